//! Running the tools' SQL: one tokio-postgres session through the gateway's own listener,
//! as the token the MCP server is bound to, with the session's notices captured so the
//! gateway's cap notice reaches the model inside the tool result.

use std::fmt::Write as _;
use std::time::Duration;

use tokio::sync::{mpsc, Mutex};
use tokio_postgres::{AsyncMessage, NoTls, SimpleQueryMessage};

/// `describe_schema`: one row per table (so a row cap counts tables, not columns), read
/// from pg_catalog as the agent.
pub const DESCRIBE_SCHEMA_SQL: &str = "select n.nspname || '.' || c.relname as \"table\", \
  case c.relkind when 'r' then 'table' when 'p' then 'partitioned table' when 'v' then 'view' \
    when 'm' then 'materialized view' else 'foreign table' end as kind, \
  (select string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) \
      || case when a.attnotnull then ' not null' else '' end, ', ' order by a.attnum) \
    from pg_attribute a where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped) as columns, \
  (select string_agg(pg_get_constraintdef(k.oid), '; ' order by k.contype desc, k.conname) \
    from pg_constraint k where k.conrelid = c.oid and k.contype in ('p', 'u', 'f')) as keys \
from pg_class c join pg_namespace n on n.oid = c.relnamespace \
where c.relkind in ('r', 'p', 'v', 'm', 'f') \
  and n.nspname not in ('pg_catalog', 'information_schema') and n.nspname not like 'pg_toast%' \
order by 1";

/// Failure to set up a [`SqlTarget`].
#[derive(Debug, thiserror::Error)]
pub enum SqlTargetError {
    /// The DSN does not parse.
    #[error("bad DSN: {0}")]
    Dsn(#[from] tokio_postgres::Error),
}

/// What a tool call produced: the text the model reads, and whether it is an error.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Tables, row counts, notices, or the error with its SQLSTATE.
    pub text: String,
    /// True when the SQL (or the connection) failed.
    pub is_error: bool,
}

struct Session {
    client: tokio_postgres::Client,
    notices: mpsc::UnboundedReceiver<String>,
}

/// One token's way into its scratch database: a DSN, and a session opened on first use and
/// kept (so `BEGIN` in one call and `COMMIT` in the next mean what they say). A session
/// that died (revoke, expiry, a FATAL) is reopened on the next call.
pub struct SqlTarget {
    config: tokio_postgres::Config,
    session: Mutex<Option<Session>>,
}

impl SqlTarget {
    /// A target for a `postgresql://` DSN (no TLS: meant for the gateway on loopback or a
    /// private network; the token authenticates with SCRAM).
    pub fn from_dsn(dsn: &str) -> Result<SqlTarget, SqlTargetError> {
        let mut config: tokio_postgres::Config = dsn.parse()?;
        config.application_name("sandpit-mcp");
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(30));
        }
        Ok(SqlTarget::from_config(config))
    }

    /// A target for a ready-made client config.
    pub fn from_config(config: tokio_postgres::Config) -> SqlTarget {
        SqlTarget {
            config,
            session: Mutex::new(None),
        }
    }

    async fn connect(&self) -> Result<Session, tokio_postgres::Error> {
        let (client, mut conn) = self.config.connect(NoTls).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        // The connection future must be polled for the session to make progress; polling it
        // by hand hands us the notices, in order, before the query they belong to completes.
        tokio::spawn(async move {
            while let Some(m) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                match m {
                    Ok(AsyncMessage::Notice(n)) => {
                        let _ = tx.send(format!(
                            "{} {}: {}",
                            n.severity(),
                            n.code().code(),
                            n.message()
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "mcp sql session ended");
                        break;
                    }
                }
            }
        });
        Ok(Session {
            client,
            notices: rx,
        })
    }

    /// Run `sql` (simple query protocol: several statements allowed, values as text) and
    /// render what came back.
    pub async fn run(&self, sql: &str) -> Outcome {
        let mut guard = self.session.lock().await;
        if guard.as_ref().is_none_or(|s| s.client.is_closed()) {
            match self.connect().await {
                Ok(s) => *guard = Some(s),
                Err(e) => {
                    return Outcome {
                        text: format!("could not connect: {}", error_text(&e)),
                        is_error: true,
                    }
                }
            }
        }
        let Some(session) = guard.as_mut() else {
            return Outcome {
                text: "no session".into(),
                is_error: true,
            };
        };
        // Notices from before this call (e.g. at login) are not this call's business.
        while session.notices.try_recv().is_ok() {}
        let res = session.client.simple_query(sql).await;
        let mut notices = Vec::new();
        while let Ok(n) = session.notices.try_recv() {
            notices.push(n);
        }
        let (mut text, is_error) = match res {
            Ok(msgs) => (render(&msgs), false),
            Err(e) => (error_text(&e), true),
        };
        for n in notices {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&n);
        }
        if is_error && session.client.is_closed() {
            *guard = None;
        }
        Outcome { text, is_error }
    }
}

/// `ERROR 42P01: relation "x" does not exist` plus detail and hint when there are any.
fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
            if let Some(d) = db.detail() {
                let _ = write!(s, "\nDETAIL: {d}");
            }
            if let Some(h) = db.hint() {
                let _ = write!(s, "\nHINT: {h}");
            }
            s
        }
        None => match e.code() {
            Some(c) => format!("ERROR {}: {e}", c.code()),
            None => format!("ERROR: {e}"),
        },
    }
}

fn cell(v: Option<&str>) -> String {
    match v {
        None => "NULL".into(),
        // One table row per line, whatever the value holds.
        Some(s) => s
            .replace('\\', "\\\\")
            .replace('\n', "\\n")
            .replace('\r', "\\r"),
    }
}

/// Compact text: for each result set a header line, one line per row (`|`-separated,
/// NULL spelled out) and `(N rows)`; for a command `OK, N rows affected`.
pub fn render(msgs: &[SimpleQueryMessage]) -> String {
    let mut out = String::new();
    let mut in_rows = false;
    let mut header_written = false;
    for m in msgs {
        match m {
            SimpleQueryMessage::RowDescription(cols) => {
                in_rows = true;
                header_written = true;
                let names: Vec<&str> = cols.iter().map(|c| c.name()).collect();
                let _ = writeln!(out, "{}", names.join(" | "));
            }
            SimpleQueryMessage::Row(row) => {
                if !header_written {
                    let names: Vec<&str> = row.columns().iter().map(|c| c.name()).collect();
                    let _ = writeln!(out, "{}", names.join(" | "));
                    header_written = true;
                    in_rows = true;
                }
                let cells: Vec<String> = (0..row.len()).map(|i| cell(row.get(i))).collect();
                let _ = writeln!(out, "{}", cells.join(" | "));
            }
            SimpleQueryMessage::CommandComplete(n) => {
                if in_rows {
                    let _ = writeln!(out, "({n} row{})", if *n == 1 { "" } else { "s" });
                } else {
                    let _ = writeln!(
                        out,
                        "OK, {n} row{} affected",
                        if *n == 1 { "" } else { "s" }
                    );
                }
                in_rows = false;
                header_written = false;
            }
            _ => {}
        }
    }
    if out.is_empty() {
        out.push_str("OK (no statements)\n");
    }
    out
}

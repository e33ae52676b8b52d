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
    /// Most bytes of one tool result: each result set is already capped by the gateway, but
    /// a call may hold many statements (and their notices).
    max_bytes: usize,
}

/// A tool result's bound when the token's `max_bytes` is not known (stdio mode): the
/// gateway's default `max_bytes`.
pub const DEFAULT_MAX_BYTES: usize = 1024 * 1024;

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
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }

    /// Bound each tool result to `max_bytes` (the token's cap, where it is known).
    pub fn with_max_bytes(mut self, max_bytes: u64) -> SqlTarget {
        self.max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
        self
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
        let res = run_bounded(&session.client, sql, self.max_bytes).await;
        let mut notices = Vec::new();
        while let Ok(n) = session.notices.try_recv() {
            notices.push(n);
        }
        let (mut text, is_error) = match res {
            Ok(text) => (text, false),
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
        cut_text(&mut text, self.max_bytes);
        Outcome { text, is_error }
    }
}

/// Run `sql` and render its results as they stream in, keeping at most `max` bytes.
async fn run_bounded(
    client: &tokio_postgres::Client,
    sql: &str,
    max: usize,
) -> Result<String, tokio_postgres::Error> {
    use futures_util::StreamExt;
    let stream = client.simple_query_raw(sql).await?;
    let mut stream = std::pin::pin!(stream);
    let mut r = Render::new(max);
    while let Some(m) = stream.next().await {
        r.push(&m?);
    }
    Ok(r.finish())
}

/// Cut `text` to at most `max` bytes (whole characters), with a line saying so.
fn cut_text(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let whole = text.len();
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    let _ = write!(
        text,
        "\n[sandpit: this result was cut at {end} of {whole} bytes (max_bytes {max}); ask for less with LIMIT or fewer statements]"
    );
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
/// NULL spelled out) and `(N rows)`; for a command `OK, N rows affected`. Built message by
/// message as they arrive; past `max` bytes nothing more is kept (the stream is still read
/// to its end, so the session stays in step).
pub struct Render {
    out: String,
    max: usize,
    /// Bytes that were not kept.
    dropped: usize,
    in_rows: bool,
    header_written: bool,
}

impl Render {
    /// An empty rendering that keeps at most `max` bytes.
    pub fn new(max: usize) -> Render {
        Render {
            out: String::new(),
            max,
            dropped: 0,
            in_rows: false,
            header_written: false,
        }
    }

    fn line(&mut self, line: String) {
        if self.dropped > 0 || self.out.len() + line.len() + 1 > self.max {
            self.dropped += line.len() + 1;
            return;
        }
        self.out.push_str(&line);
        self.out.push('\n');
    }

    fn header(&mut self, names: Vec<&str>) {
        self.line(names.join(" | "));
        self.header_written = true;
        self.in_rows = true;
    }

    /// One message of the result stream.
    pub fn push(&mut self, m: &SimpleQueryMessage) {
        match m {
            SimpleQueryMessage::RowDescription(cols) => {
                self.header(cols.iter().map(|c| c.name()).collect());
            }
            SimpleQueryMessage::Row(row) => {
                if !self.header_written {
                    self.header(row.columns().iter().map(|c| c.name()).collect());
                }
                let cells: Vec<String> = (0..row.len()).map(|i| cell(row.get(i))).collect();
                self.line(cells.join(" | "));
            }
            SimpleQueryMessage::CommandComplete(n) => {
                let s = if *n == 1 { "" } else { "s" };
                if self.in_rows {
                    self.line(format!("({n} row{s})"));
                } else {
                    self.line(format!("OK, {n} row{s} affected"));
                }
                self.in_rows = false;
                self.header_written = false;
            }
            _ => {}
        }
    }

    /// The text, with a line saying what was left out past the bound.
    pub fn finish(mut self) -> String {
        if self.dropped > 0 {
            let _ = writeln!(
                self.out,
                "[sandpit: {} more bytes of this result were not kept (max_bytes {}); ask for less with LIMIT or fewer statements]",
                self.dropped, self.max
            );
        }
        if self.out.is_empty() {
            self.out.push_str("OK (no statements)\n");
        }
        self.out
    }
}

/// The whole of `msgs` rendered (no bound).
pub fn render(msgs: &[SimpleQueryMessage]) -> String {
    let mut r = Render::new(usize::MAX);
    for m in msgs {
        r.push(m);
    }
    r.finish()
}

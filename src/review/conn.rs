//! Review connections: as the review's own role where the provider has one (never a
//! superuser; never the agent's role, whose settings the agent controls), else as the agent
//! role, over the same kind of socket
//! the relay uses, with a locked-down session (catalog-only search path, fixed output formats, no row
//! security, timeouts) inside one read-only repeatable-read transaction.

use std::collections::VecDeque;
use std::time::Duration;

use tokio_postgres::{Client, SimpleQueryMessage};

use crate::pgconn::stream as backend_stream;
use crate::pgconn::BackendTarget;

/// A row as text output (None is NULL).
pub type TextRow = Vec<Option<String>>;

/// Errors of review reads.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("connecting to {side} database: {message}")]
    Connect { side: &'static str, message: String },
    #[error("{side} database: {message}")]
    Query { side: &'static str, message: String },
    #[error("{0}")]
    Other(String),
}

/// The server's message and SQLSTATE when there is one (tokio-postgres' Display says only
/// "db error").
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// Session settings applied on both sides (and echoed in the patch), so that text output of
/// every value is the same function of the value on both sides.
pub const SESSION_SETTINGS: &[(&str, &str)] = &[
    ("search_path", "pg_catalog, pg_temp"),
    ("TimeZone", "'UTC'"),
    ("DateStyle", "'ISO, YMD'"),
    ("IntervalStyle", "'postgres'"),
    ("extra_float_digits", "1"),
    ("bytea_output", "'hex'"),
];

/// One side of the comparison.
pub struct Side {
    /// "scratch" or "reference", for messages.
    pub name: &'static str,
    client: Client,
    cursors: u32,
}

/// Timeouts for review sessions.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// `statement_timeout` of every review statement.
    pub statement: Duration,
    /// `lock_timeout` (an agent holding an exclusive lock must not stall the review long).
    pub lock: Duration,
}

impl Side {
    /// Connect as `target.user` (never a superuser) and lock the session down. The timeouts
    /// are startup options (they outrank every `ALTER ROLE|DATABASE ... SET`, so a role's
    /// `idle_in_transaction_session_timeout = '1ms'` cannot end the review), the rest is set
    /// after login, so no default of the role or database survives it.
    pub async fn connect(
        name: &'static str,
        target: &BackendTarget,
        t: Timeouts,
    ) -> Result<Side, ConnError> {
        let gate_err = |message: String| ConnError::Connect {
            side: name,
            message,
        };
        let first = crate::pgconn::gate::login(
            target,
            async |t2: &BackendTarget| Self::connect_with(name, t2, t, true).await,
            gate_err,
        )
        .await;
        match first {
            // A server older than 17 knows no `transaction_timeout` (and has none to fear).
            Err(ConnError::Connect { message, .. }) if message.contains("transaction_timeout") => {
                crate::pgconn::gate::login(
                    target,
                    async |t2: &BackendTarget| Self::connect_with(name, t2, t, false).await,
                    gate_err,
                )
                .await
            }
            r => r,
        }
    }

    async fn connect_with(
        name: &'static str,
        target: &BackendTarget,
        t: Timeouts,
        transaction_timeout: bool,
    ) -> Result<Side, ConnError> {
        // Our own socket (unix, TCP, or TLS after an SSLRequest, as the endpoint says), so a
        // review reaches every backend the relay reaches, with the same TLS checks.
        let stream =
            backend_stream::open(&target.endpoint)
                .await
                .map_err(|e| ConnError::Connect {
                    side: name,
                    message: e.to_string(),
                })?;
        let mut cfg = tokio_postgres::Config::new();
        let mut options = startup_options(t);
        if transaction_timeout {
            options.push_str(" -c transaction_timeout=0");
        }
        cfg.user(&target.user)
            .dbname(&target.database)
            .application_name("sandpit-review")
            .options(&options)
            .ssl_mode(tokio_postgres::config::SslMode::Disable);
        if let Some(p) = &target.password {
            cfg.password(p.as_bytes());
        }
        let (client, conn) = tokio::time::timeout(
            Duration::from_secs(10),
            cfg.connect_raw(stream, tokio_postgres::NoTls),
        )
        .await
        .map_err(|_| ConnError::Connect {
            side: name,
            message: "login timed out".into(),
        })?
        .map_err(|e| ConnError::Connect {
            side: name,
            message: describe(&e),
        })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "review connection ended");
            }
        });
        let side = Side {
            name,
            client,
            cursors: 0,
        };
        let mut set = String::new();
        for (k, v) in SESSION_SETTINGS {
            set.push_str(&format!("SET {k} = {v}; "));
        }
        set.push_str(&format!(
            "SET statement_timeout = {}; SET lock_timeout = {}; SET row_security = off; \
             SET default_transaction_read_only = on;",
            t.statement.as_millis().max(1),
            t.lock.as_millis().max(1)
        ));
        side.exec(&set).await?;
        Ok(side)
    }

    /// Start the read-only snapshot.
    pub async fn begin(&self) -> Result<(), ConnError> {
        self.exec("BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ; SELECT 1")
            .await
    }

    /// End the transaction (nothing was written; it is read-only).
    pub async fn rollback(&self) -> Result<(), ConnError> {
        self.exec("ROLLBACK").await
    }

    /// Run statements, ignoring results.
    pub async fn exec(&self, sql: &str) -> Result<(), ConnError> {
        self.client
            .simple_query(sql)
            .await
            .map(|_| ())
            .map_err(|e| ConnError::Query {
                side: self.name,
                message: describe(&e),
            })
    }

    /// Run one query; all rows as text.
    pub async fn rows(&self, sql: &str) -> Result<Vec<TextRow>, ConnError> {
        let msgs = self
            .client
            .simple_query(sql)
            .await
            .map_err(|e| ConnError::Query {
                side: self.name,
                message: describe(&e),
            })?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(
                    (0..r.columns().len())
                        .map(|i| r.get(i).map(str::to_string))
                        .collect(),
                ),
                _ => None,
            })
            .collect())
    }

    /// Open a cursor over `select` that is read in batches of `batch` rows.
    pub async fn cursor(&mut self, select: &str, batch: u32) -> Result<Cursor<'_>, ConnError> {
        self.cursors += 1;
        let name = format!("sandpit_review_{}", self.cursors);
        self.exec(&format!("DECLARE {name} NO SCROLL CURSOR FOR {select}"))
            .await?;
        Ok(Cursor {
            side: self,
            name,
            batch,
            buf: VecDeque::new(),
            done: false,
        })
    }
}

/// The review session's timeouts as startup options: its own statement and lock timeouts,
/// none of the idle timeouts an agent could have set on the role it logs in as.
pub fn startup_options(t: Timeouts) -> String {
    format!(
        "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout=0 \
         -c idle_session_timeout=0",
        t.statement.as_millis().clamp(1, i32::MAX as u128),
        t.lock.as_millis().clamp(1, i32::MAX as u128)
    )
}

/// Rows of a query, fetched in bounded batches.
pub struct Cursor<'a> {
    side: &'a Side,
    name: String,
    batch: u32,
    buf: VecDeque<TextRow>,
    done: bool,
}

impl Cursor<'_> {
    /// The next row, or None at the end.
    pub async fn next(&mut self) -> Result<Option<TextRow>, ConnError> {
        if self.buf.is_empty() && !self.done {
            let rows = self
                .side
                .rows(&format!("FETCH FORWARD {} FROM {}", self.batch, self.name))
                .await?;
            if rows.len() < self.batch as usize {
                self.done = true;
            }
            self.buf.extend(rows);
        }
        Ok(self.buf.pop_front())
    }

    /// Close the cursor.
    pub async fn close(self) -> Result<(), ConnError> {
        self.side.exec(&format!("CLOSE {}", self.name)).await
    }
}

/// `'text'` as an SQL string literal (standard_conforming_strings is on in every supported
/// server).
pub fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

//! Before an end-of-token review: every session on the scratch server ended and every
//! prepared transaction rolled back, as a role allowed to, so nothing the agent left behind
//! (a lock held in a `PREPARE TRANSACTION`, a session opened around the gateway) can hold the
//! review back.

use std::time::Duration;

use tokio_postgres::{Client, NoTls};

use super::ProviderError;
use crate::pgconn::stream as backend_stream;
use crate::pgconn::BackendTarget;

/// How long `pg_terminate_backend` waits for each session to be gone (its locks released).
pub const TERMINATE_WAIT_MS: i64 = 5000;
/// Longest wait for a login of the quiescing role.
const LOGIN_WAIT: Duration = Duration::from_secs(10);

/// A step before the review that failed on the server.
fn sql(what: &str) -> impl FnOnce(tokio_postgres::Error) -> ProviderError {
    let what = format!("before the review, {what}");
    move |source| ProviderError::Sql { what, source }
}

/// Logs in as `target` (a superuser of a server that is the token's alone).
async fn login(target: &BackendTarget) -> Result<Client, ProviderError> {
    let stream = backend_stream::open(&target.endpoint)
        .await
        .map_err(ProviderError::io_at(
            "before the review, connecting as the admin role",
        ))?;
    let mut cfg = tokio_postgres::Config::new();
    cfg.user(&target.user)
        .dbname(&target.database)
        .application_name("sandpit-quiesce")
        // The role's own settings must not time this session out.
        .options(
            "-c statement_timeout=0 -c lock_timeout=0 -c idle_in_transaction_session_timeout=0",
        )
        .ssl_mode(tokio_postgres::config::SslMode::Disable);
    if let Some(p) = &target.password {
        cfg.password(p.as_bytes());
    }
    let (client, conn) = tokio::time::timeout(LOGIN_WAIT, cfg.connect_raw(stream, NoTls))
        .await
        .map_err(|_| {
            ProviderError::Other(
                "before the review, logging in as the admin role: timed out".into(),
            )
        })?
        .map_err(sql("logging in as the admin role"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "quiesce connection ended");
        }
    });
    Ok(client)
}

/// Quiesces a server that belongs to one token (`instance`, `microvm`): `admin` is a
/// superuser login to it. Every other client session is ended (waiting until each is gone),
/// then every prepared transaction is rolled back from the database it was prepared in.
/// Returns how many prepared transactions were rolled back.
pub async fn whole_server(admin: &BackendTarget) -> Result<usize, ProviderError> {
    let c = login(admin).await?;
    c.execute(
        "SELECT count(pg_catalog.pg_terminate_backend(pid, $1)) FROM pg_catalog.pg_stat_activity \
         WHERE backend_type = 'client backend' AND pid <> pg_catalog.pg_backend_pid()",
        &[&TERMINATE_WAIT_MS],
    )
    .await
    .map_err(sql("ending the agent's sessions"))?;
    let rows = c
        .query(
            "SELECT gid, database::text FROM pg_catalog.pg_prepared_xacts ORDER BY database",
            &[],
        )
        .await
        .map_err(sql("listing prepared transactions"))?;
    let mut n = 0;
    for r in rows {
        let gid: String = r.get(0);
        let db: String = r.get(1);
        let mut there = admin.clone();
        there.database = db.clone();
        let other = if db == admin.database {
            None
        } else {
            Some(login(&there).await?)
        };
        other
            .as_ref()
            .unwrap_or(&c)
            .batch_execute(&format!("ROLLBACK PREPARED '{}'", gid.replace('\'', "''")))
            .await
            .map_err(sql("rolling back a prepared transaction"))?;
        n += 1;
        tracing::info!(database = %db, "rolled back a prepared transaction left by the agent");
    }
    Ok(n)
}

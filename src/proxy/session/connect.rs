//! The attach stage's backend connection: the token's pace, the startup parameters the
//! backend is sent, the backend forked or resumed and connected (once more after a
//! failure), and the phases of a token's first connection.

use std::time::Instant;

use super::error::SessionError;
use crate::lifecycle::pace::Turn;
use crate::lifecycle::LifecycleError;
use crate::pgconn::startup::{self as backend, BackendConn, BackendError};
use crate::pgconn::BackendTarget;
use crate::proxy::Proxy;
use crate::registry::TokenRecord;
use crate::wire::scrub;
use crate::wire::startup::StartupMessage;

/// Startup parameters that must never reach the backend: identity is the gateway's to set.
const RESERVED_PARAMS: &[&str] = &["user", "database", "replication"];

/// A new session waits for its token's pace ([`crate::lifecycle::pace`]) before it makes
/// the scratch server start a backend; refused when its turn is more than the startup
/// timeout away.
pub(super) async fn pace(proxy: &Proxy, rec: &TokenRecord) -> Result<(), SessionError> {
    let limits = &proxy.gw.config.limits;
    match proxy.gw.pace_session(&rec.id, limits.startup_timeout).await {
        Turn::Now => Ok(()),
        Turn::After(wait) => {
            metrics::counter!("sandpit_sessions_paced_total", "outcome" => "waited").increment(1);
            tokio::time::sleep(wait).await;
            Ok(())
        }
        Turn::Refused => {
            metrics::counter!("sandpit_sessions_paced_total", "outcome" => "refused").increment(1);
            tracing::info!("new session refused: over the token's pace");
            Err(SessionError::TooManyNewSessions {
                id: rec.id.clone(),
                rate: limits.sessions_per_second,
                burst: limits.session_burst,
            })
        }
    }
}

/// The session defaults a token sets: its statement and idle-in-transaction timeouts.
pub(super) fn token_timeouts(rec: &TokenRecord) -> [(&'static str, String); 2] {
    [
        (
            "statement_timeout",
            rec.caps.statement_timeout_ms.to_string(),
        ),
        (
            "idle_in_transaction_session_timeout",
            rec.caps.idle_in_transaction_timeout_ms.to_string(),
        ),
    ]
}

/// The startup parameters the backend is sent: the client's, less those that are the
/// gateway's to set, then each of the token's `timeouts` the client did not set itself.
pub(super) fn backend_params<'a>(
    startup: &'a StartupMessage,
    timeouts: &'a [(&'static str, String)],
) -> Vec<(&'a str, &'a [u8])> {
    let mut params: Vec<(&str, &[u8])> = startup
        .params
        .iter()
        .filter(|(k, _)| !RESERVED_PARAMS.contains(&k.as_str()) && !k.starts_with("_pq_."))
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    // The token's limits are the session defaults unless the client set them, as a startup
    // parameter or in its `options` (as a server would take them; the agent can SET them
    // anyway): the gateway's watchdog enforces the token's statement timeout whatever the
    // session says. `options` names are matched as the server reads them there, where `-`
    // stands for `_` (`--statement-timeout=0`); a startup parameter after `options` would
    // override it.
    let client_options = startup
        .get("options")
        .unwrap_or("")
        .to_ascii_lowercase()
        .replace('-', "_");
    let client_sets = |t: &str| {
        client_options.contains(t)
            || startup
                .params
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case(t))
    };
    params.extend(
        timeouts
            .iter()
            .filter(|(k, _)| !client_sets(k))
            .map(|(k, v)| (*k, v.as_bytes())),
    );
    params
}

/// The backend, forked or resumed, connected as the token's login role. A connection that
/// fails on a backend the gateway believed running (its server crashed) is tried once more
/// after the backend is checked again and restarted.
pub(super) async fn connect_with_retry(
    proxy: &Proxy,
    rec: &TokenRecord,
    params: &[(&str, &[u8])],
    phases: Phases,
) -> Result<(BackendTarget, BackendConn), SessionError> {
    let max_message = proxy.gw.config.limits.max_message;
    let mut retried = false;
    loop {
        let claim_started = Instant::now();
        let login = login_target(proxy, rec).await?;
        phases.record("claim", claim_started);
        let connect_started = Instant::now();
        match backend::connect(&login, params, max_message).await {
            Ok(conn) => {
                phases.record("backend_connect", connect_started);
                return Ok((login, conn));
            }
            Err(BackendError::Refused(raw)) => {
                let out = scrub::scrub_error(b'E', raw.get(5..).unwrap_or(&[]), proxy.gw.secrets())
                    .unwrap_or(raw);
                return Err(SessionError::BackendRefused(out));
            }
            Err(e) if !retried => {
                tracing::warn!(error = %e, "backend connect failed; checking the backend again");
                metrics::counter!("sandpit_backend_reconnects_total").increment(1);
                let (gw, id) = (proxy.gw.clone(), rec.id.clone());
                proxy
                    .on_main(async move { gw.backend_failed(&id).await })
                    .await;
                retried = true;
            }
            Err(e) => {
                tracing::error!(error = %e, "backend connect failed");
                return Err(SessionError::BackendUnreachable);
            }
        }
    }
}

/// The token's backend (forked, resumed or running) and the login to reach it as.
async fn login_target(proxy: &Proxy, rec: &TokenRecord) -> Result<BackendTarget, SessionError> {
    // On the main pool: a fork or resume may take long and spawns work of its own.
    let (gw, id) = (proxy.gw.clone(), rec.id.clone());
    let Some(backend) = proxy
        .on_main(async move { gw.backend_for(&id).await })
        .await
    else {
        tracing::error!("backend unavailable: the fork's task failed");
        return Err(SessionError::BackendUnavailable);
    };
    let backend = match backend {
        Ok(b) => b,
        Err(LifecycleError::NotUsable(id, state)) => {
            return Err(SessionError::NotUsable(id, state))
        }
        Err(e) => {
            // The detail stays in our log; the client learns only that it failed.
            tracing::error!(error = %e, "backend unavailable");
            return Err(SessionError::BackendUnavailable);
        }
    };
    // The login role follows the token's policy, so Postgres itself refuses what the
    // policy forbids (the pipeline's lexical check only labels and refuses earlier).
    // A superuser token (issued only where the provider has such a login) logs in as
    // the superuser of its own backend; the pipeline's checks still apply to it.
    let provider = &proxy.gw.provider;
    if !rec.superuser {
        return Ok(provider.session_target(&backend, rec.caps.allow.as_deref()));
    }
    let Some(logins) = provider.superuser_logins() else {
        tracing::error!(
            provider = provider.name(),
            "superuser token, but the provider has no superuser login"
        );
        return Err(SessionError::BackendUnavailable);
    };
    Ok(logins.superuser_target(&backend))
}

/// Only a token's first connection (no backend yet) reports its phases.
#[derive(Clone, Copy)]
pub(super) struct Phases {
    first: bool,
}

impl Phases {
    pub(super) fn of(rec: &TokenRecord) -> Phases {
        Phases {
            first: rec.state == crate::registry::TokenState::Issued,
        }
    }

    pub(super) fn record(self, name: &'static str, since: Instant) {
        if self.first {
            first_query_phase(name, since)
        }
    }
}

/// One phase of a token's first connection (`auth`, `claim`, `backend_connect`, `greet`),
/// so the time of a first query can be split where it goes.
fn first_query_phase(name: &'static str, since: Instant) {
    metrics::histogram!("sandpit_first_query_phase_seconds", "phase" => name)
        .record(since.elapsed().as_secs_f64());
}

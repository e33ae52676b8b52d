//! One-login passwords for task roles (issue 30, item 2). PostgreSQL lets every role change
//! its own password, so a password the gateway keeps cannot stay the agent's secret-free
//! way in; instead no task role has a usable password at rest: `VALID UNTIL '-infinity'`,
//! which a role without CREATEROLE cannot change, makes every password expire, the agent's
//! too. For each login the gateway (as the template admin) sets a fresh random password and
//! opens the role for [`OPEN_FOR`], logs in, and closes it again; in the same statement as
//! the close it checks the password is still its own. A password changed inside that window
//! (the only way the agent could have used it) marks the role tampered with: its sessions
//! end and so does the token. A changed password at rest opens nothing and locks nothing
//! out: the next login sets its own. Logins of one role take turns (in this gateway by a
//! mutex, across replicas by an advisory lock), so one login's window never closes another's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rand::RngCore;
use tokio_postgres::Client;

use super::quote_literal;
use super::records::RECORDS_TABLE;
use crate::pgconn::gate::{GateFuture, LoginGate, Window};
use crate::pgconn::scram;
use crate::pgconn::Endpoint;

/// How long a role stays open if the gateway never closes it (it died mid-login).
const OPEN_FOR: &str = "30 seconds";
/// PBKDF2 iterations of a one-login password's verifier. Stretching protects guessable
/// passwords; this one is 256 random bits used once, so one iteration loses nothing and
/// spares a login the 4096 HMACs.
const ITERATIONS: u32 = 1;
/// Longest wait for another replica's login of the same role.
const TURN_WAIT: Duration = Duration::from_secs(10);
/// Further tries of a close that failed (a concurrent change of the role).
const CLOSE_TRIES: usize = 5;
/// What a role found changed inside a login window is recorded as.
pub(super) const CHANGED_IN_WINDOW: &str = "password changed during a gateway login";

/// The gate every task-role target carries.
pub struct RoleGate {
    admin: tokio_postgres::Config,
    admin_db: String,
    endpoint: Endpoint,
    /// Kept admin session for the windows (single statements only: it is shared).
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    /// Per-role turn of this gateway's logins; entries leave with their last user.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Whether `pg_authid` is readable (else the in-window check cannot run).
    pub(super) can_read_verifiers: AtomicBool,
}

impl std::fmt::Debug for RoleGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoleGate")
    }
}

/// What an open window holds until it is closed.
struct Open {
    pending: Option<Pending>,
}

impl RoleGate {
    pub(super) fn new(
        admin: tokio_postgres::Config,
        admin_db: String,
        endpoint: Endpoint,
    ) -> RoleGate {
        RoleGate {
            admin,
            admin_db,
            endpoint,
            client: tokio::sync::Mutex::new(None),
            turns: Mutex::new(HashMap::new()),
            can_read_verifiers: AtomicBool::new(false),
        }
    }

    async fn client(&self) -> Result<Arc<Client>, String> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let c = super::admin_session(&self.admin, &self.endpoint, &self.admin_db)
            .await
            .map_err(|e| e.to_string())?;
        let c = Arc::new(c);
        *slot = Some(c.clone());
        Ok(c)
    }

    fn turn(&self, user: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut t = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        // Entries nobody waits on or holds: only the map refers to them.
        t.retain(|_, m| Arc::strong_count(m) > 1);
        t.entry(user.to_string()).or_default().clone()
    }

    /// Every await from the advisory lock on may be the last (a session dropped midway):
    /// from there the window is an [`Open`], whose drop closes it.
    async fn open_inner(&self, user: &str) -> Result<Window, String> {
        super::validate_handle(super::seatbelt::handle_of(user)).map_err(|e| e.to_string())?;
        let mut raw = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let password = URL_SAFE_NO_PAD.encode(raw);
        // Its keys go into the login cache: the login that follows runs no PBKDF2.
        let verifier = scram::new_verifier(user, &password, ITERATIONS)
            .await
            .map_err(|e| e.to_string())?;
        let turn = self.turn(user).lock_owned().await;
        let c = self.client().await?;
        let mut open = Open {
            pending: Some(Pending {
                turn,
                user: user.to_string(),
                verifier: verifier.clone(),
                client: c.clone(),
                // Nothing of ours to compare with until the password is sent.
                check: false,
            }),
        };
        let started = std::time::Instant::now();
        loop {
            let got = c
                .query_one(
                    "SELECT pg_try_advisory_lock(hashtext('sandpit_login'), hashtext($1))",
                    &[&user],
                )
                .await
                .map(|r| r.get::<_, bool>(0));
            let why = match got {
                Ok(true) => break,
                Err(e) => format!("taking the login turn: {e}"),
                Ok(false) if started.elapsed() > TURN_WAIT => {
                    format!("another gateway holds {user}'s login turn")
                }
                Ok(false) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            };
            // Not ours to close: another gateway's window may be open.
            open.pending.take();
            return Err(why);
        }
        let check = self.can_read_verifiers.load(Ordering::Relaxed);
        if let Some(p) = open.pending.as_mut() {
            // Sent on the first poll below: from here the server has our password.
            p.check = check;
        }
        let opened = c
            .batch_execute(&format!(
                "DO $sandpit$ BEGIN EXECUTE format('ALTER ROLE %I PASSWORD %L VALID UNTIL %L', \
                 {}, {}, now() + interval '{OPEN_FOR}'); END $sandpit$",
                quote_literal(user),
                quote_literal(&verifier)
            ))
            .await;
        if let Err(e) = opened {
            if let Some(mut p) = open.pending.take() {
                p.check = false;
                let _ = p.finish().await;
            }
            return Err(format!("opening the login: {e}"));
        }
        Ok(Window {
            password,
            state: Box::new(open),
        })
    }

    async fn close_inner(&self, user: &str, w: Window) -> Result<(), String> {
        let Ok(mut open) = w.state.downcast::<Open>() else {
            return Err("not this gate's window".into());
        };
        let Some(pending) = open.pending.take() else {
            return Err("window closed twice".into());
        };
        debug_assert_eq!(pending.user, user);
        pending.finish().await
    }
}

/// What closing a window needs; taken out of [`Open`] by the close, or by its drop when the
/// login was abandoned midway (a client gone, a timeout): the close then runs on its own
/// task, so a window cannot be left open for the agent to race.
struct Pending {
    turn: tokio::sync::OwnedMutexGuard<()>,
    user: String,
    verifier: String,
    client: Arc<Client>,
    check: bool,
}

impl Drop for Open {
    fn drop(&mut self) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Err(e) = pending.finish().await {
                        tracing::warn!(error = %e, "closing an abandoned login window");
                    }
                });
            }
            Err(_) => tracing::warn!(
                role = %pending.user,
                "login window abandoned outside a runtime; it closes by itself within {OPEN_FOR}"
            ),
        }
    }
}

impl Pending {
    /// Closes the role, releases the turn, and reports a password changed meanwhile.
    async fn finish(self) -> Result<(), String> {
        let (c, user) = (&self.client, self.user.as_str());
        let user_lit = quote_literal(user);
        // One statement, one transaction: the read after the close sees the password the
        // window ended with (a change committed later is expired, one committing meanwhile
        // makes the close fail with "tuple concurrently updated", and it is tried again).
        let check = if self.check {
            format!(
                "IF (SELECT rolpassword FROM pg_authid WHERE rolname = {user_lit}) \
                   IS DISTINCT FROM {} THEN \
                   UPDATE {RECORDS_TABLE} SET tampered = coalesce(tampered, '{CHANGED_IN_WINDOW}') \
                   WHERE handle = {user_lit}; \
                 END IF;",
                quote_literal(&self.verifier)
            )
        } else {
            String::new()
        };
        let close = format!(
            "DO $sandpit$ BEGIN \
             EXECUTE format('ALTER ROLE %I VALID UNTIL %L', {user_lit}, '-infinity'); {check} \
             END $sandpit$"
        );
        let mut closed = c.batch_execute(&close).await;
        for _ in 0..CLOSE_TRIES {
            if closed.is_ok() || c.is_closed() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            closed = c.batch_execute(&close).await;
        }
        unlock(c, user).await;
        drop(self.turn);
        closed.map_err(|e| format!("closing the login: {e}"))?;
        if !self.check {
            return Ok(());
        }
        let tampered: Option<String> = c
            .query_opt(
                &format!("SELECT tampered FROM {RECORDS_TABLE} WHERE handle = $1"),
                &[&user],
            )
            .await
            .map_err(|e| format!("reading the role's record: {e}"))?
            .and_then(|r| r.get(0));
        if tampered.as_deref() != Some(CHANGED_IN_WINDOW) {
            return Ok(());
        }
        tracing::warn!(
            role = user,
            "task role's password changed during a gateway login; ending its sessions"
        );
        metrics::counter!("sandpit_template_tampered_total").increment(1);
        // Every session of the role: one that got in with the agent's password meanwhile
        // cannot be told from the gateway's.
        c.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE usename = $1 AND pid <> pg_backend_pid()",
            &[&user],
        )
        .await
        .map_err(|e| format!("ending the role's sessions: {e}"))?;
        Err(format!("{user}: {CHANGED_IN_WINDOW}"))
    }
}

async fn unlock(c: &Client, user: &str) {
    if let Err(e) = c
        .execute(
            "SELECT pg_advisory_unlock(hashtext('sandpit_login'), hashtext($1))",
            &[&user],
        )
        .await
    {
        tracing::warn!(role = user, error = %e, "releasing the login turn");
    }
}

impl LoginGate for RoleGate {
    fn open<'a>(&'a self, user: &'a str) -> GateFuture<'a, Result<Window, String>> {
        Box::pin(self.open_inner(user))
    }

    fn close<'a>(&'a self, user: &'a str, window: Window) -> GateFuture<'a, Result<(), String>> {
        Box::pin(self.close_inner(user, window))
    }
}

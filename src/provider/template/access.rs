//! Keeps task roles reachable only through the gateway. PostgreSQL lets any role change its
//! own password (`ALTER ROLE CURRENT_USER PASSWORD …`, under any `password_encryption`), and
//! nothing on a server we do not control can forbid it; so no task role has a usable password
//! at rest (`VALID UNTIL '-infinity'`, which only a role with CREATEROLE can change) and each
//! gateway login sets its own ([`super::gate`]). What is checked here, before sessions and at
//! every janitor pass: the attributes the agent cannot change (a change would mean the
//! server let it, and is undone and reported as [`ProviderError::Tampered`], so the token can
//! be ended), a password changed during a gateway login (recorded by the gate), and roles
//! made before one-login passwords, which are closed.

use tokio_postgres::Client;

use super::records::RECORDS_TABLE;
use super::seatbelt::{handle_of, roles_of};
use super::{pg_err, quote_ident, TemplateProvider};
use crate::provider::ProviderError;

/// One role as the check sees it.
struct RoleState {
    handle: String,
    /// `VALID UNTIL` unset or infinity: a role made before one-login passwords.
    valid_forever: bool,
    /// `CONNECTION LIMIT`.
    conn_limit: i32,
    /// Why it was found tampered with before, if it was.
    tampered: Option<String>,
}

impl RoleState {
    /// What differs from what the gateway set, in words; empty when nothing does.
    /// (A changed password is none: it is expired, and the next login sets its own.)
    fn changes(&self) -> Vec<&'static str> {
        let mut what = Vec::new();
        // Refused by the server to a role without CREATEROLE; checked anyway, it is free.
        if self.conn_limit != -1 {
            what.push("CONNECTION LIMIT set");
        }
        what
    }
}

impl TemplateProvider {
    /// Checks one backend's roles (`Some`: its task role and seatbelt logins) or every
    /// recorded role (`None`); undoes what it finds and returns the handles (of the scratch
    /// database) found tampered with, now or at an earlier check, with what was changed.
    pub(super) async fn check_roles(
        &self,
        c: &Client,
        only: Option<&str>,
    ) -> Result<Vec<(String, String)>, ProviderError> {
        let rows = c
            .query(
                &format!(
                    "SELECT b.handle, \
                       (a.rolvaliduntil IS NULL OR a.rolvaliduntil = 'infinity'), a.rolconnlimit, b.tampered \
                     FROM {RECORDS_TABLE} b JOIN pg_roles a ON a.rolname = b.handle \
                     WHERE NOT b.destroying AND ($1::text[] IS NULL OR b.handle = ANY($1))"
                ),
                &[&only.map(roles_of).as_ref().map(|r| r.as_slice())],
            )
            .await
            .map_err(|e| pg_err("reading task roles", e))?;
        let mut found = Vec::new();
        for r in rows {
            let role = RoleState {
                handle: r.get(0),
                valid_forever: r.get::<_, Option<bool>>(1).unwrap_or(true),
                conn_limit: r.get(2),
                tampered: r.get(3),
            };
            if role.valid_forever {
                close_at_rest(c, &role.handle).await?;
            }
            let changes = role.changes();
            if !changes.is_empty() {
                let why = changes.join(", ");
                self.neutralise(c, &role.handle, &why).await?;
                found.push((handle_of(&role.handle).to_string(), why));
            } else if let Some(why) = role.tampered {
                found.push((handle_of(&role.handle).to_string(), why));
            }
        }
        Ok(found)
    }

    /// Closes the role and puts its limits back, ends every session of the role (the
    /// gateway's own ones too: which came through it cannot be told apart reliably, and a
    /// gateway client reconnects), and records why.
    async fn neutralise(&self, c: &Client, handle: &str, why: &str) -> Result<(), ProviderError> {
        tracing::warn!(
            handle,
            what = why,
            "task role changed outside the gateway; restoring it and ending its sessions"
        );
        metrics::counter!("sandpit_template_tampered_total").increment(1);
        let q = quote_ident(handle);
        // Closed first, so a session ended below cannot log in again with the agent's.
        c.batch_execute(&format!(
            "ALTER ROLE {q} PASSWORD NULL VALID UNTIL '-infinity' CONNECTION LIMIT -1"
        ))
        .await
        .map_err(|e| pg_err("restoring the task role", e))?;
        c.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE usename = $1 AND pid <> pg_backend_pid()",
            &[&handle],
        )
        .await
        .map_err(|e| pg_err("ending the task role's sessions", e))?;
        c.execute(
            &format!(
                "UPDATE {RECORDS_TABLE} SET tampered = coalesce(tampered, $2) WHERE handle = $1"
            ),
            &[&handle, &why],
        )
        .await
        .map_err(|e| pg_err("recording the change", e))?;
        Ok(())
    }

    /// The per-session check of one backend, on a kept admin session (a login per session
    /// would cost a TLS handshake and SCRAM each time).
    pub(super) async fn check_access_inner(&self, handle: &str) -> Result<(), ProviderError> {
        let mut slot = self.kept_admin().await?;
        let Some(c) = slot.as_ref() else {
            return Err(ProviderError::Template("no admin session".into()));
        };
        let found = match self.check_roles(c, Some(handle)).await {
            Ok(f) => f,
            Err(e) => {
                // Maybe a dead session: drop it so the next check logs in anew.
                *slot = None;
                return Err(e);
            }
        };
        match found.into_iter().next() {
            Some((h, why)) => Err(ProviderError::Tampered(format!("{h}: {why}"))),
            None => Ok(()),
        }
    }

    /// The kept admin session (logged in anew when it is gone), locked for one use; the
    /// caller drops it (`*slot = None`) after an error that may mean a dead session.
    pub(super) async fn kept_admin(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, Option<Client>>, ProviderError> {
        let mut slot = self.checker.lock().await;
        if slot.as_ref().is_none_or(|c| c.is_closed()) {
            *slot = Some(self.connect(None).await?);
        }
        Ok(slot)
    }
}

/// A role from before one-login passwords (valid forever, with the derived password):
/// closed like every other, its password left to the next login.
async fn close_at_rest(c: &Client, role: &str) -> Result<(), ProviderError> {
    c.batch_execute(&format!(
        "ALTER ROLE {} VALID UNTIL '-infinity'",
        quote_ident(role)
    ))
    .await
    .map_err(|e| pg_err("closing an older task role", e))
}

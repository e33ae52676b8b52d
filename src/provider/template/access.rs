//! Keeps task roles reachable only through the gateway. PostgreSQL lets any role change its
//! own password (`ALTER ROLE CURRENT_USER PASSWORD …`, under any `password_encryption`), and
//! nothing on a server we do not control can forbid it; with the new password an agent that
//! can reach the server logs in directly, past caps and log. So the verifier the gateway set is
//! compared with the one in `pg_authid`, before sessions and at every janitor pass; a change is
//! undone on the spot (the verifier put back, every session of the role ended) and reported as
//! [`ProviderError::Tampered`], so the token can be ended.

use tokio_postgres::Client;

use super::records::RECORDS_TABLE;
use super::seatbelt::{handle_of, roles_of};
use super::{pg_err, quote_ident, quote_literal, TemplateProvider};
use crate::provider::ProviderError;

/// One role as the check sees it.
struct RoleState {
    handle: String,
    /// What the gateway set (None: a backend recorded before verifiers were).
    verifier: Option<String>,
    /// What the server has.
    stored: Option<String>,
    /// `VALID UNTIL` unset or infinity.
    valid_forever: bool,
    /// `CONNECTION LIMIT`.
    conn_limit: i32,
    /// Why it was found tampered with before, if it was.
    tampered: Option<String>,
}

impl RoleState {
    /// What differs from what the gateway set, in words; empty when nothing does.
    fn changes(&self, verifier: &str) -> Vec<&'static str> {
        let mut what = Vec::new();
        if self.stored.as_deref() != Some(verifier) {
            what.push("password changed");
        }
        // Refused by the server to a role without CREATEROLE; checked anyway, it is free.
        if !self.valid_forever {
            what.push("VALID UNTIL set");
        }
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
        if !self.can_read_verifiers {
            return Ok(Vec::new());
        }
        let rows = c
            .query(
                &format!(
                    "SELECT b.handle, b.verifier, a.rolpassword, \
                       (a.rolvaliduntil IS NULL OR a.rolvaliduntil = 'infinity'), a.rolconnlimit, b.tampered \
                     FROM {RECORDS_TABLE} b JOIN pg_authid a ON a.rolname = b.handle \
                     WHERE NOT b.destroying AND ($1::text[] IS NULL OR b.handle = ANY($1))"
                ),
                &[&only.map(roles_of).as_ref().map(|r| r.as_slice())],
            )
            .await
            .map_err(|e| pg_err("reading task role verifiers", e))?;
        let mut found = Vec::new();
        for r in rows {
            let role = RoleState {
                handle: r.get(0),
                verifier: r.get(1),
                stored: r.get(2),
                valid_forever: r.get::<_, Option<bool>>(3).unwrap_or(true),
                conn_limit: r.get(4),
                tampered: r.get(5),
            };
            let Some(verifier) = role.verifier.as_deref() else {
                self.give_verifier(c, &role.handle).await?;
                continue;
            };
            let changes = role.changes(verifier);
            if !changes.is_empty() {
                let why = changes.join(", ");
                self.neutralise(c, &role.handle, verifier, &why).await?;
                found.push((handle_of(&role.handle).to_string(), why));
            } else if let Some(why) = role.tampered {
                found.push((handle_of(&role.handle).to_string(), why));
            }
        }
        Ok(found)
    }

    /// Puts the gateway's verifier and limits back, ends every session of the role (the
    /// gateway's own ones too: which came through it cannot be told apart reliably, and a
    /// gateway client reconnects), and records why.
    async fn neutralise(
        &self,
        c: &Client,
        handle: &str,
        verifier: &str,
        why: &str,
    ) -> Result<(), ProviderError> {
        tracing::warn!(
            handle,
            what = why,
            "task role changed outside the gateway; restoring it and ending its sessions"
        );
        metrics::counter!("sandpit_template_tampered_total").increment(1);
        let q = quote_ident(handle);
        // Password first, so a session ended below cannot log in again with the agent's.
        c.batch_execute(&format!(
            "ALTER ROLE {q} PASSWORD {} VALID UNTIL 'infinity' CONNECTION LIMIT -1",
            quote_literal(verifier)
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

    /// A backend recorded without a verifier: a fresh one for the same password, recorded.
    async fn give_verifier(&self, c: &Client, handle: &str) -> Result<(), ProviderError> {
        let verifier = postgres_protocol::password::scram_sha_256(self.password(handle).as_bytes());
        c.batch_execute(&format!(
            "ALTER ROLE {} PASSWORD {}",
            quote_ident(handle),
            quote_literal(&verifier)
        ))
        .await
        .map_err(|e| pg_err("setting the task role's verifier", e))?;
        c.execute(
            &format!("UPDATE {RECORDS_TABLE} SET verifier = $2 WHERE handle = $1"),
            &[&handle, &verifier],
        )
        .await
        .map_err(|e| pg_err("recording the verifier", e))?;
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

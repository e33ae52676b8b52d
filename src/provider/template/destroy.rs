//! Destroying a scratch database, its task role and seatbelt logins so that nothing the role did can keep
//! either alive: not a template flag on the database, not objects or grants elsewhere on the
//! server, and never a role left able to log in.

use std::time::Instant;

use tokio_postgres::Client;

use super::seatbelt::roles_of;
use super::{
    pg_err, quote_ident, quote_literal, validate_handle, TemplateProvider, SESSIONS_LEAVE_WAIT,
};
use crate::provider::ProviderError;

impl TemplateProvider {
    /// Removes the database and the role, whatever the role did to either: its login goes
    /// first (a role that cannot be dropped keeps no way in), the template flag is cleared
    /// before the drop, and what it owns or was granted anywhere on the server is dropped
    /// before the role.
    pub(super) async fn destroy_inner(&self, h: &str) -> Result<(), ProviderError> {
        validate_handle(h)?;
        let q = quote_ident(h);
        let c = self.connect(None).await?;
        self.mark_destroying(&c, h).await?;
        let all = roles_of(h);
        // The task role and its seatbelt logins that exist (a fork cut off midway, or made
        // before the seatbelt logins, lacks some).
        let roles: Vec<String> = c
            .query(
                "SELECT rolname::text FROM pg_roles WHERE rolname = ANY($1)",
                &[&all.as_slice()],
            )
            .await
            .map_err(|e| pg_err("looking up the task roles", e))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for role in &roles {
            c.batch_execute(&format!(
                "ALTER ROLE {} NOLOGIN PASSWORD NULL",
                quote_ident(role)
            ))
            .await
            .map_err(|e| pg_err("locking the task role", e))?;
        }
        // Gateways (this one, or replicas sharing its registry) are ending their sessions on
        // it with the token's reason; let them leave first, so a client reads that reason
        // rather than the server's "terminating connection due to administrator command".
        let deadline = Instant::now() + SESSIONS_LEAVE_WAIT;
        loop {
            let open: i64 = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                    &[&h],
                )
                .await
                .map_err(|e| pg_err("reading pg_stat_activity", e))?
                .get(0);
            if open == 0 || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // Sessions of the role in other databases, too (a direct login to `postgres`).
        c.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE usename = ANY($1) AND pid <> pg_backend_pid()",
            &[&all.as_slice()],
        )
        .await
        .map_err(|e| pg_err("ending the task role's sessions", e))?;
        let db = c
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&h])
            .await
            .map_err(|e| pg_err("looking up the scratch database", e))?
            .is_some();
        if db {
            // A template database cannot be dropped; harmless when it is not one.
            c.batch_execute(&format!(
                "ALTER DATABASE {q} IS_TEMPLATE false ALLOW_CONNECTIONS true"
            ))
            .await
            .map_err(|e| pg_err("clearing the scratch database's flags", e))?;
        }
        // A prepared transaction holds its locks and blocks DROP DATABASE (and, if the role
        // prepared one elsewhere, DROP ROLE): roll back every one the task left behind (from
        // its own database, which accepts connections again by now).
        self.rollback_prepared(&c, h).await?;
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {q} WITH (FORCE)"))
            .await
            .map_err(|e| pg_err("dropping the scratch database", e))?;
        // The seatbelt logins own nothing but what they could make themselves (large
        // objects): dropped with them, wherever it is.
        for role in &roles {
            self.drop_owned_everywhere(&c, role).await?;
            c.batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(role)))
                .await
                .map_err(|e| pg_err("dropping the task role", e))?;
        }
        self.delete_record(&c, h).await?;
        tracing::debug!(handle = h, "scratch database destroyed");
        Ok(())
    }

    /// Before the end-of-token review: the task role's sessions anywhere and every session
    /// on its database ended (the gateway's or not: a direct login, a `dblink` loopback),
    /// waiting until each is gone, then its prepared transactions rolled back.
    pub(super) async fn quiesce_inner(&self, h: &str) -> Result<(), ProviderError> {
        validate_handle(h)?;
        let c = self.connect(None).await?;
        c.execute(
            "SELECT count(pg_terminate_backend(pid, $2)) FROM pg_stat_activity \
             WHERE (usename = ANY($1) OR datname = $3) AND pid <> pg_backend_pid()",
            &[
                &roles_of(h).as_slice(),
                &crate::provider::quiesce::TERMINATE_WAIT_MS,
                &h,
            ],
        )
        .await
        .map_err(|e| pg_err("ending the task's sessions before the review", e))?;
        let db = c
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&h])
            .await
            .map_err(|e| pg_err("looking up the scratch database", e))?
            .is_some();
        if db {
            // Flags that would shut the review (and the rollbacks below) out, as at destroy.
            c.batch_execute(&format!(
                "ALTER DATABASE {} IS_TEMPLATE false ALLOW_CONNECTIONS true",
                quote_ident(h)
            ))
            .await
            .map_err(|e| pg_err("clearing the scratch database's flags", e))?;
        }
        self.rollback_prepared(&c, h).await
    }

    /// Rolls back the prepared transactions in the task's database or owned by its role,
    /// each from the database it was prepared in (Postgres requires that).
    async fn rollback_prepared(&self, c: &Client, h: &str) -> Result<(), ProviderError> {
        let rows = c
            .query(
                "SELECT gid, database::text FROM pg_prepared_xacts                  WHERE database = $1 OR owner = $1 ORDER BY database",
                &[&h],
            )
            .await
            .map_err(|e| pg_err("listing prepared transactions", e))?;
        for r in rows {
            let gid: String = r.get(0);
            let db: String = r.get(1);
            let other = self.connect(Some(&db)).await?;
            other
                .batch_execute(&format!("ROLLBACK PREPARED {}", quote_literal(&gid)))
                .await
                .map_err(|e| pg_err("rolling back a prepared transaction", e))?;
            tracing::info!(handle = h, database = %db, "rolled back a prepared transaction left by the task");
        }
        Ok(())
    }

    /// `DROP OWNED BY` the role in every database where it owns or was granted something
    /// (and here, which also covers grants on shared objects), so `DROP ROLE` can succeed.
    async fn drop_owned_everywhere(&self, c: &Client, h: &str) -> Result<(), ProviderError> {
        let q = quote_ident(h);
        let dbs = c
            .query(
                "SELECT DISTINCT d.datname::text FROM pg_shdepend s \
                 JOIN pg_database d ON d.oid = s.dbid \
                 WHERE s.refclassid = 'pg_authid'::regclass \
                   AND s.refobjid = (SELECT oid FROM pg_roles WHERE rolname = $1) \
                   AND d.datname <> current_database()",
                &[&h],
            )
            .await
            .map_err(|e| pg_err("finding the task role's objects", e))?;
        c.batch_execute(&format!("DROP OWNED BY {q}"))
            .await
            .map_err(|e| pg_err("DROP OWNED", e))?;
        for r in dbs {
            let name: String = r.get(0);
            let other = self.connect(Some(&name)).await?;
            other
                .batch_execute(&format!("DROP OWNED BY {q}"))
                .await
                .map_err(|e| pg_err(&format!("DROP OWNED in {name}"), e))?;
        }
        Ok(())
    }
}

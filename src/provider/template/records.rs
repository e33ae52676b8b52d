//! What the `template` provider keeps about each scratch database: the tag the janitor reads
//! back, and the SCRAM verifiers the gateway set on the task role and its seatbelt logins
//! (one row each, the logins' without a tag). They live in a table of the
//! admin's own database that only the admin can read; a database comment would be readable by
//! every role on the server, other tasks included.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::logins::roles_of;
use super::{pg_err, quote_ident, Comment, TemplateProvider};
use crate::provider::{BackendTag, ProviderError};

/// Schema of the records table, in the admin DSN's database.
pub const RECORDS_SCHEMA: &str = "sandpit_template";
/// The records table, schema-qualified.
pub const RECORDS_TABLE: &str = "sandpit_template.backends";

impl TemplateProvider {
    /// Creates the schema and table once (across replicas), readable by the admin only.
    pub(super) async fn ensure_records(&self, c: &Client) -> Result<(), ProviderError> {
        let lock_id = i64::from_be_bytes(
            Sha256::digest(RECORDS_TABLE.as_bytes())[..8]
                .try_into()
                .unwrap_or([0; 8]),
        );
        // One transaction: CREATE … IF NOT EXISTS still races another replica's CREATE.
        c.batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({lock_id}); \
             CREATE SCHEMA IF NOT EXISTS {RECORDS_SCHEMA}; \
             REVOKE ALL ON SCHEMA {RECORDS_SCHEMA} FROM PUBLIC; \
             CREATE TABLE IF NOT EXISTS {RECORDS_TABLE} ( \
               handle text PRIMARY KEY, \
               tag text, \
               verifier text, \
               destroying boolean NOT NULL DEFAULT false, \
               tampered text); \
             REVOKE ALL ON TABLE {RECORDS_TABLE} FROM PUBLIC; \
             COMMIT"
        ))
        .await
        .map_err(|e| {
            pg_err(
                &format!("creating {RECORDS_TABLE} (the admin role needs CREATE on its database)"),
                e,
            )
        })
    }

    /// Records a backend about to be made: its tag and the verifier its role gets.
    pub(super) async fn put_record(
        &self,
        c: &Client,
        handle: &str,
        tag: &BackendTag,
        verifier: &str,
    ) -> Result<(), ProviderError> {
        let tag = tag_json(tag)?;
        c.execute(
            &format!(
                "INSERT INTO {RECORDS_TABLE} (handle, tag, verifier) VALUES ($1, $2, $3) \
                 ON CONFLICT (handle) DO UPDATE SET tag = $2, verifier = $3, \
                   destroying = false, tampered = NULL"
            ),
            &[&handle, &tag, &verifier],
        )
        .await
        .map_err(|e| pg_err("recording the scratch database", e))?;
        Ok(())
    }

    /// Records a seatbelt login of a backend (no tag: it is no database of its own) and
    /// the verifier it gets.
    pub(super) async fn put_role_record(
        &self,
        c: &Client,
        role: &str,
        verifier: &str,
    ) -> Result<(), ProviderError> {
        c.execute(
            &format!(
                "INSERT INTO {RECORDS_TABLE} (handle, verifier) VALUES ($1, $2) \
                 ON CONFLICT (handle) DO UPDATE SET verifier = $2, destroying = false, tampered = NULL"
            ),
            &[&role, &verifier],
        )
        .await
        .map_err(|e| pg_err("recording a seatbelt role", e))?;
        Ok(())
    }

    /// Marks a backend (its task role and seatbelt logins) as going away, so access checks
    /// stop restoring their logins.
    pub(super) async fn mark_destroying(
        &self,
        c: &Client,
        handle: &str,
    ) -> Result<(), ProviderError> {
        let roles = roles_of(handle);
        c.execute(
            &format!("UPDATE {RECORDS_TABLE} SET destroying = true WHERE handle = ANY($1)"),
            &[&roles.as_slice()],
        )
        .await
        .map_err(|e| pg_err("marking the scratch database", e))?;
        Ok(())
    }

    /// Forgets a backend whose database and roles are gone.
    pub(super) async fn delete_record(
        &self,
        c: &Client,
        handle: &str,
    ) -> Result<(), ProviderError> {
        let roles = roles_of(handle);
        c.execute(
            &format!("DELETE FROM {RECORDS_TABLE} WHERE handle = ANY($1)"),
            &[&roles.as_slice()],
        )
        .await
        .map_err(|e| pg_err("forgetting the scratch database", e))?;
        Ok(())
    }

    /// Every scratch-shaped database on the server with its tag. Databases tagged by a
    /// comment (before the records table) have the tag moved into the table and the comment
    /// cleared.
    pub(super) async fn tagged_databases(
        &self,
        c: &Client,
    ) -> Result<Vec<(String, Option<BackendTag>)>, ProviderError> {
        let rows = c
            .query(
                &format!(
                    "SELECT d.datname::text, b.tag, shobj_description(d.oid, 'pg_database') \
                     FROM pg_database d LEFT JOIN {RECORDS_TABLE} b ON b.handle = d.datname \
                     WHERE d.datname LIKE 'sp\\_%' OR d.datname LIKE 'pool-%' ORDER BY 1"
                ),
                &[],
            )
            .await
            .map_err(|e| pg_err("listing scratch databases", e))?;
        let mut out = Vec::new();
        let mut legacy: HashMap<String, BackendTag> = HashMap::new();
        for r in rows {
            let name: String = r.get(0);
            // Only names shaped like ours: other `sp_` databases are not ours to reap.
            if !super::is_scratch_name(&name) {
                continue;
            }
            let recorded: Option<String> = r.get(1);
            let comment: Option<String> = r.get(2);
            let tag = match recorded {
                Some(t) => serde_json::from_str::<BackendTag>(&t).ok(),
                None => {
                    let old = comment
                        .and_then(|c| serde_json::from_str::<Comment>(&c).ok())
                        .filter(|c| c.sandpit == "template")
                        .map(|c| c.tag);
                    if let Some(t) = &old {
                        legacy.insert(name.clone(), t.clone());
                    }
                    old
                }
            };
            out.push((name, tag));
        }
        for (name, tag) in legacy {
            if let Err(e) = self.move_comment_tag(c, &name, &tag).await {
                tracing::warn!(handle = %name, error = %e, "moving a comment tag into the records table failed");
            }
        }
        Ok(out)
    }

    async fn move_comment_tag(
        &self,
        c: &Client,
        name: &str,
        tag: &BackendTag,
    ) -> Result<(), ProviderError> {
        let json = tag_json(tag)?;
        // No verifier yet: the next access check gives the role a fresh one (same password).
        c.execute(
            &format!(
                "INSERT INTO {RECORDS_TABLE} (handle, tag) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            ),
            &[&name, &json],
        )
        .await
        .map_err(|e| pg_err("recording a comment-tagged database", e))?;
        c.batch_execute(&format!(
            "COMMENT ON DATABASE {} IS NULL",
            quote_ident(name)
        ))
        .await
        .map_err(|e| pg_err("clearing a database comment", e))?;
        tracing::info!(
            handle = name,
            "tag moved from the database comment to {RECORDS_TABLE}"
        );
        Ok(())
    }
}

/// The tag as the table stores it (the same JSON the database comment held).
pub(super) fn tag_json(tag: &BackendTag) -> Result<String, ProviderError> {
    serde_json::to_string(tag).map_err(|e| ProviderError::Other(format!("tag: {e}")))
}

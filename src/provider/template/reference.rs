//! The review reference of the `template` provider: a pristine fork of the golden database,
//! named after the golden's identity, that review diffs compare against.

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::{pg_err, TemplateProvider};
use crate::provider::{Backend, BackendTag, ProviderError};

impl TemplateProvider {
    /// `sp_ref_<hash>` of the golden's name, oid and comment: a rebuilt golden (new oid or
    /// comment) gets a reference of its own. Never shaped like a token id, so the janitor
    /// leaves it alone.
    pub(super) async fn reference_name(&self, c: &Client) -> Result<String, ProviderError> {
        let row = c
            .query_one(
                "SELECT oid::text, coalesce(shobj_description(oid, 'pg_database'), '') \
                 FROM pg_database WHERE datname = $1",
                &[&self.golden],
            )
            .await
            .map_err(|e| pg_err("reading the golden's identity", e))?;
        let (oid, comment): (String, String) = (row.get(0), row.get(1));
        let mut h = Sha256::new();
        for part in [self.golden.as_str(), &oid, &comment] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        Ok(format!("sp_ref_{}", &hex::encode(h.finalize())[..16]))
    }

    /// The reference database, forked from the golden on first use and then kept. Replicas
    /// sharing a server share it: one that finds it made by another uses it.
    pub(super) async fn reference_inner(&self) -> Result<Backend, ProviderError> {
        let _guard = self.reference_lock.lock().await;
        let r = self.reference.as_str();
        let c = self.connect(None).await?;
        let exists = c
            .query_opt(
                "SELECT 1 FROM pg_database d JOIN pg_roles r ON r.rolname = d.datname \
                 WHERE d.datname = $1 AND d.datallowconn",
                &[&r],
            )
            .await
            .map_err(|e| pg_err("looking up the reference database", e))?
            .is_some();
        if !exists {
            // A half-made one (a fork cut off midway) is dropped and made again.
            self.destroy_inner(r).await?;
            let tag = BackendTag {
                token_id: r.to_string(),
                task: "sandpit review reference".into(),
                expires_at: String::new(),
                gateway_id: String::new(),
                golden: None,
            };
            if let Err(e) = self.fork_inner(&tag).await {
                let _ = self.destroy_inner(r).await;
                return Err(e);
            }
            tracing::info!(reference = r, "review reference database forked");
        }
        Ok(self.backend(r, "reference"))
    }
}

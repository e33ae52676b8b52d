//! Golden handling of the `template` provider: building the golden database from SQL (once
//! per SQL text, across replicas), accepting an existing one, and checking its owner role.

use std::path::Path;
use std::time::Instant;

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::{pg_err, quote_ident, quote_literal, TemplateProvider};
use crate::provider::ProviderError;

/// Marker in the comment of a golden this provider built; bump to rebuild goldens.
const GOLDEN_FORMAT: &str = "sandpit-template-golden-v1";

impl TemplateProvider {
    /// Builds the golden from SQL unless a golden built from the same SQL exists.
    pub(super) async fn ensure_golden(
        &self,
        c: &Client,
        sql: &Path,
        owner: &str,
    ) -> Result<(), ProviderError> {
        let text = std::fs::read_to_string(sql).map_err(ProviderError::golden_io(format!(
            "reading {}",
            sql.display()
        )))?;
        let mut h = Sha256::new();
        h.update(text.as_bytes());
        h.update(GOLDEN_FORMAT.as_bytes());
        let want = format!("{GOLDEN_FORMAT}:{}", &hex::encode(h.finalize())[..16]);
        // One builder at a time, across gateway replicas sharing the server.
        let lock_id = i64::from_be_bytes(
            Sha256::digest(self.golden.as_bytes())[..8]
                .try_into()
                .unwrap_or([0; 8]),
        );
        c.execute("SELECT pg_advisory_lock($1)", &[&lock_id])
            .await
            .map_err(|e| pg_err("locking the golden build", e))?;
        let result = self.build_if_needed(c, &text, &want, owner).await;
        let _ = c
            .execute("SELECT pg_advisory_unlock($1)", &[&lock_id])
            .await;
        result
    }

    async fn build_if_needed(
        &self,
        c: &Client,
        sql: &str,
        want: &str,
        owner: &str,
    ) -> Result<(), ProviderError> {
        let g = quote_ident(&self.golden);
        let row = c
            .query_opt(
                "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1",
                &[&self.golden],
            )
            .await
            .map_err(|e| pg_err("looking up the golden", e))?;
        if let Some(row) = row {
            let comment: Option<String> = row.get(0);
            match comment.as_deref() {
                Some(have) if have == want => return Ok(()),
                Some(have) if have.starts_with("sandpit-template-golden") => {
                    tracing::info!(golden = %self.golden, "golden SQL changed; rebuilding the golden database");
                    let sqls = [
                        format!("ALTER DATABASE {g} IS_TEMPLATE false"),
                        format!("DROP DATABASE {g} WITH (FORCE)"),
                    ];
                    for s in sqls {
                        c.batch_execute(&s).await.map_err(|e| pg_err("dropping the old golden", e))?;
                    }
                }
                _ => {
                    return Err(ProviderError::Golden(format!(
                        "database {:?} exists and was not built by sandpit; unset the golden SQL to use it as it is, or name another template.golden",
                        self.golden
                    )))
                }
            }
        }
        let t0 = Instant::now();
        let o = quote_ident(owner);
        let exists = c
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&owner])
            .await
            .map_err(|e| pg_err("looking up the golden owner", e))?
            .is_some();
        if !exists {
            c.batch_execute(&format!(
                "CREATE ROLE {o} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION"
            ))
            .await
            .map_err(|e| pg_err("creating the golden owner role", e))?;
        }
        // Marked as ours before anything else, so a half-built golden is rebuilt, not refused.
        for s in [
            format!("CREATE DATABASE {g}"),
            format!(
                "COMMENT ON DATABASE {g} IS {}",
                quote_literal(&format!("{GOLDEN_FORMAT}:building"))
            ),
            format!("REVOKE ALL ON DATABASE {g} FROM PUBLIC"),
        ] {
            c.batch_execute(&s)
                .await
                .map_err(|e| pg_err("creating the golden", e))?;
        }
        let gc = self.connect(Some(&self.golden)).await?;
        gc.batch_execute(&format!("ALTER SCHEMA public OWNER TO {o}; SET ROLE {o}"))
            .await
            .map_err(|e| pg_err("preparing the golden", e))?;
        gc.batch_execute(sql)
            .await
            .map_err(|e| pg_err("running the golden SQL", e))?;
        gc.batch_execute("RESET ROLE")
            .await
            .map_err(|e| pg_err("golden", e))?;
        gc.batch_execute("VACUUM ANALYZE")
            .await
            .map_err(|e| pg_err("vacuuming the golden", e))?;
        drop(gc);
        // No connections, ever: CREATE DATABASE … TEMPLATE refuses a golden in use.
        for s in [
            format!("COMMENT ON DATABASE {g} IS {}", quote_literal(want)),
            format!("ALTER DATABASE {g} IS_TEMPLATE true ALLOW_CONNECTIONS false"),
        ] {
            c.batch_execute(&s)
                .await
                .map_err(|e| pg_err("sealing the golden", e))?;
        }
        tracing::info!(golden = %self.golden, elapsed_ms = t0.elapsed().as_millis() as u64, "golden database built");
        Ok(())
    }

    /// An existing golden: it must exist; its objects' owner is configured or its owner.
    pub(super) async fn check_existing_golden(
        &self,
        c: &Client,
        owner: Option<&str>,
    ) -> Result<String, ProviderError> {
        let row = c
            .query_opt(
                "SELECT pg_get_userbyid(datdba)::text, datallowconn FROM pg_database WHERE datname = $1",
                &[&self.golden],
            )
            .await
            .map_err(|e| pg_err("looking up the golden", e))?
            .ok_or_else(|| {
                ProviderError::Golden(format!(
                    "golden database {:?} does not exist (set template.golden_sql to build it)",
                    self.golden
                ))
            })?;
        let dba: String = row.get(0);
        let allow: bool = row.get(1);
        if allow {
            tracing::warn!(golden = %self.golden, "the golden accepts connections; any open one makes forks fail (ALTER DATABASE … ALLOW_CONNECTIONS false prevents that)");
        }
        Ok(owner.map(str::to_string).unwrap_or(dba))
    }

    /// `REASSIGN OWNED` also moves shared objects (databases, tablespaces): refuse an owner
    /// that has any, or the first fork would take them.
    pub(super) async fn check_owner_shared_objects(&self, c: &Client) -> Result<(), ProviderError> {
        let row = c
            .query_one(
                "SELECT r.rolsuper, \
                   (SELECT string_agg(datname, ', ') FROM pg_database WHERE datdba = r.oid) \
                   || coalesce(', ' || (SELECT string_agg(spcname, ', ') FROM pg_tablespace WHERE spcowner = r.oid), '') \
                 FROM pg_roles r WHERE r.rolname = $1",
                &[&self.owner],
            )
            .await
            .map_err(|e| pg_err("checking the golden owner", e))?;
        let superuser: bool = row.get(0);
        let shared: Option<String> = row.get(1);
        if superuser {
            return Err(ProviderError::Golden(format!(
                "the golden's objects are owned by superuser {:?}; give them to an ordinary role and set template.golden_owner",
                self.owner
            )));
        }
        if let Some(s) = shared.filter(|s| !s.is_empty()) {
            return Err(ProviderError::Golden(format!(
                "golden owner {:?} owns {s}; every fork reassigns what that role owns to the task role, so make another role own them (e.g. ALTER DATABASE … OWNER TO the admin role)",
                self.owner
            )));
        }
        Ok(())
    }
}

//! The `template` provider: scratch databases on a Postgres server you already run. A fork is
//! `CREATE DATABASE <token> TEMPLATE <golden>` (owned by the admin role, so the task cannot
//! change the database's flags, limits or settings) plus a login role of its own (named like
//! the database) with `CONNECT, CREATE, TEMPORARY` on it, whose password the gateway derives
//! from a key it keeps; the golden's objects are handed to that role with `REASSIGN OWNED`
//! inside the new database. Tokens not allowed `ddl` log in as the database's read or write
//! login instead ([`seatbelt`]), which own nothing. Tags and verifiers are kept in an admin-only table
//! ([`records`]), so `list()` finds the databases and other tasks cannot read them.

mod access;
mod destroy;
mod gate;
mod golden;
pub mod hba;
mod key;
mod logins;
pub mod records;
mod reference;
mod retag;
pub mod seatbelt;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, NoTls};

use super::pool::POOL_PREFIX;
use super::{Backend, BackendTag, BoxFuture, Provider, ProviderError};
use crate::pgconn::stream as backend_stream;
use crate::pgconn::tls::{self as btls, SslMode};
use crate::pgconn::{BackendAddr, BackendTarget, Endpoint};
use key::load_key;

/// Longest wait at destroy for the gateways' own sessions to leave before they are forced out.
const SESSIONS_LEAVE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
/// Default owner role of the objects of a golden built from SQL.
pub const DEFAULT_GOLDEN_OWNER: &str = "sandpit_golden_owner";

/// Settings of the `template` provider.
#[derive(Debug, Clone)]
pub struct TemplateConfig {
    /// libpq-style DSN of a role that may create databases and roles (tested: a superuser).
    pub admin_dsn: String,
    /// Name of the golden database.
    pub golden: String,
    /// SQL file to build the golden from; None = the golden database exists already.
    pub golden_sql: Option<PathBuf>,
    /// Role owning the golden's objects; default: `sandpit_golden_owner` for a built golden,
    /// else the owner of the golden database.
    pub golden_owner: Option<String>,
    /// TLS towards the server (admin and task connections); None = the DSN's `sslmode`.
    pub sslmode: Option<SslMode>,
    /// CA file to verify the server with.
    pub ca_file: Option<PathBuf>,
    /// File holding the key task-role passwords are derived from (created, mode 0600).
    pub key_file: PathBuf,
    /// The key itself, hex, when replicas share it (from the shared registry); `key_file`
    /// is then not used.
    pub shared_key: Option<String>,
    /// Start even when the server's `pg_hba.conf` lets task roles in from elsewhere than the
    /// gateway (the operator vouches that the network keeps agents away).
    pub trust_network: bool,
}

/// What a scratch database's comment held before tags moved to [`records`].
#[derive(Debug, Serialize, Deserialize)]
struct Comment {
    sandpit: String,
    #[serde(flatten)]
    tag: BackendTag,
}

/// Forks are databases cloned from a golden database on one shared server.
pub struct TemplateProvider {
    admin: tokio_postgres::Config,
    admin_db: String,
    endpoint: Endpoint,
    golden: String,
    owner: String,
    key: Vec<u8>,
    secrets: Vec<String>,
    /// Name of the reference database (a pristine fork that reviews compare against), derived
    /// from the golden's identity so a changed golden gets a new one.
    reference: String,
    /// Single-flight creation of the reference database.
    reference_lock: tokio::sync::Mutex<()>,
    /// Admin session kept for the per-session access checks and warm-pool claims.
    checker: tokio::sync::Mutex<Option<Client>>,
    /// Claims' re-tags waiting for the kept admin session, written together.
    retags: retag::RetagQueue,
    /// Whether the admin role can read `pg_authid` (superuser): without it, a task role's
    /// password change cannot be detected.
    can_read_verifiers: bool,
    /// One-login passwords for every task-role login ([`gate`]).
    gate: Arc<gate::RoleGate>,
}
fn tpl(e: impl std::fmt::Display) -> ProviderError {
    ProviderError::Template(e.to_string())
}

/// A failed statement of the admin connection (shown with its SQLSTATE and message).
fn pg_err(what: &str, source: tokio_postgres::Error) -> ProviderError {
    ProviderError::TemplateSql {
        what: what.to_string(),
        source,
    }
}

/// A database this provider made: a token's, or a warm-pool member (whose handle is
/// `pool-` + the 20 characters of a token id).
fn is_scratch_name(name: &str) -> bool {
    crate::auth::is_token_id(name)
        || name
            .strip_prefix(POOL_PREFIX)
            .is_some_and(|rest| crate::auth::is_token_id(&format!("sp_{rest}")))
}

/// `"name"` with embedded quotes doubled.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// An `E'…'` literal, correct whatever `standard_conforming_strings` is.
fn quote_literal(s: &str) -> String {
    format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// Handles are token ids (`sp_` + lowercase base32) or warm-pool member names (`pool-` +
/// lowercase base32), safe as quoted identifiers and file names.
fn validate_handle(h: &str) -> Result<(), ProviderError> {
    let ok = h.len() <= 63
        && (h.starts_with("sp_") || h.starts_with(POOL_PREFIX))
        && h.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || (b == b'-' && i == 4)
        });
    if ok {
        Ok(())
    } else {
        Err(ProviderError::NotFound(format!("invalid handle {h:?}")))
    }
}
/// An admin session on `db`, over our own socket so that TLS follows `sslmode` exactly as
/// task connections do.
async fn admin_session(
    admin: &tokio_postgres::Config,
    endpoint: &Endpoint,
    db: &str,
) -> Result<Client, ProviderError> {
    let stream =
        backend_stream::open(endpoint)
            .await
            .map_err(|source| ProviderError::TemplateIo {
                what: "connecting as admin".into(),
                source,
            })?;
    let mut cfg = admin.clone();
    cfg.dbname(db)
        .ssl_mode(tokio_postgres::config::SslMode::Disable);
    let (client, conn) = cfg
        .connect_raw(stream, NoTls)
        .await
        .map_err(|e| pg_err("admin login", e))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "admin connection ended");
        }
    });
    Ok(client)
}

impl TemplateProvider {
    /// Connects as admin, checks (or builds) the golden and its owner role.
    pub async fn new(cfg: TemplateConfig) -> Result<Self, ProviderError> {
        let key = match &cfg.shared_key {
            Some(k) => hex::decode(k).map_err(|e| tpl(format!("shared template key: {e}")))?,
            None => load_key(&cfg.key_file)?,
        };
        let mut p = Self::configured(&cfg, key)?;
        p.start(&cfg).await?;
        Ok(p)
    }

    /// Only the start-up's `pg_hba.conf` check, for `serve --check-config` (nothing made,
    /// no key read or created).
    pub async fn check_network(cfg: &TemplateConfig) -> Result<(), ProviderError> {
        if cfg.trust_network {
            return Ok(());
        }
        let p = Self::configured(cfg, Vec::new())?;
        let c = p.connect(None).await?;
        p.check_hba(&c).await
    }

    /// The provider from its settings, before any connection.
    fn configured(cfg: &TemplateConfig, key: Vec<u8>) -> Result<Self, ProviderError> {
        let admin: tokio_postgres::Config = cfg
            .admin_dsn
            .parse()
            .map_err(|e| pg_err("template.admin_dsn", e))?;
        let user = admin
            .get_user()
            .ok_or_else(|| tpl("template.admin_dsn names no user"))?
            .to_string();
        let port = admin.get_ports().first().copied().unwrap_or(5432);
        let sslmode = cfg.sslmode.unwrap_or(match admin.get_ssl_mode() {
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            _ => SslMode::Disable,
        });
        let tls_cfg = btls::client_config(sslmode, cfg.ca_file.as_deref())?;
        let mut secrets = vec![user.clone()];
        let endpoint = match admin.get_hosts().first() {
            Some(Host::Tcp(h)) => {
                secrets.push(h.clone());
                Endpoint {
                    addr: BackendAddr::Tcp {
                        host: h.clone(),
                        port,
                    },
                    tls: btls::for_host(&tls_cfg, h),
                }
            }
            Some(Host::Unix(dir)) => {
                secrets.push(dir.display().to_string());
                Endpoint::unix(dir.join(format!(".s.PGSQL.{port}")))
            }
            None => return Err(tpl("template.admin_dsn names no host")),
        };
        let admin_db = admin.get_dbname().unwrap_or(&user).to_string();
        let gate = Arc::new(gate::RoleGate::new(
            admin.clone(),
            admin_db.clone(),
            endpoint.clone(),
        ));
        Ok(TemplateProvider {
            admin,
            admin_db,
            endpoint,
            golden: cfg.golden.clone(),
            owner: String::new(),
            key,
            secrets,
            reference: String::new(),
            reference_lock: tokio::sync::Mutex::new(()),
            checker: tokio::sync::Mutex::new(None),
            retags: retag::RetagQueue::default(),
            can_read_verifiers: false,
            gate,
        })
    }

    /// Records, groups, the `pg_hba.conf` check, the golden and its reference.
    async fn start(&mut self, cfg: &TemplateConfig) -> Result<(), ProviderError> {
        let p = self;
        let c = p.connect(None).await?;
        p.ensure_records(&c).await?;
        p.ensure_groups(&c).await?;
        if cfg.trust_network {
            tracing::warn!("[template] trust_network = true: pg_hba.conf is not checked; a task role that changes its own password can log in directly from wherever the server's rules allow, until the next access check");
        } else {
            p.check_hba(&c).await?;
        }
        p.can_read_verifiers = c
            .query_one("SELECT has_table_privilege('pg_authid', 'SELECT')", &[])
            .await
            .map_err(|e| pg_err("checking access to pg_authid", e))?
            .get(0);
        p.gate
            .can_read_verifiers
            .store(p.can_read_verifiers, std::sync::atomic::Ordering::Relaxed);
        if !p.can_read_verifiers {
            tracing::warn!("the template admin role cannot read pg_authid (it is no superuser): a task role that changes its own password is not detected, and can log in to the server directly if the network lets it");
        }
        p.owner = match &cfg.golden_sql {
            Some(sql) => {
                let owner = cfg
                    .golden_owner
                    .clone()
                    .unwrap_or_else(|| DEFAULT_GOLDEN_OWNER.into());
                p.ensure_golden(&c, sql, &owner).await?;
                owner
            }
            None => {
                p.check_existing_golden(&c, cfg.golden_owner.as_deref())
                    .await?
            }
        };
        p.check_owner_shared_objects(&c).await?;
        p.reference = p.reference_name(&c).await?;
        let busy: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&p.golden],
            )
            .await
            .map_err(|e| pg_err("reading pg_stat_activity", e))?
            .get(0);
        if busy > 0 {
            tracing::warn!(golden = %p.golden, connections = busy,
                "the golden database has open connections; forks fail until they are closed");
        }
        tracing::info!(golden = %p.golden, owner = %p.owner, "template provider ready");
        Ok(())
    }

    /// An admin session on `db` (default: the DSN's database).
    async fn connect(&self, db: Option<&str>) -> Result<Client, ProviderError> {
        admin_session(&self.admin, &self.endpoint, db.unwrap_or(&self.admin_db)).await
    }
    fn backend(&self, handle: &str, method: &str) -> Backend {
        Backend {
            handle: handle.to_string(),
            target: BackendTarget {
                endpoint: self.endpoint.clone(),
                user: handle.to_string(),
                database: handle.to_string(),
                // No password at rest: each login gets its own ([`gate`]).
                password: None,
                gate: Some(self.gate.clone()),
            },
            method: method.to_string(),
            netns: false,
            golden: None,
        }
    }
    async fn fork_inner(&self, tag: &BackendTag) -> Result<(), ProviderError> {
        let h = tag.token_id.as_str();
        let q = quote_ident(h);
        let g = quote_ident(&self.golden);
        let c = self.connect(None).await?;
        // The verifier, not the password, goes over the wire and into any server log.
        let verifier = self.rest_verifier(h).await?;
        // Recorded first: a fork cut off midway is tagged, so the janitor can remove it.
        self.put_record(&c, h, tag, &verifier).await?;
        c.batch_execute(&format!(
            "CREATE ROLE {q} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT PASSWORD {} VALID UNTIL '-infinity'",
            quote_literal(&verifier)
        ))
        .await
        .map_err(|e| pg_err("creating the task role", e))?;
        c.batch_execute(&format!("GRANT {} TO {q}", hba::TASKS_GROUP))
            .await
            .map_err(|e| pg_err("adding the task role to its pg_hba group", e))?;
        self.create_seatbelt_roles(&c, h).await?;
        if let Err(e) = c
            .batch_execute(&format!("CREATE DATABASE {q} TEMPLATE {g}"))
            .await
        {
            if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE) {
                return Err(ProviderError::Fork(format!(
                    "the golden database {:?} is being accessed by other users; CREATE DATABASE … TEMPLATE needs it free of connections: close them (see pg_stat_activity) and keep them away with ALTER DATABASE … ALLOW_CONNECTIONS false",
                    self.golden
                )));
            }
            return Err(pg_err("CREATE DATABASE … TEMPLATE", e));
        }
        // The admin keeps the database: its owner may change its template flag, connection
        // limit and settings, which would let the agent dodge revoke and review.
        c.batch_execute(&format!(
            "REVOKE ALL ON DATABASE {q} FROM PUBLIC; GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {q} TO {q}"
        ))
        .await
        .map_err(|e| pg_err("granting the scratch database", e))?;
        let dc = self.connect(Some(h)).await?;
        // Checked again right before: a shared object owned by the golden owner would move too.
        let shared: i64 = dc
            .query_one(
                "SELECT (SELECT count(*) FROM pg_database d JOIN pg_roles r ON r.oid = d.datdba WHERE r.rolname = $1) \
                      + (SELECT count(*) FROM pg_tablespace t JOIN pg_roles r ON r.oid = t.spcowner WHERE r.rolname = $1)",
                &[&self.owner],
            )
            .await
            .map_err(|e| pg_err("checking the golden owner", e))?
            .get(0);
        if shared > 0 {
            return Err(ProviderError::Fork(format!(
                "golden owner {:?} now owns a database or tablespace; refusing to REASSIGN OWNED",
                self.owner
            )));
        }
        dc.batch_execute(&format!(
            "REASSIGN OWNED BY {} TO {q}",
            quote_ident(&self.owner)
        ))
        .await
        .map_err(|e| pg_err("REASSIGN OWNED", e))?;
        // Schemas left to `pg_database_owner` (PostgreSQL 15's `public` in a golden not built
        // here) would now be the admin's: the task gets them as it got them owning the database.
        let schemas = dc
            .query(
                "SELECT nspname::text FROM pg_namespace \
                 WHERE nspowner = (SELECT oid FROM pg_roles WHERE rolname = 'pg_database_owner')",
                &[],
            )
            .await
            .map_err(|e| pg_err("reading schema owners", e))?;
        for r in schemas {
            let name: String = r.get(0);
            dc.batch_execute(&format!("ALTER SCHEMA {} OWNER TO {q}", quote_ident(&name)))
                .await
                .map_err(|e| pg_err("handing a schema to the task role", e))?;
        }
        self.grant_seatbelt(&c, &dc, h).await
    }
}

impl Provider for TemplateProvider {
    fn name(&self) -> &'static str {
        "template"
    }

    fn fork<'a>(&'a self, tag: &'a BackendTag) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let t0 = Instant::now();
            validate_handle(&tag.token_id)?;
            if let Err(e) = self.fork_inner(tag).await {
                if let Err(e2) = self.destroy_inner(&tag.token_id).await {
                    tracing::warn!(handle = %tag.token_id, error = %e2, "cleanup after failed fork");
                }
                return Err(e);
            }
            tracing::info!(handle = %tag.token_id, elapsed_ms = t0.elapsed().as_millis() as u64, "database forked");
            Ok(self.backend(&tag.token_id, "template"))
        })
    }

    fn ensure_running<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            validate_handle(handle)?;
            let c = self.connect(None).await?;
            let found = c
                .query_opt(
                    "SELECT 1 FROM pg_database d JOIN pg_roles r ON r.rolname = d.datname WHERE d.datname = $1",
                    &[&handle],
                )
                .await
                .map_err(|e| pg_err("looking up the scratch database", e))?;
            if found.is_none() {
                return Err(ProviderError::NotFound(handle.to_string()));
            }
            drop(c);
            self.check_access_inner(handle).await?;
            Ok(self.backend(handle, "adopted"))
        })
    }

    fn check_access<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            validate_handle(handle)?;
            self.check_access_inner(handle).await
        })
    }

    fn destroy<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(self.destroy_inner(handle))
    }

    fn ended_backend<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            match self.ensure_running(handle).await {
                // Its password was put back and its sessions cut when the change was found.
                Err(ProviderError::Tampered(why)) => {
                    tracing::info!(
                        handle,
                        why,
                        "reviewing a backend whose access was tampered with"
                    );
                    Ok(self.backend(handle, "adopted"))
                }
                r => r,
            }
        })
    }

    fn quiesce<'a>(&'a self, backend: &'a Backend) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(self.quiesce_inner(&backend.handle))
    }

    fn stop<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        // The server is shared and stays up; the gateway ends the sessions itself.
        Box::pin(async move { validate_handle(handle) })
    }

    /// Also the janitor's access check: every recorded role is compared with what the
    /// gateway set, and a change is undone here (reported again by [`Provider::check_access`]).
    fn list(&self) -> BoxFuture<'_, Result<Vec<(String, Option<BackendTag>)>, ProviderError>> {
        Box::pin(async move {
            let c = self.connect(None).await?;
            let out = self.tagged_databases(&c).await?;
            match self.check_roles(&c, None).await {
                Ok(found) => {
                    for (handle, why) in found {
                        tracing::warn!(handle, what = %why, "backend access was changed outside the gateway; its token should end");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "checking task roles failed"),
            }
            Ok(out)
        })
    }

    fn secrets(&self) -> Vec<String> {
        self.secrets.clone()
    }

    /// The task role for `ddl` (or no policy), else the database's write or read login
    /// ([`seatbelt`]): the server refuses what the policy forbids. A fork made before the
    /// seatbelt logins has none, and its narrower sessions are refused at login.
    fn session_target(&self, backend: &Backend, allow: Option<&[String]>) -> BackendTarget {
        let role = seatbelt::login_role(&backend.handle, allow);
        let mut t = backend.target.clone();
        t.password = None;
        t.gate = Some(self.gate.clone());
        t.user = role;
        t
    }

    // One golden, no versions (golden builds are instance-only): one reference.
    fn reference<'a>(
        &'a self,
        _golden: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(self.reference_inner())
    }

    fn release_reference(&self) -> BoxFuture<'_, Result<(), ProviderError>> {
        Box::pin(async move {
            let _guard = self.reference_lock.lock().await;
            self.destroy_inner(&self.reference).await
        })
    }

    /// A claimed warm-pool member gets the token's tag in the records table, so the janitor
    /// reads it as that token's backend (the database and role keep the pool name).
    fn retag<'a>(
        &'a self,
        handle: &'a str,
        tag: &'a BackendTag,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            validate_handle(handle)?;
            // On the kept session: a claim is on a first connection's path, and a login of
            // its own (TLS, SCRAM, a new server backend) was most of a claim's server CPU,
            // which a burst of claims queues behind on a busy server. Queued, so that a
            // burst's claims share statements instead of taking turns (see `retag`).
            self.retag_queued(handle, tag).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_handles() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's \\x"), "E'it''s \\\\x'");
        assert!(validate_handle("sp_abc234").is_ok());
        assert!(validate_handle("postgres").is_err());
        assert!(validate_handle("sp_A").is_err());
        assert!(validate_handle("sp_a;drop").is_err());
        assert!(validate_handle("pool-abc234").is_ok());
        assert!(validate_handle("pool-a-b").is_err());
        assert!(validate_handle("pool_ab").is_err());
        assert!(is_scratch_name("pool-abcdefghijklmnopqrst"));
        assert!(!is_scratch_name("pool-abc"));
        assert!(!is_scratch_name("sp_other"));
    }

    #[test]
    fn comment_round_trips_the_tag() {
        let tag = BackendTag {
            token_id: "sp_x".into(),
            task: "t".into(),
            expires_at: "2030-01-01T00:00:00Z".into(),
            gateway_id: String::new(),
            golden: None,
        };
        let s = serde_json::to_string(&Comment {
            sandpit: "template".into(),
            tag: tag.clone(),
        })
        .unwrap();
        let back: Comment = serde_json::from_str(&s).unwrap();
        assert_eq!(back.tag, tag);
        assert!(s.contains("\"token_id\":\"sp_x\""), "{s}");
    }
}

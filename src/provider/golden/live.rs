//! Filling a golden from a live database: `pg_dump` of the source (its own read-only,
//! repeatable-read transaction) piped straight into `psql` as the agent in the staging
//! cluster, then masking and sampling, then `VACUUM FULL` so no original value is left in
//! dead tuples. The source's password only ever travels in the child's environment.

use std::path::Path;
use std::process::Stdio;

use serde::Serialize;

use super::psql::{psql, psql_command, tail, CHECKPOINTS};
use super::roles::{create_roles, AGENT, DATABASE, SUPERUSER};
use super::GoldenCtx;
use crate::pg::process;
use crate::provider::conninfo;
use crate::provider::mask::{self, MaskReport, MaskRules};
use crate::provider::ProviderError;

/// libpq parameters that are secrets: never stored, shown or put on a command line.
const SECRET_PARAMS: [&str; 2] = ["password", "sslpassword"];

/// A source database, parsed from a DSN (URL or `key=value` form) the way libpq parses it.
/// Every parameter reaches libpq as given (`sslmode=verify-full&sslrootcert=…` included);
/// only the password is kept apart, for the child's environment.
#[derive(Clone)]
pub struct SourceDsn {
    /// Everything but the password, in the order given.
    params: conninfo::Params,
    password: Option<String>,
}

impl std::fmt::Debug for SourceDsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.write_str(&self.describe())
    }
}

impl SourceDsn {
    /// The DSN again, password included: only for passing it on to a worker over its TLS
    /// API (never for a log or an answer).
    pub fn to_dsn(&self) -> String {
        let mut all = self.params.clone();
        if let Some(p) = &self.password {
            all.push(("password".to_string(), p.clone()));
        }
        conninfo::render(&all)
    }

    /// Parses a libpq-style DSN.
    pub fn parse(dsn: &str) -> Result<SourceDsn, ProviderError> {
        let all = conninfo::parse(dsn).map_err(|e| {
            // The parser's messages quote keywords and malformed parts, never a value that
            // parsed; the DSN itself is not echoed.
            ProviderError::Invalid(format!("from_dsn is not a valid PostgreSQL DSN: {e}"))
        })?;
        if all.iter().any(|(k, _)| k == "sslpassword") {
            // No environment variable carries it, and a command line is readable by others.
            return Err(ProviderError::Invalid(
                "from_dsn: sslpassword is not supported (use an unencrypted key file readable only by the gateway)".to_string(),
            ));
        }
        let password = conninfo::get(&all, "password").map(str::to_string);
        let params: conninfo::Params = all.into_iter().filter(|(k, _)| k != "password").collect();
        if conninfo::get(&params, "host")
            .or(conninfo::get(&params, "hostaddr"))
            .is_none_or(str::is_empty)
        {
            return Err(ProviderError::Invalid("from_dsn names no host".to_string()));
        }
        Ok(SourceDsn { params, password })
    }

    /// `postgresql://user@host:port/db`, without the password: safe to store and show.
    pub fn describe(&self) -> String {
        let get = |k| conninfo::get(&self.params, k);
        format!(
            "postgresql://{}{}{}/{}",
            get("user").map(|u| format!("{u}@")).unwrap_or_default(),
            get("host").or(get("hostaddr")).unwrap_or(""),
            get("port")
                .filter(|p| !p.is_empty())
                .map(|p| format!(":{p}"))
                .unwrap_or_default(),
            get("dbname").unwrap_or("")
        )
    }

    /// The password, so callers can check it went nowhere.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The connection string for `pg_dump --dbname`: every parameter but the password
    /// (a command line is readable by other local users).
    fn conninfo(&self) -> String {
        self.public_conninfo()
    }

    /// Every parameter but the secret ones (`password`, `sslpassword`), as a libpq
    /// `key='value'` list: safe to store with the golden and show, and what promotion
    /// reaches the source with by default (the password then comes from the gateway's
    /// environment).
    pub fn public_conninfo(&self) -> String {
        let kept: conninfo::Params = self
            .params
            .iter()
            .filter(|(k, _)| !SECRET_PARAMS.contains(&k.as_str()))
            .cloned()
            .collect();
        conninfo::render(&kept)
    }

    /// libpq environment for `pg_dump`: the password, and defaults the DSN may override.
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("PGAPPNAME", "sandpit golden build".to_string()),
            ("PGCONNECT_TIMEOUT", "10".to_string()),
        ];
        if let Some(p) = &self.password {
            env.push(("PGPASSWORD", p.clone()));
        }
        env
    }
}

/// What to copy from the source and how to mask it.
#[derive(Debug, Clone)]
pub struct LiveSpec {
    /// The source.
    pub source: SourceDsn,
    /// Only these schemas (all when empty).
    pub schemas: Vec<String>,
    /// Tables left out (`pg_dump --exclude-table` patterns).
    pub exclude_tables: Vec<String>,
    /// Masking and sampling rules.
    pub mask: MaskRules,
    /// The version id to build under (a front chooses one for all its workers, so that an
    /// id names the same content everywhere); None: a new one.
    pub id: Option<String>,
    /// The rules' text as given, for a front to pass on to its workers.
    pub mask_text: Option<String>,
}

impl LiveSpec {
    /// A build as an API body asks for it (the gateway's own API, or a front's to a worker):
    /// the DSN and the rules' text parsed, the text kept for passing on.
    pub fn from_request(
        from_dsn: &str,
        schemas: Vec<String>,
        exclude_tables: Vec<String>,
        mask_text: Option<String>,
        id: Option<String>,
    ) -> Result<LiveSpec, ProviderError> {
        let source = SourceDsn::parse(from_dsn)?;
        let mask = match mask_text.as_deref().map(MaskRules::parse).transpose() {
            Ok(m) => m.unwrap_or_default(),
            Err(e) => return Err(ProviderError::InvalidMask(e)),
        };
        Ok(LiveSpec {
            source,
            schemas,
            exclude_tables,
            mask,
            id,
            mask_text,
        })
    }
}

/// What a build from a live database did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BuildReport {
    /// Tables in the golden.
    pub tables: u64,
    /// The source's connection parameters without any secret ([`SourceDsn::public_conninfo`]):
    /// the default target of a promotion.
    pub source_conninfo: String,
    /// Masking and sampling.
    #[serde(flatten)]
    pub mask: MaskReport,
}

fn name_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= 200 && !s.contains('\0') && !s.starts_with('-')
}

/// Dump, restore, mask, vacuum, checkpoint; the server in `sock` is a fresh staging cluster.
pub async fn load(
    ctx: &GoldenCtx<'_>,
    sock: &Path,
    spec: &LiveSpec,
) -> Result<BuildReport, ProviderError> {
    for s in spec.schemas.iter().chain(&spec.exclude_tables) {
        if !name_ok(s) {
            return Err(ProviderError::Invalid(format!(
                "schema or table pattern {s:?} is not allowed"
            )));
        }
    }
    create_roles(ctx, sock).await?;
    copy_source(ctx, sock, spec).await?;
    let mut client = superuser_client(sock).await?;
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
               AND n.nspname NOT LIKE 'pg\\_toast%'",
            &[],
        )
        .await
        .map_err(ProviderError::golden_sql("counting tables"))?
        .get(0);
    let mask = mask::apply(&mut client, &spec.mask)
        .await
        .map_err(|e| match e {
            mask::MaskError::Invalid(_) => ProviderError::InvalidMask(e),
            mask::MaskError::Apply(_) => ProviderError::Mask(e),
        })?;
    // Rewrites every table and index: the rows before masking and sampling become
    // unreachable files that are truncated at once, not dead tuples in live pages.
    client
        .batch_execute("VACUUM (FULL, ANALYZE)")
        .await
        .map_err(ProviderError::golden_sql("VACUUM FULL"))?;
    drop(client);
    psql(&ctx.bins.psql, sock, SUPERUSER, "postgres", &CHECKPOINTS).await?;
    Ok(BuildReport {
        tables: tables as u64,
        source_conninfo: spec.source.public_conninfo(),
        mask,
    })
}

async fn superuser_client(sock: &Path) -> Result<tokio_postgres::Client, ProviderError> {
    let (client, conn) = tokio_postgres::Config::new()
        .host_path(sock)
        .port(process::PORT)
        .user(SUPERUSER)
        .dbname(DATABASE)
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(ProviderError::golden_sql("connecting to the staging copy"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// `pg_dump` of the source into `psql` as the agent, one transaction, nothing on disk
/// between them. pg_dump reads inside `BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY`
/// (it sets that itself), so the source only ever sees reads.
async fn copy_source(
    ctx: &GoldenCtx<'_>,
    sock: &Path,
    spec: &LiveSpec,
) -> Result<(), ProviderError> {
    let mut dump = tokio::process::Command::new(ctx.bins.bin_dir.join("pg_dump"));
    dump.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .envs(spec.source.env())
        .args([
            "--format=plain",
            "--no-owner",
            "--no-privileges",
            "--no-tablespaces",
            "--no-publications",
            "--no-subscriptions",
            "--no-security-labels",
            "--no-comments",
        ])
        .arg(format!("--dbname={}", spec.source.conninfo()));
    for s in &spec.schemas {
        dump.arg(format!("--schema={s}"));
    }
    for t in &spec.exclude_tables {
        dump.arg(format!("--exclude-table={t}"));
    }
    let mut dump = dump
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(ProviderError::golden_io("running pg_dump"))?;
    let Some(out) = dump.stdout.take() else {
        return Err(ProviderError::Golden("pg_dump has no stdout".into()));
    };
    let out: Stdio = out
        .try_into()
        .map_err(ProviderError::golden_io("piping pg_dump"))?;
    let restore = psql_command(&ctx.bins.psql, sock, AGENT, DATABASE)
        .arg("--single-transaction")
        .stdin(out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(ProviderError::golden_io("running psql"))?;
    let (dumped, restored) = tokio::join!(dump.wait_with_output(), restore.wait_with_output());
    let dumped = dumped.map_err(ProviderError::golden_io("pg_dump"))?;
    let restored = restored.map_err(ProviderError::golden_io("psql"))?;
    // A failed restore breaks pg_dump's pipe too: its own message is the cause.
    if !restored.status.success() {
        return Err(ProviderError::Golden(format!(
            "restoring the dump as {AGENT} failed: {}",
            tail(&String::from_utf8_lossy(&restored.stderr))
        )));
    }
    if !dumped.status.success() {
        return Err(ProviderError::Golden(format!(
            "pg_dump of {} failed: {}",
            spec.source.describe(),
            tail(&String::from_utf8_lossy(&dumped.stderr))
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_leaves_the_password_out() {
        let d =
            SourceDsn::parse("postgresql://alice:s3cr3t-pw@db.example:5433/shop?sslmode=require")
                .unwrap();
        assert_eq!(d.describe(), "postgresql://alice@db.example:5433/shop");
        assert!(!format!("{d:?}").contains("s3cr3t"));
        assert_eq!(d.password(), Some("s3cr3t-pw"));
        assert!(!d.conninfo().contains("s3cr3t"), "{}", d.conninfo());
        assert!(!d.public_conninfo().contains("s3cr3t"));
        assert!(d.public_conninfo().contains("sslmode='require'"));
        assert!(d.env().contains(&("PGPASSWORD", "s3cr3t-pw".into())));
        let kv = SourceDsn::parse("host=127.0.0.1 port=5 user=u password=p dbname=d").unwrap();
        assert_eq!(kv.describe(), "postgresql://u@127.0.0.1:5/d");
        assert!(SourceDsn::parse("not a dsn at all ===").is_err());
        assert!(SourceDsn::parse("postgresql:///db").is_err(), "no host");
        assert!(SourceDsn::parse("host=h sslpassword=x").is_err());
    }

    #[test]
    fn every_parameter_reaches_libpq_as_given() {
        let d = SourceDsn::parse(
            "postgresql://alice:pw@db.example:5433/shop?sslmode=verify-full&sslrootcert=/etc/ssl/my%20ca.pem&target_session_attrs=read-only",
        )
        .unwrap();
        let back = conninfo::parse(&d.conninfo()).unwrap();
        let want: conninfo::Params = [
            ("user", "alice"),
            ("host", "db.example"),
            ("port", "5433"),
            ("dbname", "shop"),
            ("sslmode", "verify-full"),
            ("sslrootcert", "/etc/ssl/my ca.pem"),
            ("target_session_attrs", "read-only"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(back, want);
    }
}

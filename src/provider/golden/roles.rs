//! The roles and the database of every golden: who owns what, which login a token's policy
//! gets, and the review's role.

use std::fs;
use std::path::Path;

use super::psql::psql;
use super::GoldenCtx;
use crate::provider::ProviderError;

/// Superuser role, used only by the gateway (never handed to an agent). Owns the database,
/// so that no agent can change its connection limit, template flag or settings.
pub const SUPERUSER: &str = "sandpit_admin";
/// Role the gateway logs in as on behalf of an agent whose token may change the schema:
/// it owns schema `public` and every object of the golden.
pub const AGENT: &str = "agent";
/// Login role of tokens that may write rows but not change the schema: reads and writes
/// every table through `pg_read_all_data`/`pg_write_all_data`, owns nothing, creates nothing.
pub const AGENT_WRITE: &str = "agent_write";
/// Login role of read-only tokens: reads every table through `pg_read_all_data`, owns
/// nothing, creates nothing (not even temporary tables).
pub const AGENT_READ: &str = "agent_read";
/// Login role of the review: reads everything (`pg_read_all_data`, past row security), may
/// see and end the agents' sessions, owns nothing, writes nothing; its settings are out of
/// every agent's reach.
pub const REVIEWER: &str = "sandpit_review";
/// The only database the agent can reach.
pub const DATABASE: &str = "sandpit";

/// Attributes every non-admin role gets (stated, not left to defaults).
const PLAIN: &str = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION";

/// The roles and the database. The admin role owns the database (an owner could set its
/// connection limit, template flag and settings, and so lock the review out); the agent
/// owns schema `public` and, by loading the golden SQL, every object in it.
pub async fn create_roles(ctx: &GoldenCtx<'_>, sock: &Path) -> Result<(), ProviderError> {
    let statements = [
        format!("CREATE ROLE {AGENT} {PLAIN} NOBYPASSRLS"),
        format!(
            "CREATE ROLE {AGENT_WRITE} {PLAIN} NOBYPASSRLS IN ROLE pg_read_all_data, pg_write_all_data"
        ),
        format!("CREATE ROLE {AGENT_READ} {PLAIN} NOBYPASSRLS IN ROLE pg_read_all_data"),
        // BYPASSRLS: with row_security off, a policy (agent-written code) is never run and
        // cannot hide rows; pg_read_all_stats: the other roles' session states, to know
        // when their counters are published; pg_signal_backend: ending the agents'
        // sessions when a token ends (never the admin's: it is a superuser).
        format!(
            "CREATE ROLE {REVIEWER} {PLAIN} BYPASSRLS \
             IN ROLE pg_read_all_data, pg_read_all_stats, pg_signal_backend"
        ),
        format!("CREATE DATABASE {DATABASE} OWNER {SUPERUSER}"),
        "REVOKE ALL ON DATABASE postgres FROM PUBLIC".to_string(),
        "REVOKE ALL ON DATABASE template1 FROM PUBLIC".to_string(),
        format!("REVOKE ALL ON DATABASE {DATABASE} FROM PUBLIC"),
        // CREATE: schemas and trusted extensions, as its owner could before.
        format!("GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {DATABASE} TO {AGENT}"),
        format!("GRANT CONNECT ON DATABASE {DATABASE} TO {AGENT_WRITE}, {AGENT_READ}, {REVIEWER}"),
        // Each statement above rewrote its database's row; rewritten once more in a stock
        // cluster's order, `pg_database` reads as a stock one does without ORDER BY
        // (`postgres` first: tokio-postgres' own suite relies on it). A no-op otherwise.
        "ALTER DATABASE postgres CONNECTION LIMIT -1".to_string(),
        "ALTER DATABASE template1 CONNECTION LIMIT -1".to_string(),
        "ALTER DATABASE template0 CONNECTION LIMIT -1".to_string(),
        format!("ALTER DATABASE {DATABASE} CONNECTION LIMIT -1"),
    ];
    let mut args: Vec<&str> = Vec::new();
    for s in &statements {
        args.extend(["-c", s.as_str()]);
    }
    psql(&ctx.bins.psql, sock, SUPERUSER, "postgres", &args).await?;
    psql(
        &ctx.bins.psql,
        sock,
        SUPERUSER,
        DATABASE,
        &["-c", &format!("ALTER SCHEMA public OWNER TO {AGENT}")],
    )
    .await
}

/// Which role a session of a token logs in as, from its seatbelt policy (None: no policy).
/// Postgres then refuses what the role may not do, whatever the statement text looks like:
/// DDL needs the owner; writes need `write`; everything else gets the read-only role.
/// `privilege` without `ddl` gains nothing: only an owner can grant on its objects.
pub fn login_role(allow: Option<&[String]>) -> &'static str {
    let Some(allow) = allow else { return AGENT };
    let has = |k: &str| allow.iter().any(|a| a == k);
    if has("ddl") {
        AGENT
    } else if has("write") {
        AGENT_WRITE
    } else {
        AGENT_READ
    }
}

/// Whether a data dir (a golden's copy) was built before the seatbelt and review roles
/// ([`GOLDEN_FORMAT`](super::GOLDEN_FORMAT) v1): such forks are reached as the agent only, as they were then.
/// Only a readable map without the review role says so; anything else fails closed (the
/// narrower role's login is tried, and refused if it does not exist).
pub fn predates_policy_roles(data: &Path) -> bool {
    match fs::read_to_string(data.join("pg_ident.conf")) {
        Ok(t) => !t.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() == 3 && f[0] == "sandpit" && f[2] == REVIEWER
        }),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_role_follows_the_widest_kind_the_policy_allows() {
        let role = |kinds: Option<&[&str]>| {
            let owned: Option<Vec<String>> =
                kinds.map(|k| k.iter().map(|s| s.to_string()).collect());
            login_role(owned.as_deref())
        };
        assert_eq!(role(None), AGENT);
        assert_eq!(role(Some(&["read", "write", "ddl"])), AGENT);
        assert_eq!(role(Some(&["ddl"])), AGENT);
        assert_eq!(role(Some(&["read", "write", "transaction"])), AGENT_WRITE);
        assert_eq!(role(Some(&["write"])), AGENT_WRITE);
        assert_eq!(role(Some(&["read", "transaction", "utility"])), AGENT_READ);
        assert_eq!(role(Some(&["read", "privilege"])), AGENT_READ);
        assert_eq!(role(Some(&[])), AGENT_READ);
    }

    #[test]
    fn only_a_readable_map_without_the_review_role_is_a_legacy_fork() {
        let dir = std::env::temp_dir().join(format!("sandpit-ident-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert!(!predates_policy_roles(&dir), "unreadable: fail closed");
        fs::write(
            dir.join("pg_ident.conf"),
            "sandpit root agent\nsandpit root sandpit_admin\n",
        )
        .unwrap();
        assert!(predates_policy_roles(&dir));
        fs::write(
            dir.join("pg_ident.conf"),
            "# x\nsandpit root agent\nsandpit root sandpit_review\n",
        )
        .unwrap();
        assert!(!predates_policy_roles(&dir));
        fs::remove_dir_all(&dir).unwrap();
    }
}

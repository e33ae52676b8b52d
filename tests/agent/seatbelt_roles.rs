//! The seatbelt held by Postgres itself, and a review the agent cannot dodge: each token's
//! sessions log in as the role its policy allows (read-only, rows-only, or the owner), so the
//! server refuses what the policy forbids whatever the statement text looks like; the
//! database belongs to the admin and the review logs in as its own role.
//!
//! The attacks are chosen to pass (or to be able to pass) the gateway's lexical check, so the
//! refusals here are the server's: the same 42501 as the lexical refusal, but the tables are
//! then read back to prove nothing changed.

use crate::support::harness;

use std::sync::OnceLock;

use crate::support::harness::{connect, sqlstate, Gateway};
use serde_json::{json, Value};
use tokio_postgres::{Client, SimpleQueryMessage};

const GOLDEN: &str = "create table items(id serial primary key, name text not null);\n\
insert into items(name) select 'item ' || g from generate_series(1, 100) g;\n\
create table notes(id int primary key, body text not null);\n\
insert into notes values (1, 'golden note');\n";

/// One gateway for the whole file, alive as long as the test process.
fn gw() -> &'static Gateway {
    static G: OnceLock<&'static Gateway> = OnceLock::new();
    G.get_or_init(|| harness::process_gateway(|| Gateway::start(Some(GOLDEN), None)))
}

fn issue(task: &str, allow: Option<&[&str]>) -> (String, String) {
    let mut body = json!({"task": task, "ttl_seconds": 600});
    if let Some(a) = allow {
        body["allow"] = json!(a);
    }
    let t = gw().issue_with(body);
    (
        t["id"].as_str().expect("id").to_string(),
        t["dsn"].as_str().expect("dsn").to_string(),
    )
}

/// First column of the first row, as text.
async fn one(c: &Client, q: &str) -> Option<String> {
    let msgs = c
        .simple_query(q)
        .await
        .unwrap_or_else(|e| panic!("{q}: {e}"));
    msgs.into_iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_string)),
        _ => None,
    })?
}

/// Run `q` as one simple Query message; it must fail with one of `codes`.
async fn refused(c: &Client, q: &str, codes: &[&str]) {
    match c.simple_query(q).await {
        Ok(_) => panic!("not refused: {q}"),
        Err(e) => {
            let code = sqlstate(&e);
            assert!(codes.contains(&code.as_str()), "{q}: got {code}: {e:?}");
        }
    }
}

/// Everything a write could change: the rows of both tables and the sequence.
async fn state(c: &Client) -> String {
    one(
        c,
        "select md5(coalesce((select string_agg(t::text, ',' order by id) from items t), '')) \
         || md5(coalesce((select string_agg(t::text, ',' order by id) from notes t), '')) \
         || (select last_value || '/' || is_called from items_id_seq) \
         || (select count(*) from pg_class where relnamespace = 'public'::regnamespace)",
    )
    .await
    .expect("state")
}

/// The live review of a token, through the API (it logs in as the review role).
fn review(id: &str) -> Value {
    let (s, r) = gw().raw_call("GET", &format!("/v1/tokens/{id}/diff"), None);
    assert_eq!(s, 200, "{r}");
    r
}

fn no_changes(r: &Value) {
    assert_eq!(r["schema"], json!([]), "{r:#}");
    assert_eq!(r["data"], json!([]), "{r:#}");
    assert_eq!(r["sequences"], json!([]), "{r:#}");
}

#[tokio::test]
async fn a_read_only_token_cannot_write_by_any_route() {
    let (id, dsn) = issue("roles-read", Some(&["read", "transaction", "utility"]));
    let c = connect(&dsn).await.expect("connect");
    assert_eq!(
        one(&c, "select current_user").await.as_deref(),
        Some("agent_read")
    );
    let before = state(&c).await;
    assert_eq!(
        one(&c, "select count(*) from items").await.as_deref(),
        Some("100")
    );
    for q in [
        // Reads to the lexer; writes to the server.
        "EXPLAIN (ANALYZE) DELETE FROM items",
        "EXPLAIN (ANALYZE, FORMAT JSON) UPDATE items SET name = 'x'",
        "SELECT nextval('items_id_seq')",
        "SELECT setval('items_id_seq', 1000)",
        "WITH d AS (DELETE FROM items RETURNING *) SELECT count(*) FROM d",
        "SELECT 1 FROM items FOR UPDATE",
        // Text the splitter may not split: judged by its first statement, if at all.
        "SELECT 'BEGIN ATOMIC'; DELETE FROM items",
        "SELECT 'BEGIN ATOMIC'; CREATE TABLE evil(x int)",
        // Plain writes and DDL (the lexical layer refuses them first; either way 42501).
        "DELETE FROM notes",
        "CREATE TABLE evil(x int)",
        "CREATE TEMP TABLE evil(x int)",
        "CREATE SCHEMA evil",
        "CREATE FUNCTION evil() RETURNS int LANGUAGE sql AS 'select 1'",
        "ALTER TABLE items ADD COLUMN x int",
        "DROP TABLE notes",
        "TRUNCATE items",
    ] {
        refused(&c, q, &["42501", "25006"]).await;
    }
    // COPY of a write's RETURNING rows, over the extended protocol.
    let e = c
        .copy_out("COPY (DELETE FROM items RETURNING *) TO STDOUT")
        .await
        .err()
        .expect("COPY (DELETE …) refused");
    assert_eq!(sqlstate(&e), "42501", "{e:?}");
    // Extended protocol: Parse/Bind/Execute of a read-looking write.
    let e = c
        .query("select nextval($1::text::regclass)", &[&"items_id_seq"])
        .await
        .expect_err("nextval refused");
    assert_eq!(sqlstate(&e), "42501", "{e:?}");
    // The role, not the text, decides: no write privilege on anything.
    assert_eq!(
        one(
            &c,
            "select has_table_privilege('items', 'INSERT') or has_table_privilege('items', 'DELETE') \
             or has_sequence_privilege('items_id_seq', 'UPDATE') \
             or has_schema_privilege('public', 'CREATE') \
             or has_database_privilege(current_database(), 'CREATE') \
             or has_database_privilege(current_database(), 'TEMP')"
        )
        .await
        .as_deref(),
        Some("f")
    );

    assert_eq!(
        state(&c).await,
        before,
        "the read-only token changed something"
    );
    no_changes(&review(&id));
    drop(c);
    let (s, _) = gw().revoke(&id);
    assert_eq!(s, 200);
    no_changes(&review(&id));
}

#[tokio::test]
async fn a_write_token_writes_rows_but_cannot_change_the_schema() {
    let (id, dsn) = issue("roles-write", Some(&["read", "write", "transaction"]));
    let c = connect(&dsn).await.expect("connect");
    assert_eq!(
        one(&c, "select current_user").await.as_deref(),
        Some("agent_write")
    );
    // Rows, including a serial's nextval.
    assert_eq!(
        one(&c, "insert into items(name) values ('new') returning id")
            .await
            .as_deref(),
        Some("101")
    );
    c.simple_query(
        "update notes set body = 'changed' where id = 1; delete from items where id = 1",
    )
    .await
    .expect("writes");
    let before = state(&c).await;
    for q in [
        "CREATE TABLE evil(x int)",
        "CREATE TEMP TABLE evil(x int)",
        "CREATE SCHEMA evil",
        "CREATE FUNCTION evil() RETURNS int LANGUAGE sql AS 'select 1'",
        "CREATE INDEX evil ON items(name)",
        "ALTER TABLE items ADD COLUMN x int",
        "ALTER TABLE items ENABLE ROW LEVEL SECURITY",
        "ALTER SEQUENCE items_id_seq RESTART 1",
        "DROP TABLE notes",
        "DROP SCHEMA public CASCADE",
        "TRUNCATE items",
        "SELECT 'BEGIN ATOMIC'; DROP TABLE notes",
        "SELECT 'BEGIN ATOMIC'; ALTER TABLE items DROP COLUMN name",
        "EXPLAIN (ANALYZE) CREATE TABLE evil AS SELECT 1",
        "ALTER DATABASE sandpit CONNECTION LIMIT 0",
    ] {
        refused(&c, q, &["42501"]).await;
    }
    assert_eq!(state(&c).await, before);
    let r = review(&id);
    assert_eq!(r["schema"], json!([]), "{r:#}");
    let mut tables: Vec<&str> = r["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|t| t["table"].as_str())
        .collect();
    tables.sort();
    assert_eq!(tables, ["public.items", "public.notes"], "{r:#}");
    gw().revoke(&id);
}

#[tokio::test]
async fn the_agent_cannot_lock_the_review_out() {
    let (id, dsn) = issue("roles-review", None);
    let c = connect(&dsn).await.expect("connect");
    assert_eq!(
        one(&c, "select current_user").await.as_deref(),
        Some("agent")
    );
    // What the owner of the golden's objects still does: rows, DDL, a schema of its own.
    c.simple_query(
        "insert into notes values (2, 'by the agent'); create schema mine; \
         create table mine.t(x int); create temp table scratchpad(x int)",
    )
    .await
    .expect("agent DDL");
    // The database is not the agent's: no connection limit, template flag, settings or owner.
    for q in [
        "ALTER DATABASE sandpit CONNECTION LIMIT 0",
        "ALTER DATABASE sandpit ALLOW_CONNECTIONS false",
        "ALTER DATABASE sandpit IS_TEMPLATE true",
        "ALTER DATABASE sandpit SET statement_timeout = 1",
        "ALTER DATABASE sandpit SET search_path = evil",
        "ALTER DATABASE sandpit RESET ALL",
        "ALTER DATABASE sandpit OWNER TO agent",
        "ALTER DATABASE sandpit RENAME TO elsewhere",
        "ALTER ROLE sandpit_review SET statement_timeout = 1",
        "ALTER ROLE sandpit_review CONNECTION LIMIT 0",
        "ALTER ROLE sandpit_review NOLOGIN",
        "ALTER ROLE ALL SET statement_timeout = 1",
        "ALTER ROLE agent_read SET statement_timeout = 1",
        "DROP DATABASE sandpit",
    ] {
        refused(&c, q, &["42501"]).await;
    }
    // Granted by the admin: revoking it is a no-op (a warning), not an error.
    c.simple_query("REVOKE CONNECT ON DATABASE sandpit FROM sandpit_review")
        .await
        .expect("revoke is a no-op");
    // Settings on its own role are its to make; they must not reach the review.
    c.simple_query(
        "ALTER ROLE CURRENT_USER SET search_path = evil; \
         ALTER ROLE CURRENT_USER SET statement_timeout = 1; \
         ALTER ROLE CURRENT_USER SET idle_session_timeout = 1; \
         ALTER ROLE CURRENT_USER SET default_transaction_isolation = 'serializable'; \
         ALTER ROLE CURRENT_USER IN DATABASE sandpit SET lock_timeout = 1",
    )
    .await
    .expect("own role settings");
    drop(c);

    let live = review(&id);
    let notes = |r: &Value| {
        r["data"]
            .as_array()
            .expect("data")
            .iter()
            .find(|t| t["table"] == "public.notes")
            .map(|t| t["inserted"].clone())
    };
    assert_eq!(notes(&live), Some(json!(1)), "{live:#}");

    let (s, _) = gw().revoke(&id);
    assert_eq!(s, 200);
    let stored = gw()
        .data_dir
        .join("reviews")
        .join("roles-review")
        .join(format!("{id}.json"));
    let r: Value = serde_json::from_str(
        &std::fs::read_to_string(&stored)
            .unwrap_or_else(|e| panic!("no stored review at {}: {e}", stored.display())),
    )
    .expect("review json");
    assert_eq!(notes(&r), Some(json!(1)), "{r:#}");
    assert!(
        r["schema"].to_string().contains("mine.t"),
        "the agent's table is in the review: {r:#}"
    );
}

#[tokio::test]
async fn each_role_is_exactly_what_the_policy_needs() {
    let (read, read_dsn) = issue("roles-attrs-read", Some(&["read"]));
    let (write, write_dsn) = issue("roles-attrs-write", Some(&["read", "write", "utility"]));
    let (ddl, ddl_dsn) = issue("roles-attrs-ddl", Some(&["read", "write", "ddl"]));
    let q = "select current_user || ':' || \
             (select row(rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls)::text \
              from pg_roles where rolname = current_user) || ':' || \
             (select coalesce(string_agg(rolname, ',' order by rolname), '') from pg_roles \
              where pg_has_role(current_user, oid, 'member') and rolname <> current_user) || ':' || \
             (select count(*) from pg_class where relowner = current_user::regrole)";
    for (dsn, want) in [
        (&read_dsn, "agent_read:(f,f,f,f,f):pg_read_all_data:0"),
        (
            &write_dsn,
            "agent_write:(f,f,f,f,f):pg_read_all_data,pg_write_all_data:0",
        ),
    ] {
        let c = connect(dsn).await.expect("connect");
        assert_eq!(one(&c, q).await.as_deref(), Some(want));
    }
    let c = connect(&ddl_dsn).await.expect("connect");
    let got = one(&c, q).await.expect("row");
    assert!(got.starts_with("agent:(f,f,f,f,f)::"), "{got}");
    // Nobody but the admin owns the database.
    assert_eq!(
        one(&c, "select pg_get_userbyid(datdba)::text from pg_database where datname = current_database()")
            .await
            .as_deref(),
        Some("sandpit_admin")
    );
    for id in [read, write, ddl] {
        gw().revoke(&id);
    }
}

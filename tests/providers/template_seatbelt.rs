//! The `template` seatbelt by Postgres privileges (issue 30, item 1), on a shared server
//! started here (`tests/support/shared_pg.rs`): a token's sessions log in as its scratch
//! database's read login, write login or task role, by its policy, so the server refuses what
//! the policy forbids however the SQL text looks. Every refusal is followed by a look at the
//! rows through an admin connection: nothing changed. And (item 2) the provider starts only
//! when the server's `pg_hba.conf` admits task roles from the gateway's address alone, so a
//! password the agent sets opens no direct login from anywhere else.

use crate::support::harness;
use crate::support::shared_pg;

use crate::support::harness::{connect, sqlstate, Gateway};
use sandpit::pgconn::tls::SslMode;
use sandpit::provider::template::hba::TASKS_GROUP;
use sandpit::provider::template::seatbelt::{READ_GROUP, WRITE_GROUP};
use sandpit::provider::template::{TemplateConfig, TemplateProvider, DEFAULT_GOLDEN_OWNER};
use sandpit::provider::Provider;
use serde_json::{json, Value};
use tokio_postgres::{Client, SimpleQueryMessage};

const GOLDEN: &str = "create table items(id serial primary key, name text not null);\n\
insert into items(name) select 'item ' || g from generate_series(1, 100) g;\n\
create table notes(id int primary key, body text not null);\n\
insert into notes values (1, 'golden note');\n";

/// A gateway on the shared server; no scheduled janitor pass.
fn gateway(pg: &shared_pg::SharedPg) -> Gateway {
    let cfg = format!(
        "provider = \"template\"\n[template]\nadmin_dsn = \"{}\"\ngolden = \"sandpit_golden\"\n\
         sslmode = \"require\"\n[janitor]\ninterval = \"0s\"\n",
        pg.admin_dsn()
    );
    Gateway::start(Some(GOLDEN), Some(&cfg))
}

/// (token id, dsn) of a token allowed `allow`.
fn issue(g: &Gateway, task: &str, allow: &[&str]) -> (String, String) {
    let t: Value = g.issue_with(json!({"task": task, "ttl_seconds": 600, "allow": allow}));
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

/// Run `q` as one simple Query message; it must fail with 42501 (the server's refusal or the
/// lexical check's, whichever comes first).
async fn refused(c: &Client, q: &str) {
    match c.simple_query(q).await {
        Ok(_) => panic!("not refused: {q}"),
        Err(e) => assert_eq!(sqlstate(&e), "42501", "{q}: {e:?}"),
    }
}

/// Everything a write could change, read by the admin inside the scratch database.
async fn state(pg: &shared_pg::SharedPg, db: &str) -> String {
    let a = pg.admin(db).await;
    one(
        &a,
        "select md5(coalesce((select string_agg(t::text, ',' order by id) from items t), '')) \
         || md5(coalesce((select string_agg(t::text, ',' order by id) from notes t), '')) \
         || (select last_value || '/' || is_called from items_id_seq) \
         || (select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace \
             where n.nspname not in ('pg_catalog', 'information_schema', 'pg_toast'))",
    )
    .await
    .expect("state")
}

/// (role attributes, memberships, objects owned) of the session's role, one line.
const WHO: &str = "select current_user || ':' || \
     (select row(rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls)::text \
      from pg_roles where rolname = current_user) || ':' || \
     (select coalesce(string_agg(rolname, ',' order by rolname), '') from pg_roles \
      where pg_has_role(current_user, oid, 'member') and rolname <> current_user) || ':' || \
     (select count(*) from pg_class where relowner = current_user::regrole)";

/// The provider as the gateway runs it (same server, same key), to call its checks directly.
async fn provider(pg: &shared_pg::SharedPg, g: &Gateway) -> TemplateProvider {
    TemplateProvider::new(TemplateConfig {
        admin_dsn: pg.admin_dsn(),
        golden: "sandpit_golden".into(),
        golden_sql: None,
        golden_owner: Some(DEFAULT_GOLDEN_OWNER.into()),
        sslmode: Some(SslMode::Require),
        ca_file: None,
        key_file: g.data_dir.join("template.key"),
        shared_key: None,
        trust_network: false,
    })
    .await
    .expect("template provider")
}

#[test]
fn a_read_token_cannot_write_by_any_route() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let g = gateway(&pg);
    let (h, dsn) = issue(&g, "tpl-read", &["read", "transaction"]);
    rt.block_on(async {
        let c = connect(&dsn).await.expect("connect");
        assert_eq!(
            one(&c, WHO).await.unwrap_or_default(),
            format!("{h}_r:(f,f,f,f,f):{TASKS_GROUP},{READ_GROUP}:0")
        );
        let before = state(&pg, &h).await;
        assert_eq!(
            one(&c, "select count(*) from items").await.as_deref(),
            Some("100")
        );
        for q in [
            // Text the splitter may not split: judged by its first statement, if at all.
            "SELECT 'BEGIN ATOMIC'; DELETE FROM items",
            "SELECT 'BEGIN ATOMIC'; CREATE TABLE evil(x int)",
            // Reads to the lexer; writes to the server.
            "EXPLAIN ANALYZE DELETE FROM items",
            "EXPLAIN (ANALYZE, FORMAT JSON) UPDATE items SET name = 'x'",
            "WITH d AS (DELETE FROM items RETURNING *) SELECT count(*) FROM d",
            "SELECT nextval('items_id_seq')",
            "SELECT setval('items_id_seq', 1000)",
            "SELECT 1 FROM items FOR UPDATE",
            // Plain writes and DDL.
            "UPDATE items SET name = 'x' WHERE id = 1 RETURNING *",
            "DELETE FROM notes",
            "DROP TABLE notes",
            "CREATE TABLE evil(x int)",
            "CREATE TEMP TABLE evil(x int)",
            "CREATE SCHEMA evil",
            "ALTER TABLE items ADD COLUMN x int",
            "TRUNCATE items",
        ] {
            refused(&c, q).await;
        }
        // COPY of a write's RETURNING rows, over the extended protocol.
        let e = c
            .copy_out("COPY (DELETE FROM items RETURNING *) TO STDOUT")
            .await
            .err()
            .expect("COPY (DELETE …) refused");
        assert_eq!(sqlstate(&e), "42501", "{e:?}");
        // Parse/Bind/Execute of a read-looking write.
        let e = c
            .query("select nextval($1::text::regclass)", &[&"items_id_seq"])
            .await
            .expect_err("nextval refused");
        assert_eq!(sqlstate(&e), "42501", "{e:?}");
        // The role, not the text, decides: no write privilege on anything.
        assert_eq!(
            one(
                &c,
                "select has_table_privilege('items', 'INSERT') or has_table_privilege('notes', 'DELETE') \
                 or has_table_privilege('items', 'TRUNCATE') \
                 or has_sequence_privilege('items_id_seq', 'UPDATE') \
                 or has_sequence_privilege('items_id_seq', 'USAGE') \
                 or has_schema_privilege('public', 'CREATE') \
                 or has_database_privilege(current_database(), 'CREATE') \
                 or has_database_privilege(current_database(), 'TEMP')"
            )
            .await
            .as_deref(),
            Some("f")
        );
        assert_eq!(state(&pg, &h).await, before, "the read token changed something");

        // `ALTER ROLE CURRENT_USER SET …`: the server lets any ordinary role set its own
        // defaults (they would reach only this login's later sessions — the agent's own: the
        // review logs in as the task role, with its timeouts as startup options, which
        // outrank role settings — and no setting an ordinary role may set grants a write).
        // The lexical check refuses it to this policy, also inside text it cannot split
        // (judged whole: several statements are `unparsed`).
        refused(&c, "ALTER ROLE CURRENT_USER SET work_mem = '64kB'").await;
        refused(
            &c,
            "SELECT 'BEGIN ATOMIC'; ALTER ROLE CURRENT_USER SET work_mem = '64kB'",
        )
        .await;
        let c2 = connect(&dsn).await.expect("connect again");
        assert_ne!(one(&c2, "show work_mem").await.as_deref(), Some("64kB"));
        refused(&c2, "SELECT 'BEGIN ATOMIC'; DELETE FROM items").await;
        assert_eq!(state(&pg, &h).await, before);

        // Its read login reaches no other scratch database.
        let (h2, dsn2) = issue(&g, "tpl-read-other", &["read"]);
        let o = connect(&dsn2).await.expect("connect other");
        o.simple_query("select 1").await.expect("other forked");
        let admin = pg.admin("postgres").await;
        let cross = admin
            .query_one(
                "select has_database_privilege($1, $2, 'CONNECT') \
                     or has_database_privilege($3, $4, 'CONNECT')",
                &[
                    &format!("{h}_r"),
                    &h2,
                    &format!("{h2}_w"),
                    &h,
                ],
            )
            .await
            .expect("privileges");
        assert!(!cross.get::<_, bool>(0), "a login reaches another task's database");

        // The groups' grants are the same in the reference fork: the review sees nothing.
        let (status, r) = g.raw_call("GET", &format!("/v1/tokens/{h}/diff"), None);
        assert_eq!(status, 200, "{r}");
        assert_eq!((&r["schema"], &r["data"]), (&json!([]), &json!([])), "{r:#}");

        // A password change on the read login opens nothing (every task login is expired at
        // rest) and locks nothing out (each gateway login sets its own).
        // The policy refuses it to the agent (also in text it cannot split); the role does
        // it here as any route that reached the server would, as itself.
        refused(
            &c2,
            "SELECT 'BEGIN ATOMIC'; alter role current_user password 'agent-chosen'",
        )
        .await;
        admin
            .batch_execute(&format!(
                "SET ROLE \"{h}_r\"; ALTER ROLE CURRENT_USER PASSWORD 'agent-chosen'; RESET ROLE"
            ))
            .await
            .expect("a role may change its own password");
        let e = direct_from_gateway_address(&pg, &format!("{h}_r"), "agent-chosen")
            .await
            .expect_err("expired");
        assert!(e.to_string().contains("password authentication failed"), "{e}");
        let p = provider(&pg, &g).await;
        p.check_access(&h).await.expect("nothing to report");
        c2.simple_query("select 1").await.expect("its session goes on");
        let c3 = connect(&dsn).await.expect("and new ones");
        assert_eq!(one(&c3, "select current_user").await, Some(format!("{h}_r")));

        // Revoke drops the logins with the task role, and their records.
        let (status, body) = g.revoke(&h);
        assert_eq!(status, 200, "{body}");
        let left: i64 = admin
            .query_one(
                "select (select count(*) from pg_roles where rolname like $1 || '%') \
                      + (select count(*) from sandpit_template.backends where handle like $1 || '%')",
                &[&h],
            )
            .await
            .expect("leftovers")
            .get(0);
        assert_eq!(left, 0, "roles and records gone\n{}", g.log());
    });
}

#[test]
fn a_write_token_writes_rows_only_and_a_ddl_token_everything() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let g = gateway(&pg);
    let (w, wdsn) = issue(&g, "tpl-write", &["read", "write", "transaction"]);
    let (d, ddsn) = issue(&g, "tpl-ddl", &["read", "write", "ddl", "transaction"]);
    rt.block_on(async {
        let c = connect(&wdsn).await.expect("connect");
        assert_eq!(
            one(&c, WHO).await.unwrap_or_default(),
            format!("{w}_w:(f,f,f,f,f):{TASKS_GROUP},{WRITE_GROUP}:0")
        );
        assert_eq!(
            one(&c, "insert into items(name) values ('new') returning id")
                .await
                .as_deref(),
            Some("101")
        );
        c.simple_query(
            "update notes set body = 'changed' where id = 1 returning *; \
             delete from items where id = 1",
        )
        .await
        .expect("writes");
        let before = state(&pg, &w).await;
        for q in [
            "CREATE TABLE evil(x int)",
            "CREATE TEMP TABLE evil(x int)",
            "CREATE SCHEMA evil",
            "CREATE INDEX evil ON items(name)",
            "ALTER TABLE items ADD COLUMN x int",
            "ALTER SEQUENCE items_id_seq RESTART 1",
            "DROP TABLE notes",
            "TRUNCATE items",
            "SELECT 'BEGIN ATOMIC'; DROP TABLE notes",
            "SELECT 'BEGIN ATOMIC'; TRUNCATE notes",
            "EXPLAIN ANALYZE CREATE TABLE evil AS SELECT 1",
        ] {
            refused(&c, q).await;
        }
        assert_eq!(state(&pg, &w).await, before);

        // The ddl token logs in as the task role, owner of the golden's objects, as before.
        let c = connect(&ddsn).await.expect("connect");
        assert_eq!(one(&c, "select current_user").await, Some(d.clone()));
        c.batch_execute(
            "create table mine(x int); insert into mine values (1); truncate notes; \
             drop table mine; alter table items add column extra int",
        )
        .await
        .expect("ddl");
        assert_eq!(
            one(&c, "select count(*) from notes").await.as_deref(),
            Some("0")
        );

        // A fork without its seatbelt logins (one made before them): the narrower policies
        // fail closed, at login.
        let admin = pg.admin("postgres").await;
        admin
            .batch_execute(&format!(
                "revoke connect on database \"{w}\" from \"{w}_w\"; drop role \"{w}_w\"; \
                 delete from sandpit_template.backends where handle = '{w}_w'"
            ))
            .await
            .expect("drop the write login");
        assert!(
            connect(&wdsn).await.is_err(),
            "a fork without its write login must refuse the write token's sessions"
        );
        assert_eq!(state(&pg, &w).await, before);
    });
}

/// A login straight to the shared server from 127.0.0.2 — not the gateway's address
/// (127.0.0.1) — as an agent elsewhere on the network would try it.
async fn direct_from_elsewhere(
    pg: &shared_pg::SharedPg,
    user: &str,
    password: &str,
) -> Result<Client, tokio_postgres::Error> {
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.bind("127.0.0.2:0".parse().expect("addr"))
        .expect("bind 127.0.0.2");
    let stream = sock
        .connect(format!("127.0.0.1:{}", pg.port).parse().expect("addr"))
        .await
        .expect("tcp connect");
    let (c, conn) = tokio_postgres::Config::new()
        .user(user)
        .password(password)
        .dbname(user)
        .connect_raw(stream, tokio_postgres::NoTls)
        .await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(c)
}

/// The same from the gateway's own address, over TLS as the server requires there.
async fn direct_from_gateway_address(
    pg: &shared_pg::SharedPg,
    user: &str,
    password: &str,
) -> Result<(), sqlx::Error> {
    use sqlx::postgres::{PgConnectOptions, PgSslMode};
    use sqlx::ConnectOptions;
    PgConnectOptions::new()
        .host("127.0.0.1")
        .port(pg.port)
        .username(user)
        .password(password)
        .database(user)
        .ssl_mode(PgSslMode::VerifyCa)
        .ssl_root_cert(&pg.ca_file)
        .connect()
        .await
        .map(|_| ())
}

/// Issue 30's acceptance: after the agent changes its own password, neither that password
/// nor any other lets it log in to the shared server from the agent's side — from elsewhere
/// pg_hba.conf refuses task roles, from the gateway's own address every task password is
/// expired at rest — and the gateway keeps serving the token.
#[test]
fn a_changed_password_opens_no_direct_login_and_locks_nothing_out() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    // The test server's rules: socket, TLS from 127.0.0.1 (the gateway's address), reject
    // from anywhere else; the provider's start-up check accepts them.
    let g = gateway(&pg);
    let t = g.issue("tpl-direct", 600);
    let (h, dsn) = (
        t["id"].as_str().expect("id").to_string(),
        t["dsn"].as_str().expect("dsn").to_string(),
    );
    rt.block_on(async {
        let c = connect(&dsn).await.expect("connect");
        c.batch_execute("alter role current_user password 'agent-chosen'")
            .await
            .expect("a role may change its own password");
        // From the gateway's own address: no password works, the agent's or any other.
        for pw in ["agent-chosen", "anything-else", ""] {
            let Err(e) = direct_from_gateway_address(&pg, &h, pw).await else {
                panic!("a direct login with {pw:?} got in");
            };
            assert!(
                e.to_string().contains("password authentication failed"),
                "{pw:?}: {e}"
            );
        }
        // From elsewhere no password gets past pg_hba.conf.
        for pw in ["agent-chosen", "anything-else", ""] {
            let Err(e) = direct_from_elsewhere(&pg, &h, pw).await else {
                panic!("a direct login from elsewhere with {pw:?} got in");
            };
            assert_eq!(sqlstate(&e), "28000", "{pw:?}: {e:?}");
        }
        for role in [format!("{h}_r"), format!("{h}_w")] {
            let Err(e) = direct_from_elsewhere(&pg, &role, "x").await else {
                panic!("{role} got in directly");
            };
            assert_eq!(sqlstate(&e), "28000", "{role}: {e:?}");
        }
        // The gateway keeps serving the token, old session and new.
        c.simple_query("select 1").await.expect("the open session");
        let c2 = connect(&dsn).await.expect("a new session");
        assert_eq!(one(&c2, "select current_user").await, Some(h.clone()));
        let (status, report) = g.raw_call("POST", "/v1/reap", None);
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["tampered"], json!([]), "{report}");
        connect(&dsn).await.expect("after a janitor pass");
        // After those logins (each set its own password) the agent's is still refused.
        let e = direct_from_gateway_address(&pg, &h, "agent-chosen")
            .await
            .expect_err("still closed");
        assert!(e.to_string().contains("password"), "{e}");
    });
}

#[test]
fn the_provider_refuses_a_server_open_to_task_roles_unless_told_to_trust_the_network() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let key = harness::tempdir();
    let cfg = |trust_network| TemplateConfig {
        admin_dsn: pg.admin_dsn(),
        golden: "sandpit_golden".into(),
        golden_sql: Some(key.path().join("g.sql")),
        golden_owner: None,
        sslmode: Some(SslMode::Require),
        ca_file: None,
        key_file: key.path().join("k"),
        shared_key: None,
        trust_network,
    };
    std::fs::write(key.path().join("g.sql"), GOLDEN).expect("golden sql");
    rt.block_on(async {
        TemplateProvider::new(cfg(false))
            .await
            .expect("the test server's rules pass");
        let open = "local all all trust\nhostssl all all 0.0.0.0/0 scram-sha-256\n";
        pg.set_hba(open).await;
        match TemplateProvider::new(cfg(false)).await {
            Err(e) => assert!(e.to_string().contains("pg_hba.conf line 2"), "{e}"),
            Ok(_) => panic!("started on a server open to task roles"),
        }
        TemplateProvider::new(cfg(true))
            .await
            .expect("trust_network = true starts anyway");
        // `serve --check-config` makes the same check (and nothing else on the server).
        let check = |trust: bool| {
            let file = key.path().join(format!("check-{trust}.toml"));
            std::fs::write(
                &file,
                format!(
                    "provider = \"template\"\n[template]\nadmin_dsn = \"{}\"\n\
                     sslmode = \"require\"\ntrust_network = {trust}\n",
                    pg.admin_dsn()
                ),
            )
            .expect("config");
            let data = key.path().join("unused-data-dir");
            harness::run_sandpit(
                &[
                    "serve",
                    "--check-config",
                    "--config",
                    file.to_str().expect("path"),
                    "--data-dir",
                    data.to_str().expect("path"),
                ],
                &[],
            )
        };
        let (code, _, err) = check(false);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("pg_hba.conf line 2"), "{err}");
        let (code, out, err) = check(true);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("trust_network = true"), "{out}");
        pg.set_hba(
            "local all all trust\n\
             hostssl all +sandpit_tasks 127.0.0.1/32 scram-sha-256\n\
             host all +sandpit_tasks all reject\n\
             hostssl all all 0.0.0.0/0 scram-sha-256\n",
        )
        .await;
        // A task role of a fork made before the group: it becomes a member at start, so the
        // `+sandpit_tasks` rule admits the gateway's logins for it too.
        let admin = pg.admin("postgres").await;
        let old = "sp_aaaaaaaaaaaaaaaaaaaa";
        admin
            .batch_execute(&format!(
                "create role {old} login;                  insert into sandpit_template.backends(handle) values ('{old}')"
            ))
            .await
            .expect("an older task role");
        TemplateProvider::new(cfg(false))
            .await
            .expect("task roles from the gateway's address only, others from anywhere");
        let member: bool = admin
            .query_one(
                "select pg_has_role($1, 'sandpit_tasks', 'MEMBER')",
                &[&old],
            )
            .await
            .expect("membership")
            .get(0);
        assert!(member, "the older task role joined sandpit_tasks");
        let (code, out, err) = check(false);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("pg_hba.conf admits task roles only"), "{out}");
    });
}

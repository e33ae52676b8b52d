//! The `template` provider against a hostile task role (issue 14, item 7), on a Postgres
//! server started here (`tests/support/shared_pg.rs`: SCRAM over TCP with TLS): the agent
//! changes its own password and tries to log in directly, flags its database so that it cannot be
//! dropped, and reads other tasks' metadata. Each attack ends with no way in past the gateway,
//! nothing left after revoke, and nothing of another task to read.

use crate::support::shared_pg;

use crate::support::harness::{connect, sqlstate, Gateway, SMALL_GOLDEN};
use sandpit::pgconn::tls::SslMode;
use sandpit::provider::template::{TemplateConfig, TemplateProvider, DEFAULT_GOLDEN_OWNER};
use sandpit::provider::{Provider, ProviderError};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};
use sqlx::ConnectOptions;

fn dsn(v: &Value) -> String {
    v["dsn"].as_str().expect("dsn").to_string()
}

fn id(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

/// A gateway on the shared server; no scheduled janitor pass, so the test says when one runs.
fn gateway(pg: &shared_pg::SharedPg) -> Gateway {
    let cfg = format!(
        "provider = \"template\"\n[template]\nadmin_dsn = \"{}\"\ngolden = \"sandpit_golden\"\n\
         sslmode = \"require\"\n[janitor]\ninterval = \"0s\"\n",
        pg.admin_dsn()
    );
    Gateway::start(Some(SMALL_GOLDEN), Some(&cfg))
}

/// A login straight to the shared server, past the gateway, as the agent would try it.
async fn direct(
    pg: &shared_pg::SharedPg,
    user: &str,
    password: &str,
) -> Result<PgConnection, sqlx::Error> {
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
}

fn sqlstate_sqlx(e: &sqlx::Error) -> String {
    e.as_database_error()
        .and_then(|d| d.code().map(|c| c.to_string()))
        .unwrap_or_else(|| format!("(no code: {e})"))
}

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

/// (every password of the role expired, tampered note).
async fn role_state(pg: &shared_pg::SharedPg, role: &str) -> (bool, Option<String>) {
    let row = pg
        .admin("postgres")
        .await
        .query_one(
            "select a.rolvaliduntil < now(), b.tampered from pg_roles a \
             join sandpit_template.backends b on b.handle = a.rolname where a.rolname = $1",
            &[&role],
        )
        .await
        .expect("role lookup");
    (row.get::<_, Option<bool>>(0).unwrap_or(false), row.get(1))
}

/// Issue 30, item 2: a task role's own password change opens no direct login (every
/// password of a task role is expired at rest; each gateway login sets a fresh one for
/// itself) and locks nothing out: the gateway keeps serving the token.
#[test]
fn own_password_change_opens_nothing_and_locks_nothing_out() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let g = gateway(&pg);
    rt.block_on(async {
        let t = g.issue("tpl-password", 600);
        let h = id(&t);
        let c = connect(&dsn(&t)).await.expect("connect");
        c.simple_query("select 1").await.expect("forked");

        // Role attributes other than the password: refused by the server to a role without
        // CREATEROLE, so the agent cannot reopen its role, set a connection limit that locks
        // out the gateway or the review, or log in elsewhere.
        for sql in [
            "alter role current_user valid until 'infinity'",
            "alter role current_user valid until '2000-01-01'",
            "alter role current_user connection limit 0",
            "alter role current_user nologin",
            "alter role current_user createdb",
        ] {
            let e = c.batch_execute(sql).await.expect_err(sql);
            assert_eq!(sqlstate(&e), "42501", "{sql}");
        }
        for role in [h.clone(), format!("{h}_r"), format!("{h}_w")] {
            assert_eq!(
                role_state(&pg, &role).await,
                (true, None),
                "{role} closed at rest"
            );
        }

        // PostgreSQL lets every role change its own password: it changes, and opens nothing
        // (from the gateway's own address, which pg_hba.conf must admit).
        c.batch_execute("alter role current_user password 'agent-chosen-password'")
            .await
            .expect("a role may change its own password");
        for pw in ["agent-chosen-password", "anything-else"] {
            let e = direct(&pg, &h, pw).await.expect_err(pw);
            assert_eq!(sqlstate_sqlx(&e), "28P01", "{pw}: {e}");
        }
        // md5 and no password at all: the same.
        c.batch_execute(
            "set password_encryption = 'md5'; alter role current_user password 'agent-md5'",
        )
        .await
        .expect("md5 verifier");
        let e = direct(&pg, &h, "agent-md5").await.expect_err("md5");
        assert_eq!(sqlstate_sqlx(&e), "28P01", "{e}");
        c.batch_execute("alter role current_user password null")
            .await
            .expect("password null");

        // The gateway keeps serving the token: the open session, new ones, a janitor pass
        // that finds nothing, and new sessions after it.
        c.simple_query("select 1").await.expect("the open session");
        for _ in 0..3 {
            let n = connect(&dsn(&t)).await.expect("a new session");
            n.simple_query("select 1").await.expect("select");
        }
        let (status, report) = g.raw_call("POST", "/v1/reap", None);
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["tampered"], serde_json::json!([]), "{report}");
        assert_eq!(g.show(&h)["state"], "live", "{}", g.show(&h));
        let n = connect(&dsn(&t)).await.expect("a session after the pass");
        n.simple_query("select 1").await.expect("select");
        c.simple_query("select 1")
            .await
            .expect("the first session still");
        // The gateway's logins set passwords of their own; none of them is left usable.
        let e = direct(&pg, &h, "agent-chosen-password")
            .await
            .expect_err("still closed");
        assert_eq!(sqlstate_sqlx(&e), "28P01", "{e}");
        assert_eq!(
            role_state(&pg, &h).await,
            (true, None),
            "closed after the logins"
        );
        let p = provider(&pg, &g).await;
        p.check_access(&h).await.expect("nothing to report");
    });
}

/// The one moment a task role can be logged in to is a gateway login's window, with the
/// password the gateway just set. An agent changing its password inside that window (and
/// logging in with it) is caught when the window closes: every session of the role ends,
/// the role is closed, and the token's next check reports it.
#[test]
fn a_password_changed_inside_a_login_window_ends_the_role_sessions() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let g = gateway(&pg);
    rt.block_on(async {
        let t = g.issue("tpl-window", 600);
        let h = id(&t);
        let c = connect(&dsn(&t)).await.expect("connect");
        c.simple_query("select 1").await.expect("forked");
        let p = provider(&pg, &g).await;
        let backend = p.ensure_running(&h).await.expect("backend");
        let target = p.session_target(&backend, None);
        let gate = target
            .gate
            .clone()
            .expect("template targets carry a login gate");
        assert_eq!(target.password, None, "no password at rest");

        // An untouched window: the gate's own password logs in, and the close is clean.
        let w = gate.open(&h).await.expect("open");
        let d = direct(&pg, &h, &w.password)
            .await
            .expect("the window's password");
        drop(d);
        gate.close(&h, w).await.expect("nothing changed");
        assert_eq!(role_state(&pg, &h).await, (true, None));

        // A window abandoned midway (a login dropped, its client gone) is closed from its
        // own task: the password it set no longer works.
        let w = gate.open(&h).await.expect("open");
        let abandoned = w.password.clone();
        drop(w);
        let mut closed = false;
        for _ in 0..200 {
            if role_state(&pg, &h).await.0 {
                closed = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(closed, "the abandoned window was closed");
        let e = direct(&pg, &h, &abandoned).await.expect_err("closed");
        assert_eq!(sqlstate_sqlx(&e), "28P01", "{e}");

        // The race: a window opens, the agent changes the password from its session and logs
        // in directly with it before the close.
        let w = gate.open(&h).await.expect("open");
        c.batch_execute("alter role current_user password 'raced-in'")
            .await
            .expect("password change");
        let mut d = direct(&pg, &h, "raced-in")
            .await
            .expect("in, inside the window");
        let e = gate.close(&h, w).await.expect_err("the change is seen");
        assert!(e.contains("changed during a gateway login"), "{e}");
        assert!(
            sqlx::query("select 1").execute(&mut d).await.is_err(),
            "the direct session was ended"
        );
        assert!(c.simple_query("select 1").await.is_err(), "and the agent's");
        let e = direct(&pg, &h, "raced-in").await.expect_err("closed again");
        assert_eq!(sqlstate_sqlx(&e), "28P01", "{e}");
        let (closed, note) = role_state(&pg, &h).await;
        assert!(closed && note.is_some(), "{note:?}");
        match p.check_access(&h).await {
            Err(ProviderError::Tampered(m)) => assert!(m.contains(&h), "{m}"),
            other => panic!("expected Tampered, got {other:?}"),
        }
        connect(&dsn(&t))
            .await
            .expect_err("the check ends the token");
        let e = connect(&dsn(&t)).await.expect_err("the token ended");
        assert_eq!(sqlstate(&e), "28000", "{e:?}");
        assert!(
            g.log().contains("backend access tampered with"),
            "{}",
            g.log()
        );
    });
}

#[test]
fn database_flags_refused_revoke_removes_all_tags_private() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let g = gateway(&pg);
    rt.block_on(async {
        let t = g.issue("tpl-flags", 600);
        let other = g.issue("tpl-secret-task-name", 600);
        let h = id(&t);
        let c = connect(&dsn(&t)).await.expect("connect");
        let o = connect(&dsn(&other)).await.expect("connect other");
        o.simple_query("select 1").await.expect("other forked");

        // The admin owns the database; the task owns the golden's objects and `public`, and
        // may still create schemas, tables and temporary tables.
        let row = c
            .query_one(
                "select pg_get_userbyid(d.datdba)::text, \
                        (select nspowner::regrole::text from pg_namespace where nspname = 'public'), \
                        (select tableowner::text from pg_tables where tablename = 'items') \
                 from pg_database d where d.datname = current_database()",
                &[],
            )
            .await
            .expect("owners");
        assert_eq!(row.get::<_, String>(0), shared_pg::ADMIN);
        assert_eq!(row.get::<_, String>(1), h);
        assert_eq!(row.get::<_, String>(2), h);
        c.batch_execute(
            "create schema mine; create table mine.t(x int); create table public.t2(x int); \
             create temp table tt(x int); insert into items values (5000, 'new')",
        )
        .await
        .expect("the task's own DDL and DML");
        // A prepared transaction left behind holds locks and would block DROP DATABASE.
        c.batch_execute(
            "begin; insert into items values (6000, 'prepared'); prepare transaction 'left-behind'",
        )
        .await
        .expect("two-phase commit works for a task");

        // Database-level changes need its owner: all refused.
        let q = format!("\"{h}\"");
        for sql in [
            format!("alter database {q} is_template true"),
            format!("alter database {q} connection limit 0"),
            format!("alter database {q} allow_connections false"),
            format!("alter database {q} set default_transaction_read_only = on"),
            format!("alter database {q} rename to sp_elsewhere"),
            format!("alter database {q} owner to current_user"),
            format!("comment on database {q} is 'mine'"),
        ] {
            let e = c.batch_execute(&sql).await.expect_err(&sql);
            assert_eq!(sqlstate(&e), "42501", "{sql}");
        }

        // Other tasks' metadata: no database comment, and the records table is the admin's
        // alone (tried as the other task's role, in the admin's database).
        let comment: Option<String> = o
            .query_one(
                "select shobj_description(oid, 'pg_database') from pg_database where datname = $1",
                &[&h],
            )
            .await
            .expect("comment")
            .get(0);
        assert_eq!(comment, None);
        let as_other = pg.admin("postgres").await;
        as_other
            .batch_execute(&format!("set role \"{}\"", id(&other)))
            .await
            .expect("set role");
        let e = as_other
            .query("select tag from sandpit_template.backends", &[])
            .await
            .expect_err("records are admin-only");
        assert_eq!(sqlstate(&e), "42501");
        let names: i64 = pg
            .admin("postgres")
            .await
            .query_one(
                "select count(*) from pg_shdescription where description like '%tpl-secret-task-name%'",
                &[],
            )
            .await
            .expect("descriptions")
            .get(0);
        assert_eq!(names, 0, "no task name in any comment");

        // What an agent owning its database could do before (and what the admin stands in
        // for here): flag it a template closed to connections, and leave objects and grants
        // in another database. Revoke still removes database, role and record.
        let admin = pg.admin("postgres").await;
        admin
            .batch_execute(&format!(
                "alter database {q} is_template true allow_connections false; \
                 create table leftover(x int); alter table leftover owner to {q}; \
                 create table shared_t(x int); grant select on shared_t to {q}; \
                 grant connect on database postgres to {q}"
            ))
            .await
            .expect("leftovers");
        let (status, body) = g.revoke(&h);
        assert_eq!(status, 200, "{body}");
        let left: i64 = admin
            .query_one(
                "select (select count(*) from pg_database where datname = $1) \
                      + (select count(*) from pg_roles where rolname = $1) \
                      + (select count(*) from sandpit_template.backends where handle = $1)",
                &[&h],
            )
            .await
            .expect("leftovers")
            .get(0);
        assert_eq!(left, 0, "database, role and record gone\n{}", g.log());
        let prepared: i64 = admin
            .query_one("select count(*) from pg_prepared_xacts", &[])
            .await
            .expect("prepared transactions")
            .get(0);
        assert_eq!(prepared, 0, "the task's prepared transaction was rolled back");
        let kept: i64 = admin
            .query_one("select count(*) from pg_tables where tablename = 'leftover'", &[])
            .await
            .expect("leftover table")
            .get(0);
        assert_eq!(kept, 0, "objects the role owned elsewhere were dropped with it");
        o.simple_query("select 1")
            .await
            .expect("the other task is untouched");
    });
}

/// Issue 29, item 3: on `template` the review logs in as the task's own role, whose settings
/// the agent may change; and the agent may hold locks in prepared transactions. Neither
/// prevents the end-of-token review: its timeouts are startup options (which outrank role
/// settings), and before it the task's sessions end and its prepared transactions roll back.
#[test]
fn role_settings_and_prepared_locks_cannot_prevent_the_review() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let g = gateway(&pg);
    let t = g.issue("tpl-review", 600);
    let h = id(&t);
    rt.block_on(async {
        let c = connect(&dsn(&t)).await.expect("connect");
        c.batch_execute("insert into items values (100001, 'the change')")
            .await
            .expect("change");
        let p = connect(&dsn(&t)).await.expect("connect");
        p.batch_execute(
            "begin; lock table items in access exclusive mode; \
             update items set name = 'held' where id = 1; prepare transaction 'tpl-hold'",
        )
        .await
        .expect("prepare transaction (max_prepared_transactions > 0 on the server)");
        // A session that stays idle in a transaction, too.
        let idle = connect(&dsn(&t)).await.expect("connect");
        idle.batch_execute("begin; select count(*) from pg_class")
            .await
            .expect("idle in transaction");
        c.batch_execute(
            "alter role current_user set idle_in_transaction_session_timeout = '1ms'; \
             alter role current_user set statement_timeout = '1ms'; \
             alter role current_user set lock_timeout = '1ms'",
        )
        .await
        .expect("a role may change its own settings");
        let (status, body) = g.revoke(&h);
        assert_eq!(status, 200, "{body}");
        let shown = g.show(&h);
        assert_eq!(shown["review"], "stored", "{shown}\n{}", g.log());
        assert_eq!(shown["end"], "destroyed", "{shown}");
        let path = g
            .data_dir
            .join("reviews")
            .join("tpl-review")
            .join(format!("{h}.json"));
        let r: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("stored review"))
                .expect("json");
        let data = &r["data"];
        assert_eq!(data.as_array().map(Vec::len), Some(1), "{data}");
        assert_eq!(data[0]["table"], "public.items", "{data}");
        assert_eq!(
            (data[0]["inserted"].as_u64(), data[0]["updated"].as_u64()),
            (Some(1), Some(0)),
            "the insert, and nothing of the rolled-back prepared update: {data}"
        );
    });
}

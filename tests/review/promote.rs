//! Review decisions and promotion with real Postgres: a golden built from a live source
//! database, a task that changes rows and schema, approval, then promotion onto copies of
//! the source. Onto an untouched copy it applies exactly the task's change (compared with a
//! copy where the task's SQL ran directly, by schema dump and content hashes); onto a copy
//! changed concurrently it lists the conflicting rows and applies nothing; a change writing
//! a masked column is refused; a failing validator blocks approval. tests/review/promote/ holds issue
//! 35's cases and a corpus of agent sessions (`corpus.rs`, run by `runner.rs`).

use crate::support::harness;
/// Issue 35's cases and the corpus of agent sessions, in tests/review/promote/.
mod cases;
mod corpus;
mod runner;
use crate::support::shared_pg;

use std::path::PathBuf;

use crate::support::harness::{connect, run_sandpit, Gateway};
use serde_json::{json, Value};

const OWNER: &str = "shop_owner";

const SOURCE_SQL: &str = "
CREATE TABLE customers(id int PRIMARY KEY, email text NOT NULL, city text NOT NULL);
CREATE TABLE orders(id serial PRIMARY KEY, customer_id int NOT NULL REFERENCES customers(id),
  total numeric(10,2) NOT NULL, status text NOT NULL);
INSERT INTO customers SELECT g, 'cust' || g || '@real.test', 'city-' || g FROM generate_series(1, 50) g;
INSERT INTO orders(customer_id, total, status) SELECT 1 + g % 50, g * 1.5, 'open' FROM generate_series(1, 200) g;
";

/// What the agent does (also run directly on the expected copy).
const TASK_SQL: &str = "
UPDATE customers SET city = 'Bergen' WHERE id = 3;
DELETE FROM orders WHERE id = 5;
INSERT INTO orders(customer_id, total, status) VALUES (2, 99.50, 'new');
ALTER TABLE customers ADD COLUMN vip boolean NOT NULL DEFAULT false;
CREATE TABLE coupons(code text PRIMARY KEY, pct int NOT NULL);
INSERT INTO coupons VALUES ('X10', 10), ('Y20', 20);
CREATE INDEX orders_status_idx ON orders(status);
";

async fn exec(c: &tokio_postgres::Client, sql: &str) {
    c.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
}

/// Schema dump of `db` (pg_dump over the admin socket).
fn dump(src: &shared_pg::SharedPg, db: &str) -> String {
    let bin = sandpit::pg::find_binaries(None).expect("binaries");
    let pg_dump = bin.initdb.with_file_name("pg_dump");
    let out = std::process::Command::new(pg_dump)
        .args([
            "--schema-only",
            "--no-comments",
            "-U",
            shared_pg::ADMIN,
            "-d",
            db,
        ])
        .arg("-h")
        .arg(&src.socket_dir)
        .arg("-p")
        .arg(src.port.to_string())
        .output()
        .expect("pg_dump");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without the random key of `\restrict` lines (newer pg_dump releases).
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with("\\restrict") && !l.starts_with("\\unrestrict"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Content hash of every table and the position of every sequence.
async fn content(c: &tokio_postgres::Client) -> Vec<(String, String)> {
    let tables = c
        .query(
            "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) FROM pg_tables \
             WHERE schemaname = 'public' ORDER BY 1",
            &[],
        )
        .await
        .expect("tables");
    let mut out = Vec::new();
    for t in tables {
        let name: String = t.get(0);
        let row = c
            .query_one(
                &format!("SELECT count(*)::text || ':' || coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM {name} t"),
                &[],
            )
            .await
            .expect("hash");
        out.push((name, row.get(0)));
    }
    let seqs = c
        .query(
            "SELECT sequencename, last_value::text FROM pg_sequences WHERE schemaname = 'public' ORDER BY 1",
            &[],
        )
        .await
        .expect("sequences");
    for s in seqs {
        out.push((s.get(0), s.get::<_, Option<String>>(1).unwrap_or_default()));
    }
    out
}

fn record(g: &Gateway, id: &str) -> Value {
    let (s, v) = g.raw_call("GET", &format!("/v1/tokens/{id}/review"), None);
    assert_eq!(s, 200, "{v}");
    v
}

#[test]
fn approve_then_promote_applies_exactly_the_change_or_nothing() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let src = shared_pg::SharedPg::start().await;
        let admin = src.admin("postgres").await;
        let password = format!("pw-{}", sandpit::auth::new_secret());
        exec(&admin, &format!("CREATE ROLE {OWNER} LOGIN PASSWORD '{password}'")).await;
        exec(&admin, &format!("CREATE DATABASE shop OWNER {OWNER}")).await;
        let shop = src.admin("shop").await;
        exec(&shop, &format!("SET ROLE {OWNER}; {SOURCE_SQL}")).await;
        drop(shop);
        for db in ["shop_target", "shop_expected", "shop_moved"] {
            exec(&admin, &format!("CREATE DATABASE {db} TEMPLATE shop OWNER {OWNER}")).await;
        }
        let source_dsn = format!(
            "postgresql://{OWNER}:{password}@127.0.0.1:{}/shop?sslmode=verify-full&sslrootcert={}",
            src.port,
            src.ca_file.display()
        );
        let tcp_dsn = |db: &str| source_dsn.replace("/shop?", &format!("/{db}?"));
        let config = format!(
            "[pool]\nsize = 0\n\n[promote]\nsource_role = \"{OWNER}\"\n\
             [promote.targets.default]\ndsn = \"host={} port={} user={OWNER} dbname=shop_target\"\n\n\
             [[promote.validators]]\nname = \"no negative totals\"\n\
             sql = \"SELECT id, total FROM public.orders WHERE total < 0\"\n\n\
             [[promote.validators]]\nname = \"psql sees the orders\"\n\
             command = [\"sh\", \"-c\", \"test \\\"$(psql -X -tAc 'SELECT count(*) > 0 FROM public.orders')\\\" = t\"]\n",
            src.socket_dir.display(),
            src.port
        );
        // The password of the golden's source, for promotions that name no target.
        let g = Gateway::start_with(
            Some(harness::SMALL_GOLDEN),
            Some(&config),
            &[],
            &[("SANDPIT_PROMOTE_PASSWORD", password.as_str())],
        );
        let api = ["--api", g.api.as_str()];
        let key = [("SANDPIT_ADMIN_KEY", g.admin_key.as_str())];

        let (s, v1) = g.raw_call("POST", "/v1/goldens", Some(json!({"from_dsn": source_dsn, "activate": true})));
        assert_eq!(s, 201, "{v1}");
        // The source is kept with the golden without its password: promotion's default.
        let kept = v1["report"]["source_conninfo"].as_str().unwrap_or_default();
        assert!(kept.contains("dbname='shop'") && kept.contains("sslmode='verify-full'"), "{v1}");
        assert!(!v1.to_string().contains(&password), "{v1}");

        // The task.
        let a = g.issue("promote-a", 600);
        let a_id = a["id"].as_str().expect("id").to_string();
        let c = connect(a["dsn"].as_str().unwrap()).await.expect("connect a");
        exec(&c, TASK_SQL).await;
        drop(c);
        let expected = src.admin("shop_expected").await;
        exec(&expected, &format!("SET ROLE {OWNER}; {TASK_SQL}")).await;

        // A live token cannot be approved: its change is not final.
        let (s, v) = g.raw_call("POST", &format!("/v1/tokens/{a_id}/approve"), Some(json!({"comment": "early"})));
        assert_eq!(s, 409, "{v}");
        assert_eq!(g.revoke(&a_id).0, 200);
        let r = record(&g, &a_id);
        assert_eq!(r["state"], "needs_review", "{r}");
        assert_eq!(r["validators"][0]["passed"], true, "{r}");
        assert_eq!(r["validators"][1]["passed"], true, "command validator: {r}");
        assert_eq!(r["capture"]["complete"], true, "{r}");
        // A rejection needs a reason; approval through the CLI; then the decision is final.
        let (s, _) = g.raw_call("POST", &format!("/v1/tokens/{a_id}/reject"), Some(json!({})));
        assert_eq!(s, 400);
        let (code, out, err) = run_sandpit(
            &[&["review", "approve", &a_id, "--comment", "index is fine"][..], &api[..]].concat(),
            &key,
        );
        assert_eq!(code, 0, "{out}{err}");
        let (s, v) = g.raw_call("POST", &format!("/v1/tokens/{a_id}/reject"), Some(json!({"comment": "check the index first"})));
        assert_eq!(s, 409, "{v}");
        assert!(v["error"].as_str().unwrap_or("").contains("approved by admin at"), "{v}");
        let r = record(&g, &a_id);
        assert_eq!(r["state"], "approved", "{r}");
        let trail = r["trail"].as_array().expect("trail");
        assert_eq!(trail.len(), 1, "{r}");
        assert_eq!(trail[0]["action"], "approved");
        assert_eq!(trail[0]["by"], "admin");
        assert_eq!(trail[0]["comment"], "index is fine");
        assert!(trail[0]["at"].as_str().unwrap_or("").contains('T'));

        // The target moved since the golden: conflicts listed, nothing applied.
        let moved = src.admin("shop_moved").await;
        exec(&moved, "UPDATE customers SET city = 'Trondheim' WHERE id = 3; UPDATE orders SET status = 'paid' WHERE id = 5;").await;
        let moved_before = (dump(&src, "shop_moved"), content(&moved).await);
        let moved_dsn = tcp_dsn("shop_moved");
        let (code, out, err) = run_sandpit(
            &[&["promote", &a_id, "--json"][..], &api[..]].concat(),
            &[key[0], ("SANDPIT_PROMOTE_TARGET", moved_dsn.as_str())],
        );
        assert_ne!(code, 0, "{out}{err}");
        let rep: Value = serde_json::from_str(&out).expect("report json");
        assert_eq!(rep["outcome"], "conflicts", "{rep}");
        let conflicts: Vec<String> = rep["conflicts"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect();
        assert_eq!(conflicts.len(), 2, "{conflicts:#?}");
        assert!(conflicts.iter().any(|c| c.contains("public.customers row (id)=(3)") && c.contains("city")), "{conflicts:#?}");
        assert!(conflicts.iter().any(|c| c.contains("public.orders row (id)=(5)") && c.contains("status")), "{conflicts:#?}");
        assert!(!out.contains(&password) && !err.contains(&password));
        assert_eq!((dump(&src, "shop_moved"), content(&moved).await), moved_before, "the conflicting promotion changed the target");

        // A dry run onto the untouched copy would apply, and commits nothing.
        let target = src.admin("shop_target").await;
        let target_before = (dump(&src, "shop_target"), content(&target).await);
        let (s, rep) = g.raw_call("POST", &format!("/v1/tokens/{a_id}/promote"), Some(json!({"target": "default", "dry_run": true})));
        assert_eq!(s, 200, "{rep}");
        assert_eq!(rep["outcome"], "dry_run", "{rep}");
        assert_eq!(rep["counts"]["inserted"], 3, "{rep}");
        assert_eq!(rep["counts"]["deleted"], 1, "{rep}");
        assert_eq!((dump(&src, "shop_target"), content(&target).await), target_before);
        assert_eq!(record(&g, &a_id)["state"], "approved");

        // Promote for real, naming no target: to the source the golden was built from, with
        // the password from the gateway's environment. Exactly the task's change.
        let source = src.admin("shop").await;
        let (code, out, err) = run_sandpit(&[&["promote", &a_id, "--json"][..], &api[..]].concat(), &key);
        assert_eq!(code, 0, "{out}{err}");
        let rep: Value = serde_json::from_str(&out).expect("report json");
        assert_eq!(rep["outcome"], "applied", "{rep}");
        assert_eq!(rep["target"], format!("postgresql://{OWNER}@127.0.0.1:{}/shop", src.port), "{rep}");
        assert_eq!(rep["role"], OWNER, "{rep}");
        assert_eq!(dump(&src, "shop"), dump(&src, "shop_expected"));
        assert_eq!(content(&source).await, content(&expected).await);
        assert_eq!((dump(&src, "shop_target"), content(&target).await), target_before);
        let r = record(&g, &a_id);
        assert_eq!(r["state"], "promoted", "{r}");
        assert_eq!(r["promotions"].as_array().map(|a| a.len()), Some(3), "{r}");
        assert!(!r.to_string().contains(&password));
        // Once promoted, no second time and no more decisions.
        let (s, _) = g.raw_call("POST", &format!("/v1/tokens/{a_id}/promote"), Some(json!({"target": "default"})));
        assert_eq!(s, 409);
        let (s, _) = g.raw_call("POST", &format!("/v1/tokens/{a_id}/reject"), Some(json!({"comment": "late"})));
        assert_eq!(s, 409);

        // A failing validator blocks approval.
        let b = g.issue("promote-b", 600);
        let b_id = b["id"].as_str().unwrap().to_string();
        let c = connect(b["dsn"].as_str().unwrap()).await.expect("connect b");
        exec(&c, "UPDATE orders SET total = -1 WHERE id = 7").await;
        drop(c);
        assert_eq!(g.revoke(&b_id).0, 200);
        let r = record(&g, &b_id);
        assert_eq!(r["validators"][0]["passed"], false, "{r}");
        assert!(r["validators"][0]["detail"].as_str().unwrap().contains("(7, -1.00)"), "{r}");
        let (code, out, err) = run_sandpit(&[&["review", "approve", &b_id][..], &api[..]].concat(), &key);
        assert_ne!(code, 0, "{out}");
        assert!(err.contains("validators failed: no negative totals"), "{err}");
        assert_eq!(record(&g, &b_id)["state"], "needs_review");

        // A golden with a masked column: a change writing it is refused.
        let (s, v2) = g.raw_call(
            "POST",
            "/v1/goldens",
            Some(json!({"from_dsn": source_dsn, "activate": true,
                        "mask": "[columns]\n\"customers.email\" = \"email\"\n"})),
        );
        assert_eq!(s, 201, "{v2}");
        let m = g.issue("promote-masked", 600);
        let m_id = m["id"].as_str().unwrap().to_string();
        let c = connect(m["dsn"].as_str().unwrap()).await.expect("connect m");
        exec(&c, "UPDATE customers SET email = 'new@example.test', city = 'Oslo' WHERE id = 1").await;
        drop(c);
        assert_eq!(g.revoke(&m_id).0, 200);
        // Known when the token ended: approval is refused with the reason.
        let (s, v) = g.raw_call("POST", &format!("/v1/tokens/{m_id}/approve"), Some(json!({"comment": "ok"})));
        assert_eq!(s, 409, "{v}\n{}", record(&g, &m_id));
        assert!(v.to_string().contains("masked columns (email)"), "{v}");
        let (s, rep) = g.raw_call("POST", &format!("/v1/tokens/{m_id}/promote"), Some(json!({"dsn": tcp_dsn("shop_moved"), "dry_run": true})));
        assert_eq!(s, 200, "{rep}");
        assert_eq!(rep["outcome"], "refused", "{rep}");
        assert!(rep["refusals"].to_string().contains("masked columns (email)"), "{rep}");
        assert_eq!((dump(&src, "shop_moved"), content(&moved).await), moved_before);
        assert_eq!(record(&g, &m_id)["state"], "needs_review");

        // No file the gateway wrote holds the source's password (golden metadata included).
        let found = std::process::Command::new("grep")
            .args(["-rlFa", "-D", "skip", "--", &password])
            .arg(&g.data_dir)
            .output()
            .expect("grep");
        assert_eq!(found.status.code(), Some(1), "password found in: {}", String::from_utf8_lossy(&found.stdout));
        // The list shows every token with its decision state and change counts.
        let (s, list) = g.raw_call("GET", "/v1/reviews", None);
        assert_eq!(s, 200);
        let find = |id: &str| list.as_array().unwrap().iter().find(|x| x["token"] == id).cloned().unwrap();
        assert_eq!(find(&a_id)["state"], "promoted");
        // 3 inserted, 1 deleted, and all 50 customers updated: the added `vip` column's values
        // are changes of their own (issue 16), so its one flipped row is among the 50.
        assert_eq!(find(&a_id)["rows_changed"], 54, "{list}");
        assert_eq!(find(&b_id)["validators_failed"], 1);
        // Records are files in the data dir: they outlive the process.
        let dir: PathBuf = g.data_dir.join("reviews").join("promote-a");
        assert!(dir.join(format!("{a_id}.promote.json")).is_file());
        let metrics = harness::metrics(&g.api);
        assert!(metrics.get("sandpit_review_approvals_total").copied().unwrap_or(0.0) >= 1.0, "{metrics:?}");
    });
}

/// A golden built from the SQL file has no source to promote to: with no target named and no
/// `[promote.targets].default`, the error says both ways out.
#[test]
fn no_target_named_and_none_by_default_is_a_clear_error() {
    let g = Gateway::start(Some(harness::SMALL_GOLDEN), Some("[pool]\nsize = 0\n"));
    let t = g.issue("promote-nowhere", 600);
    let id = t["id"].as_str().expect("id").to_string();
    assert_eq!(g.revoke(&id).0, 200);
    let (s, v) = g.raw_call("POST", &format!("/v1/tokens/{id}/promote"), Some(json!({})));
    assert_eq!(s, 400, "{v}");
    let e = v.to_string();
    assert!(e.contains("was not built from a live database"), "{e}");
    assert!(
        e.contains("[promote.targets]") && e.contains("--target"),
        "{e}"
    );
}

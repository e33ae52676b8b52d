//! Issue 35's promotion cases, against one real source/target server and one gateway whose
//! golden masks `customers.email`: a change with a serial table, a dropped table with rows
//! and children moved to another parent promotes exactly (target = a copy where the SQL ran
//! directly, by schema dump and content hashes); agent code in expressions, masked values
//! written back (derived, `CREATE TABLE AS`, concatenated, upper-cased) and changes the
//! review does not model are refused when the token ends, so approval is refused with the
//! reason, and nothing reaches the target (a LISTEN session hears nothing, no large object
//! appears, dump and hashes unchanged). A promotion killed mid-way leaves an "interrupted"
//! entry and the target untouched; after the golden version is replaced, the default target
//! (the source) is still known. Onto a target whose sequence moved, inserted rows get fresh
//! keys and their children follow; a concurrent edit to a column the task drops conflicts.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_postgres::AsyncMessage;

use super::{content, dump, exec, record, shared_pg, OWNER};
use crate::support::harness::{connect, Gateway};

const SOURCE_SQL: &str = "
CREATE TABLE customers(id int PRIMARY KEY, email text NOT NULL, city text NOT NULL);
CREATE TABLE orders(id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers(id),
  status text NOT NULL);
CREATE TABLE notes(id serial PRIMARY KEY, body text NOT NULL);
INSERT INTO customers SELECT g, 'cust' || g || '@real.test', 'city-' || g FROM generate_series(1, 20) g;
INSERT INTO orders SELECT g, 1 + g % 20, 'open' FROM generate_series(1, 60) g;
INSERT INTO notes(body) SELECT 'note ' || g FROM generate_series(1, 5) g;
CREATE TABLE events(id serial PRIMARY KEY, name text NOT NULL);
CREATE TABLE event_items(id int PRIMARY KEY, event_id int NOT NULL REFERENCES events(id),
  what text NOT NULL);
INSERT INTO events(name) VALUES ('a'), ('b');
";

/// Rows with sequence-generated keys and a child pointing at one, onto a target whose
/// sequence moved since the golden (`CONCURRENT_SQL` ran there first).
const REBASE_SQL: &str = "
INSERT INTO events(name) VALUES ('launch');
INSERT INTO event_items VALUES (1, currval('events_id_seq'), 'cake');
";
const CONCURRENT_SQL: &str = "INSERT INTO events(name) VALUES ('other');";

/// Common changes that failed before: a serial table (sequence before table, its DEFAULT
/// nextval allowed), a dropped table with rows, children moved before their parent goes.
const COMMON_SQL: &str = "
CREATE TABLE tags(id serial PRIMARY KEY, name text NOT NULL CHECK (length(name) > 0));
INSERT INTO tags(name) VALUES ('red'), ('green');
CREATE INDEX tags_lower_idx ON tags (lower(name));
DROP TABLE notes;
UPDATE orders SET customer_id = 2 WHERE customer_id = 1;
DELETE FROM customers WHERE id = 1;
";

/// Expressions that would run agent code or side effects on the target.
const HOSTILE_SQL: &str = "
CREATE FUNCTION positive(int) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT $1 > 0';
CREATE FUNCTION same_int(int, int) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT $1 = $2';
CREATE OPERATOR === (LEFTARG = int, RIGHTARG = int, FUNCTION = same_int);
ALTER TABLE customers ADD CONSTRAINT leak_notify CHECK (length(pg_notify('leak', email)::text) = 0);
ALTER TABLE customers ADD CONSTRAINT leak_lo CHECK (lo_from_bytea(0, convert_to(email, 'UTF8')) > 0);
ALTER TABLE customers ADD CONSTRAINT lock_it CHECK (pg_try_advisory_lock(id));
ALTER TABLE orders ADD COLUMN note text DEFAULT set_config('app.x', 'y', false);
ALTER TABLE orders ADD CONSTRAINT positive_id CHECK (positive(id));
CREATE INDEX orders_odd ON orders (id) WHERE id === 1;
";

/// Masked values written back, derived four ways.
const LEAK_SQL: &str = "
UPDATE orders SET status = c.email FROM customers c WHERE c.id = orders.customer_id AND orders.id = 3;
UPDATE orders SET status = 'x' || c.email FROM customers c WHERE c.id = orders.customer_id AND orders.id = 4;
UPDATE orders SET status = upper(c.email) FROM customers c WHERE c.id = orders.customer_id AND orders.id = 5;
CREATE TABLE customers_backup AS SELECT id, email FROM customers WHERE id <= 3;
";

/// What the review does not model.
const UNMODELLED_SQL: &str = "
ALTER TABLE orders ENABLE ROW LEVEL SECURITY;
CREATE POLICY only_open ON orders USING (status = 'open');
ALTER TABLE customers SET (fillfactor = 70);
";

/// Run `sql` as a task; its token ended; its review record.
async fn task(g: &Gateway, name: &str, sql: &str) -> (String, Value) {
    let t = g.issue(name, 600);
    let id = t["id"].as_str().expect("id").to_string();
    let c = connect(t["dsn"].as_str().expect("dsn"))
        .await
        .expect("connect");
    exec(&c, sql).await;
    drop(c);
    assert_eq!(g.revoke(&id).0, 200);
    let r = record(g, &id);
    (id, r)
}

/// A LISTEN session on `db` (every channel used here), and what it receives.
async fn listener(
    src: &shared_pg::SharedPg,
    db: &str,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (client, mut conn) = tokio_postgres::Config::new()
        .host_path(&src.socket_dir)
        .port(src.port)
        .user(shared_pg::ADMIN)
        .dbname(db)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("listener connect");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut m = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(msg)) = m.next().await {
            if let AsyncMessage::Notification(n) = msg {
                let _ = tx.send(format!("{}: {}", n.channel(), n.payload()));
            }
        }
    });
    exec(&client, "LISTEN leak").await;
    (client, rx)
}

async fn large_objects(c: &tokio_postgres::Client) -> i64 {
    c.query_one("SELECT count(*) FROM pg_largeobject_metadata", &[])
        .await
        .expect("count large objects")
        .get(0)
}

/// Approve `id`; if that (wrongly) succeeds, promote it for real so the side-effect checks
/// that follow see what it does. Returns the approval's answer.
fn approve_or_promote(g: &Gateway, id: &str) -> (u16, Value) {
    let (s, v) = g.raw_call(
        "POST",
        &format!("/v1/tokens/{id}/approve"),
        Some(json!({"comment": "looks fine"})),
    );
    if s == 200 {
        let _ = g.raw_call(
            "POST",
            &format!("/v1/tokens/{id}/promote"),
            Some(json!({"target": "default"})),
        );
    }
    (s, v)
}

fn refusals(r: &Value) -> String {
    r["capture"]["refusals"].to_string()
}

#[test]
fn unsafe_changes_are_refused_before_approval_and_common_ones_promote_exactly() {
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
        for db in ["shop_target", "shop_expected", "shop_moving", "shop_moving_expected"] {
            exec(&admin, &format!("CREATE DATABASE {db} TEMPLATE shop OWNER {OWNER}")).await;
        }
        let source_dsn = format!(
            "postgresql://{OWNER}:{password}@127.0.0.1:{}/shop?sslmode=verify-full&sslrootcert={}",
            src.port,
            src.ca_file.display()
        );
        let config = format!(
            "[pool]\nsize = 0\n\n[promote]\nsource_role = \"{OWNER}\"\n\
             [promote.targets.default]\ndsn = \"host={} port={} user={OWNER} dbname=shop_target\"\n",
            src.socket_dir.display(),
            src.port
        );
        let env = [("SANDPIT_PROMOTE_PASSWORD", password.as_str())];
        let g = Gateway::start_with(Some(crate::support::harness::SMALL_GOLDEN), Some(&config), &[], &env);
        let (s, v) = g.raw_call(
            "POST",
            "/v1/goldens",
            Some(json!({"from_dsn": source_dsn, "activate": true,
                        "mask": "[columns]\n\"customers.email\" = \"email\"\n"})),
        );
        assert_eq!(s, 201, "{v}");
        let kept = v["report"]["masked_values"].as_array().map(|a| a.len());
        assert_eq!(kept, Some(20), "every masked e-mail is kept with the golden: {v}");

        let target = src.admin("shop_target").await;
        let (_listen, mut heard) = listener(&src, "shop_target").await;
        // The listener works: a notification sent on purpose arrives.
        exec(&target, "NOTIFY leak, 'control'").await;
        let control = tokio::time::timeout(Duration::from_secs(10), heard.recv()).await;
        assert_eq!(control.ok().flatten().as_deref(), Some("leak: control"));
        let lo_before = large_objects(&target).await;
        let target_before = (dump(&src, "shop_target"), content(&target).await);

        // Agent code in expressions: each named, approval refused, nothing runs.
        let (h_id, r) = task(&g, "promote-hostile", HOSTILE_SQL).await;
        let why = refusals(&r);
        for needle in [
            "constraint public.customers.leak_notify",
            "pg_notify(text,text), which has side effects",
            "lo_from_bytea(oid,bytea), which has side effects",
            "pg_try_advisory_lock(bigint), which has side effects",
            "set_config(text,text,boolean), which has side effects",
            "positive(integer), which is not built in",
            "operator public.===(integer,integer), which is not built in",
            "index CREATE INDEX orders_odd",
        ] {
            assert!(why.contains(needle), "{needle} missing from {why}");
        }
        let (s, v) = approve_or_promote(&g, &h_id);
        let dry = g.raw_call("POST", &format!("/v1/tokens/{h_id}/promote"), Some(json!({"target": "default", "dry_run": true})));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(heard.try_recv().is_err(), "the target's listener heard the agent's code");
        assert_eq!(large_objects(&target).await, lo_before, "large objects appeared");
        assert_eq!(s, 409, "{v}");
        assert!(v.to_string().contains("pg_notify"), "{v}");
        assert_eq!(dry.1["outcome"], "refused", "{}", dry.1);
        assert_eq!((dump(&src, "shop_target"), content(&target).await), target_before);

        // Masked values written back, however derived: refused with table, row and column.
        let (l_id, r) = task(&g, "promote-leak", LEAK_SQL).await;
        let why = refusals(&r);
        for needle in [
            "table public.orders: writes values the golden's masking produced",
            "row (id)=(3): column status",
            "row (id)=(4): column status",
            "row (id)=(5): column status",
            "table public.customers_backup: writes values",
            "column email holds",
        ] {
            assert!(why.contains(needle), "{needle} missing from {why}");
        }
        let (s, v) = approve_or_promote(&g, &l_id);
        assert_eq!(s, 409, "{v}");
        assert_eq!((dump(&src, "shop_target"), content(&target).await), target_before);

        // What the review does not model: "patch verified: differs" blocks approval.
        let (u_id, r) = task(&g, "promote-unmodelled", UNMODELLED_SQL).await;
        let why = refusals(&r);
        assert!(why.contains("patch verified: differs") && why.contains("does not model"), "{r}");
        let (s, v) = approve_or_promote(&g, &u_id);
        assert_eq!(s, 409, "{v}");
        assert_eq!((dump(&src, "shop_target"), content(&target).await), target_before);

        // A target that moved: the task's generated keys are taken afresh from the target's
        // sequence and the child row follows; the same as running the task's SQL there.
        let moving = src.admin("shop_moving").await;
        let moving_expected = src.admin("shop_moving_expected").await;
        exec(&moving, CONCURRENT_SQL).await;
        exec(&moving_expected, &format!("SET ROLE {OWNER}; {CONCURRENT_SQL} {REBASE_SQL}")).await;
        let (m_id, r) = task(&g, "promote-rebase", REBASE_SQL).await;
        assert_eq!(refusals(&r), "null", "{r}");
        let (s, v) = g.raw_call("POST", &format!("/v1/tokens/{m_id}/approve"), Some(json!({"comment": "ok"})));
        assert_eq!(s, 200, "{v}");
        let moving_dsn = source_dsn.replace("/shop?", "/shop_moving?");
        let moving_before = (dump(&src, "shop_moving"), content(&moving).await);
        let (s, rep) = g.raw_call("POST", &format!("/v1/tokens/{m_id}/promote"), Some(json!({"dsn": moving_dsn, "dry_run": true})));
        assert_eq!(rep["outcome"], "dry_run", "{s} {rep}");
        assert_eq!((dump(&src, "shop_moving"), content(&moving).await), moving_before, "a dry run moved the target");
        let (s, rep) = g.raw_call("POST", &format!("/v1/tokens/{m_id}/promote"), Some(json!({"dsn": moving_dsn})));
        assert_eq!(rep["outcome"], "applied", "{s} {rep}");
        assert_eq!(dump(&src, "shop_moving"), dump(&src, "shop_moving_expected"));
        assert_eq!(content(&moving).await, content(&moving_expected).await);

        // A concurrent edit to a column the task drops is a conflict; without one, it applies.
        let (d_id, r) = task(&g, "promote-drop-column", "ALTER TABLE customers DROP COLUMN city").await;
        assert_eq!(refusals(&r), "null", "{r}");
        let (s, v) = g.raw_call("POST", &format!("/v1/tokens/{d_id}/approve"), Some(json!({"comment": "ok"})));
        assert_eq!(s, 200, "{v}");
        let (_, rep) = g.raw_call("POST", &format!("/v1/tokens/{d_id}/promote"), Some(json!({"dsn": moving_dsn, "dry_run": true})));
        assert_eq!(rep["outcome"], "dry_run", "{rep}");
        exec(&moving, "UPDATE customers SET city = 'Elsewhere' WHERE id = 5").await;
        let (_, rep) = g.raw_call("POST", &format!("/v1/tokens/{d_id}/promote"), Some(json!({"dsn": moving_dsn})));
        assert_eq!(rep["outcome"], "conflicts", "{rep}");
        assert!(rep["conflicts"].to_string().contains("column public.customers.city: its values changed"), "{rep}");

        // Common changes: approved; a promotion killed mid-way (the target holds a lock the
        // promotion waits for) leaves an "interrupted" entry and the target untouched.
        let (c_id, r) = task(&g, "promote-common", COMMON_SQL).await;
        assert_eq!(refusals(&r), "null", "{r}");
        let (s, v) = g.raw_call("POST", &format!("/v1/tokens/{c_id}/approve"), Some(json!({"comment": "ok"})));
        assert_eq!(s, 200, "{v}");
        let blocker = src.admin("shop_target").await;
        exec(&blocker, "BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE").await;
        let (api, key, path) = (g.api.clone(), g.admin_key.clone(), format!("/v1/tokens/{c_id}/promote"));
        let pending = std::thread::spawn(move || {
            // Cut short by the kill below: its answer (an error) does not matter.
            let body = crate::support::harness::Body::Json(json!({"target": "default"}));
            let _ = crate::support::harness::http("POST", &format!("{api}{path}"), Some(&key), body);
        });
        let mut under_way = false;
        for _ in 0..100 {
            if !record(&g, &c_id)["promoting"].is_null() {
                under_way = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(under_way, "the promotion never showed as under way: {}", record(&g, &c_id));
        let mut g = g;
        g.kill();
        exec(&blocker, "ROLLBACK").await;
        let _ = pending.join();
        let g = Gateway::start_in_with(&g.data_dir.clone(), Some(crate::support::harness::SMALL_GOLDEN), Some(&config), &[], &env);
        let r = record(&g, &c_id);
        let last = r["trail"].as_array().and_then(|t| t.last()).cloned().unwrap_or_default();
        assert_eq!(last["action"], "promote-interrupted", "{r}");
        assert!(r["promoting"].is_null(), "{r}");
        assert_eq!(r["state"], "approved", "{r}");
        assert_eq!((dump(&src, "shop_target"), content(&target).await), target_before);

        // A new golden version replaces the first (removed: nothing uses it); the default
        // target, the source the golden was built from, is still known. Exactly the change.
        let (s, v2) = g.raw_call("POST", "/v1/goldens", Some(json!({"from_dsn": source_dsn, "activate": true,
                        "mask": "[columns]\n\"customers.email\" = \"email\"\n"})));
        assert_eq!(s, 201, "{v2}");
        let (_, list) = g.raw_call("GET", "/v1/goldens", None);
        assert!(!list.to_string().contains(r["golden"].as_str().unwrap_or("?")), "the first version is still listed: {list}");
        let (s, rep) = g.raw_call("POST", &format!("/v1/tokens/{c_id}/promote"), Some(json!({})));
        assert_eq!(s, 200, "{rep}");
        assert_eq!(rep["outcome"], "applied", "{rep}");
        assert_eq!(rep["target"], format!("postgresql://{OWNER}@127.0.0.1:{}/shop", src.port), "{rep}");
        let expected = src.admin("shop_expected").await;
        exec(&expected, &format!("SET ROLE {OWNER}; {COMMON_SQL}")).await;
        let source = src.admin("shop").await;
        assert_eq!(dump(&src, "shop"), dump(&src, "shop_expected"));
        assert_eq!(content(&source).await, content(&expected).await);
        assert_eq!((dump(&src, "shop_target"), content(&target).await), target_before);
        assert!(heard.try_recv().is_err());
    });
}

//! Goldens from a live database: a password-protected source server (started with the
//! project's own code) is copied with masking and sampling; masked columns share no value
//! with the source, hashed keys still join the right rows, the sampled table keeps its
//! foreign keys, the source saw only reads, and no original value nor the source password
//! is left in the golden's files or the gateway's log. Then versions: a second golden serves
//! new tokens while an old token keeps its fork, and the old version is removed once its
//! last fork ends.

use crate::support::harness;
use crate::support::shared_pg;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::harness::{connect, run_sandpit, Gateway};
use serde_json::{json, Value};

const SOURCE_ROLE: &str = "shop_owner";

const SOURCE_SQL: &str = "
CREATE TABLE customers(id int PRIMARY KEY, email text UNIQUE NOT NULL, name text NOT NULL,
  phone text, notes text, tier text NOT NULL, city text NOT NULL);
CREATE TABLE orders(id int PRIMARY KEY, customer_id int NOT NULL REFERENCES customers(id),
  total numeric(10,2) NOT NULL);
CREATE TABLE order_items(id int PRIMARY KEY, order_id int NOT NULL REFERENCES orders(id),
  sku text NOT NULL);
CREATE TABLE audit_secrets(id int, payload text);
INSERT INTO customers SELECT g, 'cust' || g || '@realmail.test', 'Realname' || g,
  '+44 20 7946 ' || lpad(g::text, 4, '0'), 'secret note ' || g, 'gold', 'city-' || g
  FROM generate_series(1, 200) g;
INSERT INTO orders SELECT g, 1 + g % 200, g * 1.5 FROM generate_series(1, 1000) g;
INSERT INTO order_items SELECT g, 1 + g % 1000, 'sku-' || g FROM generate_series(1, 2000) g;
INSERT INTO audit_secrets VALUES (1, 'audit-payload-xyz');
";

const MASK: &str = r#"
[columns]
"public.customers.email" = "email"
"customers.name" = "name"
"customers.id" = "hash"
"orders.customer_id" = "hash"
"customers.notes" = "null"
"customers.tier" = "constant:basic"
"customers.phone" = "phone"
"orders.total" = "sql:round(total * 0.9, 2)"
[tables]
"orders" = "sample:10"
"#;

/// Every statement the source logged for `SOURCE_ROLE` (log_statement = all for that role).
fn source_statements(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.split('\n')
        .filter_map(|l| {
            l.split_once("LOG:  statement: ")
                .map(|x| x.1.trim().to_string())
        })
        .collect()
}

fn is_read(stmt: &str) -> bool {
    let s = stmt.to_ascii_uppercase();
    let first = s.split_whitespace().next().unwrap_or("");
    match first {
        "SELECT" | "SET" | "SHOW" | "RESET" | "COMMIT" | "ROLLBACK" | "BEGIN" => true,
        // A CTE, but not a data-modifying one.
        "WITH" => !["INSERT ", "UPDATE ", "DELETE ", "MERGE "]
            .iter()
            .any(|w| s.contains(w)),
        "LOCK" => s.contains("IN ACCESS SHARE MODE"),
        "COPY" => s.contains(" TO STDOUT"),
        _ => false,
    }
}

/// Files under `dir` holding any of `needles` (as bytes).
fn files_containing(dir: &Path, needles: &[&str]) -> Vec<(PathBuf, String)> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                let bytes = std::fs::read(&p).unwrap_or_default();
                for n in needles {
                    if bytes.windows(n.len()).any(|w| w == n.as_bytes()) {
                        hits.push((p.clone(), n.to_string()));
                    }
                }
            }
        }
    }
    hits
}

async fn rows(dsn: &str, sql: &str) -> Vec<Vec<Option<String>>> {
    let c = connect(dsn).await.expect("connect");
    c.simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect()
}

async fn one(dsn: &str, sql: &str) -> String {
    rows(dsn, sql).await[0][0].clone().unwrap_or_default()
}

fn versions_dir(g: &Gateway) -> PathBuf {
    g.data_dir.join("pg").join("versions")
}

#[test]
fn golden_from_a_live_database() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        // The source: a real server, a password-protected owner role, log of its statements.
        let src = shared_pg::SharedPg::start().await;
        let admin = src.admin("postgres").await;
        let password = format!("pw-{}", sandpit::auth::new_secret());
        for sql in [
            format!("CREATE ROLE {SOURCE_ROLE} LOGIN PASSWORD '{password}'"),
            format!("CREATE DATABASE shop OWNER {SOURCE_ROLE}"),
            format!("ALTER ROLE {SOURCE_ROLE} SET log_statement = 'all'"),
        ] {
            admin.batch_execute(&sql).await.expect("source role");
        }
        let shop = src.admin("shop").await;
        shop.batch_execute(&format!("SET ROLE {SOURCE_ROLE}; {SOURCE_SQL}"))
            .await
            .expect("source data");
        // The source's certificate is verified: the DSN's TLS parameters reach libpq as given.
        let source_dsn = format!(
            "postgresql://{SOURCE_ROLE}:{password}@127.0.0.1:{}/shop?sslmode=verify-full&sslrootcert={}",
            src.port,
            src.ca_file.display()
        );
        let before = source_statements(&src.log_path()).len();

        let g = Gateway::start(
            Some(harness::SMALL_GOLDEN),
            Some("[pool]\nsize = 1\n"),
        );
        let api = ["--api", g.api.as_str()];
        let key = [("SANDPIT_ADMIN_KEY", g.admin_key.as_str())];

        // Strict rules: an unknown column is refused, with the column named.
        let (status, body) = g.raw_call(
            "POST",
            "/v1/goldens",
            Some(json!({"from_dsn": source_dsn, "exclude_tables": ["audit_secrets"],
                        "mask": "[columns]\n\"customers.nope\" = \"hash\"\n"})),
        );
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains("has no column \\\"nope\\\""), "{body}");
        // A hashed key whose referencing column is left alone would break the join.
        let (status, body) = g.raw_call(
            "POST",
            "/v1/goldens",
            Some(json!({"from_dsn": source_dsn, "mask": "[columns]\n\"customers.id\" = \"hash\"\n"})),
        );
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains("orders.customer_id references"), "{body}");
        assert!(!body.to_string().contains(&password));
        // A server whose certificate the given CA did not sign is refused before the password
        // is sent.
        let other_ca = g.data_dir.join("other-ca.pem");
        let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("cert");
        std::fs::write(&other_ca, other.cert.pem()).expect("other ca");
        let (status, body) = g.raw_call(
            "POST",
            "/v1/goldens",
            Some(json!({"from_dsn": format!(
                "postgresql://{SOURCE_ROLE}:{password}@127.0.0.1:{}/shop?sslmode=verify-full&sslrootcert={}",
                src.port,
                other_ca.display()
            )})),
        );
        assert_ne!(status, 201, "{body}");
        assert!(body.to_string().contains("certificate"), "{body}");
        assert!(!body.to_string().contains(&password));

        // Build v1 through the CLI, the DSN in the environment, and use it at once.
        let mask_file = g.data_dir.join("mask.toml");
        std::fs::write(&mask_file, MASK).expect("mask file");
        let mask_arg = mask_file.display().to_string();
        let (code, out, err) = run_sandpit(
            &[
                &["golden", "build", "--exclude-table", "audit_secrets", "--mask", &mask_arg, "--use", "--json"][..],
                &api[..],
            ]
            .concat(),
            &[key[0], ("SANDPIT_GOLDEN_SOURCE_DSN", source_dsn.as_str())],
        );
        assert_eq!(code, 0, "stdout {out}\nstderr {err}\nlog {}", g.log());
        let v1: Value = serde_json::from_str(&out).expect("build json");
        let v1_id = v1["id"].as_str().expect("id").to_string();
        assert_eq!(v1["active"], true);
        assert_eq!(v1["kind"], "live");
        assert_eq!(
            v1["source"],
            format!("postgresql://{SOURCE_ROLE}@127.0.0.1:{}/shop", src.port)
        );
        assert_eq!(v1["report"]["sampled"][0]["table"], "public.orders");
        assert!(v1["report"]["trimmed"]["public.order_items"].as_u64().unwrap_or(0) > 0, "{v1}");

        // The source saw only reads, inside a read-only transaction.
        let stmts: Vec<String> = source_statements(&src.log_path()).split_off(before);
        assert!(!stmts.is_empty(), "the source logged no statement of the build");
        assert!(
            stmts.iter().any(|s| s.to_ascii_uppercase().contains("READ ONLY")),
            "{stmts:#?}"
        );
        let writes: Vec<&String> = stmts.iter().filter(|s| !is_read(s)).collect();
        assert!(writes.is_empty(), "source saw non-reads: {writes:#?}");
        // Every transaction is made read only before anything is read in it.
        for (i, s) in stmts.iter().enumerate() {
            if s.eq_ignore_ascii_case("BEGIN") {
                let next = stmts.get(i + 1).map(|n| n.to_ascii_uppercase()).unwrap_or_default();
                assert!(
                    next.starts_with("SET TRANSACTION") && next.contains("READ ONLY"),
                    "BEGIN followed by {next:?}"
                );
            }
        }

        // A token on v1.
        let a = g.issue("golden-a", 600);
        let a_dsn = a["dsn"].as_str().unwrap().to_string();
        let customers = rows(&a_dsn, "SELECT id, email, name, phone, notes, tier FROM customers").await;
        assert_eq!(customers.len(), 200);
        for c in &customers {
            let id: i64 = c[0].as_deref().unwrap().parse().unwrap();
            assert!(!(1..=200).contains(&id), "id {id} kept its original value");
            let email = c[1].as_deref().unwrap();
            assert!(!email.contains("@realmail.test"), "{email}");
            assert!(!c[2].as_deref().unwrap().starts_with("Realname"));
            assert!(!c[3].as_deref().unwrap().starts_with("+44 20 7946"));
            assert_eq!(c[4], None);
            assert_eq!(c[5].as_deref(), Some("basic"));
        }
        let originals: std::collections::HashSet<String> =
            (1..=200).map(|g| format!("cust{g}@realmail.test")).collect();
        assert!(customers.iter().all(|c| !originals.contains(c[1].as_deref().unwrap())));
        // Hashed keys join, and to the right customer (city is not masked).
        let orders = rows(
            &a_dsn,
            "SELECT o.id, c.city, o.total FROM orders o LEFT JOIN customers c ON c.id = o.customer_id",
        )
        .await;
        let n = orders.len();
        assert!(n > 0 && n < 1000, "orders sampled to {n} of 1000");
        for o in &orders {
            let id: i64 = o[0].as_deref().unwrap().parse().unwrap();
            assert_eq!(o[1], Some(format!("city-{}", 1 + id % 200)), "order {id}");
            let total = format!("{:.2}", (id as f64 * 1.5 * 0.9 * 100.0).round() / 100.0);
            assert_eq!(o[2].as_deref(), Some(total.as_str()), "order {id}");
        }
        // The sampled table keeps referential integrity downstream.
        assert_eq!(
            one(&a_dsn, "SELECT count(*) FROM order_items i LEFT JOIN orders o ON o.id = i.order_id WHERE o.id IS NULL").await,
            "0"
        );
        let items: i64 = one(&a_dsn, "SELECT count(*) FROM order_items").await.parse().unwrap();
        assert!(items > 0 && items < 2000, "{items}");
        assert_eq!(one(&a_dsn, "SELECT count(*) FROM pg_tables WHERE tablename = 'audit_secrets'").await, "0");
        assert_eq!(g.show(a["id"].as_str().unwrap())["golden"], v1_id.as_str());
        let c = connect(&a_dsn).await.expect("connect a");
        c.batch_execute("CREATE TABLE a_marker(x int); INSERT INTO a_marker VALUES (42)")
            .await
            .expect("write in a");

        // Nothing original is left in the golden's files, nor the password anywhere.
        let v1_dir = versions_dir(&g).join(&v1_id);
        assert!(v1_dir.join("data").is_dir());
        let leaks = files_containing(
            &v1_dir,
            &["@realmail.test", "Realname1", "secret note", "+44 20 7946", "audit-payload", &password],
        );
        assert!(leaks.is_empty(), "original values in the golden: {leaks:?}");
        // The scan does find such values where they are (the source's own files).
        let source_data = src.log_path().parent().expect("source dir").join("data");
        assert!(!files_containing(&source_data, &["@realmail.test"]).is_empty());
        assert!(!g.log().contains(&password), "password in the gateway log");
        let leaks = files_containing(&g.data_dir, &[&password]);
        assert!(leaks.is_empty(), "password in the data dir: {leaks:?}");

        // v2: same source, no sampling; new tokens get it, A keeps v1.
        let (status, v2) = g.raw_call(
            "POST",
            "/v1/goldens",
            Some(json!({"from_dsn": source_dsn, "exclude_tables": ["audit_secrets"],
                        "mask": "[columns]\n\"customers.email\" = \"email\"\n"})),
        );
        assert_eq!(status, 201, "{v2}");
        let v2_id = v2["id"].as_str().unwrap().to_string();
        assert_eq!(v2["active"], false);
        // Issued before the switch: pinned to v1, whether they connect after it or never.
        let late = g.issue("golden-late", 600);
        let idle = g.issue("golden-idle", 600);
        assert_eq!(g.show(idle["id"].as_str().unwrap())["golden"], v1_id.as_str());
        let (code, out, err) = run_sandpit(&[&["golden", "use", &v2_id][..], &api[..]].concat(), &key);
        assert_eq!(code, 0, "{out}{err}");
        let b = g.issue("golden-b", 600);
        let b_dsn = b["dsn"].as_str().unwrap().to_string();
        assert_eq!(one(&b_dsn, "SELECT count(*) FROM orders").await, "1000");
        assert_eq!(one(&b_dsn, "SELECT count(*) FROM customers WHERE id BETWEEN 1 AND 200").await, "200");
        assert_eq!(g.show(b["id"].as_str().unwrap())["golden"], v2_id.as_str());
        assert_eq!(one(&a_dsn, "SELECT x FROM a_marker").await, "42");
        assert_eq!(one(&a_dsn, "SELECT count(*) FROM orders").await, n.to_string());
        let late_dsn = late["dsn"].as_str().unwrap().to_string();
        assert_eq!(one(&late_dsn, "SELECT count(*) FROM orders").await, n.to_string());
        assert_eq!(g.show(late["id"].as_str().unwrap())["golden"], v1_id.as_str());

        let (code, out, _) = run_sandpit(&[&["golden", "list", "--json"][..], &api[..]].concat(), &key);
        assert_eq!(code, 0);
        let list: Vec<Value> = serde_json::from_str(&out).expect("list json");
        let find = |id: &str| list.iter().find(|v| v["id"] == id).cloned().expect(id);
        assert_eq!(find(&v1_id)["active"], false);
        assert_eq!(find(&v1_id)["forks"], 2);
        assert_eq!(find(&v2_id)["active"], true);
        assert!(!out.contains(&password));

        // The old version goes with its last fork and its last pin (a revoke answers after
        // the collection it triggers).
        drop(c);
        for t in [&a, &late] {
            let (s, _) = g.revoke(t["id"].as_str().unwrap());
            assert_eq!(s, 200);
        }
        assert!(v1_dir.join("data").is_dir(), "v1 removed while a token pinned to it lives");
        let (s, _) = g.revoke(idle["id"].as_str().unwrap());
        assert_eq!(s, 200);
        assert!(
            harness::wait_until(Duration::from_secs(60), || !v1_dir.exists()),
            "v1 still on disk after its last fork ended"
        );
        assert!(versions_dir(&g).join(&v2_id).join("data").is_dir());
        assert_eq!(one(&b_dsn, "SELECT count(*) FROM orders").await, "1000");
        let (s, body) = g.raw_call("POST", &format!("/v1/goldens/{v1_id}/use"), None);
        assert_eq!(s, 404, "{body}");
        assert!(!g.log().contains(&password), "password in the gateway log");
    });
}

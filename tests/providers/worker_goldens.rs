//! Golden versions through workers (docs/workers.md): a front over two real workers builds a
//! version from a live source database on both under one id, lists it as ready on both, and
//! puts it in use on both; new tokens see the source's rows whichever worker they are placed
//! on, while a token forked before the switch keeps the old golden. A version only one worker
//! has (built through a front over that worker alone) is refused by `golden use`, naming the
//! worker that lacks it. The source's password is in no log.

use serde_json::{json, Value};

use super::worker::{client, dsn, id, tokens_on, Worker};
use super::worker_placement::front_over;
use crate::support::harness::{query_one, run_sandpit, sqlstate, tempdir, Gateway};
use crate::support::shared_pg::SharedPg;

const SOURCE_ROLE: &str = "catalog_owner";

/// The source database: one table, three rows.
async fn source() -> (SharedPg, String, String) {
    let src = SharedPg::start().await;
    let admin = src.admin("postgres").await;
    let password = format!("pw-{}", sandpit::auth::new_secret());
    for sql in [
        format!("CREATE ROLE {SOURCE_ROLE} LOGIN PASSWORD '{password}'"),
        format!("CREATE DATABASE catalog OWNER {SOURCE_ROLE}"),
    ] {
        admin.batch_execute(&sql).await.expect("source role");
    }
    src.admin("catalog")
        .await
        .batch_execute(&format!(
            "SET ROLE {SOURCE_ROLE}; CREATE TABLE wares(id int PRIMARY KEY, name text);
             INSERT INTO wares VALUES (1, 'anvil'), (2, 'bucket'), (3, 'crate');"
        ))
        .await
        .expect("source data");
    let dsn = format!(
        "postgresql://{SOURCE_ROLE}:{password}@127.0.0.1:{}/catalog?sslmode=verify-full&sslrootcert={}",
        src.port,
        src.ca_file.display()
    );
    (src, dsn, password)
}

/// `sandpit golden <args> --json` against a front.
fn golden_cli(front: &Gateway, args: &[&str]) -> (i32, String, String) {
    let all = [
        &["golden"][..],
        args,
        &["--json", "--api", front.api.as_str()][..],
    ]
    .concat();
    run_sandpit(&all, &[("SANDPIT_ADMIN_KEY", front.admin_key.as_str())])
}

/// The workers (by position) a listed version is ready on.
fn ready_on(listing: &Value, version: &str) -> Vec<u64> {
    listing
        .as_array()
        .expect("listing")
        .iter()
        .find(|g| g["id"] == version)
        .map(|g| {
            g["workers"]
                .as_array()
                .expect("workers")
                .iter()
                .filter_map(|w| w["worker"].as_u64())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn golden_versions_through_workers() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let (_src, source_dsn, password) = rt.block_on(source());
    let tmp = tempdir();
    let w0 = Worker::start_with(&tmp.path().join("w0"), "127.0.0.1:0", "");
    let w1 = Worker::start_with(&tmp.path().join("w1"), "127.0.0.1:0", "");
    let ca = tmp.path().join("workers-ca.pem");
    let mut bundle = std::fs::read(w0.dir.join("tls/cert.pem")).expect("w0 cert");
    bundle.extend(std::fs::read(w1.dir.join("tls/cert.pem")).expect("w1 cert"));
    std::fs::write(&ca, bundle).expect("bundle");
    let http = client(&ca);
    let front = front_over(&[&w0, &w1], &ca);
    let items = |t: &Value| {
        rt.block_on(query_one(
            &dsn(t),
            "select string_agg(name, ',' order by id) from wares",
        ))
    };

    // A token forked before the switch: the configured golden, without the table.
    let old = front.issue("before-switch", 600);
    let e = items(&old).expect_err("the SQL golden has no wares table");
    assert_eq!(sqlstate(&e), "42P01", "{e:?}");

    // Built on both workers under one id.
    let (status, built) = front.raw_call(
        "POST",
        "/v1/goldens",
        Some(json!({ "from_dsn": source_dsn })),
    );
    assert_eq!(status, 201, "{built}\n{}", front.log_problems());
    let version = built["id"].as_str().expect("id").to_string();
    assert_eq!(ready_on(&json!([built]), &version), vec![0, 1], "{built}");
    assert_eq!(built["active"], false);
    let (code, out, err) = golden_cli(&front, &["list"]);
    assert_eq!(code, 0, "{err}");
    let listing: Value = serde_json::from_str(&out).expect("list json");
    assert_eq!(ready_on(&listing, &version), vec![0, 1], "{listing}");

    // In use on both: new tokens see the source's rows, on either worker.
    let (code, _, err) = golden_cli(&front, &["use", &version]);
    assert_eq!(code, 0, "{err}");
    let mut new_tokens = Vec::new();
    while new_tokens.len() < 8
        && !(new_tokens
            .iter()
            .any(|t: &String| tokens_on(&http, &w0).contains(t))
            && new_tokens
                .iter()
                .any(|t: &String| tokens_on(&http, &w1).contains(t)))
    {
        let t = front.issue("after-switch", 600);
        let rows = items(&t).unwrap_or_else(|e| panic!("{e:?}\n{}", front.log_problems()));
        assert_eq!(rows.as_deref(), Some("anvil,bucket,crate"));
        assert_eq!(front.show(&id(&t))["golden"], version.as_str());
        new_tokens.push(id(&t));
    }
    for (n, w) in [&w0, &w1].iter().enumerate() {
        assert!(
            new_tokens.iter().any(|t| tokens_on(&http, w).contains(t)),
            "no new token was placed on worker {n}: {new_tokens:?}"
        );
    }
    // The token forked before keeps its golden.
    let e = items(&old).expect_err("the old token keeps the SQL golden");
    assert_eq!(sqlstate(&e), "42P01", "{e:?}");
    let (_, listing) = front.raw_call("GET", "/v1/goldens", None);
    let active: Vec<&Value> = listing
        .as_array()
        .expect("listing")
        .iter()
        .filter(|g| g["active"] == true)
        .collect();
    assert_eq!(active.len(), 1, "{listing}");
    assert_eq!(active[0]["id"], version.as_str());

    // A version on worker 0 only (built through a front over it alone): use is refused.
    let lone = front_over(&[&w0], &ca);
    let (status, only0) = lone.raw_call(
        "POST",
        "/v1/goldens",
        Some(json!({ "from_dsn": source_dsn })),
    );
    assert_eq!(status, 201, "{only0}\n{}", lone.log_problems());
    let partial = only0["id"].as_str().expect("id").to_string();
    let (_, listing) = front.raw_call("GET", "/v1/goldens", None);
    assert_eq!(ready_on(&listing, &partial), vec![0], "{listing}");
    let (status, body) = front.raw_call("POST", &format!("/v1/goldens/{partial}/use"), None);
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("worker 1") && e.contains("has no golden")),
        "{body}"
    );
    let (code, _, err) = golden_cli(&front, &["use", &partial]);
    assert_ne!(code, 0);
    assert!(err.contains("worker 1"), "{err}");
    // Nothing switched: new tokens still get the version in use.
    let t = front.issue("after-refusal", 600);
    assert_eq!(
        items(&t).expect("rows").as_deref(),
        Some("anvil,bucket,crate")
    );

    // The source's password is in no log.
    for (what, log) in [
        ("front", front.log()),
        ("lone front", lone.log()),
        ("worker 0", w0.log()),
        ("worker 1", w1.log()),
    ] {
        assert!(
            !log.contains(&password),
            "the source password is in the {what} log"
        );
    }
}

//! Runs the corpus (`corpus.rs`): one real source server, one gateway whose golden (built
//! from the source, `customers.email` masked) every session forks through a real token. Each
//! session's token is ended (reviewed, its change captured); a session that must be refused
//! has approval refused with its reason and its promotion refused, onto a target that stays
//! untouched; one that must promote is approved and promoted onto its own copy of the source
//! while another connection keeps writing to an unrelated table there, then compared with a
//! copy where the session's SQL ran directly: schema dump (with comments and grants) and
//! content hashes of every table and sequence but the unrelated ones. Every session is run
//! and reported before the test fails on any.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::corpus::{Expect, Session, SESSIONS, SOURCE_SQL};
use super::{exec, record, shared_pg, OWNER};
use crate::support::harness::{connect, Gateway};

/// Schema dump of `db` with comments, privileges and owners.
fn full_dump(src: &shared_pg::SharedPg, db: &str) -> String {
    let bin = sandpit::pg::find_binaries(None).expect("binaries");
    let out = std::process::Command::new(bin.initdb.with_file_name("pg_dump"))
        .args(["--schema-only", "-U", shared_pg::ADMIN, "-d", db, "-h"])
        .arg(&src.socket_dir)
        .args(["-p", &src.port.to_string()])
        .output()
        .expect("pg_dump");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with("\\restrict") && !l.starts_with("\\unrestrict"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Content hash of every table and sequence position, the concurrently written ones aside.
async fn hashes(c: &tokio_postgres::Client) -> Vec<(String, String)> {
    let tables = c
        .query(
            "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) FROM pg_tables \
             WHERE schemaname NOT IN ('pg_catalog', 'information_schema') \
             AND tablename <> 'page_views' ORDER BY 1",
            &[],
        )
        .await
        .expect("tables");
    let mut out = Vec::new();
    for t in tables {
        let name: String = t.get(0);
        let sql = format!(
            "SELECT count(*)::text || ':' || coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM {name} t"
        );
        let row = c.query_one(&sql, &[]).await.expect("hash");
        out.push((name, row.get(0)));
    }
    let seqs = c
        .query(
            "SELECT schemaname || '.' || sequencename, last_value::text FROM pg_sequences \
             WHERE sequencename <> 'page_views_id_seq' ORDER BY 1",
            &[],
        )
        .await
        .expect("sequences");
    for s in seqs {
        out.push((s.get(0), s.get::<_, Option<String>>(1).unwrap_or_default()));
    }
    out
}

/// Keeps writing to `page_views` of `db` (inserts and updates) on a thread of its own until
/// stopped; counts the writes.
struct Writer {
    stop: Arc<AtomicBool>,
    writes: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(src: &shared_pg::SharedPg, db: &str) -> Writer {
        let (stop, writes) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (socket, port, db) = (src.socket_dir.clone(), src.port, db.to_string());
        let (s, w) = (stop.clone(), writes.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            rt.block_on(async move {
                let (c, conn) = tokio_postgres::Config::new()
                    .host_path(&socket)
                    .port(port)
                    .user(shared_pg::ADMIN)
                    .dbname(&db)
                    .connect(tokio_postgres::NoTls)
                    .await
                    .expect("writer connect");
                tokio::spawn(conn);
                while !s.load(Ordering::SeqCst) {
                    c.batch_execute(
                        "INSERT INTO page_views(path) VALUES ('/shop'); \
                         UPDATE page_views SET hits = hits + 1 WHERE id = 1",
                    )
                    .await
                    .expect("concurrent write");
                    w.fetch_add(1, Ordering::SeqCst);
                }
            });
        });
        let w = Writer {
            stop,
            writes,
            thread: Some(thread),
        };
        let t0 = Instant::now();
        while w.count() == 0 && t0.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(5));
        }
        w
    }

    fn count(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("writer thread");
        }
        self.count()
    }
}

struct Env<'a> {
    src: &'a shared_pg::SharedPg,
    admin: tokio_postgres::Client,
    g: &'a Gateway,
    tcp: String,
}

/// Runs `s`; Ok(what happened) when it went as the corpus says, Err(why not) otherwise.
async fn run_one(env: &Env<'_>, i: usize, s: &Session) -> Result<String, String> {
    let g = env.g;
    let t = g.issue(s.name, 600);
    let id = t["id"].as_str().ok_or(format!("issue: {t}"))?.to_string();
    let c = connect(t["dsn"].as_str().unwrap_or_default())
        .await
        .map_err(|e| e.to_string())?;
    c.batch_execute(s.sql)
        .await
        .map_err(|e| format!("the session's SQL: {e:?}"))?;
    drop(c);
    let (st, v) = g.revoke(&id);
    if st != 200 {
        return Err(format!("revoke: {st} {v}"));
    }
    let r = record(g, &id);
    let why = r["capture"]["refusals"].to_string();
    let approve = |comment: &str| {
        g.raw_call(
            "POST",
            &format!("/v1/tokens/{id}/approve"),
            Some(json!({ "comment": comment })),
        )
    };
    match s.expect {
        Expect::Refused(needle) => {
            if !why.contains(needle) {
                return Err(format!("refusals lack {needle:?}: {why}"));
            }
            let (st, v) = approve("looks fine");
            if st != 409 || !v.to_string().contains(needle) {
                return Err(format!(
                    "approval was not refused with the reason: {st} {v}"
                ));
            }
            let dsn = env.tcp.replace("/shop?", "/shop_refused?");
            let (_, rep) = g.raw_call(
                "POST",
                &format!("/v1/tokens/{id}/promote"),
                Some(json!({ "dsn": dsn })),
            );
            if rep.to_string().contains("\"applied\"") {
                return Err(format!("a refused change was promoted: {rep}"));
            }
            Ok(format!("refused: {}", first_reason(&r, needle)))
        }
        Expect::Promoted => {
            if why != "null" {
                return Err(format!("refused: {why}"));
            }
            let (st, v) = approve("ok");
            if st != 200 {
                return Err(format!("approve: {st} {v}"));
            }
            let conflicted = match s.conflict {
                Some(edit) => format!("; {}", conflicting(env, i, &id, edit).await?),
                None => String::new(),
            };
            let (target, expected) = (format!("shop_t{i}"), format!("shop_e{i}"));
            for db in [&target, &expected] {
                exec(
                    &env.admin,
                    &format!("CREATE DATABASE {db} TEMPLATE shop OWNER {OWNER}"),
                )
                .await;
            }
            let e = env.src.admin(&expected).await;
            e.batch_execute(&format!("SET ROLE {OWNER}; {}", s.sql))
                .await
                .map_err(|e| format!("expected copy: {e:?}"))?;
            let writer = Writer::start(env.src, &target);
            let before = writer.count();
            let dsn = env.tcp.replace("/shop?", &format!("/{target}?"));
            let (st, rep) = g.raw_call(
                "POST",
                &format!("/v1/tokens/{id}/promote"),
                Some(json!({ "dsn": dsn })),
            );
            let during = writer.count() - before;
            writer.finish();
            if rep["outcome"] != "applied" {
                return Err(format!("promote: {st} {rep}"));
            }
            if during == 0 {
                return Err("no concurrent write landed during the promotion".into());
            }
            let tc = env.src.admin(&target).await;
            if full_dump(env.src, &target) != full_dump(env.src, &expected) {
                return Err(diff_lines(
                    &full_dump(env.src, &target),
                    &full_dump(env.src, &expected),
                ));
            }
            let (ht, he) = (hashes(&tc).await, hashes(&e).await);
            if ht != he {
                return Err(format!("content differs: target {ht:?}\nexpected {he:?}"));
            }
            drop((tc, e));
            for db in [&target, &expected] {
                exec(&env.admin, &format!("DROP DATABASE {db} WITH (FORCE)")).await;
            }
            let c = &rep["counts"];
            Ok(format!(
                "promoted exactly ({} schema, {} ins, {} upd, {} del; {during} concurrent writes during it){conflicted}",
                c["schema"], c["inserted"], c["updated"], c["deleted"]
            ))
        }
    }
}

/// Promotes token `id` onto a copy of the source where `edit` ran first: the promotion
/// must apply nothing (conflicts listed, or failed and rolled back).
async fn conflicting(env: &Env<'_>, i: usize, id: &str, edit: &str) -> Result<String, String> {
    let db = format!("shop_c{i}");
    exec(
        &env.admin,
        &format!("CREATE DATABASE {db} TEMPLATE shop OWNER {OWNER}"),
    )
    .await;
    let c = env.src.admin(&db).await;
    exec(&c, &format!("SET ROLE {OWNER}; {edit}")).await;
    let before = (full_dump(env.src, &db), hashes(&c).await);
    let dsn = env.tcp.replace("/shop?", &format!("/{db}?"));
    let (st, rep) = env.g.raw_call(
        "POST",
        &format!("/v1/tokens/{id}/promote"),
        Some(json!({ "dsn": dsn })),
    );
    let after = (full_dump(env.src, &db), hashes(&c).await);
    drop(c);
    exec(&env.admin, &format!("DROP DATABASE {db} WITH (FORCE)")).await;
    let outcome = rep["outcome"].as_str().unwrap_or_default().to_string();
    if !matches!(outcome.as_str(), "conflicts" | "failed") || before != after {
        return Err(format!("after a conflicting edit: {st} {rep}"));
    }
    let first = match outcome.as_str() {
        "conflicts" => rep["conflicts"][0].as_str().unwrap_or_default().to_string(),
        _ => rep["error"].as_str().unwrap_or_default().to_string(),
    };
    Ok(format!(
        "onto a conflicting copy: {outcome}, nothing applied ({first})"
    ))
}

fn first_reason(r: &Value, needle: &str) -> String {
    r["capture"]["refusals"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .find(|s| s.contains(needle))
        })
        .unwrap_or_default()
        .chars()
        .take(160)
        .collect()
}

fn diff_lines(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let only_a: Vec<&&str> = la.iter().filter(|l| !lb.contains(l)).collect();
    let only_b: Vec<&&str> = lb.iter().filter(|l| !la.contains(l)).collect();
    format!("dumps differ: only in the target {only_a:#?}\nonly in the expected copy {only_b:#?}")
}

#[test]
fn corpus_sessions_are_promoted_exactly_or_refused_before_approval() {
    assert!(SESSIONS.len() >= 20);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let started = Instant::now();
        let src = shared_pg::SharedPg::start().await;
        let admin = src.admin("postgres").await;
        let password = format!("pw-{}", sandpit::auth::new_secret());
        exec(
            &admin,
            &format!("CREATE ROLE {OWNER} LOGIN PASSWORD '{password}'"),
        )
        .await;
        exec(&admin, &format!("CREATE DATABASE shop OWNER {OWNER}")).await;
        let shop = src.admin("shop").await;
        exec(&shop, &format!("SET ROLE {OWNER}; {SOURCE_SQL}")).await;
        drop(shop);
        exec(
            &admin,
            &format!("CREATE DATABASE shop_refused TEMPLATE shop OWNER {OWNER}"),
        )
        .await;
        let tcp = format!(
            "postgresql://{OWNER}:{password}@127.0.0.1:{}/shop?sslmode=verify-full&sslrootcert={}",
            src.port,
            src.ca_file.display()
        );
        let config = format!("[pool]\nsize = 0\n\n[promote]\nsource_role = \"{OWNER}\"\n");
        let g = Gateway::start_with(
            Some(crate::support::harness::SMALL_GOLDEN),
            Some(&config),
            &[],
            &[],
        );
        let (s, v) = g.raw_call(
            "POST",
            "/v1/goldens",
            Some(json!({"from_dsn": tcp, "activate": true,
                        "mask": "[columns]\n\"customers.email\" = \"email\"\n"})),
        );
        assert_eq!(s, 201, "{v}");
        let refused_db = src.admin("shop_refused").await;
        let refused_before = (full_dump(&src, "shop_refused"), hashes(&refused_db).await);
        let env = Env {
            src: &src,
            admin,
            g: &g,
            tcp,
        };
        let setup = started.elapsed();
        let mut failures = Vec::new();
        for (i, s) in SESSIONS.iter().enumerate() {
            let t0 = Instant::now();
            let r = run_one(&env, i, s).await;
            let secs = t0.elapsed().as_secs_f64();
            match &r {
                Ok(what) => eprintln!("corpus {:<28} {secs:5.1}s  {what}", s.name),
                Err(why) => {
                    eprintln!("corpus {:<28} {secs:5.1}s  FAILED: {why}", s.name);
                    failures.push(s.name);
                }
            }
        }
        let untouched =
            (full_dump(&src, "shop_refused"), hashes(&refused_db).await) == refused_before;
        eprintln!(
            "corpus: {} sessions in {:.1}s (set-up {:.1}s); {} failed",
            SESSIONS.len(),
            started.elapsed().as_secs_f64(),
            setup.as_secs_f64(),
            failures.len()
        );
        assert!(untouched, "a refused session changed its target");
        assert!(
            failures.is_empty(),
            "sessions not as the corpus says: {failures:?}"
        );
    });
}

/// With the patch check off, what the review does not model cannot be ruled out: even a
/// plain row update is refused before approval, with that reason.
#[test]
fn a_change_whose_patch_check_was_not_made_is_not_promotable() {
    let config = "[pool]\nsize = 0\n\n[review]\nverify_on_end = false\n";
    let g = Gateway::start(Some(crate::support::harness::SMALL_GOLDEN), Some(config));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let t = g.issue("promote-unverified", 600);
    let id = t["id"].as_str().expect("id").to_string();
    rt.block_on(async {
        let c = connect(t["dsn"].as_str().expect("dsn"))
            .await
            .expect("connect");
        exec(&c, "UPDATE items SET name = 'renamed' WHERE id = 1").await;
    });
    assert_eq!(g.revoke(&id).0, 200);
    let r = record(&g, &id);
    let why = r["capture"]["refusals"].to_string();
    assert!(
        why.contains("patch not verified") && why.contains("is unknown; not promoted"),
        "{r}"
    );
    let (s, v) = g.raw_call(
        "POST",
        &format!("/v1/tokens/{id}/approve"),
        Some(json!({"comment": "ok"})),
    );
    assert_eq!(s, 409, "{v}");
    assert!(v.to_string().contains("does not model"), "{v}");
}

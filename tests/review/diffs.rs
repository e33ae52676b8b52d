//! Review diff end to end: the real gateway and real Postgres forks; scripted agent sessions
//! with psql; the diff read from the HTTP API; the SQL patch applied (by the test, as a
//! person would) to a second fork of the golden, whose diff must then be the same.

use crate::support::harness;

use std::path::Path;
use std::sync::OnceLock;

use crate::support::harness::{psql, Gateway};
use sandpit::pgconn::BackendTarget;
use sandpit::review::model::Action;
use serde_json::{json, Value};

/// Small golden: a primary key with a serial, a composite key, a table without any key, an
/// identity column with a foreign key, a plain sequence, a view, and a trigger whose function
/// calls another by its unqualified name (so a patch must not narrow the search path).
const GOLDEN: &str = r#"
create table items(id serial primary key, name text not null, price numeric(10,2), tags text[]);
insert into items(name, price, tags)
  select 'item ' || g, g * 1.5, array['t' || g, 'x'] from generate_series(1, 50) g;
create table order_lines(order_id int, line_no int, qty int not null, note text,
  primary key (order_id, line_no));
insert into order_lines select o, l, o + l, null from generate_series(1, 10) o, generate_series(1, 3) l;
create table events(kind text, payload jsonb, at timestamptz);
insert into events select 'k' || (g % 3), jsonb_build_object('n', g),
  timestamptz '2024-01-01 00:00:00+00' + g * interval '1 hour' from generate_series(1, 20) g;
insert into events select 'dup', '{}', timestamptz '2024-01-01 00:00:00+00' from generate_series(1, 3);
create table audit(id bigint generated always as identity primary key,
  item_id int references items(id), msg text);
insert into audit(item_id, msg) values (1, 'created'), (2, 'it''s "quoted"');
create sequence ticket_seq;
create function default_note() returns text language sql as 'select ''touched''::text';
create function order_lines_touch() returns trigger language plpgsql as
  $$ begin new.note := coalesce(new.note, default_note()); return new; end $$;
create trigger order_lines_touch before update on order_lines
  for each row execute function order_lines_touch();
create view cheap_items as select id, name from items where price < 10;
"#;

/// The gateway of this test binary, on the small golden. Started from a thread that lives as
/// long as the process, so the gateway's PDEATHSIG fires only when the process ends.
pub(super) fn gateway() -> &'static Gateway {
    static G: OnceLock<&'static Gateway> = OnceLock::new();
    G.get_or_init(|| {
        harness::process_gateway(|| {
            let dir = harness::reused_dir(
                "review-gateway",
                &["tokens", "pg/instances", "reviews", "logs", "gateway.log"],
            );
            Gateway::start_in(&dir, Some(GOLDEN), None)
        })
    })
}

pub(super) fn get_text(g: &Gateway, path: &str) -> (u16, String) {
    let url = format!("{}{}", g.api, path);
    match harness::http("GET", &url, Some(&g.admin_key), harness::Body::None) {
        Ok(r) => (r.status, r.body),
        Err(e) => panic!("api call failed: {e}"),
    }
}

pub(super) fn diff(g: &Gateway, id: &str) -> Value {
    let (s, body) = get_text(g, &format!("/v1/tokens/{id}/diff"));
    assert_eq!(s, 200, "{body}");
    serde_json::from_str(&body).expect("review json")
}

pub(super) fn run_sql(dsn: &str, sql: &str) {
    let dir = harness::tempdir();
    let f = dir.path().join("script.sql");
    std::fs::write(&f, sql).expect("write script");
    let (ok, out, err) = psql(dsn, &["-f", f.to_str().expect("path")]);
    assert!(ok, "script failed: {err}\n{out}\n--- script:\n{sql}");
}

/// The parts of a review that describe the database (not when or how it was taken).
fn normalize(r: &Value) -> Value {
    let patch: Vec<&str> = r["patch"]
        .as_str()
        .unwrap_or("")
        .lines()
        .filter(|l| !l.starts_with("-- sandpit review patch"))
        .collect();
    json!({
        "schema": r["schema"],
        "sequences": r["sequences"],
        "data": r["data"],
        "notes": r["notes"],
        "patch": patch.join("\n"),
    })
}

pub(super) fn schema_of(r: &Value) -> Vec<(String, String, String)> {
    r["schema"]
        .as_array()
        .expect("schema")
        .iter()
        .map(|c| {
            (
                c["kind"].as_str().unwrap_or("").to_string(),
                c["action"].as_str().unwrap_or("").to_string(),
                c["object"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn data_of(r: &Value) -> Vec<(String, u64, u64, u64)> {
    r["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|t| {
            assert!(t.get("error").is_none(), "table error: {t}");
            (
                t["table"].as_str().unwrap_or("").to_string(),
                t["inserted"].as_u64().unwrap_or(0),
                t["updated"].as_u64().unwrap_or(0),
                t["deleted"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn seqs_of(r: &Value) -> Vec<(String, String, bool)> {
    r["sequences"]
        .as_array()
        .expect("sequences")
        .iter()
        .map(|s| {
            (
                s["sequence"].as_str().unwrap_or("").to_string(),
                s["after"]["last_value"].as_str().unwrap_or("").to_string(),
                s["after"]["is_called"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

fn s3(a: &str, b: &str, c: &str) -> (String, String, String) {
    (a.into(), b.into(), c.into())
}

/// How the test process reaches a token's scratch database: the same unix socket the
/// gateway uses, as the agent role (peer auth maps this OS user, as it does the gateway's).
fn target(g: &Gateway, id: &str) -> BackendTarget {
    let inst = std::fs::canonicalize(g.instances_dir().join(id)).expect("instance dir");
    BackendTarget {
        endpoint: sandpit::pgconn::Endpoint::unix(sandpit::pg::process::socket_path(
            &sandpit::provider::golden::socket_dir_for(&inst),
        )),
        user: "agent".into(),
        database: "sandpit".into(),
        password: None,
        gate: None,
    }
}

fn sq(a: &str, b: &str, called: bool) -> (String, String, bool) {
    (a.into(), b.into(), called)
}

fn d4(t: &str, i: u64, u: u64, d: u64) -> (String, u64, u64, u64) {
    (t.into(), i, u, d)
}

/// Runs `script` as the agent, checks the diff, applies the patch to a second fork and
/// checks that its diff is the same; revokes both and checks the stored review.
fn scenario(
    task: &str,
    script: &str,
    schema: Vec<(String, String, String)>,
    data: Vec<(String, u64, u64, u64)>,
    seqs: Vec<(String, String, bool)>,
) -> Value {
    let g = gateway();
    let t1 = g.issue(task, 600);
    let id1 = t1["id"].as_str().expect("id").to_string();
    run_sql(t1["dsn"].as_str().expect("dsn"), script);
    let r1 = diff(g, &id1);
    assert_eq!(schema_of(&r1), schema, "schema diff of {task}: {r1:#}");
    assert_eq!(data_of(&r1), data, "data diff of {task}: {r1:#}");
    assert_eq!(seqs_of(&r1), seqs, "sequence diff of {task}: {r1:#}");
    assert_eq!(r1["scan"]["mode"], "touched", "{task}: {}", r1["scan"]);

    let (s, patch) = get_text(g, &format!("/v1/tokens/{id1}/diff?format=sql"));
    assert_eq!(s, 200);
    let body = |p: &str| p.lines().skip(1).collect::<Vec<_>>().join("\n");
    assert_eq!(body(&patch), body(r1["patch"].as_str().unwrap_or("")));
    let t2 = g.issue(&format!("{task}-patched"), 600);
    let id2 = t2["id"].as_str().expect("id").to_string();
    run_sql(t2["dsn"].as_str().expect("dsn"), &patch);
    let r2 = diff(g, &id2);
    assert_eq!(
        normalize(&r2),
        normalize(&r1),
        "{task}: the patched fork differs from the scratch database\npatch:\n{patch}"
    );

    // Diffing the scratch database against the patched fork directly (every table read, as
    // their counters may well be equal) must find nothing. Objects the patch created have
    // OIDs of their own there, so an added/dropped pair with the same name and definition is
    // the same object; new tables would add their rows too, so those scenarios skip this.
    if !schema.iter().any(|(k, a, _)| k == "table" && a == "added") {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let opts = sandpit::review::diff::DiffOptions {
            full_scan: true,
            ..Default::default()
        };
        let direct = rt
            .block_on(sandpit::review::diff::diff(
                &target(g, &id2),
                &target(g, &id1),
                opts,
                &id1,
                task,
            ))
            .expect("direct diff");
        let mut left = direct.schema.clone();
        let mut paired = Vec::new();
        while let Some(i) = left.iter().position(|a| {
            a.action == Action::Added
                && left.iter().any(|d| {
                    d.action == Action::Dropped
                        && d.kind == a.kind
                        && d.object == a.object
                        // A sequence's before/after say what owns or makes it, not its
                        // definition (its parameters are the detail).
                        && (d.before == a.after || (a.kind == "sequence" && d.detail.is_empty()))
                })
        }) {
            let a = left.remove(i);
            let j = left
                .iter()
                .position(|d| {
                    d.action == Action::Dropped && d.object == a.object && d.kind == a.kind
                })
                .expect("pair");
            left.remove(j);
            paired.push(a.object);
        }
        // A sequence created on both sides (its position checked by the reviews above).
        let moved: Vec<_> = direct
            .sequences
            .iter()
            .filter(|s| !(s.before.is_none() && paired.contains(&s.sequence)))
            .collect();
        assert!(
            left.is_empty() && direct.data.is_empty() && moved.is_empty(),
            "{task}: scratch vs patched fork is not empty: {left:#?} {:#?} {:#?}",
            direct.data,
            direct.sequences
        );
    }

    // After revoke the backend is gone and the stored review is served.
    let (s, _) = g.revoke(&id1);
    assert_eq!(s, 200);
    assert!(!g.instances_dir().join(&id1).exists());
    let stored = diff(g, &id1);
    assert_eq!(
        normalize(&stored),
        normalize(&r1),
        "{task}: stored review differs"
    );
    for ext in ["json", "txt", "sql", "html"] {
        let p = g
            .data_dir
            .join("reviews")
            .join(task)
            .join(format!("{id1}.{ext}"));
        assert!(p.is_file(), "{} missing", p.display());
    }
    g.revoke(&id2);
    r1
}

#[test]
fn insert_update_delete_on_primary_key_tables_in_fk_order() {
    let r = scenario(
        "pk",
        "insert into items(name, price) values ('new thing', 9.99);\n\
         update items set price = 2, name = 'renamed' where id = 3;\n\
         delete from audit where item_id = 1;\n\
         delete from items where id = 1;\n",
        vec![],
        vec![d4("public.items", 1, 1, 1), d4("public.audit", 0, 0, 1)],
        vec![sq("public.items_id_seq", "51", true)],
    );
    let items = &r["data"][0];
    assert_eq!(items["matched_by"], "primary key");
    let upd = &items["samples"]["updated"][0];
    assert_eq!(upd["changed"], json!(["name", "price"]));
    assert_eq!(upd["after"][1], "renamed");
    assert_eq!(items["samples"]["inserted"][0][1], "new thing");
    let patch = r["patch"].as_str().unwrap_or("");
    let audit_del = patch
        .find("DELETE FROM public.audit")
        .expect("audit delete");
    let items_del = patch
        .find("DELETE FROM public.items")
        .expect("items delete");
    assert!(
        audit_del < items_del,
        "child rows must be deleted first:\n{patch}"
    );
}

#[test]
fn composite_key_changes() {
    let r = scenario(
        "composite",
        "update order_lines set qty = 0, note = 'it''s zero' where order_id = 2 and line_no = 3;\n\
         delete from order_lines where order_id = 10;\n\
         insert into order_lines values (11, 1, 5, null), (11, 2, 6, E'tab\\there');\n",
        vec![],
        vec![d4("public.order_lines", 2, 1, 3)],
        vec![],
    );
    assert_eq!(r["data"][0]["key"], json!(["order_id", "line_no"]));
}

#[test]
fn table_without_key_is_compared_as_multiset() {
    let r = scenario(
        "multiset",
        "delete from events where ctid = (select ctid from events where kind = 'dup' limit 1);\n\
         insert into events values ('new', '{\"a\": [1, 2]}', '2025-06-01 12:00:00+02');\n\
         update events set kind = 'k9' where payload->>'n' = '5';\n",
        vec![],
        vec![d4("public.events", 2, 0, 2)],
        vec![],
    );
    assert_eq!(r["data"][0]["matched_by"], "none (compared as multisets)");
}

#[test]
fn dropped_column() {
    scenario(
        "dropcol",
        "alter table items drop column tags;\n",
        vec![s3("column", "dropped", "public.items.tags")],
        vec![],
        vec![],
    );
}

#[test]
fn added_index() {
    let r = scenario(
        "index",
        "create index items_name_idx on items (lower(name));\n",
        vec![s3("index", "added", "public.items_name_idx")],
        vec![],
        vec![],
    );
    assert!(r["schema"][0]["detail"]
        .as_str()
        .unwrap_or("")
        .contains("lower(name)"));
}

#[test]
fn new_function() {
    scenario(
        "function",
        "create function add_one(i int) returns int language sql immutable as 'select i + 1';\n",
        vec![s3("function", "added", "public.add_one(i integer)")],
        vec![],
        vec![],
    );
}

#[test]
fn renamed_table() {
    scenario(
        "rename",
        "alter table order_lines rename to lines;\n",
        vec![s3("table", "renamed", "public.lines")],
        vec![],
        vec![],
    );
}

#[test]
fn truncated_table() {
    let r = scenario(
        "truncate",
        "truncate events;\n",
        vec![],
        vec![d4("public.events", 0, 0, 23)],
        vec![],
    );
    assert!(r["patch"]
        .as_str()
        .unwrap_or("")
        .contains("DELETE FROM public.events;"));
}

#[test]
fn rolled_back_changes_do_not_appear() {
    let r = scenario(
        "rollback",
        "begin;\n\
         update items set name = 'gone' where id < 10;\n\
         delete from order_lines;\n\
         insert into events values ('x', null, null);\n\
         alter table items add column extra int;\n\
         rollback;\n",
        vec![],
        vec![],
        vec![],
    );
    // The counters saw the rolled-back work, so the tables were scanned, and found equal.
    assert!(
        r["scan"]["tables_scanned"].as_u64().unwrap_or(0) >= 3,
        "{}",
        r["scan"]
    );
}

#[test]
fn sequence_advanced() {
    scenario(
        "sequence",
        "select nextval('ticket_seq'); select nextval('ticket_seq'); select nextval('ticket_seq');\n",
        vec![],
        vec![],
        vec![sq("public.ticket_seq", "3", true)],
    );
}

#[test]
fn untouched_fork_has_empty_diff_and_never_connected_token_forks_nothing() {
    let g = gateway();
    let t = g.issue("empty", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let r = diff(g, &id);
    assert_eq!(r["scan"]["mode"], "none");
    assert!(
        !g.instances_dir().join(&id).exists(),
        "a review must not fork"
    );
    let (ok, _, err) = psql(
        t["dsn"].as_str().expect("dsn"),
        &["-c", "select count(*) from items"],
    );
    assert!(ok, "{err}");
    let r = diff(g, &id);
    assert_eq!(data_of(&r), vec![]);
    assert_eq!(schema_of(&r), vec![]);
    assert_eq!(r["scan"]["tables_scanned"], 0, "{}", r["scan"]);
    let (s, body) = get_text(g, &format!("/v1/tokens/{id}/diff?format=text"));
    assert_eq!(s, 200);
    assert!(body.contains("no changes against the golden"), "{body}");
    let (s, _) = get_text(g, &format!("/v1/tokens/{id}/diff?format=yaml"));
    assert_eq!(s, 400);
    let url = format!("{}/v1/tokens/{id}/diff", g.api);
    let res = harness::http("GET", &url, None, harness::Body::None);
    assert!(matches!(res, Ok(ref r) if r.status == 401));
    g.revoke(&id);
}

/// Writes a statement log in the format of `sandpit::journal::log` for a token.
fn write_log(data_dir: &Path, task: &str, token: &str) {
    let dir = data_dir.join("logs").join(task);
    std::fs::create_dir_all(&dir).expect("log dir");
    let lines = [
        json!({"type":"statement","seq":1,"ts":"2026-01-01T00:00:00Z","token":token,"task":task,"session":1,"protocol":"simple","text":"select count(*) from items","kind":"read"}),
        json!({"type":"outcome","seq":1,"ts":"2026-01-01T00:00:00Z","rows":1,"capped":false,"duration_ms":0.4,"sqlstate":null,"tag":"SELECT 1"}),
        json!({"type":"statement","seq":2,"ts":"2026-01-01T00:00:01Z","token":token,"task":task,"session":1,"protocol":"simple","text":"update items set name = '<b>x</b>' where id = 4","kind":"write"}),
        json!({"type":"outcome","seq":2,"ts":"2026-01-01T00:00:01Z","rows":1,"capped":false,"duration_ms":0.9,"sqlstate":null,"tag":"UPDATE 1"}),
        json!({"type":"statement","seq":3,"ts":"2026-01-01T00:00:02Z","token":token,"task":task,"session":1,"protocol":"simple","text":"insert into items(id, name) values (2, 'dup')","kind":"write"}),
        json!({"type":"outcome","seq":3,"ts":"2026-01-01T00:00:02Z","rows":null,"capped":false,"duration_ms":0.3,"sqlstate":"23505","tag":null}),
        json!({"type":"statement","seq":4,"ts":"2026-01-01T00:00:03Z","token":token,"task":task,"session":1,"protocol":"simple","text":"drop table events","kind":"ddl"}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join(format!("{token}.jsonl")), text).expect("write log");
}

#[test]
fn statement_summary_and_html_page_render_in_chromium() {
    let g = gateway();
    let t = g.issue("html", 600);
    let id = t["id"].as_str().expect("id").to_string();
    run_sql(
        t["dsn"].as_str().expect("dsn"),
        "update items set name = '<b>x</b>' where id = 4;\ndrop table events;\n",
    );
    write_log(&g.data_dir, "html", &id);
    let r = diff(g, &id);
    assert_eq!(r["statements"]["total"], 4);
    assert_eq!(
        r["statements"]["by_kind"],
        json!({"ddl": 1, "read": 1, "write": 2})
    );
    assert_eq!(r["statements"]["unfinished"], 1);
    assert_eq!(r["statements"]["failed"][0]["seq"], 3);
    assert_eq!(r["statements"]["failed"][0]["sqlstate"], "23505");
    g.revoke(&id);
    let page = g
        .data_dir
        .join("reviews")
        .join("html")
        .join(format!("{id}.html"));
    let html = std::fs::read_to_string(&page).expect("stored html");
    assert!(
        html.contains("&lt;b&gt;x&lt;/b&gt;") && !html.contains("<b>x</b>"),
        "values must be escaped"
    );

    let Some(chromium) = ["chromium", "chromium-browser"].iter().find(|b| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {b}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }) else {
        let _ = harness::require(
            false,
            "chromium",
            "the Debian package `chromium` renders the page",
        );
        return;
    };
    let profile = harness::tempdir();
    let out = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && dom.contains("</html>"),
        "chromium failed: {}\n{dom}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "id=\"statements\"",
        "id=\"schema\"",
        "id=\"rows\"",
        "update items set name = '&lt;b&gt;x&lt;/b&gt;' where id = 4",
        "error 23505",
        "dropped table",
        "public.events",
        "public.items",
        "DROP TABLE public.events;",
        "1 schema change(s)",
    ] {
        assert!(
            dom.contains(needle),
            "rendered page lacks {needle:?}:\n{dom}"
        );
    }
}

#[test]
fn cli_review_prints_text_and_sql() {
    let g = gateway();
    let t = g.issue("cli", 600);
    let id = t["id"].as_str().expect("id").to_string();
    run_sql(
        t["dsn"].as_str().expect("dsn"),
        "delete from audit where id = 2;\n",
    );
    let run = |fmt: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandpit"))
            .args(["review", &id, "--format", fmt, "--api", &g.api])
            .env("SANDPIT_ADMIN_KEY", &g.admin_key)
            .output()
            .expect("run sandpit review");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = run("text");
    assert!(text.contains("public.audit"), "{text}");
    assert!(text.contains("0 inserted, 0 updated, 1 deleted"), "{text}");
    let sql = run("sql");
    assert!(
        sql.contains("DELETE FROM public.audit WHERE id = '2'::bigint;"),
        "{sql}"
    );
    g.revoke(&id);
}

#[test]
fn open_session_with_unpublished_counters_falls_back_to_scanning_every_table() {
    let g = gateway();
    let t = g.issue("live", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // Two commits in quick succession: the second one's counters stay in the backend (Postgres
    // publishes at most once a second, and an idle backend only after 10 s).
    let client = rt.block_on(async {
        let c = harness::connect(&dsn).await.expect("connect");
        c.simple_query("update items set price = 0 where id = 7")
            .await
            .expect("update 1");
        c.simple_query("delete from order_lines where order_id = 5 and line_no = 1")
            .await
            .expect("update 2");
        c
    });
    let r = diff(g, &id);
    assert_eq!(r["scan"]["mode"], "all", "{}", r["scan"]);
    assert_eq!(
        data_of(&r),
        vec![
            d4("public.items", 0, 1, 0),
            d4("public.order_lines", 0, 0, 1)
        ]
    );
    drop(client);
    drop(rt);
    // Session gone: its counters are published, only touched tables are read.
    let r = diff(g, &id);
    assert_eq!(r["scan"]["mode"], "touched", "{}", r["scan"]);
    assert_eq!(r["scan"]["tables_scanned"], 2, "{}", r["scan"]);
    let (s, body) = get_text(g, &format!("/v1/tokens/{id}/diff?scan=all"));
    assert_eq!(s, 200);
    let all: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(all["scan"]["tables_scanned"], 4, "{}", all["scan"]);
    assert_eq!(normalize(&all), normalize(&r));
    g.revoke(&id);
}

#[test]
fn row_level_security_cannot_hide_rows_from_the_review() {
    let g = gateway();
    let t = g.issue("rls", 600);
    let id = t["id"].as_str().expect("id").to_string();
    run_sql(
        t["dsn"].as_str().expect("dsn"),
        "delete from audit where id = 2;\n\
         alter table audit enable row level security;\n\
         alter table audit force row level security;\n\
         create policy hide on audit using (false);\n",
    );
    let r = diff(g, &id);
    let audit = r["data"]
        .as_array()
        .expect("data")
        .iter()
        .find(|t| t["table"] == "public.audit")
        .unwrap_or_else(|| panic!("audit missing from {r:#}"));
    // The review role reads past row security (BYPASSRLS, row_security off): the policy,
    // agent-written code, is never run and hides nothing.
    assert!(audit.get("error").is_none(), "{audit:#}");
    assert_eq!(audit["deleted"], 1, "{audit:#}");
    assert_eq!(audit["inserted"], 0, "{audit:#}");
    g.revoke(&id);
}

#[test]
fn reference_backend_is_not_a_token_backend() {
    let g = gateway();
    let t = g.issue("ref", 600);
    let id = t["id"].as_str().expect("id").to_string();
    run_sql(t["dsn"].as_str().expect("dsn"), "select 1;\n");
    diff(g, &id);
    let names: Vec<String> = std::fs::read_dir(g.instances_dir())
        .expect("instances")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| n.starts_with("sp_")), "{names:?}");
    // One reference per golden version: `reference/<version>/`, here the token's own.
    let version = g.show(&id)["golden"].as_str().expect("golden").to_string();
    let pid_file = g
        .data_dir
        .join("pg")
        .join("reference")
        .join(&version)
        .join("data")
        .join("postmaster.pid");
    assert!(pid_file.is_file(), "reference backend should be running");
    g.revoke(&id);
}

#[test]
fn new_types_tables_views_triggers_and_column_changes_round_trip() {
    let r = scenario(
        "objects",
        "create type mood as enum ('sad', 'ok', 'it''s fine');\n\
         create domain posint as int check (value > 0);\n\
         create table feelings(id serial primary key, item_id int not null references items(id),\n\
           m mood not null default 'ok', p posint, at timestamptz default now());\n\
         insert into feelings(item_id, m, p, at) values (2, 'sad', 3, '2024-02-03 04:05:06+00'),\n\
           (3, 'it''s fine', null, '2024-02-03 04:05:06+00');\n\
         create view feeling_items as select f.id, i.name from feelings f join items i on i.id = f.item_id;\n\
         create function touch() returns trigger language plpgsql as\n\
           $$ begin new.at := '2000-01-01 00:00:00+00'; return new; end $$;\n\
         create trigger feelings_touch before update on feelings for each row execute function touch();\n\
         alter table order_lines alter column qty type bigint;\n\
         alter table order_lines alter column note set default 'n/a';\n\
         alter table items alter column price set not null;\n\
         alter table items rename column name to title;\n\
         drop view cheap_items;\n\
         create view cheap_items as select id, title from items where price < 5;\n",
        vec![
            s3("type", "added", "public.mood"),
            s3("type", "added", "public.posint"),
            s3("function", "added", "public.touch()"),
            s3("sequence", "added", "public.feelings_id_seq"),
            s3("column", "renamed", "public.items.title"),
            s3("column", "altered", "public.items.price"),
            s3("column", "altered", "public.order_lines.qty"),
            s3("column", "altered", "public.order_lines.note"),
            s3("table", "added", "public.feelings"),
            s3("constraint", "added", "public.feelings.feelings_pkey"),
            s3("constraint", "added", "public.feelings.feelings_item_id_fkey"),
            s3("view", "added", "public.feeling_items"),
            s3("view", "added", "public.cheap_items"),
            s3("view", "dropped", "public.cheap_items"),
            s3("trigger", "added", "public.feelings.feelings_touch"),
        ],
        vec![d4("public.feelings", 2, 0, 0)],
        vec![sq("public.feelings_id_seq", "2", true)],
    );
    // Created tables name their key.
    assert_eq!(r["data"][0]["key"], json!(["id"]), "{:#}", r["data"][0]);
    let patch = r["patch"].as_str().unwrap_or("");
    let create = patch.find("CREATE TABLE public.feelings").expect("create");
    let insert = patch.find("INSERT INTO public.feelings").expect("insert");
    let trigger = patch
        .find("CREATE TRIGGER feelings_touch")
        .expect("trigger");
    assert!(create < insert && insert < trigger, "{patch}");
}

#[test]
fn review_dir_and_on_end_are_configurable() {
    let small = "create table t(id int primary key, v text);\ninsert into t values (1, 'a');\n";
    let out = harness::tempdir();
    let cfg = format!("[review]\ndir = \"{}\"\n", out.path().display());
    let g = Gateway::start(Some(small), Some(&cfg));
    let t = g.issue("custom-dir", 600);
    let id = t["id"].as_str().expect("id").to_string();
    run_sql(t["dsn"].as_str().expect("dsn"), "update t set v = 'b';\n");
    g.revoke(&id);
    let stored = out.path().join("custom-dir").join(format!("{id}.json"));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&stored).expect("stored review"))
        .expect("json");
    assert_eq!(data_of(&r), vec![d4("public.t", 0, 1, 0)]);
    assert!(!g.data_dir.join("reviews").exists());
    assert_eq!(diff(&g, &id)["data"], r["data"]);
    drop(g);

    let g = Gateway::start(Some(small), Some("[review]\non_end = false\n"));
    let t = g.issue("off", 600);
    let id = t["id"].as_str().expect("id").to_string();
    run_sql(t["dsn"].as_str().expect("dsn"), "delete from t;\n");
    assert_eq!(data_of(&diff(&g, &id)), vec![d4("public.t", 0, 0, 1)]);
    g.revoke(&id);
    let (s, body) = get_text(&g, &format!("/v1/tokens/{id}/diff"));
    assert_eq!(s, 404, "{body}");
    assert!(body.contains("no review was stored"), "{body}");
}

// Issue 16: changes that went missing from the review or broke its patch.

#[test]
fn renamed_sequence_is_not_a_changed_default_and_is_renamed_before_it_is_named() {
    let r = scenario(
        "seqrename",
        "alter sequence items_id_seq rename to items_seq;\n\
         insert into items(name) values ('after rename');\n\
         alter sequence ticket_seq rename to tickets;\n\
         create sequence ticket_seq start 7;\n\
         alter table audit alter column msg set default 'm' || nextval('tickets');\n",
        vec![
            s3("sequence", "renamed", "public.items_seq"),
            s3("sequence", "renamed", "public.tickets"),
            s3("sequence", "added", "public.ticket_seq"),
            s3("column", "altered", "public.audit.msg"),
        ],
        vec![d4("public.items", 1, 0, 0)],
        vec![sq("public.items_seq", "51", true)],
    );
    let patch = r["patch"].as_str().unwrap_or("");
    let rename = patch
        .find("ALTER SEQUENCE public.ticket_seq RENAME TO tickets;")
        .expect("rename");
    let default = patch
        .find("SET DEFAULT ('m'::text || nextval('public.tickets'::regclass));")
        .unwrap_or_else(|| panic!("default:\n{patch}"));
    assert!(rename < default, "{patch}");
}

#[test]
fn foreign_keys_re_pointed_to_a_new_parent_and_away_from_a_deleted_one_replay() {
    let r = scenario(
        "repoint",
        "insert into items(id, name) values (100, 'new parent');\n\
         update audit set item_id = 100 where id = 1;\n\
         update audit set item_id = 3 where id = 2;\n\
         delete from items where id = 2;\n",
        vec![],
        vec![d4("public.items", 1, 0, 1), d4("public.audit", 0, 2, 0)],
        vec![],
    );
    let patch = r["patch"].as_str().unwrap_or("");
    let insert = patch.find("INSERT INTO public.items").expect("insert");
    let update = patch.find("UPDATE public.audit").expect("update");
    let delete = patch.find("DELETE FROM public.items").expect("delete");
    assert!(insert < update && update < delete, "{patch}");
}

#[test]
fn rows_re_parented_within_a_self_referencing_table_replay() {
    let golden = "create table node(id int primary key, parent int references node(id), label text);\n\
                  insert into node values (1, null, 'root'), (2, 1, 'a'), (3, 2, 'b'), (4, 2, 'c');\n";
    let g = Gateway::start(Some(golden), None);
    let t1 = g.issue("selfref", 600);
    let id1 = t1["id"].as_str().expect("id").to_string();
    run_sql(
        t1["dsn"].as_str().expect("dsn"),
        "insert into node values (10, null, 'new root'), (11, 10, 'new child');\n\
         update node set parent = 10 where parent = 2;\n\
         delete from node where id = 2;\n",
    );
    let r = diff(&g, &id1);
    assert_eq!(data_of(&r), vec![d4("public.node", 2, 2, 1)]);
    let notes = r["notes"].to_string();
    assert!(notes.contains("node_parent_fkey"), "{notes}");
    let patch = r["patch"].as_str().unwrap_or("").to_string();
    let t2 = g.issue("selfref-patched", 600);
    let id2 = t2["id"].as_str().expect("id").to_string();
    run_sql(t2["dsn"].as_str().expect("dsn"), &patch);
    assert_same_as_patched_fork(&g, &id1, &id2);
    // The key is back to what it was: not deferrable.
    let (ok, out, err) = psql(
        t2["dsn"].as_str().expect("dsn"),
        &[
            "-Atc",
            "select condeferrable, condeferred from pg_constraint where conname = 'node_parent_fkey'",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "f|f");
}

/// The scratch database of `scratch` against the patched fork `patched`, every table read:
/// nothing may differ (objects the patch created have their own OIDs there, so an
/// added/dropped pair with the same name and definition is the same object).
fn assert_same_as_patched_fork(g: &Gateway, scratch: &str, patched: &str) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let opts = sandpit::review::diff::DiffOptions {
        full_scan: true,
        ..Default::default()
    };
    let direct = rt
        .block_on(sandpit::review::diff::diff(
            &target(g, patched),
            &target(g, scratch),
            opts,
            scratch,
            "direct",
        ))
        .expect("direct diff");
    assert!(
        direct.schema.is_empty() && direct.data.is_empty() && direct.sequences.is_empty(),
        "scratch vs patched fork is not empty: {:#?} {:#?} {:#?}",
        direct.schema,
        direct.data,
        direct.sequences
    );
}

#[test]
fn values_of_added_columns_are_diffed_and_patched_before_their_constraints() {
    let r = scenario(
        "addcol",
        "alter table items add column score int;\n\
         update items set score = id * 10;\n\
         alter table items alter column score set not null;\n\
         alter table items add column flag boolean not null default true;\n\
         alter table items add constraint score_positive check (score > 0);\n\
         alter table order_lines add column weight numeric;\n\
         update order_lines set weight = 1.5 where order_id = 1;\n\
         alter table events add column seen boolean;\n\
         update events set seen = true where kind = 'dup';\n",
        vec![
            s3("column", "added", "public.items.score"),
            s3("column", "added", "public.items.flag"),
            s3("column", "added", "public.order_lines.weight"),
            s3("column", "added", "public.events.seen"),
            s3("constraint", "added", "public.items.score_positive"),
        ],
        vec![
            d4("public.items", 0, 50, 0),
            d4("public.order_lines", 0, 3, 0),
            d4("public.events", 3, 0, 3),
        ],
        vec![],
    );
    let items = &r["data"][0];
    assert_eq!(items["updated_columns"], json!({"flag": 50, "score": 50}));
    assert_eq!(
        items["samples"]["showing"],
        json!({"updated": "showing 20 of 50"})
    );
    let upd = &items["samples"]["updated"][0];
    assert_eq!(upd["changed"], json!(["score", "flag"]), "{upd}");
    assert_eq!(upd["before"][4], Value::Null);
    assert_eq!(upd["after"][4], "10");
    assert_eq!(upd["after"][5], "t");
    // The golden's trigger fills `note` on update: those count too.
    assert_eq!(
        r["data"][1]["updated_columns"],
        json!({"note": 3, "weight": 3})
    );
    // The column is added empty, filled, then constrained.
    let patch = r["patch"].as_str().unwrap_or("");
    let add = patch
        .find("ALTER TABLE public.items ADD COLUMN score integer;")
        .unwrap_or_else(|| panic!("{patch}"));
    let fill = patch
        .find("UPDATE public.items SET score = '10'::integer, flag = 't'::boolean WHERE id = '1'::integer;")
        .unwrap_or_else(|| panic!("{patch}"));
    let not_null = patch
        .find("ALTER TABLE public.items ALTER COLUMN score SET NOT NULL;")
        .expect("not null");
    let check = patch.find("ADD CONSTRAINT score_positive").expect("check");
    assert!(add < fill && fill < not_null && not_null < check, "{patch}");
    // "showing N of M" in text and HTML too.
    let g = gateway();
    let id = r["token"].as_str().expect("token");
    let (s, text) = get_text(g, &format!("/v1/tokens/{id}/diff?format=text"));
    assert_eq!(s, 200);
    assert!(text.contains("updated: showing 20 of 50"), "{text}");
    assert!(
        text.contains("updated per column: flag 50, score 50"),
        "{text}"
    );
    let (s, html) = get_text(g, &format!("/v1/tokens/{id}/diff?format=html"));
    assert_eq!(s, 200);
    assert!(html.contains("updated: showing 20 of 50"), "{html}");
}

#[test]
fn comments_and_grants_are_diffed_and_patched() {
    let r = scenario(
        "annotations",
        "comment on table items is 'things we sell';\n\
         comment on column items.name is 'shown to customers';\n\
         comment on view cheap_items is 'under 10';\n\
         comment on function default_note() is 'fallback note';\n\
         comment on sequence ticket_seq is 'it''s for tickets';\n\
         comment on schema public is 'the app';\n\
         grant select on items to agent_read;\n\
         grant select (name), update (name) on items to agent_write;\n\
         grant usage on sequence ticket_seq to agent_write with grant option;\n\
         grant select on cheap_items to agent_read;\n\
         revoke execute on function default_note() from public;\n\
         grant execute on function default_note() to agent_read;\n\
         grant create on schema public to agent_write;\n",
        vec![
            s3("comment", "added", "public.items"),
            s3("comment", "added", "public.items.name"),
            s3("comment", "added", "public.ticket_seq"),
            s3("comment", "added", "public.cheap_items"),
            s3("comment", "added", "public.default_note()"),
            s3("comment", "altered", "public"),
            s3("grant", "added", "public.items"),
            s3("grant", "added", "public.items.name"),
            s3("grant", "added", "public.ticket_seq"),
            s3("grant", "added", "public.cheap_items"),
            s3("grant", "dropped", "public.default_note()"),
            s3("grant", "added", "public.default_note()"),
            s3("grant", "added", "public"),
        ],
        vec![],
        vec![],
    );
    let details: Vec<&str> = r["schema"]
        .as_array()
        .expect("schema")
        .iter()
        .map(|c| c["detail"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        details[6..],
        [
            "to agent_read: SELECT",
            "to agent_write: SELECT (name), UPDATE (name)",
            "to agent_write: USAGE with grant option",
            "to agent_read: SELECT",
            "from PUBLIC: EXECUTE",
            "to agent_read: EXECUTE",
            "to agent_write: CREATE",
        ]
    );
    let patch = r["patch"].as_str().unwrap_or("");
    for stmt in [
        "COMMENT ON TABLE public.items IS 'things we sell';",
        "COMMENT ON COLUMN public.items.name IS 'shown to customers';",
        "COMMENT ON SEQUENCE public.ticket_seq IS 'it''s for tickets';",
        "COMMENT ON VIEW public.cheap_items IS 'under 10';",
        "COMMENT ON FUNCTION public.default_note() IS 'fallback note';",
        "COMMENT ON SCHEMA public IS 'the app';",
        "GRANT SELECT ON TABLE public.items TO agent_read;",
        "GRANT SELECT (name), UPDATE (name) ON TABLE public.items TO agent_write;",
        "GRANT USAGE ON SEQUENCE public.ticket_seq TO agent_write WITH GRANT OPTION;",
        "REVOKE EXECUTE ON FUNCTION public.default_note() FROM PUBLIC;",
        "GRANT CREATE ON SCHEMA public TO agent_write;",
    ] {
        assert!(patch.contains(stmt), "{stmt} missing from\n{patch}");
    }
}

#[test]
fn removed_comments_and_revoked_grants_are_patched_back() {
    // Grants and comments the golden has are themselves set up by a first token's patch
    // here, so this one builds on a golden with them: a small gateway of its own.
    let golden = "create table t(id int primary key, v text);\n\
                  comment on table t is 'golden comment';\n\
                  comment on column t.v is 'golden column comment';\n\
                  grant select, insert on t to agent_read;\n\
                  grant update (v) on t to agent_write;\n";
    let g = Gateway::start(Some(golden), None);
    let t1 = g.issue("unannotate", 600);
    let id1 = t1["id"].as_str().expect("id").to_string();
    run_sql(
        t1["dsn"].as_str().expect("dsn"),
        "comment on table t is null;\n\
         comment on column t.v is 'changed';\n\
         revoke insert on t from agent_read;\n\
         revoke update (v) on t from agent_write;\n",
    );
    let r = diff(&g, &id1);
    assert_eq!(
        schema_of(&r),
        vec![
            s3("comment", "dropped", "public.t"),
            s3("comment", "altered", "public.t.v"),
            s3("grant", "dropped", "public.t"),
            s3("grant", "dropped", "public.t.v"),
        ]
    );
    let patch = r["patch"].as_str().unwrap_or("").to_string();
    for stmt in [
        "COMMENT ON TABLE public.t IS NULL;",
        "COMMENT ON COLUMN public.t.v IS 'changed';",
        "REVOKE INSERT ON TABLE public.t FROM agent_read;",
        "REVOKE UPDATE (v) ON TABLE public.t FROM agent_write;",
    ] {
        assert!(patch.contains(stmt), "{stmt} missing from\n{patch}");
    }
    let t2 = g.issue("unannotate-patched", 600);
    let id2 = t2["id"].as_str().expect("id").to_string();
    run_sql(t2["dsn"].as_str().expect("dsn"), &patch);
    assert_same_as_patched_fork(&g, &id1, &id2);
}

#[test]
fn dropped_table_rows_count_as_deleted_with_samples() {
    let r = scenario(
        "droptable",
        "drop table order_lines;\ndrop table events;\n",
        vec![
            s3("table", "dropped", "public.order_lines"),
            s3("table", "dropped", "public.events"),
        ],
        vec![
            d4("public.order_lines", 0, 0, 30),
            d4("public.events", 0, 0, 23),
        ],
        vec![],
    );
    let lines = &r["data"][0];
    assert_eq!(lines["matched_by"], "dropped table");
    assert_eq!(lines["key"], json!(["order_id", "line_no"]));
    assert_eq!(
        lines["samples"]["showing"],
        json!({"deleted": "showing 20 of 30"})
    );
    let events = &r["data"][1];
    assert_eq!(events["key"], json!([]), "events has no key");
    assert_eq!(events["columns"], json!(["kind", "payload", "at"]));
    assert_eq!(
        events["samples"]["deleted"].as_array().map(Vec::len),
        Some(20)
    );
    assert_eq!(
        events["samples"]["showing"],
        json!({"deleted": "showing 20 of 23"})
    );
    assert_eq!(
        events["samples"]["deleted"][0].as_array().map(Vec::len),
        Some(3)
    );
}

#[test]
fn added_serial_and_identity_columns_replay_with_their_values() {
    let r = scenario(
        "addserial",
        "alter table items add column code serial;\n\
         alter table order_lines add column n int generated always as identity;\n",
        vec![
            s3("sequence", "added", "public.items_code_seq"),
            s3("sequence", "added", "public.order_lines_n_seq"),
            s3("column", "added", "public.items.code"),
            s3("column", "added", "public.order_lines.n"),
        ],
        vec![
            d4("public.items", 0, 50, 0),
            d4("public.order_lines", 0, 30, 0),
        ],
        vec![
            sq("public.items_code_seq", "50", true),
            sq("public.order_lines_n_seq", "30", true),
        ],
    );
    let patch = r["patch"].as_str().unwrap_or("");
    for stmt in [
        "ALTER TABLE public.items ADD COLUMN code integer;",
        "ALTER TABLE public.items ALTER COLUMN code SET DEFAULT nextval('public.items_code_seq'::regclass);",
        "ALTER TABLE public.order_lines ADD COLUMN n integer;",
        "ALTER TABLE public.order_lines ALTER COLUMN n ADD GENERATED ALWAYS AS IDENTITY;",
    ] {
        assert!(patch.contains(stmt), "{stmt} missing from\n{patch}");
    }
}

//! End-of-token work that skips tables (`review::touched`), attacked: a real gateway and
//! real Postgres forks; the agent writes through every trick that could hide a write from
//! the evidence (COPY, a trigger, a rule, a rewrite that changes nothing, a rolled-back
//! write, a table dropped and re-created under its name, a column added with a default, a
//! crash that drops every counter and empties an unlogged table). Each must still show in
//! the stored review, be hashed by its patch check and be in the promote capture; only the
//! tables nobody touched are skipped, and they are counted.

use crate::support::harness;

use std::sync::OnceLock;
use std::time::Duration;

use crate::support::harness::{psql, Gateway};
use serde_json::Value;

/// Quiet tables nobody touches (the ones the checks may skip), and one per trick.
const GOLDEN: &str = r#"
create table q1(id int primary key, v text);
create table q2(id int primary key, v text);
create table q3(id int primary key, v text);
create table q4(id int primary key, v text);
insert into q1 select g, 'q' || g from generate_series(1, 200) g;
insert into q2 select g, 'q' || g from generate_series(1, 200) g;
insert into q3 select g, 'q' || g from generate_series(1, 200) g;
insert into q4 select g, 'q' || g from generate_series(1, 200) g;
create table t_copy(id int primary key, v text);
create table t_trig_src(id int primary key, v text);
create table t_trig_dst(id int primary key, v text);
create table t_rule_src(id int primary key, v text);
create table t_rule_dst(id int primary key, v text);
create rule to_dst as on insert to t_rule_src do instead insert into public.t_rule_dst values (new.id, new.v);
create table t_trunc(id int primary key, v text);
insert into t_trunc select g, 'x' || g from generate_series(1, 20) g;
create table t_vacfull(id int primary key, v text);
insert into t_vacfull select g, 'x' || g from generate_series(1, 20) g;
create table t_cluster(id int primary key, v text);
insert into t_cluster select g, 'x' || g from generate_series(1, 20) g;
create table t_rollback(id int primary key, v text);
insert into t_rollback select g, 'x' || g from generate_series(1, 20) g;
create table t_recreate(id int primary key, v text);
insert into t_recreate select g, 'x' || g from generate_series(1, 20) g;
create table t_addcol(id int primary key, v text);
insert into t_addcol select g, 'x' || g from generate_series(1, 20) g;
create unlogged table t_unlogged(id int primary key, v text);
insert into t_unlogged select g, 'u' || g from generate_series(1, 20) g;
create table t_crash(id int primary key, v text);
insert into t_crash select g, 'x' || g from generate_series(1, 20) g;
create table t_fire(id int primary key, v text);
create table t_fired(id int, v text);
create function note_fire() returns trigger language plpgsql as
  'begin insert into public.t_fired values (new.id, new.v); return new; end';
create trigger t_note after insert on t_fire for each row execute function note_fire();
create table t_prep(id int primary key, v text);
create table t_open(id int primary key, v text);
insert into t_open select g, 'x' || g from generate_series(1, 20) g;
"#;

/// Tables of the golden nobody touches in the first test: q1..q4, t_crash, t_fire, t_fired,
/// t_prep, t_open and t_rule_src (whose rule wrote elsewhere). The unlogged table is read
/// whatever its counters say.
const QUIET: u64 = 10;

fn gateway() -> &'static Gateway {
    static G: OnceLock<&'static Gateway> = OnceLock::new();
    G.get_or_init(|| {
        harness::process_gateway(|| {
            let dir = harness::reused_dir(
                "review-skip-gateway",
                &["tokens", "pg/instances", "reviews", "logs", "gateway.log"],
            );
            Gateway::start_in(&dir, Some(GOLDEN), None)
        })
    })
}

fn stored_review(g: &Gateway, id: &str) -> Value {
    let url = format!("{}/v1/tokens/{id}/diff", g.api);
    let r = harness::http("GET", &url, Some(&g.admin_key), harness::Body::None)
        .unwrap_or_else(|e| panic!("api call failed: {e}"));
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).expect("review json")
}

/// (inserted, updated, deleted) of `table` in a review, if it changed.
fn changes(r: &Value, table: &str) -> Option<(u64, u64, u64)> {
    r["data"].as_array()?.iter().find_map(|t| {
        (t["table"] == table).then(|| {
            let n = |k: &str| t[k].as_u64().unwrap_or(0);
            (n("inserted"), n("updated"), n("deleted"))
        })
    })
}

fn captured(g: &Gateway, task: &str, id: &str) -> Value {
    let p = g
        .data_dir
        .join("reviews")
        .join(task)
        .join(format!("{id}.change.json"));
    let b = std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_slice(&b).expect("change json")
}

/// A child of `parent` whose command line holds `name`.
fn child_named(parent: i32, name: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let ppid: i32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let cmd = std::fs::read_to_string(e.path().join("cmdline")).ok()?;
        (ppid == parent && cmd.contains(name)).then_some(pid)
    })
}

fn run(dsn: &str, sql: &[&str]) {
    let mut args = Vec::new();
    for s in sql {
        args.extend(["-c", s]);
    }
    let (ok, out, err) = psql(dsn, &args);
    assert!(ok, "{err}\n{out}");
}

#[test]
fn every_trick_shows_in_the_review_the_patch_check_and_the_capture() {
    let g = gateway();
    let task = "tricks";
    let t = g.issue(task, 600);
    let id = t["id"].as_str().expect("id").to_string();
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    let dir = harness::tempdir();
    let csv = dir.path().join("rows.csv");
    std::fs::write(&csv, "1,one\n2,two\n3,three\n").expect("csv");
    run(
        &dsn,
        &[
            &format!(
                "\\copy public.t_copy from '{}' with (format csv)",
                csv.display()
            ),
            // The agent's own trigger (the patch creates it after the rows, so it replays).
            "create function copy_row() returns trigger language plpgsql as \
             'begin insert into public.t_trig_dst values (new.id, new.v); return new; end'",
            "create trigger t_copy_row after insert on t_trig_src for each row \
             execute function copy_row()",
            "insert into t_trig_src values (1, 'through a trigger')",
            "insert into t_rule_src values (1, 'through a rule')",
            "truncate t_trunc",
            "vacuum full t_vacfull",
            "cluster t_cluster using t_cluster_pkey",
            // (the mark CLUSTER leaves on the index is not what is tested here)
            "alter table t_cluster set without cluster",
            "begin; delete from t_rollback; rollback",
            "drop table t_recreate; create table t_recreate(id int primary key, v text); \
             insert into t_recreate select g, 'x' || g from generate_series(1, 19) g",
            "alter table t_addcol add column extra int default 7",
        ],
    );
    // Resetting counters is a superuser's: the agent is refused.
    let (ok, _, err) = psql(&dsn, &["-c", "select pg_stat_reset()"]);
    assert!(!ok && err.contains("permission denied"), "{err}");
    let (s, _) = g.revoke(&id);
    assert_eq!(s, 200);
    let r = stored_review(g, &id);
    let scan = &r["scan"];
    assert_eq!(scan["mode"], "touched", "{scan}");
    assert_eq!(changes(&r, "public.t_copy"), Some((3, 0, 0)), "{r:#}");
    assert_eq!(changes(&r, "public.t_trig_src"), Some((1, 0, 0)));
    assert_eq!(changes(&r, "public.t_trig_dst"), Some((1, 0, 0)));
    assert_eq!(
        changes(&r, "public.t_rule_src"),
        None,
        "a rule wrote elsewhere"
    );
    assert_eq!(changes(&r, "public.t_rule_dst"), Some((1, 0, 0)));
    assert_eq!(changes(&r, "public.t_trunc"), Some((0, 0, 20)));
    assert_eq!(changes(&r, "public.t_addcol"), Some((0, 20, 0)));
    assert!(changes(&r, "public.t_recreate").is_some(), "{r:#}");
    for same in ["public.t_vacfull", "public.t_cluster", "public.t_rollback"] {
        assert_eq!(changes(&r, same), None, "{same} has its golden rows");
    }
    // Read: everything but the quiet tables (t_recreate is new, its old self dropped).
    let total = scan["tables_total"].as_u64().expect("total");
    assert_eq!(
        scan["tables_scanned"].as_u64(),
        Some(total - QUIET + 1),
        "{scan}"
    );
    // The patch check hashed every table a trick touched on either side, and skipped
    // exactly the quiet ones.
    let v = &r["verification"];
    assert_eq!(v["status"], "exact", "{v:#}");
    assert_eq!(
        v["compared"]["tables_unchanged"].as_u64(),
        Some(QUIET),
        "{v:#}"
    );
    assert_eq!(v["compared"]["tables"].as_u64(), Some(total), "{v:#}");
    // The promote capture: the same tables, every changed row.
    let c = captured(g, task, &id);
    assert_eq!(
        c["review"]["scan"]["mode"], "touched",
        "{:#}",
        c["review"]["scan"]
    );
    assert_eq!(
        c["review"]["scan"]["tables_scanned"],
        scan["tables_scanned"]
    );
    for table in [
        "public.t_copy",
        "public.t_trig_dst",
        "public.t_rule_dst",
        "public.t_trunc",
    ] {
        assert_eq!(changes(&c["review"], table), changes(&r, table), "{table}");
    }
}

/// A crash drops every counter (and empties unlogged tables) without a write the counters
/// keep: the checks must see the restart and read every table.
#[test]
fn a_crash_restart_makes_every_table_read() {
    let g = gateway();
    let task = "crash";
    let t = g.issue(task, 600);
    let id = t["id"].as_str().expect("id").to_string();
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let c = harness::connect(&dsn).await.expect("connect");
        c.simple_query("update t_crash set v = 'changed' where id <= 3")
            .await
            .expect("update");
        // A crash in the postmaster's first second is not told apart from its start; the
        // agent's own writes come later than that here as with any warm fork.
        loop {
            let r = c
                .simple_query(
                    "select (now() > pg_postmaster_start_time() + interval '1.5 seconds')::text, \
                     pg_backend_pid()::text",
                )
                .await
                .expect("select");
            let row = r.iter().find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some((r.get(0).map(str::to_string), r.get(1).map(str::to_string)))
                }
                _ => None,
            });
            if let Some((Some(late), Some(_))) = row {
                if late == "true" {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    // Counters of a committed write are published within a second of going idle.
    std::thread::sleep(Duration::from_millis(1500));
    // The test (root) kills the checkpointer: the postmaster restarts every process and
    // drops every counter, and the unlogged table comes back empty.
    let (postmaster, _) = harness::postmaster(g, &id).expect("postmaster.pid");
    let pid = child_named(postmaster, "checkpointer").expect("the checkpointer");
    // SAFETY: kill(2) with a pid read from /proc.
    let killed = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(killed, 0, "kill {pid}");
    drop(rt);
    let back = harness::wait_until(Duration::from_secs(60), || {
        let (ok, out, _) = psql(&dsn, &["-XAtc", "select count(*) from t_unlogged"]);
        ok && out.trim() == "0"
    });
    assert!(
        back,
        "the server did not come back with an empty unlogged table"
    );
    // The evidence any role can read (a provider's own role cannot see the checkpointer's
    // start): the shared statistics were reset after the postmaster started.
    let (ok, out, err) = psql(
        &dsn,
        &[
            "-XAtc",
            "select (stats_reset > pg_postmaster_start_time() + interval '1 second')::text \
             from pg_stat_bgwriter",
        ],
    );
    assert!(ok && out.trim() == "true", "{out} {err}");
    let (s, _) = g.revoke(&id);
    assert_eq!(s, 200);
    let r = stored_review(g, &id);
    let scan = &r["scan"];
    assert_eq!(scan["mode"], "all", "{scan}");
    assert!(
        scan["reason"].as_str().unwrap_or("").contains("crash"),
        "{scan}"
    );
    assert_eq!(changes(&r, "public.t_crash"), Some((0, 3, 0)), "{r:#}");
    assert_eq!(changes(&r, "public.t_unlogged"), Some((0, 0, 20)), "{r:#}");
    let v = &r["verification"];
    assert_eq!(v["status"], "exact", "{v:#}");
    assert_eq!(v["compared"]["tables_unchanged"].as_u64(), Some(0), "{v:#}");
    let c = captured(g, task, &id);
    assert_eq!(c["review"]["scan"]["mode"], "all");
    assert_eq!(changes(&c["review"], "public.t_crash"), Some((0, 3, 0)));
}

/// The patch check must also read what the patch changed in the fork and the agent did not
/// change in the scratch database: here the golden's trigger, which the agent had turned
/// off around its insert, fires when the patch replays it.
#[test]
fn a_table_only_the_patch_writes_is_hashed_and_differs() {
    let g = gateway();
    let t = g.issue("fork-side", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    run(
        &dsn,
        &[
            "alter table t_fire disable trigger t_note",
            "insert into t_fire values (1, 'quietly')",
            "alter table t_fire enable trigger t_note",
        ],
    );
    let (s, _) = g.revoke(&id);
    assert_eq!(s, 200);
    let r = stored_review(g, &id);
    assert_eq!(r["scan"]["mode"], "touched", "{}", r["scan"]);
    assert_eq!(changes(&r, "public.t_fire"), Some((1, 0, 0)), "{r:#}");
    assert_eq!(changes(&r, "public.t_fired"), None, "{r:#}");
    let v = &r["verification"];
    assert_eq!(v["status"], "differs", "{v:#}");
    let diffs: Vec<&str> = v["differences"]
        .as_array()
        .expect("differences")
        .iter()
        .filter_map(|d| d.as_str())
        .collect();
    assert!(
        diffs
            .iter()
            .any(|d| d.starts_with("rows of public.t_fired")),
        "{v:#}"
    );
    // Hashed: t_fire (scratch), t_fired (fork) and the unlogged table; nothing else.
    let total = v["compared"]["tables"].as_u64().expect("tables");
    assert_eq!(
        v["compared"]["tables_unchanged"].as_u64(),
        Some(total - 3),
        "{v:#}"
    );
}

/// A write pending in a prepared transaction publishes no counter until it ends: while one
/// is pending every table is read; once it is committed its write shows as any other.
#[test]
fn a_prepared_transaction_makes_every_table_read_until_it_ends() {
    let g = gateway();
    let t = g.issue("prepared", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    run(
        &dsn,
        &["begin; insert into t_prep values (1, 'hidden'); prepare transaction 'hide'"],
    );
    let r = stored_review(g, &id);
    assert_eq!(r["scan"]["mode"], "all", "{}", r["scan"]);
    assert!(
        r["scan"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("prepared"),
        "{}",
        r["scan"]
    );
    run(&dsn, &["commit prepared 'hide'"]);
    let r = stored_review(g, &id);
    assert_eq!(r["scan"]["mode"], "touched", "{}", r["scan"]);
    assert_eq!(changes(&r, "public.t_prep"), Some((1, 0, 0)), "{r:#}");
    g.revoke(&id);
}

/// A session still open when the token ends holds its last counters unpublished; ending it
/// publishes them, so its writes show while untouched tables stay unread.
#[test]
fn writes_of_a_session_open_at_the_end_show() {
    let g = gateway();
    let t = g.issue("open-session", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let client = rt.block_on(async {
        let c = harness::connect(&dsn).await.expect("connect");
        c.simple_query("update t_open set v = 'a' where id = 1")
            .await
            .expect("update 1");
        c.simple_query("update t_open set v = 'b' where id = 2")
            .await
            .expect("update 2");
        c
    });
    let (s, _) = g.revoke(&id);
    assert_eq!(s, 200);
    drop(client);
    drop(rt);
    let r = stored_review(g, &id);
    assert_eq!(r["scan"]["mode"], "touched", "{}", r["scan"]);
    assert_eq!(changes(&r, "public.t_open"), Some((0, 2, 0)), "{r:#}");
    let v = &r["verification"];
    assert_eq!(v["status"], "exact", "{v:#}");
    assert!(
        v["compared"]["tables_unchanged"].as_u64().unwrap_or(0) > 0,
        "{v:#}"
    );
}

//! A gateway whose data dir is a small tmpfs that fills up (as root): a fork that runs out of
//! space leaves no partial copy, a statement whose record cannot be written is refused and
//! does not run, and revoke still ends the token and its sessions.

use crate::support::harness;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::harness::{connect, sqlstate, Gateway, SMALL_GOLDEN};
use serde_json::Value;

/// A tmpfs mounted on a directory, unmounted when dropped (after the gateway on it stopped:
/// declare it before the gateway).
struct Mount {
    dir: PathBuf,
}

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Option<Mount> {
        std::fs::create_dir_all(dir).expect("mkdir");
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Mount {
            dir: dir.to_path_buf(),
        })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Something still holds it open: detach it now, freed when released.
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// Free bytes of the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    s.blocks_available() as u64 * s.fragment_size() as u64
}

/// Fill the filesystem until only `leave` bytes are free (0: to the last byte).
fn fill(dir: &Path, name: &str, leave: u64) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .expect("fill file");
    let chunk = vec![0x5au8; 1 << 20];
    while free_bytes(dir) > leave + (1 << 20) {
        if f.write_all(&chunk).is_err() {
            break;
        }
    }
    let small = vec![0x5au8; 4096];
    while free_bytes(dir) > leave {
        if f.write_all(&small).is_err() {
            break;
        }
    }
    if leave == 0 {
        while f.write_all(&[0x5a]).is_ok() {}
    }
}

fn dsn(t: &Value) -> String {
    t["dsn"].as_str().expect("dsn").to_string()
}

fn id(t: &Value) -> String {
    t["id"].as_str().expect("id").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_keeps_the_kill_switch_and_the_log() {
    let tmp = harness::tempdir();
    let data = tmp.path().join("data");
    let mount = Mount::tmpfs(&data, "400m");
    if !harness::require(mount.is_some(), "a tmpfs mount", "needs root") {
        return;
    }
    // The gateway's own log (its stderr) is on the full filesystem too, as an operator's
    // would be: a log line that cannot be written must not take a session or a request down.
    // The fork pre-check (limits.min_free_bytes) is set low here, so that the copy itself
    // runs out of space and the removal of a partial copy is what gets tested.
    let g = Gateway::start_in(
        &data,
        Some(SMALL_GOLDEN),
        Some("[limits]\nmin_free_bytes = 1048576\n"),
    );

    // Before the disk fills: A (for the log) and B (for revoke) have their scratch
    // databases; C is issued (its record written) but never connected.
    let a = g.issue("full-a", 600);
    let b = g.issue("full-b", 600);
    let c = g.issue("full-c", 600);
    let ca = connect(&dsn(&a)).await.expect("connect a");
    ca.simple_query("insert into items values (5000, 'before')")
        .await
        .expect("insert before");
    let cb = connect(&dsn(&b)).await.expect("connect b");
    cb.simple_query("select 1").await.expect("b works");
    // A review now starts the review's reference copy, so it is not copied later.
    let (s, v) = g.raw_call("GET", &format!("/v1/tokens/{}/diff", id(&a)), None);
    assert_eq!(s, 200, "{v}");

    // A little room, not enough for a fork: C's first connection fails, and whatever its
    // copy wrote is removed again.
    fill(&data, "fill-1", 4 << 20);
    let before = free_bytes(&data);
    let err = connect(&dsn(&c)).await.expect_err("no room for a fork");
    eprintln!("fork on a full disk: {err}");
    assert!(
        harness::wait_until(Duration::from_secs(60), || free_bytes(&data)
            >= before - (256 << 10)),
        "a partial copy holds space: {} free, {before} before",
        free_bytes(&data)
    );
    for l in g.log().lines().filter(|l| l.contains("No space")) {
        eprintln!("gateway: {l}");
    }
    // Its golden pin may stay (a few bytes); no instance directory of it, live or trashed.
    let leftovers = || -> Vec<PathBuf> {
        ["instances", "trash"]
            .iter()
            .flat_map(|d| walk(&data.join("pg").join(d)))
            .filter(|p| p.to_string_lossy().contains(&id(&c)))
            .collect()
    };
    // The failed fork's instance directory goes through the trash, deleted in the background.
    assert!(
        harness::wait_until(Duration::from_secs(60), || leftovers().is_empty()),
        "{:?}",
        leftovers()
    );

    // No room at all.
    fill(&data, "fill-2", 0);

    // A statement whose record cannot be written is refused, and the session goes on.
    let pad = "p".repeat(16 << 10);
    let e = ca
        .simple_query(&format!(
            "insert into items values (5001, 'while full') -- {pad}"
        ))
        .await
        .expect_err("refused");
    if sqlstate(&e) != "58030" {
        panic!("{e}; gateway log (up to the fill):\n{}", g.log());
    }
    assert!(!ca.is_closed());

    // Revoke works, and B's session ends with the reason.
    let (s, v) = g.revoke(&id(&b));
    assert_eq!(s, 200, "{v}");
    assert_eq!(g.show(&id(&b))["state"], "revoked");
    let mut ended = false;
    for _ in 0..100 {
        match cb.simple_query("select 1").await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => {
                let code = sqlstate(&e);
                assert!(
                    code == "57P01" || cb.is_closed(),
                    "unexpected error after revoke: {e}"
                );
                ended = true;
                break;
            }
        }
    }
    assert!(ended, "B's session outlived its revoke");
    assert!(connect(&dsn(&b)).await.is_err(), "a revoked token connects");

    // Room again: the refused insert never ran, seen by the same session and a new one.
    std::fs::remove_file(data.join("fill-1")).expect("rm fill-1");
    std::fs::remove_file(data.join("fill-2")).expect("rm fill-2");
    let count = |rows: Vec<tokio_postgres::SimpleQueryMessage>| -> String {
        rows.into_iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .expect("a row")
    };
    let q = "select count(*) filter (where id = 5000) || '/' || count(*) filter (where id = 5001) from items";
    assert_eq!(
        count(ca.simple_query(q).await.expect("same session")),
        "1/0"
    );
    let fresh = connect(&dsn(&a)).await.expect("fresh connection");
    assert_eq!(count(fresh.simple_query(q).await.expect("fresh")), "1/0");

    // A's log holds whole records only, and no trace of the refused statement.
    let path = data.join("logs/full-a").join(format!("{}.jsonl", id(&a)));
    assert_eq!(
        sandpit::journal::log::unreadable_lines(&path).expect("check"),
        Vec::<u64>::new()
    );
    let log = std::fs::read(&path).expect("log");
    assert!(!log.windows(10).any(|w| w == b"while full"));
    // Forks work again.
    let cc = connect(&dsn(&c)).await.expect("fork once there is room");
    cc.simple_query("select 1").await.expect("c works");
}

/// Every path under `dir` (not following links).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// Below `limits.min_free_bytes` a fork is refused before anything is copied: the client
/// gets a clean 08006, the metric counts it, nothing of the token is on disk.
#[tokio::test]
async fn a_fork_is_refused_ahead_when_free_space_is_below_the_minimum() {
    let g = Gateway::start(
        Some(SMALL_GOLDEN),
        Some("[limits]\nmin_free_bytes = 1000000000000000000\n"),
    );
    let t = g.issue("no-room", 600);
    let e = connect(&dsn(&t)).await.expect_err("fork refused");
    assert_eq!(sqlstate(&e), "08006", "{e:?}");
    assert!(g.log().contains("fork refused"), "{}", g.log());
    let m = harness::metrics(&g.api);
    assert_eq!(
        m.get("sandpit_forks_refused_low_disk_total"),
        Some(&1.0),
        "{m:?}"
    );
    let leftovers: Vec<PathBuf> = walk(&g.instances_dir())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(&id(&t)))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Issue 29, item 4: the end-of-token review is written into space reserved when the token
/// was issued, so a review directory that filled up in between still takes it; without a
/// reserve the same review fails, is said to have failed, and is stored by the janitor once
/// there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_review_is_written_into_space_reserved_at_issue() {
    let tmp = harness::tempdir();
    let reviews = tmp.path().join("reviews");
    let Some(_mount) = Mount::tmpfs(&reviews, "8m") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "cannot mount a tmpfs (needs root)"
        );
        eprintln!("skipped: cannot mount a tmpfs (needs root)");
        return;
    };
    let cfg = |reserve: u64| {
        format!(
            "[review]\ndir = \"{}\"\nreserve_bytes = {reserve}\n[janitor]\ninterval = \"0s\"\n",
            reviews.display()
        )
    };
    for (reserve, stored_at_once) in [(1u64 << 20, true), (0, false)] {
        let g = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg(reserve)));
        let t = g.issue("reserved", 600);
        let tid = id(&t);
        let c = connect(&dsn(&t)).await.expect("connect");
        c.simple_query("insert into items values (5000, 'the change')")
            .await
            .expect("insert");
        drop(c);
        fill(&reviews, "fill", 0);
        assert_eq!(free_bytes(&reviews), 0);
        let (s, v) = g.revoke(&tid);
        assert_eq!(s, 200, "{v}");
        let shown = g.show(&tid);
        let json = reviews.join("reserved").join(format!("{tid}.json"));
        if stored_at_once {
            assert_eq!(shown["review"], "stored", "{shown}\n{}", g.log());
            for ext in ["json", "txt", "sql", "html"] {
                let p = reviews.join("reserved").join(format!("{tid}.{ext}"));
                assert!(
                    std::fs::metadata(&p).map(|m| m.len() > 0).unwrap_or(false),
                    "{ext}"
                );
                let reserve = reviews
                    .join("reserved")
                    .join(format!("{tid}.{ext}.reserve"));
                assert!(!reserve.exists(), "the reserve became the review");
            }
            let text = std::fs::read_to_string(&json).expect("stored");
            assert!(text.contains("the change"), "{text}");
        } else {
            let review = shown["review"].as_str().unwrap_or("").to_string();
            assert!(review.starts_with("failed: "), "{shown}");
            assert_eq!(shown["backend"], true, "{shown}");
            // Room again: the janitor stores it.
            std::fs::remove_file(reviews.join("fill")).expect("rm fill");
            let (s, rep) = g.raw_call("POST", "/v1/reap", None);
            assert_eq!(s, 200, "{rep}");
            assert_eq!(g.show(&tid)["review"], "stored", "{rep}");
            assert!(std::fs::read_to_string(&json)
                .expect("stored")
                .contains("the change"));
        }
        let _ = std::fs::remove_file(reviews.join("fill"));
    }
}

//! The warm pool: forks kept ready, claimed by a token's first connection, refilled, and
//! never left behind.

use crate::support::harness;

use std::time::Duration;

use crate::support::harness::{psql, wait_until, Gateway, SMALL_GOLDEN};

fn tags(g: &Gateway) -> Vec<(String, String)> {
    let Ok(rd) = std::fs::read_dir(g.instances_dir()) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let tag: serde_json::Value =
                serde_json::from_slice(&std::fs::read(e.path().join("sandpit-tag.json")).ok()?)
                    .ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                tag["token_id"].as_str()?.to_string(),
            ))
        })
        .collect()
}

#[test]
fn first_connection_claims_a_ready_fork_and_the_pool_refills() {
    let mut g = Gateway::start(Some(SMALL_GOLDEN), Some("[pool]\nsize = 2\n"));
    let ready = |g: &Gateway| {
        tags(g)
            .iter()
            .filter(|(_, t)| t.starts_with("pool-"))
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(30), || ready(&g) == 2),
        "pool did not fill: {:?}",
        tags(&g)
    );

    let t = g.issue("pooled", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let (ok, out, err) = psql(
        t["dsn"].as_str().expect("dsn"),
        &["-c", "select count(*) from items"],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "1000");
    assert!(g.log().contains("method=pool("), "{}", g.log());
    // The claimed member carries the token's tag soon (re-tagged after the claim's record,
    // off the first query's path); the pool refills to two.
    let claimed_by = |g: &Gateway| -> Vec<String> {
        tags(g)
            .into_iter()
            .filter(|(_, t)| t == &id)
            .map(|(h, _)| h)
            .collect()
    };
    assert!(
        wait_until(Duration::from_secs(30), || claimed_by(&g).len() == 1),
        "{:?}",
        tags(&g)
    );
    let claimed = claimed_by(&g);
    assert!(claimed[0].starts_with("pool-"));
    assert!(
        wait_until(Duration::from_secs(30), || ready(&g) == 2),
        "pool did not refill: {:?}",
        tags(&g)
    );
    assert_eq!(g.show(&id)["fork_count"], 1);

    // Revoke destroys the claimed member; shutdown destroys the unclaimed ones.
    let (s, _) = g.revoke(&id);
    assert_eq!(s, 200);
    assert!(!g.instances_dir().join(&claimed[0]).exists());
    g.stop();
    assert!(tags(&g).is_empty(), "left behind: {:?}", tags(&g));
}

/// A `/metrics` gauge (0 when absent).
fn gauge(g: &Gateway, name: &str) -> f64 {
    harness::metrics(&g.api).get(name).copied().unwrap_or(0.0)
}

/// Waits until `n` pool members are ready.
fn wait_ready(g: &Gateway, n: f64, why: &str) {
    assert!(
        wait_until(Duration::from_secs(120), || gauge(g, "sandpit_pool_ready")
            == n),
        "{why}: ready {} target {}",
        gauge(g, "sandpit_pool_ready"),
        gauge(g, "sandpit_pool_target")
    );
}

/// `n` tokens issued one after another, tasks `prefix-0` …
fn issue_all(g: &Gateway, prefix: &str, n: usize) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| g.issue(&format!("{prefix}-{i}"), 600))
        .collect()
}

/// Each token's first query, all at once (a thread each); their outputs, in token order.
fn first_queries_at_once(tokens: &[serde_json::Value], sql: &str) -> Vec<String> {
    let clients: Vec<_> = tokens
        .iter()
        .map(|t| {
            let dsn = t["dsn"].as_str().expect("dsn").to_string();
            let sql = sql.to_string();
            std::thread::spawn(move || psql(&dsn, &["-c", &sql]))
        })
        .collect();
    clients
        .into_iter()
        .map(|c| {
            let (ok, out, err) = c.join().expect("client thread");
            assert!(ok, "{err}");
            out.trim().to_string()
        })
        .collect()
}

#[test]
fn a_burst_of_first_connections_grows_the_pool_which_then_returns_to_its_size() {
    // A short half-life so the demand decays within the test; growth is judged by the
    // gauges, never by how long anything took.
    let mut g = Gateway::start(
        Some(SMALL_GOLDEN),
        Some("[pool]\nsize = 1\nmax_size = 3\ndemand_half_life = \"20s\"\n"),
    );
    wait_ready(&g, 1.0, "pool did not fill");
    assert_eq!(gauge(&g, "sandpit_pool_target"), 1.0);

    // Six first connections at once: the demand (6) is above the standing size.
    let tokens = issue_all(&g, "burst", 6);
    first_queries_at_once(&tokens, "select 1");
    assert_eq!(
        gauge(&g, "sandpit_pool_target"),
        3.0,
        "the ceiling bounds the target"
    );
    // The pool refills past its standing size, toward the ceiling.
    let mut peak = 0.0f64;
    assert!(
        wait_until(Duration::from_secs(120), || {
            peak = peak.max(gauge(&g, "sandpit_pool_ready"));
            peak >= 2.0
        }),
        "the pool never grew above its size: target {}",
        gauge(&g, "sandpit_pool_target")
    );
    assert!(peak <= 3.0, "above the ceiling: {peak}");

    // As the demand decays, idle members go until the standing size is left.
    assert!(
        wait_until(Duration::from_secs(300), || {
            gauge(&g, "sandpit_pool_target") == 1.0 && gauge(&g, "sandpit_pool_ready") == 1.0
        }),
        "the pool did not shrink back: ready {} target {}",
        gauge(&g, "sandpit_pool_ready"),
        gauge(&g, "sandpit_pool_target")
    );
    // A destroyed member's directory is removed in the background: wait for it to go.
    let members = |g: &Gateway| {
        tags(g)
            .iter()
            .filter(|(_, t)| t.starts_with("pool-"))
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(60), || members(&g) == 1),
        "{:?}",
        tags(&g)
    );
    for t in &tokens {
        g.revoke(t["id"].as_str().expect("id"));
    }
    g.stop();
    assert!(tags(&g).is_empty(), "left behind: {:?}", tags(&g));
}

/// Steps of a warm claim on `instance`, in order (see `Gateway::record_claim`).
const CLAIM_STEPS: [&str; 4] = [
    "claim:taken",
    "claim:journaled",
    "claim:committed",
    "claim:retagged",
];

/// The backend a token's record names on disk: its file, or a claim journaled since (the
/// journal is applied to the files at start).
fn recorded_backend(g: &Gateway, id: &str) -> Option<String> {
    let dir = g.data_dir.join("tokens");
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{id}.json"))).expect("token file"))
            .expect("token json");
    let journaled = std::fs::read_to_string(dir.join("claims.log"))
        .unwrap_or_default()
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["token"] == id)
        .find_map(|l| l["backend"].as_str().map(str::to_string));
    rec["backend"].as_str().map(str::to_string).or(journaled)
}

#[test]
fn a_gateway_killed_at_any_step_of_a_claim_leaves_each_member_the_pools_or_the_tokens() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = harness::tempdir();
    let dir = tmp.path();
    let config = "[pool]\nsize = 1\n[janitor]\ninterval = \"0s\"\n";
    let pool_members = |g: &Gateway| -> Vec<String> {
        tags(g)
            .into_iter()
            .filter(|(_, t)| t.starts_with("pool-"))
            .map(|(h, _)| h)
            .collect()
    };
    for (i, step) in CLAIM_STEPS.iter().enumerate() {
        let mut g = Gateway::start_in_with(
            dir,
            Some(SMALL_GOLDEN),
            Some(config),
            &[],
            &[("SANDPIT_TEST_CRASH_AT", step)],
        );
        assert!(
            wait_until(Duration::from_secs(60), || pool_members(&g).len() == 1),
            "{step}: pool did not fill: {:?}",
            tags(&g)
        );
        let member = pool_members(&g).remove(0);
        let t = g.issue(&format!("claim-{i}"), 600);
        let id = t["id"].as_str().expect("id").to_string();
        // The gateway dies in this first connection's claim (or just after its answer).
        let _ = psql(t["dsn"].as_str().expect("dsn"), &["-c", "select 1"]);
        let mut child = g.child.take().expect("child");
        let status = harness::wait_exit(&mut child, Duration::from_secs(120)).expect("exited");
        assert_eq!(status.signal(), Some(9), "{step}: {status:?}");
        assert!(
            g.log().contains(&format!("step=\"{step}\"")),
            "{step}: not reached"
        );
        drop(g);

        let mut g = Gateway::start_in(dir, Some(SMALL_GOLDEN), Some(config));
        let recorded = recorded_backend(&g, &id);
        let member_tag = tags(&g).into_iter().find(|(h, _)| h == &member);
        if *step == "claim:taken" {
            // Nothing was written: the member is the pool's, destroyed at start as stale.
            assert_eq!(recorded, None, "{step}");
            assert!(
                !g.instances_dir().join(&member).exists(),
                "{step}: left behind"
            );
        } else {
            // The journal line survived the kill: the member is the token's and only its.
            assert_eq!(recorded.as_deref(), Some(member.as_str()), "{step}");
            assert_eq!(
                member_tag.map(|(_, t)| t).as_deref(),
                Some(id.as_str()),
                "{step}: the member carries the token's tag, not the pool's"
            );
        }
        // The token works, on the member it was recorded with, forked once.
        let (ok, out, err) = psql(
            &harness::redial(&t, &g),
            &["-c", "select count(*) from items"],
        );
        assert!(ok, "{step}: {err}");
        assert_eq!(out.trim(), "1000");
        let now = recorded_backend(&g, &id).expect("a backend after connecting");
        if recorded.is_some() {
            assert_eq!(now, member, "{step}: the claimed member was replaced");
        }
        assert_eq!(g.show(&id)["fork_count"], 1, "{step}");
        // Never claimed twice: the next token gets another backend.
        assert!(
            wait_until(Duration::from_secs(60), || pool_members(&g).len() == 1),
            "{step}: pool did not refill"
        );
        let t2 = g.issue(&format!("claim-{i}-next"), 600);
        let id2 = t2["id"].as_str().expect("id").to_string();
        let (ok, _, err) = psql(t2["dsn"].as_str().expect("dsn"), &["-c", "select 1"]);
        assert!(ok, "{step}: {err}");
        let other = recorded_backend(&g, &id2).expect("second token's backend");
        assert_ne!(other, now, "{step}: one member given to two tokens");
        // None lost: revoking both and stopping leaves no tagged backend behind.
        for tid in [&id, &id2] {
            let (s, v) = g.revoke(tid);
            assert_eq!(s, 200, "{step}: {v}");
        }
        g.stop();
        assert!(tags(&g).is_empty(), "{step}: left behind: {:?}", tags(&g));
    }
}

/// The instance directories whose tag names token `id`.
fn backends_of(g: &Gateway, id: &str) -> Vec<String> {
    tags(g)
        .into_iter()
        .filter(|(_, t)| t == id)
        .map(|(h, _)| h)
        .collect()
}

#[test]
fn first_connections_that_find_the_pool_empty_take_the_fillers_next_members() {
    // One member ready, four first connections at once, no growth: the three that find
    // nothing ready wait for the members the filler forks next (named `pool-…`), rather
    // than each forking a backend of its own (named by its token) beside the filler's.
    let mut g = Gateway::start(Some(SMALL_GOLDEN), Some("[pool]\nsize = 1\nmax_size = 1\n"));
    wait_ready(&g, 1.0, "pool did not fill");
    let tokens = issue_all(&g, "empty", 4);
    for out in first_queries_at_once(&tokens, "select count(*) from items") {
        assert_eq!(out, "1000");
    }
    for t in &tokens {
        let id = t["id"].as_str().expect("id");
        assert!(
            wait_until(Duration::from_secs(30), || backends_of(&g, id).len() == 1),
            "{id}: {:?}",
            tags(&g)
        );
        let b = backends_of(&g, id);
        assert!(b[0].starts_with("pool-"), "{id} forked its own: {b:?}");
        assert_eq!(g.show(id)["fork_count"], 1);
    }
    // The pool is back to its one member, and nothing else was forked.
    wait_ready(&g, 1.0, "pool did not refill");
    assert_eq!(tags(&g).len(), 5, "{:?}", tags(&g));
    for t in &tokens {
        g.revoke(t["id"].as_str().expect("id"));
    }
    g.stop();
    assert!(tags(&g).is_empty(), "left behind: {:?}", tags(&g));
}

#[test]
fn new_tokens_grow_the_pool_before_their_first_connection() {
    // Demand is counted when a token is issued: three tokens, no connection yet, and the
    // pool grows toward three members; their first connections then claim them, and count
    // no second time (the target stays three).
    let mut g = Gateway::start(
        Some(SMALL_GOLDEN),
        Some("[pool]\nsize = 1\nmax_size = 6\ndemand_half_life = \"10m\"\n"),
    );
    wait_ready(&g, 1.0, "pool did not fill");
    let tokens = issue_all(&g, "ahead", 3);
    assert_eq!(gauge(&g, "sandpit_pool_target"), 3.0);
    wait_ready(
        &g,
        3.0,
        "the pool did not grow ahead of the first connections",
    );
    first_queries_at_once(&tokens, "select 1");
    assert_eq!(gauge(&g, "sandpit_pool_target"), 3.0);
    for t in &tokens {
        let id = t["id"].as_str().expect("id");
        assert!(
            wait_until(Duration::from_secs(30), || backends_of(&g, id).len() == 1),
            "{id}: {:?}",
            tags(&g)
        );
        assert!(backends_of(&g, id)[0].starts_with("pool-"));
        g.revoke(id);
    }
    g.stop();
    assert!(tags(&g).is_empty(), "left behind: {:?}", tags(&g));
}

//! The warm pool: forks kept ready, claimed by a token's first connection, refilled, and
//! never left behind.

mod common;

use std::time::Duration;

use common::{psql, wait_until, Gateway, SMALL_GOLDEN};

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
    // The claimed member now carries the token's tag; the pool refills to two.
    let claimed: Vec<String> = tags(&g)
        .into_iter()
        .filter(|(_, t)| t == &id)
        .map(|(h, _)| h)
        .collect();
    assert_eq!(claimed.len(), 1, "{:?}", tags(&g));
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
    common::metrics(&g.api).get(name).copied().unwrap_or(0.0)
}

#[test]
fn a_burst_of_first_connections_grows_the_pool_which_then_returns_to_its_size() {
    // A short half-life so the demand decays within the test; growth is judged by the
    // gauges, never by how long anything took.
    let mut g = Gateway::start(
        Some(SMALL_GOLDEN),
        Some("[pool]\nsize = 1\nmax_size = 3\ndemand_half_life = \"20s\"\n"),
    );
    assert!(
        wait_until(Duration::from_secs(60), || gauge(&g, "sandpit_pool_ready")
            == 1.0),
        "pool did not fill"
    );
    assert_eq!(gauge(&g, "sandpit_pool_target"), 1.0);

    // Six first connections at once: the demand (6) is above the standing size.
    let tokens: Vec<_> = (0..6)
        .map(|i| g.issue(&format!("burst-{i}"), 600))
        .collect();
    let clients: Vec<_> = tokens
        .iter()
        .map(|t| {
            let dsn = t["dsn"].as_str().expect("dsn").to_string();
            std::thread::spawn(move || psql(&dsn, &["-c", "select 1"]))
        })
        .collect();
    for c in clients {
        let (ok, _, err) = c.join().expect("client thread");
        assert!(ok, "{err}");
    }
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

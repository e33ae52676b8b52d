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

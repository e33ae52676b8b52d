//! A burst of first connections on the `template` provider's warm pool: the claims' re-tags
//! are queued and written together on the kept admin session (`src/provider/template/
//! retag.rs`), so each member's record must still end up with its own token's tag, no claim
//! may fall back to a cold fork, and a janitor pass must keep every claimed database.

use crate::support::shared_pg;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::support::harness::{connect, Gateway, SMALL_GOLDEN};
use serde_json::Value;

const N: usize = 6;

fn dsn(v: &Value) -> String {
    v["dsn"].as_str().expect("dsn").to_string()
}

fn id(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

/// `pool-…` databases on the shared server with the token id of their recorded tag.
async fn members(pg: &shared_pg::SharedPg) -> Vec<(String, Option<String>)> {
    let c = pg.admin("postgres").await;
    c.query(
        "select d.datname::text, b.tag from pg_database d \
         left join sandpit_template.backends b on b.handle = d.datname \
         where d.datname like 'pool-%' order by 1",
        &[],
    )
    .await
    .expect("list pool databases")
    .iter()
    .map(|r| {
        let tag: Option<String> = r.get(1);
        let token = tag
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["token_id"].as_str().map(str::to_string));
        (r.get(0), token)
    })
    .collect()
}

#[test]
fn concurrent_claims_each_get_their_own_member_tagged_with_their_own_token() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let cfg = format!(
        "provider = \"template\"\n[template]\nadmin_dsn = \"{}\"\ngolden = \"sandpit_golden\"\n\
         sslmode = \"require\"\n[pool]\nsize = {N}\n[janitor]\ninterval = \"0s\"\n",
        pg.admin_dsn()
    );
    let mut g = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(120);
        while members(&pg).await.len() < N {
            assert!(Instant::now() < deadline, "pool did not fill\n{}", g.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let tokens: Vec<Value> = (0..N)
            .map(|i| g.issue(&format!("claim-{i}"), 600))
            .collect();
        // All first connections at once, so their claims queue together.
        let sessions = futures_util::future::join_all(tokens.iter().map(|t| async move {
            let c = connect(&dsn(t)).await.expect("connect");
            let db: String = c
                .query_one("select current_database()::text", &[])
                .await
                .expect("query")
                .get(0);
            (id(t), db, c)
        }))
        .await;
        let dbs: HashSet<&str> = sessions.iter().map(|(_, db, _)| db.as_str()).collect();
        assert_eq!(dbs.len(), N, "two tokens on one database: {dbs:?}");
        assert!(
            !g.log().contains("claiming a pool member failed"),
            "{}",
            g.log()
        );
        let now = members(&pg).await;
        for (token, db, _) in &sessions {
            assert!(db.starts_with("pool-"), "{token} forked cold: {db}");
            let tagged: Vec<_> = now.iter().filter(|(name, _)| name == db).collect();
            assert_eq!(tagged.len(), 1, "{db}: {now:?}");
            assert_eq!(
                tagged[0].1.as_deref(),
                Some(token.as_str()),
                "{db}: {now:?}"
            );
        }
        // The janitor reads the tags: every claimed database is kept.
        let (status, report) = g.raw_call("POST", "/v1/reap", None);
        assert_eq!(status, 200, "{report}");
        for (token, _, c) in &sessions {
            c.simple_query("select 1")
                .await
                .unwrap_or_else(|e| panic!("{token}'s backend did not survive the janitor: {e}"));
        }
        drop(sessions);
        for t in &tokens {
            assert_eq!(g.revoke(&id(t)).0, 200);
        }
    });
    g.stop();
}

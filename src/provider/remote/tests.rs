//! Unit tests of the `remote` provider that need no sandbox service.

use super::*;

#[test]
fn url_encoding_and_ids() {
    assert_eq!(url_encode("sandpit.owner=a b"), "sandpit.owner%3Da%20b");
    assert!(api::valid_id("sbx-1.a_b"));
    assert!(!api::valid_id("../x"));
    assert!(!api::valid_id(""));
    assert!(!api::valid_id(".."));
}

#[tokio::test]
async fn unreachable_service_fails_fast_after_the_retries() {
    // A port nothing listens on: connect errors, retried twice with backoff, then an error.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let p = RemoteProvider::new(RemoteConfig {
        url: format!("http://127.0.0.1:{port}/"),
        api_key: None,
        golden: "g".into(),
        owner: "o".into(),
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        fork_timeout: Duration::from_secs(10),
        retries: 2,
        ttl_grace: Duration::from_secs(60),
        sslmode: SslMode::Require,
        ca_file: None,
    })
    .unwrap();
    let tag = BackendTag {
        token_id: "sp_x".into(),
        task: "t".into(),
        expires_at: "2030-01-01T00:00:00Z".into(),
        gateway_id: String::new(),
        golden: None,
    };
    let t0 = Instant::now();
    let e = p.fork(&tag).await.unwrap_err().to_string();
    assert!(e.contains("after 3 attempts"), "{e}");
    // Backoff 200 ms + 400 ms between the three attempts.
    assert!(
        t0.elapsed() >= Duration::from_millis(600),
        "{:?}",
        t0.elapsed()
    );
}

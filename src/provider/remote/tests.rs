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

/// A one-connection-at-a-time HTTP server answering every request with `reply` (or, when
/// None, reading the request and never answering).
async fn canned(reply: Option<&'static str>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            match reply {
                Some(r) => {
                    let _ = s.write_all(r.as_bytes()).await;
                }
                None => tokio::time::sleep(Duration::from_secs(30)).await,
            }
        }
    });
    port
}

fn provider_at(port: u16) -> RemoteProvider {
    RemoteProvider::new(RemoteConfig {
        url: format!("http://127.0.0.1:{port}/"),
        api_key: None,
        golden: "g".into(),
        owner: "o".into(),
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(10),
        fork_timeout: Duration::from_secs(10),
        retries: 2,
        ttl_grace: Duration::from_secs(60),
        sslmode: SslMode::Disable,
        ca_file: None,
    })
    .unwrap()
}

#[tokio::test]
async fn capacity_answers_are_read_bounded_in_time() {
    let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 61\r\nconnection: close\r\n\r\n\
              {\"max_sandboxes\":4,\"sandboxes\":1,\"warm\":2,\"draining\":false}  ";
    let c = provider_at(canned(Some(ok)).await)
        .capacity(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        c,
        Some(api::Capacity {
            max_sandboxes: 4,
            sandboxes: 1,
            warm: 2,
            draining: false
        })
    );
    // A service without the route: no report, not an error.
    let nf = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    let c = provider_at(canned(Some(nf)).await)
        .capacity(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(c, None);
    // A broken answer and a 500 are errors (and a 500 is not retried).
    let bad = "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nnope!";
    let e = provider_at(canned(Some(bad)).await)
        .capacity(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("bad response"), "{e}");
    let ise = "HTTP/1.1 500 Oops\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    let t0 = Instant::now();
    let e = provider_at(canned(Some(ise)).await)
        .capacity(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("500"), "{e}");
    assert!(
        t0.elapsed() < Duration::from_millis(150),
        "{:?}",
        t0.elapsed()
    );
    // A service that never answers: an error when the bound passes, not at the request
    // timeout (10 s here).
    let t0 = Instant::now();
    let e = provider_at(canned(None).await)
        .capacity(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no answer within 300 ms"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

//! Hardening against a hostile agent on the same host (issue 14): failed logins from one
//! address never lock out a valid token, startup `options` are split the way Postgres splits
//! them, the data dir is private, and a token's new sessions are paced (issue 30). With
//! `databases` set, a database name the gateway does not serve is refused like a server's.

use crate::support::harness;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use crate::support::harness::{Gateway, SMALL_GOLDEN};
use serde_json::Value;

/// Strict database names too (`databases`): only what the DSN says, and the user name.
const CONFIG: &str =
    "databases = [\"sandpit\"]\n[limits]\nauth_failures_per_minute = 5\n[review]\non_end = true\n";

fn gw() -> &'static Gateway {
    static G: OnceLock<&'static Gateway> = OnceLock::new();
    G.get_or_init(|| {
        harness::process_gateway(|| {
            let dir = harness::reused_dir(
                "hardening-gateway",
                &[
                    "tokens",
                    "pg/instances",
                    "gateway.log",
                    "logs",
                    "reviews",
                    "tls",
                ],
            );
            Gateway::start_in(&dir, Some(SMALL_GOLDEN), Some(CONFIG))
        })
    })
}

fn dsn(v: &Value) -> String {
    v["dsn"].as_str().expect("dsn").to_string()
}

fn token_id(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

/// The token's secret, from its DSN.
fn secret(v: &Value) -> String {
    let d = dsn(v);
    d.split("://")
        .nth(1)
        .and_then(|s| s.split('@').next())
        .and_then(|s| s.split(':').nth(1))
        .expect("secret in dsn")
        .to_string()
}

/// Log in from 127.0.0.1 as `user` with `password`; Ok(value of `SELECT 1`) or the SQLSTATE
/// and message.
async fn login(user: &str, password: &str) -> Result<i32, (String, String)> {
    harness::login_at(gw().pg_port, user, password).await
}

/// A token id that does not exist (well-formed, so it reaches the registry lookup).
fn made_up_id(i: usize) -> String {
    let alphabet = b"abcdefghijklmnopqrstuvwxyz234567";
    let tail: String = (0..20)
        .map(|k| alphabet[(i * 7 + k * 13) % 32] as char)
        .collect();
    format!("sp_{tail}")
}

#[test]
fn thirty_failed_logins_from_an_address_do_not_lock_out_a_valid_token() {
    let t = gw().issue("hardening-valid", 600);
    let (id, secret) = (token_id(&t), secret(&t));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        // 30 failures from 127.0.0.1, all at once (failures past the limit are answered
        // late): made-up ids over SCRAM and as a cleartext whole token, and wrong secrets
        // for the real id over SCRAM and cleartext.
        let wrong = "A".repeat(43);
        let mut attempts = Vec::new();
        for i in 0..30 {
            let (user, password) = match i % 4 {
                0 => (made_up_id(i), wrong.clone()),
                1 => ("agent".to_string(), format!("{}.{wrong}", made_up_id(i))),
                2 => (id.clone(), wrong.clone()),
                _ => ("agent".to_string(), format!("{id}.{wrong}")),
            };
            attempts.push(tokio::spawn(async move { login(&user, &password).await }));
        }
        let mut limited = 0;
        for (i, a) in attempts.into_iter().enumerate() {
            match a.await.expect("attempt task") {
                Ok(v) => panic!("failed login {i} got in: {v}"),
                Err((code, msg)) => {
                    assert!(
                        code == "28P01" || code == "28000",
                        "attempt {i}: {code} {msg}"
                    );
                    if msg.contains("too many authentication failures") {
                        limited += 1;
                    }
                }
            }
        }
        assert!(limited > 0, "the limiter never engaged");

        // The valid token, from the same address, over SCRAM and as a cleartext whole token.
        assert_eq!(login(&id, &secret).await, Ok(1));
        assert_eq!(login("agent", &format!("{id}.{secret}")).await, Ok(1));
        // And failures go on being limited.
        let (code, msg) = login(&made_up_id(99), &wrong)
            .await
            .expect_err("made-up id");
        assert_eq!(code, "28000", "{msg}");
    });
    let m = harness::metrics(&gw().api);
    let n = m
        .iter()
        .find(|(k, _)| k.starts_with("sandpit_auth_rate_limited_total"))
        .map(|(_, v)| *v)
        .unwrap_or(0.0);
    assert!(n >= 1.0, "sandpit_auth_rate_limited_total is {n}");
}

/// `POST /mcp` with `bearer`: the status and the JSON-RPC error message, if any.
fn mcp_status(bearer: &str) -> (u16, String) {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let url = format!("{}/mcp", gw().api);
    let res = harness::http("POST", &url, Some(bearer), harness::Body::Json(body));
    let (status, v): (u16, Value) = match res {
        Ok(r) => (
            r.status,
            serde_json::from_str(&r.body).unwrap_or(Value::Null),
        ),
        Err(e) => panic!("POST /mcp: {e}"),
    };
    let msg = v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (status, msg)
}

#[test]
fn mcp_and_postgres_failures_share_one_limiter_budget() {
    let t = gw().issue("hardening-mcp-limit", 600);
    let (id, secret) = (token_id(&t), secret(&t));
    let wrong = format!("{id}.{}", "B".repeat(43));
    // Wrong secrets for this token over MCP only: past the limit (5 a minute) they are
    // answered late and told so.
    let mut limited = false;
    for i in 0..8 {
        let (status, msg) = mcp_status(&wrong);
        assert_eq!(status, 401, "attempt {i}: {msg}");
        limited |= msg.contains("too many authentication failures");
    }
    assert!(limited, "MCP failures never reached the limiter");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        // The same budget over Postgres: a wrong secret for the token is limited at once.
        let (code, msg) = login(&id, &"B".repeat(43)).await.expect_err("wrong secret");
        assert_eq!(code, "28000", "{msg}");
        assert!(msg.contains("too many authentication failures"), "{msg}");
        // The right secret always passes, both ways.
        assert_eq!(login(&id, &secret).await, Ok(1));
    });
    assert_eq!(mcp_status(&format!("{id}.{secret}")).0, 200);
}

#[test]
fn options_hidden_behind_a_vertical_tab_or_control_byte_are_refused() {
    let t = gw().issue("hardening-options", 600);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let with_options = |options: &'static str| {
            let mut cfg: tokio_postgres::Config = dsn(&t).parse().expect("dsn");
            cfg.options(options);
            async move {
                match cfg.connect(tokio_postgres::NoTls).await {
                    Ok((c, conn)) => {
                        tokio::spawn(conn);
                        c.query_one("SELECT current_setting('statement_timeout')", &[])
                            .await
                            .map(|r| r.get::<_, String>(0))
                            .map_err(|e| harness::sqlstate(&e))
                    }
                    Err(e) => Err(harness::sqlstate(&e)),
                }
            }
        };
        for bad in [
            "\x0b-crole=postgres",
            "-c\x0brole=postgres",
            "\x01-c statement_timeout=1s",
        ] {
            assert_eq!(with_options(bad).await, Err("42501".into()), "{bad:?}");
        }
        // Postgres splits on \v too, so an ordinary setting after one still works.
        assert_eq!(
            with_options("-c\x0bstatement_timeout=1234").await,
            Ok("1234ms".into())
        );
    });
}

/// Permission bits of `p` (not following a link).
fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .mode()
        & 0o7777
}

#[test]
fn the_data_dir_is_private() {
    let g = gw();
    let t = g.issue("hardening-perms", 600);
    let id = token_id(&t);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let c = harness::connect(&dsn(&t)).await.expect("connect");
        c.batch_execute("insert into items values (100001, 'perms')")
            .await
            .expect("insert");
    });
    // Revoking stores the review (review.on_end) before the backend goes.
    let (status, v) = g.revoke(&id);
    assert!(status < 300, "{status} {v}");
    let d = &g.data_dir;
    let review = d.join("reviews/hardening-perms").join(format!("{id}.sql"));
    assert!(
        harness::wait_until(Duration::from_secs(60), || review.exists()),
        "no stored review at {}",
        review.display()
    );

    // The data dir only lets the Postgres user through to pg/ (searchable, not listable).
    assert_eq!(mode(d), 0o711, "data dir");
    for dir in [
        "tokens",
        "logs",
        "logs/hardening-perms",
        "tls",
        "reviews",
        "reviews/hardening-perms",
    ] {
        assert_eq!(mode(&d.join(dir)), 0o700, "{dir}/");
    }
    let mut files = vec![
        d.join("admin.key"),
        d.join("tls/key.pem"),
        d.join("tls/cert.pem"),
        d.join("tokens").join(format!("{id}.json")),
        d.join("logs/hardening-perms").join(format!("{id}.jsonl")),
    ];
    for entry in std::fs::read_dir(d.join("reviews/hardening-perms")).expect("reviews") {
        files.push(entry.expect("entry").path());
    }
    for f in files {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
}

/// A token logging in over and over is paced, another token is not: past its burst a new
/// session waits its turn (it still gets in), and one whose turn is further away than the
/// startup timeout is refused with 53300 at once, costing the scratch server nothing.
#[test]
fn a_token_logging_in_in_a_loop_is_paced_and_another_token_is_not() {
    // One new session a second after a burst of one; a session waits at most 2 s.
    let cfg = "[limits]\nsessions_per_second = 1\nsession_burst = 1\nstartup_timeout = \"2s\"\n";
    let g = Gateway::start(Some(SMALL_GOLDEN), Some(cfg));
    let flood = g.issue("pace-flood", 600);
    let other = g.issue("pace-other", 600);
    let whole = |t: &Value| format!("{}.{}", token_id(t), secret(t));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    let port = g.pg_port;
    let (first, results, other_login) = rt.block_on(async {
        // The burst: straight in.
        let first = harness::login_at(port, "agent", &whole(&flood)).await;
        // Eight at once: turns one second apart. Unless they arrive more than six seconds
        // apart, some turn is more than 2 s away.
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let pw = whole(&flood);
            tasks.push(tokio::spawn(async move {
                harness::login_at(port, "agent", &pw).await
            }));
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.expect("login task"));
        }
        let other_login = harness::login_at(port, "agent", &whole(&other)).await;
        (first, results, other_login)
    });
    assert_eq!(first, Ok(1), "the first session is within the burst");
    let admitted = results.iter().filter(|r| r == &&Ok(1)).count();
    let refused: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    for (state, msg) in &refused {
        assert_eq!(state, "53300", "{msg}");
        assert!(msg.contains("sessions_per_second is 1"), "{msg}");
    }
    assert_eq!(admitted + refused.len(), 8, "{results:?}");
    assert!(
        admitted >= 1,
        "a session over the pace waits its turn: {results:?}"
    );
    assert!(
        !refused.is_empty(),
        "turns past the startup timeout are refused: {results:?}"
    );
    assert_eq!(other_login, Ok(1), "another token is not paced by this one");
    let m = harness::metrics(&g.api);
    let paced = |outcome: &str| {
        m.get(&format!(
            "sandpit_sessions_paced_total{{outcome=\"{outcome}\"}}"
        ))
        .copied()
        .unwrap_or(0.0) as usize
    };
    // Every admitted one waited, unless it arrived after its turn had come.
    assert!(paced("waited") >= 1 && paced("waited") <= admitted, "{m:?}");
    assert_eq!(paced("refused"), refused.len(), "{m:?}");
}

/// With `databases = ["sandpit"]`, another database name is refused after authentication
/// with 3D000, the user name (libpq's default) and the configured name are served, and the
/// refusal costs no one else anything.
#[test]
fn a_database_name_not_served_is_refused_like_a_servers() {
    let g = gw();
    let t = g.issue("dbnames-strict", 600);
    let id = token_id(&t);
    let whole = format!("{id}.{}", secret(&t));
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let at = |user: String, password: String, db: &'static str| {
            let mut cfg = tokio_postgres::Config::new();
            cfg.host("127.0.0.1")
                .port(g.pg_port)
                .user(&user)
                .password(&password)
                .dbname(if db.is_empty() { &user } else { db });
            async move { harness::select_1_on(cfg.connect(tokio_postgres::NoTls).await).await }
        };
        let bystander = harness::login_at(g.pg_port, "agent", &whole).await;
        assert_eq!(bystander, Ok(1));
        for db in ["nosuchdb", "postgres", "template1", "Sandpit"] {
            assert_eq!(
                at(id.clone(), secret(&t), db).await,
                Err("3D000".into()),
                "{db}"
            );
        }
        assert_eq!(at(id.clone(), secret(&t), "sandpit").await, Ok(()));
        assert_eq!(
            at(id.clone(), secret(&t), "").await,
            Ok(()),
            "the user name"
        );
        assert_eq!(harness::login_at(g.pg_port, "agent", &whole).await, Ok(1));
    });
}

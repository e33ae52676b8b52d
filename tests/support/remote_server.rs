//! A small sandbox service implementing `docs/remote-provider.yaml`, for the `remote`
//! provider's tests. Its sandboxes are real forks of the `instance` provider. Those listen on
//! a unix socket only (by design: no TCP, often inside an empty network namespace), so each
//! sandbox gets a TCP forwarder on 127.0.0.1 that terminates TLS with a self-signed
//! certificate (rcgen) and relays the bytes to the fork's socket. The whole chain therefore
//! carries real Postgres connections: client → gateway → TLS → forwarder → fork.
//!
//! Knobs for failure tests: `fail_next_creates(n)` answers the next n creates with 503;
//! `hang_next_create()` accepts a create whose sandbox never becomes ready.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use nix::sys::signal::Signal;
use sandpit::pg::process;
use sandpit::provider::instance::{InstanceConfig, InstanceProvider};
use sandpit::provider::remote_api::{
    self as api, ApiError, Connection, CreateSandbox, Sandbox, SandboxList, SandboxState, SetTtl,
};
use sandpit::provider::{BackendTag, Provider};
use sandpit::wire::startup::SSL_REQUEST;
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio_rustls::TlsAcceptor;

struct Entry {
    sb: Sandbox,
    forwarder: Option<tokio::task::JoinHandle<()>>,
}

struct Inner {
    provider: InstanceProvider,
    api_key: String,
    acceptor: TlsAcceptor,
    sandboxes: Mutex<HashMap<String, Entry>>,
    by_key: Mutex<HashMap<String, String>>,
    attempts: Mutex<HashMap<String, u32>>,
    deleted_tokens: Mutex<HashSet<String>>,
    fail_creates: AtomicU32,
    hang_next: AtomicBool,
    tls_conns: AtomicU64,
    plain_conns: AtomicU64,
    next: AtomicU64,
}

/// The running service.
pub struct RemoteServer {
    /// Base URL of the API.
    pub url: String,
    /// Bearer key it wants.
    pub api_key: String,
    inner: Arc<Inner>,
    instances: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn err(status: StatusCode, msg: &str) -> Response {
    (status, Json(ApiError { error: msg.into() })).into_response()
}

fn now_plus(secs: u64) -> String {
    (OffsetDateTime::now_utc() + time::Duration::seconds(secs as i64))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

impl RemoteServer {
    /// Builds the golden (instance provider) and serves the API on 127.0.0.1:0.
    pub async fn start(golden_sql: &str) -> RemoteServer {
        let tmp = super::tempdir::tempdir();
        let sql = tmp.path().join("golden.sql");
        std::fs::write(&sql, golden_sql).expect("golden sql");
        let mut srv = RemoteServer::start_at(tmp.path().join("pg"), &sql).await;
        srv._tmp = Some(tmp);
        srv
    }

    /// Serves the API with forks under `root` (an instance provider root: a golden already
    /// built there from the same SQL is reused, as `bench/` does with a gateway's).
    pub async fn start_at(root: PathBuf, golden_sql: &std::path::Path) -> RemoteServer {
        let provider = InstanceProvider::new(InstanceConfig::new(root, golden_sql))
            .await
            .expect("instance provider");
        let instances = provider.real_root().join("instances");
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
            .expect("cert");
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("tls versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .expect("tls config");
        let inner = Arc::new(Inner {
            provider,
            api_key: sandpit::auth::new_secret(),
            acceptor: TlsAcceptor::from(Arc::new(tls)),
            sandboxes: Mutex::new(HashMap::new()),
            by_key: Mutex::new(HashMap::new()),
            attempts: Mutex::new(HashMap::new()),
            deleted_tokens: Mutex::new(HashSet::new()),
            fail_creates: AtomicU32::new(0),
            hang_next: AtomicBool::new(false),
            tls_conns: AtomicU64::new(0),
            plain_conns: AtomicU64::new(0),
            next: AtomicU64::new(1),
        });
        let app = Router::new()
            .route("/v1/sandboxes", get(list).post(create))
            .route("/v1/sandboxes/{id}", get(show).delete(delete))
            .route("/v1/sandboxes/{id}/ttl", put(set_ttl))
            .with_state(inner.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind api");
        let url = format!("http://{}/", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        RemoteServer {
            url,
            api_key: inner.api_key.clone(),
            inner,
            instances,
            _tmp: None,
        }
    }

    /// Whether a sandbox made for this token was deleted through the API.
    pub fn deleted_for_token(&self, token: &str) -> bool {
        lock(&self.inner.deleted_tokens).contains(token)
    }

    /// Create requests seen with this idempotency key (the token id).
    pub fn create_attempts_for(&self, token: &str) -> u32 {
        lock(&self.inner.attempts).get(token).copied().unwrap_or(0)
    }

    /// Answer the next `n` creates with 503 (0 = stop failing).
    pub fn fail_next_creates(&self, n: u32) {
        self.inner.fail_creates.store(n, Ordering::SeqCst);
    }

    /// The next create is accepted but never becomes ready.
    pub fn hang_next_create(&self) {
        self.inner.hang_next.store(true, Ordering::SeqCst);
    }

    /// Forwarded backend connections: (over TLS, plain).
    pub fn connections(&self) -> (u64, u64) {
        (
            self.inner.tls_conns.load(Ordering::SeqCst),
            self.inner.plain_conns.load(Ordering::SeqCst),
        )
    }

    /// How its forks copy the golden (`reflink`, `copy`, …).
    #[allow(dead_code)] // read by examples/bench_backends.rs, not by the tests
    pub fn copy_method(&self) -> String {
        self.inner.provider.copy_method().to_string()
    }

    /// Sandboxes that exist now.
    pub fn sandboxes(&self) -> Vec<Sandbox> {
        lock(&self.inner.sandboxes)
            .values()
            .map(|e| e.sb.clone())
            .collect()
    }
}

impl Drop for RemoteServer {
    /// Forks run in their own sessions and would outlive the test: stop them by pid file.
    fn drop(&mut self) {
        let Ok(rd) = std::fs::read_dir(&self.instances) else {
            return;
        };
        for e in rd.flatten() {
            if let Some(pf) = process::read_pid_file(&e.path().join("data")) {
                process::signal(pf.pid, Signal::SIGQUIT);
                std::thread::sleep(std::time::Duration::from_millis(50));
                process::signal_group(pf.pid, Signal::SIGKILL);
            }
        }
    }
}

fn authorized(st: &Inner, h: &HeaderMap) -> bool {
    h.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {}", st.api_key))
}

async fn create(
    State(st): State<Arc<Inner>>,
    h: HeaderMap,
    Json(req): Json<CreateSandbox>,
) -> Response {
    if !authorized(&st, &h) {
        return err(StatusCode::UNAUTHORIZED, "bad api key");
    }
    let key = h
        .get(api::IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(k) = &key {
        *lock(&st.attempts).entry(k.clone()).or_default() += 1;
    }
    let failing = st
        .fail_creates
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if failing {
        return err(StatusCode::SERVICE_UNAVAILABLE, "try again");
    }
    if let Some(k) = &key {
        if let Some(id) = lock(&st.by_key).get(k) {
            if let Some(e) = lock(&st.sandboxes).get(id) {
                return (StatusCode::OK, Json(e.sb.clone())).into_response();
            }
        }
    }
    let id = format!("sbx-{}", st.next.fetch_add(1, Ordering::SeqCst));
    let sb = Sandbox {
        id: id.clone(),
        golden: req.golden,
        state: SandboxState::Creating,
        metadata: req.metadata,
        expires_at: None,
        connection: None,
        error: None,
        version: None,
    };
    lock(&st.sandboxes).insert(
        id.clone(),
        Entry {
            sb: sb.clone(),
            forwarder: None,
        },
    );
    if let Some(k) = key {
        lock(&st.by_key).insert(k, id.clone());
    }
    if !st.hang_next.swap(false, Ordering::SeqCst) {
        tokio::spawn(fork(st.clone(), id));
    }
    (StatusCode::ACCEPTED, Json(sb)).into_response()
}

/// Forks in the background (the API is asynchronous: clients poll), then starts the forwarder.
async fn fork(st: Arc<Inner>, id: String) {
    let tag = BackendTag {
        token_id: id.clone(),
        task: "remote".into(),
        expires_at: now_plus(3600),
        gateway_id: String::new(),
        golden: None,
    };
    let result = async {
        let b = st.provider.fork(&tag).await.map_err(|e| e.to_string())?;
        let sock = b
            .target
            .socket_path()
            .ok_or("fork has no socket")?
            .to_path_buf();
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        let fw = tokio::spawn(forward(l, sock, st.clone()));
        Ok::<_, String>((b, port, fw))
    }
    .await;
    // Decided under the lock, awaited after it.
    let orphan = {
        let mut all = lock(&st.sandboxes);
        match (all.get_mut(&id), result) {
            (None, Ok((_, _, fw))) => {
                fw.abort();
                true
            }
            (None, Err(_)) => true,
            (Some(e), Ok((b, port, fw))) => {
                e.sb.state = SandboxState::Ready;
                e.sb.connection = Some(Connection {
                    host: "127.0.0.1".into(),
                    port,
                    user: b.target.user.clone(),
                    password: None,
                    database: b.target.database.clone(),
                    sslmode: Some("require".into()),
                });
                e.forwarder = Some(fw);
                false
            }
            (Some(e), Err(msg)) => {
                e.sb.state = SandboxState::Failed;
                e.sb.error = Some(msg);
                false
            }
        }
    };
    if orphan {
        // Deleted while it was being forked.
        let _ = st.provider.destroy(&id).await;
    }
}

async fn forward(l: TcpListener, sock: PathBuf, st: Arc<Inner>) {
    while let Ok((tcp, _)) = l.accept().await {
        let (sock, st) = (sock.clone(), st.clone());
        tokio::spawn(async move {
            let _ = relay(tcp, sock, st).await;
        });
    }
}

async fn relay(mut tcp: TcpStream, sock: PathBuf, st: Arc<Inner>) -> std::io::Result<()> {
    let mut first = [0u8; 8];
    tcp.read_exact(&mut first).await?;
    let mut unix = UnixStream::connect(&sock).await?;
    if u32::from_be_bytes([first[4], first[5], first[6], first[7]]) == SSL_REQUEST {
        tcp.write_all(b"S").await?;
        let mut tls = st.acceptor.accept(tcp).await?;
        st.tls_conns.fetch_add(1, Ordering::SeqCst);
        tokio::io::copy_bidirectional(&mut tls, &mut unix).await?;
    } else {
        st.plain_conns.fetch_add(1, Ordering::SeqCst);
        unix.write_all(&first).await?;
        tokio::io::copy_bidirectional(&mut tcp, &mut unix).await?;
    }
    Ok(())
}

async fn show(State(st): State<Arc<Inner>>, h: HeaderMap, Path(id): Path<String>) -> Response {
    if !authorized(&st, &h) {
        return err(StatusCode::UNAUTHORIZED, "bad api key");
    }
    match lock(&st.sandboxes).get(&id) {
        Some(e) => Json(e.sb.clone()).into_response(),
        None => err(StatusCode::NOT_FOUND, "no such sandbox"),
    }
}

async fn set_ttl(
    State(st): State<Arc<Inner>>,
    h: HeaderMap,
    Path(id): Path<String>,
    Json(req): Json<SetTtl>,
) -> Response {
    if !authorized(&st, &h) {
        return err(StatusCode::UNAUTHORIZED, "bad api key");
    }
    match lock(&st.sandboxes).get_mut(&id) {
        Some(e) => {
            e.sb.expires_at = Some(now_plus(req.ttl_seconds));
            Json(e.sb.clone()).into_response()
        }
        None => err(StatusCode::NOT_FOUND, "no such sandbox"),
    }
}

async fn delete(State(st): State<Arc<Inner>>, h: HeaderMap, Path(id): Path<String>) -> Response {
    if !authorized(&st, &h) {
        return err(StatusCode::UNAUTHORIZED, "bad api key");
    }
    let Some(e) = lock(&st.sandboxes).remove(&id) else {
        return err(StatusCode::NOT_FOUND, "no such sandbox");
    };
    if let Some(fw) = e.forwarder {
        fw.abort();
    }
    if let Err(e) = st.provider.destroy(&id).await {
        return err(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
    }
    if let Some(t) = e.sb.metadata.get(api::META_TOKEN) {
        lock(&st.deleted_tokens).insert(t.clone());
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn list(
    State(st): State<Arc<Inner>>,
    h: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    if !authorized(&st, &h) {
        return err(StatusCode::UNAUTHORIZED, "bad api key");
    }
    let filter = q.get("label").and_then(|l| l.split_once('='));
    let sandboxes = lock(&st.sandboxes)
        .values()
        .filter(|e| match filter {
            Some((k, v)) => e.sb.metadata.get(k).map(String::as_str) == Some(v),
            None => true,
        })
        .map(|e| e.sb.clone())
        .collect();
    Json(SandboxList { sandboxes }).into_response()
}

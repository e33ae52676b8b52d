//! Worker mode (`[worker] listen`): the node runs its own provider (instance forks, golden,
//! warm pool) and serves the sandbox API of `docs/remote-provider.yaml` to front gateways,
//! over TLS with a bearer key. Each ready sandbox gets a TCP door (`relay`) with a password
//! of its own, which fronts use and agents never see. A restart on the same data dir adopts
//! the sandboxes a crashed run left (`adopt`, `keep`). No Postgres listener, no token API:
//! the fronts hold the tokens, logs and reviews (docs/workers.md).

mod adopt;
mod answer;
mod api;
mod goldens;
mod keep;
mod relay;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use time::OffsetDateTime;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::error::ServeError;
use super::run as serve;
use crate::config::Config;
use crate::provider::pool::WarmPool;
use crate::provider::remote_api::Sandbox;
use crate::provider::Provider;
use crate::proxy::tls;

/// Tag of every fork a worker makes (the instance provider keeps it with the fork).
const GATEWAY_ID: &str = "sandpit-worker";
/// How often expired sandboxes are looked for.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// One sandbox: what the API reports, and what the worker holds for it.
pub(super) struct Entry {
    sb: Sandbox,
    /// The provider's handle, once forked.
    handle: Option<String>,
    /// The relay task, once ready.
    door: Option<tokio::task::JoinHandle<()>>,
    /// When the TTL deletes it.
    expires: Option<OffsetDateTime>,
}

impl Entry {
    fn new(sb: Sandbox) -> Entry {
        Entry {
            sb,
            handle: None,
            door: None,
            expires: None,
        }
    }
}

/// The worker's state, shared by the API handlers.
pub(super) struct Worker {
    provider: Arc<dyn Provider>,
    key: String,
    golden: String,
    host: String,
    listen_ip: IpAddr,
    tls: Option<TlsAcceptor>,
    sandboxes: Mutex<HashMap<String, Entry>>,
    by_key: Mutex<HashMap<String, String>>,
    /// Most sandboxes held at once (`worker.max_sandboxes`).
    max_sandboxes: u64,
    /// Set by `POST /v1/drain`: no new sandboxes.
    draining: AtomicBool,
    /// The warm pool, when configured (its ready members are reported as `warm`).
    pool: Option<Arc<WarmPool>>,
    /// Records of ready sandboxes, for adoption after a crash.
    keeper: keep::Keeper,
    /// Door ports of the earlier run on this data dir: no new door takes one.
    old_ports: HashSet<u16>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Worker {
    /// Deletes a sandbox: its door closes, its fork is destroyed. Ok(false): unknown id.
    async fn remove(&self, id: &str) -> Result<bool, String> {
        let Some(e) = lock(&self.sandboxes).remove(id) else {
            return Ok(false);
        };
        lock(&self.by_key).retain(|_, v| v != id);
        if let Err(err) = self.keeper.forget(id) {
            tracing::warn!(sandbox = %id, error = %err, "worker: removing a sandbox record failed");
        }
        if let Some(d) = e.door {
            d.abort();
        }
        if let Some(h) = e.handle {
            self.provider.destroy(&h).await.map_err(|e| e.to_string())?;
        }
        Ok(true)
    }

    /// Deletes every sandbox past its TTL.
    async fn reap_expired(&self) {
        let now = OffsetDateTime::now_utc();
        let due: Vec<String> = lock(&self.sandboxes)
            .iter()
            .filter(|(_, e)| e.expires.is_some_and(|t| t <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            tracing::info!(sandbox = %id, "worker: TTL passed, sandbox deleted");
            if let Err(e) = self.remove(&id).await {
                tracing::warn!(sandbox = %id, error = %e, "worker: deleting an expired sandbox failed");
            }
        }
    }
}

/// Accepts TLS connections for the API; handshakes run on their own tasks, so a slow client
/// delays nobody else.
struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    fn new(l: TcpListener, acceptor: TlsAcceptor, local: SocketAddr) -> TlsListener {
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match l.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "worker API: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (tx, acceptor) = (tx.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let hs = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp));
                    if let Ok(Ok(s)) = hs.await {
                        let _ = tx.send((s, peer)).await;
                    }
                });
            }
        });
        TlsListener { rx, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;
    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept task never ends while the listener lives.
            None => std::future::pending().await,
        }
    }
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Runs a worker until `stop` turns true; then deletes every sandbox it holds.
/// `ready` gets the API's address once it is served.
pub async fn run(
    cfg: Config,
    mut stop: watch::Receiver<bool>,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let (listen, key) = checked(&cfg)?;
    serve::prepare_data_dir(&cfg.data_dir)?;
    let _data_dir_lock = super::lock::lock_data_dir(&cfg.data_dir)?;
    let (listener, addr) = serve::bind(listen).await?;
    let data_dir = cfg
        .data_dir
        .canonicalize()
        .map_err(|source| ServeError::DataDir {
            path: cfg.data_dir.clone(),
            source,
        })?;
    let host = cfg
        .worker
        .host
        .clone()
        .unwrap_or_else(|| addr.ip().to_string());
    let Some(provider) =
        serve::provider_unless_stopped(&cfg, &data_dir, None, None, &mut stop).await?
    else {
        return Ok(());
    };
    let keeper = keep::Keeper::open(&data_dir).map_err(|source| ServeError::DataDir {
        path: data_dir.join("worker/sandboxes"),
        source,
    })?;
    let (to_adopt, old_ports) = adopt::sort_leftovers(provider.as_ref(), &keeper).await;
    let tls =
        tls::acceptor(&cfg.tls, &data_dir, std::slice::from_ref(&host), None)?.map(|t| t.acceptor);
    let pool = cfg.pool.enabled().then(|| {
        WarmPool::new(
            provider.clone(),
            crate::provider::pool_sizing::PoolSizing {
                size: cfg.pool.size,
                max_size: cfg.pool.max_size,
                half_life: cfg.pool.demand_half_life,
                parallel_forks: cfg.pool.parallel_forks,
            },
        )
    });
    let provider: Arc<dyn Provider> = match &pool {
        Some(p) => {
            // A worker keeps no token records: no member is claimed by one.
            p.start(&std::collections::HashMap::new()).await;
            p.clone()
        }
        None => provider,
    };
    let worker = Arc::new(Worker {
        provider,
        key,
        golden: cfg.worker.golden.clone(),
        host,
        listen_ip: addr.ip(),
        tls: tls.clone(),
        sandboxes: Mutex::new(HashMap::new()),
        by_key: Mutex::new(HashMap::new()),
        max_sandboxes: cfg.worker.max_sandboxes,
        draining: AtomicBool::new(false),
        pool: pool.clone(),
        keeper,
        old_ports,
    });
    adopt::adopt_all(&worker, to_adopt).await;
    let reaper = spawn_reaper(worker.clone());
    let server = serve_api(
        api::router(worker.clone()),
        listener,
        tls,
        addr,
        stop.clone(),
    );
    tracing::info!(api = %addr, "worker ready");
    ready(addr);
    serve::stop_requested(&mut stop).await;
    tracing::info!("worker shutting down");
    reaper.abort();
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    stop_all(&worker, pool.as_deref()).await;
    Ok(())
}

/// Serves the API (over TLS when there is an acceptor) until `stop` turns true.
fn serve_api(
    app: axum::Router,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    addr: SocketAddr,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let shutdown = async move { serve::stop_requested(&mut stop).await };
    match tls {
        Some(acceptor) => tokio::spawn(async move {
            let l = TlsListener::new(listener, acceptor, addr);
            axum::serve(l, app).with_graceful_shutdown(shutdown).await
        }),
        None => tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }),
    }
}

/// Deletes expired sandboxes every `REAP_EVERY` until aborted.
fn spawn_reaper(w: Arc<Worker>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(REAP_EVERY);
        loop {
            tick.tick().await;
            w.reap_expired().await;
        }
    })
}

/// The worker's address and bearer key, once the configuration is found fit for a worker.
fn checked(cfg: &Config) -> Result<(SocketAddr, String), ServeError> {
    let invalid = |key, message: &str| {
        ServeError::Config(crate::config::ConfigError::Invalid {
            key,
            message: message.into(),
        })
    };
    let listen = cfg
        .worker
        .listen
        .ok_or_else(|| invalid("worker.listen", "worker mode needs an address"))?;
    if !matches!(cfg.provider.as_str(), "instance" | "microvm") {
        return Err(invalid(
            "provider",
            "a worker holds its own forks: provider \"instance\" or \"microvm\"",
        ));
    }
    cfg.validate()?;
    Ok((listen, cfg.worker.key()?))
}

/// At shutdown: each ready sandbox's server is stopped and its record kept, so the next
/// start on this data dir adopts it (a rolling restart loses no task's work); a sandbox still
/// being made is deleted (its front retries the create), and the warm pool is drained.
async fn stop_all(worker: &Worker, pool: Option<&WarmPool>) {
    let entries: Vec<(String, Option<String>, bool)> = lock(&worker.sandboxes)
        .iter()
        .map(|(id, e)| {
            let ready = e.sb.state == crate::provider::remote_api::SandboxState::Ready;
            (id.clone(), e.handle.clone(), ready)
        })
        .collect();
    let (mut kept, mut removed) = (0, 0);
    for (id, handle, ready) in entries {
        if let (Some(h), true) = (handle, ready) {
            if let Some(e) = lock(&worker.sandboxes).remove(&id) {
                if let Some(d) = e.door {
                    d.abort();
                }
            }
            match worker.provider.stop(&h).await {
                Ok(()) => kept += 1,
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e, "worker: stopping a sandbox's server at shutdown failed (adopted at the next start all the same)")
                }
            }
            continue;
        }
        match worker.remove(&id).await {
            Ok(_) => removed += 1,
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "worker: deleting a sandbox at shutdown failed")
            }
        }
    }
    let pool_members = match pool {
        Some(p) => p.drain().await,
        None => 0,
    };
    tracing::info!(
        sandboxes_kept = kept,
        sandboxes_deleted = removed,
        pool_members,
        "worker stopped: {kept} sandbox(es) kept for the next start, {removed} deleted, {pool_members} warm-pool member(s) removed"
    );
}

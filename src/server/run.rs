//! `sandpit serve` itself: wire the pieces together, run until a signal, shut down cleanly.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::control::{self, ApiState};
use crate::journal;
use crate::lifecycle::{janitor, Gateway, TokenHooks};
use crate::pgconn::tls::SslMode;
use crate::provider::pool::WarmPool;
use crate::provider::{BoxFuture, Provider};
use crate::proxy::{tls, Proxy};
use crate::registry::pool::PoolLimits;
use crate::registry::postgres::PgRegistryConfig;
use crate::registry::{Registry, TokenRecord};
use crate::review::reviewer::Reviewer;
use crate::review::store as review;

use super::error::ServeError;
use super::provider::build_provider;
use super::{lock, stop};

/// The lifecycle's hooks: start the review's reference after a fork, store the review and
/// run the validators and the promotion capture before a token's backend is destroyed.
struct ReviewHooks(Reviewer, crate::config::Config);

impl TokenHooks for ReviewHooks {
    fn issued(&self, rec: &TokenRecord) {
        review::reserve(&self.0, &rec.task, &rec.id);
    }
    fn discarded(&self, rec: &TokenRecord) {
        review::release_reserve(&self.0, &rec.task, &rec.id);
    }
    fn forked(&self, golden: Option<String>) {
        review::prepare(&self.0, golden);
    }
    fn ending<'a>(&'a self, rec: &'a TokenRecord) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            review::on_end(&self.0, rec).await?;
            crate::promote::on_end(&self.1, self.0.provider.as_ref(), rec).await;
            Ok(())
        })
    }
}

/// The admin key: config, then `SANDPIT_ADMIN_KEY`, then `<data_dir>/admin.key` (created
/// with mode 0600 when `create` is set).
pub fn admin_key(cfg: &Config, create: bool) -> std::io::Result<Option<String>> {
    if let Some(k) = &cfg.admin_key {
        return Ok(Some(k.clone()));
    }
    if let Ok(k) = std::env::var("SANDPIT_ADMIN_KEY") {
        if !k.is_empty() {
            return Ok(Some(k));
        }
    }
    let path = cfg.data_dir.join("admin.key");
    match std::fs::read_to_string(&path) {
        Ok(k) => return Ok(Some(k.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let key = crate::auth::new_secret();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    f.write_all(key.as_bytes())?;
    f.sync_all()?;
    Ok(Some(key))
}

pub(super) fn prepare_data_dir(dir: &Path) -> Result<(), ServeError> {
    let err = |source| ServeError::DataDir {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    // Searchable (not readable) by others, so the unprivileged Postgres user can reach pg/.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(err)?;
    Ok(())
}

/// Binds a listener, returning it with the address it got (the real port for port 0).
pub(super) async fn bind(
    addr: std::net::SocketAddr,
) -> Result<(TcpListener, std::net::SocketAddr), ServeError> {
    let err = |source| ServeError::Listen { addr, source };
    let l = TcpListener::bind(addr).await.map_err(err)?;
    let local = l.local_addr().map_err(err)?;
    Ok((l, local))
}

/// The provider, or None if a stop came while it was prepared (a golden or image build
/// takes minutes). Dropping the preparation ends its children (the image build's process
/// group and mount namespace); a golden build's staging server is stopped here and its
/// directory removed at the next start.
pub(super) async fn provider_unless_stopped(
    cfg: &Config,
    data_dir: &Path,
    shared_key: Option<String>,
    registry: Option<&Registry>,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<Arc<dyn Provider>>, ServeError> {
    let shared = registry.and_then(|r| r.shared());
    tokio::select! {
        p = build_provider(cfg, data_dir, shared_key, shared) => p.map(Some),
        () = stop_requested(stop) => {
            tracing::info!("shutting down");
            let grace = std::time::Duration::from_secs(5);
            let (servers, _) = stop::stop_local_servers_now(data_dir, grace).await;
            tracing::info!(
                staging_servers = servers,
                "stopped before ready: the provider's preparation was interrupted, \
                 {servers} staging server(s) stopped"
            );
            Ok(None)
        }
    }
}

/// Resolves once `stop` turns true (never if its sender is gone without saying so).
pub(super) async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Run the gateway until `stop` turns true; then end sessions and stop backends.
/// `ready` is called once both listeners are bound, with their addresses.
pub async fn run(
    cfg: Config,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    mut stop: watch::Receiver<bool>,
    ready: impl FnOnce(std::net::SocketAddr, std::net::SocketAddr),
) -> Result<(), ServeError> {
    let claimed = claim(&cfg).await?;
    // The registry first: with a shared one, the template provider's key lives in it.
    let registry = open_registry(&cfg, &claimed.data_dir).await?;
    let shared_key = shared_template_key(&registry).await?;
    // The first start builds the golden (tens of seconds): say so, the API is not up yet.
    tracing::info!(
        provider = %cfg.provider,
        postgres = %claimed.pg_addr,
        api = %claimed.api_addr,
        "ports bound; preparing the provider (a golden build can take a minute; ready follows)"
    );
    let data_dir = &claimed.data_dir;
    let Some(provider) =
        provider_unless_stopped(&cfg, data_dir, shared_key, Some(&registry), &mut stop).await?
    else {
        return Ok(());
    };
    let tls = tls::acceptor(
        &cfg.tls,
        data_dir,
        &cfg.public_host.iter().cloned().collect::<Vec<_>>(),
        Some(tls::ALPN_POSTGRESQL),
    )?;
    let (replica_id, gateway_id) = gateway_ids(data_dir, &registry).await?;
    let lease = match registry.shared() {
        Some(s) => Some(
            super::lease::start(
                s.clone(),
                replica_id.clone(),
                cfg.registry.session_lease,
                stop.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let mut cfg = cfg;
    cfg.data_dir = claimed.data_dir.clone();
    cfg.listen = claimed.pg_addr; // DSNs carry the real port even when asked for port 0
    let pool = warm_pool(&cfg, &provider);
    let provider = pool_or(provider, &pool, &registry, &gateway_id).await;
    let gw = gateway(cfg, registry, provider, gateway_id, &replica_id)?;
    let follower = gw.follow_replicas();
    settle(&gw).await;
    let background = Background::start(&gw, follower, &stop)?;
    let (pg_addr, api_addr) = (claimed.pg_addr, claimed.api_addr);
    let listeners = Listeners::serve(&gw, claimed.doors, tls, replica_id, metrics, &stop);
    ready(pg_addr, api_addr);

    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            break;
        }
    }
    shut_down(&gw, listeners, background, pool).await;
    if let Some(l) = lease {
        l.abort();
    }
    Ok(())
}

/// What `serve` holds before the provider is prepared: the data dir (locked), both ports,
/// the admin key.
struct Claimed {
    /// Held until `run` returns: a second gateway on the same data dir is refused.
    _lock: lock::DataDirLock,
    /// The data dir, canonical.
    data_dir: PathBuf,
    pg_addr: std::net::SocketAddr,
    api_addr: std::net::SocketAddr,
    doors: Doors,
}

/// The bound listeners and the key that opens the API, until they serve.
struct Doors {
    pg: TcpListener,
    api: TcpListener,
    admin_key: String,
}

/// The config checked, the data dir prepared and locked, both ports bound, the admin key
/// read (or made).
async fn claim(cfg: &Config) -> Result<Claimed, ServeError> {
    cfg.validate()?;
    prepare_data_dir(&cfg.data_dir)?;
    // First, before anything in the data dir is read or changed: a second gateway on the
    // same data dir stops here, having touched nothing of the first one's.
    let lock = lock::lock_data_dir(&cfg.data_dir)?;
    // Then the ports, so that one in use is reported now and not after a golden build.
    let (pg_listener, pg_addr) = bind(cfg.listen).await?;
    let (api_listener, api_addr) = bind(cfg.api_listen).await?;
    let data_dir = cfg
        .data_dir
        .canonicalize()
        .map_err(|source| ServeError::DataDir {
            path: cfg.data_dir.clone(),
            source,
        })?;
    if cfg.admin_key.is_none() {
        // Empty counts as unset, as in `admin_key()`.
        if let Some(k) = std::env::var("SANDPIT_ADMIN_KEY")
            .ok()
            .filter(|k| !k.is_empty())
        {
            crate::config::check_admin_key("SANDPIT_ADMIN_KEY", &k)?;
        }
    }
    let admin_key = admin_key(cfg, true)
        .map_err(|source| ServeError::DataDir {
            path: data_dir.join("admin.key"),
            source,
        })?
        .unwrap_or_default();
    Ok(Claimed {
        _lock: lock,
        data_dir,
        pg_addr,
        api_addr,
        doors: Doors {
            pg: pg_listener,
            api: api_listener,
            admin_key,
        },
    })
}

/// The token registry: files in the data dir, or a shared Postgres one.
async fn open_registry(cfg: &Config, data_dir: &Path) -> Result<Registry, ServeError> {
    Ok(match &cfg.registry.url {
        None => Registry::open(&data_dir.join("tokens"))?,
        Some(url) => {
            let mode = |m: &str| SslMode::parse(m).unwrap_or(SslMode::Require);
            Registry::open_postgres(
                &PgRegistryConfig {
                    url: url.clone(),
                    sslmode: cfg.registry.sslmode.as_deref().map(mode),
                    ca_file: cfg.registry.ca_file.clone(),
                    pool: PoolLimits {
                        max: cfg.registry.max_connections,
                        wait: cfg.registry.acquire_timeout,
                    },
                },
                cfg.registry.refresh_interval,
            )
            .await?
        }
    })
}

/// With a shared registry, the template provider's key: every replica derives the same
/// task-role passwords, so any of them can log in to a scratch database another one forked.
async fn shared_template_key(registry: &Registry) -> Result<Option<String>, ServeError> {
    Ok(match registry.shared() {
        Some(s) => Some(
            s.setting_or_init("template_key", &hex::encode(rand::random::<[u8; 32]>()))
                .await?,
        ),
        None => None,
    })
}

/// This replica's id and the gateway's. Replicas sharing a registry are one gateway to the
/// janitor: they tag backends alike, so any of them may reap what a token of the registry
/// no longer needs.
async fn gateway_ids(data_dir: &Path, registry: &Registry) -> Result<(String, String), ServeError> {
    let replica_id = janitor::gateway_id(data_dir).map_err(|source| ServeError::DataDir {
        path: data_dir.join(janitor::GATEWAY_ID_FILE),
        source,
    })?;
    let gateway_id = match registry.shared() {
        Some(s) => {
            let removed = s.cancel_purge(Some(&replica_id)).await?;
            if removed > 0 {
                tracing::info!(
                    removed,
                    "cancel keys left by this replica's last run removed"
                );
            }
            s.setting_or_init("gateway_id", &replica_id).await?
        }
        None => replica_id.clone(),
    };
    Ok((replica_id, gateway_id))
}

/// The warm pool in front of the provider, when configured.
fn warm_pool(cfg: &Config, provider: &Arc<dyn Provider>) -> Option<Arc<WarmPool>> {
    cfg.pool.enabled().then(|| {
        let sizing = crate::provider::pool_sizing::PoolSizing {
            size: cfg.pool.size,
            max_size: cfg.pool.max_size,
            half_life: cfg.pool.demand_half_life,
            parallel_forks: cfg.pool.parallel_forks,
        };
        WarmPool::new(provider.clone(), sizing)
    })
}

/// The provider sessions fork from: the pool (started) when there is one.
async fn pool_or(
    provider: Arc<dyn Provider>,
    pool: &Option<Arc<WarmPool>>,
    registry: &Registry,
    gateway_id: &str,
) -> Arc<dyn Provider> {
    let Some(p) = pool else {
        return provider;
    };
    // Members the registry names (claimed just before a crash) are tokens', not the pool's.
    let claimed = registry
        .list()
        .into_iter()
        .filter_map(|r| {
            let tag = crate::provider::BackendTag {
                token_id: r.id.clone(),
                task: r.task.clone(),
                expires_at: crate::rfc3339::format(r.expires_at),
                gateway_id: gateway_id.to_string(),
                golden: r.golden.clone(),
            };
            Some((r.backend?, tag))
        })
        .collect();
    p.start(&claimed).await;
    p.clone() as Arc<dyn Provider>
}

/// The gateway, its review hooks and its statement logs' quota and place: with
/// `registry.shared_dir`, this replica writes its own file of each token's log there.
fn gateway(
    cfg: Config,
    registry: Registry,
    provider: Arc<dyn Provider>,
    gateway_id: String,
    replica_id: &str,
) -> Result<Arc<Gateway>, ServeError> {
    let hooks = Arc::new(ReviewHooks(
        Reviewer::new(&cfg, provider.clone(), &gateway_id),
        cfg.clone(),
    ));
    let gw = Gateway::with_id(cfg, registry, provider, gateway_id, hooks);
    gw.logs
        .set_max_bytes_per_token(gw.config.log.max_bytes_per_token);
    if let Some(dir) = &gw.config.registry.shared_dir {
        // Refused now rather than at the first statement: a front that cannot write there
        // would refuse every statement (58030).
        let logs = dir.join("logs");
        crate::datadir::private_dirs(&logs, Path::new("")).map_err(|source| {
            crate::journal::log::LogError::Io {
                path: logs.clone(),
                source,
            }
        })?;
        gw.logs.share(dir.clone(), replica_id.to_string())?;
        // Decisions and promotions stored there are locked across fronts too.
        crate::promote::across::share();
    }
    Ok(gw)
}

/// Before `ready`: whatever an earlier (killed) run left behind is settled first.
async fn settle(gw: &Arc<Gateway>) {
    gw.resume().await;
    // A promotion an earlier (killed) run left unfinished gets its audit entry.
    crate::promote::recover_interrupted(&crate::review::reviewer::reviews_dir(&gw.config));
    match janitor::run_pass(gw, false).await {
        Ok(r) => tracing::info!(
            backends = r.backends,
            kept = r.kept,
            reaped = r.reaped.len(),
            vanished = r.vanished.len(),
            "janitor pass at start"
        ),
        Err(e) => tracing::warn!(error = %e, "janitor pass at start failed"),
    }
    // Servers a killed gateway left running: held from now on (idle suspend and shutdown
    // stop them) and rid of the dead gateway's sessions, before any new session arrives.
    let adopted = gw.adopt_running().await;
    if adopted.servers > 0 {
        tracing::info!(
            servers = adopted.servers,
            stale_sessions = adopted.stale_sessions,
            "adopted the scratch servers left running"
        );
    }
}

/// The gateway's own work beside the sessions: following replicas, the janitor, the
/// statement log's ticker, idle suspend.
struct Background {
    follower: Option<JoinHandle<()>>,
    janitor: JoinHandle<()>,
    syncer: journal::log::SyncTicker,
    suspender: Option<JoinHandle<()>>,
    /// Watches the workers of a front over several (`remote.urls`) for loss.
    fleet_watch: Option<JoinHandle<()>>,
}

impl Background {
    fn start(
        gw: &Arc<Gateway>,
        follower: Option<JoinHandle<()>>,
        stop: &watch::Receiver<bool>,
    ) -> Result<Background, ServeError> {
        let janitor = janitor::spawn(gw.clone(), gw.config.janitor.interval, stop.clone());
        let syncer = journal::log::SyncTicker::start(gw.clone(), |gw: &Gateway| &gw.logs)
            .map_err(ServeError::LogTicker)?;
        let idle = gw.config.postgres.idle_suspend;
        let suspender = (!idle.is_zero()).then(|| {
            let gw = gw.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval((idle / 4).clamp(
                    std::time::Duration::from_millis(250),
                    std::time::Duration::from_secs(30),
                ));
                loop {
                    tick.tick().await;
                    gw.suspend_idle(idle).await;
                }
            })
        });
        let fleet_watch = crate::lifecycle::lost::spawn_watch(gw.clone(), stop.clone());
        Ok(Background {
            follower,
            janitor,
            syncer,
            suspender,
            fleet_watch,
        })
    }
}

/// The Postgres listener and the control API, serving.
struct Listeners {
    pg: JoinHandle<()>,
    api: JoinHandle<()>,
    /// Stops the API: it stays up through the grace period (a harness may revoke, /metrics
    /// is scraped) and stops once sessions are ended.
    api_stop: watch::Sender<bool>,
}

impl Listeners {
    fn serve(
        gw: &Arc<Gateway>,
        doors: Doors,
        tls: Option<tls::ServerTls>,
        replica_id: String,
        metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
        stop: &watch::Receiver<bool>,
    ) -> Listeners {
        let proxy = Proxy::new(gw.clone(), tls, replica_id);
        let pg = tokio::spawn(proxy.serve(doors.pg, stop.clone()));
        let router = control::router(ApiState {
            gw: gw.clone(),
            admin_key: Arc::new(doors.admin_key),
            metrics,
        });
        let (api_stop, mut api_stopped) = watch::channel(false);
        let api_listener = doors.api;
        let api = tokio::spawn(async move {
            let shutdown = async move {
                while !*api_stopped.borrow() {
                    if api_stopped.changed().await.is_err() {
                        break;
                    }
                }
            };
            // The peer address is what MCP failures with unknown token ids count against.
            let router = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
            if let Err(e) = axum::serve(api_listener, router)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!(error = %e, "control API failed");
            }
        });
        Listeners { pg, api, api_stop }
    }
}

/// The stop, in order: no new connections, the janitor's pass finished, open sessions
/// given their grace, then ended and their servers stopped, the pool drained, the
/// background stopped, the API last.
async fn shut_down(
    gw: &Arc<Gateway>,
    listeners: Listeners,
    background: Background,
    pool: Option<Arc<WarmPool>>,
) {
    tracing::info!("shutting down");
    // The listener is closed once this returns: new connections are refused from here on.
    let _ = listeners.pg.await;
    // A pass in progress finishes (it may be destroying a backend); the loop then sees `stop`.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), background.janitor).await;
    let grace = gw.config.shutdown_grace;
    let open = gw.session_count();
    if open > 0 && !grace.is_zero() {
        tracing::info!(
            sessions = open,
            grace_ms = grace.as_millis() as u64,
            "waiting for open sessions"
        );
        let deadline = tokio::time::Instant::now() + grace;
        while gw.session_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    let sessions = gw.session_count();
    let servers = gw.shutdown().await;
    let pool_members = match &pool {
        Some(p) => p.drain().await,
        None => 0,
    };
    // A thread: stopped off the runtime (it may be finishing an fsync).
    let mut syncer = background.syncer;
    let _ = tokio::task::spawn_blocking(move || syncer.stop()).await;
    if let Some(f) = background.follower {
        f.abort();
    }
    if let Some(w) = background.fleet_watch {
        w.abort();
    }
    if let Some(s) = background.suspender {
        s.abort();
    }
    let logs = gw.logs.release_all();
    tracing::info!(
        sessions,
        scratch_servers = servers,
        pool_members,
        statement_logs = logs,
        "stopped: {sessions} session(s) ended, {servers} scratch server(s) stopped, \
         {pool_members} warm-pool member(s) removed, {logs} statement log(s) closed"
    );
    // Give sessions a moment to flush their FATAL to clients.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let _ = listeners.api_stop.send(true);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), listeners.api).await;
}

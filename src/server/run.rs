//! `sandpit serve` itself: wire the pieces together, run until a signal, shut down cleanly.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::control::{self, ApiState};
use crate::journal;
use crate::lifecycle::{janitor, Gateway, TokenHooks};
use crate::pgconn::tls::SslMode;
use crate::provider::instance::{InstanceConfig, InstanceProvider};
use crate::provider::pool::WarmPool;
use crate::provider::remote::{RemoteConfig, RemoteProvider, RemoteSet};
use crate::provider::template::{TemplateConfig, TemplateProvider};
use crate::provider::{BoxFuture, Provider, ProviderError};
use crate::proxy::{tls, Proxy};
use crate::registry::postgres::PgRegistryConfig;
use crate::registry::{Registry, TokenRecord};
use crate::review::reviewer::Reviewer;
use crate::review::store as review;

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

/// The demo golden shipped with the binary, used when no golden SQL is configured.
pub const DEMO_GOLDEN_SQL: &str = include_str!("../../config/demo_golden.sql");

/// Startup failures of `serve`.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("data dir {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Provider(#[from] crate::provider::ProviderError),
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Locked(#[from] lock::LockError),
    #[error("cannot start the statement log's ticker thread: {0}")]
    LogTicker(std::io::Error),
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

/// The provider the config names, ready to fork.
/// The `template` provider's settings from the configuration.
fn template_config(cfg: &Config, data_dir: &Path, shared_key: Option<String>) -> TemplateConfig {
    let t = &cfg.template;
    TemplateConfig {
        admin_dsn: t.admin_dsn.clone().unwrap_or_default(),
        golden: t.golden.clone(),
        golden_sql: t.golden_sql.clone().or_else(|| cfg.golden.sql.clone()),
        golden_owner: t.golden_owner.clone(),
        sslmode: t
            .sslmode
            .as_deref()
            .map(|m| SslMode::parse(m).unwrap_or(SslMode::Require)),
        ca_file: t.ca_file.clone(),
        key_file: data_dir.join("template.key"),
        shared_key,
        trust_network: t.trust_network,
    }
}

/// For `serve --check-config` with `provider = "template"`: the start-up's `pg_hba.conf`
/// check on the server (one admin login; nothing made, no file written). Ok(false): skipped
/// (`trust_network = true`).
pub fn check_template_network(cfg: &Config) -> Result<bool, ServeError> {
    let t = template_config(cfg, &cfg.data_dir, None);
    if t.trust_network {
        return Ok(false);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(crate::provider::ProviderError::from)?;
    rt.block_on(TemplateProvider::check_network(&t))?;
    Ok(true)
}

async fn build_provider(
    cfg: &Config,
    data_dir: &Path,
    shared_key: Option<String>,
) -> Result<Arc<dyn Provider>, ServeError> {
    let mode = |m: &str| SslMode::parse(m).unwrap_or(SslMode::Require);
    match cfg.provider.as_str() {
        "template" => {
            let p = TemplateProvider::new(template_config(cfg, data_dir, shared_key)).await?;
            Ok(Arc::new(p))
        }
        "remote" => {
            let r = &cfg.remote;
            let one = |url: &str| {
                RemoteProvider::new(RemoteConfig {
                    url: url.to_string(),
                    api_key: r
                        .api_key
                        .clone()
                        .or_else(|| std::env::var("SANDPIT_REMOTE_API_KEY").ok())
                        .filter(|k| !k.is_empty()),
                    golden: r.golden.clone(),
                    owner: r.owner.clone(),
                    connect_timeout: r.connect_timeout,
                    request_timeout: r.request_timeout,
                    fork_timeout: r.fork_timeout,
                    retries: r.retries,
                    ttl_grace: r.ttl_grace,
                    sslmode: mode(&r.sslmode),
                    ca_file: r.ca_file.clone(),
                })
            };
            if r.urls.is_empty() {
                return Ok(Arc::new(one(r.url.as_deref().unwrap_or_default())?));
            }
            let members = r
                .urls
                .iter()
                .map(|u| Ok((u.clone(), one(u)?)))
                .collect::<Result<Vec<_>, ProviderError>>()?;
            Ok(Arc::new(RemoteSet::new(members)?))
        }
        "microvm" => {
            let golden_sql = golden_sql_path(cfg, data_dir)?;
            let p = crate::provider::microvm::MicrovmProvider::new(microvm_config(
                cfg, data_dir, golden_sql,
            ))
            .await?;
            Ok(Arc::new(p))
        }
        _ => {
            let golden_sql = golden_sql_path(cfg, data_dir)?;
            let provider = InstanceProvider::new(InstanceConfig {
                bin_dir: cfg.postgres.bin_dir.clone(),
                root: data_dir.join("pg"),
                golden_sql,
                max_connections: cfg.postgres.max_connections,
                run_as: cfg.postgres.run_as.clone(),
                netns: cfg.postgres.netns,
                settings: vec![
                    (
                        "temp_file_limit".into(),
                        cfg.postgres.temp_file_limit.clone(),
                    ),
                    (
                        "max_prepared_transactions".into(),
                        cfg.postgres.max_prepared_transactions.to_string(),
                    ),
                ],
            })
            .await?;
            tracing::info!(
                copy_method = provider.copy_method(),
                "instance provider ready"
            );
            Ok(Arc::new(provider))
        }
    }
}

/// The golden SQL file: the configured one, else the demo written into the data dir.
fn golden_sql_path(cfg: &Config, data_dir: &Path) -> Result<PathBuf, ServeError> {
    Ok(match &cfg.golden.sql {
        Some(p) => p.clone(),
        None => {
            let p = data_dir.join("demo_golden.sql");
            if std::fs::read_to_string(&p).ok().as_deref() != Some(DEMO_GOLDEN_SQL) {
                std::fs::write(&p, DEMO_GOLDEN_SQL).map_err(|source| ServeError::DataDir {
                    path: p.clone(),
                    source,
                })?;
            }
            p
        }
    })
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
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<Arc<dyn Provider>>, ServeError> {
    tokio::select! {
        p = build_provider(cfg, data_dir, shared_key) => p.map(Some),
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
    cfg.validate()?;
    prepare_data_dir(&cfg.data_dir)?;
    // First, before anything in the data dir is read or changed: a second gateway on the
    // same data dir stops here, having touched nothing of the first one's.
    let _data_dir_lock = lock::lock_data_dir(&cfg.data_dir)?;
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
    let key = admin_key(&cfg, true)
        .map_err(|source| ServeError::DataDir {
            path: data_dir.join("admin.key"),
            source,
        })?
        .unwrap_or_default();

    // The registry first: with a shared one, the template provider's key lives in it.
    let registry = match &cfg.registry.url {
        None => Registry::open(&data_dir.join("tokens"))?,
        Some(url) => {
            let mode = |m: &str| SslMode::parse(m).unwrap_or(SslMode::Require);
            Registry::open_postgres(
                &PgRegistryConfig {
                    url: url.clone(),
                    sslmode: cfg.registry.sslmode.as_deref().map(mode),
                    ca_file: cfg.registry.ca_file.clone(),
                },
                cfg.registry.refresh_interval,
            )
            .await?
        }
    };
    let shared_key = match registry.shared() {
        // Every replica derives the same task-role passwords, so any of them can log in to
        // a scratch database another one forked.
        Some(s) => Some(
            s.setting_or_init("template_key", &hex::encode(rand::random::<[u8; 32]>()))
                .await?,
        ),
        None => None,
    };
    // The first start builds the golden (tens of seconds): say so, the API is not up yet.
    tracing::info!(
        provider = %cfg.provider,
        postgres = %pg_addr,
        api = %api_addr,
        "ports bound; preparing the provider (a golden build can take a minute; ready follows)"
    );
    let Some(provider) = provider_unless_stopped(&cfg, &data_dir, shared_key, &mut stop).await?
    else {
        return Ok(());
    };
    let tls = tls::acceptor(
        &cfg.tls,
        &data_dir,
        &cfg.public_host.iter().cloned().collect::<Vec<_>>(),
    )?;

    let replica_id = janitor::gateway_id(&data_dir).map_err(|source| ServeError::DataDir {
        path: data_dir.join(janitor::GATEWAY_ID_FILE),
        source,
    })?;
    // Replicas sharing a registry are one gateway to the janitor: they tag backends alike,
    // so any of them may reap what a token of the registry no longer needs.
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
    let mut cfg = cfg;
    cfg.data_dir = data_dir;
    cfg.listen = pg_addr; // DSNs carry the real port even when asked for port 0
    let provider: Arc<dyn crate::provider::Provider> = provider;
    let pool = cfg.pool.enabled().then(|| {
        let sizing = crate::provider::pool_sizing::PoolSizing {
            size: cfg.pool.size,
            max_size: cfg.pool.max_size,
            half_life: cfg.pool.demand_half_life,
        };
        WarmPool::new(provider.clone(), sizing)
    });
    let provider = match &pool {
        Some(p) => {
            // Members the registry names (claimed just before a crash) are tokens', not the pool's.
            let claimed = registry
                .list()
                .into_iter()
                .filter_map(|r| {
                    let tag = crate::provider::BackendTag {
                        token_id: r.id.clone(),
                        task: r.task.clone(),
                        expires_at: crate::rfc3339::format(r.expires_at),
                        gateway_id: gateway_id.clone(),
                        golden: r.golden.clone(),
                    };
                    Some((r.backend?, tag))
                })
                .collect();
            p.start(&claimed).await;
            p.clone() as Arc<dyn crate::provider::Provider>
        }
        None => provider,
    };
    let hooks = Arc::new(ReviewHooks(
        Reviewer::new(&cfg, provider.clone(), &gateway_id),
        cfg.clone(),
    ));
    let gw = Gateway::with_id(cfg, registry, provider, gateway_id, hooks);
    gw.logs
        .set_max_bytes_per_token(gw.config.log.max_bytes_per_token);
    let follower = gw.follow_replicas();
    gw.resume().await;
    // A promotion an earlier (killed) run left unfinished gets its audit entry.
    crate::promote::recover_interrupted(&crate::review::reviewer::reviews_dir(&gw.config));
    // Before `ready`: whatever an earlier (killed) run left behind is settled first.
    match janitor::run_pass(&gw, false).await {
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
    let janitor_task = janitor::spawn(gw.clone(), gw.config.janitor.interval, stop.clone());

    let mut syncer = journal::log::SyncTicker::start(gw.clone(), |gw: &Gateway| &gw.logs)
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

    let proxy = Proxy::new(gw.clone(), tls, replica_id);
    let pg_task = tokio::spawn(proxy.serve(pg_listener, stop.clone()));
    let api = control::router(ApiState {
        gw: gw.clone(),
        admin_key: Arc::new(key),
        metrics,
    });
    // The API stays up through the grace period (a harness may revoke, /metrics is scraped)
    // and stops once sessions are ended.
    let (api_stop_tx, mut api_stop) = watch::channel(false);
    let api_task = tokio::spawn(async move {
        let shutdown = async move {
            while !*api_stop.borrow() {
                if api_stop.changed().await.is_err() {
                    break;
                }
            }
        };
        // The peer address is what MCP failures with unknown token ids count against.
        let api = api.into_make_service_with_connect_info::<std::net::SocketAddr>();
        if let Err(e) = axum::serve(api_listener, api)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "control API failed");
        }
    });
    ready(pg_addr, api_addr);

    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            break;
        }
    }
    tracing::info!("shutting down");
    // The listener is closed once this returns: new connections are refused from here on.
    let _ = pg_task.await;
    // A pass in progress finishes (it may be destroying a backend); the loop then sees `stop`.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), janitor_task).await;
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
    let _ = tokio::task::spawn_blocking(move || syncer.stop()).await;
    if let Some(f) = follower {
        f.abort();
    }
    if let Some(s) = suspender {
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
    let _ = api_stop_tx.send(true);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), api_task).await;
    Ok(())
}

/// The `microvm` provider's settings from the configuration.
fn microvm_config(
    cfg: &Config,
    data_dir: &Path,
    golden_sql: PathBuf,
) -> crate::provider::microvm::MicrovmConfig {
    let m = &cfg.microvm;
    let root = data_dir.join("microvm");
    crate::provider::microvm::MicrovmConfig {
        qemu: m
            .qemu
            .clone()
            .unwrap_or_else(|| PathBuf::from("qemu-system-x86_64")),
        accel: m.accel.clone(),
        memory_mib: m.memory_mib,
        vcpus: m.vcpus,
        image: m.image.clone(),
        image_dir: m.image_dir.clone().unwrap_or_else(|| root.join("images")),
        golden_sql,
        bin_dir: cfg.postgres.bin_dir.clone(),
        boot_timeout: m.boot_timeout,
        root,
    }
}

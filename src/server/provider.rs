//! The provider `serve` runs on, built from the configuration: template, remote (one
//! server or a set), microvm, or the default local instances; and the demo golden.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Config;
use crate::pgconn::tls::SslMode;
use crate::provider::instance::{InstanceConfig, InstanceProvider};
use crate::provider::remote::{RemoteConfig, RemoteProvider, RemoteSet};
use crate::provider::template::{TemplateConfig, TemplateProvider};
use crate::provider::{Provider, ProviderError};

use super::error::ServeError;
use super::fleet::RegistryRooms;
use crate::registry::postgres::PgStore;
use crate::registry::workers::WorkerBook;

/// The demo golden shipped with the binary, used when no golden SQL is configured.
pub const DEMO_GOLDEN_SQL: &str = include_str!("../../config/demo_golden.sql");

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

/// The provider the config names, ready to fork.
pub(super) async fn build_provider(
    cfg: &Config,
    data_dir: &Path,
    shared_key: Option<String>,
    registry: Option<&Arc<PgStore>>,
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
            let set = RemoteSet::new(members)?.with_lost_after(r.worker_lost_after);
            let set = match registry {
                // Fronts sharing a registry place from one book of the workers' room.
                Some(store) => {
                    let book = WorkerBook::open(store.clone()).await?;
                    set.with_book(Arc::new(RegistryRooms(book))).await?
                }
                None => set,
            };
            Ok(Arc::new(set))
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

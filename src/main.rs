//! The `sandpit` binary: `serve`, and the harness-side commands that call the control API.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use sandpit::cli::{self, ApiClient};
use sandpit::config::Config;

#[derive(Parser)]
#[command(
    name = "sandpit",
    version,
    about = "A throwaway Postgres database per AI-agent task, behind one gateway"
)]
struct Cli {
    /// Config file (TOML).
    #[arg(long, global = true, env = "SANDPIT_CONFIG")]
    config: Option<PathBuf>,
    /// Data dir (tokens, logs, keys, Postgres data).
    #[arg(long, global = true, env = "SANDPIT_DATA_DIR")]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the gateway.
    Serve(ServeArgs),
    /// Issue, list, show and revoke tokens.
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    /// Print the statement log of a token (by id) or of every token of a task (by name).
    Log {
        /// Token id or task name.
        target: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Postgres listener.
    #[arg(long, env = "SANDPIT_LISTEN")]
    listen: Option<SocketAddr>,
    /// HTTP API listener.
    #[arg(long, env = "SANDPIT_API_LISTEN")]
    api_listen: Option<SocketAddr>,
    /// SQL file to build the golden from (default: the shipped demo shop).
    #[arg(long)]
    golden_sql: Option<PathBuf>,
    /// Log format: "text" or "json".
    #[arg(long, default_value = "text")]
    log_format: String,
}

#[derive(Args)]
struct ApiArgs {
    /// Control API base URL.
    #[arg(long, env = "SANDPIT_API")]
    api: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Issue a token; prints the DSN (or the whole object with --json).
    Issue {
        /// Task name.
        #[arg(long)]
        task: String,
        /// Time to live, e.g. 15m, 2h.
        #[arg(long)]
        ttl: Option<humantime::Duration>,
        /// Rows per statement.
        #[arg(long)]
        max_rows: Option<u64>,
        /// Bytes of row data per statement, e.g. 1MiB.
        #[arg(long)]
        max_bytes: Option<String>,
        /// What a capped result does: truncate (default) or error.
        #[arg(long)]
        cap_mode: Option<String>,
        /// Concurrent sessions for this token.
        #[arg(long)]
        max_connections: Option<u32>,
        /// Statement timeout, e.g. 30s (0s = none).
        #[arg(long)]
        statement_timeout: Option<humantime::Duration>,
        /// Idle-in-transaction timeout, e.g. 5m (0s = none).
        #[arg(long)]
        idle_in_transaction_timeout: Option<humantime::Duration>,
        /// Metadata key=value (repeatable).
        #[arg(long = "meta")]
        meta: Vec<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// List tokens.
    List {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Show one token.
    Show {
        /// Token id.
        id: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Revoke a token: ends its sessions and destroys its scratch database.
    Revoke {
        /// Token id.
        id: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

fn load_config(cli: &Cli) -> Result<Config> {
    let mut cfg = Config::load(cli.config.as_deref())?;
    if let Some(d) = &cli.data_dir {
        cfg.data_dir = d.clone();
    }
    Ok(cfg)
}

fn client(cfg: &Config, api: &ApiArgs) -> Result<ApiClient> {
    let base = api
        .api
        .clone()
        .unwrap_or_else(|| format!("http://{}", cfg.api_listen));
    let key = sandpit::server::admin_key(cfg, false).context("reading the admin key")?;
    Ok(ApiClient::new(&base, key)?)
}

fn print(
    v: &serde_json::Value,
    json: bool,
    text: impl FnOnce(&serde_json::Value) -> String,
) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        println!("{}", text(v));
    }
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let cfg = load_config(&cli)?;
    match &cli.cmd {
        Cmd::Serve(args) => serve(cfg, args),
        Cmd::Log { target, api } => {
            let c = client(&cfg, api)?;
            let ids: Vec<String> = if sandpit::auth::is_token_id(target) {
                vec![target.clone()]
            } else {
                let all = c.list()?;
                all.as_array()
                    .map(|a| {
                        a.iter()
                            .filter(|t| {
                                t.get("task").and_then(|x| x.as_str()) == Some(target.as_str())
                            })
                            .filter_map(|t| {
                                t.get("id").and_then(|x| x.as_str()).map(str::to_string)
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            };
            if ids.is_empty() {
                anyhow::bail!("no token or task named {target:?}");
            }
            let mut all = Vec::new();
            for id in ids {
                if let Some(a) = c.statements(&id)?.as_array() {
                    all.extend(a.iter().cloned());
                }
            }
            if api.json {
                for v in &all {
                    println!("{}", serde_json::to_string(v)?);
                }
            } else {
                for v in &all {
                    println!("{}", cli::statement_line(v));
                }
            }
            Ok(())
        }
        Cmd::Token { cmd } => match cmd {
            TokenCmd::Issue {
                task,
                ttl,
                max_rows,
                max_bytes,
                cap_mode,
                max_connections,
                statement_timeout,
                idle_in_transaction_timeout,
                meta,
                api,
            } => {
                let max_bytes = max_bytes.as_deref().map(cli::parse_size).transpose()?;
                let metadata: BTreeMap<String, String> = meta
                    .iter()
                    .map(|m| cli::parse_meta(m))
                    .collect::<Result<_, _>>()?;
                let v = client(&cfg, api)?.issue(
                    task,
                    ttl.map(Into::into),
                    *max_rows,
                    max_bytes,
                    cap_mode.as_deref(),
                    *max_connections,
                    (
                        statement_timeout.map(Into::into),
                        idle_in_transaction_timeout.map(Into::into),
                    ),
                    metadata,
                )?;
                print(&v, api.json, |v| {
                    v.get("dsn")
                        .and_then(|d| d.as_str())
                        .unwrap_or("")
                        .to_string()
                })
            }
            TokenCmd::List { api } => {
                let v = client(&cfg, api)?.list()?;
                print(&v, api.json, |v| {
                    v.as_array()
                        .map(|a| a.iter().map(cli::token_line).collect::<Vec<_>>().join("\n"))
                        .unwrap_or_default()
                })
            }
            TokenCmd::Show { id, api } => {
                let v = client(&cfg, api)?.show(id)?;
                print(&v, api.json, |v| {
                    serde_json::to_string_pretty(v).unwrap_or_default()
                })
            }
            TokenCmd::Revoke { id, api } => {
                let v = client(&cfg, api)?.revoke(id)?;
                print(&v, api.json, |v| {
                    format!(
                        "revoked {}",
                        v.get("id").and_then(|d| d.as_str()).unwrap_or(id)
                    )
                })
            }
        },
    }
}

fn init_logging(format: &str) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDPIT_LOG")
        .unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        "json" => builder.json().init(),
        "text" => builder.init(),
        other => anyhow::bail!("--log-format must be text or json, not {other:?}"),
    }
    Ok(())
}

fn serve(mut cfg: Config, args: &ServeArgs) -> Result<()> {
    init_logging(&args.log_format)?;
    if let Some(l) = args.listen {
        cfg.listen = l;
    }
    if let Some(l) = args.api_listen {
        cfg.api_listen = l;
    }
    if let Some(g) = &args.golden_sql {
        cfg.golden.sql = Some(g.clone());
    }
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            let _ = stop_tx.send(true);
            // A second signal exits at once.
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            std::process::exit(130);
        });
        sandpit::server::run(cfg, Some(metrics), stop_rx, |pg, api| {
            println!("sandpit ready postgres={pg} api=http://{api}");
        })
        .await
    })?;
    Ok(())
}

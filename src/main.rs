//! The `sandpit` binary: `serve`, and the harness-side commands that call the control API.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use clap::Parser;
use sandpit::cli::args::{ApiArgs, Cli, Cmd, GoldenCmd, ReviewCmd, ServeArgs, TokenCmd};
use sandpit::cli::{self, ApiClient};
use sandpit::config::Config;

fn load_config(cli: &Cli) -> Result<Config> {
    let mut cfg = Config::load(cli.config.as_deref())?;
    cfg.apply_env(|k| std::env::var(k).ok())?;
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

/// Standard output was closed under the CLI (`sandpit log … | head`): it ends quietly, 0.
#[derive(Debug)]
struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes to standard output. `println!` panics when the reader has gone (Rust ignores
/// SIGPIPE, so a write fails with EPIPE); here that is [`StdoutClosed`].
fn out(text: &str) -> Result<()> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        r => Ok(r.context("writing to standard output")?),
    }
}

fn outln(text: &str) -> Result<()> {
    out(&format!("{text}\n"))
}

fn print(
    v: &serde_json::Value,
    json: bool,
    text: impl FnOnce(&serde_json::Value) -> String,
) -> Result<()> {
    if json {
        outln(&serde_json::to_string_pretty(v)?)
    } else {
        outln(&text(v))
    }
}

fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap quotes arguments it did not expect, which may be a DSN.
            let text = cli::redact(&e.render().to_string(), &cli::secrets_of_invocation());
            if e.use_stderr() {
                eprint!("{text}");
            } else if out(&text).is_err() {
                // --help into a closed pipe: nothing more to say.
                return std::process::ExitCode::SUCCESS;
            }
            return std::process::ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<StdoutClosed>().is_some() => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}`: the causes on one line. Debug formatting would add a backtrace whenever
            // RUST_BACKTRACE is set, which says nothing to an operator.
            eprintln!(
                "Error: {}",
                cli::redact(&format!("{e:#}"), &cli::secrets_of_invocation())
            );
            std::process::ExitCode::FAILURE
        }
    }
}

/// One command, each its own step.
fn run(cli: Cli) -> Result<()> {
    let cfg = load_config(&cli)?;
    match &cli.cmd {
        Cmd::Serve(args) if args.check_config => check_config(cfg, args),
        Cmd::Serve(args) => serve(cfg, args),
        Cmd::Reap { dry_run, api } => {
            let v = client(&cfg, api)?.reap(*dry_run)?;
            print(&v, api.json, cli::reap_text)
        }
        Cmd::Mcp { dsn, api } => mcp(dsn, api.as_deref()),
        Cmd::Golden { cmd } => golden(&cfg, cmd),
        Cmd::Log { target, api } => log(&cfg, target, api),
        Cmd::Review {
            decide: Some(ReviewCmd::Approve { id, comment, api }),
            ..
        } => decide(&cfg, id, true, comment, api),
        Cmd::Review {
            decide: Some(ReviewCmd::Reject { id, comment, api }),
            ..
        } => decide(&cfg, id, false, comment, api),
        Cmd::Promote {
            id,
            target,
            target_name,
            role,
            dry_run,
            api,
        } => {
            let body = serde_json::json!({
                "dsn": target,
                "target": target_name,
                "role": role,
                "dry_run": dry_run,
            });
            promote(&cfg, id, body, api)
        }
        Cmd::Review {
            id,
            format,
            full_scan,
            verify,
            api,
            ..
        } => {
            let api = ApiArgs {
                api: api.clone(),
                json: false,
            };
            let id = cli::token_id_arg(id.as_deref().unwrap_or_default())?;
            let body = client(&cfg, &api)?.review(&id, format, *full_scan, *verify)?;
            if body.ends_with('\n') {
                out(&body)
            } else {
                outln(&body)
            }
        }
        Cmd::Token { cmd } => token(&cfg, cmd),
    }
}

/// `sandpit log`: the statements of one token, or of every token of a task.
fn log(cfg: &Config, target: &str, api: &ApiArgs) -> Result<()> {
    let c = client(cfg, api)?;
    let ids: Vec<String> = if cli::looks_like_dsn(target) {
        vec![cli::token_id_arg(target)?]
    } else {
        let all = c.list()?;
        all.as_array()
            .map(|a| {
                a.iter()
                    .filter(|t| t.get("task").and_then(|x| x.as_str()) == Some(target))
                    .filter_map(|t| t.get("id").and_then(|x| x.as_str()).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    if ids.is_empty() {
        anyhow::bail!("no token or task named {target:?}");
    }
    // Page by page: a long log is never held whole.
    let mut written = Ok(());
    for id in ids {
        c.each_statement(&id, |v| {
            written = if api.json {
                outln(&v.to_string())
            } else {
                outln(&cli::statement_line(v))
            };
            // A closed stdout stops the paging too.
            if written.is_ok() {
                std::ops::ControlFlow::Continue(())
            } else {
                std::ops::ControlFlow::Break(())
            }
        })?;
        if written.is_err() {
            break;
        }
    }
    written
}

/// `sandpit review approve|reject`.
fn decide(cfg: &Config, id: &str, approve: bool, comment: &str, api: &ApiArgs) -> Result<()> {
    let id = cli::token_id_arg(id)?;
    let v = client(cfg, api)?.decide(&id, approve, comment)?;
    print(&v, api.json, |v| {
        format!(
            "{}: {}",
            v.get("token").and_then(|x| x.as_str()).unwrap_or(""),
            v.get("state").and_then(|x| x.as_str()).unwrap_or("")
        )
    })
}

/// `sandpit promote`: fails unless the promotion was applied (or was a dry run).
fn promote(cfg: &Config, id: &str, body: serde_json::Value, api: &ApiArgs) -> Result<()> {
    let id = cli::token_id_arg(id)?;
    let v = client(cfg, api)?.promote(&id, body)?;
    let outcome = v
        .get("outcome")
        .and_then(|x| x.as_str())
        .unwrap_or("")
        .to_string();
    print(&v, api.json, cli::promote_text)?;
    if outcome == "applied" || outcome == "dry_run" {
        Ok(())
    } else {
        anyhow::bail!("promotion {outcome}")
    }
}

/// `sandpit token …`.
fn token(cfg: &Config, cmd: &TokenCmd) -> Result<()> {
    match cmd {
        TokenCmd::Issue {
            task,
            ttl,
            max_rows,
            max_bytes,
            cap_mode,
            allow,
            max_connections,
            statement_timeout,
            idle_in_transaction_timeout,
            meta,
            superuser,
            api,
        } => {
            let max_bytes = max_bytes.as_deref().map(cli::parse_size).transpose()?;
            let metadata: BTreeMap<String, String> = meta
                .iter()
                .map(|m| cli::parse_meta(m))
                .collect::<Result<_, _>>()?;
            let v = client(cfg, api)?.issue(&cli::IssueRequest {
                task,
                ttl: ttl.map(Into::into),
                max_rows: *max_rows,
                max_bytes,
                cap_mode: cap_mode.as_deref(),
                allow: allow.clone(),
                max_connections: *max_connections,
                statement_timeout: statement_timeout.map(Into::into),
                idle_in_transaction_timeout: idle_in_transaction_timeout.map(Into::into),
                metadata,
                superuser: *superuser,
            })?;
            print(&v, api.json, |v| {
                v.get("dsn")
                    .and_then(|d| d.as_str())
                    .unwrap_or("")
                    .to_string()
            })
        }
        TokenCmd::List { api } => {
            let v = client(cfg, api)?.list()?;
            print(&v, api.json, |v| {
                cli::token_table(v.as_array().map(Vec::as_slice).unwrap_or_default())
            })
        }
        TokenCmd::Show { id, api } => {
            let id = cli::token_id_arg(id)?;
            let v = client(cfg, api)?.show(&id)?;
            print(&v, api.json, cli::token_text)
        }
        TokenCmd::Discard { id, api } => {
            let id = cli::token_id_arg(id)?;
            let v = client(cfg, api)?.discard(&id)?;
            print(&v, api.json, |v| {
                format!(
                    "discarded the scratch data of {} ({})",
                    v.get("id").and_then(|d| d.as_str()).unwrap_or(&id),
                    cli::review_words(v)
                )
            })
        }
        TokenCmd::Revoke { id, api } => {
            let id = cli::token_id_arg(id)?;
            let v = client(cfg, api)?.revoke(&id)?;
            let id = v.get("id").and_then(|d| d.as_str()).unwrap_or(&id);
            print(&v, api.json, |_| format!("revoked {id}"))
        }
    }
}

fn golden(cfg: &Config, cmd: &GoldenCmd) -> Result<()> {
    match cmd {
        GoldenCmd::Build {
            from_dsn,
            schemas,
            exclude_tables,
            mask,
            activate,
            api,
        } => {
            let mask = match mask {
                Some(p) => Some(
                    std::fs::read_to_string(p)
                        .with_context(|| format!("reading masking rules {}", p.display()))?,
                ),
                None => None,
            };
            let body = serde_json::json!({
                "from_dsn": from_dsn,
                "schemas": schemas,
                "exclude_tables": exclude_tables,
                "mask": mask,
                "activate": activate,
            });
            let v = client(cfg, api)?.build_golden(body)?;
            print(&v, api.json, |v| {
                format!(
                    "built golden {}{}",
                    v.get("id").and_then(|d| d.as_str()).unwrap_or("-"),
                    if *activate {
                        " (in use for new tokens)"
                    } else {
                        ""
                    }
                )
            })
        }
        GoldenCmd::List { api } => {
            let v = client(cfg, api)?.goldens()?;
            print(&v, api.json, |v| {
                v.as_array()
                    .map(|a| {
                        a.iter()
                            .map(cli::golden_line)
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                    .unwrap_or_default()
            })
        }
        GoldenCmd::Use { version, api } => {
            let v = client(cfg, api)?.use_golden(version)?;
            print(&v, api.json, |_| {
                format!("golden {version} in use for new tokens")
            })
        }
    }
}

fn init_logging(format: &str) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDPIT_LOG")
        .unwrap_or_else(|_| "info".into());
    // Colour only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A log line that cannot be written (stderr on a full disk) is dropped: reporting that
    // failure goes through `eprintln!`, which panics the task that logged.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .log_internal_errors(false);
    match format {
        "json" => builder.json().init(),
        "text" => builder.init(),
        other => anyhow::bail!("--log-format must be text or json, not {other:?}"),
    }
    Ok(())
}

fn apply_serve_flags(cfg: &mut Config, args: &ServeArgs) {
    if let Some(l) = args.listen {
        cfg.listen = l;
    }
    if let Some(l) = args.api_listen {
        cfg.api_listen = l;
    }
    if let Some(g) = &args.golden_sql {
        cfg.golden.sql = Some(g.clone());
    }
}

fn check_config(mut cfg: Config, args: &ServeArgs) -> Result<()> {
    apply_serve_flags(&mut cfg, args);
    if !matches!(args.log_format.as_str(), "text" | "json") {
        anyhow::bail!(
            "--log-format must be text or json, not {:?}",
            args.log_format
        );
    }
    cfg.validate()?;
    let env_key = std::env::var("SANDPIT_ADMIN_KEY").ok();
    cfg.preflight(env_key.as_deref())?;
    if cfg.provider == "template" {
        // The one check that needs the server: whether task roles could log in past the gateway.
        if sandpit::server::check_template_network(&cfg)? {
            outln("template: pg_hba.conf admits task roles only from this gateway's address or a unix socket")?;
        } else {
            outln("template: trust_network = true, pg_hba.conf not checked")?;
        }
    }
    outln("config ok")?;
    Ok(())
}

fn serve(mut cfg: Config, args: &ServeArgs) -> Result<()> {
    init_logging(&args.log_format)?;
    apply_serve_flags(&mut cfg, args);
    // Buckets make fork and review times real Prometheus histograms (not summaries).
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("sandpit_fork_seconds".into()),
            &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
        )
        .context("configuring metric buckets")?
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("sandpit_review_seconds".into()),
            &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0],
        )
        .context("configuring metric buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    sandpit::control::describe_metrics();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let data_dir = cfg.data_dir.clone();
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
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            sandpit::server::stop::second_signal(&data_dir).await;
        });
        if cfg.worker.listen.is_some() {
            let tls = cfg.tls.mode != "off";
            return sandpit::server::worker::run(cfg, stop_rx, |api| {
                let scheme = if tls { "https" } else { "http" };
                println!("sandpit worker ready api={scheme}://{api}");
            })
            .await;
        }
        sandpit::server::run(cfg, Some(metrics), stop_rx, |pg, api| {
            println!("sandpit ready postgres={pg} api=http://{api}");
        })
        .await
    })?;
    Ok(())
}

fn mcp(dsn: &str, api: Option<&str>) -> Result<()> {
    // stdout carries the protocol only; logs go to stderr, quiet unless asked for.
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDPIT_LOG")
        .unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let target = sandpit::mcp::sql::SqlTarget::from_dsn(dsn).context("SANDPIT_DSN / --dsn")?;
    let server = match api {
        None => sandpit::mcp::McpServer::new(target),
        Some(api) => {
            let bearer = sandpit::mcp::review::full_token_of_dsn(dsn)
                .context("SANDPIT_DSN / --dsn does not carry a sandpit token")?;
            let url = format!("{}/mcp", api.trim_end_matches('/'));
            let review = sandpit::mcp::review::ReviewSource::Remote { url, bearer };
            sandpit::mcp::McpServer::with_review(target, review)
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(sandpit::mcp::stdio::serve(
        &server,
        tokio::io::BufReader::new(tokio::io::stdin()),
        tokio::io::stdout(),
    ))?;
    Ok(())
}

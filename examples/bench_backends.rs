//! The backends `bench/` measures the `template` and `remote` providers against, as a
//! process: the same servers the tests start (`tests/support/`), not copies of them.
//!
//! ```text
//! bench_backends postgres [MAX_CONNECTIONS]        a Postgres server for provider = "template"
//!                                                  (max_connections 100 unless given)
//! bench_backends remote ROOT GOLDEN_SQL            the sandbox service for provider = "remote",
//!                                                  forks under ROOT (an instance provider root)
//! ```
//!
//! Prints one JSON line once ready (`{"admin_dsn"}` or `{"url","api_key","copy_method"}`),
//! then serves until SIGTERM or SIGINT, and stops every server it started. Scratch files go
//! under `TMPDIR`. Run as root (Postgres itself runs as the unprivileged user).

#[allow(dead_code)]
#[path = "../tests/support/remote_server.rs"]
mod remote_server;
#[allow(dead_code)]
#[path = "../tests/support/shared_pg.rs"]
mod shared_pg;
#[path = "../tests/support/tempdir.rs"]
mod tempdir;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use tokio::signal::unix::{signal, SignalKind};

const USAGE: &str =
    "usage: bench_backends postgres [MAX_CONNECTIONS] | bench_backends remote ROOT GOLDEN_SQL";

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    // Held until a signal: dropping them stops the servers and their forks.
    let _running: Box<dyn std::any::Any> = match args.first().map(String::as_str) {
        Some("postgres") if args.len() <= 2 => {
            let max_connections = match args.get(1) {
                Some(n) => n.parse().context("MAX_CONNECTIONS: a number")?,
                None => 100,
            };
            let pg = shared_pg::SharedPg::start_with(max_connections).await;
            ready(serde_json::json!({ "admin_dsn": pg.admin_dsn() }));
            Box::new(pg)
        }
        Some("remote") if args.len() == 3 => {
            let root = PathBuf::from(&args[1]);
            let sql = PathBuf::from(&args[2]);
            let srv = remote_server::RemoteServer::start_at(root, &sql).await;
            ready(serde_json::json!({
                "url": srv.url,
                "api_key": srv.api_key,
                "copy_method": srv.copy_method(),
            }));
            Box::new(srv)
        }
        _ => bail!(USAGE),
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

fn ready(v: serde_json::Value) {
    println!("{v}");
}

//! The floor of a tokio relay, for `bench/relay-cost`: the same multi-thread runtime the
//! gateway runs on, relaying bytes between a TCP client and a Postgres unix socket with
//! `tokio::io::copy_bidirectional` — no framing, no log, no caps, no auth of its own.
//! What it costs per transaction is what the gateway's architecture costs before it does
//! any of its work; PgBouncer's count is the same transaction on a hand-written event loop.
//!
//! ```text
//! relay_floor LISTEN_PORT SOCKET_PATH     relays 127.0.0.1:LISTEN_PORT <-> SOCKET_PATH
//! ```
//!
//! Prints `ready` once listening; serves until killed.

use anyhow::{bail, Context, Result};
use tokio::net::{TcpListener, UnixStream};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [port, socket] = args.as_slice() else {
        bail!("usage: relay_floor LISTEN_PORT SOCKET_PATH");
    };
    let port: u16 = port.parse().context("LISTEN_PORT")?;
    let socket = socket.clone();
    // Built like the gateway's runtime (src/main.rs).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        println!("ready {}", std::process::id());
        loop {
            let (mut client, _) = listener.accept().await?;
            client.set_nodelay(true)?;
            let socket = socket.clone();
            tokio::spawn(async move {
                let Ok(mut server) = UnixStream::connect(&socket).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    })
}

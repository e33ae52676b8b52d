//! Host side of the channel to a guest's Postgres: a unix socket the gateway connects to,
//! each connection multiplexed over the VM's one virtio-serial port (the guest has no network
//! device). The guest's `sandpit-mux` (scripts/microvm-guest) speaks the other end.
//!
//! Frames both ways: type (1 byte), connection id (u32 BE), length (u32 BE), payload.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::provider::ProviderError;

/// Largest payload accepted from the guest (the mux sends at most 64 KiB).
const MAX_FRAME: usize = 1 << 20;
/// Payload size of the data frames sent to the guest.
const CHUNK: usize = 64 * 1024;
/// Frames queued towards the guest, and per connection towards the gateway: bounded, so a
/// slow reader holds back its writer instead of growing the gateway's memory (a stalled
/// connection holds back only its own VM's channel).
const QUEUE: usize = 64;

type Conns = Arc<Mutex<HashMap<u32, mpsc::Sender<Vec<u8>>>>>;
type Pongs = Arc<Mutex<HashMap<u32, oneshot::Sender<()>>>>;

/// A running bridge; its tasks end when it is dropped.
pub struct Bridge {
    out: mpsc::Sender<Vec<u8>>,
    pongs: Pongs,
    next_id: Arc<AtomicU32>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn frame(kind: u8, id: u32, data: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(9 + data.len());
    f.push(kind);
    f.extend_from_slice(&id.to_be_bytes());
    f.extend_from_slice(&(data.len() as u32).to_be_bytes());
    f.extend_from_slice(data);
    f
}

/// Connects to the VM's channel socket (QEMU's chardev server), waiting up to `deadline`
/// for it to appear.
pub async fn connect_channel(path: &Path, deadline: Duration) -> Result<UnixStream, ProviderError> {
    let start = std::time::Instant::now();
    loop {
        match UnixStream::connect(path).await {
            Ok(s) => return Ok(s),
            Err(source) if start.elapsed() > deadline => {
                return Err(ProviderError::NotReadyIo {
                    what: format!("channel {}", path.display()),
                    source,
                })
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

impl Bridge {
    /// Serves `listen` (a fresh unix socket path) over the connected channel `chan`.
    pub fn start(chan: UnixStream, listen: &Path) -> Result<Bridge, ProviderError> {
        let _ = std::fs::remove_file(listen);
        let listener = UnixListener::bind(listen)?;
        let (mut rd, mut wr) = chan.into_split();
        let (out, mut out_rx) = mpsc::channel::<Vec<u8>>(QUEUE);
        let conns: Conns = Arc::new(Mutex::new(HashMap::new()));
        let pongs: Pongs = Arc::new(Mutex::new(HashMap::new()));
        let next_id = Arc::new(AtomicU32::new(1));

        let writer = tokio::spawn(async move {
            while let Some(f) = out_rx.recv().await {
                if wr.write_all(&f).await.is_err() {
                    break;
                }
            }
        });

        let (c2, p2) = (conns.clone(), pongs.clone());
        let reader = tokio::spawn(async move {
            let mut head = [0u8; 9];
            loop {
                if rd.read_exact(&mut head).await.is_err() {
                    break;
                }
                let id = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
                let len = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) as usize;
                if len > MAX_FRAME {
                    tracing::warn!(len, "microvm channel: oversized frame; channel closed");
                    break;
                }
                let mut data = vec![0u8; len];
                if rd.read_exact(&mut data).await.is_err() {
                    break;
                }
                match head[0] {
                    b'D' => {
                        let tx = c2.lock().ok().and_then(|m| m.get(&id).cloned());
                        if let Some(tx) = tx {
                            let _ = tx.send(data).await;
                        }
                    }
                    b'C' => {
                        if let Ok(mut m) = c2.lock() {
                            m.remove(&id);
                        }
                    }
                    b'P' => {
                        if let Some(tx) = p2.lock().ok().and_then(|mut m| m.remove(&id)) {
                            let _ = tx.send(());
                        }
                    }
                    _ => {}
                }
            }
            // The channel is gone: every connection through it ends.
            if let Ok(mut m) = c2.lock() {
                m.clear();
            }
        });

        let (out2, c3, ids) = (out.clone(), conns.clone(), next_id.clone());
        let acceptor = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let id = ids.fetch_add(1, Ordering::Relaxed);
                let (tx, mut rx) = mpsc::channel::<Vec<u8>>(QUEUE);
                if let Ok(mut m) = c3.lock() {
                    m.insert(id, tx);
                }
                if out2.send(frame(b'O', id, &[])).await.is_err() {
                    break;
                }
                let (mut crd, mut cwr) = conn.into_split();
                let out3 = out2.clone();
                let c4 = c3.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; CHUNK];
                    loop {
                        match crd.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if out3.send(frame(b'D', id, &buf[..n])).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = out3.send(frame(b'C', id, &[])).await;
                    if let Ok(mut m) = c4.lock() {
                        m.remove(&id);
                    }
                });
                tokio::spawn(async move {
                    while let Some(d) = rx.recv().await {
                        if cwr.write_all(&d).await.is_err() {
                            break;
                        }
                    }
                    let _ = cwr.shutdown().await;
                });
            }
        });
        Ok(Bridge {
            out,
            pongs,
            next_id,
            tasks: vec![writer, reader, acceptor],
        })
    }

    /// Sets the guest's clock to the host's (after a restore, the guest's is the snapshot's).
    pub async fn set_clock(&self) -> Result<(), ProviderError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let text = format!("{}.{:06}", now.as_secs(), now.subsec_micros());
        self.send(frame(b'T', 0, text.as_bytes())).await
    }

    async fn send(&self, f: Vec<u8>) -> Result<(), ProviderError> {
        self.out
            .send(f)
            .await
            .map_err(|_| ProviderError::NotReady("microvm channel closed".into()))
    }

    /// Mixes fresh host entropy into the guest's kernel RNG (on top of vmgenid's reseed).
    pub async fn reseed(&self) -> Result<(), ProviderError> {
        let mut seed = [0u8; 64];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))?;
        self.send(frame(b'R', 0, &seed)).await
    }

    /// Round trip through the guest's mux: it runs and reads the channel.
    pub async fn ping(&self, deadline: Duration) -> Result<(), ProviderError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut m) = self.pongs.lock() {
            m.insert(id, tx);
        }
        self.send(frame(b'P', id, b"ping")).await?;
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(ProviderError::NotReady(format!(
                "guest did not answer on its channel within {deadline:?}"
            ))),
        }
    }
}

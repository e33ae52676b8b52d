//! Relay cores: one current-thread tokio runtime per CPU, each driven by a thread of its
//! own, for the relay loops whose sockets can all move there.
//!
//! Counted with callgrind (`bench/relay-cost`), the multi-thread scheduler costs a relayed
//! round trip about 1.3 k instructions more than a current-thread one: per wake-up each
//! worker reads the clock four times and computes a `pow` for its poll-time average (the
//! self-tuning of the global queue interval, which no `Builder` option turns off), keeps
//! its idle and steal bookkeeping, and checks the other workers' queues. A session's
//! relay does not need any of it: it is one task that waits on its two sockets.
//!
//! What stays on the main runtime: everything before the relay (negotiation, TLS, SCRAM,
//! the fork and the backend login, which may block a worker for a while), and the relay of
//! a session with a TLS client or a TCP backend (those sockets stay registered with the
//! main runtime's event loop, so relaying them elsewhere would add a cross-thread wake-up
//! per message). A plain client and a unix-socket backend are re-registered by the relay
//! itself (`wire::socket`), on whichever runtime runs it.
//!
//! Fairness: a relay still yields after its turn of frames (`turn`); on a core the other
//! relays of that core run in between, as the other tasks of a worker did. What a core
//! does not do is steal: sessions are dealt to the cores in turn when they start, and a
//! core with two busy sessions shares its CPU between them while another core may be idle.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle};

/// The cores, started on first use; None when none could be started (relays then run on
/// the main runtime, as before).
struct Cores {
    handles: Vec<Handle>,
    next: AtomicUsize,
}

fn cores() -> Option<&'static Cores> {
    static CORES: OnceLock<Option<Cores>> = OnceLock::new();
    CORES.get_or_init(start).as_ref()
}

fn start() -> Option<Cores> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let rt = match Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::warn!(error = %e, "relay core not started");
                break;
            }
        };
        let handle = rt.handle().clone();
        let started = std::thread::Builder::new()
            .name(format!("sandpit-relay-{i}"))
            .spawn(move || rt.block_on(std::future::pending::<()>()));
        match started {
            Ok(_) => handles.push(handle),
            Err(e) => {
                tracing::warn!(error = %e, "relay core not started");
                break;
            }
        }
    }
    (!handles.is_empty()).then(|| Cores {
        handles,
        next: AtomicUsize::new(0),
    })
}

/// Runs `relay` on the next core and waits for it; on the calling runtime when there is no
/// core. A panic in it ends only it, as in a task of its own; dropping the waiting future
/// (its runtime shutting down) drops the relay too, as before.
pub async fn run<F>(relay: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let Some(c) = cores() else {
        return relay.await;
    };
    let i = c.next.fetch_add(1, Ordering::Relaxed) % c.handles.len();
    let task = c.handles[i].spawn(relay);
    let _abort = AbortOnDrop(task.abort_handle());
    let _ = task.await;
}

/// Aborts the task when dropped (a no-op once it finished).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

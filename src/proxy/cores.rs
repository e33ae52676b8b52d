//! The relay threads (`relay_threads`, off by default): one single-threaded runtime per
//! thread, each running whole sessions (accept to end), a new session going to the thread
//! with the fewest.
//!
//! Why they are off by default: there is no work stealing between them, so a session that
//! floods its thread delays every session dealt to the same thread even while another
//! thread idles (measured: docs/BENCHMARKS.md, "Relay cost, round six"). Why they exist:
//! a relayed round trip is
//! a few reads and writes, and that pool's work stealing, per-batch statistics (two clock
//! reads and a `pow` per batch) and cross-thread wake-ups cost about 1.3 k instructions per
//! transaction of the ~18 k the relay spends (measured with `bench/callgrind.sh`, see
//! docs/BENCHMARKS.md). A session's sockets are registered with its own thread's reactor, so
//! its reads, writes and timers never leave that thread. What a session asks of the
//! gateway's lifecycle (forking, resuming a backend) runs on the main pool through
//! [`RelayCores::on_main`], so a slow fork never holds a relay thread.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// The relay threads and the main pool's handle.
pub struct RelayCores {
    cores: Vec<Core>,
    /// Where ties start, so equal threads take turns.
    next: AtomicUsize,
    main: Handle,
}

struct Core {
    handle: Handle,
    /// Sessions now running on this thread.
    sessions: Arc<AtomicUsize>,
    /// Dropped with the cores: the thread's runtime stops and drops what it still runs.
    _stop: oneshot::Sender<()>,
}

/// Why the relay threads could not start.
#[derive(Debug, thiserror::Error)]
pub enum CoresError {
    /// Called outside a Tokio runtime (the main pool is the caller's).
    #[error("the relay threads must be started from inside the main runtime")]
    NoMainRuntime,
    /// A runtime or thread could not be created.
    #[error("starting relay thread {index}: {source}")]
    Start {
        /// Which thread.
        index: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl RelayCores {
    /// Start `threads` relay threads (at least one). Called on the main runtime.
    pub fn start(threads: usize) -> Result<RelayCores, CoresError> {
        let main = Handle::try_current().map_err(|_| CoresError::NoMainRuntime)?;
        let n = threads.max(1);
        let mut cores = Vec::with_capacity(n);
        for index in 0..n {
            let start = |source| CoresError::Start { index, source };
            let rt = Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(start)?;
            let handle = rt.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("sandpit-relay-{index}"))
                .spawn(move || {
                    rt.block_on(async {
                        let _ = stopped.await;
                    });
                    // Sessions still open are dropped (their sockets closed); a blocking
                    // task in flight is not waited for.
                    rt.shutdown_background();
                })
                .map_err(start)?;
            cores.push(Core {
                handle,
                sessions: Arc::new(AtomicUsize::new(0)),
                _stop: stop,
            });
        }
        Ok(RelayCores {
            cores,
            next: AtomicUsize::new(0),
            main,
        })
    }

    /// How many relay threads run.
    pub fn len(&self) -> usize {
        self.cores.len()
    }

    /// Always false: there is at least one thread.
    pub fn is_empty(&self) -> bool {
        self.cores.is_empty()
    }

    /// Sessions running on each thread, in thread order.
    pub fn loads(&self) -> Vec<usize> {
        self.cores
            .iter()
            .map(|c| c.sessions.load(Ordering::Relaxed))
            .collect()
    }

    /// Run `session` on the thread with the fewest sessions. `session` is built there, so
    /// the sockets it registers belong to that thread's reactor.
    pub fn spawn<F, Fut>(&self, session: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let core = &self.cores[self.pick()];
        let count = core.sessions.clone();
        count.fetch_add(1, Ordering::Relaxed);
        let guard = Running(count);
        core.handle.spawn(async move {
            let _guard = guard;
            session().await
        });
    }

    /// The thread with the fewest sessions, ties taken in turn.
    fn pick(&self) -> usize {
        let n = self.cores.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let mut best = start;
        let mut least = usize::MAX;
        for k in 0..n {
            let i = (start + k) % n;
            let load = self.cores[i].sessions.load(Ordering::Relaxed);
            if load < least {
                least = load;
                best = i;
            }
        }
        best
    }

    /// Run `work` on the main pool and wait for it: what may take long or spawn work of its
    /// own (a fork, a resume) never runs on a relay thread. Already on the main pool, it
    /// runs in place. None: the work panicked or the main pool is shutting down.
    pub async fn on_main<F, T>(&self, work: F) -> Option<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let here = Handle::try_current().ok().map(|h| h.id());
        if here == Some(self.main.id()) {
            return Some(work.await);
        }
        self.main.spawn(work).await.ok()
    }
}

/// Counts a session on its thread while it runs (also when it is dropped unfinished).
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_go_to_the_least_loaded_thread_and_run_there() {
        let cores = Arc::new(RelayCores::start(3).unwrap());
        assert_eq!(cores.len(), 3);
        let (release, released) = tokio::sync::watch::channel(false);
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..6 {
            let mut released = released.clone();
            let seen_tx = seen_tx.clone();
            cores.spawn(move || async move {
                let name = std::thread::current().name().map(str::to_string);
                let _ = seen_tx.send(name);
                let _ = released.wait_for(|r| *r).await;
            });
        }
        let mut names = Vec::new();
        for _ in 0..6 {
            names.push(seen.recv().await.flatten().unwrap());
        }
        names.sort();
        assert_eq!(
            names,
            [
                "sandpit-relay-0",
                "sandpit-relay-0",
                "sandpit-relay-1",
                "sandpit-relay-1",
                "sandpit-relay-2",
                "sandpit-relay-2"
            ]
        );
        assert_eq!(cores.loads(), [2, 2, 2]);
        release.send(true).unwrap();
        // Each guard drops when its session ends on its thread; up to 10 s on a loaded machine.
        for _ in 0..1000 {
            if cores.loads() == [0, 0, 0] {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(cores.loads(), [0, 0, 0]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_sent_to_main_runs_on_the_main_pool() {
        let cores = Arc::new(RelayCores::start(1).unwrap());
        let main = Handle::current().id();
        let (tx, rx) = oneshot::channel();
        let c = cores.clone();
        cores.spawn(move || async move {
            let relay = Handle::current().id();
            let ran_on = c.on_main(async { Handle::current().id() }).await;
            let _ = tx.send((relay, ran_on));
        });
        let (relay, ran_on) = rx.await.unwrap();
        assert_ne!(relay, main);
        assert_eq!(ran_on, Some(main));
        // From the main pool itself, in place.
        assert_eq!(cores.on_main(async { 7 }).await, Some(7));
    }
}

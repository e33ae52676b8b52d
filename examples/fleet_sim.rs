//! The fleet simulation (issue 32 item 5; `bench/fleet-sim` runs it): a real registry
//! Postgres (the tests' `shared_pg` server: TLS + SCRAM over TCP), simulated workers that
//! answer the real worker API over HTTP without forking anything (one listener each, all in
//! this process), and fronts that are the library's own `remote` provider over all workers
//! with the registry's book of their room (`server::fleet::RegistryRooms`), each with its own
//! registry connection pool, watched every second as `serve` watches them.
//!
//! A task is what a front does for a token's first connection, minus the session: the token
//! record inserted (issue), the token's cross-front lock taken (a registry connection of its
//! own), the fork placed (the book read, the room counted, create and TTL on the chosen
//! worker) and the claim recorded. `--place-only` leaves out all but the placement.
//!
//! ```text
//! fleet_sim [--workers 100] [--fronts 4] [--tasks 10000] [--rates 50,100,200,400,800]
//!           [--in-flight 64] [--place-only]
//! ```
//!
//! Tasks are started open-loop at each rate in turn (the tasks split evenly over the rates),
//! at most `--in-flight` per front at once; a step prints one JSON line: target and achieved
//! rate, placement and task latency (median, p99, ms), registry transactions per second
//! (`pg_stat_database`), placements refused. Run as root (Postgres runs as its own user).

#[allow(dead_code)]
#[path = "../tests/support/shared_pg.rs"]
mod shared_pg;
#[path = "../tests/support/tempdir.rs"]
mod tempdir;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use sandpit::auth::Verifier;
use sandpit::pgconn::tls::SslMode;
use sandpit::provider::remote::{RemoteConfig, RemoteProvider, RemoteSet};
use sandpit::provider::remote_api::{
    Capacity, Connection, CreateSandbox, Sandbox, SandboxList, SandboxState,
};
use sandpit::provider::{BackendTag, Provider};
use sandpit::registry::pool::PoolLimits;
use sandpit::registry::postgres::PgRegistryConfig;
use sandpit::registry::workers::WorkerBook;
use sandpit::registry::{Caps, Registry, TokenRecord, TokenState};
use sandpit::server::fleet::RegistryRooms;
use time::OffsetDateTime;
use tokio::sync::Semaphore;

/// Room of each simulated worker (10 000 tasks over 100 workers fit).
const MAX_SANDBOXES: u64 = 1000;
const KEY: &str = "fleet-sim-bearer-key-0123456789";

struct Args {
    workers: usize,
    fronts: usize,
    tasks: usize,
    rates: Vec<u64>,
    in_flight: usize,
    place_only: bool,
}

fn args() -> Result<Args> {
    let mut a = Args {
        workers: 100,
        fronts: 4,
        tasks: 10_000,
        rates: vec![50, 100, 200, 400, 800],
        in_flight: 64,
        place_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().with_context(|| format!("{k} needs a value"));
        match k.as_str() {
            "--workers" => a.workers = v()?.parse()?,
            "--fronts" => a.fronts = v()?.parse()?,
            "--tasks" => a.tasks = v()?.parse()?,
            "--in-flight" => a.in_flight = v()?.parse()?,
            "--rates" => a.rates = v()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--place-only" => a.place_only = true,
            other => bail!("unknown argument {other}"),
        }
    }
    if a.workers == 0 || a.fronts == 0 || a.rates.is_empty() || a.in_flight == 0 {
        bail!("workers, fronts, in-flight and rates must be non-zero");
    }
    Ok(a)
}

/// One simulated worker: its sandboxes (no forks behind them) and what it hands out as the
/// sandbox's door (the registry server's port; nothing connects in this simulation).
struct SimWorker {
    sandboxes: Mutex<HashMap<String, Sandbox>>,
    door_port: u16,
    creates: AtomicU64,
}

async fn capacity(State(w): State<Arc<SimWorker>>) -> Json<Capacity> {
    let held = w.sandboxes.lock().map(|s| s.len() as u64).unwrap_or(0);
    Json(Capacity {
        max_sandboxes: MAX_SANDBOXES,
        sandboxes: held,
        warm: 0,
        draining: false,
    })
}

async fn create(State(w): State<Arc<SimWorker>>, Json(req): Json<CreateSandbox>) -> Response {
    w.creates.fetch_add(1, Ordering::Relaxed);
    let id = format!("sim-{}", hex::encode(rand::random::<[u8; 8]>()));
    let sb = Sandbox {
        id: id.clone(),
        golden: req.golden,
        state: SandboxState::Ready,
        metadata: req.metadata,
        expires_at: None,
        connection: Some(Connection {
            host: "127.0.0.1".into(),
            port: w.door_port,
            user: "agent".into(),
            password: None,
            database: "sim".into(),
            sslmode: None,
        }),
        error: None,
        version: None,
    };
    let Ok(mut all) = w.sandboxes.lock() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    if all.len() as u64 >= MAX_SANDBOXES {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    all.insert(id, sb.clone());
    (StatusCode::CREATED, Json(sb)).into_response()
}

async fn show(State(w): State<Arc<SimWorker>>, Path(id): Path<String>) -> Response {
    match w.sandboxes.lock().ok().and_then(|s| s.get(&id).cloned()) {
        Some(sb) => Json(sb).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn list(State(w): State<Arc<SimWorker>>) -> Json<SandboxList> {
    let sandboxes = w
        .sandboxes
        .lock()
        .map(|s| s.values().cloned().collect())
        .unwrap_or_default();
    Json(SandboxList { sandboxes })
}

async fn delete(State(w): State<Arc<SimWorker>>, Path(id): Path<String>) -> StatusCode {
    match w.sandboxes.lock().ok().and_then(|mut s| s.remove(&id)) {
        Some(_) => StatusCode::NO_CONTENT,
        None => StatusCode::NOT_FOUND,
    }
}

/// Starts one simulated worker; returns its URL.
async fn sim_worker(door_port: u16) -> Result<(String, Arc<SimWorker>)> {
    let w = Arc::new(SimWorker {
        sandboxes: Mutex::new(HashMap::new()),
        door_port,
        creates: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/v1/sandboxes", get(list).post(create))
        .route("/v1/sandboxes/{id}", get(show).delete(delete))
        .route("/v1/sandboxes/{id}/ttl", put(show))
        .route("/v1/capacity", get(capacity))
        .route("/v1/drain", post(capacity))
        .with_state(w.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", l.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    Ok((url, w))
}

/// A front: the token registry and the `remote` provider over every worker, placing from
/// the registry's book.
struct Front {
    registry: Registry,
    set: RemoteSet,
}

async fn front(reg: &PgRegistryConfig, urls: &[String]) -> Result<Front> {
    let registry = Registry::open_postgres(reg, Duration::from_secs(5)).await?;
    let store = registry.shared().context("shared registry")?.clone();
    let members = urls
        .iter()
        .map(|u| {
            let p = RemoteProvider::new(RemoteConfig {
                url: u.clone(),
                api_key: Some(KEY.into()),
                golden: "sim".into(),
                owner: "fleet-sim".into(),
                connect_timeout: Duration::from_secs(5),
                request_timeout: Duration::from_secs(30),
                fork_timeout: Duration::from_secs(60),
                retries: 2,
                ttl_grace: Duration::from_secs(60),
                sslmode: SslMode::Disable,
                ca_file: None,
            })?;
            Ok((u.clone(), p))
        })
        .collect::<Result<Vec<_>>>()?;
    let book = WorkerBook::open(store).await?;
    let set = RemoteSet::new(members)?
        .with_lost_after(Duration::from_secs(300))
        .with_book(Arc::new(RegistryRooms(book)))
        .await?;
    Ok(Front { registry, set })
}

fn record(id: &str, verifier: &Verifier) -> TokenRecord {
    let now = OffsetDateTime::now_utc();
    TokenRecord {
        id: id.into(),
        task: "fleet-sim".into(),
        metadata: BTreeMap::new(),
        created_at: now,
        expires_at: now + time::Duration::hours(1),
        caps: Caps {
            max_rows: 200,
            max_bytes: 1 << 20,
            max_connections: 4,
            cap_mode: Default::default(),
            allow: None,
            statement_timeout_ms: 0,
            idle_in_transaction_timeout_ms: 0,
        },
        state: TokenState::Issued,
        verifier: verifier.clone(),
        backend: None,
        fork_count: 0,
        golden: None,
        superuser: false,
        ended_at: None,
        end: None,
        review_error: None,
        ended_why: None,
    }
}

/// One task; returns (placement time, whole task time).
async fn task(f: &Front, id: String, verifier: &Verifier, place_only: bool) -> Result<(f64, f64)> {
    let t0 = Instant::now();
    let tag = BackendTag {
        token_id: id.clone(),
        task: "fleet-sim".into(),
        expires_at: sandpit::rfc3339::format(OffsetDateTime::now_utc() + time::Duration::hours(1)),
        gateway_id: "fleet-sim".into(),
        golden: None,
    };
    if place_only {
        f.set.fork(&tag).await?;
        let t = t0.elapsed().as_secs_f64() * 1e3;
        return Ok((t, t));
    }
    f.registry.insert(record(&id, verifier)).await?;
    let _lock = f.registry.lock_token(&id).await?;
    f.registry.fresh(&id).await?;
    let p0 = Instant::now();
    let b = f.set.fork(&tag).await?;
    let placed = p0.elapsed().as_secs_f64() * 1e3;
    f.registry.claim(&id, &b.handle, None).await?;
    Ok((placed, t0.elapsed().as_secs_f64() * 1e3))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

async fn xacts(pg: &shared_pg::SharedPg) -> Result<i64> {
    let c = pg.admin("postgres").await;
    let r = c
        .query_one(
            "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = 'sandpit_registry'",
            &[],
        )
        .await?;
    Ok(r.get(0))
}

/// What every step runs on.
struct Sim {
    fronts: Vec<Arc<Front>>,
    /// Per front: its tasks in flight.
    limits: Vec<Arc<Semaphore>>,
    pg: shared_pg::SharedPg,
    place_only: bool,
    verifier: Verifier,
}

/// One rate step: `n` tasks started at `rate` per second over all fronts.
async fn step(sim: &Sim, rate: u64, n: usize, first_id: usize) -> Result<serde_json::Value> {
    let (fronts, limits, pg) = (&sim.fronts, &sim.limits, &sim.pg);
    let (place_only, verifier) = (sim.place_only, &sim.verifier);
    // The statistics collector lags by up to 500 ms: flush before each reading.
    let x0 = xacts(pg).await?;
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut handles = Vec::with_capacity(n);
    for k in 0..n {
        tick.tick().await;
        let i = k % fronts.len();
        let (f, sem, v) = (fronts[i].clone(), limits[i].clone(), verifier.clone());
        // At most `in_flight` per front: past it, starting waits (the achieved rate drops).
        let permit = sem.acquire_owned().await?;
        let id = format!("sp_sim{:06}", first_id + k);
        handles.push(tokio::spawn(async move {
            let r = task(&f, id, &v, place_only).await;
            drop(permit);
            r
        }));
    }
    let (mut placed, mut whole, mut failed) = (Vec::new(), Vec::new(), 0u64);
    let mut first_error = None;
    for h in handles {
        match h.await? {
            Ok((p, w)) => {
                placed.push(p);
                whole.push(w);
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let x1 = xacts(pg).await?;
    let round = |x: f64| (x * 100.0).round() / 100.0;
    Ok(serde_json::json!({
        "target_per_s": rate,
        "tasks": n,
        "achieved_per_s": round(n as f64 / secs),
        "place_p50_ms": round(pct(&mut placed, 0.5)),
        "place_p99_ms": round(pct(&mut placed, 0.99)),
        "task_p50_ms": round(pct(&mut whole, 0.5)),
        "task_p99_ms": round(pct(&mut whole, 0.99)),
        "registry_xact_per_s": round((x1 - x0) as f64 / secs),
        "registry_xact_per_task": round((x1 - x0) as f64 / n as f64),
        "failed": failed,
        "first_error": first_error,
    }))
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let pg = shared_pg::SharedPg::start_with(500).await;
    pg.admin("postgres")
        .await
        .batch_execute("CREATE DATABASE sandpit_registry")
        .await?;
    let reg = PgRegistryConfig {
        url: pg.admin_dsn().replace("/postgres", "/sandpit_registry"),
        sslmode: Some(SslMode::VerifyFull),
        ca_file: Some(pg.ca_file.clone()),
        pool: PoolLimits::default(),
    };
    let mut urls = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..a.workers {
        let (u, w) = sim_worker(pg.port).await?;
        urls.push(u);
        workers.push(w);
    }
    let mut fronts = Vec::new();
    for _ in 0..a.fronts {
        fronts.push(Arc::new(front(&reg, &urls).await?));
    }
    // Each front watches the workers every second (asks those due, records the answers),
    // as `serve` does; a report is due every 2 s, so the fronts share the asking.
    for f in &fronts {
        let f = f.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                if let Some(fleet) = f.set.fleet() {
                    fleet.check().await;
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle0 = xacts(&pg).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = (xacts(&pg).await? - idle0) as f64 / 5.0;
    println!(
        "{}",
        serde_json::json!({"workers": a.workers, "fronts": a.fronts, "tasks": a.tasks,
            "place_only": a.place_only, "in_flight_per_front": a.in_flight,
            "idle_registry_xact_per_s": idle})
    );
    let verifier = Verifier::from_secret(&sandpit::auth::new_secret());
    let limits: Vec<Arc<Semaphore>> = (0..a.fronts)
        .map(|_| Arc::new(Semaphore::new(a.in_flight)))
        .collect();
    let per = a.tasks / a.rates.len();
    let sim = Sim {
        fronts,
        limits,
        pg,
        place_only: a.place_only,
        verifier,
    };
    for (i, &rate) in a.rates.iter().enumerate() {
        let line = step(&sim, rate, per, i * per).await?;
        println!("{line}");
    }
    let creates: u64 = workers
        .iter()
        .map(|w| w.creates.load(Ordering::Relaxed))
        .sum();
    let held: Vec<usize> = workers
        .iter()
        .map(|w| w.sandboxes.lock().map(|s| s.len()).unwrap_or(0))
        .collect();
    println!(
        "{}",
        serde_json::json!({"creates": creates,
            "per_worker_min": held.iter().min(), "per_worker_max": held.iter().max()})
    );
    Ok(())
}

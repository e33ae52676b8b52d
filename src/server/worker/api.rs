//! The worker's sandbox API: the routes of `docs/remote-provider.yaml` over the node's own
//! provider (instance forks, the warm pool when configured), with its capacity report.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use time::OffsetDateTime;
use tokio::net::TcpListener;

use super::answer::{authorized, err};
use super::relay::{self, Door};
use super::{lock, Entry, Worker};
use crate::provider::remote_api::{
    self as api, Capacity, Connection, CreateSandbox, Drain, Sandbox, SandboxList, SandboxState,
    SetTtl,
};
use crate::provider::BackendTag;

/// The API's routes.
pub(super) fn router(w: Arc<Worker>) -> Router {
    Router::new()
        .route("/v1/sandboxes", get(list).post(create))
        .route("/v1/sandboxes/{id}", get(show).delete(delete))
        .route("/v1/sandboxes/{id}/ttl", put(set_ttl))
        .route("/v1/capacity", get(capacity))
        .route("/v1/drain", post(drain))
        .route(
            "/v1/goldens",
            get(super::goldens::list).post(super::goldens::build),
        )
        .route("/v1/goldens/{id}/use", post(super::goldens::use_version))
        .with_state(w)
}

/// Answers 401 unless the request bears the worker's key.
macro_rules! authorize {
    ($w:expr, $h:expr) => {
        if !authorized(&$w, &$h) {
            tracing::warn!("worker API: request without the right bearer key");
            return err(StatusCode::UNAUTHORIZED, "bad api key");
        }
    };
}

async fn create(
    State(w): State<Arc<Worker>>,
    h: HeaderMap,
    Json(req): Json<CreateSandbox>,
) -> Response {
    authorize!(w, h);
    if req.golden != w.golden {
        return err(StatusCode::NOT_FOUND, "no such golden on this worker");
    }
    let key = h
        .get(api::IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .filter(|k| k.len() <= 200)
        .map(str::to_string);
    if let Some(k) = &key {
        let known = lock(&w.by_key).get(k).cloned();
        if let Some(e) = known.and_then(|id| lock(&w.sandboxes).get(&id).map(|e| e.sb.clone())) {
            return (StatusCode::OK, Json(e)).into_response();
        }
    }
    let id = format!("sbx-{}", hex::encode(rand::random::<[u8; 9]>()));
    let sb = Sandbox {
        id: id.clone(),
        golden: req.golden,
        state: SandboxState::Creating,
        metadata: req.metadata,
        expires_at: None,
        connection: None,
        error: None,
        version: None,
    };
    {
        // Counted and inserted under one lock: two creates cannot both take the last room.
        let mut all = lock(&w.sandboxes);
        if let Some(why) = refusal(&w, held(&all)) {
            drop(all);
            tracing::info!(reason = %why, "worker: create refused");
            return err(StatusCode::SERVICE_UNAVAILABLE, &why);
        }
        all.insert(id.clone(), Entry::new(sb.clone()));
    }
    if let Some(k) = key {
        lock(&w.by_key).insert(k, id.clone());
    }
    tokio::spawn(fork(w.clone(), id));
    (StatusCode::ACCEPTED, Json(sb)).into_response()
}

/// Sandboxes that take room: being created or ready (a failed one holds no fork).
fn held(all: &std::collections::HashMap<String, Entry>) -> u64 {
    all.values()
        .filter(|e| e.sb.state != SandboxState::Failed)
        .count() as u64
}

/// Why a new sandbox is refused now, if it is: draining, or full.
fn refusal(w: &Worker, held: u64) -> Option<String> {
    if w.draining.load(Ordering::SeqCst) {
        return Some("worker is draining: it makes no new sandboxes".into());
    }
    (held >= w.max_sandboxes).then(|| {
        format!(
            "worker is full: {held} of {} sandboxes (worker.max_sandboxes)",
            w.max_sandboxes
        )
    })
}

/// `GET /v1/capacity`: room for new sandboxes, for fronts' placement.
async fn capacity(State(w): State<Arc<Worker>>, h: HeaderMap) -> Response {
    authorize!(w, h);
    capacity_now(&w)
}

/// `POST /v1/drain`: no new sandboxes from now on (`{"draining": false}`: take them again);
/// the ones held keep serving until deleted or past their TTL. Answers the capacity.
async fn drain(State(w): State<Arc<Worker>>, h: HeaderMap, body: axum::body::Bytes) -> Response {
    authorize!(w, h);
    let req = if body.iter().all(u8::is_ascii_whitespace) {
        Drain { draining: true }
    } else {
        match serde_json::from_slice::<Drain>(&body) {
            Ok(d) => d,
            Err(_) => return err(StatusCode::BAD_REQUEST, "body: {\"draining\": true|false}"),
        }
    };
    let was = w.draining.swap(req.draining, Ordering::SeqCst);
    if was != req.draining {
        tracing::info!(
            draining = req.draining,
            "worker: {}",
            if req.draining {
                "draining: no new sandboxes"
            } else {
                "no longer draining"
            }
        );
    }
    capacity_now(&w)
}

fn capacity_now(w: &Worker) -> Response {
    let sandboxes = held(&lock(&w.sandboxes));
    Json(Capacity {
        max_sandboxes: w.max_sandboxes,
        sandboxes,
        warm: w.pool.as_ref().map_or(0, |p| p.ready() as u64),
        draining: w.draining.load(Ordering::SeqCst),
    })
    .into_response()
}

/// Forks in the background (clients poll), then opens the fork's door.
async fn fork(w: Arc<Worker>, id: String) {
    let meta = lock(&w.sandboxes).get(&id).map(|e| e.sb.metadata.clone());
    let Some(meta) = meta else { return };
    let tag = BackendTag {
        token_id: id.clone(),
        task: meta.get(api::META_TASK).cloned().unwrap_or_default(),
        expires_at: meta.get(api::META_EXPIRES).cloned().unwrap_or_default(),
        gateway_id: super::GATEWAY_ID.into(),
        golden: None,
    };
    let result = async {
        let b = w.provider.fork(&tag).await.map_err(|e| e.to_string())?;
        // A pool member claimed for a provider that leaves ownership to a registry record
        // still carries the pool's tag: a worker keeps no token records, so it re-tags it.
        if w.provider.claims_by_record() {
            if let Err(e) = w.provider.retag(&b.handle, &tag).await {
                let _ = w.provider.destroy(&b.handle).await;
                return Err(e.to_string());
            }
        }
        let opened = open_door(&w, &b).await;
        match opened {
            Ok((task, conn)) => Ok((b.handle, task, (conn, b.golden))),
            Err(e) => {
                let _ = w.provider.destroy(&b.handle).await;
                Err(e)
            }
        }
    }
    .await;
    // Decided under the lock, awaited after it.
    let (orphan, ready) = {
        let mut all = lock(&w.sandboxes);
        match (all.get_mut(&id), result) {
            (None, Ok((handle, task, _))) => {
                task.abort();
                (Some(handle), None)
            }
            (None, Err(_)) => (None, None),
            (Some(e), Ok((handle, task, (conn, version)))) => {
                e.sb.state = SandboxState::Ready;
                e.sb.connection = Some(conn);
                // The front records it with the token (reviews, promotion's masking).
                e.sb.version = version;
                e.handle = Some(handle.clone());
                e.door = Some(task);
                (None, Some((e.sb.clone(), handle)))
            }
            (Some(e), Err(msg)) => {
                tracing::warn!(sandbox = %id, error = %msg, "worker fork failed");
                e.sb.state = SandboxState::Failed;
                e.sb.error = Some(msg);
                (None, None)
            }
        }
    };
    if let Some(handle) = orphan {
        // Deleted while it was being forked.
        let _ = w.provider.destroy(&handle).await;
    }
    if let Some((sb, handle)) = ready {
        keep(&w, sb, handle).await;
    }
}

/// Records a ready sandbox for adoption after a crash (a failure only costs that), off the
/// async threads (the record is synced to disk).
async fn keep(w: &Arc<Worker>, sb: Sandbox, handle: String) {
    let w = w.clone();
    let saved = tokio::task::spawn_blocking(move || {
        w.keeper
            .save(&sb, &handle)
            .map_err(|e| format!("sandbox {}: {e}", sb.id))
    })
    .await;
    let failed = match saved {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e,
        Err(e) => e.to_string(),
    };
    tracing::warn!(error = %failed, "worker: recording a sandbox failed; it is not adopted after a crash");
}

/// The fork's door: a TCP port on the worker's address (never one of the earlier run's
/// doors), with a password of its own.
pub(super) async fn open_door(
    w: &Worker,
    b: &crate::provider::Backend,
) -> Result<(tokio::task::JoinHandle<()>, Connection), String> {
    let socket = b
        .target
        .socket_path()
        .ok_or("the fork has no unix socket")?
        .to_path_buf();
    // Ports of the earlier run held open while binding again, so each is skipped once.
    let mut skipped = Vec::new();
    let (l, port) = loop {
        let l = TcpListener::bind((w.listen_ip, 0))
            .await
            .map_err(|e| e.to_string())?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        if !w.old_ports.contains(&port) || skipped.len() >= 64 {
            break (l, port);
        }
        skipped.push(l);
    };
    drop(skipped);
    let door = Arc::new(Door {
        socket,
        user: b.target.user.clone(),
        password: crate::auth::new_secret(),
        tls: w.tls.clone(),
    });
    let conn = Connection {
        host: w.host.clone(),
        port,
        user: door.user.clone(),
        password: Some(door.password.clone()),
        database: b.target.database.clone(),
        sslmode: Some(
            if w.tls.is_some() {
                "require"
            } else {
                "disable"
            }
            .into(),
        ),
    };
    Ok((tokio::spawn(relay::serve(l, door)), conn))
}

async fn show(State(w): State<Arc<Worker>>, h: HeaderMap, Path(id): Path<String>) -> Response {
    authorize!(w, h);
    match lock(&w.sandboxes).get(&id) {
        Some(e) => Json(e.sb.clone()).into_response(),
        None => err(StatusCode::NOT_FOUND, "no such sandbox"),
    }
}

async fn set_ttl(
    State(w): State<Arc<Worker>>,
    h: HeaderMap,
    Path(id): Path<String>,
    Json(req): Json<SetTtl>,
) -> Response {
    authorize!(w, h);
    // Bounded so the addition cannot overflow: ten years is past any token.
    let secs = req.ttl_seconds.min(10 * 365 * 24 * 3600) as i64;
    let at = OffsetDateTime::now_utc() + time::Duration::seconds(secs);
    let found = lock(&w.sandboxes).get_mut(&id).map(|e| {
        e.expires = Some(at);
        e.sb.expires_at = crate::rfc3339::try_format(at).ok();
        (e.sb.clone(), e.handle.clone())
    });
    match found {
        Some((sb, handle)) => {
            // A ready sandbox's record follows its TTL (one still forking is recorded ready).
            if let Some(h) = handle {
                keep(&w, sb.clone(), h).await;
            }
            Json(sb).into_response()
        }
        None => err(StatusCode::NOT_FOUND, "no such sandbox"),
    }
}

async fn delete(State(w): State<Arc<Worker>>, h: HeaderMap, Path(id): Path<String>) -> Response {
    authorize!(w, h);
    match w.remove(&id).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => err(StatusCode::NOT_FOUND, "no such sandbox"),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, &e),
    }
}

async fn list(
    State(w): State<Arc<Worker>>,
    h: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    authorize!(w, h);
    let filter = q.get("label").and_then(|l| l.split_once('='));
    let mut sandboxes: Vec<Sandbox> = lock(&w.sandboxes)
        .values()
        .filter(|e| match filter {
            Some((k, v)) => e.sb.metadata.get(k).map(String::as_str) == Some(v),
            None => true,
        })
        .map(|e| e.sb.clone())
        .collect();
    sandboxes.sort_by(|a, b| a.id.cmp(&b.id));
    Json(SandboxList { sandboxes }).into_response()
}

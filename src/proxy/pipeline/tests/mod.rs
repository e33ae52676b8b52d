//! Table tests of the pipeline: frames in, frames out, no I/O. Backend answers are built by
//! hand, the way a Postgres server would send them for the client messages given.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use super::*;
use crate::journal::log::{read_statements, LoggedStatement};
use crate::proxy::caps::CapMode;
use crate::wire::frame::{build, FrameReader};
use crate::wire::messages::{self, frontend, Severity};

const SECRETS: &[String] = &[];

// -- builders -------------------------------------------------------------------------

fn frame(raw: Bytes) -> Frame {
    Frame { tag: raw[0], raw }
}

fn query(sql: &str) -> Frame {
    let mut b = sql.as_bytes().to_vec();
    b.push(0);
    frame(build(b'Q', &b))
}

fn parse(name: &str, sql: &str) -> Frame {
    frame(frontend::build_parse(name.as_bytes(), sql.as_bytes()))
}

fn bind(portal: &str, stmt: &str) -> Frame {
    frame(frontend::build_bind(portal.as_bytes(), stmt.as_bytes()))
}

fn describe_portal(portal: &str) -> Frame {
    frame(frontend::build_target(b'D', b'P', portal.as_bytes()))
}

fn execute(portal: &str, max_rows: i32) -> Frame {
    frame(frontend::build_execute(portal.as_bytes(), max_rows))
}

fn sync() -> Frame {
    frame(frontend::build_sync())
}

fn copy_data(data: &[u8]) -> Frame {
    frame(build(b'd', data))
}

fn copy_done() -> Frame {
    frame(messages::copy_done())
}

/// A one-column RowDescription (text `?column?`).
fn row_desc() -> Frame {
    let mut b = BytesMut::new();
    b.put_i16(1);
    b.put_slice(b"?column?\0");
    b.put_i32(0);
    b.put_i16(0);
    b.put_i32(25);
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i16(0);
    frame(build(b'T', &b))
}

fn data_row(v: &str) -> Frame {
    let mut b = BytesMut::new();
    b.put_i16(1);
    b.put_i32(v.len() as i32);
    b.put_slice(v.as_bytes());
    frame(build(b'D', &b))
}

fn complete(tag: &str) -> Frame {
    frame(messages::command_complete(tag))
}

fn ready(status: u8) -> Frame {
    frame(messages::ready_for_query(status))
}

fn error(code: &str) -> Frame {
    frame(messages::error_response(
        Severity::Error,
        code,
        "backend error",
    ))
}

/// ParseComplete, BindComplete, CloseComplete, NoData, PortalSuspended: empty bodies.
fn empty(tag: u8) -> Frame {
    frame(build(tag, &[]))
}

/// CopyInResponse: text format, one column.
fn copy_in_response() -> Frame {
    frame(build(b'G', &[0, 0, 1, 0, 0]))
}

// -- driving --------------------------------------------------------------------------

fn policy(max_rows: u64, mode: CapMode) -> CapPolicy {
    CapPolicy {
        max_rows,
        max_bytes: 1 << 20,
        mode,
    }
}

fn pipeline(caps: CapPolicy, allow: Option<&[&str]>, log: Option<Arc<TokenLog>>) -> Pipeline {
    Pipeline::new(SessionIdentity {
        token: "sp_table".into(),
        task: "table".into(),
        session: 1,
        log,
        caps,
        allow: allow.map(|a| a.iter().map(|s| s.to_string()).collect()),
    })
}

/// Client frames in; the bytes that reach the backend (the outbox drained after each).
fn client(pl: &mut Pipeline, frames: impl IntoIterator<Item = Frame>) -> Vec<Frame> {
    let mut out = BytesMut::new();
    for f in frames {
        pl.on_client(f);
        pl.drain_outbox(&mut out);
    }
    split(out)
}

/// Backend frames in; what the client sees. The outbox is drained after each, as the
/// relay does; what reached the backend that way is returned too.
fn backend(pl: &mut Pipeline, frames: impl IntoIterator<Item = Frame>) -> (Vec<Frame>, Vec<Frame>) {
    let mut out = BytesMut::new();
    let mut to_backend = BytesMut::new();
    for f in frames {
        pl.on_backend(f, &mut out, SECRETS);
        pl.drain_outbox(&mut to_backend);
    }
    (split(out), split(to_backend))
}

fn split(bytes: BytesMut) -> Vec<Frame> {
    let len = bytes.len();
    let mut r = FrameReader::with_buffer(tokio::io::empty(), bytes, 1 << 30);
    let mut out = Vec::new();
    let mut seen = 0;
    while let Ok(Some(f)) = r.try_frame() {
        seen += f.raw.len();
        out.push(f);
    }
    assert_eq!(seen, len, "output is not whole frames");
    out
}

/// The tags of `frames` as a string, e.g. "PBDES".
fn tags(frames: &[Frame]) -> String {
    frames.iter().map(|f| f.tag as char).collect()
}

fn rows(frames: &[Frame]) -> usize {
    frames.iter().filter(|f| f.tag == b'D').count()
}

fn tag_of(f: &Frame) -> String {
    messages::command_tag(f.body()).unwrap_or("").to_string()
}

fn code_of(f: &Frame) -> String {
    messages::error_code(f.body()).unwrap_or_default()
}

/// The first frame with `tag`.
fn first(frames: &[Frame], tag: u8) -> &Frame {
    frames
        .iter()
        .find(|f| f.tag == tag)
        .unwrap_or_else(|| panic!("no {:?} in {}", tag as char, tags(frames)))
}

/// The Execute max_rows the backend was asked for, in order.
fn max_rows(frames: &[Frame]) -> Vec<i32> {
    frames
        .iter()
        .filter(|f| f.tag == b'E')
        .filter_map(|f| frontend::execute(f.body()).map(|(_, n)| n))
        .collect()
}

/// The session's log as a reader sees it once the deferred outcomes are written (as the
/// relay does when the session goes idle).
fn logged(pl: &Pipeline, dir: &tempfile::TempDir) -> Vec<LoggedStatement> {
    pl.flush_outcomes();
    read_statements(&crate::journal::log::log_path(
        dir.path(),
        "table",
        "sp_table",
    ))
    .unwrap()
}

fn with_log(caps: CapPolicy) -> (Pipeline, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(TokenLog::open(dir.path(), "table", "sp_table", u64::MAX).unwrap());
    (pipeline(caps, None, Some(log)), dir)
}

// -- tests ----------------------------------------------------------------------------

mod names_and_copy;
mod results;

#[test]
fn the_gateways_own_messages_are_the_wire_builders_bytes() {
    // `Outgoing::unnamed_run` writes its messages by hand into one buffer.
    let sql = b"select abalance from t where aid = 7";
    let mut want = BytesMut::new();
    want.extend_from_slice(&frontend::build_parse(b"", sql));
    want.extend_from_slice(&frontend::build_bind(b"", b""));
    want.extend_from_slice(&frontend::build_target(b'D', b'P', b""));
    want.extend_from_slice(&frontend::build_execute(b"", 201));
    let mut outbox = Outbox::default();
    outbox.unnamed_run(sql, 201, Some((Vec::new(), 1)), Pending::InjectedError);
    assert_eq!(outbox.responses(), 4);
    let mut got = BytesMut::new();
    let taken = outbox.take(&mut got).unwrap();
    assert_eq!(taken.responses, 4);
    assert!(!taken.barrier);
    assert_eq!(got.freeze(), want.freeze());
    assert_eq!(sync_message(), frontend::build_sync());
    assert_eq!(Bytes::from_static(FLUSH), build(b'H', &[]));
}

#[test]
fn a_lowered_execute_of_a_named_portal_is_written_as_execute_then_close() {
    // The lowered Execute and the Close of its portal are written by hand into the outbox.
    let mut p = pipeline(
        CapPolicy {
            max_rows: 2,
            max_bytes: 1 << 20,
            mode: CapMode::Truncate,
        },
        None,
        None,
    );
    p.on_client(parse("s", "select 1"));
    p.on_client(bind("cur", "s"));
    let mut to_backend = BytesMut::new();
    p.drain_outbox(&mut to_backend);
    to_backend.clear();
    p.on_client(execute("cur", 0));
    p.drain_outbox(&mut to_backend);
    // Both name the backend's portal (the gateway's name for "cur"), not the client's.
    let cur = p
        .backend_names
        .render(super::owned::Target(2, super::owned::Role::Portal));
    let mut want = BytesMut::new();
    want.extend_from_slice(&frontend::build_execute(cur.as_bytes(), 3));
    want.extend_from_slice(&frontend::build_target(b'C', b'P', cur.as_bytes()));
    assert!(!cur.as_bytes().is_empty() && cur.as_bytes() != b"cur");
    assert_eq!(to_backend.freeze(), want.freeze());
}

#[test]
fn the_outbox_keeps_order_across_built_and_shared_messages_and_drops_ignored_syncs() {
    let mut outbox = Outbox::default();
    outbox.unnamed_run(b"select 1", 0, None, Pending::InjectedError);
    outbox.push(
        sync_message(),
        [Pending::Sync {
            copy_ends_before: 0,
        }],
    );
    outbox.unnamed_run(b"select 2", 0, None, Pending::InjectedError);
    outbox.push(
        sync_message(),
        [Pending::Sync {
            copy_ends_before: 1,
        }],
    );
    outbox.unnamed_run_first(b"select 0", Pending::Refused);
    assert_eq!(outbox.responses(), 3 + 3 + 1 + 3 + 1);
    let dropped = outbox.drop_responses(|p| {
        matches!(
            p,
            Pending::Sync {
                copy_ends_before: 0
            }
        )
    });
    assert_eq!(dropped, 1);
    let mut got = BytesMut::new();
    let mut seen = Vec::new();
    while let Some(taken) = outbox.take(&mut got) {
        for _ in 0..taken.responses {
            seen.push(match outbox.pop_response().unwrap() {
                Pending::Parse { .. } => 'P',
                Pending::Bind { .. } => 'B',
                Pending::Refused => 'R',
                Pending::InjectedError => 'I',
                Pending::Sync { .. } => 'S',
                _ => '?',
            });
        }
    }
    assert_eq!(seen.into_iter().collect::<String>(), "PBRPBIPBIS");
    assert!(outbox.is_empty());
    let mut want = BytesMut::new();
    for (sql, sync) in [
        (&b"select 0"[..], false),
        (b"select 1", true),
        (b"select 2", true),
    ] {
        want.extend_from_slice(&frontend::build_parse(b"", sql));
        want.extend_from_slice(&frontend::build_bind(b"", b""));
        want.extend_from_slice(&frontend::build_execute(b"", 0));
        if sync {
            want.extend_from_slice(&frontend::build_sync());
        }
    }
    assert_eq!(got.freeze(), want.freeze());
}

//! Table tests of the pipeline: frames in, frames out, no I/O. Backend answers are built by
//! hand, the way a Postgres server would send them for the client messages given.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use super::*;
use crate::proxy::caps::CapMode;
use crate::review::log::{read_statements, LoggedStatement};
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

fn logged(dir: &tempfile::TempDir) -> Vec<LoggedStatement> {
    read_statements(&crate::review::log::log_path(
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

#[test]
fn simple_query_is_rewritten_into_capped_extended_statements() {
    // (query, what reaches the backend, Execute max_rows)
    let cases: &[(&str, &str, &[i32])] = &[
        ("SELECT 1", "PBDES", &[3]),
        ("SELECT 1; SELECT 2;", "PBDEPBDES", &[3, 3]),
        // A write is not lowered in truncate mode (its rows affected must all happen).
        ("SELECT 1; DELETE FROM t", "PBDEPBDES", &[3, 0]),
        // Nothing may return rows: relayed as is.
        ("SET x = 1", "Q", &[]),
        // COPY runs as sent (a rewrite would lose its Sync inside COPY FROM STDIN).
        ("SELECT 1; COPY t TO STDOUT", "Q", &[]),
        // Unsplittable text: relayed whole.
        ("SELECT 'BEGIN ATOMIC'; SELECT 2", "Q", &[]),
    ];
    for (sql, expect, max) in cases {
        let mut pl = pipeline(policy(2, CapMode::Truncate), None, None);
        let sent = client(&mut pl, [query(sql)]);
        assert_eq!(tags(&sent), *expect, "{sql}");
        assert_eq!(max_rows(&sent), *max, "{sql}");
        assert!(!pl.blocked(), "{sql}: truncate mode never holds the outbox");
    }
}

#[test]
fn rewritten_query_answers_look_like_a_simple_query() {
    let mut pl = pipeline(policy(2, CapMode::Truncate), None, None);
    client(&mut pl, [query("SET x = 1; SELECT 1")]);
    let (seen, _) = backend(
        &mut pl,
        [
            // SET: its Describe answers NoData, swallowed like its Parse/BindComplete.
            empty(b'1'),
            empty(b'2'),
            empty(b'n'),
            complete("SET"),
            empty(b'1'),
            empty(b'2'),
            row_desc(),
            data_row("1"),
            complete("SELECT 1"),
            ready(b'I'),
        ],
    );
    assert_eq!(tags(&seen), "CTDCZ");
    assert_eq!(pl.fifo.len(), 0);
    // The client's own Describe gets its NoData, and its own Parse/Bind their answers.
    client(
        &mut pl,
        [
            parse("", "SET x = 1"),
            bind("", ""),
            describe_portal(""),
            execute("", 0),
            sync(),
        ],
    );
    let (seen, _) = backend(
        &mut pl,
        [
            empty(b'1'),
            empty(b'2'),
            empty(b'n'),
            complete("SET"),
            ready(b'I'),
        ],
    );
    assert_eq!(tags(&seen), "12nCZ");
}

#[test]
fn a_cut_result_is_suspended_at_cap_plus_one_and_shown_as_cut() {
    let mut pl = pipeline(policy(2, CapMode::Truncate), None, None);
    client(&mut pl, [query("SELECT * FROM t")]);
    let (seen, _) = backend(
        &mut pl,
        [
            empty(b'1'),
            empty(b'2'),
            row_desc(),
            data_row("1"),
            data_row("2"),
            data_row("3"),
            empty(b's'),
            ready(b'I'),
        ],
    );
    // The third row is dropped; a NOTICE says so; the tag counts what was sent.
    assert_eq!(tags(&seen), "TDDNCZ");
    assert_eq!(tag_of(first(&seen, b'C')), "SELECT 2");
}

#[test]
fn error_mode_holds_the_rest_behind_a_barrier() {
    let mut pl = pipeline(policy(2, CapMode::Error), None, None);
    let sent = client(&mut pl, [query("SELECT 1; SELECT 2")]);
    // Only the first statement goes, with a Flush so its answer comes without a Sync.
    assert_eq!(tags(&sent), "PBDEH");
    assert!(pl.blocked());
    // It fits: its rows are released with its completion, then the rest goes.
    let (seen, more) = backend(
        &mut pl,
        [empty(b'1'), empty(b'2'), row_desc(), data_row("1")],
    );
    assert_eq!(
        tags(&seen),
        "T",
        "rows are held until the result is known to fit"
    );
    assert!(more.is_empty());
    let (seen, more) = backend(&mut pl, [complete("SELECT 1")]);
    assert_eq!(tags(&seen), "DC");
    assert_eq!(
        tags(&more),
        "PBDEH",
        "the Sync waits behind the next barrier"
    );
    assert!(pl.blocked());
    // The second does not fit: the gateway makes the backend fail in its place.
    let (seen, injected) = backend(
        &mut pl,
        [
            empty(b'1'),
            empty(b'2'),
            row_desc(),
            data_row("1"),
            data_row("2"),
            data_row("3"),
            empty(b's'),
        ],
    );
    assert_eq!(
        tags(&seen),
        "T",
        "held rows of a cut result never reach the client"
    );
    // Its failing statement goes first, then the Sync that was held back.
    assert_eq!(tags(&injected), "PBES");
    let (seen, _) = backend(
        &mut pl,
        [empty(b'1'), empty(b'2'), error("54000"), ready(b'I')],
    );
    assert_eq!(tags(&seen), "EZ");
    assert_eq!(code_of(&seen[0]), "54000");
    assert_eq!(pl.fifo.len(), 0);
    assert!(!pl.blocked());
}

#[test]
fn after_an_extended_error_the_rest_up_to_sync_is_skipped() {
    let (mut pl, dir) = with_log(policy(10, CapMode::Truncate));
    // Two pipelines in one go; the first fails at its Parse.
    client(
        &mut pl,
        [
            parse("", "SELEC 1"),
            bind("", ""),
            execute("", 0),
            sync(),
            parse("", "SELECT 2"),
            bind("", ""),
            execute("", 0),
            sync(),
        ],
    );
    let (seen, _) = backend(
        &mut pl,
        [
            error("42601"),
            ready(b'I'),
            empty(b'1'),
            empty(b'2'),
            data_row("2"),
            complete("SELECT 1"),
            ready(b'I'),
        ],
    );
    assert_eq!(tags(&seen), "EZ12DCZ");
    let log = logged(&dir);
    assert_eq!(log.len(), 2);
    // The statement failed at its Parse: its outcome carries the error.
    assert_eq!(
        log[0].outcome.as_ref().unwrap().sqlstate.as_deref(),
        Some("42601")
    );
    assert_eq!(log[1].outcome.as_ref().unwrap().rows, Some(1));

    // An error while the client's Sync has not been sent yet: what follows until that Sync
    // is skipped by the server, so nothing is expected from it.
    client(&mut pl, [parse("", "SELEC 1"), bind("", "")]);
    let (seen, _) = backend(&mut pl, [error("42601")]);
    assert_eq!(tags(&seen), "E");
    assert!(pl.skip_until_sync);
    client(&mut pl, [execute("", 0), parse("", "SELECT 1"), sync()]);
    assert_eq!(pl.fifo.len(), 1, "only the Sync is expected");
    let (seen, _) = backend(&mut pl, [ready(b'I')]);
    assert_eq!(tags(&seen), "Z");
    assert_eq!(pl.fifo.len(), 0);
}

#[test]
fn the_seatbelt_refuses_inside_the_backend() {
    // Simple protocol: the whole string is replaced by a query that fails.
    let mut pl = pipeline(policy(10, CapMode::Truncate), Some(&["read"]), None);
    let sent = client(&mut pl, [query("SELECT 1; DELETE FROM t")]);
    assert_eq!(tags(&sent), "Q");
    assert!(String::from_utf8_lossy(sent[0].body()).contains("sandpit policy"));
    let (seen, _) = backend(&mut pl, [error("42501"), ready(b'I')]);
    assert_eq!(tags(&seen), "EZ");
    assert_eq!(code_of(&seen[0]), "42501");
    assert!(String::from_utf8_lossy(&seen[0].raw).contains("may run only read"));

    // Extended: the Execute is replaced by a failing statement; Parse and Bind go as sent.
    let sent = client(
        &mut pl,
        [
            parse("", "DELETE FROM t"),
            bind("", ""),
            execute("", 0),
            sync(),
        ],
    );
    assert_eq!(tags(&sent), "PBPBES");
    assert!(String::from_utf8_lossy(&sent[2].raw).contains("sandpit policy"));
    let (seen, _) = backend(
        &mut pl,
        [
            empty(b'1'),
            empty(b'2'),
            empty(b'1'),
            empty(b'2'),
            error("42501"),
            ready(b'I'),
        ],
    );
    assert_eq!(tags(&seen), "12EZ");
    assert_eq!(code_of(&seen[2]), "42501");
}

#[test]
fn tracking_limits_refuse_with_53400_and_bound_pending_responses() {
    let mut pl = pipeline(policy(10, CapMode::Truncate), None, None);
    for i in 0..MAX_TRACKED {
        client(&mut pl, [parse(&format!("s{i}"), "SELECT 1")]);
        backend(&mut pl, [empty(b'1')]);
    }
    assert_eq!(pl.prepared.len(), MAX_TRACKED);
    // One more named statement: the backend gets a Parse that fails instead.
    let sent = client(&mut pl, [parse("one_more", "SELECT 1"), sync()]);
    assert_eq!(tags(&sent), "PS");
    assert_eq!(
        frontend::parse(sent[0].body()).map(|(n, q)| (n.to_vec(), q.to_vec())),
        Some((Vec::new(), REFUSED_SQL.to_vec()))
    );
    let (seen, _) = backend(&mut pl, [error("42601"), ready(b'I')]);
    assert_eq!(tags(&seen), "EZ");
    assert_eq!(code_of(&seen[0]), "53400");
    // The unnamed statement is always allowed (it replaces itself).
    let sent = client(&mut pl, [parse("", "SELECT 1")]);
    assert_eq!(
        frontend::parse(sent[0].body()).map(|(_, q)| q),
        Some(&b"SELECT 1"[..])
    );

    // Responses outstanding: past MAX_PENDING the relay stops reading the client.
    let mut pl = pipeline(policy(10, CapMode::Truncate), None, None);
    for _ in 0..MAX_PENDING - 1 {
        client(&mut pl, [sync()]);
    }
    assert!(pl.accepting());
    client(&mut pl, [sync()]);
    assert!(!pl.accepting());
    backend(&mut pl, [ready(b'I')]);
    assert!(pl.accepting());
}

#[test]
fn a_query_relayed_whole_has_every_result_capped() {
    // The splitter gives up on this text (it names BEGIN ATOMIC); the backend runs three
    // statements. Each result is counted and cut from the backend's own stream.
    let (mut pl, dir) = with_log(policy(2, CapMode::Truncate));
    let sent = client(
        &mut pl,
        [query(
            "SELECT 'BEGIN ATOMIC'; SELECT g FROM t; SELECT g FROM t",
        )],
    );
    assert_eq!(tags(&sent), "Q");
    let mut answer = Vec::new();
    for _ in 0..3 {
        answer.push(row_desc());
        answer.extend((0..5).map(|i| data_row(&i.to_string())));
        answer.push(complete("SELECT 5"));
    }
    answer.push(ready(b'I'));
    let (seen, _) = backend(&mut pl, answer);
    assert_eq!(tags(&seen), "TDDNCTDDNCTDDNCZ");
    assert!(seen
        .iter()
        .filter(|f| f.tag == b'C')
        .all(|f| tag_of(f) == "SELECT 2"));
    let log = logged(&dir);
    assert_eq!(log.len(), 1, "one record for the text relayed whole");
    let outcome = log[0].outcome.as_ref().unwrap();
    assert!(outcome.capped);
    assert_eq!(outcome.rows, Some(6));

    // Split, but the backend brings more results than the splitter found (the text was
    // misread): the extra results are counted against the last statement.
    let mut pl = pipeline(policy(2, CapMode::Truncate), None, None);
    client(&mut pl, [query("SET x = 1; COPY t FROM STDIN")]);
    let mut answer = vec![complete("SET")];
    for _ in 0..2 {
        answer.push(row_desc());
        answer.extend((0..4).map(|i| data_row(&i.to_string())));
        answer.push(complete("SELECT 4"));
    }
    answer.push(ready(b'I'));
    let (seen, _) = backend(&mut pl, answer);
    assert_eq!(tags(&seen), "CTDDNCTDDNCZ");

    // Over MAX_SPLIT_STATEMENTS: relayed whole, still capped.
    let mut pl = pipeline(policy(1, CapMode::Truncate), None, None);
    let sent = client(
        &mut pl,
        [query(&"SELECT 1;".repeat(MAX_SPLIT_STATEMENTS + 1))],
    );
    assert_eq!(tags(&sent), "Q");
    let (seen, _) = backend(
        &mut pl,
        [
            row_desc(),
            data_row("1"),
            data_row("1"),
            complete("SELECT 2"),
            ready(b'I'),
        ],
    );
    assert_eq!(tags(&seen), "TDNCZ");
}

#[test]
fn a_data_row_nobody_expected_is_counted_as_a_stray() {
    for mode in [CapMode::Truncate, CapMode::Error] {
        let mut pl = pipeline(policy(2, mode), None, None);
        let (seen, _) = backend(
            &mut pl,
            [
                data_row("1"),
                data_row("2"),
                data_row("3"),
                data_row("4"),
                complete("SELECT 4"),
            ],
        );
        assert_eq!(tags(&seen), "DDNC", "{mode:?}");
        assert_eq!(tag_of(&seen[3]), "SELECT 2");
        // The stray's count ends with its result: the next one starts from zero.
        let (seen, _) = backend(
            &mut pl,
            [data_row("1"), data_row("2"), data_row("3"), ready(b'I')],
        );
        assert_eq!(tags(&seen), "DDZ", "{mode:?}");
        let (seen, _) = backend(&mut pl, [data_row("1"), data_row("2")]);
        assert_eq!(rows(&seen), 2, "{mode:?}");
    }
}

#[test]
fn a_second_parse_of_a_name_never_replaces_the_text_the_server_kept() {
    let (mut pl, dir) = with_log(policy(10, CapMode::Truncate));
    // Sent all at once, as a hostile client would.
    let sent = client(
        &mut pl,
        [
            parse("s", "DELETE FROM t"),
            sync(),
            parse("s", "SELECT 1"),
            sync(),
            bind("", "s"),
            execute("", 0),
            sync(),
        ],
    );
    // The second Parse depends on whether the first was accepted: it waits.
    assert_eq!(tags(&sent), "PS");
    let (seen, sent) = backend(&mut pl, [empty(b'1'), ready(b'I')]);
    assert_eq!(tags(&seen), "1Z");
    assert_eq!(tags(&sent), "PSBES");
    // The server refuses the duplicate; the Bind/Execute of the next Sync run the first text.
    let (seen, _) = backend(
        &mut pl,
        [
            error("42P05"),
            ready(b'I'),
            empty(b'2'),
            complete("DELETE 3"),
            ready(b'I'),
        ],
    );
    assert_eq!(tags(&seen), "EZ2CZ");
    let log = logged(&dir);
    let last = log.last().unwrap();
    assert_eq!(last.statement.protocol, "extended");
    assert_eq!(last.statement.text, "DELETE FROM t");
    assert_eq!(last.statement.kind, "write");
    assert_eq!(
        last.outcome.as_ref().unwrap().tag.as_deref(),
        Some("DELETE 3")
    );
    assert!(log.iter().all(|s| s.statement.text != "SELECT 1"));
    assert!(
        matches!(pl.prepared.lookup(b"s", pl.group), names::Lookup::Defined(p) if &*p.text == "DELETE FROM t")
    );
}

#[test]
fn syncs_inside_copy_from_stdin_expect_nothing() {
    // Simple protocol: the client's Syncs between CopyInResponse and CopyDone are ignored
    // by the server.
    let mut pl = pipeline(policy(2, CapMode::Truncate), None, None);
    client(&mut pl, [query("COPY t FROM STDIN")]);
    let (seen, _) = backend(&mut pl, [copy_in_response()]);
    assert_eq!(tags(&seen), "G");
    let sent = client(&mut pl, [copy_data(b"1\n"), sync(), sync(), copy_done()]);
    assert_eq!(tags(&sent), "dSSc");
    assert_eq!(pl.take_ignored_syncs(), 2);
    let (seen, _) = backend(&mut pl, [complete("COPY 1"), ready(b'I')]);
    assert_eq!(tags(&seen), "CZ");
    assert_eq!(pl.fifo.len(), 0);

    // Extended protocol, everything sent before the CopyInResponse arrives (as
    // tokio-postgres does): the Sync after Execute is inside the COPY too.
    client(
        &mut pl,
        [
            parse("", "COPY t FROM STDIN"),
            bind("", ""),
            execute("", 0),
            sync(),
        ],
    );
    let (seen, _) = backend(&mut pl, [empty(b'1'), empty(b'2'), copy_in_response()]);
    assert_eq!(tags(&seen), "12G");
    assert_eq!(pl.take_ignored_syncs(), 1);
    client(&mut pl, [copy_data(b"2\n"), copy_done(), sync()]);
    let (seen, _) = backend(&mut pl, [complete("COPY 1"), ready(b'I')]);
    assert_eq!(tags(&seen), "CZ");
    assert_eq!(pl.fifo.len(), 0);

    // In step afterwards: the next result is counted and capped.
    client(&mut pl, [query("SELECT g FROM t")]);
    let (seen, _) = backend(
        &mut pl,
        [
            empty(b'1'),
            empty(b'2'),
            row_desc(),
            data_row("1"),
            data_row("2"),
            data_row("3"),
            empty(b's'),
            ready(b'I'),
        ],
    );
    assert_eq!(tags(&seen), "TDDNCZ");
}

//! Names bound only when the server answers, and COPY FROM STDIN.

use super::*;

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
    // It goes to the same backend name (the server decides whether it still holds it); the
    // Bind of the next Sync waits for that answer.
    assert_eq!(tags(&sent), "PS");
    // The server refuses the duplicate; the Bind/Execute of the next Sync run the first text.
    let (seen, sent) = backend(&mut pl, [error("42P05"), ready(b'I')]);
    assert_eq!(tags(&seen), "EZ");
    assert_eq!(tags(&sent), "BES");
    let (seen, _) = backend(&mut pl, [empty(b'2'), complete("DELETE 3"), ready(b'I')]);
    assert_eq!(tags(&seen), "2CZ");
    let log = logged(&pl, &dir);
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

#[test]
fn a_name_the_server_forgot_and_accepted_again_holds_the_new_text() {
    // The attack: DISCARD ALL makes the server forget the statement; a second Parse
    // of the name is then accepted, and the Execute runs (and is logged as) the new text.
    let (mut pl, dir) = with_log(policy(10, CapMode::Truncate));
    client(&mut pl, [parse("s8", "SELECT 'harmless'"), sync()]);
    backend(&mut pl, [empty(b'1'), ready(b'I')]);
    client(&mut pl, [query("DISCARD ALL")]);
    backend(&mut pl, [complete("DISCARD ALL"), ready(b'I')]);
    let sent = client(&mut pl, [parse("s8", "UPDATE t SET a = 1"), sync()]);
    // The client's name never reaches the backend.
    assert!(sent.iter().all(|f| !f.body().starts_with(b"s8\0")));
    backend(&mut pl, [empty(b'1'), ready(b'I')]);
    let sent = client(&mut pl, [bind("", "s8"), execute("", 0), sync()]);
    assert_eq!(tags(&sent), "BES");
    backend(&mut pl, [empty(b'2'), complete("UPDATE 1"), ready(b'I')]);
    let log = logged(&pl, &dir);
    let last = log.last().unwrap();
    assert_eq!(last.statement.text, "UPDATE t SET a = 1");
    assert_eq!(last.statement.kind, "write");
    assert!(log.iter().all(|s| s.statement.text != "SELECT 'harmless'"
        || s.outcome.as_ref().and_then(|o| o.tag.as_deref()) != Some("UPDATE 1")));
}

#[test]
fn a_name_never_parsed_is_never_passed_to_the_backend() {
    // A statement made by SQL PREPARE under the client's name is not reached by a Bind.
    let mut pl = pipeline(policy(10, CapMode::Truncate), None, None);
    let sent = client(
        &mut pl,
        [
            bind("", "by_sql"),
            frame(frontend::build_target(b'D', b'S', b"by_sql")),
            execute("cur", 0),
            frame(frontend::build_target(b'C', b'S', b"by_sql")),
            sync(),
        ],
    );
    // The Execute is lowered to the cap, and its portal closed after it.
    assert_eq!(tags(&sent), "BDECCS");
    for f in &sent {
        assert!(!f.body().windows(6).any(|w| w == b"by_sql"), "{f:?}");
    }
    // An unmapped portal is an SQL cursor's name (DECLARE): passed on as the client's.
    assert!(sent[2].body().starts_with(b"cur\0"));
}

#[test]
fn describe_and_close_wait_for_the_name_they_use_and_carry_the_gateways_name() {
    let mut pl = pipeline(policy(10, CapMode::Truncate), None, None);
    let sent = client(
        &mut pl,
        [
            parse("s", "SELECT 1"),
            sync(),
            frame(frontend::build_target(b'D', b'S', b"s")),
            frame(frontend::build_target(b'C', b'S', b"s")),
            sync(),
        ],
    );
    // Which backend name "s" has depends on the first Parse's answer.
    assert_eq!(tags(&sent), "PS");
    let backend_name = sent[0].body().split(|&c| c == 0).next().unwrap().to_vec();
    assert_ne!(backend_name, b"s");
    let (_, sent) = backend(&mut pl, [empty(b'1'), ready(b'I')]);
    assert_eq!(tags(&sent), "DCS");
    for f in &sent[..2] {
        assert_eq!(
            &f.body()[1..1 + backend_name.len()],
            &backend_name[..],
            "{f:?}"
        );
    }
    // Closed once the server says so: a later use goes to a name never defined.
    backend(&mut pl, [row_desc(), empty(b'3'), ready(b'I')]);
    assert!(matches!(
        pl.prepared.lookup(b"s", pl.group),
        names::Lookup::Undefined
    ));
}

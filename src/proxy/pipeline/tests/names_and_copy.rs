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

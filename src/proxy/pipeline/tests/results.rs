//! Results: rewriting, caps, error mode, skipping, refusals, limits and strays.

use super::*;

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
    let log = logged(&pl, &dir);
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
    let log = logged(&pl, &dir);
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

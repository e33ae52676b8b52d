//! Tests of reading (and writing) statement logs, through real files.

use super::super::{to_line, LogRecord, TokenLog, BUSY_WRITES, TEXT_MAX};
use super::*;

fn statement(seq: u64, text: &str) -> LogRecord {
    LogRecord::Statement(StatementRecord {
        seq,
        ts: "2026-01-01T00:00:00Z".into(),
        token: "sp_t".into(),
        task: "k".into(),
        session: 1,
        protocol: "simple".into(),
        text: text.into(),
        params: Vec::new(),
        kind: "read".into(),
    })
}

fn outcome(seq: u64) -> LogRecord {
    LogRecord::Outcome(OutcomeRecord {
        seq,
        ts: "2026-01-01T00:00:00Z".into(),
        rows: Some(seq),
        capped: false,
        duration_ms: 1.0,
        sqlstate: None,
        tag: Some("SELECT 1".into()),
        skipped: false,
        denied: false,
        kind: Some("read".into()),
    })
}

#[test]
fn heads_are_read_from_the_stored_lines() {
    let line = to_line(&statement(42, "select 1")).unwrap();
    assert_eq!(head(&line[..line.len() - 1], true), Head::Statement(42));
    let line = to_line(&outcome(7)).unwrap();
    assert_eq!(head(&line[..line.len() - 1], true), Head::Outcome(7));
    // Torn: no closing brace.
    assert_eq!(head(&line[..line.len() - 5], true), Head::Other);
    assert_eq!(head(b"garbage", true), Head::Other);
    // Keys in another order (a log written by hand or another tool).
    assert_eq!(
        head(
            br#"{"kind":"read","seq":5,"text":"x","type":"statement"}"#,
            true
        ),
        Head::Statement(5)
    );
}

#[test]
fn pages_start_where_they_should_and_pair_outcomes() {
    let dir = tempfile::tempdir().unwrap();
    let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
    let n = 5000;
    // Outcomes lag their statements by a few records, as with pipelined sessions; the
    // statement of every 1000th never completes.
    for seq in 1..=n {
        assert_eq!(log.next_seq(), seq);
        log.append(&statement(
            seq,
            &format!("select {seq} -- {}", "x".repeat(seq as usize % 50)),
        ))
        .unwrap();
        if seq > 3 && (seq - 3) % 1000 != 0 {
            log.append(&outcome(seq - 3)).unwrap();
        }
    }
    let path = log.path().to_path_buf();
    let mut after = 0;
    let mut seen = 0;
    loop {
        let p = read_page(&path, after, 777).unwrap();
        for s in &p.statements {
            seen += 1;
            assert_eq!(s.statement.seq, seen);
            let done = s.outcome.is_some();
            let expect = seen + 3 <= n && seen % 1000 != 0;
            assert_eq!(done, expect, "seq {seen}");
        }
        match p.next_after {
            Some(a) => after = a,
            None => break,
        }
    }
    assert_eq!(seen, n);
    // A page from the middle starts right after `after`.
    let p = read_page(&path, 4321, 3).unwrap();
    let seqs: Vec<u64> = p.statements.iter().map(|s| s.statement.seq).collect();
    assert_eq!(seqs, vec![4322, 4323, 4324]);
    assert_eq!(p.next_after, Some(4324));
    assert!(read_page(&path, n, 10).unwrap().statements.is_empty());
    assert_eq!(last_seq(&path).unwrap(), n);
    assert_eq!(read_statements(&path).unwrap().len(), n as usize);
}

fn defer(log: &TokenLog, seq: u64) {
    let LogRecord::Outcome(o) = outcome(seq) else {
        unreachable!()
    };
    log.defer_outcome(&super::super::line::outcome_ref(&o))
        .unwrap();
}

#[test]
fn deferred_outcomes_lead_the_next_statement_and_are_paired_with_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
    let path = log.path().to_path_buf();
    let len = |p: &Path| std::fs::metadata(p).unwrap().len();
    log.append(&statement(log.next_seq(), "select 1")).unwrap();
    let written = len(&path);
    defer(&log, 1);
    // Deferred: not in the file yet, the statement reads as not (yet) completed.
    assert_eq!(len(&path), written);
    assert!(read_statements(&path).unwrap()[0].outcome.is_none());
    log.append(&statement(log.next_seq(), "select 2")).unwrap();
    let mut kinds = Vec::new();
    scan(&path, |e| {
        kinds.push(match e {
            LogEntry::Statement { statement, .. } => format!("s{}", statement.seq),
            LogEntry::Outcome(o) => format!("o{}", o.seq),
        })
    })
    .unwrap();
    assert_eq!(kinds, ["s1", "o1", "s2"]);
    defer(&log, 2);
    log.append(&statement(log.next_seq(), "select 3")).unwrap();
    defer(&log, 3);
    log.flush_outcomes().unwrap();
    let all = read_statements(&path).unwrap();
    assert!(all
        .iter()
        .all(|s| s.outcome.as_ref().map(|o| o.seq) == Some(s.statement.seq)));
    // Dropping the log writes what is still deferred.
    log.append(&statement(log.next_seq(), "select 4")).unwrap();
    defer(&log, 4);
    drop(log);
    assert!(read_statements(&path).unwrap()[3].outcome.is_some());
}

#[test]
fn a_busy_log_is_mapped_read_while_mapped_and_released_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
    let path = log.path().to_path_buf();
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    for i in 0..BUSY_WRITES - 1 {
        log.append(&statement(log.next_seq(), &format!("select {i}")))
            .unwrap();
    }
    log.adapt();
    assert!(!log.is_mapped(), "not busy enough");
    for i in 0..BUSY_WRITES {
        log.append(&statement(log.next_seq(), &format!("select {i}")))
            .unwrap();
    }
    log.adapt();
    assert!(log.is_mapped());
    let n = 2 * BUSY_WRITES - 1;
    log.append(&statement(log.next_seq(), "select 'mapped'"))
        .unwrap();
    defer(&log, n + 1);
    log.append(&statement(log.next_seq(), "select 'mapped 2'"))
        .unwrap();
    // The file holds a reserved tail of zeros past its records; readers see each record.
    assert!(size(&path) > log.data_len());
    let all = read_statements(&path).unwrap();
    assert_eq!(all.len() as u64, n + 2);
    assert_eq!(all[n as usize].statement.text, "select 'mapped'");
    assert!(all[n as usize].outcome.is_some());
    // Written since the last tick: stays mapped; a tick with no write: released.
    log.adapt();
    assert!(log.is_mapped());
    log.adapt();
    assert!(!log.is_mapped());
    assert_eq!(size(&path), log.data_len());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.ends_with('\n'));
    for line in text.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
    // Plain writes again, after the released tail.
    log.append(&statement(log.next_seq(), "select 'plain'"))
        .unwrap();
    assert_eq!(size(&path), log.data_len());
    assert_eq!(read_statements(&path).unwrap().len() as u64, n + 3);
}

#[test]
fn a_log_left_mapped_by_a_crash_goes_on_after_its_records() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
    let path = log.path().to_path_buf();
    for i in 0..BUSY_WRITES {
        log.append(&statement(log.next_seq(), &format!("select {i}")))
            .unwrap();
    }
    log.adapt();
    assert!(log.is_mapped());
    log.append(&statement(log.next_seq(), "select 'last'"))
        .unwrap();
    let len = log.data_len();
    // Killed while copying a record in: part of it landed, with zeros inside and the
    // reservation's zeros after; nothing released.
    std::mem::forget(log);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(
        b"{\"type\":\"statement\",\"seq\":99,\0\0\0\"kind\":\"read\"}\n",
        len,
    )
    .unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() > len + 40);
    // Read as it is: every whole record, not the torn one.
    let all = read_statements(&path).unwrap();
    assert_eq!(all.len() as u64, BUSY_WRITES + 1);
    assert_eq!(all.last().unwrap().statement.text, "select 'last'");
    // Opened again: the zeros are cut off and the log goes on after its records.
    let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), log.data_len());
    log.append(&statement(log.next_seq(), "select 'after'"))
        .unwrap();
    let all = read_statements(&path).unwrap();
    assert_eq!(all.len() as u64, BUSY_WRITES + 2);
    assert_eq!(all.last().unwrap().statement.text, "select 'after'");
    assert!(all.iter().all(|s| s.statement.seq != 99));
}

#[test]
fn the_idle_ticker_writes_outcomes_only_after_a_tick_with_no_write() {
    let dir = tempfile::tempdir().unwrap();
    let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
    let path = log.path().to_path_buf();
    let outcomes = |p: &Path| {
        read_statements(p)
            .unwrap()
            .iter()
            .filter(|s| s.outcome.is_some())
            .count()
    };
    log.append(&statement(log.next_seq(), "select 1")).unwrap();
    defer(&log, 1);
    log.flush_idle_outcomes().unwrap();
    assert_eq!(outcomes(&path), 0, "first tick: only noted");
    // Busy: the next statement carries it; the outcome deferred after is not idle yet.
    log.append(&statement(log.next_seq(), "select 2")).unwrap();
    defer(&log, 2);
    log.flush_idle_outcomes().unwrap();
    assert_eq!(outcomes(&path), 1);
    // Idle for a whole tick: written.
    log.flush_idle_outcomes().unwrap();
    assert_eq!(outcomes(&path), 2);
}

#[test]
fn a_statement_refused_by_the_quota_still_writes_the_deferred_outcomes() {
    let dir = tempfile::tempdir().unwrap();
    let log = TokenLog::open(dir.path(), "k", "sp_t", 400).unwrap();
    log.append(&statement(log.next_seq(), "select 1")).unwrap();
    defer(&log, 1);
    let refused = log.append(&statement(log.next_seq(), &"y".repeat(400)));
    assert!(
        matches!(refused, Err(LogError::Quota { .. })),
        "{refused:?}"
    );
    let all = read_statements(log.path()).unwrap();
    assert_eq!(all.len(), 1);
    assert!(all[0].outcome.is_some());
}

#[test]
fn long_text_is_cut_with_length_and_digest() {
    let dir = tempfile::tempdir().unwrap();
    let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
    // Multi-byte characters across the cut: it falls on a character boundary.
    let text = format!("select '{}'", "é".repeat(TEXT_MAX));
    log.append(&statement(log.next_seq(), &text)).unwrap();
    let all = read_statements(log.path()).unwrap();
    let s = &all[0];
    assert!(s.statement.text.len() <= TEXT_MAX && s.statement.text.len() > TEXT_MAX - 4);
    assert!(text.starts_with(&s.statement.text));
    let cut = s.cut.as_ref().unwrap();
    assert_eq!(cut.text_len, text.len() as u64);
    assert_eq!(
        cut.text_sha256,
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()))
    );
    let json = serde_json::to_value(s).unwrap();
    assert_eq!(json["text_len"], text.len() as u64);
}

#[test]
fn quota_refuses_statements_but_not_outcomes_and_a_torn_tail_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let log = TokenLog::open(dir.path(), "k", "sp_t", 2000).unwrap();
    let mut written = 0;
    loop {
        let seq = log.next_seq();
        match log.append(&statement(seq, &"y".repeat(100))) {
            Ok(()) => written += 1,
            Err(LogError::Quota { max, .. }) => {
                assert_eq!(max, 2000);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(written > 3);
    log.append(&outcome(1)).unwrap();
    let path = log.path().to_path_buf();
    drop(log);
    // A crash cut the last record: the next one starts on its own line.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"type\":\"statement\",\"seq\":99").unwrap();
    let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
    log.append(&statement(log.next_seq(), "select 2")).unwrap();
    let all = read_statements(&path).unwrap();
    assert_eq!(all.len(), written + 1);
    assert!(all[0].outcome.is_some());
    assert_eq!(all.last().unwrap().statement.text, "select 2");
}

#[test]
fn sessions_on_many_threads_take_numbers_in_write_order() {
    use super::super::StatementRef;
    let dir = tempfile::tempdir().unwrap();
    let log = std::sync::Arc::new(TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|session| {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut seqs = Vec::new();
                for i in 0..300 {
                    let text = format!("select {session}, {i}");
                    let rec = StatementRef {
                        seq: 0,
                        ts: None,
                        token: "sp_t",
                        task: "k",
                        session,
                        protocol: "simple",
                        text: &text,
                        params: &[],
                        kind: "read",
                    };
                    seqs.push(log.append_next_statement(rec).unwrap());
                }
                seqs
            })
        })
        .collect();
    let mut taken: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    taken.sort_unstable();
    assert_eq!(taken, (1..=1200).collect::<Vec<u64>>(), "each number once");
    let path = log.path().to_path_buf();
    drop(log);
    // In the file, in number order with no gap: readers page by `seq`.
    let order: Vec<u64> = read_statements(&path)
        .unwrap()
        .iter()
        .map(|s| s.statement.seq)
        .collect();
    assert_eq!(order, (1..=1200).collect::<Vec<u64>>());
}

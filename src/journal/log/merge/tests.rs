//! The merged order of fronts' files, through real files written by [`TokenLog`].

use super::super::{LogRecord, OutcomeRecord, StatementRecord, TokenLog};
use super::*;

fn statement(seq: u64, ts: &str, text: &str) -> LogRecord {
    LogRecord::Statement(StatementRecord {
        seq,
        ts: ts.into(),
        token: "sp_t".into(),
        task: "k".into(),
        session: 1,
        protocol: "simple".into(),
        text: text.into(),
        params: Vec::new(),
        kind: "read".into(),
    })
}

fn outcome(seq: u64, sqlstate: Option<&str>) -> LogRecord {
    LogRecord::Outcome(OutcomeRecord {
        seq,
        ts: "2026-01-01T00:00:09Z".into(),
        rows: Some(seq),
        capped: false,
        duration_ms: 1.0,
        sqlstate: sqlstate.map(str::to_string),
        tag: sqlstate.is_none().then(|| "SELECT 1".to_string()),
        skipped: false,
        denied: false,
        kind: Some("read".into()),
    })
}

/// Writes `records` (front, record) into each front's own file, in the order given; the
/// files, ordered by front id as a reader lists them.
fn write(dir: &std::path::Path, records: &[(&str, LogRecord)]) -> Vec<FrontFile> {
    let mut logs = std::collections::BTreeMap::new();
    for (front, r) in records {
        let log = logs.entry(*front).or_insert_with(|| {
            TokenLog::open_front(dir, front, "k", "sp_t", 0).expect("open front log")
        });
        if let LogRecord::Statement(s) = r {
            assert_eq!(
                log.next_seq(),
                s.seq,
                "test records number each front's own"
            );
        }
        log.append(r).expect("append");
    }
    logs.iter()
        .map(|(front, log)| FrontFile {
            front: front.to_string(),
            path: log.path().to_path_buf(),
        })
        .collect()
}

fn merged(files: &[FrontFile]) -> Vec<LoggedStatement> {
    page(files, 0, usize::MAX, usize::MAX).unwrap().statements
}

fn texts(s: &[LoggedStatement]) -> Vec<&str> {
    s.iter().map(|s| s.statement.text.as_str()).collect()
}

#[test]
fn fronts_merge_by_time_then_front_then_seq() {
    let dir = tempfile::tempdir().unwrap();
    let t = |s: u32| format!("2026-01-01T00:00:{s:02}.5Z");
    let files = write(
        dir.path(),
        &[
            ("bb", statement(1, &t(1), "b1")),
            ("aa", statement(1, &t(2), "a1")),
            ("bb", statement(2, &t(2), "b2")), // same time as a1: front id aa first
            ("aa", statement(2, &t(3), "a2")),
            ("aa", outcome(1, None)),
            ("bb", outcome(2, Some("22012"))),
            ("bb", statement(3, &t(5), "b3")),
            ("aa", statement(3, &t(4), "a3")),
        ],
    );
    let m = merged(&files);
    assert_eq!(texts(&m), ["b1", "a1", "b2", "a2", "a3", "b3"]);
    let seqs: Vec<u64> = m.iter().map(|s| s.statement.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
    let fronts: Vec<(&str, u64)> = m
        .iter()
        .map(|s| (s.front.as_deref().unwrap(), s.front_seq.unwrap()))
        .collect();
    assert_eq!(
        fronts,
        [
            ("bb", 1),
            ("aa", 1),
            ("bb", 2),
            ("aa", 2),
            ("aa", 3),
            ("bb", 3)
        ]
    );
    // Each outcome went to its own front's statement, not to the other front's same seq.
    assert_eq!(m[1].outcome.as_ref().unwrap().seq, 2);
    assert_eq!(m[1].outcome.as_ref().unwrap().sqlstate, None);
    assert_eq!(
        m[2].outcome.as_ref().unwrap().sqlstate.as_deref(),
        Some("22012")
    );
    assert!(m[0].outcome.is_none() && m[3].outcome.is_none());
}

#[test]
fn a_front_whose_clock_stepped_back_keeps_its_own_order() {
    let dir = tempfile::tempdir().unwrap();
    let files = write(
        dir.path(),
        &[
            ("aa", statement(1, "2026-01-01T00:00:05Z", "a1")),
            ("aa", statement(2, "2026-01-01T00:00:01Z", "a2")), // clock stepped back
            ("bb", statement(1, "2026-01-01T00:00:03Z", "b1")),
            ("aa", statement(3, "not a time", "a3")),
        ],
    );
    // a2 cannot come before a1, so b1 (earlier than a1) leads; a1, a2, a3 stay in order.
    assert_eq!(texts(&merged(&files)), ["b1", "a1", "a2", "a3"]);
}

#[test]
fn pages_of_the_merged_log_cover_it_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut records = Vec::new();
    for i in 1..=40u64 {
        let front = ["aa", "bb", "cc"][(i % 3) as usize];
        let seq = records
            .iter()
            .filter(|(f, r)| *f == front && matches!(r, LogRecord::Statement(_)))
            .count() as u64
            + 1;
        let ts = format!("2026-01-01T00:{:02}:{:02}Z", i / 60, i % 60);
        records.push((front, statement(seq, &ts, &format!("s{i}"))));
        records.push((front, outcome(seq, None)));
    }
    let files = write(dir.path(), &records);
    let (mut after, mut seen) = (0, Vec::new());
    loop {
        let p = page(&files, after, 7, usize::MAX).unwrap();
        for s in &p.statements {
            assert!(s.outcome.is_some(), "{} has its outcome", s.statement.text);
            seen.push(s.statement.text.clone());
        }
        match p.next_after {
            Some(a) => after = a,
            None => break,
        }
    }
    let want: Vec<String> = (1..=40).map(|i| format!("s{i}")).collect();
    assert_eq!(seen, want);
    // The scan numbers outcomes as it numbers their statements.
    let mut pairs = Vec::new();
    scan(&files, |m| {
        if let LogEntry::Outcome(o) = m.entry {
            pairs.push(o.seq)
        }
        true
    })
    .unwrap();
    assert_eq!(pairs, (1..=40).collect::<Vec<u64>>());
}

#[test]
fn a_torn_last_record_of_a_killed_front_is_skipped() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let files = write(
        dir.path(),
        &[
            ("aa", statement(1, "2026-01-01T00:00:01Z", "a1")),
            ("bb", statement(1, "2026-01-01T00:00:02Z", "b1")),
        ],
    );
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&files[0].path)
        .unwrap();
    f.write_all(b"{\"type\":\"statement\",\"seq\":2,\"ts\":\"2026")
        .unwrap();
    assert_eq!(texts(&merged(&files)), ["a1", "b1"]);
}

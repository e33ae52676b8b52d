//! The compact statement log (format version 2) through the library's own writer and
//! readers: it reads back exactly as the JSON lines of version 1 would, a repeated statement
//! costs at most 48 bytes with its outcome, version 1 logs are read and continued as JSON,
//! and a cut or damaged file never crashes a reader.

use sandpit::journal::log::{
    read_page, read_statements, to_line, unreadable_lines, LogRecord, OutcomeRecord, OutcomeRef,
    StatementRecord, StatementRef, TokenLog,
};

const TOKEN: &str = "sp_compacttesttoken";
const TASK: &str = "compact";

fn statement(seq: u64, text: &str, params: Vec<Option<String>>) -> StatementRecord {
    StatementRecord {
        seq,
        ts: format!(
            "2030-12-03T21:00:{:02}.{:09}Z",
            seq % 60,
            seq * 7919 % 1_000_000_000
        ),
        token: TOKEN.into(),
        task: TASK.into(),
        session: seq % 3 + 1,
        protocol: ["simple", "extended", "function"][(seq % 3) as usize].into(),
        text: text.into(),
        params,
        kind: ["read", "write", "odd-kind"][(seq % 3) as usize].into(),
    }
}

fn outcome(seq: u64) -> OutcomeRecord {
    OutcomeRecord {
        seq,
        ts: format!(
            "2030-12-03T21:01:{:02}.{:09}Z",
            seq % 60,
            seq * 104_729 % 1_000_000_000
        ),
        rows: (!seq.is_multiple_of(4)).then_some(seq * 3),
        capped: seq.is_multiple_of(5),
        duration_ms: (seq * 1_234 % 100_000) as f64 / 1000.0,
        sqlstate: seq.is_multiple_of(4).then(|| "23505".to_string()),
        tag: match seq % 4 {
            0 => None,
            1 => Some(format!("SELECT {}", seq * 3)),
            2 => Some("INSERT 0 1".into()),
            _ => Some("ODD TAG 007".into()),
        },
        skipped: seq.is_multiple_of(7),
        denied: seq.is_multiple_of(11),
        kind: (seq % 4 == 1).then(|| "read".to_string()),
    }
}

fn records() -> Vec<LogRecord> {
    let long = format!("select '{}'", "é".repeat(40_000));
    let texts = [
        "select 1",
        "update t set a = $1 where id = $2",
        "select 1",
        "line\nbreak \"quoted\" \u{0} nul \u{b} esc",
        long.as_str(),
    ];
    let mut out = Vec::new();
    for seq in 1..=60u64 {
        let params = match seq % 3 {
            0 => vec![],
            1 => vec![Some("42".into()), None, Some("a\nb\0c\u{b}".into())],
            _ => vec![Some("\\x00ff…".into())],
        };
        let text = texts[(seq % texts.len() as u64) as usize];
        out.push(LogRecord::Statement(statement(seq, text, params)));
        out.push(LogRecord::Outcome(outcome(seq)));
    }
    out
}

/// A version 1 log: the same records as JSON lines.
fn write_v1(path: &std::path::Path, recs: &[LogRecord]) {
    let mut bytes = Vec::new();
    for r in recs {
        bytes.extend(to_line(r).expect("line"));
    }
    std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
    std::fs::write(path, bytes).expect("write v1");
}

fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).expect("json")
}

#[test]
fn compact_records_read_back_exactly_as_json_lines_do() {
    let a = tempfile::tempdir().expect("tmp");
    let b = tempfile::tempdir().expect("tmp");
    let log = TokenLog::open(a.path(), TASK, TOKEN, 0).expect("open");
    let recs = records();
    for r in &recs {
        log.append(r).expect("append");
    }
    drop(log);
    let v1 = sandpit::journal::log::log_path(b.path(), TASK, TOKEN);
    write_v1(&v1, &recs);
    let v2 = sandpit::journal::log::log_path(a.path(), TASK, TOKEN);
    let raw = std::fs::read(&v2).expect("v2");
    assert!(raw.starts_with(b"{\"type\":\"log\",\"version\":2,"));
    // Times after the log's start are stored compact (others stay JSON lines): a text's
    // first use carries it inline (`T`), later ones refer to its definition (`S`).
    let marks = |m: u8| {
        raw.split(|&b| b == b'\n')
            .filter(|l| l.first() == Some(&m))
            .count()
    };
    assert_eq!(marks(b'S') + marks(b'T'), 60);
    // The three short texts are inline once each; the cut one (over 64 KiB) is always
    // defined.
    assert_eq!(marks(b'T'), 3);
    assert!(raw.len() < std::fs::metadata(&v1).expect("v1").len() as usize);
    let (two, one) = (
        read_statements(&v2).expect("v2"),
        read_statements(&v1).expect("v1"),
    );
    assert_eq!(two.len(), 60);
    assert_eq!(json(&two), json(&one));
    // Paged from the middle (bisected), the same.
    let p2 = read_page(&v2, 17, 9).expect("page");
    let p1 = read_page(&v1, 17, 9).expect("page");
    assert_eq!(json(&p2.statements), json(&one[17..26].to_vec()));
    assert_eq!(p2.next_after, p1.next_after);
    assert_eq!(unreadable_lines(&v2).expect("check"), Vec::<u64>::new());
    // Reopened, it goes on in the same format, its texts new again, seq continuing.
    let log = TokenLog::open(a.path(), TASK, TOKEN, 0).expect("reopen");
    assert_eq!(log.next_seq(), 61);
    log.append(&LogRecord::Statement(statement(61, "select 1", vec![])))
        .expect("append");
    drop(log);
    let again = read_statements(&v2).expect("v2");
    assert_eq!(again.len(), 61);
    assert_eq!(again[60].statement.text, "select 1");
    assert_eq!(again[60].statement.seq, 61);
}

#[test]
fn a_text_is_inline_at_its_first_use_and_defined_at_its_second() {
    let d = tempfile::tempdir().expect("tmp");
    let log = TokenLog::open(d.path(), TASK, TOKEN, 0).expect("open");
    let path = log.path().to_path_buf();
    let texts: Vec<String> = (0..3000)
        .map(|i| format!("SELECT abalance FROM pgbench_accounts WHERE aid = {i};"))
        .collect();
    // 100 texts three times each, then 2900 once each, then one with a line break twice.
    // (A text seen once is remembered in a table of hashes that later texts may take over:
    // then its next use is inline again, and the one after defines it.)
    let odd = "select 'a\nb\u{0}c\u{b}'".to_string();
    let order: Vec<&String> = texts[..100]
        .iter()
        .flat_map(|t| [t, t, t])
        .chain(texts[100..].iter())
        .chain([&odd, &odd])
        .collect();
    for t in &order {
        let seq = log.next_seq();
        let s = StatementRef {
            seq,
            ts: None,
            token: TOKEN,
            task: TASK,
            session: 1,
            protocol: "simple",
            text: t,
            params: &[],
            kind: "read",
        };
        log.append_statement(&s).expect("statement");
    }
    drop(log);
    let raw = std::fs::read(&path).expect("read");
    let lines: Vec<&[u8]> = raw.split(|&b| b == b'\n').collect();
    let count = |f: &dyn Fn(&[u8]) -> bool| lines.iter().filter(|l| f(l)).count();
    assert_eq!(count(&|l| l.first() == Some(&b'T')), 3001);
    let inline: Vec<usize> = lines
        .iter()
        .filter(|l| l.first() == Some(&b'T'))
        .map(|l| l.len() + 1)
        .collect();
    println!(
        "a pgbench -S text used once: {:.1} bytes inline (a definition line and its record: {})",
        inline.iter().sum::<usize>() as f64 / inline.len() as f64,
        lines
            .iter()
            .find(|l| l.starts_with(b"{\"type\":\"text\""))
            .map_or(0, |l| l.len() + 1)
            + lines
                .iter()
                .find(|l| l.first() == Some(&b'S'))
                .map_or(0, |l| l.len() + 1)
    );
    assert_eq!(count(&|l| l.first() == Some(&b'S')), 201);
    assert_eq!(count(&|l| l.starts_with(b"{\"type\":\"text\"")), 101);
    let all = read_statements(&path).expect("read");
    let got: Vec<&str> = all.iter().map(|s| s.statement.text.as_str()).collect();
    let want: Vec<&str> = order.iter().map(|t| t.as_str()).collect();
    assert_eq!(got, want);
    assert_eq!(unreadable_lines(&path).expect("check"), Vec::<u64>::new());
    // A page from the middle of the inline ones, bisected, starts where it should.
    let p = read_page(&path, 1500, 3).expect("page");
    let seqs: Vec<u64> = p.statements.iter().map(|s| s.statement.seq).collect();
    assert_eq!(seqs, vec![1501, 1502, 1503]);
    assert_eq!(p.statements[0].statement.text, *order[1500]);
}

#[test]
fn a_version_1_log_is_read_and_continued_as_json_lines() {
    let d = tempfile::tempdir().expect("tmp");
    let path = sandpit::journal::log::log_path(d.path(), TASK, TOKEN);
    let recs = records();
    write_v1(&path, &recs[..10]);
    let log = TokenLog::open(d.path(), TASK, TOKEN, 0).expect("open");
    for r in &recs[10..] {
        log.append(r).expect("append");
    }
    drop(log);
    let raw = std::fs::read_to_string(&path).expect("still all text");
    for l in raw.lines() {
        serde_json::from_str::<serde_json::Value>(l).expect("a JSON line");
    }
    assert_eq!(read_statements(&path).expect("read").len(), 60);
}

#[test]
fn a_repeated_statement_costs_at_most_48_bytes_with_its_outcome() {
    let d = tempfile::tempdir().expect("tmp");
    let log = TokenLog::open(d.path(), TASK, TOKEN, 0).expect("open");
    let path = log.path().to_path_buf();
    let n = 200_000u64;
    let before = log.data_len();
    for _ in 0..n {
        let seq = log.next_seq();
        log.append_statement(&StatementRef {
            seq,
            ts: None,
            token: TOKEN,
            task: TASK,
            session: 3,
            protocol: "extended",
            text: "SELECT abalance FROM pgbench_accounts WHERE aid = $1",
            params: &[],
            kind: "read",
        })
        .expect("statement");
        log.defer_outcome(&OutcomeRef {
            seq,
            ts: None,
            rows: Some(1),
            capped: false,
            micros: 187,
            sqlstate: None,
            tag: Some("SELECT 1"),
            skipped: false,
            denied: false,
            kind: Some("read"),
        })
        .expect("outcome");
    }
    log.flush_outcomes().expect("flush");
    let per = (log.data_len() - before) as f64 / n as f64;
    drop(log);
    let all = read_statements(&path).expect("read");
    assert_eq!(all.len() as u64, n);
    // The same pair as version 1 stored it (JSON lines), for comparison.
    let last = all.last().expect("one");
    let v1 = to_line(&LogRecord::Statement(last.statement.clone()))
        .expect("line")
        .len()
        + to_line(&LogRecord::Outcome(last.outcome.clone().expect("outcome")))
            .expect("line")
            .len();
    println!("{per:.1} bytes per statement with its outcome (version 1: {v1})");
    assert!(per <= 48.0, "{per} bytes per statement");
    assert!(per * 5.0 < v1 as f64, "{per} vs {v1}");
    assert!(all
        .iter()
        .all(|s| s.outcome.as_ref().and_then(|o| o.tag.as_deref()) == Some("SELECT 1")));
}

#[test]
fn a_cut_or_damaged_log_reads_without_crashing() {
    let d = tempfile::tempdir().expect("tmp");
    let log = TokenLog::open(d.path(), TASK, TOKEN, 0).expect("open");
    for r in &records()[..40] {
        log.append(r).expect("append");
    }
    let path = log.path().to_path_buf();
    drop(log);
    let whole = std::fs::read(&path).expect("read");
    let full = read_statements(&path).expect("read");
    // Cut anywhere in its last 600 bytes (a torn last write): every record before the cut
    // reads, the torn one does not.
    for cut in whole.len().saturating_sub(600)..whole.len() {
        std::fs::write(&path, &whole[..cut]).expect("cut");
        let got = read_statements(&path).expect("read cut");
        assert!(
            got.len() <= full.len() && got.len() + 2 >= full.len(),
            "cut at {cut}"
        );
        for (g, f) in got.iter().zip(&full) {
            assert_eq!(g.statement, f.statement, "cut at {cut}");
        }
    }
    // Bytes overwritten anywhere (a deterministic sweep): no crash, no invented text.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..400 {
        let mut bad = whole.clone();
        for _ in 0..3 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x % bad.len() as u64) as usize;
            bad[at] = (x >> 32) as u8;
        }
        std::fs::write(&path, &bad).expect("damage");
        let got = read_statements(&path).expect("read damaged");
        assert!(got.len() <= full.len() + 1);
        let _ = unreadable_lines(&path).expect("check");
    }
}

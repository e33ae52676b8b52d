//! Tests of `classify`.
use super::*;

#[test]
fn literal_shapes() {
    let s = |t: &str| literal_shape(t);
    assert_eq!(
        s("SELECT abalance FROM t1 WHERE aid = 12345;").as_deref(),
        Some("SELECT abalance FROM t1 WHERE aid = 0;")
    );
    assert_eq!(
        s("update t set v = 'it''s' where id=7").as_deref(),
        Some("update t set v = '' where id=0")
    );
    assert_eq!(s("select $1, \"c 9\"").as_deref(), None); // nothing to blank
    assert_eq!(s("select x2 from y where z = $1").as_deref(), None);
    for t in [
        "select $$a$$",
        "select E'\\'' ; drop table t'",
        "select 1 -- 'x",
        "select '1",
    ] {
        assert_eq!(s(t), None, "{t}");
    }
    // Same shape, same kind; different shapes stay apart.
    assert_eq!(classify("select * from t where id = 1"), Kind::Read);
    assert_eq!(classify("delete from t where id = 1"), Kind::Write);
    assert_eq!(classify("select * from t where id = 2"), Kind::Read);
}

#[test]
fn kinds() {
    assert_eq!(classify("select * from orders"), Kind::Read);
    assert_eq!(
        classify("DELETE FROM orders WHERE status = 'pending' OR TRUE"),
        Kind::Write
    );
    assert_eq!(
        classify("with d as (delete from t returning *) select * from d"),
        Kind::Write
    );
    assert_eq!(classify("create table t(x int)"), Kind::Ddl);
    assert_eq!(classify("alter table t add column y int"), Kind::Ddl);
    assert_eq!(classify("begin"), Kind::Transaction);
    assert_eq!(classify("commit"), Kind::Transaction);
    assert_eq!(classify("grant select on t to public"), Kind::Privilege);
    assert_eq!(classify("set search_path = x"), Kind::Utility);
    assert_eq!(classify("vacuum t"), Kind::Utility);
    assert_eq!(classify("alter system set fsync = off"), Kind::Utility);
    assert_eq!(classify("do $$ begin perform 1; end $$"), Kind::Unparsed);
    assert_eq!(classify("copy t to stdout"), Kind::Read);
    assert_eq!(classify("copy t from stdin"), Kind::Write);
    assert_eq!(classify("select 1 into t2"), Kind::Ddl);
    assert_eq!(classify("set role postgres"), Kind::Privilege);
    assert_eq!(classify("gibberish words"), Kind::Unparsed);
}

#[test]
fn rows() {
    assert!(may_return_rows("select 1"));
    assert!(may_return_rows("  /* hi */ (select 1)"));
    assert!(may_return_rows("fetch all from c"));
    assert!(may_return_rows("insert into t values (1) returning x"));
    assert!(!may_return_rows("insert into t values (1)"));
    assert!(!may_return_rows("create table t(x int)"));
    assert!(may_return_rows("explain select 1"));
}

#[test]
fn splitting() {
    assert_eq!(
        split("select 1; select 2").unwrap(),
        vec!["select 1", "select 2"]
    );
    assert_eq!(
        split("select ';'; select $$;$$; select $a$ $$; $a$")
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        split("select 1 -- ; \n; select /* ; /* ; */ */ 2;")
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        split("select \"a;b\" from t; ;;").unwrap(),
        vec!["select \"a;b\" from t"]
    );
    assert_eq!(split("select E'\\';'; select 2").unwrap().len(), 2);
    assert_eq!(split("select $1; select 2").unwrap().len(), 2);
    assert!(split("select 'open").is_none());
    assert!(
        split("create function f() returns int language sql begin atomic select 1; end").is_none()
    );
    assert_eq!(split("").unwrap().len(), 0);
}

#[test]
fn explain_analyze_and_copy_of_a_write_are_writes() {
    for (text, kind) in [
        ("EXPLAIN DELETE FROM t", Kind::Read),
        ("EXPLAIN ANALYZE DELETE FROM t", Kind::Write),
        ("EXPLAIN (ANALYZE) DELETE FROM t", Kind::Write),
        (
            "explain (format json, analyze true) update t set a = 1",
            Kind::Write,
        ),
        ("EXPLAIN (ANALYSE) INSERT INTO t VALUES (1)", Kind::Write),
        ("EXPLAIN (ANALYZE false) DELETE FROM t", Kind::Read),
        ("EXPLAIN (ANALYZE) SELECT 1", Kind::Read),
        ("COPY t TO STDOUT", Kind::Read),
        ("COPY (SELECT * FROM t) TO STDOUT", Kind::Read),
        ("COPY (DELETE FROM t RETURNING *) TO STDOUT", Kind::Write),
        ("COPY t FROM STDIN", Kind::Write),
    ] {
        assert_eq!(classify(text), kind, "{text}");
    }
}

#[test]
fn split_follows_the_postgres_scanner_where_it_was_fooled() {
    // Findings of the differential fuzz target against libpg_query.
    for (text, n) in [
        ("SELECT 1 -- c\rSELECT 2; SELECT 3", 2),
        ("SELECT 1 AS abcE'\\'; SELECT 2", 2),
        ("SELECT e'\\''; SELECT 2", 2),
        ("SELECT 1 AS é$a$; SELECT 2 AS é$a$", 2),
        ("SELECT $a$ ; $a$; SELECT 2", 2),
    ] {
        assert_eq!(split_as_read(text).map(|p| p.len()), Some(n), "{text:?}");
    }
}

/// [`split`] as the lexer reads with `standard_conforming_strings` on, without the check
/// that the other reading agrees (the reference splitters know only this one).
fn split_as_read(text: &str) -> Option<Vec<&str>> {
    let mut ranges = Vec::new();
    scan(text, false, &mut ranges, None, &mut false)
        .then(|| ranges.into_iter().map(|r| &text[r]).collect())
}

#[test]
fn catalog_and_leading_word_hints() {
    assert!(may_read_catalogs("select * from PG_type"));
    assert!(may_read_catalogs("select * from information_schema.tables"));
    assert!(may_read_catalogs(
        "SELECT 1 FROM INFORMATION_SCHEMA.columns"
    ));
    assert!(!may_read_catalogs(
        "select abalance from pgbench_accounts where aid = 1"
    ));
    assert!(!may_read_catalogs("select information from t"));
    assert!(leading_word_is("/* c */ copy t from stdin", "COPY"));
    assert!(!leading_word_is("select 'copy'", "COPY"));
    assert!(!leading_word_is("select 1", "COPY"));
}

/// The allocation-free first word agrees with `leading_words` on every text, including the
/// ones it hands back to it (comments, non-ASCII, odd starts).
#[test]
fn first_word_agrees_with_leading_words() {
    let mut texts: Vec<String> = [
        "",
        "  ",
        "select 1",
        "  (( SELECT 1",
        "insert into t values (1) returning a",
        "-- c\nselect 1",
        "/* c */ update t set a=1",
        "/* /* n */ */ select 1",
        "_x",
        "x_1y",
        "éselect",
        "selecté 1",
        "\u{85}select",
        ";",
        "1 + 1",
        "\x0bselect",
        "(\n\tWITH x",
        "abcdefghijklmnopqrstuvwxyz",
        "delete/**/from t",
        "ÉDELETE",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // And every short text over a small alphabet of the interesting bytes.
    let alphabet = [
        "s", "E", "_", "1", " ", "(", "-", "/", "*", "\n", "é", ";", "\u{85}",
    ];
    for a in &alphabet {
        for b in &alphabet {
            for c in &alphabet {
                texts.push(format!("{a}{b}{c}x"));
            }
        }
    }
    for t in &texts {
        let slow = leading_words(t, 1).into_iter().next().unwrap_or_default();
        let mut buf = [0u8; 16];
        let fast = first_word_upper(t, &mut buf).to_string();
        let expect = if slow.len() > 16 {
            "?".to_string()
        } else {
            slow.clone()
        };
        assert_eq!(fast, expect, "first_word_upper({t:?})");
        if !slow.is_empty() {
            assert!(
                first_word_is(t, &slow.to_ascii_lowercase()),
                "first_word_is({t:?})"
            );
        }
        assert!(!first_word_is(t, "nosuchword"), "{t:?}");
    }
    // The relay's one look at a simple Query's statement answers as the two questions did.
    for t in texts.iter().map(String::as_str).chain([
        "copy t from stdin",
        "/* c */ COPY t to stdout",
        "Copy",
        "copyx",
        "insert into t values (1) returning a",
        "delete from t",
        "select 1",
        "   ",
    ]) {
        assert_eq!(
            rows_and_copy(t),
            (may_return_rows(t), leading_word_is(t, "COPY")),
            "rows_and_copy({t:?})"
        );
    }
}

#[test]
fn returning_and_rows_without_allocating_still_answer_the_same() {
    assert!(returning("insert into t values (1) Returning a"));
    assert!(returning("/* x */ UPDATE t SET a = 1 RETURNING *"));
    assert!(!returning("select returning from t"));
    assert!(!returning("insert into t values (1)"));
    assert!(may_return_rows("select 1"));
    assert!(may_return_rows("delete from t returning *"));
    assert!(!may_return_rows("delete from t"));
    assert!(!may_return_rows("   "));
    assert!(may_return_rows("averyveryverylongfunctionname()"));
    assert_eq!(
        split("create function f() begin\natomic select 1; end"),
        None
    );
    assert_eq!(
        split("select 1; select 2"),
        Some(vec!["select 1", "select 2"])
    );
}

/// Texts made of SQL fragments chosen by a fixed pseudo-random sequence (repeatable).
fn generated_texts(n: usize) -> Vec<String> {
    const PARTS: &[&str] = &[
        "select ",
        "SELECT ",
        "begin",
        "BEGIN",
        " atomic",
        " ATOMIC",
        "\n",
        " ",
        "Atomic ",
        "bégin ",
        "insert into t values (1)",
        " returning *",
        "'it''s'",
        "42",
        "x2",
        "$1",
        "$$a$$",
        "\"q 9\"",
        ";",
        " -- c\n",
        "/* c */",
        "\\",
        "E'\\''",
        "delete from t",
        "copy t to stdout",
        "with d as (delete from t returning *) select * from d",
        "(",
        "ü",
        "pg_class",
        "begin\natomic",
        "BEGIN ATOMIC",
        "end",
        "information_schema.tables",
        "_",
        "b",
        "B",
        "'",
        "\"",
        "$a$",
        "-",
        "/",
        "*/",
        "abcdefghijklmnop",
        "e'x'",
    ];
    let mut seed: u64 = 0x5eed;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as usize
    };
    (0..n)
        .map(|_| {
            let len = 1 + next() % 8;
            (0..len).map(|_| PARTS[next() % PARTS.len()]).collect()
        })
        .collect()
}

#[test]
fn begin_atomic_agrees_with_upper_casing_a_copy() {
    for t in generated_texts(20_000) {
        let up = t.to_ascii_uppercase();
        let old = up.contains("BEGIN ATOMIC") || up.contains("BEGIN\nATOMIC");
        assert_eq!(begin_atomic(t.as_bytes()), old, "{t:?}");
    }
}

#[test]
fn the_reused_shape_buffer_and_the_last_kind_change_no_answer() {
    let texts = generated_texts(3_000);
    let mut buf = String::from("left over from an earlier statement");
    for t in &texts {
        let fresh = literal_shape(t);
        assert_eq!(literal_shape_into(t, &mut buf), fresh.is_some(), "{t:?}");
        if let Some(f) = fresh {
            assert_eq!(buf, f, "{t:?}");
        }
    }
    // Each text classified twice, apart and in a row, gets one answer (the second from
    // the shared cache or the thread's last entry), the one the parser gives.
    let first: Vec<Kind> = texts.iter().map(|t| classify(t)).collect();
    for (t, k) in texts.iter().zip(&first) {
        assert_eq!(classify(t), *k, "{t:?}");
        assert_eq!(classify(t), *k, "{t:?}");
        let parsed = if reading::ambiguous(t) {
            Kind::Unparsed
        } else {
            classify_uncached(t)
        };
        assert_eq!(parsed, *k, "{t:?}");
    }
}

mod hostile;
mod references;

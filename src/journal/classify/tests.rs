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

/// The byte-at-a-time splitter the word-at-a-time one replaced (kept as the reference).
fn split_reference(text: &str) -> Option<Vec<&str>> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\'' => {
                // E'…' only where the E starts a token (`abcE'x'` is identifier `abce`
                // followed by a standard string), as in PostgreSQL's scanner.
                let escapes = i > 0
                    && (b[i - 1] == b'E' || b[i - 1] == b'e')
                    && !(i > 1 && ident_byte(b[i - 2]));
                i += 1;
                loop {
                    match b.get(i) {
                        None => return None,
                        Some(b'\\') if escapes => i += 2,
                        Some(b'\'') if b.get(i + 1) == Some(&b'\'') => i += 2,
                        Some(b'\'') => break,
                        Some(_) => i += 1,
                    }
                }
            }
            b'"' => {
                i += 1;
                loop {
                    match b.get(i) {
                        None => return None,
                        Some(b'"') if b.get(i + 1) == Some(&b'"') => i += 2,
                        Some(b'"') => break,
                        Some(_) => i += 1,
                    }
                }
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                // A comment ends at a newline: \n or \r, as PostgreSQL's scanner has it.
                while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 1;
                i += 2;
                while depth > 0 {
                    match (b.get(i), b.get(i + 1)) {
                        (None, _) => return None,
                        (Some(b'/'), Some(b'*')) => {
                            depth += 1;
                            i += 2;
                        }
                        (Some(b'*'), Some(b'/')) => {
                            depth -= 1;
                            i += 2;
                        }
                        _ => i += 1,
                    }
                }
                continue;
            }
            b'$' => {
                // $tag$ … $tag$ (a `$1` parameter is not a quote).
                // Inside an identifier (`a$b`, or after a non-ASCII letter) `$` is part of it.
                let prev_ident = i > 0 && (ident_byte(b[i - 1]) || b[i - 1] == b'$');
                let tag_end = b[i + 1..]
                    .iter()
                    .position(|&c| !ident_byte(c))
                    .map(|p| i + 1 + p);
                if let Some(te) = tag_end {
                    let tag = &b[i..=te];
                    let valid = !prev_ident
                        && b[te] == b'$'
                        && !tag[1..tag.len() - 1]
                            .first()
                            .is_some_and(|c| c.is_ascii_digit());
                    if valid {
                        let body_start = te + 1;
                        let close = b[body_start..].windows(tag.len()).position(|w| w == tag)?;
                        i = body_start + close + tag.len();
                        continue;
                    }
                }
            }
            b';' => {
                let piece = text[start..i].trim();
                if !piece.is_empty() {
                    out.push(piece);
                }
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    let piece = text[start..].trim();
    if !piece.is_empty() {
        out.push(piece);
    }
    let atomic = out.iter().any(|p| {
        let up = p.to_ascii_uppercase();
        up.contains("BEGIN ATOMIC") || up.contains("BEGIN\nATOMIC")
    });
    if atomic {
        return None;
    }
    Some(out)
}

/// The byte-at-a-time catalog guess the word-at-a-time one replaced (the reference).
fn may_read_catalogs_reference(text: &str) -> bool {
    let b = text.as_bytes();
    b.iter().enumerate().any(|(i, &c)| {
        c == b'_'
            && ((i >= 2 && b[i - 2..i].eq_ignore_ascii_case(b"pg"))
                || (i >= 11
                    && b[i - 11..i].eq_ignore_ascii_case(b"information")
                    && b.get(i + 1..i + 7)
                        .is_some_and(|w| w.eq_ignore_ascii_case(b"schema"))))
    })
}

#[test]
fn word_at_a_time_scans_agree_with_the_byte_loops() {
    for t in generated_texts(30_000) {
        assert_eq!(split_as_read(&t), split_reference(&t), "{t:?}");
        if !reading::ambiguous(&t) {
            assert_eq!(split(&t), split_reference(&t), "{t:?}");
        }
        assert_eq!(
            may_read_catalogs(&t),
            may_read_catalogs_reference(&t),
            "{t:?}"
        );
    }
}

#[test]
fn has_byte_is_exact() {
    // Every byte value in every lane, next to every other lane content class.
    for lane in 0..8 {
        for v in 0..=255u8 {
            for fill in [0u8, 0x20, 0x7f, 0x80, 0xff, b'b', b'_'] {
                let mut w = [fill; 8];
                w[lane] = v;
                let x = u64::from_le_bytes(w);
                for c in [b'_', b'\'', b'"', b'-', b'/', b'$', b';', b'b', 0, 0xff] {
                    let m = has_byte(x, c);
                    assert_eq!(m != 0, w.contains(&c), "{w:?} {c}");
                    if m != 0 {
                        let first = w.iter().position(|&b| b == c);
                        assert_eq!(Some((m.trailing_zeros() / 8) as usize), first, "{w:?} {c}");
                    }
                }
            }
        }
    }
}

#[test]
fn skip_words_stops_at_the_first_marked_byte() {
    let texts = generated_texts(5_000);
    for t in &texts {
        let b = t.as_bytes();
        for from in 0..b.len() {
            let to = skip_words(b, from, |x| has_byte(x, b'_') | has_byte(x, b';'));
            let first = b[from..].iter().position(|&c| c == b'_' || c == b';');
            match first {
                // Stopped exactly there, or earlier only where less than a word is left.
                Some(p) => assert!(to == from + p || (to <= from + p && b.len() - to < 8)),
                None => assert!(b.len() - to < 8),
            }
        }
    }
}

/// The shape function before it became one pass (kept as the reference).
fn literal_shape_reference(text: &str) -> Option<String> {
    let b = text.as_bytes();
    if text.contains("--") || text.contains("/*") || b.contains(&b'\\') {
        return None;
    }
    let mut out = String::new();
    let mut changed = false;
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    while i < b.len() {
        let c = b[i];
        if c == b'$' {
            if !b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                return None;
            }
            let end = i + 1 + b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            out.push_str(&text[i..end]);
            i = end;
        } else if c == b'\'' {
            let mut j = i + 1;
            loop {
                match b.get(j) {
                    None => return None,
                    Some(b'\'') if b.get(j + 1) == Some(&b'\'') => j += 2,
                    Some(b'\'') => break,
                    Some(_) => j += 1,
                }
            }
            out.push_str("''");
            changed = true;
            i = j + 1;
        } else if c == b'"' {
            let close = b[i + 1..].iter().position(|&c| c == b'"')?;
            let end = i + 1 + close + 1;
            out.push_str(&text[i..end]);
            i = end;
        } else if c.is_ascii_digit() && (i == 0 || !ident(b[i - 1])) {
            let end = i + b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
            out.push('0');
            changed = true;
            i = end;
        } else {
            let mut end = i + 1;
            while end < b.len() {
                let c = b[end];
                if c == b'$'
                    || c == b'\''
                    || c == b'"'
                    || (c.is_ascii_digit() && !ident(b[end - 1]))
                {
                    break;
                }
                end += 1;
            }
            out.push_str(&text[i..end]);
            i = end;
        }
    }
    changed.then_some(out)
}

#[test]
fn the_one_pass_shape_agrees_with_the_reference() {
    let mut texts = generated_texts(30_000);
    // Every fragment pair and triple boundary once more, short: comment openers and
    // backslashes split across a literal's edge.
    for a in ["'", "\"", "-", "/", "*", "\\", "x", "1", "$1", " "] {
        for b in ["'", "\"", "-", "/", "*", "\\", "x", "1", "$1", " "] {
            for c in ["'", "\"", "-", "/", "*", "x", "1"] {
                texts.push(format!("{a}{b}{c}"));
                texts.push(format!("select {a}{b}{c} from t where a = 5"));
            }
        }
    }
    let mut buf = String::new();
    for t in &texts {
        let old = literal_shape_reference(t);
        assert_eq!(literal_shape_into(t, &mut buf), old.is_some(), "{t:?}");
        if let Some(o) = old {
            assert_eq!(buf, o, "{t:?}");
        }
    }
}

/// Comments as PostgreSQL's scanner ends them (nested block comments; a line comment ends at
/// `\r` too): a misread first word would be a wrong kind, which a token's policy trusts.
#[test]
fn leading_words_skip_comments_as_the_server_does() {
    for (text, kind) in [
        (
            "/* /* */ select */ delete from items * where true",
            Kind::Write,
        ),
        (
            "/* a /* b /* c */ */ select */ drop table t cascade",
            Kind::Ddl,
        ),
        ("/**/ delete from items * where true", Kind::Write),
        ("-- select\rdelete from items * where true", Kind::Write),
        ("-- c\r\ndelete from items * where true", Kind::Write),
    ] {
        assert_eq!(classify(text), kind, "{text:?}");
        assert_eq!(from_keywords(text), kind, "{text:?}");
    }
    assert!(!may_return_rows("/* /* */ select */ delete from items"));
    assert!(leading_word_is(
        "/* /* */ select */ copy t from stdin",
        "COPY"
    ));
}

/// A text whose reading depends on `standard_conforming_strings` or a client-only encoding
/// is not split and is `unparsed` (refused by a policy), whatever it looks like.
#[test]
fn texts_the_server_may_read_otherwise_are_not_understood() {
    let hidden = "select '\\' , ' ; delete from items; --'";
    assert_eq!(split(hidden), None);
    assert_eq!(classify(hidden), Kind::Unparsed);
    let cte =
        "with a as (select '\\', ' ), d as (delete from t returning 1) select 1 --' ) select 1";
    assert_eq!(classify(cte), Kind::Unparsed);
    // A backslash that reads the same either way changes nothing.
    assert_eq!(classify("select 'C:\\temp'"), Kind::Read);
    assert_eq!(
        split("select 'C:\\temp'; select 2").map(|p| p.len()),
        Some(2)
    );
}

/// A text the splitter cannot part is judged whole: several statements in it, a WITH or
/// EXPLAIN only the parser could read, or an EXECUTE of whatever the server holds are not
/// understood (a policy refuses them); a PREPARE is as strong as what it prepares.
#[test]
fn whole_texts_are_judged_by_everything_in_them() {
    let many = format!("{}delete from items", "select 1;".repeat(MAX_STATEMENTS));
    assert_eq!(split(&many), None);
    assert_eq!(classify(&many), Kind::Unparsed);
    let atomic = "create function f() returns int language sql begin atomic select 1; end; \
                  delete from items";
    assert_eq!(split(atomic), None);
    assert_eq!(classify(atomic), Kind::Unparsed);
    let padded = format!(
        "with d as (delete from items returning 1) select 1 /* {} */",
        "x".repeat(PARSE_MAX)
    );
    assert_eq!(classify(&padded), Kind::Unparsed);
    assert_eq!(
        from_keywords("EXPLAIN ANALYZE DELETE FROM t"),
        Kind::Unparsed
    );
    assert_eq!(classify("prepare p as delete from items"), Kind::Write);
    assert_eq!(classify("prepare p as select 1"), Kind::Utility);
    assert_eq!(classify("execute p"), Kind::Unparsed);
    assert_eq!(classify("select 1; select 2"), Kind::Unparsed);
    // Past the parser's bound, a semicolon in a string is still one statement.
    let big = format!("insert into t values ('{};')", "x".repeat(PARSE_MAX));
    assert_eq!(classify(&big), Kind::Write);
    assert_eq!(classify("select 1;"), Kind::Read);
}

/// A split never holds more than MAX_STATEMENTS ranges, whatever the text: a 2 MB Query of
/// empty-ish statements costs the bound, not 16 bytes per statement.
#[test]
fn a_split_is_bounded_in_statements() {
    let text = "1;".repeat(1_000_000);
    let mut out = Vec::new();
    assert!(!split_ranges(&text, &mut out));
    assert!(out.len() <= MAX_STATEMENTS, "{}", out.len());
    let text = "'\\';".repeat(500_000);
    assert!(!split_ranges(&text, &mut out));
    assert!(out.len() <= MAX_STATEMENTS, "{}", out.len());
}

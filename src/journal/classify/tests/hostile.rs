//! Texts a hostile agent writes to be misread: comments, backslashes whose meaning the
//! session's settings change, text the splitter cannot part, huge counts.

use super::super::*;

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

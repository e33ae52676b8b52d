//! Table tests of the compact record codec: round trips, every cut point, bounds.

use super::*;

#[test]
fn integers_table() {
    for (n, len) in [
        (0u64, 1usize),
        (111, 1),
        (112, 2),
        (14_335, 2),
        (14_336, 3),
        (1_835_007, 3),
        (1_835_008, 4),
        (3_600_000_000_000, 6),
        (400_000_000_000_000, 7),
        (u64::MAX, 10),
    ] {
        let mut out = Vec::new();
        put_v(&mut out, n);
        assert_eq!(out.len(), len, "{n}");
        assert!(out.iter().all(|&b| b >= 0x10), "{n}: {out:?}");
        let mut c = Cursor::new(&out);
        assert_eq!(c.v(), Some(n));
        assert!(c.done());
        // Every cut of it is refused, never misread.
        for cut in 0..out.len() {
            assert_eq!(Cursor::new(&out[..cut]).v(), None, "{n} cut at {cut}");
        }
    }
    // Too many continuation bytes, bytes outside the alphabet: refused.
    for bad in [
        vec![0xff; 11],
        vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
        vec![0x0a],
        vec![0x00],
        vec![0x80, 0x05],
    ] {
        assert_eq!(Cursor::new(&bad).v(), None, "{bad:?}");
    }
}

fn sample_statement() -> Statement<'static> {
    Statement {
        seq: 5_000_000,
        ts: 3_600_000_000_123,
        session: 7,
        protocol: Ref::Word(1),
        text: Text::Ref(Ref::At(123)),
        kind: Ref::Word(3),
    }
}

#[test]
fn statements_round_trip_and_cuts_are_refused() {
    let texts = [
        Text::Ref(Ref::At(123)),
        Text::Inline("select 1".into()),
        Text::Inline("a\nb\0c\u{b}d ✓ 'S' O\u{1}".into()),
        Text::Inline(String::new().into()),
        Text::Inline("y".repeat(300).into()),
    ];
    for (params, text) in [
        vec![],
        vec![None],
        vec![Some(String::new()), None, Some("a\nb\0c\u{b}d ✓".into())],
        vec![Some("x".repeat(300))],
    ]
    .into_iter()
    .flat_map(|p| texts.iter().map(move |t| (p.clone(), t.clone())))
    {
        let s = Statement {
            text,
            ..sample_statement()
        };
        let mut out = Vec::new();
        put_statement(&mut out, &s, &params);
        assert_eq!(out.pop(), Some(b'\n'));
        assert!(!out.contains(&b'\n') && !out.contains(&0), "{out:?}");
        assert_eq!(head(&out), Some((STATEMENT, s.seq)));
        assert_eq!(statement(&out), Some((s.clone(), params.clone())));
        for cut in 0..out.len() {
            assert_eq!(statement(&out[..cut]), None, "cut at {cut}");
        }
    }
}

#[test]
fn inline_texts_are_bounded() {
    for (len, read) in [(INLINE_MAX, true), (INLINE_MAX + 1, false)] {
        let s = Statement {
            text: Text::Inline("z".repeat(len).into()),
            ..sample_statement()
        };
        let mut out = Vec::new();
        put_statement(&mut out, &s, &[]);
        out.pop();
        assert_eq!(statement(&out).is_some(), read, "{len}");
    }
}

#[test]
fn a_repeated_statement_and_its_outcome_fit_in_48_bytes() {
    let mut out = Vec::new();
    put_statement(&mut out, &sample_statement(), &[]);
    put_outcome(
        &mut out,
        &Outcome {
            seq: 5_000_000,
            ts: 3_600_000_900_000,
            rows: Some(1),
            capped: false,
            micros: 812,
            sqlstate: None,
            tag: Some((Ref::Word(10), Some(1))),
            skipped: false,
            denied: false,
            kind: Some(Ref::Word(3)),
        },
    );
    assert!(out.len() <= 48, "{} bytes", out.len());
}

#[test]
fn outcomes_round_trip_and_cuts_are_refused() {
    let base = Outcome {
        seq: 1,
        ts: 0,
        rows: None,
        capped: false,
        micros: 0,
        sqlstate: None,
        tag: None,
        skipped: false,
        denied: false,
        kind: None,
    };
    for o in [
        base.clone(),
        Outcome {
            rows: Some(200),
            capped: true,
            micros: 12_345_007,
            tag: Some((Ref::Word(10), Some(200))),
            kind: Some(Ref::Word(3)),
            ..base.clone()
        },
        Outcome {
            sqlstate: Some(Ref::At(40)),
            skipped: true,
            denied: true,
            tag: Some((Ref::At(0), None)),
            ..base.clone()
        },
        Outcome {
            rows: Some(u64::MAX),
            tag: Some((Ref::Word(11), Some(u64::MAX - 1))),
            ..base.clone()
        },
    ] {
        let mut out = Vec::new();
        put_outcome(&mut out, &o);
        out.pop();
        assert_eq!(head(&out), Some((OUTCOME, o.seq)));
        assert_eq!(outcome(&out), Some(o.clone()));
        for cut in 0..out.len() {
            assert_eq!(outcome(&out[..cut]), None, "cut at {cut}");
        }
    }
}

#[test]
fn tags_split_only_when_they_join_back() {
    for (tag, words, n) in [
        ("SELECT 200", "SELECT", Some(200)),
        ("INSERT 0 1", "INSERT 0", Some(1)),
        ("BEGIN", "BEGIN", None),
        ("SELECT 007", "SELECT 007", None),
        ("SELECT 0", "SELECT", Some(0)),
        ("X 99999999999999999999", "X 99999999999999999999", None),
        ("X 18446744073709551615", "X 18446744073709551615", None),
        ("X 18446744073709551614", "X", Some(u64::MAX - 1)),
        ("TAG ", "TAG ", None),
        ("", "", None),
    ] {
        assert_eq!(split_tag(tag), (words, n), "{tag}");
        assert_eq!(join_tag(words, n), tag);
    }
}

#[test]
fn references_table() {
    for (r, code) in [
        (Ref::Word(0), 0u64),
        (Ref::Word(31), 31),
        (Ref::At(0), 32),
        (Ref::At(1000), 1032),
    ] {
        assert_eq!(r.code(), code);
        assert_eq!(Ref::from_code(code), Some(r));
    }
    assert_eq!(Ref::word("extended"), Some(Ref::Word(1)));
    assert_eq!(Ref::word("nope"), None);
}

#[test]
fn every_word_found_by_its_slot_and_nothing_else() {
    for (i, w) in WORDS.iter().enumerate() {
        assert_eq!(Ref::word(w), Some(Ref::Word(i as u8)), "{w}");
        // Same first byte and length, another text; a prefix; a longer text; other case.
        let mut other = w.to_string();
        other.push('x');
        let changed = format!("{}{}", &w[..1], "~".repeat(w.len() - 1));
        for not in [&other, &w[..w.len() - 1], &changed, &w.to_ascii_lowercase()] {
            if not != *w {
                assert_eq!(Ref::word(not), None, "{not:?}");
            }
        }
    }
    for not in [
        "",
        "S",
        "\u{e9}t\u{e9}",
        "SELECT SELECT SELECT SELECT",
        "\0",
    ] {
        assert_eq!(Ref::word(not), None, "{not:?}");
    }
}

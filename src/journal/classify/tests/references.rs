//! The classifier's fast scans against the byte-at-a-time loops they replaced, over
//! generated texts.

use super::super::*;
use super::{generated_texts, split_as_read};

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

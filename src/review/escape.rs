//! Values and names shown to a person, made unable to lie about their shape: control and
//! format characters (a newline that would start a fake line, U+202E that would reverse
//! what follows, U+200B that hides a difference) are shown as `\u{..}` escapes, in text and
//! MCP answers and (styled, inside a bidi isolate) on HTML pages; long text is cut short
//! with an ellipsis, never inside a character.

/// Whether `c` changes how text around it is laid out or read rather than showing as a
/// glyph: controls (C0, DEL, C1), format characters (Unicode category Cf: bidi embeddings,
/// overrides and isolates, zero-width characters, the BOM, tag characters…), and the line
/// and paragraph separators.
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(c as u32,
            0x00AD | 0x0600..=0x0605 | 0x061C | 0x06DD | 0x070F | 0x0890..=0x0891 | 0x08E2
            | 0x180E | 0x200B..=0x200F | 0x2028..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F
            | 0xFEFF | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F)
}

/// The escape shown for a hidden character.
pub fn escape_of(c: char) -> String {
    format!("\\u{{{:x}}}", c as u32)
}

/// `s` with every hidden character shown as `\u{..}` and each backslash doubled (so an
/// escape in the data cannot pass for one of ours).
pub fn visible(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\\' {
            o.push_str("\\\\");
        } else if is_hidden(c) {
            o.push_str(&escape_of(c));
        } else {
            o.push(c);
        }
    }
    o
}

/// `s` as a quoted value on one line: `'…'`, quotes doubled, hidden characters escaped.
pub fn quoted(s: &str) -> String {
    format!("'{}'", visible(s).replace('\'', "''"))
}

/// `s` cut to at most `max` bytes on a char boundary, with an ellipsis when cut.
pub fn cap(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_characters_are_shown_and_nothing_else_changes() {
        let cases: &[(&str, &str)] = &[
            ("plain", "plain"),
            ("a\nb", "a\\u{a}b"),
            ("x\u{202e}cba", "x\\u{202e}cba"),
            ("zero\u{200b}width", "zero\\u{200b}width"),
            ("tab\tcr\r", "tab\\u{9}cr\\u{d}"),
            ("bom\u{feff}", "bom\\u{feff}"),
            ("iso\u{2066}x\u{2069}", "iso\\u{2066}x\\u{2069}"),
            ("ls\u{2028}", "ls\\u{2028}"),
            ("c1\u{85}", "c1\\u{85}"),
            ("back\\u{a}slash", "back\\\\u{a}slash"),
            ("héllo 日本 עברית", "héllo 日本 עברית"),
        ];
        for (raw, shown) in cases {
            assert_eq!(visible(raw), *shown, "{raw:?}");
            assert!(!visible(raw).chars().any(is_hidden));
        }
        assert_eq!(quoted("it's\n"), "'it''s\\u{a}'");
    }
}

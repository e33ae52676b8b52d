//! Whether the server reads a text as the gateway does whatever the session's lexical state
//! is. Two settings change where a quoted string ends: `standard_conforming_strings = off`
//! (a backslash in a plain `'…'` string escapes the next byte) and a client-only encoding
//! (SJIS, BIG5, GBK, UHC, GB18030, JOHAB: a backslash may be the second byte of a character,
//! escaping nothing). The agent can change both from any statement (`set_config(…)` is a
//! SELECT) pipelined right before the text, so the gateway cannot know which reading the
//! server will use when it reads a message: a text whose reading depends on them is "not
//! understood" (unsplittable, kind `unparsed`), which a token's policy refuses.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use super::scan;

/// Whether `text` may be read otherwise by the server than by the gateway's lexer.
pub(super) fn ambiguous(text: &str) -> bool {
    let b = text.as_bytes();
    if !b.contains(&b'\\') {
        return false; // neither setting changes the reading of a text with no backslash
    }
    // A backslash right after a non-ASCII byte may be a multibyte character's second byte.
    if b.windows(2).any(|w| w[0] >= 0x80 && w[1] == b'\\') {
        return true;
    }
    let (mut on, mut off) = (Vec::new(), Vec::new());
    // The token ends are hashed, not kept: a text of millions of tiny strings costs no
    // memory. The key is random per call, so no text can be made to collide on purpose.
    let key = RandomState::new();
    let (mut on_marks, mut off_marks) = (key.build_hasher(), key.build_hasher());
    let mut quoted = false;
    let on_ok = scan(text, false, &mut on, Some(&mut on_marks), &mut quoted);
    let off_ok = scan(text, true, &mut off, Some(&mut off_marks), &mut quoted);
    // Same statement ends and the same end of every quoted token and comment: the code
    // between them is lexed alike, so the two readings are the same text.
    on_ok != off_ok || on != off || on_marks.finish() != off_marks.finish()
}

#[cfg(test)]
mod tests {
    use super::ambiguous;

    #[test]
    fn readings_that_depend_on_the_session_are_ambiguous() {
        for (text, yes) in [
            ("select 1", false),
            ("select 'C:\\path'", false),
            ("select 'a\\\\'", false),
            ("select E'it\\'s'; select 2", false),
            ("select '\\' , ' ; delete from items; --'", true),
            (
                "with a as (select '\\', ' ), d as (delete from t returning 1) select 1 --' ) select 1",
                true,
            ),
            ("select 'a\\'", true),
            ("select E'\u{c1}\\' ; delete from t; --'", true),
            ("select 1 -- \u{e9}\\", true),
            ("select '\u{e9}', 1 -- a \\ b", false),
        ] {
            assert_eq!(ambiguous(text), yes, "{text:?}");
        }
    }
}

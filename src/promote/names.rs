//! Names as the review writes them (`schema.table.column`, each part quoted by the server's
//! `quote_ident` where needed), split into parts without losing their quoting.

/// One part of a qualified name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// As written (quoted when it needs to be): safe to put into SQL.
    pub quoted: String,
    /// The name itself.
    pub plain: String,
}

/// Split `a."b.c".d` into its parts. None when the quoting is broken.
pub fn split(s: &str) -> Option<Vec<Part>> {
    let mut parts = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        let mut quoted = String::new();
        let mut plain = String::new();
        if chars.peek() == Some(&'"') {
            quoted.push('"');
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        quoted.push_str("\"\"");
                        plain.push('"');
                    }
                    '"' => {
                        quoted.push('"');
                        break;
                    }
                    c => {
                        quoted.push(c);
                        plain.push(c);
                    }
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                quoted.push(c);
                plain.push(c);
                chars.next();
            }
            if plain.is_empty() {
                return None;
            }
        }
        parts.push(Part { quoted, plain });
        match chars.next() {
            None => return Some(parts),
            Some('.') => continue,
            Some(_) => return None,
        }
    }
}

/// `name` as an identifier, always quoted.
pub fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The plain (unquoted) form of a qualified name, parts joined by dots; the input itself
/// when it does not split.
pub fn plain(s: &str) -> String {
    split(s)
        .map(|p| {
            p.iter()
                .map(|x| x.plain.as_str())
                .collect::<Vec<_>>()
                .join(".")
        })
        .unwrap_or_else(|| s.to_string())
}

/// A qualified name split as (everything but the last part, quoted; the last part).
pub fn parent_and_last(s: &str) -> Option<(String, Part)> {
    let mut p = split(s)?;
    let last = p.pop()?;
    if p.is_empty() {
        return None;
    }
    let parent = p
        .iter()
        .map(|x| x.quoted.as_str())
        .collect::<Vec<_>>()
        .join(".");
    Some((parent, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_parts_keep_dots_and_quotes() {
        let p = split("public.\"my.ta\"\"ble\".col").unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[1].plain, "my.ta\"ble");
        assert_eq!(p[1].quoted, "\"my.ta\"\"ble\"");
        assert_eq!(plain("public.\"A\".b"), "public.A.b");
        assert!(split("a..b").is_none());
        assert!(split("\"a").is_none());
        let (parent, last) = parent_and_last("s.t.\"C\"").unwrap();
        assert_eq!(parent, "s.t");
        assert_eq!(last.plain, "C");
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
    }
}

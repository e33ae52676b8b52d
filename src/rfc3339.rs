//! RFC 3339 timestamps, the one way times are written in records, views, tags and reviews.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// `t` as RFC 3339, or why it cannot be written (a year past 9999).
pub fn try_format(t: OffsetDateTime) -> Result<String, time::error::Format> {
    t.format(&Rfc3339)
}

/// `t` as RFC 3339 (empty for a time RFC 3339 cannot write).
pub fn format(t: OffsetDateTime) -> String {
    try_format(t).unwrap_or_default()
}

/// The current time (UTC) as RFC 3339.
pub fn now() -> String {
    format(OffsetDateTime::now_utc())
}

/// An RFC 3339 time, if `s` is one.
pub fn parse(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &Rfc3339).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_and_parses_back() {
        let t = time::macros::datetime!(2026-01-02 03:04:05.5 UTC);
        assert_eq!(super::format(t), "2026-01-02T03:04:05.5Z");
        assert_eq!(super::parse(&super::format(t)), Some(t));
        assert_eq!(super::parse("yesterday"), None);
    }
}

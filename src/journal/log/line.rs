//! Records written as JSON lines by hand, into a reused buffer: the relay writes two per
//! statement, and a general serialiser (with float formatting of the duration and a fresh
//! allocation per record) cost as much as the rest of the relay. The output is plain JSON
//! with the same keys in the same order as before (readers check `type` then `seq` first),
//! so `serde_json` reads it back (see `read`).

use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use super::{LogRecord, TEXT_MAX};

/// Longest text parameter kept in the log, in bytes.
const PARAM_LOG_MAX: usize = 256;
/// Binary parameters are logged as a hex prefix of this many bytes.
const PARAM_HEX_MAX: usize = 32;

/// How a bind parameter (format code and value, None for NULL) appears in a statement
/// record's `params`: text cut to [`PARAM_LOG_MAX`] bytes, binary as a short hex prefix,
/// `…` marking a cut; None for NULL.
pub fn param_text(format: i16, value: Option<&[u8]>) -> Option<String> {
    let v = value?;
    if format == 1 {
        let n = v.len().min(PARAM_HEX_MAX);
        let more = if v.len() > n { "…" } else { "" };
        return Some(format!("\\x{}{more}", hex::encode(&v[..n])));
    }
    let mut s = String::from_utf8_lossy(&v[..v.len().min(PARAM_LOG_MAX)]).into_owned();
    if v.len() > PARAM_LOG_MAX {
        s.push('…');
    }
    Some(s)
}

/// A statement record's fields, borrowed from the session (nothing is copied to write it).
pub struct StatementRef<'a> {
    /// Sequence number.
    pub seq: u64,
    /// Its time (RFC 3339), or None for now.
    pub ts: Option<&'a str>,
    /// Token id.
    pub token: &'a str,
    /// Task name.
    pub task: &'a str,
    /// Session number.
    pub session: u64,
    /// "simple", "extended" or "function".
    pub protocol: &'a str,
    /// Statement text as sent (cut to [`TEXT_MAX`] when written).
    pub text: &'a str,
    /// Logged bind parameters.
    pub params: &'a [Option<String>],
    /// Its kind's word.
    pub kind: &'a str,
}

/// An outcome record's fields, borrowed.
pub struct OutcomeRef<'a> {
    /// The statement's `seq`.
    pub seq: u64,
    /// Its time (RFC 3339), or None for now.
    pub ts: Option<&'a str>,
    /// Rows returned or affected.
    pub rows: Option<u64>,
    /// Cut by a cap.
    pub capped: bool,
    /// Wall time from forwarding to completion, in microseconds (written as milliseconds
    /// with three decimals).
    pub micros: u64,
    /// SQLSTATE when it failed.
    pub sqlstate: Option<&'a str>,
    /// The tag the client saw.
    pub tag: Option<&'a str>,
    /// Never ran.
    pub skipped: bool,
    /// Refused by the seatbelt.
    pub denied: bool,
    /// The kind its command tags tell (None: they do not, or it never completed).
    pub kind: Option<&'a str>,
}

/// What the last records had in common, kept formatted: the statement text escaped (a
/// prepared statement or a driver's repeated query is escaped once), the token and task
/// (the same for every record of a log), the date and time to the second.
#[derive(Default)]
pub(super) struct EscapeCache {
    text: String,
    escaped: Vec<u8>,
    token: String,
    task: String,
    /// `,"token":…,"task":…` for `token` and `task`.
    ident: Vec<u8>,
    /// `YYYY-MM-DDTHH:MM:SS.` of second `secs` (empty: none yet).
    second: Vec<u8>,
    secs: u64,
}

/// Texts longer than this are escaped each time rather than kept in the cache.
const CACHE_MAX: usize = 4096;

impl EscapeCache {
    fn put_text(&mut self, out: &mut Vec<u8>, text: &str) {
        if text.len() > CACHE_MAX {
            return put_str(out, text);
        }
        if self.escaped.is_empty() || self.text != text {
            self.text.clear();
            self.text.push_str(text);
            self.escaped.clear();
            put_str(&mut self.escaped, text);
        }
        out.extend_from_slice(&self.escaped);
    }

    fn put_ident(&mut self, out: &mut Vec<u8>, token: &str, task: &str) {
        if self.ident.is_empty() || self.token != token || self.task != task {
            self.token.clear();
            self.token.push_str(token);
            self.task.clear();
            self.task.push_str(task);
            self.ident.clear();
            self.ident.extend_from_slice(b",\"token\":");
            put_str(&mut self.ident, token);
            self.ident.extend_from_slice(b",\"task\":");
            put_str(&mut self.ident, task);
        }
        out.extend_from_slice(&self.ident);
    }

    /// `ts` as a JSON string, or the current time.
    fn put_ts(&mut self, out: &mut Vec<u8>, ts: Option<&str>) {
        match ts {
            Some(ts) => put_str(out, ts),
            None => {
                out.push(b'"');
                self.put_now(out);
                out.push(b'"');
            }
        }
    }

    /// The current time as RFC 3339 in UTC with nanoseconds (`2026-12-02T13:44:09.218694732Z`).
    fn put_now(&mut self, out: &mut Vec<u8>) {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        if self.second.is_empty() || self.secs != d.as_secs() {
            self.secs = d.as_secs();
            self.second.clear();
            put_second(&mut self.second, self.secs);
        }
        out.extend_from_slice(&self.second);
        put_digits(out, u64::from(d.subsec_nanos()), 9);
        out.push(b'Z');
    }
}

/// Appends the statement record's line (with its newline) to `out`.
pub(super) fn statement_line(out: &mut Vec<u8>, s: &StatementRef<'_>, cache: &mut EscapeCache) {
    let (text, cut) = cut_text(s.text);
    out.reserve(160 + s.token.len() + s.task.len() + text.len());
    out.extend_from_slice(b"{\"type\":\"statement\",\"seq\":");
    put_u64(out, s.seq);
    out.extend_from_slice(b",\"ts\":");
    cache.put_ts(out, s.ts);
    cache.put_ident(out, s.token, s.task);
    out.extend_from_slice(b",\"session\":");
    put_u64(out, s.session);
    out.extend_from_slice(b",\"protocol\":");
    put_str(out, s.protocol);
    out.extend_from_slice(b",\"text\":");
    cache.put_text(out, text);
    if let Some((len, sha)) = cut {
        out.extend_from_slice(b",\"text_len\":");
        put_u64(out, len);
        out.extend_from_slice(b",\"text_sha256\":\"");
        out.extend_from_slice(sha.as_bytes());
        out.push(b'"');
    }
    if !s.params.is_empty() {
        out.extend_from_slice(b",\"params\":[");
        for (i, p) in s.params.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match p {
                Some(v) => put_str(out, v),
                None => out.extend_from_slice(b"null"),
            }
        }
        out.push(b']');
    }
    out.extend_from_slice(b",\"kind\":");
    put_str(out, s.kind);
    out.extend_from_slice(b"}\n");
}

/// Appends the outcome record's line (with its newline) to `out`.
pub(super) fn outcome_line(out: &mut Vec<u8>, o: &OutcomeRef<'_>, cache: &mut EscapeCache) {
    out.reserve(160);
    out.extend_from_slice(b"{\"type\":\"outcome\",\"seq\":");
    put_u64(out, o.seq);
    out.extend_from_slice(b",\"ts\":");
    cache.put_ts(out, o.ts);
    out.extend_from_slice(b",\"rows\":");
    match o.rows {
        Some(n) => put_u64(out, n),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(if o.capped {
        b",\"capped\":true"
    } else {
        b",\"capped\":false"
    });
    out.extend_from_slice(b",\"duration_ms\":");
    put_u64(out, o.micros / 1000);
    out.push(b'.');
    let frac = o.micros % 1000;
    out.extend_from_slice(&[
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
    out.extend_from_slice(b",\"sqlstate\":");
    put_opt_str(out, o.sqlstate);
    out.extend_from_slice(b",\"tag\":");
    put_opt_str(out, o.tag);
    if o.skipped {
        out.extend_from_slice(b",\"skipped\":true");
    }
    if o.denied {
        out.extend_from_slice(b",\"denied\":true");
    }
    if let Some(k) = o.kind {
        out.extend_from_slice(b",\"kind\":");
        if k.bytes().all(|c| c.is_ascii_lowercase()) {
            // A kind's word (the relay's case): nothing to escape.
            out.push(b'"');
            out.extend_from_slice(k.as_bytes());
            out.push(b'"');
        } else {
            put_str(out, k);
        }
    }
    out.extend_from_slice(b"}\n");
}

/// The line (with its newline) a record is stored as (it cannot fail; the `Result` is kept
/// for callers written when a serialiser made the line).
pub fn to_line(rec: &LogRecord) -> Result<Vec<u8>, std::convert::Infallible> {
    let mut line = Vec::new();
    match rec {
        LogRecord::Statement(s) => {
            statement_line(&mut line, &statement_ref(s), &mut EscapeCache::default())
        }
        LogRecord::Outcome(o) => {
            outcome_line(&mut line, &outcome_ref(o), &mut EscapeCache::default())
        }
    }
    Ok(line)
}

/// A statement record as the writer takes it.
pub(super) fn statement_ref(s: &super::StatementRecord) -> StatementRef<'_> {
    StatementRef {
        seq: s.seq,
        ts: Some(&s.ts),
        token: &s.token,
        task: &s.task,
        session: s.session,
        protocol: &s.protocol,
        text: &s.text,
        params: &s.params,
        kind: &s.kind,
    }
}

/// An outcome record as the writer takes it (its duration to the microsecond).
pub(super) fn outcome_ref(o: &super::OutcomeRecord) -> OutcomeRef<'_> {
    OutcomeRef {
        seq: o.seq,
        ts: Some(&o.ts),
        rows: o.rows,
        capped: o.capped,
        micros: (o.duration_ms.max(0.0) * 1000.0).round() as u64,
        sqlstate: o.sqlstate.as_deref(),
        tag: o.tag.as_deref(),
        skipped: o.skipped,
        denied: o.denied,
        kind: o.kind.as_deref(),
    }
}

/// The text as stored, and its length and digest when that is not all of it.
pub(super) fn cut_text(text: &str) -> (&str, Option<(u64, String)>) {
    if text.len() <= TEXT_MAX {
        return (text, None);
    }
    let mut end = TEXT_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let digest = Sha256::digest(text.as_bytes());
    (&text[..end], Some((text.len() as u64, hex::encode(digest))))
}

fn put_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// A JSON string: `"`, `\` and control characters escaped, everything else (valid UTF-8,
/// it is a `str`) copied as is, a run at a time.
pub(super) fn put_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let b = s.as_bytes();
    out.push(b'"');
    // Most text needs no escape: its clean start is found eight bytes at a time.
    let start = clean_prefix(b);
    out.extend_from_slice(&b[..start]);
    let mut start = start;
    for (i, &c) in b.iter().enumerate().skip(start) {
        if c >= 0x20 && c != b'"' && c != b'\\' {
            continue;
        }
        out.extend_from_slice(&b[start..i]);
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(c >> 4)],
                HEX[usize::from(c & 15)],
            ]),
        }
        start = i + 1;
    }
    out.extend_from_slice(&b[start..]);
    out.push(b'"');
}

/// How many leading bytes of `b` a JSON string holds as they are (no `"`, `\\` or
/// control character among them).
fn clean_prefix(b: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte of `x` is zero / below 0x20: the high bit of its lane in these (exact as a
    // whole-word test, the classic "has zero byte" trick).
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH != 0;
    let has_below_20 = |x: u64| x.wrapping_sub(ONES * 0x20) & !x & HIGH != 0;
    let mut i = 0;
    while let Some(chunk) = b.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        if has_below_20(x)
            || has_zero(x ^ (ONES * u64::from(b'"')))
            || has_zero(x ^ (ONES * u64::from(b'\\')))
        {
            break;
        }
        i += 8;
    }
    i + b[i..]
        .iter()
        .take_while(|&&c| c >= 0x20 && c != b'"' && c != b'\\')
        .count()
}

fn put_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

fn put_digits(out: &mut Vec<u8>, n: u64, width: usize) {
    let mut buf = [b'0'; 9];
    let mut n = n;
    for i in (0..width).rev() {
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out.extend_from_slice(&buf[..width]);
}

/// A Unix time in nanoseconds as the RFC 3339 string the writer gives the current time
/// (nine decimals, `Z`): how a compact record's time is read back.
pub(super) fn time_text(unix_ns: u64) -> String {
    let mut out = Vec::with_capacity(30);
    put_second(&mut out, unix_ns / 1_000_000_000);
    put_digits(&mut out, unix_ns % 1_000_000_000, 9);
    out.push(b'Z');
    String::from_utf8(out).unwrap_or_default()
}

/// The current Unix time in nanoseconds.
pub(super) fn now_ns() -> u64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    d.as_secs() * 1_000_000_000 + u64::from(d.subsec_nanos())
}

/// A given record time in Unix nanoseconds, when [`time_text`] gives exactly it back
/// (else the record is written as a JSON line, which keeps any string).
pub(super) fn time_ns(ts: &str) -> Option<u64> {
    let t = time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).ok()?;
    let ns = u64::try_from(t.unix_timestamp_nanos()).ok()?;
    (time_text(ns) == ts).then_some(ns)
}

/// `YYYY-MM-DDTHH:MM:SS.` of a Unix time in seconds, UTC.
fn put_second(out: &mut Vec<u8>, secs: u64) {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    put_digits(out, y as u64, 4);
    out.push(b'-');
    put_digits(out, m, 2);
    out.push(b'-');
    put_digits(out, d, 2);
    out.push(b'T');
    put_digits(out, rem / 3600, 2);
    out.push(b':');
    put_digits(out, rem / 60 % 60, 2);
    out.push(b':');
    put_digits(out, rem % 60, 2);
    out.push(b'.');
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's method).
fn civil_from_days(z: i64) -> (i64, u64, u64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_escape_as_serde_json_does() {
        for s in [
            "plain",
            "quote \" back \\ slash",
            "ctl \u{0}\u{1}\u{7f}\u{1f} \n\r\t\u{8}\u{c}",
            "ünïcødé ✓ 😀",
            "",
        ] {
            let mut out = Vec::new();
            put_str(&mut out, s);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(s).unwrap()
            );
            let mut cache = EscapeCache::default();
            let mut twice = Vec::new();
            cache.put_text(&mut twice, s);
            cache.put_text(&mut twice, s);
            assert_eq!(twice.len(), 2 * serde_json::to_string(s).unwrap().len());
        }
    }

    #[test]
    fn the_word_at_a_time_scan_escapes_as_serde_json_does() {
        // Every byte class at every offset of a word (and past the last whole word).
        let specials = [
            '"', '\\', '\n', '\u{1f}', '\u{0}', '\u{7f}', 'é', ' ', 'a', '\u{20}',
        ];
        for len in 0..20 {
            for pos in 0..len {
                for c in specials {
                    let mut s: String = "abcdefghijklmnopqrstu".chars().take(len).collect();
                    s.replace_range(pos..=pos, &c.to_string());
                    let mut out = Vec::new();
                    put_str(&mut out, &s);
                    assert_eq!(
                        String::from_utf8(out).unwrap(),
                        serde_json::to_string(&s).unwrap(),
                        "{s:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn times_match_the_time_crate() {
        for secs in [
            0u64,
            951_782_400,
            1_764_769_449,
            4_102_444_799,
            1_709_164_800,
        ] {
            let mut out = Vec::new();
            put_second(&mut out, secs);
            put_digits(&mut out, 218_694_732, 9);
            out.push(b'Z');
            let t = time::OffsetDateTime::from_unix_timestamp(secs as i64).unwrap()
                + time::Duration::nanoseconds(218_694_732);
            let want = t
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
    }

    #[test]
    fn times_read_back_as_written() {
        for ts in [
            "2026-12-02T13:44:09.218694732Z",
            "1970-01-01T00:00:00.000000000Z",
        ] {
            let ns = time_ns(ts).expect(ts);
            assert_eq!(time_text(ns), ts);
        }
        // Not in the writer's own shape: kept as JSON.
        for ts in [
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00.5+01:00",
            "nope",
        ] {
            assert_eq!(time_ns(ts), None, "{ts}");
        }
        let mut cache = EscapeCache::default();
        let mut out = Vec::new();
        cache.put_now(&mut out);
        let shown = String::from_utf8(out).unwrap();
        assert!(time_ns(&shown).is_some(), "{shown}");
    }

    #[test]
    fn durations_are_milliseconds_to_the_microsecond() {
        for (micros, want) in [
            (0u64, 0.0f64),
            (683, 0.683),
            (1_000, 1.0),
            (12_345_007, 12345.007),
        ] {
            let mut out = Vec::new();
            let o = OutcomeRef {
                seq: 1,
                ts: None,
                rows: None,
                capped: false,
                micros,
                sqlstate: None,
                tag: Some("SELECT 1"),
                skipped: false,
                denied: false,
                kind: None,
            };
            outcome_line(&mut out, &o, &mut EscapeCache::default());
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["duration_ms"].as_f64().unwrap(), want);
        }
    }
}

//! Per-statement result caps: what a token allows and how a result is counted against it.

use bytes::Bytes;

use crate::wire::messages;

pub use crate::registry::CapMode;

/// The caps of one session.
#[derive(Debug, Clone, Copy)]
pub struct CapPolicy {
    /// Rows per statement.
    pub max_rows: u64,
    /// Bytes of row data (DataRow / CopyData messages) per statement.
    pub max_bytes: u64,
    /// Truncate or error.
    pub mode: CapMode,
}

impl CapPolicy {
    /// The `max_rows` to ask the backend for when the client asked for `asked` (0 = all):
    /// one more than the cap, so the gateway knows whether anything was left out.
    pub fn lowered(&self, asked: i32) -> Option<i32> {
        let cap = self.max_rows.min(i32::MAX as u64 - 1) as i32;
        (asked <= 0 || asked > cap).then_some(cap + 1)
    }

    /// The notice for a truncated result. `server_finished`: the backend could not be
    /// stopped early (it ran the statement to its end; only the rows shown were sent).
    pub fn notice(&self, rows: u64, by_bytes: bool, server_finished: bool) -> Bytes {
        let mut msg = if by_bytes {
            format!(
                "sandpit: result cut at {rows} rows because it reached max_bytes ({} bytes); ask for less with LIMIT or narrower columns",
                self.max_bytes
            )
        } else {
            format!(
                "sandpit: result cut at {rows} rows (max_rows is {}); ask for fewer rows with LIMIT, or page with OFFSET/keyset (rows returned by INSERT/UPDATE/DELETE/MERGE … RETURNING and results of catalog columns only are not cut by max_rows)",
                self.max_rows
            )
        };
        if server_finished {
            msg.push_str(
                " (the server ran the statement to its end; only the rows shown were sent)",
            );
        }
        messages::notice_response("NOTICE", "01000", &msg)
    }

    /// The error for error mode.
    pub fn error_text(&self) -> String {
        format!(
            "sandpit: result exceeds the cap of {} rows / {} bytes for this token; ask for less with LIMIT or narrower columns",
            self.max_rows, self.max_bytes
        )
    }
}

/// How one result is doing against the cap.
#[derive(Debug, Default, Clone)]
pub struct ResultCount {
    /// Rows (or COPY data messages) passed to the client.
    pub rows: u64,
    /// Bytes passed to the client.
    pub bytes: u64,
    /// Something was left out.
    pub truncated: bool,
    /// It was the byte cap that cut it.
    pub by_bytes: bool,
    /// Its RowDescription says every column comes from a system catalog: a driver's own
    /// catalog query, not cut by the row cap (the byte cap still applies).
    pub catalog: bool,
}

impl ResultCount {
    /// Count one COPY data message of `len` bytes: COPY is capped by bytes only.
    pub fn admit_copy(&mut self, policy: &CapPolicy, len: usize) -> bool {
        if self.truncated {
            return false;
        }
        if self.bytes + len as u64 > policy.max_bytes {
            self.truncated = true;
            self.by_bytes = true;
            return false;
        }
        self.rows += 1;
        self.bytes += len as u64;
        true
    }

    /// Count one row of `len` bytes; false when it must not be passed on.
    pub fn admit(&mut self, policy: &CapPolicy, len: usize) -> bool {
        if !self.truncated && !self.catalog && self.rows >= policy.max_rows {
            self.truncated = true;
        }
        // Past the row check a row is capped by bytes exactly as a COPY message is.
        self.admit_copy(policy, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowering_and_counting() {
        let p = CapPolicy {
            max_rows: 2,
            max_bytes: 100,
            mode: CapMode::Truncate,
        };
        assert_eq!(p.lowered(0), Some(3));
        assert_eq!(p.lowered(10), Some(3));
        assert_eq!(p.lowered(2), None);
        assert_eq!(p.lowered(1), None);
        let mut c = ResultCount::default();
        assert!(c.admit(&p, 10));
        assert!(c.admit(&p, 10));
        assert!(!c.admit(&p, 10));
        assert!(c.truncated && !c.by_bytes);
        let mut c = ResultCount::default();
        assert!(c.admit(&p, 60));
        assert!(!c.admit(&p, 60));
        assert!(c.by_bytes && c.rows == 1);
    }
}

//! When a token's log warns that it is filling up: before the quota refuses statements,
//! each level is crossed once (a metric, a gateway log line, a WARNING to each session).

/// Percentages of `log.max_bytes_per_token` at which a token's log warns (metric, gateway
/// log line, and a WARNING to the client of each session), before the quota refuses
/// statements: no cliff without notice.
pub const FILL_WARNINGS: [u8; 2] = [80, 95];

/// The highest of [`FILL_WARNINGS`] that `len` bytes of a `max` quota reach.
pub(super) fn fill_level(len: u64, max: u64) -> Option<u8> {
    FILL_WARNINGS
        .iter()
        .rev()
        .copied()
        .find(|&p| u128::from(len) * 100 >= u128::from(max) * u128::from(p))
}

#[cfg(test)]
mod tests {
    use super::fill_level;

    #[test]
    fn fill_levels_table() {
        for (len, max, level) in [
            (0, 100, None),
            (79, 100, None),
            (80, 100, Some(80)),
            (94, 100, Some(80)),
            (95, 100, Some(95)),
            (100, 100, Some(95)),
            (250, 100, Some(95)),
            (u64::MAX, u64::MAX, Some(95)),
            (8 * (1 << 20) - 1, 10 * (1 << 20), None),
            (8 * (1 << 20), 10 * (1 << 20), Some(80)),
        ] {
            assert_eq!(fill_level(len, max), level, "{len} of {max}");
        }
    }
}

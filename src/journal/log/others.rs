//! The quota of a token's log under a shared directory counts every front's file of the
//! token, not only this front's: each front sums the sizes of the other fronts' files
//! (one readdir and a stat per front) at open and then each time its own file has grown by
//! a chunk ([`chunk`]: 1/64 of the quota, at most 1 MiB), never per statement and with no
//! lock shared between fronts. Between two sums another front's growth is unseen, so the
//! token's files together can pass the quota by at most a chunk per front (plus a record).
//! A busy front's file may end in reserved zeros (`mapped`): its data end is what counts,
//! read from its last block or few.

use std::path::Path;

use super::Writer;

/// Most bytes this front writes between two sums of the other fronts' files.
const CHUNK_MAX: u64 = 1 << 20;

/// How much this front's file grows between two sums for a quota of `max` bytes.
pub(super) fn chunk(max: u64) -> u64 {
    (max / 64).clamp(1, CHUNK_MAX)
}

/// Sum the other `.jsonl` files in `dir` (this front's, `own`, left out) into `w.others`
/// and set when to sum again. No directory (one gateway, or no quota): nothing to sum, ever.
pub(super) fn resum(w: &mut Writer, dir: Option<&Path>, own: &Path, max: u64) {
    let Some(dir) = dir else {
        w.others = 0;
        w.resum_at = u64::MAX;
        return;
    };
    match sum_others(dir, own) {
        Ok(n) => w.others = n,
        // Kept from the last sum: an unreadable directory does not lift the quota.
        Err(e) => tracing::warn!(error = %e, dir = %dir.display(),
            "statement log: cannot sum the other fronts' files of the token"),
    }
    w.resum_at = w.len.saturating_add(chunk(max));
}

/// Bytes in the `.jsonl` files of `dir` other than `own`.
fn sum_others(dir: &Path, own: &Path) -> std::io::Result<u64> {
    let mut total = 0u64;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if path == own || path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        // A busy front's file ends in its mapping's reserved zeros: only its data counts.
        // A file removed meanwhile counts for nothing.
        if let Ok(n) = std::fs::File::open(&path).and_then(|f| super::mapped::data_end(&f)) {
            total = total.saturating_add(n);
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_table() {
        for (max, c) in [
            (1, 1),
            (63, 1),
            (64 * 1024, 1024),
            (64 << 20, 1 << 20),
            (256 << 20, 1 << 20),
            (u64::MAX, 1 << 20),
        ] {
            assert_eq!(chunk(max), c, "quota {max}");
        }
    }

    #[test]
    fn sums_the_other_fronts_files_only() {
        let dir = std::env::temp_dir().join(format!("sandpit-others-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let own = dir.join("aa.jsonl");
        for (name, len) in [
            ("aa.jsonl", 100),
            ("bb.jsonl", 30),
            ("cc.jsonl", 12),
            ("x.tmp", 999),
        ] {
            std::fs::write(dir.join(name), vec![b'x'; len]).expect("write");
        }
        assert_eq!(sum_others(&dir, &own).expect("sum"), 42);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! A busy log's records copied into a shared mapping of the file instead of written with
//! `write(2)`: one syscall less per statement. A store into a `MAP_SHARED` file mapping is in
//! the kernel's page cache as soon as it is made, exactly where `write(2)` would have put it,
//! so the record survives a SIGKILL of the gateway all the same (and `fdatasync` on the file
//! flushes it like any other dirty page).
//!
//! The file is grown ahead of the data with `fallocate`, which reserves the blocks: a store
//! into the mapping can then never need space the disk does not have (a store that cannot be
//! backed would be SIGBUS, not an error). While a log is mapped its file therefore ends in
//! zero bytes past the last record; readers stop a line at a zero byte and skip zero runs
//! (`read::Lines`), and the reservation is cut off again when the log goes idle, is closed,
//! or is next opened after a crash ([`data_end`]).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// First reservation; each further one doubles, up to [`CHUNK_MAX`].
const CHUNK_MIN: u64 = 64 << 10;
/// Largest reservation at a time (what a mapped log can hold of zeros at most).
pub(super) const CHUNK_MAX: u64 = 4 << 20;

/// The mapped tail of a log file: bytes `[start, start + len)` of the file, reserved.
pub(super) struct MappedTail {
    ptr: NonNull<u8>,
    /// File offset of the mapping's first byte (page aligned).
    start: u64,
    /// Bytes mapped: the file is `start + len` long.
    len: usize,
    /// Size of the next reservation.
    chunk: u64,
}

// SAFETY: the mapping is owned by this value alone (no aliasing pointer escapes it), and it
// is used only by whoever holds the log writer's lock.
unsafe impl Send for MappedTail {}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Reserves the file's blocks in `[from, to)` (growing the file to `to`).
fn reserve(file: &File, from: u64, to: u64) -> io::Result<()> {
    let (off, len) = (from as libc::off_t, (to - from) as libc::off_t);
    // SAFETY: a plain syscall on a descriptor we own; no memory is passed.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, off, len) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn map(file: &File, start: u64, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping of a file range that exists (reserved just before); the
    // pointer is only used within `len` bytes and unmapped once (Drop or a remap).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            start as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
}

impl MappedTail {
    /// Maps the file from its data end `data_len`, with room for at least `need` bytes. The
    /// file must be exactly `data_len` long. `cap` (the log's quota, 0 = none) bounds how far
    /// ahead space is reserved; `need` is always reserved.
    pub(super) fn start(file: &File, data_len: u64, need: usize, cap: u64) -> io::Result<Self> {
        let page = page_size();
        let start = data_len / page * page;
        let end = Self::target_end(data_len, need, CHUNK_MIN, data_len, cap);
        reserve(file, data_len, end)?;
        match map(file, start, (end - start) as usize) {
            Ok(ptr) => Ok(MappedTail {
                ptr,
                start,
                len: (end - start) as usize,
                chunk: (CHUNK_MIN * 2).min(CHUNK_MAX),
            }),
            Err(e) => {
                let _ = file.set_len(data_len);
                Err(e)
            }
        }
    }

    /// Where a reservation for `need` bytes at `data_len` ends: a chunk past `end`, but not
    /// past the quota unless `need` itself is; page aligned.
    fn target_end(data_len: u64, need: usize, chunk: u64, end: u64, cap: u64) -> u64 {
        let page = page_size();
        let needed = round_up(data_len + need as u64, page);
        let mut want = round_up(end + chunk, page);
        if cap > 0 {
            want = want.min(round_up(cap, page));
        }
        want.max(needed)
    }

    /// The end of the reserved (mapped) part of the file, i.e. the file's length.
    pub(super) fn end(&self) -> u64 {
        self.start + self.len as u64
    }

    /// Copies `bytes` to file offset `data_len`, reserving and mapping more first if they
    /// do not fit. On an error nothing was copied and the mapping is as it was.
    pub(super) fn append(
        &mut self,
        file: &File,
        data_len: u64,
        bytes: &[u8],
        cap: u64,
    ) -> io::Result<()> {
        if data_len + bytes.len() as u64 > self.end() {
            self.grow(file, data_len, bytes.len(), cap)?;
        }
        let at = (data_len - self.start) as usize;
        // SAFETY: `at + bytes.len() <= self.len` (checked above, or grown to fit), the
        // mapping is live and writable, and `bytes` cannot overlap it (it is ours alone).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(at), bytes.len());
        }
        Ok(())
    }

    fn grow(&mut self, file: &File, data_len: u64, need: usize, cap: u64) -> io::Result<()> {
        let old_end = self.end();
        let mut end = Self::target_end(data_len, need, self.chunk, old_end, cap);
        if let Err(e) = reserve(file, old_end, end) {
            // Short of space for a whole chunk: just what this record needs.
            let needed = round_up(data_len + need as u64, page_size());
            if e.raw_os_error() != Some(libc::ENOSPC) || needed >= end {
                return Err(e);
            }
            reserve(file, old_end, needed)?;
            end = needed;
        }
        let page = page_size();
        let start = data_len / page * page;
        let len = (end - start) as usize;
        let ptr = map(file, start, len).inspect_err(|_| {
            let _ = file.set_len(old_end);
        })?;
        self.unmap();
        self.ptr = ptr;
        self.start = start;
        self.len = len;
        self.chunk = (self.chunk * 2).min(CHUNK_MAX);
        Ok(())
    }

    fn unmap(&mut self) {
        // SAFETY: `ptr`/`len` are exactly one live mapping made by `map`; callers replace
        // or forget them right after.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }

    /// Unmaps and cuts the file back to its data (`data_len`), leaving a plain file.
    pub(super) fn release(mut self, file: &File, data_len: u64) -> io::Result<()> {
        self.unmap();
        let r = file.set_len(data_len);
        std::mem::forget(self);
        r
    }
}

impl Drop for MappedTail {
    fn drop(&mut self) {
        self.unmap();
    }
}

/// Where a log file's data ends: after its last non-zero byte (a mapped log that was not
/// released, e.g. the gateway was killed, ends in its reservation's zeros). Reads at most
/// [`CHUNK_MAX`] plus a page from the end.
pub(super) fn data_end(file: &File) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    let mut end = len;
    let floor = len.saturating_sub(CHUNK_MAX + page_size());
    let mut buf = vec![0u8; 64 << 10];
    while end > floor {
        let from = end.saturating_sub(buf.len() as u64).max(floor);
        let part = &mut buf[..(end - from) as usize];
        file.read_exact_at(part, from)?;
        if let Some(i) = part.iter().rposition(|&b| b != 0) {
            return Ok(from + i as u64 + 1);
        }
        end = from;
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(dir.join("log"))
            .unwrap()
    }

    fn contents(f: &File) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let mut v = vec![0u8; f.metadata().unwrap().len() as usize];
        f.read_exact_at(&mut v, 0).unwrap();
        v
    }

    #[test]
    fn records_land_in_the_file_and_release_cuts_the_reservation() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(dir.path());
        std::io::Write::write_all(&mut &f, b"before\n").unwrap();
        let mut t = MappedTail::start(&f, 7, 10, 0).unwrap();
        assert!(t.end() >= CHUNK_MIN && f.metadata().unwrap().len() == t.end());
        t.append(&f, 7, b"one\n", 0).unwrap();
        // Seen through read(2) at once (same page cache), zeros after.
        let c = contents(&f);
        assert_eq!(&c[..11], b"before\none\n");
        assert!(c[11..].iter().all(|&b| b == 0));
        assert_eq!(data_end(&f).unwrap(), 11);
        // Past the first reservation: grown and remapped, earlier bytes kept.
        let big = vec![b'x'; (CHUNK_MIN * 3) as usize];
        t.append(&f, 11, &big, 0).unwrap();
        let len = 11 + big.len() as u64;
        t.append(&f, len, b"\n", 0).unwrap();
        t.release(&f, len + 1).unwrap();
        let c = contents(&f);
        assert_eq!(c.len() as u64, len + 1);
        assert_eq!(&c[..11], b"before\none\n");
        assert!(c[11..c.len() - 1].iter().all(|&b| b == b'x'));
    }

    #[test]
    fn the_quota_bounds_the_reservation_but_not_what_is_needed() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(dir.path());
        let t = MappedTail::start(&f, 0, 100, 8192).unwrap();
        assert_eq!(t.end(), 8192);
        let mut t = t;
        t.append(&f, 0, &vec![b'y'; 9000], 8192).unwrap();
        assert!(t.end() >= 9000 && t.end() <= 9000 + page_size());
    }

    #[test]
    fn data_end_skips_only_trailing_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(dir.path());
        assert_eq!(data_end(&f).unwrap(), 0);
        std::io::Write::write_all(&mut &f, b"a\0b\n").unwrap();
        f.set_len(200_000).unwrap();
        assert_eq!(data_end(&f).unwrap(), 4);
    }
}

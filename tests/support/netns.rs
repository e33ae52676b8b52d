//! Network namespaces for tests that stand in for separate machines: each [`Netns`] is a
//! named namespace with loopback up and one veth pair to this (the test's) namespace, a /30
//! of 198.18.0.0/15 (the range RFC 2544 sets aside for benchmarks, so no real network is
//! shadowed) per namespace. A process started through [`Netns::command`] sees only its own
//! loopback and the link to here; deleting the namespace (on drop) removes the pair.

use std::process::Command;

/// One namespace and the two ends of its link.
pub struct Netns {
    /// `ip netns` name.
    pub name: String,
    /// The address inside the namespace (what a process there listens on).
    pub inside: String,
    /// This namespace's end of the link.
    pub outside: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    /// Namespace number `i` (0..64) of this test process; `Err` says why it could not be made
    /// (not root, no `ip`, no namespace support).
    pub fn create(i: u32) -> Result<Netns, String> {
        assert!(i < 64, "at most 64 namespaces per process");
        let pid = std::process::id();
        let name = format!("sandpit-t{pid}-{i}");
        // Interface names are at most 15 bytes.
        let (a, b) = (
            format!("sp{}o{i}", pid % 100_000),
            format!("sp{}i{i}", pid % 100_000),
        );
        // A /30 per namespace: 198.18.<pid's low byte>.<4i>; the third octet keeps two test
        // processes running at once apart (they would have to share a pid's low byte).
        let base = format!("198.18.{}", pid & 0xff);
        let (outside, inside) = (
            format!("{base}.{}", 4 * i + 1),
            format!("{base}.{}", 4 * i + 2),
        );
        let _ = ip(&["netns", "del", &name]); // a leftover of a crashed run with this pid
        ip(&["netns", "add", &name])?;
        let ns = Netns {
            name,
            inside,
            outside,
        };
        ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])?;
        ip(&["link", "set", &b, "netns", &ns.name])?;
        ip(&["addr", "add", &format!("{}/30", ns.outside), "dev", &a])?;
        ip(&["link", "set", &a, "up"])?;
        let inner = |args: &[&str]| {
            let mut all = vec!["netns", "exec", ns.name.as_str(), "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        inner(&["link", "set", "lo", "up"])?;
        inner(&["addr", "add", &format!("{}/30", ns.inside), "dev", &b])?;
        inner(&["link", "set", &b, "up"])?;
        Ok(ns)
    }

    /// Whether namespaces can be made here: one made and deleted.
    pub fn available() -> Result<(), String> {
        Netns::create(63).map(drop)
    }

    /// `program` run inside the namespace (`ip netns exec` execs it: the child's pid is the
    /// program's own).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

//! Which accelerator the VMs run on. `microvm.accel = "auto"` (the default) uses KVM only
//! when a probe shows it runs a standard guest, and TCG otherwise: a `/dev/kvm` can exist
//! and open, and even run guest code, yet lack the CPU features of QEMU's standard CPU
//! model (a paravirtual KVM inside another sandbox does), and a stock kernel then fails.
//!
//! The probe boots a 64 KiB firmware of our own under KVM with `-cpu qemu64,enforce` (QEMU
//! refuses to start if KVM cannot provide every feature of the model the VMs get) whose
//! reset vector writes one byte to an `isa-debug-exit` port: QEMU exits with
//! `(byte << 1) | 1`, which proves that KVM executed guest instructions.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// The accelerator the VMs are started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation through /dev/kvm.
    Kvm,
    /// QEMU's software emulation (works anywhere).
    Tcg,
}

impl Accel {
    /// QEMU's `-accel` name; also what the golden snapshot's key hashes.
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Byte the probe firmware writes to the exit port.
const PROBE_BYTE: u8 = 0x2a;
/// QEMU's exit status when the probe firmware ran to its write.
pub const PROBE_PASSED: i32 = ((PROBE_BYTE as i32) << 1) | 1;
/// I/O port of the probe's `isa-debug-exit` device.
const PROBE_PORT: u8 = 0xf4;
/// Longest wait for the probe (a working KVM answers in well under a second).
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// Whether the setting needs the probe run before [`decide`]: only `auto` with a /dev/kvm.
pub fn needs_probe(setting: &str, dev_kvm: bool) -> bool {
    setting == "auto" && dev_kvm
}

/// The accelerator for `setting` ("auto", "tcg" or "kvm"; validated by the config) and why.
/// `probe` is the probe's outcome when [`needs_probe`] said to run it (None otherwise).
/// An explicit choice is kept as is: `kvm` on a host that cannot run it fails at the first
/// boot with QEMU's own error, which is what asking for it explicitly means.
pub fn decide(setting: &str, dev_kvm: bool, probe: Option<&Result<(), String>>) -> (Accel, String) {
    match setting {
        "kvm" => (Accel::Kvm, "microvm.accel = \"kvm\"".into()),
        "tcg" => (Accel::Tcg, "microvm.accel = \"tcg\"".into()),
        _ if !dev_kvm => (Accel::Tcg, "auto: no /dev/kvm on this host".into()),
        _ => match probe {
            Some(Ok(())) => (
                Accel::Kvm,
                "auto: /dev/kvm ran a probe guest with the standard CPU model".into(),
            ),
            Some(Err(why)) => (
                Accel::Tcg,
                format!("auto: /dev/kvm exists but cannot run a standard guest ({why})"),
            ),
            None => (Accel::Tcg, "auto: /dev/kvm was not probed".into()),
        },
    }
}

/// What a probe run's end says: `status` is QEMU's exit code (None: killed or timed out),
/// `stderr` its messages.
pub fn verdict(status: Option<i32>, stderr: &str) -> Result<(), String> {
    let last = stderr
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("no message");
    match status {
        Some(PROBE_PASSED) => Ok(()),
        Some(code) => Err(format!("qemu exited with {code}: {last}")),
        None => Err(format!(
            "the probe did not finish within {} s: {last}",
            PROBE_TIMEOUT.as_secs()
        )),
    }
}

/// The probe firmware: `hlt` everywhere, and at the reset vector (16 bytes from the end,
/// mapped at 0xFFFF0 in real mode) `mov al, PROBE_BYTE; out PROBE_PORT, al; hlt; jmp $-1`.
fn firmware() -> Vec<u8> {
    let mut fw = vec![0xf4u8; 64 * 1024];
    let code = [0xb0, PROBE_BYTE, 0xe6, PROBE_PORT, 0xf4, 0xeb, 0xfd];
    let at = fw.len() - 16;
    fw[at..at + code.len()].copy_from_slice(&code);
    fw
}

/// Runs the probe with `qemu`, its firmware written under `dir`.
async fn probe(qemu: &Path, dir: &Path) -> Result<(), String> {
    let fw = dir.join("kvm-probe.bin");
    std::fs::write(&fw, firmware()).map_err(|e| format!("writing {}: {e}", fw.display()))?;
    let child = tokio::process::Command::new(qemu)
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        .args([
            "-accel",
            "kvm",
            "-machine",
            "q35",
            "-cpu",
            "qemu64,enforce",
            "-m",
            "16",
        ])
        .arg("-bios")
        .arg(&fw)
        .args([
            "-device",
            &format!("isa-debug-exit,iobase={PROBE_PORT:#x},iosize=1"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", qemu.display()))?;
    let out = tokio::time::timeout(PROBE_TIMEOUT, child.wait_with_output()).await;
    let _ = std::fs::remove_file(&fw);
    match out {
        Ok(Ok(o)) => verdict(o.status.code(), &String::from_utf8_lossy(&o.stderr)),
        Ok(Err(e)) => Err(format!("waiting for qemu: {e}")),
        Err(_) => verdict(None, ""),
    }
}

/// Resolves `setting` on this host (running the probe when it is `auto` and /dev/kvm
/// exists), with the reason to log.
pub async fn resolve(setting: &str, qemu: &Path, dir: &Path) -> (Accel, String) {
    let dev_kvm = Path::new("/dev/kvm").exists();
    let outcome = if needs_probe(setting, dev_kvm) {
        Some(probe(qemu, dir).await)
    } else {
        None
    };
    decide(setting, dev_kvm, outcome.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_host_and_probe_decide_the_accelerator() {
        let ok: Result<(), String> = Ok(());
        let bad: Result<(), String> = Err("qemu exited with 1: Host doesn't support".into());
        // (setting, /dev/kvm, probe outcome, expected, reason contains)
        type Case<'a> = (
            &'a str,
            bool,
            Option<&'a Result<(), String>>,
            Accel,
            &'a str,
        );
        let table: [Case; 9] = [
            ("tcg", true, None, Accel::Tcg, "\"tcg\""),
            ("tcg", false, None, Accel::Tcg, "\"tcg\""),
            ("kvm", false, None, Accel::Kvm, "\"kvm\""),
            ("kvm", true, None, Accel::Kvm, "\"kvm\""),
            ("auto", false, None, Accel::Tcg, "no /dev/kvm"),
            ("auto", true, Some(&ok), Accel::Kvm, "ran a probe guest"),
            ("auto", true, Some(&bad), Accel::Tcg, "Host doesn't support"),
            ("auto", true, None, Accel::Tcg, "not probed"),
            // A probe result without a /dev/kvm cannot happen; the device decides.
            ("auto", false, Some(&ok), Accel::Tcg, "no /dev/kvm"),
        ];
        for (setting, dev, probe, want, why) in table {
            let (got, reason) = decide(setting, dev, probe);
            assert_eq!(got, want, "{setting} {dev} {probe:?}");
            assert!(reason.contains(why), "{setting} {dev} {probe:?}: {reason}");
        }
    }

    #[test]
    fn only_auto_with_a_device_probes() {
        let table = [
            ("auto", true, true),
            ("auto", false, false),
            ("kvm", true, false),
            ("tcg", true, false),
        ];
        for (setting, dev, want) in table {
            assert_eq!(needs_probe(setting, dev), want, "{setting} {dev}");
        }
    }

    #[test]
    fn only_the_probe_byte_on_the_exit_port_passes() {
        assert_eq!(PROBE_PASSED, 85);
        let table = [
            (Some(85), "", true, ""),
            (
                Some(1),
                "warning: x\nHost doesn't support requested features\n",
                false,
                "Host doesn't support requested features",
            ),
            (Some(0), "", false, "exited with 0: no message"),
            (None, "", false, "did not finish"),
        ];
        for (status, stderr, pass, msg) in table {
            let v = verdict(status, stderr);
            assert_eq!(v.is_ok(), pass, "{status:?} {v:?}");
            if let Err(m) = v {
                assert!(m.contains(msg), "{m}");
            }
        }
    }

    #[test]
    fn the_firmware_writes_the_probe_byte_at_the_reset_vector() {
        let fw = firmware();
        assert_eq!(fw.len(), 65536);
        assert_eq!(&fw[0xfff0..0xfff4], &[0xb0, PROBE_BYTE, 0xe6, PROBE_PORT]);
    }
}

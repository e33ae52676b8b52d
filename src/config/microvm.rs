//! `[microvm]` of the configuration: scratch databases as QEMU virtual machines restored
//! from a memory snapshot of a golden VM.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{de_duration, ConfigError};

/// `[microvm]`: the hypervisor and the shape of each VM.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MicrovmSection {
    /// The hypervisor binary; default `qemu-system-x86_64` on PATH.
    pub qemu: Option<PathBuf>,
    /// "auto" (default: KVM when /dev/kvm runs a probe guest with the standard CPU model,
    /// TCG otherwise), "tcg" (software emulation, works everywhere) or "kvm" (hardware
    /// virtualisation, when /dev/kvm runs a standard guest).
    pub accel: String,
    /// Guest memory per VM, MiB.
    pub memory_mib: u32,
    /// vCPUs per VM.
    pub vcpus: u32,
    /// A ready guest image dir (vmlinuz, initrd.img, root.qcow2); default: built from
    /// Debian packages by scripts/microvm-image.sh, cached in `image_dir`.
    pub image: Option<PathBuf>,
    /// Cache of built images, by recipe hash; default `<data_dir>/microvm/images`.
    pub image_dir: Option<PathBuf>,
    /// Longest wait for the golden VM's boot or a clone's restore.
    #[serde(deserialize_with = "de_duration")]
    pub boot_timeout: Duration,
}

impl Default for MicrovmSection {
    fn default() -> Self {
        MicrovmSection {
            qemu: None,
            accel: "auto".into(),
            memory_mib: 384,
            vcpus: 1,
            image: None,
            image_dir: None,
            boot_timeout: Duration::from_secs(300),
        }
    }
}

impl MicrovmSection {
    /// Values that types alone do not rule out.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !["auto", "tcg", "kvm"].contains(&self.accel.as_str()) {
            return Err(ConfigError::Invalid {
                key: "microvm.accel",
                message: "\"auto\", \"tcg\" or \"kvm\"".into(),
            });
        }
        if !(128..=65536).contains(&self.memory_mib) || !(1..=64).contains(&self.vcpus) {
            return Err(ConfigError::Invalid {
                key: "microvm.memory_mib",
                message: "memory_mib 128..65536 and vcpus 1..64".into(),
            });
        }
        Ok(())
    }
}

//! The guest image: built by scripts/microvm-image.sh (embedded here) from Debian packages,
//! cached under the image dir by the hash of the recipe, rebuilt when the recipe changes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::image_build::{self, BuildChild};
use super::qemu::Image;
use crate::provider::ProviderError;

const SCRIPT: &str = include_str!("../../../scripts/microvm-image.sh");
const GUEST_INIT: &str = include_str!("../../../scripts/microvm-guest/sandpit-init");
const GUEST_MUX: &str = include_str!("../../../scripts/microvm-guest/sandpit-mux");

/// Longest an image build may take (debootstrap downloads ~150 MB of packages).
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(1800);

/// Hash of the recipe: the script and the guest files it installs.
pub fn recipe_hash() -> String {
    let mut h = Sha256::new();
    for part in [SCRIPT, GUEST_INIT, GUEST_MUX] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())[..16].to_string()
}

fn complete(dir: &Path) -> bool {
    ["vmlinuz", "initrd.img", "root.qcow2"]
        .iter()
        .all(|f| dir.join(f).is_file())
}

/// The image to use: `fixed` if configured, else `<images>/image-<recipe hash>`, built
/// first if missing (one build at a time per image dir, by a lock file).
pub async fn ensure(fixed: Option<&Path>, images: &Path) -> Result<Image, ProviderError> {
    if let Some(dir) = fixed {
        if !complete(dir) {
            return Err(ProviderError::Golden(format!(
                "microvm.image {}: needs vmlinuz, initrd.img and root.qcow2",
                dir.display()
            )));
        }
        return Ok(Image {
            dir: dir.to_path_buf(),
        });
    }
    std::fs::create_dir_all(images)?;
    let dir = images.join(format!("image-{}", recipe_hash()));
    if complete(&dir) {
        return Ok(Image { dir });
    }
    let lock_path = images.join(format!("image-{}.lock", recipe_hash()));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)?;
    // Another gateway or test binary may be building the same image: wait for it.
    let lock = tokio::task::spawn_blocking(move || {
        nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| e)
    })
    .await
    .map_err(|source| ProviderError::Task {
        what: "golden snapshot: image lock".into(),
        source,
    })?
    .map_err(|e| ProviderError::golden_io("image lock")(e.into()))?;
    if complete(&dir) {
        return Ok(Image { dir });
    }
    build(&dir).await?;
    drop(lock);
    Ok(Image { dir })
}

/// Removes what interrupted builds of `out` left (their work and recipe dirs; we hold the
/// lock, so none runs). A dir with anything mounted below it (left by a build that did not
/// have a mount namespace of its own) is left alone: removing it would walk into the mount.
fn remove_interrupted(out: &Path) {
    let (Some(dir), Some(name)) = (out.parent(), out.file_name()) else {
        return;
    };
    let name = name.to_string_lossy();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().to_string();
        let Some(rest) = n.strip_prefix(name.as_ref()) else {
            continue;
        };
        if !(rest.starts_with(".work.") || rest.starts_with(".recipe.")) {
            continue;
        }
        let p = e.path();
        let mounted = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .any(|m| Path::new(m).starts_with(&p));
        if mounted {
            tracing::warn!(dir = %p.display(), "an interrupted image build left mounts; not removing it");
        } else if let Err(err) = std::fs::remove_dir_all(&p) {
            tracing::warn!(dir = %p.display(), error = %err, "removing an interrupted image build failed");
        }
    }
}

async fn build(out: &Path) -> Result<(), ProviderError> {
    let pid_file = out.with_extension("build.pid");
    image_build::end_leftover(&pid_file, "microvm-image.sh").await;
    remove_interrupted(out);
    let recipe = out.with_extension(format!("recipe.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&recipe);
    let guest = recipe.join("microvm-guest");
    std::fs::create_dir_all(&guest)?;
    let script = recipe.join("microvm-image.sh");
    std::fs::write(&script, SCRIPT)?;
    std::fs::write(guest.join("sandpit-init"), GUEST_INIT)?;
    std::fs::write(guest.join("sandpit-mux"), GUEST_MUX)?;
    let log_path: PathBuf = out.with_extension("build.log");
    tracing::info!(image = %out.display(), "building the microvm guest image from Debian packages (a few minutes)");
    let t0 = Instant::now();
    // Own mount namespace and process group; dropped (gateway shutdown, timeout), the build
    // ends with every process it started and the mounts it made.
    let mut child = BuildChild::spawn(&script, &[out], &log_path)?;
    if let Err(e) = child.record(&pid_file) {
        tracing::warn!(error = %e, "recording the image build's pid failed");
    }
    tracing::debug!(pid = child.pid(), log = %log_path.display(), "image build started");
    let status = child.wait(BUILD_TIMEOUT).await;
    drop(child);
    let _ = std::fs::remove_file(&pid_file);
    let tail = || {
        let t = std::fs::read_to_string(&log_path).unwrap_or_default();
        crate::provider::golden::tail(&t)
    };
    let _ = std::fs::remove_dir_all(&recipe);
    match status {
        Some(Ok(s)) if s.success() && complete(out) => {
            tracing::info!(seconds = t0.elapsed().as_secs(), image = %out.display(), "microvm guest image built");
            Ok(())
        }
        Some(other) => Err(ProviderError::Golden(format!(
            "image build failed ({other:?}): {}",
            tail()
        ))),
        None => Err(ProviderError::Golden(format!(
            "image build took longer than {BUILD_TIMEOUT:?}: {}",
            tail()
        ))),
    }
}

//! The guest image: built by scripts/microvm-image.sh (embedded here) from Debian packages,
//! cached under the image dir by the hash of the recipe, rebuilt when the recipe changes.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

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
    .map_err(|e| ProviderError::Golden(format!("image lock: {e}")))?
    .map_err(|e| ProviderError::Golden(format!("image lock: {e}")))?;
    if complete(&dir) {
        return Ok(Image { dir });
    }
    build(&dir).await?;
    drop(lock);
    Ok(Image { dir })
}

async fn build(out: &Path) -> Result<(), ProviderError> {
    let recipe = out.with_extension(format!("recipe.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&recipe);
    let guest = recipe.join("microvm-guest");
    std::fs::create_dir_all(&guest)?;
    let script = recipe.join("microvm-image.sh");
    std::fs::write(&script, SCRIPT)?;
    std::fs::write(guest.join("sandpit-init"), GUEST_INIT)?;
    std::fs::write(guest.join("sandpit-mux"), GUEST_MUX)?;
    let log_path: PathBuf = out.with_extension("build.log");
    let log = std::fs::File::create(&log_path)?;
    tracing::info!(image = %out.display(), "building the microvm guest image from Debian packages (a few minutes)");
    let t0 = Instant::now();
    let mut child = tokio::process::Command::new("sh")
        .arg(&script)
        .arg(out)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ProviderError::Golden(format!("running the image script: {e}")))?;
    let status = tokio::time::timeout(BUILD_TIMEOUT, child.wait()).await;
    let tail = || {
        let t = std::fs::read_to_string(&log_path).unwrap_or_default();
        crate::provider::golden::tail(&t)
    };
    let _ = std::fs::remove_dir_all(&recipe);
    match status {
        Ok(Ok(s)) if s.success() && complete(out) => {
            tracing::info!(seconds = t0.elapsed().as_secs(), image = %out.display(), "microvm guest image built");
            Ok(())
        }
        Ok(other) => Err(ProviderError::Golden(format!(
            "image build failed ({other:?}): {}",
            tail()
        ))),
        Err(_) => Err(ProviderError::Golden(format!(
            "image build took longer than {BUILD_TIMEOUT:?}: {}",
            tail()
        ))),
    }
}

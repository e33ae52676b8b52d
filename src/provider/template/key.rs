//! The key task-role passwords are derived from: loaded from (or created in) the key file,
//! and the HMAC that turns a role name into its password.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{tpl, TemplateProvider};
use crate::provider::ProviderError;

type HmacSha256 = Hmac<Sha256>;
pub(super) fn load_key(path: &Path) -> Result<Vec<u8>, ProviderError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read_to_string(path) {
        Ok(s) => return hex::decode(s.trim()).map_err(|e| tpl(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let mut key = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut key);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(hex::encode(key).as_bytes())?;
    f.sync_all()?;
    Ok(key.to_vec())
}
impl TemplateProvider {
    /// The password of a task role: HMAC of its name under the provider key, so it is never
    /// stored anywhere and survives gateway restarts.
    pub(super) fn password(&self, role: &str) -> String {
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.key).expect("HMAC takes any key");
        m.update(role.as_bytes());
        URL_SAFE_NO_PAD.encode(m.finalize().into_bytes())
    }

    /// The verifier a task role is made with: of its derived password, expired from the
    /// start (`VALID UNTIL '-infinity'`; logins get one-login passwords, [`super::gate`]).
    /// PBKDF2 runs off the async workers.
    pub(super) async fn rest_verifier(&self, role: &str) -> Result<String, ProviderError> {
        crate::pgconn::scram::new_verifier(role, &self.password(role), 4096)
            .await
            .map_err(|e| tpl(format!("making a verifier: {e}")))
    }
}

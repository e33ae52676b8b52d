//! Checks of an issue request that need more than a range: the seatbelt's statement kinds
//! and the superuser opt-in, which only some providers can honour.

use super::LifecycleError;
use crate::provider::Provider;

/// Statement kinds a seatbelt policy may name (besides `all`).
const KINDS: [&str; 6] = [
    "read",
    "write",
    "ddl",
    "transaction",
    "privilege",
    "utility",
];

/// The policy to store: None for no policy or one naming `all`.
pub(super) fn allow_kinds(
    allow: Option<Vec<String>>,
) -> Result<Option<Vec<String>>, LifecycleError> {
    match allow {
        None => Ok(None),
        Some(kinds) if kinds.iter().any(|k| k == "all") => Ok(None),
        Some(kinds) => {
            if let Some(bad) = kinds.iter().find(|k| !KINDS.contains(&k.as_str())) {
                return Err(LifecycleError::Invalid(format!(
                    "unknown statement kind {bad:?} in allow (use {} or all; unparsed statements are always denied under a policy)",
                    KINDS.join(", ")
                )));
            }
            Ok(Some(kinds))
        }
    }
}

/// A superuser token only where the backend is a whole throwaway machine: elsewhere a
/// superuser would reach the host's files and programs, or other tokens' databases.
pub(super) fn superuser(wanted: bool, provider: &dyn Provider) -> Result<(), LifecycleError> {
    if wanted && provider.superuser_logins().is_none() {
        return Err(LifecycleError::Invalid(format!(
            "superuser tokens need the microvm provider (a VM per token); this gateway runs the {} provider, where a superuser would reach the host or other tokens' databases",
            provider.name()
        )));
    }
    Ok(())
}

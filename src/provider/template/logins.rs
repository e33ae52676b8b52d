//! The login roles of a scratch database, by name: its task role (the handle itself), the
//! seatbelt's read login `<handle>_r` and write login `<handle>_w`, and which of them a
//! token's policy logs in as. The records, the seatbelt, the access checks and the destroy
//! all key on these names.

use crate::provider::golden::{self, AGENT, AGENT_WRITE};

/// The read login of a scratch database.
pub fn read_role(handle: &str) -> String {
    format!("{handle}_r")
}

/// The write login of a scratch database.
pub fn write_role(handle: &str) -> String {
    format!("{handle}_w")
}

/// Every login role of a scratch database: the task role first.
pub(super) fn roles_of(handle: &str) -> [String; 3] {
    [handle.to_string(), read_role(handle), write_role(handle)]
}

/// The scratch database a login role belongs to (its own name for a task role).
pub(super) fn handle_of(role: &str) -> &str {
    role.strip_suffix("_r")
        .or_else(|| role.strip_suffix("_w"))
        .filter(|h| super::validate_handle(h).is_ok())
        .unwrap_or(role)
}

/// The login of a session whose token allows `allow` (None: no policy): the task role for
/// `ddl` (or no policy), the write login for `write`, else the read login — the same levels
/// as the `instance` provider's roles.
pub(super) fn login_role(handle: &str, allow: Option<&[String]>) -> String {
    match golden::login_role(allow) {
        AGENT => handle.to_string(),
        AGENT_WRITE => write_role(handle),
        _ => read_role(handle),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_the_policy_and_map_back_to_their_handle() {
        let h = "sp_abcdefghijklmnopqrst";
        let allow = |k: &[&str]| -> Vec<String> { k.iter().map(|s| s.to_string()).collect() };
        assert_eq!(login_role(h, None), h);
        assert_eq!(login_role(h, Some(&allow(&["read", "ddl"]))), h);
        assert_eq!(
            login_role(h, Some(&allow(&["read", "write", "transaction"]))),
            format!("{h}_w")
        );
        assert_eq!(
            login_role(h, Some(&allow(&["read", "transaction"]))),
            format!("{h}_r")
        );
        assert_eq!(login_role(h, Some(&[])), format!("{h}_r"));
        for r in roles_of(h) {
            assert_eq!(handle_of(&r), h);
        }
        assert_eq!(
            handle_of("pool-abcdefghijklmnopqrst_w"),
            "pool-abcdefghijklmnopqrst"
        );
        assert_eq!(handle_of("postgres_r"), "postgres_r");
    }
}

//! `[promote]` of the configuration: who may review, where approved changes may go, which
//! validators run against a task's scratch database, and how much change is kept for
//! promotion.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::{check_admin_key, de_duration, ConfigError};

/// `[promote]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PromoteSection {
    /// Keep every changed row when a token ends (a second, full diff next to the review),
    /// so that an approved change can be promoted after the scratch database is gone.
    pub capture: bool,
    /// Most changed rows (all tables, all kinds) a captured change may hold; a larger change
    /// is recorded as too large to promote (bounds the memory of the capture).
    pub max_rows: usize,
    /// Keys with review rights only (read reviews, approve, reject): name = key. The name is
    /// what the audit trail records.
    pub reviewer_keys: BTreeMap<String, String>,
    /// Whether a reviewer key may also promote (to a named target or the default one, never
    /// a DSN).
    pub reviewers_may_promote: bool,
    /// Named promotion targets (the page and reviewer keys can only use these, or the
    /// golden's source when none is named).
    pub targets: BTreeMap<String, PromoteTarget>,
    /// Role (`SET ROLE`) a change is applied as when it goes to its default target, the
    /// source its golden was built from (default the source DSN's login role).
    pub source_role: Option<String>,
    /// statement_timeout and lock_timeout of promotion and validator statements.
    #[serde(deserialize_with = "de_duration")]
    pub statement_timeout: Duration,
    /// Checks run against the scratch database when a token ends; a failing one blocks
    /// approval.
    pub validators: Vec<ValidatorSection>,
}

impl Default for PromoteSection {
    fn default() -> Self {
        PromoteSection {
            capture: true,
            max_rows: 10_000,
            reviewer_keys: BTreeMap::new(),
            reviewers_may_promote: false,
            targets: BTreeMap::new(),
            source_role: None,
            statement_timeout: Duration::from_secs(60),
            validators: Vec::new(),
        }
    }
}

/// A named promotion target.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromoteTarget {
    /// libpq-style DSN of the target database.
    pub dsn: String,
    /// Role the change is applied as (`SET ROLE`); default the DSN's login role.
    #[serde(default)]
    pub role: Option<String>,
}

/// One validator.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidatorSection {
    /// Name shown on the review page.
    pub name: String,
    /// Golden version ids it applies to (empty: every golden).
    #[serde(default)]
    pub goldens: Vec<String>,
    /// A SELECT that must return no rows (names qualified: the search path is
    /// `pg_catalog, pg_temp`).
    #[serde(default)]
    pub sql: Option<String>,
    /// A program and its arguments, run with the scratch database in `PG*` variables and
    /// `SANDPIT_SCRATCH_DSN`; exit status 0 passes.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// How long it may run.
    #[serde(default = "validator_timeout", deserialize_with = "de_duration")]
    pub timeout: Duration,
}

fn validator_timeout() -> Duration {
    Duration::from_secs(60)
}

impl PromoteSection {
    /// Checks types alone do not rule out.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for k in self.reviewer_keys.values() {
            check_admin_key("promote.reviewer_keys", k)?;
        }
        if self.max_rows == 0 {
            return Err(ConfigError::Invalid {
                key: "promote.max_rows",
                message: "must be at least 1".into(),
            });
        }
        for v in &self.validators {
            let given = v.sql.is_some() as u8 + v.command.is_some() as u8;
            if given != 1 || v.command.as_ref().is_some_and(|c| c.is_empty()) {
                return Err(ConfigError::Invalid {
                    key: "promote.validators",
                    message: format!("validator {:?} needs exactly one of sql or command", v.name),
                });
            }
        }
        Ok(())
    }
}

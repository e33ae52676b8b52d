//! What a review reports: the serialisable result of comparing a scratch database with the
//! pristine golden (the JSON format is this, serialised).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A whole review of one token.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Review {
    /// Token id.
    pub token: String,
    /// Task name.
    pub task: String,
    /// RFC 3339 time the diff was taken.
    pub generated_at: String,
    /// Wall time the diff took, in milliseconds.
    pub duration_ms: f64,
    /// Which tables were scanned and why.
    pub scan: ScanInfo,
    /// Schema changes (tables, columns, indexes, constraints, views, functions, triggers,
    /// sequences, extensions, schemas), in patch order.
    pub schema: Vec<SchemaChange>,
    /// Sequences whose position moved.
    pub sequences: Vec<SequenceChange>,
    /// Row changes, one entry per table that has any (or could not be read).
    pub data: Vec<TableDiff>,
    /// Summary of the statement log.
    pub statements: StatementSummary,
    /// Caveats a reader should know (e.g. what the patch does not cover).
    pub notes: Vec<String>,
    /// The SQL patch that, applied to a fresh fork of the golden, reproduces the scratch
    /// state for what this diff covers. Never applied by sandpit.
    pub patch: String,
    /// The patch replayed on a fresh fork of the golden and compared with the scratch
    /// database (None only in reviews stored before the check existed).
    #[serde(default)]
    pub verification: Option<Verification>,
}

impl Review {
    /// Whether the scratch database equals the golden in everything the diff covers.
    pub fn is_empty(&self) -> bool {
        self.schema.is_empty() && self.sequences.is_empty() && self.data.is_empty()
    }
}

/// How the tables to compare were chosen.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ScanInfo {
    /// "touched" (only tables whose counters or storage changed) or "all".
    pub mode: String,
    /// Why "all" was needed, when it was.
    pub reason: Option<String>,
    /// User tables in the scratch database.
    pub tables_total: usize,
    /// Tables whose rows were compared.
    pub tables_scanned: usize,
    /// Rows read from both sides.
    pub rows_read: u64,
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Exists only in the scratch database.
    Added,
    /// Exists only in the golden.
    Dropped,
    /// Exists in both, changed.
    Altered,
    /// Same object (same OID), new name or schema.
    Renamed,
}

impl Action {
    /// Word for text output.
    pub fn word(self) -> &'static str {
        match self {
            Action::Added => "added",
            Action::Dropped => "dropped",
            Action::Altered => "altered",
            Action::Renamed => "renamed",
        }
    }
}

/// One schema change.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SchemaChange {
    /// schema, extension, table, column, index, constraint, view, function, trigger, sequence,
    /// comment, grant; and, listed but never in the patch ([`super::unmodeled`]): policy,
    /// rule, statistics, default privileges, collation, operator, publication, large
    /// objects, table options, row security, replica identity.
    pub kind: String,
    /// What happened.
    pub action: Action,
    /// Qualified, quoted name in the scratch database (the golden's for dropped objects).
    pub object: String,
    /// What changed, for a person.
    pub detail: String,
    /// Definition in the golden, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    /// Definition in the scratch database, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// The patch statements this change contributes, with their place in the patch
    /// ([`super::sql::order`]): promotion runs them for the kinds it takes whole
    /// (renames, altered columns, views, comments, grants).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sql: Vec<(u32, String)>,
}

/// A sequence whose position moved.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SequenceChange {
    /// Qualified, quoted name.
    pub sequence: String,
    /// last_value in the golden (None for a new sequence).
    pub before: Option<SeqState>,
    /// last_value in the scratch database.
    pub after: SeqState,
}

/// Position of a sequence.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SeqState {
    /// `last_value`.
    pub last_value: String,
    /// `is_called`.
    pub is_called: bool,
}

/// Row changes of one table.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TableDiff {
    /// Qualified, quoted name in the scratch database.
    pub table: String,
    /// How rows were matched: "primary key", "unique index <name>", "none (compared as
    /// multisets)", or "new table".
    pub matched_by: String,
    /// Key columns (empty when compared as multisets).
    pub key: Vec<String>,
    /// Columns shown in samples, in order.
    pub columns: Vec<String>,
    /// Rows only in the scratch database.
    pub inserted: u64,
    /// Rows only in the golden.
    pub deleted: u64,
    /// Rows with the same key and different values.
    pub updated: u64,
    /// Updated rows per changed column (a row counts once for each column it changed).
    #[serde(default)]
    pub updated_columns: BTreeMap<String, u64>,
    /// Capped samples.
    pub samples: Samples,
    /// Why the table could not be compared, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Caveat about how it was compared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl TableDiff {
    /// Whether anything changed or went wrong.
    pub fn has_changes(&self) -> bool {
        self.inserted + self.deleted + self.updated > 0 || self.error.is_some()
    }
}

/// Samples of changed rows (values in Postgres text output; None is NULL).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Samples {
    /// Inserted rows (values for `columns`).
    pub inserted: Vec<Vec<Option<String>>>,
    /// Deleted rows (values for `columns`).
    pub deleted: Vec<Vec<Option<String>>>,
    /// Updated rows.
    pub updated: Vec<UpdatedRow>,
    /// For each kind whose samples were cut: "showing N of M".
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub showing: BTreeMap<String, String>,
}

impl TableDiff {
    /// Records "showing N of M" for every kind whose samples are fewer than its count.
    pub fn mark_cut_samples(&mut self) {
        let s = &mut self.samples;
        s.showing.clear();
        for (kind, shown, total) in [
            ("inserted", s.inserted.len(), self.inserted),
            ("deleted", s.deleted.len(), self.deleted),
            ("updated", s.updated.len(), self.updated),
        ] {
            if (shown as u64) < total {
                s.showing
                    .insert(kind.into(), format!("showing {shown} of {total}"));
            }
        }
    }
}

/// One updated row.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct UpdatedRow {
    /// Values before (for `columns`).
    pub before: Vec<Option<String>>,
    /// Values after (for `columns`).
    pub after: Vec<Option<String>>,
    /// Names of the columns that changed.
    pub changed: Vec<String>,
}

/// Summary of a token's statement log.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StatementSummary {
    /// Statements logged.
    pub total: u64,
    /// Count per kind (read, write, ddl, …).
    pub by_kind: BTreeMap<String, u64>,
    /// Statements that failed (SQLSTATE set).
    pub failed: Vec<FailedStatement>,
    /// Statements without an outcome (session died mid-statement).
    pub unfinished: u64,
}

/// A statement that failed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FailedStatement {
    /// Its sequence number in the log.
    pub seq: u64,
    /// Its kind.
    pub kind: String,
    /// Its text, capped.
    pub text: String,
    /// SQLSTATE.
    pub sqlstate: String,
}

/// Outcome of the patch check ([`super::verify`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum VerifyStatus {
    /// The patched fork equals the scratch database in everything compared.
    Exact,
    /// It does not, or the patch did not apply.
    Differs,
    /// The check was not made (not asked for, or it could not be).
    NotVerified,
}

/// What the check found, as kept in the review.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Verification {
    /// Exact, differs or not verified.
    pub status: VerifyStatus,
    /// One line for a person: `patch verified: exact`, `patch verified: differs at …`,
    /// `patch not verified: <reason>`.
    pub summary: String,
    /// Why it was not verified, or the error that stopped the patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What differs, one line per object (at most 200; see `differences_total`).
    #[serde(default)]
    pub differences: Vec<String>,
    /// How many differences there are.
    #[serde(default)]
    pub differences_total: usize,
    /// Schema objects, tables and sequences compared (in the scratch database).
    #[serde(default)]
    pub compared: Compared,
    /// Wall time of the check (fork, apply, compare, destroy), in milliseconds.
    #[serde(default)]
    pub duration_ms: f64,
}

/// Sizes of what was compared.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Compared {
    /// Schema objects (relations, columns, constraints, indexes, functions, …).
    pub objects: usize,
    /// Tables compared: hashed, or shown unchanged since the golden on both sides.
    pub tables: usize,
    /// Of those, the tables shown unchanged on both sides and so not read
    /// ([`super::touched`]).
    #[serde(default)]
    pub tables_unchanged: usize,
    /// Sequences whose positions were read.
    pub sequences: usize,
}

impl Verification {
    /// A check that was not made, and why.
    pub fn not_verified(reason: impl Into<String>) -> Verification {
        let reason = reason.into();
        Verification {
            status: VerifyStatus::NotVerified,
            summary: format!("patch not verified: {reason}"),
            reason: Some(reason),
            differences: Vec::new(),
            differences_total: 0,
            compared: Compared::default(),
            duration_ms: 0.0,
        }
    }
}

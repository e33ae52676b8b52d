//! The plan's data: what a promotion checks and runs (guards, DDL, row changes), apart from
//! how [`super::plan::build`] works it out, so the kinds and multiset helpers can fill it
//! without importing the builder.

use serde::Serialize;

use crate::review::model::SeqState;

/// Cells of a row (Postgres text output; None is NULL).
pub type Row = Vec<Option<String>>;

/// The state a schema object must have in the target before anything is applied.
#[derive(Debug, Clone, PartialEq)]
pub enum Want {
    /// The golden had no such object.
    Absent,
    /// The golden's definition, as the review's catalog deparses it.
    Def(String),
    /// Present, whatever its definition (renamed objects, whose golden definition the
    /// review does not keep: their rows are guarded one by one).
    Exists,
}

/// A guard on one schema object.
#[derive(Debug, Clone)]
pub struct SchemaGuard {
    /// table, column, index, constraint.
    pub kind: String,
    /// Qualified, quoted name.
    pub object: String,
    /// What the target must hold.
    pub want: Want,
}

/// Row changes of one table, with what guards them.
#[derive(Debug, Clone)]
pub struct TableChange {
    /// Qualified, quoted table name.
    pub table: String,
    /// Created by the task: no row of it can exist in the target.
    pub new_table: bool,
    /// Dropped by the task: its rows are guarded (and counted), then go with the table.
    pub dropped: bool,
    /// No key: rows matched as a multiset, the whole table guarded by
    /// [`Plan::multiset_guards`], each deleted row deleted once by its values.
    pub multiset: bool,
    /// Columns of the rows, quoted.
    pub columns: Vec<String>,
    /// Positions (in `columns`) of the key.
    pub key: Vec<usize>,
    /// Positions compared with the golden's values before an update or delete (columns
    /// the golden had, masked ones left out).
    pub guard: Vec<usize>,
    /// Indexes into `guard` compared again by the delete and update themselves (not the
    /// columns whose type the change alters: their text may change with the type).
    pub recheck: Vec<usize>,
    /// Rows to delete (golden values).
    pub deletes: Vec<Row>,
    /// Rows to update: golden values, new values, positions that changed.
    pub updates: Vec<(Row, Row, Vec<usize>)>,
    /// Rows to insert.
    pub inserts: Vec<Row>,
}

/// Everything a promotion does, in order, and why it may not.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Reasons the change cannot be promoted at all.
    pub refusals: Vec<String>,
    /// Schema objects to check first.
    pub schema_guards: Vec<SchemaGuard>,
    /// Schema objects to check before the renames (under their golden names).
    pub rename_guards: Vec<SchemaGuard>,
    /// Renames (the review's patch statements, in its order): run right after the
    /// rename guards, before every other guard.
    pub renames: Vec<String>,
    /// Columns the change drops, with a hash of their values in the golden
    /// ([`super::plan::column_hash_sql`]): a concurrent edit to one is a conflict.
    pub column_guards: Vec<(String, String, String)>,
    /// Tables without a key whose rows the change deletes: (table, the query giving a hash
    /// of their rows ([`super::multiset::hash_sql`]), its value in the golden). Any change to
    /// such a table in the target since the golden is a conflict.
    pub multiset_guards: Vec<(String, String, String)>,
    /// Sequences whose position must still be the golden's.
    pub sequence_guards: Vec<(String, SeqState)>,
    /// DDL before the row changes, in order.
    pub before_data: Vec<String>,
    /// Sequences to create (name, parameters), unless a created table made them already.
    pub create_sequences: Vec<(String, String)>,
    /// DDL of tables that create their own sequences (identity columns), run before
    /// `create_sequences`.
    pub identity_tables: Vec<String>,
    /// Row changes per table.
    pub tables: Vec<TableChange>,
    /// DDL after the row changes (NOT NULL, constraints, indexes), in order.
    pub after_data: Vec<String>,
    /// Sequence positions to set.
    pub setvals: Vec<(String, SeqState)>,
}

/// How much a plan changes.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Counts {
    /// Schema changes.
    pub schema: usize,
    /// Rows inserted.
    pub inserted: usize,
    /// Rows updated.
    pub updated: usize,
    /// Rows deleted.
    pub deleted: usize,
    /// Sequence positions set.
    pub sequences: usize,
}

impl Plan {
    /// What the plan changes.
    pub fn counts(&self) -> Counts {
        Counts {
            schema: self.before_data.len()
                + self.renames.len()
                + self.after_data.len()
                + self.create_sequences.len()
                + self.identity_tables.len(),
            inserted: self.tables.iter().map(|t| t.inserts.len()).sum(),
            updated: self.tables.iter().map(|t| t.updates.len()).sum(),
            deleted: self.tables.iter().map(|t| t.deletes.len()).sum(),
            sequences: self.setvals.len(),
        }
    }
}

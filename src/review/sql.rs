//! SQL text the review writes, shared by the schema diff, the row diff and promotion: a
//! qualified name, a table named by OID, and the order numbers that place each patch
//! statement.

use super::catalog::{Catalog, Table};

/// Patch statements with their place in the patch (see [`order`]).
pub type Stmts = Vec<(u32, String)>;

/// Order numbers: below [`order::DATA`] runs before the row changes, above it after.
pub mod order {
    /// CREATE SCHEMA.
    pub const CREATE_SCHEMA: u32 = 1;
    /// ALTER SCHEMA … RENAME.
    pub const RENAME_SCHEMA: u32 = 2;
    /// CREATE / ALTER EXTENSION.
    pub const EXTENSION: u32 = 3;
    /// CREATE TYPE / DOMAIN, ALTER TYPE … RENAME.
    pub const TYPE: u32 = 4;
    /// ALTER FUNCTION … RENAME.
    pub const RENAME_FUNCTION: u32 = 5;
    /// CREATE OR REPLACE FUNCTION.
    pub const FUNCTION: u32 = 6;
    /// ALTER SEQUENCE … RENAME / SET SCHEMA (before a new one takes its old name, and
    /// before any default names it).
    pub const RENAME_SEQUENCE: u32 = 7;
    /// CREATE SEQUENCE.
    pub const CREATE_SEQUENCE: u32 = 8;
    /// DROP VIEW.
    pub const DROP_VIEW: u32 = 10;
    /// DROP TRIGGER.
    pub const DROP_TRIGGER: u32 = 11;
    /// DROP foreign keys.
    pub const DROP_FK: u32 = 13;
    /// DROP other constraints.
    pub const DROP_CONSTRAINT: u32 = 14;
    /// DROP INDEX.
    pub const DROP_INDEX: u32 = 15;
    /// Table rename / set schema.
    pub const RENAME_TABLE: u32 = 20;
    /// Column rename.
    pub const RENAME_COLUMN: u32 = 21;
    /// DROP COLUMN.
    pub const DROP_COLUMN: u32 = 22;
    /// DROP TABLE.
    pub const DROP_TABLE: u32 = 23;
    /// CREATE TABLE.
    pub const CREATE_TABLE: u32 = 24;
    /// ADD COLUMN.
    pub const ADD_COLUMN: u32 = 25;
    /// ALTER COLUMN type / default / DROP NOT NULL.
    pub const ALTER_COLUMN: u32 = 26;
    /// Constraint, index, sequence renames.
    pub const RENAME_OTHER: u32 = 27;
    /// ALTER SEQUENCE parameters.
    pub const ALTER_SEQUENCE: u32 = 30;
    /// DROP SEQUENCE.
    pub const DROP_SEQUENCE: u32 = 87;
    /// DROP FUNCTION.
    pub const DROP_FUNCTION: u32 = 88;
    /// DROP TYPE / DOMAIN.
    pub const DROP_TYPE: u32 = 89;
    /// DROP EXTENSION.
    pub const DROP_EXTENSION: u32 = 90;
    /// DROP SCHEMA.
    pub const DROP_SCHEMA: u32 = 91;
    /// Row changes go here.
    pub const DATA: u32 = 99;
    /// SET NOT NULL; for added columns then their DEFAULT and identity (after their data).
    pub const SET_NOT_NULL: u32 = 100;
    /// ADD CONSTRAINT (not FK).
    pub const ADD_CONSTRAINT: u32 = 101;
    /// ADD CONSTRAINT … FOREIGN KEY.
    pub const ADD_FK: u32 = 102;
    /// CREATE INDEX.
    pub const CREATE_INDEX: u32 = 103;
    /// CREATE VIEW.
    pub const CREATE_VIEW: u32 = 104;
    /// CREATE TRIGGER.
    pub const CREATE_TRIGGER: u32 = 105;
    /// ALTER SEQUENCE … OWNED BY.
    pub const OWNED_BY: u32 = 106;
    /// setval.
    pub const SETVAL: u32 = 107;
    /// COMMENT ON.
    pub const COMMENT: u32 = 108;
    /// GRANT / REVOKE.
    pub const GRANT: u32 = 109;
}

/// `schema.name` (both already quoted).
pub(super) fn q(schema: &str, name: &str) -> String {
    format!("{schema}.{name}")
}

/// A table's `schema.name` by OID (a placeholder naming the OID when the catalog lacks it).
pub(super) fn table_name(cat: &Catalog, oid: u32) -> String {
    cat.tables
        .get(&oid)
        .map(Table::qname)
        .unwrap_or_else(|| format!("<table {oid}>"))
}

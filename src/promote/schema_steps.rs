//! The schema half of a promotion plan: each reviewed schema change placed as the guard the
//! target must pass and the DDL to run before or after the row changes (or refused). Tables,
//! columns, indexes, constraints and sequences are placed here; the other kinds by
//! [`super::kinds`].

use std::collections::{BTreeMap, BTreeSet};

use super::kinds;
use super::names;
use super::plan_model::{Plan, SchemaGuard, Want};
use crate::review::model::{Action, Review, SchemaChange};
use crate::review::sql::order;

/// Masked columns of the golden, as plain `schema.table.column`.
pub type Masked = BTreeSet<String>;

/// The masked columns of `table`, by plain column name.
pub fn masked_in(masked: &Masked, table: &str) -> BTreeSet<String> {
    let t = names::plain(table);
    masked
        .iter()
        .filter_map(|m| {
            let (tab, col) = m.rsplit_once('.')?;
            (tab == t).then(|| col.to_string())
        })
        .collect()
}

/// Whether `owner` (`OWNED BY schema.table.column`) goes with a table or column the
/// review drops (or is an identity column's, dropped with it).
fn owned_by_dropped(owner: &str, review: &Review) -> bool {
    let Some(col) = owner.strip_prefix("OWNED BY ") else {
        return false;
    };
    if col == "an identity column" {
        return true;
    }
    let table = names::parent_and_last(col).map(|(t, _)| t);
    review.schema.iter().any(|c| {
        c.action == Action::Dropped
            && ((c.kind == "column" && c.object == col)
                || (c.kind == "table" && Some(&c.object) == table.as_ref()))
    })
}

/// The schema statements gathered so far, each with its rank (`review::sql::order`).
#[derive(Default)]
pub struct SchemaSteps {
    /// Run before the row changes.
    pub before: Vec<(u32, String)>,
    /// Run after the row changes.
    pub after: Vec<(u32, String)>,
    /// Renames, run last.
    pub renames: Vec<(u32, String)>,
    /// Columns the task added, per plain table name (their values have no golden to
    /// guard against).
    pub added_cols: BTreeMap<String, BTreeSet<String>>,
}

/// Why a change is refused, as the plan's refusal line.
fn refuse(plan: &mut Plan, c: &SchemaChange, why: &str) {
    plan.refusals.push(format!(
        "{} {} {}: {why}",
        c.kind,
        c.object,
        c.action.word()
    ));
}

/// The target must show `c`'s object as `want` before anything runs.
fn guard(plan: &mut Plan, c: &SchemaChange, want: Want) {
    plan.schema_guards.push(SchemaGuard {
        kind: c.kind.clone(),
        object: c.object.clone(),
        want,
    });
}

const NO_DEF: &str = "no definition in the review";
const NO_GOLDEN_DEF: &str = "no golden definition in the review";

impl SchemaSteps {
    /// Place one reviewed schema change into `plan` and these steps.
    pub fn place(&mut self, plan: &mut Plan, c: &SchemaChange, review: &Review, masked: &Masked) {
        match (c.kind.as_str(), c.action) {
            ("table", Action::Added) => self.table_added(plan, c),
            ("table", Action::Dropped) => self.table_dropped(plan, c, masked),
            ("column", Action::Added) => self.column_added(plan, c),
            ("column", Action::Dropped) => self.column_dropped(plan, c, masked),
            ("index", Action::Added) => match c.after.clone() {
                None => refuse(plan, c, NO_DEF),
                Some(def) => {
                    guard(plan, c, Want::Absent);
                    self.after.push((order::CREATE_INDEX, format!("{def};")));
                }
            },
            ("index", Action::Dropped) => match c.before.clone() {
                None => refuse(plan, c, NO_GOLDEN_DEF),
                Some(def) => {
                    guard(plan, c, Want::Def(def));
                    let drop = format!("DROP INDEX {};", c.object);
                    self.before.push((order::DROP_INDEX, drop));
                }
            },
            ("constraint", Action::Added) => self.constraint_added(plan, c),
            ("constraint", Action::Dropped) => self.constraint_dropped(plan, c),
            ("sequence", Action::Added) => self.sequence_added(plan, c),
            ("sequence", Action::Dropped) => match c.before.as_deref() {
                None => {
                    let drop = format!("DROP SEQUENCE {};", c.object);
                    self.before.push((order::DROP_SEQUENCE, drop));
                }
                Some(owner) if owned_by_dropped(owner, review) => {}
                Some(owner) => refuse(
                    plan,
                    c,
                    &format!("it was {owner}, which the change keeps: not promoted"),
                ),
            },
            _ => self.other_kind(plan, c),
        }
    }

    fn table_added(&mut self, plan: &mut Plan, c: &SchemaChange) {
        let Some(sql) = c.after.clone() else {
            return refuse(plan, c, NO_DEF);
        };
        guard(plan, c, Want::Absent);
        if sql.contains(" AS IDENTITY") {
            plan.identity_tables.push(sql);
        } else {
            self.before.push((order::CREATE_TABLE, sql));
        }
    }

    fn table_dropped(&mut self, plan: &mut Plan, c: &SchemaChange, masked: &Masked) {
        if !masked_in(masked, &c.object).is_empty() {
            return refuse(
                plan,
                c,
                "the table has masked columns: its real values were never reviewed",
            );
        }
        let Some(def) = c.before.clone() else {
            return refuse(plan, c, NO_GOLDEN_DEF);
        };
        guard(plan, c, Want::Def(def));
        let drop = format!("DROP TABLE {};", c.object);
        self.before.push((order::DROP_TABLE, drop));
    }

    fn column_added(&mut self, plan: &mut Plan, c: &SchemaChange) {
        let (Some((table, col)), Some(def)) = (names::parent_and_last(&c.object), c.after.clone())
        else {
            return refuse(plan, c, NO_DEF);
        };
        guard(plan, c, Want::Absent);
        self.added_cols
            .entry(names::plain(&table))
            .or_default()
            .insert(col.plain.clone());
        // NOT NULL only once the rows are in: the golden's rows have no value for it yet.
        match def.strip_suffix(" NOT NULL") {
            Some(nullable) => {
                let add = format!("ALTER TABLE {table} ADD COLUMN {nullable};");
                self.before.push((order::ADD_COLUMN, add));
                let not_null = format!(
                    "ALTER TABLE {table} ALTER COLUMN {} SET NOT NULL;",
                    col.quoted
                );
                self.after.push((order::SET_NOT_NULL, not_null));
            }
            None => {
                let add = format!("ALTER TABLE {table} ADD COLUMN {def};");
                self.before.push((order::ADD_COLUMN, add));
            }
        }
    }

    fn column_dropped(&mut self, plan: &mut Plan, c: &SchemaChange, masked: &Masked) {
        let (Some((table, col)), Some(def)) = (names::parent_and_last(&c.object), c.before.clone())
        else {
            return refuse(plan, c, NO_GOLDEN_DEF);
        };
        if masked.contains(&names::plain(&c.object)) {
            return refuse(
                plan,
                c,
                "the column is masked: its real values were never reviewed",
            );
        }
        guard(plan, c, Want::Def(def));
        let drop = format!("ALTER TABLE {table} DROP COLUMN {};", col.quoted);
        self.before.push((order::DROP_COLUMN, drop));
    }

    fn constraint_added(&mut self, plan: &mut Plan, c: &SchemaChange) {
        let (Some((table, name)), Some(def)) = (names::parent_and_last(&c.object), c.after.clone())
        else {
            return refuse(plan, c, NO_DEF);
        };
        guard(plan, c, Want::Absent);
        let rank = if def.starts_with("FOREIGN KEY") {
            order::ADD_FK
        } else {
            order::ADD_CONSTRAINT
        };
        let add = format!("ALTER TABLE {table} ADD CONSTRAINT {} {def};", name.quoted);
        self.after.push((rank, add));
    }

    fn constraint_dropped(&mut self, plan: &mut Plan, c: &SchemaChange) {
        let (Some((table, name)), Some(def)) =
            (names::parent_and_last(&c.object), c.before.clone())
        else {
            return refuse(plan, c, NO_GOLDEN_DEF);
        };
        let rank = if def.starts_with("FOREIGN KEY") {
            order::DROP_FK
        } else {
            order::DROP_CONSTRAINT
        };
        guard(plan, c, Want::Def(def));
        let drop = format!("ALTER TABLE {table} DROP CONSTRAINT {};", name.quoted);
        self.before.push((rank, drop));
    }

    fn sequence_added(&mut self, plan: &mut Plan, c: &SchemaChange) {
        match &c.after {
            // Before the tables whose defaults call it; OWNED BY once they exist.
            Some(made) => {
                guard(plan, c, Want::Absent);
                for (i, stmt) in made.lines().enumerate() {
                    if i == 0 {
                        self.before.push((order::CREATE_SEQUENCE, stmt.to_string()));
                    } else {
                        self.after.push((order::OWNED_BY, stmt.to_string()));
                    }
                }
            }
            // An identity column's own (or a review from before `after` was kept).
            None => plan
                .create_sequences
                .push((c.object.clone(), c.detail.clone())),
        }
    }

    /// Kinds placed by [`kinds::place`] (views, functions, renames, …).
    fn other_kind(&mut self, plan: &mut Plan, c: &SchemaChange) {
        match kinds::place(c) {
            kinds::Placed::Refused(why) => refuse(plan, c, &why),
            kinds::Placed::Renames => {
                kinds::guards(c, plan);
                self.renames.extend(c.sql.iter().cloned());
            }
            kinds::Placed::Stmts(stmts) => {
                kinds::guards(c, plan);
                for (o, s) in stmts {
                    if kinds::after_data(o) {
                        self.after.push((o, s));
                    } else {
                        self.before.push((o, s));
                    }
                }
            }
        }
    }

    /// Into the plan, each list in rank order; stable sorts keep the review's patch order
    /// within one rank.
    pub fn finish(self, plan: &mut Plan) {
        let ordered = |mut v: Vec<(u32, String)>| {
            v.sort_by_key(|(r, _)| *r);
            v.into_iter().map(|(_, s)| s).collect::<Vec<_>>()
        };
        plan.before_data = ordered(self.before);
        plan.after_data = ordered(self.after);
        plan.renames = ordered(self.renames);
    }
}

//! Applying a [`Plan`] to a target database in one transaction, as the operator's role.
//! First every guard is checked (rows locked `FOR UPDATE`, schema objects compared with
//! their golden definitions, sequence positions); if any fails, nothing is applied and each
//! conflict is listed. Then the DDL and the row changes run, each row change guarded again
//! by the golden's values and required to touch exactly the rows it names. A dry run does
//! all of it and rolls back.

use std::collections::BTreeMap;
use std::time::Duration;

use super::guards::{self, Mismatch};
use super::names;
use super::plan::{Plan, TableChange};
use super::rebase;
use super::target_catalog::{describe_key, row_order, schema_conflicts, tables_by_name, value};
use crate::pgconn::BackendTarget;
use crate::review::catalog::{self, Catalog, Table};
use crate::review::conn::{literal, ConnError, Side, Timeouts};
use crate::review::diff::data_order::Step;

/// Rows per INSERT statement.
const INSERT_BATCH: usize = 100;
/// Conflicts listed (the count is exact).
const CONFLICTS_MAX: usize = 1000;

/// How an attempt ended (a failure to reach or talk to the target is an `Err`).
#[derive(Debug)]
pub enum Applied {
    /// Everything applied (or, in a dry run, would have been; then rolled back).
    Done,
    /// The target moved since the golden: nothing applied.
    Conflicts(Vec<String>, usize),
}

struct Run<'a> {
    side: &'a Side,
    conflicts: Vec<String>,
    total: usize,
    /// Rows of each table change, loaded in the target (by table).
    loaded: BTreeMap<String, guards::Loaded>,
}

impl Run<'_> {
    fn conflict(&mut self, c: String) {
        self.total += 1;
        if self.conflicts.len() < CONFLICTS_MAX {
            self.conflicts.push(c);
        }
    }

    /// Every sequence the change moves must be at its golden position.
    async fn check_sequences(&mut self, plan: &Plan, cat: &Catalog) -> Result<(), ConnError> {
        for (seq, want) in &plan.sequence_guards {
            if !cat.sequences.values().any(|s| s.qname() == *seq) {
                self.conflict(format!("sequence {seq}: missing from the target"));
                continue;
            }
            let r = self
                .side
                .rows(&format!("SELECT last_value::text, is_called FROM {seq}"))
                .await?;
            let now = r
                .first()
                .map(|r| (r[0].clone(), r[1].as_deref() == Some("t")));
            if now != Some((Some(want.last_value.clone()), want.is_called)) {
                self.conflict(format!(
                    "sequence {seq}: moved in the target since the golden (golden last_value {}, target {})",
                    want.last_value,
                    now.and_then(|n| n.0).unwrap_or_default()
                ));
            }
        }
        Ok(())
    }

    /// Every column the change drops must hold its golden values.
    async fn check_columns(&mut self, plan: &Plan) -> Result<(), ConnError> {
        for (table, col, golden) in &plan.column_guards {
            // A column already gone is the schema guard's conflict; this one must not abort.
            self.side.exec("SAVEPOINT sandpit_column").await?;
            let now = match self
                .side
                .rows(&super::plan::column_hash_sql(table, col))
                .await
            {
                Ok(r) => r.first().and_then(|r| r[0].clone()),
                Err(_) => {
                    self.side
                        .exec("ROLLBACK TO SAVEPOINT sandpit_column")
                        .await?;
                    continue;
                }
            };
            self.side.exec("RELEASE SAVEPOINT sandpit_column").await?;
            if now.as_deref() != Some(golden.as_str()) {
                self.conflict(format!(
                    "column {table}.{col}: its values changed in the target since the golden (the task drops it)"
                ));
            }
        }
        Ok(())
    }

    /// Every keyless table whose rows the change deletes must hold the golden's rows.
    async fn check_multisets(&mut self, plan: &Plan) -> Result<(), ConnError> {
        for (table, sql, golden) in &plan.multiset_guards {
            self.side.exec("SAVEPOINT sandpit_multiset").await?;
            let now = match self.side.rows(sql).await {
                Ok(r) => r.first().and_then(|r| r[0].clone()),
                Err(_) => {
                    self.side
                        .exec("ROLLBACK TO SAVEPOINT sandpit_multiset")
                        .await?;
                    None
                }
            };
            self.side.exec("RELEASE SAVEPOINT sandpit_multiset").await?;
            if now.as_deref() != Some(golden.as_str()) {
                self.conflict(format!(
                    "table {table} (no key, compared as a multiset): its rows changed in the target since the golden"
                ));
            }
        }
        Ok(())
    }

    /// Deletes of a keyless table: each deleted row once, found by its values (the whole
    /// table was guarded, so as many equal rows are there as in the golden).
    async fn multiset_deletes(&mut self, tc: &TableChange) -> Result<(), ConnError> {
        for row in &tc.deletes {
            let eq: Vec<String> = tc
                .guard
                .iter()
                .map(|&i| {
                    let v = row[i]
                        .as_ref()
                        .map(|s| literal(s))
                        .unwrap_or_else(|| "NULL".into());
                    format!(
                        "pg_catalog.format('%L', {}) OPERATOR(pg_catalog.=) pg_catalog.format('%L', {v}::pg_catalog.text)",
                        tc.columns[i]
                    )
                })
                .collect();
            let sql = format!(
                "DELETE FROM ONLY {tab} WHERE ctid = (SELECT ctid FROM ONLY {tab} WHERE {} LIMIT 1) RETURNING 1",
                eq.join(" AND "),
                tab = tc.table
            );
            self.exact(&sql, 1, || format!("a delete from {}", tc.table))
                .await?;
        }
        Ok(())
    }

    /// Guards of the rows of `tc` (before anything is applied): loaded into a temporary
    /// table, locked and compared in one go ([`guards`]).
    async fn check_rows(&mut self, tc: &TableChange, cat: &Catalog) -> Result<(), ConnError> {
        let tables = tables_by_name(cat);
        let Some((_, t)) = tables.get(&tc.table) else {
            self.conflict(format!("table {}: missing from the target", tc.table));
            return Ok(());
        };
        if tc.multiset {
            return Ok(());
        }
        let l = guards::load(self.side, tc, self.loaded.len()).await?;
        for m in guards::check(self.side, tc, t, &l).await? {
            self.conflict(match m {
                Mismatch::Gone(row, what) => format!(
                    "{}: gone from the target (the task {what} it)",
                    describe_key(tc, row)
                ),
                Mismatch::Changed(row, what, differ) => format!(
                    "{}: changed in the target since the golden ({}), the task {what} it",
                    describe_key(tc, row),
                    differ.join(", ")
                ),
                Mismatch::Present(row) => format!(
                    "{}: already in the target, the task inserted it",
                    describe_key(tc, row)
                ),
            });
        }
        self.loaded.insert(tc.table.clone(), l);
        if tc.dropped {
            // Every row it holds goes with it: none may have been added since the golden.
            let q = format!("SELECT count(*)::text FROM ONLY {}", tc.table);
            let n = self.side.rows(&q).await?;
            let n = n.first().and_then(|r| r[0].clone()).unwrap_or_default();
            if n != tc.deletes.len().to_string() {
                self.conflict(format!(
                    "table {}: holds {n} rows in the target, the golden {} (the task drops it)",
                    tc.table,
                    tc.deletes.len()
                ));
            }
        }
        Ok(())
    }

    fn touched(&mut self, tc: &TableChange, what: &str, got: usize, want: usize) {
        if got != want {
            self.conflict(format!(
                "{} {what}: touched {got} rows in the target, {want} expected",
                tc.table
            ));
        }
    }

    /// Runs `sql` (ending in RETURNING 1) and checks it touched `want` rows.
    async fn exact(
        &mut self,
        sql: &str,
        want: usize,
        what: impl FnOnce() -> String,
    ) -> Result<(), ConnError> {
        let got = self.side.rows(sql).await?.len();
        if got != want {
            self.conflict(format!(
                "{}: touched {got} rows in the target, {want} expected",
                what()
            ));
        }
        Ok(())
    }

    async fn deletes(&mut self, tc: &TableChange, t: &Table) -> Result<(), ConnError> {
        let Some(l) = self.loaded.get(&tc.table) else {
            return Ok(());
        };
        let got = guards::delete(self.side, tc, t, l).await?;
        self.touched(tc, "deletes", got, tc.deletes.len());
        Ok(())
    }

    async fn updates(&mut self, tc: &TableChange, t: &Table) -> Result<(), ConnError> {
        let Some(l) = self.loaded.get(&tc.table) else {
            return Ok(());
        };
        for (got, want) in guards::update(self.side, tc, t, l).await? {
            self.touched(tc, "updates", got, want);
        }
        Ok(())
    }

    async fn inserts(&mut self, tc: &TableChange, t: Option<&Table>) -> Result<(), ConnError> {
        let col = |i: usize| t.and_then(|t| t.columns.iter().find(|c| c.name == tc.columns[i]));
        let cols: Vec<usize> = (0..tc.columns.len())
            .filter(|&i| col(i).is_none_or(|c| c.generated != "s"))
            .collect();
        let overriding = if cols
            .iter()
            .any(|&i| col(i).is_some_and(|c| c.identity == "a"))
        {
            " OVERRIDING SYSTEM VALUE"
        } else {
            ""
        };
        let head = format!(
            "INSERT INTO {} ({}){overriding} VALUES ",
            tc.table,
            cols.iter()
                .map(|&i| tc.columns[i].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        for chunk in tc.inserts.chunks(INSERT_BATCH) {
            let rows: Vec<String> = chunk
                .iter()
                .map(|r| {
                    let v: Vec<String> = cols
                        .iter()
                        .map(|&i| value(t, &tc.columns[i], &r[i]))
                        .collect();
                    format!("({})", v.join(", "))
                })
                .collect();
            let sql = format!("{head}{} RETURNING 1", rows.join(", "));
            self.exact(&sql, chunk.len(), || format!("inserts into {}", tc.table))
                .await?;
        }
        Ok(())
    }
}

/// Apply `plan` to `target` as `role` (None: the login role) in one transaction; with
/// `dry_run` everything runs and is rolled back.
pub async fn apply(
    plan: &Plan,
    target: &BackendTarget,
    role: Option<&str>,
    dry_run: bool,
    timeout: Duration,
) -> Result<Applied, ConnError> {
    let t = Timeouts {
        statement: timeout,
        lock: timeout.min(Duration::from_secs(10)),
    };
    let side = Side::connect("target", target, t).await?;
    // The review's session settings stay (text output of values is compared with the
    // review's); writes are allowed; names in every statement are qualified.
    side.exec("SET default_transaction_read_only = off; SET standard_conforming_strings = on")
        .await?;
    side.exec("BEGIN ISOLATION LEVEL READ COMMITTED").await?;
    let result = run(&side, plan, role, dry_run).await;
    match result {
        Ok(Applied::Done) if !dry_run => {
            side.exec("COMMIT").await?;
            Ok(Applied::Done)
        }
        other => {
            let _ = side.exec("ROLLBACK").await;
            other
        }
    }
}

async fn run(
    side: &Side,
    plan: &Plan,
    role: Option<&str>,
    dry_run: bool,
) -> Result<Applied, ConnError> {
    if let Some(r) = role {
        side.exec(&format!("SET LOCAL ROLE {}", names::quote(r)))
            .await?;
    }
    let mut cat = catalog::snapshot(side).await?;
    // Renames first (guarded under the golden's names): every other guard, the rows'
    // included, then finds objects under the names the review shows.
    let renamed = schema_conflicts(&plan.rename_guards, &cat);
    if !renamed.is_empty() {
        let total = renamed.len();
        return Ok(Applied::Conflicts(renamed, total));
    }
    if !plan.renames.is_empty() {
        for s in &plan.renames {
            side.exec(s).await?;
        }
        cat = catalog::snapshot(side).await?;
    }
    let mut plan = plan.clone();
    let (taken, rebased) = rebase::rebase(side, &cat, &mut plan).await?;
    for r in &rebased {
        tracing::info!(rebase = %r, "promotion onto a moving target");
    }
    let plan = &plan;
    let mut run = Run {
        side,
        conflicts: schema_conflicts(&plan.schema_guards, &cat),
        total: 0,
        loaded: BTreeMap::new(),
    };
    run.total = run.conflicts.len();
    run.check_sequences(plan, &cat).await?;
    run.check_columns(plan).await?;
    run.check_multisets(plan).await?;
    for tc in plan.tables.iter().filter(|t| !t.new_table) {
        run.check_rows(tc, &cat).await?;
    }
    if run.total == 0 && !dry_run {
        if let Some(c) = rebase::consume(side, &taken).await? {
            run.conflict(c);
        }
    }
    if run.total > 0 {
        return Ok(Applied::Conflicts(run.conflicts, run.total));
    }
    changes(side, plan, &mut run, dry_run).await
}

/// The server's message when `e` is a foreign-key or unique violation (SQLSTATE 23503,
/// 23505): what the target answered, not a guess.
fn integrity(e: &ConnError) -> Option<&str> {
    match e {
        ConnError::Query { message, .. }
            if message.ends_with("(SQLSTATE 23503)") || message.ends_with("(SQLSTATE 23505)") =>
        {
            Some(message)
        }
        _ => None,
    }
}

/// The DDL and row changes of `plan`, once every guard passed.
async fn changes(
    side: &Side,
    plan: &Plan,
    run: &mut Run<'_>,
    dry_run: bool,
) -> Result<Applied, ConnError> {
    // The target's usual search path for the changes (its triggers expect it); every name
    // below is qualified.
    side.exec("SET LOCAL search_path TO DEFAULT; SET CONSTRAINTS ALL DEFERRED")
        .await?;
    for s in plan.before_data.iter().chain(plan.identity_tables.iter()) {
        side.exec(s).await?;
    }
    for (seq, params) in &plan.create_sequences {
        let r = side
            .rows(&format!("SELECT pg_catalog.to_regclass({})", literal(seq)))
            .await?;
        if r.first().and_then(|r| r[0].as_ref()).is_none() {
            side.exec(&format!("CREATE SEQUENCE {seq} {params}"))
                .await?;
        }
    }
    // Types, generated and identity columns, and foreign keys as they are now, created
    // tables included.
    side.exec("SET LOCAL search_path = pg_catalog, pg_temp")
        .await?;
    let cat = catalog::snapshot(side).await?;
    side.exec("SET LOCAL search_path TO DEFAULT").await?;
    let order = row_order(&cat, plan);
    for s in &order.before {
        side.exec(s).await?;
    }
    for (tc, t, step) in &order.steps {
        let done = match step {
            Step::Delete if tc.multiset => run.multiset_deletes(tc).await,
            Step::Delete => run.deletes(tc, t).await,
            Step::Update => run.updates(tc, t).await,
            Step::Insert => run.inserts(tc, Some(t)).await,
        };
        // The target refused a row change by a key: a row added or removed concurrently
        // (a child of a parent the task deletes, a unique value taken) is a conflict.
        if let Err(e) = done {
            let Some(why) = integrity(&e) else {
                return Err(e);
            };
            run.conflict(format!(
                "{}: the target refused the task's row changes ({why}): a row there changed since the golden",
                tc.table
            ));
            return Ok(Applied::Conflicts(
                std::mem::take(&mut run.conflicts),
                run.total,
            ));
        }
    }
    for tc in &order.missing {
        run.conflict(format!("table {}: missing from the target", tc.table));
    }
    if run.total > 0 {
        return Ok(Applied::Conflicts(
            std::mem::take(&mut run.conflicts),
            run.total,
        ));
    }
    // Deferred foreign keys are checked before the keys the row order deferred are set
    // back, and before the constraints added after the data.
    side.exec("SET CONSTRAINTS ALL IMMEDIATE").await?;
    for s in order.after.iter().chain(&plan.after_data) {
        side.exec(s).await?;
    }
    // setval is not undone by a rollback: it runs last, after deferred constraints have
    // been checked, and never in a dry run.
    side.exec("SET CONSTRAINTS ALL IMMEDIATE").await?;
    if dry_run {
        return Ok(Applied::Done);
    }
    for (seq, st) in &plan.setvals {
        side.exec(&format!(
            "SELECT pg_catalog.setval({}, {}, {})",
            literal(seq),
            literal(&st.last_value),
            st.is_called
        ))
        .await?;
    }
    Ok(Applied::Done)
}

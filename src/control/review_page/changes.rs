//! What the task changed, on a task's page: the schema changes, every changed row paged
//! table by table (changed cells highlighted), the statement log filtered to what wrote
//! (all of it on request) and the SQL patch. Paging and filtering are plain links with a
//! query, so no script is needed.

use std::fmt::Write;

use serde::Deserialize;

use crate::journal::log::{self, LoggedStatement};
use crate::promote::change::Change;
use crate::review::html::{self, esc, show, show_lines};
use crate::review::model::{Review, Samples, TableDiff};
use crate::review::render::headline;

/// Changed rows shown per table and page.
pub(super) const ROWS_PAGE: usize = 50;
/// Statements read per page of the log.
const LOG_PAGE: usize = 500;
/// Statement kinds that change something: what the log shows unless asked for all.
const WRITE_KINDS: [&str; 3] = ["write", "ddl", "privilege"];

/// Query of `GET /review/{id}`: which table's rows to page, and the log's view.
#[derive(Deserialize, Default, Clone)]
pub(crate) struct PageQuery {
    /// Index (in the review) of the table paged.
    #[serde(default)]
    table: Option<usize>,
    /// Page of that table's rows, from 0.
    #[serde(default)]
    page: Option<usize>,
    /// `all`: every statement; otherwise only writes.
    #[serde(default)]
    log: Option<String>,
    /// The log page starts after this statement number.
    #[serde(default)]
    after: Option<u64>,
}

impl PageQuery {
    fn all_statements(&self) -> bool {
        self.log.as_deref() == Some("all")
    }

    fn link(
        &self,
        id: &str,
        table: Option<usize>,
        page: Option<usize>,
        after: Option<u64>,
    ) -> String {
        let mut q = Vec::new();
        if let (Some(t), Some(p)) = (table, page) {
            q.push(format!("table={t}&amp;page={p}"));
        }
        if self.all_statements() {
            q.push("log=all".into());
        }
        if let Some(a) = after {
            q.push(format!("after={a}"));
        }
        let q = if q.is_empty() {
            String::new()
        } else {
            format!("?{}", q.join("&amp;"))
        };
        format!("/review/{}{q}", esc(id))
    }
}

/// Rows `from..from+n` of a table's inserted, then deleted, then updated rows.
fn page_of(t: &TableDiff, from: usize, n: usize) -> TableDiff {
    let s = &t.samples;
    let (ni, nd) = (s.inserted.len(), s.deleted.len());
    let pick = |lo: usize, len: usize| {
        let a = from.max(lo).min(lo + len) - lo;
        let b = (from + n).max(lo).min(lo + len) - lo;
        a..b
    };
    TableDiff {
        table: t.table.clone(),
        matched_by: t.matched_by.clone(),
        key: t.key.clone(),
        columns: t.columns.clone(),
        inserted: t.inserted,
        deleted: t.deleted,
        updated: t.updated,
        updated_columns: t.updated_columns.clone(),
        samples: Samples {
            inserted: s.inserted[pick(0, ni)].to_vec(),
            deleted: s.deleted[pick(ni, nd)].to_vec(),
            updated: s.updated[pick(ni + nd, s.updated.len())].to_vec(),
            showing: Default::default(),
        },
        error: t.error.clone(),
        note: t.note.clone(),
    }
}

/// What the task changed: the stored review's headline and schema changes, then every
/// changed row of `complete` (the change captured for promotion, when it holds them all)
/// or else the review's samples.
pub(super) fn review_section(
    b: &mut String,
    id: &str,
    stored: Option<&Review>,
    complete: Option<&Change>,
    q: &PageQuery,
) {
    b.push_str("<section class=\"review\" id=\"review\"><h2>What the task changed</h2>");
    match stored {
        Some(review) => {
            let _ = write!(b, "<p id=\"headline\">{}</p>", esc(&headline(review)));
            html::schema(b, review);
            match complete {
                Some(ch) => rows_section(b, id, &ch.review.data, true, q),
                None => rows_section(b, id, &review.data, false, q),
            }
        }
        None => b.push_str("<p>No stored review yet: it is written when the token ends.</p>"),
    }
    b.push_str("</section>");
}

/// The row changes of `data`: every row held (`all_rows`: the change captured for
/// promotion) or the review's samples, [`ROWS_PAGE`] per table and page.
fn rows_section(b: &mut String, id: &str, data: &[TableDiff], all_rows: bool, q: &PageQuery) {
    b.push_str("<section id=\"rows\"><h3>Row changes</h3>");
    if data.is_empty() {
        b.push_str("<p class=\"muted\">none</p>");
    } else if all_rows {
        b.push_str("<p class=\"muted\">Every changed row, as captured for promotion; changed cells are highlighted.</p>");
    } else {
        b.push_str("<p class=\"muted\">Only the review's samples are shown (no complete capture of the change was kept); counts are exact.</p>");
    }
    for (i, t) in data.iter().enumerate() {
        let s = &t.samples;
        let held = s.inserted.len() + s.deleted.len() + s.updated.len();
        let pages = held.div_ceil(ROWS_PAGE).max(1);
        let page = if q.table == Some(i) {
            q.page.unwrap_or(0).min(pages - 1)
        } else {
            0
        };
        let from = page * ROWS_PAGE;
        let _ = write!(b, "<div class=\"tablediff\" id=\"t{i}\">");
        html::table(b, &page_of(t, from, ROWS_PAGE));
        let total = t.inserted + t.deleted + t.updated;
        if held > 0 {
            let _ = write!(
                b,
                "<p class=\"pager\">rows {}–{} of {held}{}",
                from + 1,
                (from + ROWS_PAGE).min(held),
                if (held as u64) < total {
                    format!(" held ({total} changed)")
                } else {
                    String::new()
                }
            );
            if page > 0 {
                let _ = write!(
                    b,
                    " · <a rel=\"prev\" href=\"{}#t{i}\">previous {ROWS_PAGE}</a>",
                    q.link(id, Some(i), Some(page - 1), q.after)
                );
            }
            if page + 1 < pages {
                let _ = write!(
                    b,
                    " · <a class=\"next\" rel=\"next\" href=\"{}#t{i}\">next {ROWS_PAGE}</a>",
                    q.link(id, Some(i), Some(page + 1), q.after)
                );
            }
            b.push_str("</p>");
        }
        b.push_str("</div>");
    }
    b.push_str("</section>");
}

/// The statement log: writes (write, DDL, privilege) by default, every statement with
/// `?log=all`; [`LOG_PAGE`] statements of the log per page.
pub(super) fn log_section(
    b: &mut String,
    place: &log::LogPlace,
    rec: &crate::registry::TokenRecord,
    review: Option<&Review>,
    q: &PageQuery,
) {
    let id = rec.id.as_str();
    b.push_str("<section id=\"statements\"><h2>Statement log</h2>");
    let read = place
        .files(&rec.task, &rec.id)
        .and_then(|f| f.read_page(q.after.unwrap_or(0), LOG_PAGE));
    let page = match read {
        Ok(p) => p,
        Err(e) => {
            let _ = write!(
                b,
                "<p class=\"fail\">The log could not be read: {}</p></section>",
                esc(&e.to_string())
            );
            return;
        }
    };
    let all = q.all_statements();
    let is_write = |st: &&LoggedStatement| {
        let failed = st.outcome.as_ref().is_none_or(|o| o.sqlstate.is_some());
        WRITE_KINDS.contains(&st.statement.kind.as_str()) || (failed && st.statement.kind != "read")
    };
    let shown: Vec<&LoggedStatement> = page
        .statements
        .iter()
        .filter(|s| all || is_write(s))
        .collect();
    if let Some(r) = review {
        let s = &r.statements;
        let kinds: Vec<String> = s
            .by_kind
            .iter()
            .map(|(k, n)| format!("{} {n}", esc(k)))
            .collect();
        let _ = write!(
            b,
            "<p>{} statements in all ({}); {} failed; {} unfinished.</p>",
            s.total,
            kinds.join(", "),
            s.failed.len(),
            s.unfinished
        );
    }
    let (first, last) = (
        page.statements
            .first()
            .map(|s| s.statement.seq)
            .unwrap_or(0),
        page.statements.last().map(|s| s.statement.seq).unwrap_or(0),
    );
    let toggle = if all {
        format!(
            "<a id=\"log-writes\" href=\"{}#statements\">show only writes</a>",
            PageQuery::default().link(id, q.table, q.page, q.after)
        )
    } else {
        let mut everything = q.clone();
        everything.log = Some("all".into());
        format!(
            "<a id=\"log-all\" href=\"{}#statements\">show all statements</a>",
            everything.link(id, q.table, q.page, q.after)
        )
    };
    let _ = write!(
        b,
        "<p id=\"log-view\">Showing {} {} of statements #{first}–#{last} · {toggle}</p>",
        shown.len(),
        if all {
            "statements"
        } else {
            "writes (write, DDL, privilege, and failed or unfinished statements)"
        }
    );
    if !shown.is_empty() {
        b.push_str("<div class=\"box\">");
        html::statement_table(b, shown.into_iter());
        b.push_str("</div>");
    }
    if let Some(next) = page.next_after {
        let _ = write!(
            b,
            "<p><a id=\"log-next\" href=\"{}#statements\">next {LOG_PAGE} statements</a></p>",
            q.link(id, q.table, q.page, Some(next))
        );
    }
    b.push_str("</section>");
}

/// The review's notes, the patch check's verdict and the SQL patch.
pub(super) fn patch_section(b: &mut String, r: &Review) {
    if !r.notes.is_empty() {
        b.push_str("<section id=\"notes\"><h2>Notes</h2><ul>");
        for n in &r.notes {
            let _ = write!(b, "<li>{}</li>", show(n));
        }
        b.push_str("</ul></section>");
    }
    let _ = write!(
        b,
        "<section id=\"patch-section\"><h2>SQL patch</h2><p class=\"muted\">What the review models, as SQL; never applied by sandpit.</p>\
         <pre id=\"verification\">{}</pre><pre id=\"patch\">{}</pre></section>",
        show_lines(&crate::review::render::verification(r.verification.as_ref())),
        show_lines(&r.patch)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::model::UpdatedRow;

    fn row(n: usize) -> Vec<Option<String>> {
        vec![Some(n.to_string())]
    }

    #[test]
    fn pages_run_through_inserted_then_deleted_then_updated_rows() {
        let t = TableDiff {
            samples: Samples {
                inserted: (0..3).map(row).collect(),
                deleted: (3..5).map(row).collect(),
                updated: (5..9)
                    .map(|n| UpdatedRow {
                        before: row(n),
                        after: row(n),
                        changed: vec![],
                    })
                    .collect(),
                showing: Default::default(),
            },
            ..Default::default()
        };
        // (from, n) -> (inserted, deleted, updated) first values shown.
        let cases: [(usize, usize, [usize; 3]); 5] = [
            (0, 2, [2, 0, 0]),
            (2, 2, [1, 1, 0]),
            (4, 3, [0, 1, 2]),
            (8, 5, [0, 0, 1]),
            (9, 5, [0, 0, 0]),
        ];
        for (from, n, want) in cases {
            let p = page_of(&t, from, n);
            let got = [
                p.samples.inserted.len(),
                p.samples.deleted.len(),
                p.samples.updated.len(),
            ];
            assert_eq!(got, want, "from {from}, {n} rows");
        }
        let p = page_of(&t, 4, 3);
        assert_eq!(p.samples.deleted[0], row(4));
        assert_eq!(p.samples.updated[1].before, row(6));
    }
}

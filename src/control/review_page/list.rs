//! `GET /review`: every token with its decision state, whether its change can be promoted,
//! and filters (`?show=needs_review|failed|promotable`) as plain links.

use std::fmt::Write;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use super::{header_bar, html, login_page, session, state_badge};
use crate::control::promote::{approval_blockers, summaries, ReviewSummary};
use crate::control::ApiState;
use crate::promote::{self, decisions::ReviewState};
use crate::registry::TokenRecord;
use crate::review::escape::cap;
use crate::review::html::{esc, show};

/// Longest reason shown in the list (the task's page has all of them).
const WHY_MAX: usize = 120;

/// The list's filters: query value, link text.
const FILTERS: [(&str, &str); 3] = [
    ("needs_review", "needs review"),
    ("failed", "failed"),
    ("promotable", "promotable"),
];

/// Query of `GET /review`.
#[derive(Deserialize, Default)]
pub(crate) struct ListQuery {
    /// One of [`FILTERS`]; anything else (or nothing) lists every token.
    #[serde(default)]
    show: Option<String>,
}

/// What the list says of one token beyond its summary.
struct Row {
    summary: ReviewSummary,
    /// None: promotable; Some(why not).
    blocked: Option<String>,
    failed: bool,
}

fn classify(s: &ApiState, rec: &TokenRecord, summary: ReviewSummary) -> Row {
    let r = promote::record(&s.gw, rec).unwrap_or_default();
    let last_failed = r
        .promotions
        .last()
        .is_some_and(|p| matches!(p.outcome.as_str(), "failed" | "conflicts" | "refused"));
    let review_failed = summary
        .review
        .as_deref()
        .is_some_and(|v| v.starts_with("failed"));
    let failed = review_failed || summary.validators_failed > 0 || last_failed;
    // The stored review is not read here (it may be large): a capture carries the patch
    // check's verdict among its refusals, and without a capture nothing is promotable.
    let blocked = if rec.state.is_usable() {
        Some("the token is still live".to_string())
    } else if matches!(r.state, ReviewState::Promoted | ReviewState::Rejected) {
        Some(format!("{} already", r.state.words()))
    } else {
        match &r.capture {
            None => Some("no change was captured for promotion".into()),
            Some(c) if !c.complete => Some(format!(
                "capture incomplete: {}",
                c.reason.clone().unwrap_or_default()
            )),
            Some(_) => approval_blockers(s, rec, &r, None).into_iter().next(),
        }
    };
    Row {
        summary,
        blocked,
        failed,
    }
}

fn shown(row: &Row, filter: Option<&str>) -> bool {
    match filter {
        Some("needs_review") => {
            row.summary.state == ReviewState::NeedsReview && !is_live(&row.summary)
        }
        Some("failed") => row.failed,
        Some("promotable") => row.blocked.is_none(),
        _ => true,
    }
}

fn is_live(s: &ReviewSummary) -> bool {
    s.token_state == "issued" || s.token_state == "live"
}

fn filter_bar(b: &mut String, rows: &[Row], filter: Option<&str>) {
    let current = |on: bool| if on { " aria-current=\"page\"" } else { "" };
    let _ = write!(
        b,
        "<nav id=\"filters\" aria-label=\"filters\">Show: <a href=\"/review\"{}>all ({})</a>",
        current(filter.is_none()),
        rows.len()
    );
    for (key, words) in FILTERS {
        let n = rows.iter().filter(|r| shown(r, Some(key))).count();
        let _ = write!(
            b,
            " · <a id=\"filter-{key}\" href=\"/review?show={key}\"{}>{words} ({n})</a>",
            current(filter == Some(key))
        );
    }
    b.push_str("</nav>");
}

fn row_html(b: &mut String, row: &Row) {
    let r = &row.summary;
    let id = esc(&r.token);
    let promotable = match &row.blocked {
        None => "<span class=\"pass\">yes</span>".to_string(),
        Some(why) => format!(
            "<span class=\"muted\">no: {}</span>",
            show(&cap(why, WHY_MAX))
        ),
    };
    // No stored review: no count, no validator verdict, only why (never a "0").
    if let Some(why) = r.review.as_deref().filter(|v| *v != "stored") {
        let _ = write!(
            b,
            "<tr class=\"review-missing\"><td><a href=\"/review/{id}\">{}</a></td><td><code>{id}</code></td><td>{}</td><td>{}</td>\
             <td colspan=\"3\" class=\"fail\">review {}</td><td>{}</td><td>{promotable}</td><td></td></tr>",
            show(&r.task),
            esc(&r.token_state),
            esc(r.golden.as_deref().unwrap_or("–")),
            show(why),
            state_badge(r.state),
        );
        return;
    }
    let count = |v: Option<String>| v.unwrap_or_else(|| "–".into());
    let validators = if r.validators_failed > 0 {
        format!("<span class=\"fail\">{} failed</span>", r.validators_failed)
    } else {
        "ok".into()
    };
    let last = r
        .last
        .as_ref()
        .map(|e| format!("{} by {} at {}", esc(&e.action), esc(&e.by), esc(&e.at)))
        .unwrap_or_default();
    let _ = write!(
        b,
        "<tr><td><a href=\"/review/{id}\">{}</a></td><td><code>{id}</code></td><td>{}</td><td>{}</td>\
         <td>{}</td><td>{}</td><td>{validators}</td><td>{}</td><td>{promotable}</td><td>{last}</td></tr>",
        show(&r.task),
        esc(&r.token_state),
        esc(r.golden.as_deref().unwrap_or("–")),
        count(r.schema_changes.map(|n| n.to_string())),
        count(r.rows_changed.map(|n| n.to_string())),
        state_badge(r.state),
    );
}

/// `GET /review`: the list (or the sign-in form).
pub(crate) async fn list(
    State(s): State<ApiState>,
    headers: HeaderMap,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let Some((who, csrf)) = session(&headers) else {
        return login_page(StatusCode::OK, None);
    };
    let mut records = match s.gw.registry.list_fresh().await {
        Ok(r) => r,
        Err(e) => {
            return html(
                StatusCode::INTERNAL_SERVER_ERROR,
                "error",
                &esc(&e.to_string()),
            )
        }
    };
    records.sort_by_key(|r| std::cmp::Reverse(r.created_at));
    // A query that does not parse is ignored: the page as if none was given.
    let q = q.map(|Query(q)| q).unwrap_or_default();
    let filter = q
        .show
        .as_deref()
        .and_then(|f| FILTERS.iter().find(|(k, _)| *k == f).map(|(k, _)| *k));
    let rows: Vec<Row> = records
        .iter()
        .zip(summaries(&s, &records))
        .map(|(rec, sum)| classify(&s, rec, sum))
        .collect();
    let mut b = String::new();
    header_bar(&mut b, &who, &csrf);
    let listed = rows.iter().filter(|r| shown(r, filter)).count();
    let _ = write!(
        b,
        "<main><h1>Tasks to review</h1><p>{listed} of {} tokens, newest first.</p>",
        rows.len()
    );
    filter_bar(&mut b, &rows, filter);
    b.push_str(
        "<div class=\"box\"><table id=\"tokens\"><thead><tr><th>task</th><th>token</th><th>token state</th>\
         <th>golden</th><th>schema changes</th><th>rows changed</th><th>validators</th><th>review</th>\
         <th>promotable</th><th>last decision</th></tr></thead><tbody>",
    );
    for row in rows.iter().filter(|r| shown(r, filter)) {
        row_html(&mut b, row);
    }
    b.push_str("</tbody></table></div></main>");
    html(StatusCode::OK, "sandpit review: tasks", &b)
}

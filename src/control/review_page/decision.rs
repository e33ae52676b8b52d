//! The parts of a task's page a decision rests on: why the task ran (its token's metadata),
//! whether its change can be promoted (what blocks it, what a promotion would run, the last
//! dry run and a form for one), and the decision itself — Approve and Reject below the
//! change, the patch check's verdict and every blocker beside them, Approve disabled while
//! any blocker stands, and no buttons at all once decided (decisions are final).

use std::fmt::Write;

use crate::control::ApiState;
use crate::promote::change::Change;
use crate::promote::decisions::{ReviewRecord, ReviewState};
use crate::promote::resolve::Resolved;
use crate::promote::{self, plan, PromoteError};
use crate::registry::TokenRecord;
use crate::review::html::{esc, show, show_lines};
use crate::review::model::Review;
use crate::review::model::VerifyStatus;

/// The task and the metadata its token was issued with: why the change was made.
pub(super) fn why_section(b: &mut String, rec: &TokenRecord) {
    b.push_str("<section id=\"why\"><h2>Why: the task</h2>");
    let _ = write!(
        b,
        "<p>Task <b>{}</b>, token issued {} (expires {}).</p>",
        show(&rec.task),
        esc(&crate::rfc3339::format(rec.created_at)),
        esc(&crate::rfc3339::format(rec.expires_at))
    );
    if rec.metadata.is_empty() {
        b.push_str("<p class=\"muted\">The token was issued without metadata.</p></section>");
        return;
    }
    b.push_str("<div class=\"box\"><table id=\"metadata\"><tbody>");
    for (k, v) in &rec.metadata {
        let _ = write!(
            b,
            "<tr><th scope=\"row\">{}</th><td>{}</td></tr>",
            show(k),
            show(v)
        );
    }
    b.push_str("</tbody></table></div></section>");
}

/// The patch check's verdict as one line, with a class saying whether it blocks.
pub(super) fn verdict(stored: Option<&Review>) -> (&'static str, String) {
    match stored.and_then(|r| r.verification.as_ref()) {
        None => (
            "muted",
            "patch not verified: no stored review with a patch check".into(),
        ),
        Some(v) => (
            match v.status {
                VerifyStatus::Exact => "pass",
                VerifyStatus::Differs => "fail",
                VerifyStatus::NotVerified => "muted",
            },
            v.summary.clone(),
        ),
    }
}

fn blocker_list(b: &mut String, blockers: &[String]) {
    b.push_str("<ul id=\"blockers\" class=\"blockers\">");
    for x in blockers {
        let _ = write!(b, "<li>{}</li>", show(x));
    }
    b.push_str("</ul>");
}

/// Everything [`promotability_section`] shows.
pub(super) struct Promotability<'a> {
    pub rec: &'a TokenRecord,
    pub r: &'a ReviewRecord,
    pub stored: Option<&'a Review>,
    pub change: Option<&'a Change>,
    pub blockers: &'a [String],
    pub csrf: &'a str,
    /// Whether the signed-in key may run a (dry) promotion.
    pub may_promote: bool,
    pub default_target: Option<&'a Result<Resolved, PromoteError>>,
}

/// Can this change be promoted: the blockers, the plan's size and statements, the last
/// dry run and (before a decision) a form for one.
pub(super) fn promotability_section(b: &mut String, s: &ApiState, p: &Promotability) {
    b.push_str("<section id=\"promotability\"><h2>Can this change be promoted?</h2>");
    let (class, line) = verdict(p.stored);
    let incomplete = p.r.capture.as_ref().filter(|c| !c.complete);
    if p.r.state == ReviewState::Promoted {
        b.push_str("<p id=\"promotable\">Promoted already: see Promotion below.</p>");
    } else if p.r.state == ReviewState::Rejected {
        b.push_str("<p id=\"promotable\">No: the change was rejected.</p>");
    } else if p.rec.state.is_usable() {
        b.push_str("<p id=\"promotable\">Not yet: the token is still live.</p>");
    } else if !p.blockers.is_empty() {
        b.push_str("<p id=\"promotable\" class=\"fail\">No: approval is blocked.</p>");
        blocker_list(b, p.blockers);
    } else if p.change.is_none() {
        b.push_str("<p id=\"promotable\" class=\"fail\">No: no change was captured for promotion when the token ended.</p>");
    } else if let Some(c) = incomplete {
        let _ = write!(
            b,
            "<p id=\"promotable\" class=\"fail\">No: the captured change is incomplete ({}).</p>",
            show(c.reason.as_deref().unwrap_or(""))
        );
    } else {
        b.push_str("<p id=\"promotable\" class=\"pass\">Yes: nothing found blocks promotion. A dry run checks it against the target.</p>");
    }
    let _ = write!(
        b,
        "<p>Patch check: <span class=\"{class}\">{}</span></p>",
        show(&line)
    );
    if let Some(ch) = p.change {
        let masked: plan::Masked = ch.masked.iter().cloned().collect();
        let pl = plan::build(&ch.review, &masked);
        let c = pl.counts();
        let _ = write!(
            b,
            "<p id=\"plan\">A promotion runs, in one transaction guarded against the golden: {} schema statements, \
             {} inserted, {} updated, {} deleted rows, {} sequence positions.</p>",
            c.schema, c.inserted, c.updated, c.deleted, c.sequences
        );
        let ddl: Vec<&String> = pl.before_data.iter().chain(pl.after_data.iter()).collect();
        if !ddl.is_empty() {
            let _ = write!(
                b,
                "<details><summary>Schema statements it runs ({})</summary><pre>",
                ddl.len()
            );
            for d in ddl {
                let _ = writeln!(b, "{}", show_lines(d));
            }
            b.push_str("</pre></details>");
        }
    }
    dry_runs(b, p.r);
    let undecided = matches!(p.r.state, ReviewState::NeedsReview);
    // A change with blockers would only be refused: no dry run is offered for it.
    if undecided
        && p.may_promote
        && p.change.is_some()
        && !p.rec.state.is_usable()
        && p.blockers.is_empty()
    {
        target_form(b, s, &p.rec.id, p.csrf, p.default_target, true);
    }
    b.push_str("</section>");
}

/// The last dry run, if any.
fn dry_runs(b: &mut String, r: &ReviewRecord) {
    let Some(d) = r.promotions.iter().rev().find(|p| p.dry_run) else {
        b.push_str("<p id=\"dry-run-result\" class=\"muted\">No dry run yet.</p>");
        return;
    };
    let what = match d.outcome.as_str() {
        "dry_run" => "<span class=\"pass\">would apply</span>".to_string(),
        "conflicts" => format!(
            "<span class=\"fail\">{} conflicts</span>",
            d.conflicts_total
        ),
        "refused" => "<span class=\"fail\">refused</span>".to_string(),
        o => format!("<span class=\"fail\">{}</span>", esc(o)),
    };
    let _ = write!(
        b,
        "<p id=\"dry-run-result\">Last dry run: {what} on <code>{}</code> at {} by {}.</p>",
        esc(&d.target),
        esc(&d.at),
        esc(&d.by)
    );
    let why: Vec<&String> = d
        .conflicts
        .iter()
        .chain(d.refusals.iter())
        .chain(d.error.iter())
        .collect();
    if !why.is_empty() {
        b.push_str("<ul>");
        for w in why {
            let _ = write!(b, "<li>{}</li>", show(w));
        }
        b.push_str("</ul>");
    }
}

/// The target picker and a Promote (or Dry run) button.
pub(super) fn target_form(
    b: &mut String,
    s: &ApiState,
    token: &str,
    csrf: &str,
    default_target: Option<&Result<Resolved, PromoteError>>,
    dry_run: bool,
) {
    let targets = &s.gw.config.promote.targets;
    let has_default = matches!(default_target, Some(Ok(_)));
    if targets.is_empty() && !has_default {
        b.push_str("<p>No target is configured here: promote with the CLI or API.</p>");
        return;
    }
    let suffix = if dry_run { "-dry" } else { "" };
    let _ = write!(
        b,
        "<form method=\"post\" action=\"/review/{}/promote\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <p><label for=\"target{suffix}\">Target</label> <select id=\"target{suffix}\" name=\"target\">",
        esc(token),
        esc(csrf)
    );
    if let Some(Ok(d)) = default_target {
        let _ = write!(b, "<option value=\"\">default: {}</option>", esc(&d.shown));
    }
    for name in targets.keys() {
        let _ = write!(b, "<option value=\"{0}\">{0}</option>", esc(name));
    }
    if dry_run {
        b.push_str(
            "</select> <input type=\"hidden\" name=\"dry_run\" value=\"1\">\
             <button type=\"submit\" id=\"dry-run\">Dry run (commit nothing)</button></p></form>",
        );
    } else {
        b.push_str(
            "</select> <label><input type=\"checkbox\" id=\"dry_run\" name=\"dry_run\" value=\"1\"> dry run (commit nothing)</label></p>\
             <p><button type=\"submit\" id=\"promote\">Promote</button></p></form>",
        );
    }
}

/// Approve / Reject (below the change), or the final decision once made.
pub(super) fn decision_section(
    b: &mut String,
    rec: &TokenRecord,
    r: &ReviewRecord,
    stored: Option<&Review>,
    blockers: &[String],
    csrf: &str,
) {
    b.push_str("<section id=\"decision\"><h2>Decision</h2>");
    if r.state != ReviewState::NeedsReview {
        let last = r
            .trail
            .iter()
            .rev()
            .find(|e| e.action == "approved" || e.action == "rejected");
        let _ = write!(
            b,
            "<p id=\"decided\">{}",
            esc(&capitalised(r.state.words()))
        );
        if let Some(e) = last {
            let _ = write!(b, " by {} at {}", esc(&e.by), esc(&e.at));
            if !e.comment.is_empty() {
                let _ = write!(b, ": “{}”", show(&e.comment));
            }
        }
        b.push_str(". Decisions are final.</p></section>");
        return;
    }
    if rec.state.is_usable() {
        b.push_str(
            "<p>The token is still live; its change can be decided once it ends.</p></section>",
        );
        return;
    }
    let blocked = !blockers.is_empty();
    let (class, line) = verdict(stored);
    let _ = write!(
        b,
        "<form method=\"post\" action=\"/review/{}/decide\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <p><label for=\"comment\">Comment (required to reject)</label><br>\
         <textarea id=\"comment\" name=\"comment\" rows=\"3\" maxlength=\"{}\"></textarea></p>\
         <div class=\"decide\"><p class=\"buttons\"><button type=\"submit\" id=\"approve\" name=\"decision\" value=\"approve\"{}{}>Approve</button>\
         <button type=\"submit\" id=\"reject\" name=\"decision\" value=\"reject\">Reject</button></p>\
         <div class=\"beside\"><p id=\"verdict\" class=\"{class}\">{}</p>",
        esc(&rec.id),
        esc(csrf),
        promote::COMMENT_MAX,
        if blocked { " disabled" } else { "" },
        if blocked { " aria-describedby=\"blockers-why\"" } else { "" },
        show(&line)
    );
    if blocked {
        b.push_str("<p id=\"blockers-why\" class=\"fail\">Approve is disabled:</p>");
        blocker_list(b, blockers);
    }
    b.push_str("</div></div><p class=\"muted\">A decision is final.</p></form></section>");
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

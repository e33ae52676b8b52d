//! The sections of a task's review page: the stored review's content, validators, the
//! decision and promotion forms, and the audit trail.

use std::fmt::Write;

use crate::control::ApiState;
use crate::promote;
use crate::promote::decisions::{ReviewRecord, ReviewState};
use crate::promote::resolve::Resolved;
use crate::review::html::esc;

/// The content of a stored review page (between its body tags).
pub(super) fn body_of(page: &str) -> &str {
    let start = page.find("<body>").map(|i| i + "<body>".len()).unwrap_or(0);
    let end = page.rfind("</body>").unwrap_or(page.len());
    page.get(start..end.max(start)).unwrap_or("")
}

pub(super) fn validators_section(b: &mut String, r: &ReviewRecord) {
    b.push_str("<section id=\"validators\"><h2>Validators</h2>");
    if r.validators.is_empty() {
        b.push_str("<p>None configured for this golden.</p></section>");
        return;
    }
    let _ = write!(b, "<p>Ran at {}.</p><div class=\"box\"><table><thead><tr><th>validator</th><th>kind</th><th>result</th><th>detail</th></tr></thead><tbody>",
        esc(r.validated_at.as_deref().unwrap_or("–")));
    for v in &r.validators {
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td><code>{}</code></td></tr>",
            esc(&v.name),
            esc(&v.kind),
            if v.passed { "pass" } else { "fail" },
            if v.passed { "passed" } else { "failed" },
            esc(&v.detail)
        );
    }
    b.push_str("</tbody></table></div></section>");
}

pub(super) fn decision_section(
    b: &mut String,
    rec: &crate::registry::TokenRecord,
    r: &ReviewRecord,
    csrf: &str,
) {
    b.push_str("<section id=\"decision\"><h2>Decision</h2>");
    if r.state == ReviewState::Promoted {
        b.push_str("<p>Promoted: no further decision.</p></section>");
        return;
    }
    if rec.state.is_usable() {
        b.push_str(
            "<p>The token is still live; its change can be decided once it ends.</p></section>",
        );
        return;
    }
    let blocked = !r.failed_validators().is_empty();
    if blocked {
        b.push_str("<p class=\"fail\">A validator failed: approval is blocked.</p>");
    }
    let _ = write!(
        b,
        "<form method=\"post\" action=\"/review/{}/decide\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <p><label for=\"comment\">Comment (required to reject)</label><br>\
         <textarea id=\"comment\" name=\"comment\" rows=\"3\" maxlength=\"{}\"></textarea></p>\
         <p><button type=\"submit\" id=\"approve\" name=\"decision\" value=\"approve\"{}>Approve</button>\
         <button type=\"submit\" id=\"reject\" name=\"decision\" value=\"reject\">Reject</button></p></form></section>",
        esc(&rec.id),
        esc(csrf),
        promote::COMMENT_MAX,
        if blocked { " disabled" } else { "" }
    );
}

pub(super) fn promote_section(
    b: &mut String,
    s: &ApiState,
    r: &ReviewRecord,
    csrf: &str,
    default_target: Option<&Result<Resolved, promote::PromoteError>>,
) {
    b.push_str("<section id=\"promotion\"><h2>Promotion</h2>");
    if let Some(c) = &r.capture {
        let _ = write!(
            b,
            "<p>Captured change: {} schema changes, {} changed rows{}{}.</p>",
            c.schema_changes,
            c.rows,
            if c.complete {
                ""
            } else {
                " — not promotable: "
            },
            esc(c.reason.as_deref().unwrap_or(""))
        );
        if !c.masked.is_empty() {
            let _ = write!(
                b,
                "<p>Masked columns (never written back): <code>{}</code></p>",
                esc(&c.masked.join(", "))
            );
        }
    }
    let targets = &s.gw.config.promote.targets;
    if r.state == ReviewState::Approved {
        match default_target {
            Some(Ok(d)) => {
                let _ = write!(
                    b,
                    "<p id=\"default-target\">Default target: <code>{}</code> ({}){}</p>",
                    esc(&d.shown),
                    esc(&d.origin.words()),
                    d.role
                        .as_deref()
                        .map(|r| format!(", as role <code>{}</code>", esc(r)))
                        .unwrap_or_default()
                );
            }
            Some(Err(e)) => {
                let _ = write!(b, "<p id=\"default-target\">{}</p>", esc(&e.to_string()));
            }
            None => {}
        }
        let has_default = matches!(default_target, Some(Ok(_)));
        if targets.is_empty() && !has_default {
            b.push_str("<p>Promote with the CLI or API.</p>");
        } else {
            let _ = write!(
                b,
                "<form method=\"post\" action=\"/review/{}/promote\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                 <p><label for=\"target\">Target</label> <select id=\"target\" name=\"target\">",
                esc(&r.token),
                esc(csrf)
            );
            if let Some(Ok(d)) = default_target {
                let _ = write!(b, "<option value=\"\">default: {}</option>", esc(&d.shown));
            }
            for name in targets.keys() {
                let _ = write!(b, "<option value=\"{0}\">{0}</option>", esc(name));
            }
            b.push_str(
                "</select> <label><input type=\"checkbox\" id=\"dry_run\" name=\"dry_run\" value=\"1\"> dry run (commit nothing)</label></p>\
                 <p><button type=\"submit\" id=\"promote\">Promote</button></p></form>",
            );
        }
    } else if r.state != ReviewState::Promoted {
        b.push_str("<p>Available once the change is approved.</p>");
    }
    if !r.promotions.is_empty() {
        b.push_str("<div class=\"box\"><table id=\"promotions\"><thead><tr><th>at</th><th>by</th><th>outcome</th><th>target</th><th>role</th><th>changes</th><th>conflicts / refusals</th></tr></thead><tbody>");
        for p in r.promotions.iter().rev() {
            let c = &p.counts;
            let mut why: Vec<String> = p
                .conflicts
                .iter()
                .chain(p.refusals.iter())
                .map(|x| esc(x))
                .collect();
            if p.conflicts_total > p.conflicts.len() {
                why.push(format!(
                    "showing {} of {} conflicts",
                    p.conflicts.len(),
                    p.conflicts_total
                ));
            }
            if let Some(e) = &p.error {
                why.push(esc(e));
            }
            let _ = write!(
                b,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td>\
                 <td>{} schema, +{} ~{} −{} rows, {} sequences</td><td>{}</td></tr>",
                esc(&p.at),
                esc(&p.by),
                esc(&p.outcome),
                esc(&p.target),
                esc(p.role.as_deref().unwrap_or("login role")),
                c.schema,
                c.inserted,
                c.updated,
                c.deleted,
                c.sequences,
                if why.is_empty() {
                    String::new()
                } else {
                    format!("<ul><li>{}</li></ul>", why.join("</li><li>"))
                }
            );
        }
        b.push_str("</tbody></table></div>");
    }
    b.push_str("</section>");
}

pub(super) fn trail_section(b: &mut String, r: &ReviewRecord) {
    b.push_str("<section id=\"trail\"><h2>Audit trail</h2>");
    if r.trail.is_empty() {
        b.push_str("<p>No decision yet.</p></section>");
        return;
    }
    b.push_str("<div class=\"box\"><table><thead><tr><th>at</th><th>by</th><th>action</th><th>comment</th></tr></thead><tbody>");
    for e in &r.trail {
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&e.at),
            esc(&e.by),
            esc(&e.action),
            esc(&e.comment)
        );
    }
    b.push_str("</tbody></table></div></section>");
}

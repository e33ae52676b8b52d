//! The sections of a task's review page after the decision: validators, the promotion form
//! and its attempts, and the audit trail.

use std::fmt::Write;

use crate::control::ApiState;
use crate::promote;
use crate::promote::decisions::{ReviewRecord, ReviewState};
use crate::promote::resolve::Resolved;
use crate::review::html::esc;

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
        super::decision::target_form(b, s, &r.token, csrf, default_target, false);
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

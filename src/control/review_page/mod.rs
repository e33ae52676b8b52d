//! The review pages for people: `/review` lists every token with its decision state,
//! `/review/{id}` shows one task's page in the order a decision needs: why (the token's
//! metadata), whether the change can be promoted (blockers, plan, dry run), the change
//! itself (every changed row, paged), then Approve / Reject with the patch check's verdict
//! beside them, once approved the Promote form, the statement log (writes by default), the
//! patch and the audit trail. Plain server-rendered HTML: no script, no outside asset,
//! a strict CSP; usable with a keyboard; wide tables scroll inside their box.
//!
//! Sign-in and CSRF: the admin or a reviewer key is posted once to `/review/login`; the
//! gateway answers with a random 256-bit session id in a cookie (`HttpOnly`,
//! `SameSite=Strict`, path `/review`), kept in memory only (a restart signs everyone out).
//! Every form carries the session's own random CSRF token, compared in constant time with
//! the session's, so a request forged by another site fails even where a browser would send
//! the cookie; `form-action 'self'` and `frame-ancestors 'none'` close the rest.

use std::fmt::Write;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Form;
use dashmap::DashMap;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::promote::{approval_blockers, decide_once, stored_review, who_is};
use super::ApiState;
use crate::promote::decisions::{ReviewRecord, ReviewState};
use crate::promote::resolve::{self, Resolved};
use crate::promote::{self, Decision, PromoteRequest, Who};
use crate::registry::TokenRecord;
use crate::review::html::{esc, show};
use crate::review::reviewer::reviews_dir;

mod changes;
mod decision;
mod list;
mod sections;
use changes::PageQuery;
pub(crate) use list::list;
use sections::{promote_section, trail_section, validators_section};

/// Name of the session cookie.
const COOKIE: &str = "sandpit_review";
/// How long a sign-in lasts.
const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// Most sessions kept (expired ones are dropped first; then sign-in is refused).
const SESSIONS_MAX: usize = 10_000;

const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

const STYLE: &str = "body{font:15px/1.45 system-ui,sans-serif;margin:1.2em auto;max-width:110em;padding:0 1em;color:#222}\
a{color:#0550ae}:focus-visible{outline:3px solid #0969da;outline-offset:2px}\
.box{overflow:auto;max-width:100%;border:1px solid #ddd;margin:.4em 0 1em}\
.box table{margin:0}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}\
.state{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600}\
.needs_review{background:#fff8c5}.approved{background:#dafbe1}.rejected{background:#ffebe9}.promoted{background:#ddf4ff}\
.msg{padding:.5em .8em;border:1px solid #999;background:#f6f8fa}.err{border-color:#cf222e;background:#ffebe9}\
.pass{color:#1a7f37}.fail{color:#cf222e;font-weight:600}textarea{width:min(40em,100%)}\
form{margin:.5em 0}button{font:inherit;padding:3px 12px;margin-right:.4em}\
.review table{display:block;overflow-x:auto;max-width:100%}.review pre{overflow:auto;max-height:40em}\
.review .cols{display:block}pre{white-space:pre-wrap;word-break:break-word;overflow:auto;max-height:40em}\
.ins{background:#e6ffec}.del{background:#ffebe9}.upd{background:#fff8c5}\
td.chg{background:#ffd33d;font-weight:700;outline:2px solid #bf8700;outline-offset:-2px}\
.failed{background:#ffebe9}.muted{color:#666}.pager{margin:.4em 0 1.4em}\
bdi{unicode-bidi:isolate}.cc{color:#a00;background:#fee;border:1px dotted #a00;font:11px ui-monospace,monospace}\
section{margin-bottom:1.2em}#why table th{background:#f6f8fa}\
.decide{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start;border:2px solid #d0d7de;padding:.6em .8em;background:#f6f8fa}\
.decide .buttons{margin:0}.decide .beside{flex:1;min-width:18em}.decide .beside p{margin:0 0 .3em}\
button#approve{background:#1f883d;color:#fff;border:1px solid #1a7f37}button#approve:disabled{background:#8c959f;border-color:#8c959f;cursor:not-allowed}\
.blockers{margin:.2em 0;padding-left:1.3em;color:#a40e26}nav#filters a[aria-current]{font-weight:700;text-decoration:none;color:#222}";

struct Session {
    who: Who,
    csrf: String,
    expires: Instant,
}

static SESSIONS: LazyLock<DashMap<String, Session>> = LazyLock::new(DashMap::new);

fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().strip_prefix(&format!("{COOKIE}=")))
        .map(str::to_string)
        .next()
}

/// The signed-in session: who, and its CSRF token.
fn session(headers: &HeaderMap) -> Option<(Who, String)> {
    let id = cookie_value(headers)?;
    let s = SESSIONS.get(&id)?;
    if s.expires < Instant::now() {
        drop(s);
        SESSIONS.remove(&id);
        return None;
    }
    Some((s.who.clone(), s.csrf.clone()))
}

/// The session, if the form's CSRF token is its own.
fn checked(headers: &HeaderMap, csrf: &str) -> Option<Who> {
    let (who, want) = session(headers)?;
    bool::from(csrf.as_bytes().ct_eq(want.as_bytes())).then_some(who)
}

fn html(status: StatusCode, title: &str, body: &str) -> Response {
    let page = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>{body}</body></html>",
        esc(title)
    );
    let mut r = (status, page).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn see_other(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

fn login_page(status: StatusCode, error: Option<&str>) -> Response {
    let mut b = String::from("<main><h1>sandpit review</h1>");
    if let Some(e) = error {
        let _ = write!(b, "<p class=\"msg err\" role=\"alert\">{}</p>", esc(e));
    }
    b.push_str(
        "<form method=\"post\" action=\"/review/login\"><p><label for=\"key\">Admin or reviewer key</label><br>\
         <input id=\"key\" name=\"key\" type=\"password\" autocomplete=\"current-password\" size=\"50\" autofocus required></p>\
         <p><button type=\"submit\" id=\"login\">Sign in</button></p></form></main>",
    );
    html(status, "sandpit review: sign in", &b)
}

fn header_bar(b: &mut String, who: &Who, csrf: &str) {
    let _ = write!(
        b,
        "<header><form method=\"post\" action=\"/review/logout\"><a href=\"/review\">All tasks</a> · \
         signed in as <b>{}</b> <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <button type=\"submit\">Sign out</button></form></header>",
        esc(&who.label()),
        esc(csrf)
    );
}

fn state_badge(s: ReviewState) -> String {
    let class = serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    format!("<span class=\"state {class}\">{}</span>", s.words())
}

/// Form of `POST /review/login`.
#[derive(Deserialize)]
pub(crate) struct LoginForm {
    key: String,
}

/// `POST /review/login`.
pub(crate) async fn login(State(s): State<ApiState>, Form(f): Form<LoginForm>) -> Response {
    let Some(who) = who_is(&s, f.key.trim()) else {
        metrics::counter!("sandpit_api_auth_failures_total").increment(1);
        return login_page(
            StatusCode::UNAUTHORIZED,
            Some("That key is neither the admin key nor a reviewer key."),
        );
    };
    let now = Instant::now();
    SESSIONS.retain(|_, v| v.expires > now);
    if SESSIONS.len() >= SESSIONS_MAX {
        return login_page(
            StatusCode::SERVICE_UNAVAILABLE,
            Some("Too many sessions; try again later."),
        );
    }
    let id = crate::auth::new_secret();
    SESSIONS.insert(
        id.clone(),
        Session {
            who,
            csrf: crate::auth::new_secret(),
            expires: now + SESSION_TTL,
        },
    );
    let mut r = see_other("/review");
    let cookie = format!(
        "{COOKIE}={id}; Path=/review; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_TTL.as_secs()
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// Form carrying only the CSRF token.
#[derive(Deserialize)]
pub(crate) struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /review/logout`.
pub(crate) async fn logout(headers: HeaderMap, Form(f): Form<CsrfForm>) -> Response {
    if checked(&headers, &f.csrf).is_some() {
        if let Some(id) = cookie_value(&headers) {
            SESSIONS.remove(&id);
        }
    }
    let mut r = see_other("/review");
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "sandpit_review=; Path=/review; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    r
}

/// `GET /review/{id}` (`?table=&page=` pages a table's rows, `?log=all&after=` the log).
pub(crate) async fn token(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Response {
    let Some((who, csrf)) = session(&headers) else {
        return login_page(StatusCode::UNAUTHORIZED, Some("Sign in first."));
    };
    // A query that does not parse is ignored: the page as if none was given.
    let q = q.map(|Query(q)| q).unwrap_or_default();
    token_page(&s, &id, &who, &csrf, None, StatusCode::OK, &q).await
}

/// The default target (shown without its password), while a promotion or dry run is
/// possible.
async fn default_target(
    s: &ApiState,
    rec: &TokenRecord,
    r: &ReviewRecord,
) -> Option<Result<Resolved, promote::PromoteError>> {
    if !matches!(r.state, ReviewState::Approved | ReviewState::NeedsReview) {
        return None;
    }
    let kept = r
        .capture
        .as_ref()
        .and_then(|c| c.source_conninfo.as_deref());
    Some(
        resolve::resolve(
            &s.gw.config.promote,
            s.gw.provider.as_ref(),
            rec.golden.as_deref(),
            kept,
            &PromoteRequest::default(),
            &Who::Admin,
        )
        .await,
    )
}

/// The page's title, state line, the outcome of the form just posted, and a warning when the
/// end-of-token review is missing.
fn title(b: &mut String, rec: &TokenRecord, state: ReviewState, msg: Option<(bool, String)>) {
    let _ = write!(
        b,
        "<main><h1>Task {} <small>token <code>{}</code></small></h1>\
         <p>Review: {} · token {} · golden {}</p>",
        show(&rec.task),
        esc(&rec.id),
        state_badge(state),
        esc(rec.state.as_str()),
        esc(rec.golden.as_deref().unwrap_or("–"))
    );
    if let Some((ok, m)) = msg {
        let _ = write!(
            b,
            "<p id=\"message\" class=\"msg{}\" role=\"{}\">{}</p>",
            if ok { "" } else { " err" },
            if ok { "status" } else { "alert" },
            esc(&m)
        );
    }
    if let Some(why) = crate::registry::end::review_status(rec).filter(|v| v != "stored") {
        let _ = write!(
            b,
            "<p id=\"review-missing\" class=\"msg err\" role=\"alert\">End-of-token review {}: \
             nothing below is a review of this token's change, and approval is refused.</p>",
            show(&why)
        );
    }
}

/// One task's page, top to bottom in the order a decision needs: why, whether it can be
/// promoted (with a dry run), what changed, validators, the decision, the promotion, then
/// the statement log, the patch and the audit trail.
async fn token_page(
    s: &ApiState,
    id: &str,
    who: &Who,
    csrf: &str,
    msg: Option<(bool, String)>,
    status: StatusCode,
    q: &PageQuery,
) -> Response {
    let Some(rec) = s.gw.registry.get(id) else {
        return html(
            StatusCode::NOT_FOUND,
            "unknown token",
            "<p>Unknown token. <a href=\"/review\">All tasks</a></p>",
        );
    };
    let r = promote::record(&s.gw, &rec).unwrap_or_default();
    let stored = stored_review(s, &rec);
    let dir = reviews_dir(&s.gw.config);
    let change = promote::change::load(&dir, &rec.task, &rec.id);
    let blockers = if rec.state.is_usable() {
        Vec::new()
    } else {
        approval_blockers(s, &rec, &r, stored.as_ref())
    };
    let target = default_target(s, &rec, &r).await;
    let mut b = String::new();
    header_bar(&mut b, who, csrf);
    title(&mut b, &rec, r.state, msg);
    decision::why_section(&mut b, &rec);
    let may_promote = *who == Who::Admin || s.gw.config.promote.reviewers_may_promote;
    let p = decision::Promotability {
        rec: &rec,
        r: &r,
        stored: stored.as_ref(),
        change: change.as_ref(),
        blockers: &blockers,
        csrf,
        may_promote,
        default_target: target.as_ref(),
    };
    decision::promotability_section(&mut b, s, &p);
    let complete = r.capture.as_ref().is_some_and(|c| c.complete);
    changes::review_section(
        &mut b,
        &rec.id,
        stored.as_ref(),
        change.as_ref().filter(|_| complete),
        q,
    );
    validators_section(&mut b, &r);
    decision::decision_section(&mut b, &rec, &r, stored.as_ref(), &blockers, csrf);
    promote_section(
        &mut b,
        s,
        &r,
        csrf,
        target.as_ref().filter(|_| r.state == ReviewState::Approved),
    );
    let place = s.gw.config.log_place();
    changes::log_section(&mut b, &place, &rec, stored.as_ref(), q);
    if let Some(review) = &stored {
        changes::patch_section(&mut b, review);
    }
    trail_section(&mut b, &r);
    b.push_str("</main>");
    html(status, &format!("sandpit review: {}", rec.task), &b)
}

/// Form of `POST /review/{id}/decide`.
#[derive(Deserialize)]
pub(crate) struct DecideForm {
    #[serde(default)]
    csrf: String,
    decision: String,
    #[serde(default)]
    comment: String,
}

/// `POST /review/{id}/decide`.
pub(crate) async fn decide(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<DecideForm>,
) -> Response {
    let Some(who) = checked(&headers, &f.csrf) else {
        return login_page(
            StatusCode::FORBIDDEN,
            Some("Your session ended or the form is stale: sign in again."),
        );
    };
    let csrf = f.csrf;
    let d = match f.decision.as_str() {
        "approve" => Decision::Approve,
        "reject" => Decision::Reject,
        _ => {
            return token_page(
                &s,
                &id,
                &who,
                &csrf,
                Some((false, "unknown decision".into())),
                StatusCode::BAD_REQUEST,
                &PageQuery::default(),
            )
            .await
        }
    };
    let Some(rec) = s.gw.registry.get(&id) else {
        return html(
            StatusCode::NOT_FOUND,
            "unknown token",
            "<p>Unknown token.</p>",
        );
    };
    match decide_once(&s, &rec, d, &f.comment, &who) {
        Ok(r) => {
            token_page(
                &s,
                &id,
                &who,
                &csrf,
                Some((true, format!("Recorded: {}.", r.state.words()))),
                StatusCode::OK,
                &PageQuery::default(),
            )
            .await
        }
        Err(e) => {
            let status = super::promote::promote_error_status(&e);
            token_page(
                &s,
                &id,
                &who,
                &csrf,
                Some((false, e.to_string())),
                status,
                &PageQuery::default(),
            )
            .await
        }
    }
}

/// Form of `POST /review/{id}/promote`.
#[derive(Deserialize)]
pub(crate) struct PromoteForm {
    #[serde(default)]
    csrf: String,
    /// Empty: the default target.
    #[serde(default)]
    target: String,
    #[serde(default)]
    dry_run: Option<String>,
}

/// `POST /review/{id}/promote` (named targets, or the default one).
pub(crate) async fn promote(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<PromoteForm>,
) -> Response {
    let Some(who) = checked(&headers, &f.csrf) else {
        return login_page(
            StatusCode::FORBIDDEN,
            Some("Your session ended or the form is stale: sign in again."),
        );
    };
    let Some(rec) = s.gw.registry.get(&id) else {
        return html(
            StatusCode::NOT_FOUND,
            "unknown token",
            "<p>Unknown token.</p>",
        );
    };
    let req = PromoteRequest {
        dsn: None,
        target: Some(f.target).filter(|t| !t.is_empty()),
        role: None,
        dry_run: f.dry_run.is_some(),
    };
    match promote::promote(&s.gw, &rec, &req, &who).await {
        Ok((rep, _)) => {
            let ok = rep.outcome == "applied" || rep.outcome == "dry_run";
            let m = match rep.outcome.as_str() {
                "applied" => format!("Promoted to {}.", rep.target),
                "dry_run" => format!(
                    "Dry run on {}: the change would apply; nothing was committed.",
                    rep.target
                ),
                "conflicts" => format!(
                    "{} conflicts on {}: nothing applied.",
                    rep.conflicts_total, rep.target
                ),
                "refused" => format!("Refused: {}", rep.refusals.join("; ")),
                _ => format!("Failed: {}", rep.error.unwrap_or_default()),
            };
            token_page(
                &s,
                &id,
                &who,
                &f.csrf,
                Some((ok, m)),
                StatusCode::OK,
                &PageQuery::default(),
            )
            .await
        }
        Err(e) => {
            let status = super::promote::promote_error_status(&e);
            token_page(
                &s,
                &id,
                &who,
                &f.csrf,
                Some((false, e.to_string())),
                status,
                &PageQuery::default(),
            )
            .await
        }
    }
}

//! The change kept for promotion: when a token ends, a second diff of its scratch database
//! against the golden that holds every changed row (the stored review keeps only samples),
//! bounded by `promote.max_rows`, with the golden's masked columns. Kept next to the review
//! as `<token>.change.json` (mode 0600: it quotes data).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::decisions::{write_private, CaptureInfo};
use crate::config::Config;
use crate::pgconn::BackendTarget;
use crate::provider::{Provider, ProviderError};
use crate::registry::TokenRecord;
use crate::review::diff::{self, DiffOptions};
use crate::review::model::Review;
use crate::review::store::Format;

/// A captured change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Change {
    /// Masked columns of the golden, `schema.table.column`.
    pub masked: Vec<String>,
    /// The diff, every changed row in its samples (when complete).
    pub review: Review,
    /// Why it cannot be promoted, found when the token ended ([`super::promotable`]).
    #[serde(default)]
    pub refusals: Vec<String>,
    /// Columns it drops (table, column) and the hash of their values in the golden
    /// ([`super::plan::column_hash_sql`]).
    #[serde(default)]
    pub dropped_columns: Vec<(String, String, String)>,
    /// Tables without a key whose rows it deletes: (table, hash query, the hash in the
    /// golden) ([`super::plan::Plan::multiset_guards`]).
    #[serde(default)]
    pub multiset_guards: Vec<(String, String, String)>,
}

/// The whole-table hash of every keyless table whose rows `review` deletes, read from the
/// golden's reference over the columns the plan compares.
async fn multiset_hashes(
    reference: &BackendTarget,
    review: &Review,
    masked: &[String],
    timeout: std::time::Duration,
) -> Result<Vec<(String, String, String)>, String> {
    let masked: super::plan::Masked = masked.iter().cloned().collect();
    let plan = super::plan::build(review, &masked);
    let wanted: Vec<(String, String)> = plan
        .tables
        .iter()
        .filter(|t| t.multiset && !t.deletes.is_empty())
        .map(|t| {
            let cols: Vec<String> = t.guard.iter().map(|&i| t.columns[i].clone()).collect();
            (t.table.clone(), super::multiset::hash_sql(&t.table, &cols))
        })
        .collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let t = crate::review::conn::Timeouts {
        statement: timeout,
        lock: timeout,
    };
    let side = crate::review::conn::Side::connect("golden", reference, t)
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (table, sql) in wanted {
        let r = side.rows(&sql).await.map_err(|e| {
            format!("table {table} has no key and its golden rows could not be read ({e})")
        })?;
        let h = r.first().and_then(|r| r[0].clone()).unwrap_or_default();
        out.push((table, sql, h));
    }
    Ok(out)
}

/// The hash of every column `review` drops, read from the golden's reference.
async fn dropped_column_hashes(
    reference: &BackendTarget,
    review: &Review,
    timeout: std::time::Duration,
) -> Result<Vec<(String, String, String)>, String> {
    use crate::review::model::Action;
    let dropped: Vec<(String, String)> = review
        .schema
        .iter()
        .filter(|c| c.kind == "column" && c.action == Action::Dropped)
        .filter_map(|c| super::names::parent_and_last(&c.object).map(|(t, k)| (t, k.quoted)))
        .collect();
    if dropped.is_empty() {
        return Ok(Vec::new());
    }
    let t = crate::review::conn::Timeouts {
        statement: timeout,
        lock: timeout,
    };
    let side = crate::review::conn::Side::connect("golden", reference, t)
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (table, col) in dropped {
        let r = side
            .rows(&super::plan::column_hash_sql(&table, &col))
            .await
            .map_err(|e| e.to_string())?;
        let h = r.first().and_then(|r| r[0].clone()).unwrap_or_default();
        out.push((table, col, h));
    }
    Ok(out)
}

/// Path of a token's captured change.
pub fn path(dir: &Path, task: &str, token: &str) -> PathBuf {
    dir.join(task).join(format!("{token}.change.json"))
}

/// The captured change, if one was kept.
pub fn load(dir: &Path, task: &str, token: &str) -> Option<Change> {
    let b = std::fs::read(path(dir, task, token)).ok()?;
    serde_json::from_slice(&b).ok()
}

/// What golden version `golden`'s masking did, from its build report: the masked columns
/// (`schema.table.column`) and every value it produced.
#[derive(Debug, Default)]
pub struct Masking {
    /// Masked columns.
    pub columns: Vec<String>,
    /// Values the masking produced (fakes; searched for in written values).
    pub values: Vec<String>,
}

/// Read once per capture. Fails closed: a provider that keeps golden versions but cannot
/// say what the token's one masked is an error, never "nothing was masked". Providers
/// without golden versions (`template`, `remote`) build no masked goldens.
pub async fn masking(
    provider: &dyn Provider,
    golden: Option<&str>,
) -> Result<Masking, ProviderError> {
    let Some(g) = golden else {
        return Ok(Masking::default());
    };
    let Some(versions) = provider.versions() else {
        return Ok(Masking::default());
    };
    let all = versions.goldens().await?;
    let report = &all
        .iter()
        .find(|v| v.id == g)
        .ok_or_else(|| ProviderError::NotFound(format!("golden version {g}")))?
        .report;
    let strings = |key: &str| -> Vec<&str> {
        report
            .get(key)
            .and_then(|m| m.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default()
    };
    Ok(Masking {
        columns: strings("masked")
            .into_iter()
            .map(|s| s.split_once(": ").map_or(s, |x| x.0).to_string())
            .collect(),
        values: strings("masked_values")
            .into_iter()
            .map(str::to_string)
            .collect(),
    })
}

/// Take and store the change of `rec`, whose scratch database the review reaches as
/// `scratch`.
pub async fn capture(
    cfg: &Config,
    provider: &dyn Provider,
    rec: &TokenRecord,
    scratch: &BackendTarget,
    dir: &Path,
) -> CaptureInfo {
    let max = cfg.promote.max_rows;
    let mut info = CaptureInfo {
        source_conninfo: super::resolve::golden_source(provider, rec.golden.as_deref()).await,
        ..Default::default()
    };
    let Masking {
        columns: masked,
        values,
    } = match masking(provider, rec.golden.as_deref()).await {
        Ok(m) => m,
        Err(e) => {
            info.reason = Some(format!(
                "what the golden's masking produced is unknown: {e}"
            ));
            return info;
        }
    };
    info.masked = masked.clone();
    let reference = match provider.reference(rec.golden.as_deref()).await {
        Ok(r) => r,
        Err(e) => {
            info.reason = Some(format!("no reference of the golden: {e}"));
            return info;
        }
    };
    let opts = DiffOptions {
        statement_timeout: cfg.review.statement_timeout,
        settle_timeout: cfg.review.settle_timeout,
        samples: max.saturating_add(1),
        // Only tables that may differ from the golden, on evidence the agent cannot forge
        // (`review::touched`); a full read whenever that evidence is missing, or when the
        // agent was a superuser (who could forge it).
        full_scan: rec.superuser,
        end_sessions: false,
        ..DiffOptions::default()
    };
    let mut review = match diff::diff(&reference.target, scratch, opts, &rec.id, &rec.task).await {
        Ok(r) => r,
        Err(e) => {
            info.reason = Some(format!("the diff failed: {e}"));
            return info;
        }
    };
    info.rows = review
        .data
        .iter()
        .map(|t| t.inserted + t.updated + t.deleted)
        .sum();
    info.schema_changes = review.schema.len();
    if info.rows > max as u64 {
        info.reason = Some(format!(
            "{} changed rows, more than promote.max_rows ({max})",
            info.rows
        ));
        // Only counts are kept: the rows could not all be held.
        for t in &mut review.data {
            t.samples = Default::default();
        }
    } else {
        info.complete = true;
    }
    let stored = crate::review::store::load(dir, &rec.task, &rec.id, Format::Json)
        .and_then(|j| serde_json::from_str::<Review>(&j).ok());
    let refusals = if info.complete {
        super::promotable::refusals(
            &review,
            stored.as_ref(),
            &masked,
            &values,
            scratch,
            cfg.review.statement_timeout,
        )
        .await
    } else {
        Vec::new()
    };
    let dropped_columns =
        match dropped_column_hashes(&reference.target, &review, cfg.review.statement_timeout).await
        {
            Ok(d) => d,
            Err(e) => {
                info.complete = false;
                info.reason = Some(format!("reading the golden's dropped columns: {e}"));
                Vec::new()
            }
        };
    let mut refusals = refusals;
    let multiset_guards = if info.complete {
        match multiset_hashes(
            &reference.target,
            &review,
            &masked,
            cfg.review.statement_timeout,
        )
        .await
        {
            Ok(m) => m,
            Err(e) => {
                refusals.push(e);
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    info.refusals = refusals.clone();
    let change = Change {
        masked,
        review,
        refusals,
        dropped_columns,
        multiset_guards,
    };
    let p = path(dir, &rec.task, &rec.id);
    let bytes = serde_json::to_vec(&change).unwrap_or_default();
    if let Err(e) = write_private(dir, &rec.task, &p, &bytes) {
        info.complete = false;
        info.reason = Some(format!("writing {}: {e}", p.display()));
    }
    info
}

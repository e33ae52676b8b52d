//! Every metric docs/operations.md's metrics table documents is in `/metrics` right after start, so a
//! dashboard or an alert (`increase()`, `absent()`) sees a series before the first event.

use crate::support::harness;

use std::collections::BTreeSet;
use std::path::Path;

use crate::support::harness::{Gateway, SMALL_GOLDEN};

/// Metric names in docs/operations.md's metrics table (the same parse as tests/checks/docs.rs).
fn documented_metrics() -> BTreeSet<String> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"))
            .expect("docs/operations.md");
    let section = doc
        .split("\n### Metrics\n")
        .nth(1)
        .and_then(|s| s.split("\n### ").next())
        .expect("docs/operations.md has a Metrics section");
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

/// (series, value) of an exposition, `name{labels}` as the key.
fn series(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The metric a series belongs to: labels and histogram/summary suffixes taken off.
fn metric_of(series: &str) -> &str {
    let name = series.split('{').next().unwrap_or(series);
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .filter(|base| !base.ends_with("_total"))
        .unwrap_or(name)
}

/// Labelled by the fork method (copy, reflink, … : the provider's and the filesystem's),
/// known only at the first fork; docs/operations.md says so.
const AT_FIRST_FORK: [&str; 2] = ["sandpit_fork_seconds", "sandpit_forks_total"];

fn scrape(g: &Gateway) -> String {
    harness::http_ok(
        "GET",
        &format!("{}/metrics", g.api),
        None,
        harness::Body::None,
    )
    .expect("GET /metrics")
    .body
}

fn missing(text: &str, wanted: &BTreeSet<String>) -> Vec<String> {
    let all = series(text);
    let exported: BTreeSet<&str> = all.iter().map(|(k, _)| metric_of(k)).collect();
    wanted
        .iter()
        .filter(|m| !exported.contains(m.as_str()))
        .cloned()
        .collect()
}

#[test]
fn every_documented_metric_is_exported_from_start() {
    let g = Gateway::start(Some(SMALL_GOLDEN), None);
    let text = scrape(&g);
    let all = series(&text);
    let documented = documented_metrics();
    assert!(documented.len() >= 40, "{documented:?}");
    let missing_now = missing(&text, &documented);
    assert_eq!(
        missing_now, AT_FIRST_FORK,
        "not in /metrics after start\n{text}"
    );
    // The ones the issue found absent, each at zero with its documented labels.
    for (series_name, value) in [
        ("sandpit_auth_failures_total{reason=\"wrong_secret\"}", 0.0),
        ("sandpit_cancel_requests_total{result=\"forwarded\"}", 0.0),
        ("sandpit_denied_statements_total{kind=\"write\"}", 0.0),
        ("sandpit_mcp_requests_total{transport=\"http\"}", 0.0),
        ("sandpit_pool_ready", 0.0),
        ("sandpit_pool_target", 0.0),
        (
            "sandpit_protocol_violations_total{kind=\"client_frame\"}",
            0.0,
        ),
        ("sandpit_validator_runs_total{result=\"fail\"}", 0.0),
    ] {
        let got = all.iter().find(|(k, _)| k == series_name).map(|(_, v)| *v);
        assert_eq!(got, Some(value), "{series_name}\n{text}");
    }
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"))
            .expect("docs/operations.md");
    assert!(
        doc.contains("`sandpit_forks_total` and `sandpit_fork_seconds` appear with the first fork")
    );
    // The first fork brings the two.
    let t = g.issue("metrics-at-start", 600);
    let (ok, out, err) = harness::psql(t["dsn"].as_str().expect("dsn"), &["-c", "select 1"]);
    assert!(ok, "{out}{err}");
    let text = scrape(&g);
    assert_eq!(missing(&text, &documented), Vec::<String>::new(), "{text}");
}

/// Every `"key" => "literal"` label the code records is one of the zero series the table
/// (control::METRICS) creates at start, so a new label value cannot be left out of it.
#[test]
fn every_literal_label_value_in_the_code_is_created_at_start() {
    fn walk(dir: &Path, out: &mut Vec<(String, String, String)>) {
        for e in std::fs::read_dir(dir).expect("read src").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let src = std::fs::read_to_string(&p).expect("read source");
                for mac in ["counter!(", "gauge!(", "histogram!("] {
                    for (i, _) in src.match_indices(mac) {
                        let call = &src[i + mac.len()..];
                        let call = &call[..call.find(')').unwrap_or(call.len())];
                        let parts: Vec<&str> = call.split('"').collect();
                        // name, `, `, key, ` => `, value: all literals.
                        if parts.len() >= 6 && parts[4].trim() == "=>" {
                            out.push((parts[1].into(), parts[3].into(), parts[5].into()));
                        }
                    }
                }
            }
        }
    }
    let mut used = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut used,
    );
    // Values computed at run time (a statement kind, an auth error's reason) are not seen here;
    // the table lists those from their enums.
    assert!(used.len() >= 5, "{used:?}");
    for (name, key, value) in used {
        let (_, _, _, zeros) = sandpit::control::METRICS
            .iter()
            .find(|m| m.0 == name)
            .unwrap_or_else(|| panic!("{name} not in control::METRICS"));
        assert!(
            zeros.iter().any(|l| l == &[(key.as_str(), value.as_str())]),
            "{name}{{{key}=\"{value}\"}} is recorded but not created at start"
        );
    }
}

//! What docs/api.yaml promises (every route with its request, query, header and response
//! fields) and the drift check of an SDK's `surface()` against it.

pub mod yaml;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Routes the SDKs leave out on purpose: the browser's review pages (HTML forms with a session
/// cookie and CSRF token; the SDKs use the /v1 JSON calls of the same actions) and a method
/// the server only refuses. Exact (method, path) pairs: a new route is never excused here.
pub const BROWSER_ONLY: &[(&str, &str)] = &[
    ("GET", "/review"),
    ("POST", "/review/login"),
    ("POST", "/review/logout"),
    ("GET", "/review/{id}"),
    ("POST", "/review/{id}/decide"),
    ("POST", "/review/{id}/promote"),
    ("GET", "/mcp"),
];

/// One operation of the API (or of an SDK's surface).
#[derive(Debug, Default, Clone)]
pub struct Op {
    pub request: BTreeSet<String>,
    pub query: BTreeSet<String>,
    pub headers: BTreeSet<String>,
    pub response: BTreeSet<String>,
}

const METHODS: &[&str] = &["get", "post", "put", "patch", "delete", "head", "options"];

/// Every operation of the OpenAPI document `doc`, by (METHOD, path).
pub fn api_ops(doc: &Value) -> BTreeMap<(String, String), Op> {
    let mut out = BTreeMap::new();
    let Some(paths) = doc["paths"].as_object() else {
        return out;
    };
    for (path, item) in paths {
        let shared = item["parameters"].as_array().cloned().unwrap_or_default();
        for m in METHODS {
            let op = &item[*m];
            if op.is_null() {
                continue;
            }
            let mut o = Op::default();
            let own = op["parameters"].as_array().cloned().unwrap_or_default();
            for p in shared.iter().chain(own.iter()) {
                let p = resolve(doc, p);
                let name = p["name"].as_str().unwrap_or_default().to_string();
                match p["in"].as_str() {
                    Some("query") => o.query.insert(name),
                    Some("header") => o.headers.insert(name),
                    _ => false,
                };
            }
            let body = &resolve(doc, &op["requestBody"])["content"]["application/json"]["schema"];
            fields(doc, body, "", &mut o.request, 0);
            if let Some(rs) = op["responses"].as_object() {
                for (code, r) in rs {
                    if code.starts_with('2') {
                        let s = &resolve(doc, r)["content"]["application/json"]["schema"];
                        fields(doc, s, "", &mut o.response, 0);
                    }
                }
            }
            out.insert((m.to_uppercase(), path.clone()), o);
        }
    }
    out
}

/// `v`, or what its `$ref` (`#/a/b/c`) points at.
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v["$ref"].as_str().and_then(|r| r.strip_prefix("#/")) {
        Some(r) => r.split('/').fold(doc, |node, k| &node[k]),
        None => v,
    }
}

/// Property names of `schema` (nested objects' as `outer.inner`), through refs and arrays.
fn fields(doc: &Value, schema: &Value, prefix: &str, out: &mut BTreeSet<String>, depth: usize) {
    if depth > 8 {
        return;
    }
    let s = resolve(doc, schema);
    if let Some(items) = s.get("items") {
        fields(doc, items, prefix, out, depth + 1);
    }
    for k in ["allOf", "oneOf", "anyOf"] {
        for sub in s[k].as_array().into_iter().flatten() {
            fields(doc, sub, prefix, out, depth + 1);
        }
    }
    if let Some(props) = s["properties"].as_object() {
        for (name, p) in props {
            out.insert(format!("{prefix}{name}"));
            fields(doc, p, &format!("{prefix}{name}."), out, depth + 1);
        }
    }
}

/// An SDK's `surface()` output as operations by (METHOD, path).
pub fn sdk_ops(surface: &Value) -> BTreeMap<(String, String), Op> {
    let set = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect()
    };
    let mut out = BTreeMap::new();
    for r in surface.as_array().into_iter().flatten() {
        let key = (
            r["method"].as_str().unwrap_or_default().to_string(),
            r["path"].as_str().unwrap_or_default().to_string(),
        );
        out.insert(
            key,
            Op {
                request: set(&r["request"]),
                query: set(&r["query"]),
                headers: set(&r["headers"]),
                response: set(&r["response"]),
            },
        );
    }
    out
}

/// Everything `api` has that `sdk` lacks, one line each (empty: no drift).
pub fn drift(
    api: &BTreeMap<(String, String), Op>,
    sdk: &BTreeMap<(String, String), Op>,
) -> Vec<String> {
    let mut gaps = Vec::new();
    for ((m, p), want) in api {
        if BROWSER_ONLY.contains(&(m.as_str(), p.as_str())) {
            continue;
        }
        let Some(have) = sdk.get(&(m.clone(), p.clone())) else {
            gaps.push(format!("route {m} {p}"));
            continue;
        };
        for (what, w, h) in [
            ("request field", &want.request, &have.request),
            ("query parameter", &want.query, &have.query),
            ("header", &want.headers, &have.headers),
            ("response field", &want.response, &have.response),
        ] {
            for f in w.difference(h) {
                gaps.push(format!("{m} {p}: {what} {f}"));
            }
        }
    }
    for (m, p) in sdk.keys() {
        if !api.contains_key(&(m.clone(), p.clone())) {
            gaps.push(format!("route {m} {p} is not in docs/api.yaml"));
        }
    }
    gaps
}

//! MCP (Model Context Protocol) server mode: the same scratch database, offered to an agent
//! stack as tools instead of a DSN. JSON-RPC 2.0 handling lives here; the transports are
//! [`stdio`] (`sandpit mcp`) and [`http`] (`POST /mcp` on the control API). The tools run
//! SQL through the gateway's own Postgres listener with one token ([`sql`]), so caps, the
//! statement log and the seatbelt policy apply exactly as to any other client.

pub mod http;
pub mod review;
pub mod sql;
pub mod stdio;

use serde_json::{json, Value};

use review::ReviewSource;
use sql::{Outcome, SqlTarget};

/// Protocol versions this server speaks, newest first; the first is offered when a client
/// asks for one it does not know.
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-06-18", "2025-03-26"];

/// The tools offered, by name. Tests and docs check against this list. `review_changes`
/// is listed only where a review can be had (always over HTTP; on stdio with an API URL).
pub const TOOL_NAMES: &[&str] = &["run_sql", "describe_schema", "review_changes"];

/// JSON-RPC error codes (JSON-RPC 2.0 section 5.1).
mod code {
    pub const PARSE: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
}

/// The protocol version to answer an `initialize` with: the client's when supported, else
/// the newest this server has (the client then decides whether to go on).
pub fn negotiate(requested: Option<&str>) -> &'static str {
    PROTOCOL_VERSIONS
        .iter()
        .find(|v| Some(**v) == requested)
        .copied()
        .unwrap_or(PROTOCOL_VERSIONS[0])
}

/// The `tools/list` result; `review` says whether `review_changes` is offered.
pub fn tools_list(review: bool) -> Value {
    let mut tools = vec![
        json!({
            "name": "run_sql",
            "title": "Run SQL",
            "description": "Run SQL (one or more statements) against this task's own scratch \
                PostgreSQL database, a throwaway copy of the real one. Returns each result as a \
                text table with a row count. Large results are cut by the gateway and a notice \
                says so: ask for fewer rows (LIMIT, WHERE, aggregates) instead.",
            "inputSchema": {
                "type": "object",
                "properties": { "sql": { "type": "string", "description": "The SQL to run." } },
                "required": ["sql"],
                "additionalProperties": false
            }
        }),
        json!({
            "name": "describe_schema",
            "title": "Describe schema",
            "description": "List the tables of the scratch database with their columns, types, \
                primary keys and foreign keys.",
            "inputSchema": { "type": "object", "properties": {}, "additionalProperties": false }
        }),
    ];
    if review {
        tools.push(json!({
            "name": "review_changes",
            "title": "Review changes",
            "description": "Show what has been changed in the scratch database so far, compared \
                with the original: schema changes and rows inserted, updated or deleted per \
                table, with samples, and a summary of the statements run. Nothing is applied \
                anywhere; this is what a person will review.",
            "inputSchema": { "type": "object", "properties": {}, "additionalProperties": false }
        }));
    }
    json!({ "tools": tools })
}

fn error_response(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message.into() } })
}

fn result_response(id: Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// A tool result as MCP wants it: one text block, `isError` set for SQL errors.
fn tool_result(o: Outcome) -> Value {
    json!({ "content": [{ "type": "text", "text": o.text }], "isError": o.is_error })
}

/// One MCP server bound to one token (the [`SqlTarget`]). Transport-independent.
pub struct McpServer {
    target: SqlTarget,
    review: Option<ReviewSource>,
}

impl McpServer {
    /// A server whose tools run as the token behind `target` (no `review_changes`).
    pub fn new(target: SqlTarget) -> McpServer {
        McpServer {
            target,
            review: None,
        }
    }

    /// A server that also offers `review_changes`, from `review`.
    pub fn with_review(target: SqlTarget, review: ReviewSource) -> McpServer {
        McpServer {
            target,
            review: Some(review),
        }
    }

    /// Handle one parsed JSON-RPC message or batch. Returns the response to send, or None
    /// for notifications and responses (which get no answer).
    pub async fn handle(&self, msg: Value) -> Option<Value> {
        match msg {
            Value::Array(items) => {
                if items.is_empty() {
                    return Some(error_response(
                        Value::Null,
                        code::INVALID_REQUEST,
                        "empty batch",
                    ));
                }
                let mut out = Vec::new();
                for m in items {
                    if let Some(r) = Box::pin(self.handle_one(m)).await {
                        out.push(r);
                    }
                }
                (!out.is_empty()).then_some(Value::Array(out))
            }
            m => self.handle_one(m).await,
        }
    }

    /// Handle raw bytes (one line of stdio, or an HTTP body).
    pub async fn handle_bytes(&self, bytes: &[u8]) -> Option<Value> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(v) => self.handle(v).await,
            Err(e) => Some(error_response(
                Value::Null,
                code::PARSE,
                format!("parse error: {e}"),
            )),
        }
    }

    async fn handle_one(&self, msg: Value) -> Option<Value> {
        let Value::Object(obj) = msg else {
            return Some(error_response(
                Value::Null,
                code::INVALID_REQUEST,
                "not a JSON-RPC object",
            ));
        };
        let id = obj.get("id").cloned();
        let method = obj.get("method").and_then(Value::as_str);
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return id
                .map(|id| error_response(id, code::INVALID_REQUEST, "jsonrpc must be \"2.0\""));
        }
        let Some(method) = method else {
            // A response from the client (we send no requests) or garbage without a method.
            if obj.contains_key("result") || obj.contains_key("error") {
                return None;
            }
            return Some(error_response(
                id.unwrap_or(Value::Null),
                code::INVALID_REQUEST,
                "missing method",
            ));
        };
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        // Notifications (no id) never get an answer, whatever they are.
        let id = id?;
        tracing::debug!(method, "mcp request");
        let r = match method {
            "initialize" => Ok(self.initialize(&params)),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(tools_list(self.review.is_some())),
            "tools/call" => self.call_tool(&params).await,
            other => Err((code::METHOD_NOT_FOUND, format!("method not found: {other}"))),
        };
        Some(match r {
            Ok(v) => result_response(id, v),
            Err((c, m)) => error_response(id, c, m),
        })
    }

    fn initialize(&self, params: &Value) -> Value {
        let asked = params.get("protocolVersion").and_then(Value::as_str);
        json!({
            "protocolVersion": negotiate(asked),
            "capabilities": { "tools": { "listChanged": false } },
            "serverInfo": { "name": "sandpit", "version": env!("CARGO_PKG_VERSION") },
            "instructions": "Tools run SQL against this task's own throwaway copy of the \
                database; nothing you run reaches the real one. Results are capped per statement."
        })
    }

    async fn call_tool(&self, params: &Value) -> Result<Value, (i64, String)> {
        let name = params.get("name").and_then(Value::as_str).ok_or((
            code::INVALID_PARAMS,
            "tools/call needs a tool name".to_string(),
        ))?;
        let args = match params.get("arguments") {
            None | Some(Value::Null) => serde_json::Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => return Err((code::INVALID_PARAMS, "arguments must be an object".into())),
        };
        match name {
            "run_sql" => {
                if let Some(k) = args.keys().find(|k| *k != "sql") {
                    return Err((
                        code::INVALID_PARAMS,
                        format!("run_sql takes only \"sql\", not {k:?}"),
                    ));
                }
                let sql = args.get("sql").and_then(Value::as_str).ok_or((
                    code::INVALID_PARAMS,
                    "run_sql needs \"sql\" (a string)".to_string(),
                ))?;
                Ok(tool_result(self.target.run(sql).await))
            }
            "describe_schema" => {
                if let Some(k) = args.keys().next() {
                    return Err((
                        code::INVALID_PARAMS,
                        format!("describe_schema takes no arguments, not {k:?}"),
                    ));
                }
                Ok(tool_result(self.target.run(sql::DESCRIBE_SCHEMA_SQL).await))
            }
            "review_changes" if self.review.is_some() => {
                if let Some(k) = args.keys().next() {
                    return Err((
                        code::INVALID_PARAMS,
                        format!("review_changes takes no arguments, not {k:?}"),
                    ));
                }
                match &self.review {
                    Some(r) => Ok(tool_result(r.changes().await)),
                    None => Err((code::INVALID_PARAMS, "unknown tool: review_changes".into())),
                }
            }
            other => Err((code::INVALID_PARAMS, format!("unknown tool: {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiates_supported_versions_and_falls_back_to_newest() {
        assert_eq!(negotiate(Some("2025-03-26")), "2025-03-26");
        assert_eq!(negotiate(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate(Some("2024-11-05")), "2025-06-18");
        assert_eq!(negotiate(None), "2025-06-18");
    }

    #[test]
    fn run_sql_has_exactly_one_field() {
        for (review, n) in [(true, 3), (false, 2)] {
            let t = tools_list(review);
            let tools = t["tools"].as_array().cloned().unwrap_or_default();
            let names: Vec<_> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
            assert_eq!(names, TOOL_NAMES[..n]);
        }
        let t = tools_list(true);
        let tools = t["tools"].as_array().cloned().unwrap_or_default();
        let schema = &tools[0]["inputSchema"];
        assert_eq!(schema["required"], json!(["sql"]));
        assert_eq!(schema["additionalProperties"], json!(false));
        assert_eq!(schema["properties"].as_object().map(|m| m.len()), Some(1));
    }
}

//! The records of a statement log as readers give them (one JSON object each, the same
//! whichever way the file stored them), and a statement paired with its outcome.

use serde::{Deserialize, Serialize};

/// One line of the log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum LogRecord {
    /// Written before the statement reaches the backend.
    Statement(StatementRecord),
    /// Written when its result is known.
    Outcome(OutcomeRecord),
}

/// A statement as the client sent it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StatementRecord {
    /// Sequence number within the token's log (unique per token).
    pub seq: u64,
    /// RFC 3339 time it was received.
    pub ts: String,
    /// Token id.
    pub token: String,
    /// Task name.
    pub task: String,
    /// Session number within the gateway process.
    pub session: u64,
    /// "simple", "extended" or "function".
    pub protocol: String,
    /// Statement text exactly as sent (lossy UTF-8 only if the client's bytes were not UTF-8).
    pub text: String,
    /// Bind parameters: text values capped in length, binary as `\x` + hex prefix, NULL as null.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<Option<String>>,
    /// read / write / ddl / transaction / privilege / utility / unparsed.
    pub kind: String,
}

/// How a statement ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutcomeRecord {
    /// The `seq` of its statement record.
    pub seq: u64,
    /// RFC 3339 time it completed.
    pub ts: String,
    /// Rows returned (SELECT, FETCH, RETURNING, COPY TO) or affected (INSERT/UPDATE/DELETE).
    pub rows: Option<u64>,
    /// Whether the result was cut by a cap.
    pub capped: bool,
    /// Wall time in milliseconds from forwarding to completion.
    pub duration_ms: f64,
    /// SQLSTATE when it failed.
    pub sqlstate: Option<String>,
    /// The command tag the client saw, when it succeeded.
    pub tag: Option<String>,
    /// Never ran: an earlier statement of the same query or pipeline failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// Refused by the token's seatbelt policy; it never reached the backend.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub denied: bool,
    /// The kind the server's command tags tell (`DELETE 10`: write), when they tell one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// The full length and digest of a statement text that was stored cut (see [`TEXT_MAX`](super::TEXT_MAX)).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TextCut {
    /// Length in bytes of the whole text.
    pub text_len: u64,
    /// SHA-256 of the whole text (hex).
    pub text_sha256: String,
}

/// A statement with its outcome (None if it never completed, e.g. the session died).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoggedStatement {
    /// The statement.
    #[serde(flatten)]
    pub statement: StatementRecord,
    /// Set when the stored text is only the first [`TEXT_MAX`](super::TEXT_MAX) bytes.
    #[serde(flatten)]
    pub cut: Option<TextCut>,
    /// Its outcome.
    pub outcome: Option<OutcomeRecord>,
    /// Where `kind` comes from: "server" (the command tags of its outcome) or "lexical"
    /// (a guess from the text: it never completed, or its tags do not tell). Set by the
    /// readers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind_source: Option<String>,
    /// The front whose file holds it, when the log is read from several fronts' files
    /// (then `seq` is its place in the merged log); absent for one gateway's log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub front: Option<String>,
    /// Its `seq` in that front's file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub front_seq: Option<u64>,
}

impl LoggedStatement {
    /// The kind the server's answer told, in place of the lexical guess when there is one.
    pub fn settle_kind(&mut self) {
        let told = self.outcome.as_ref().and_then(|o| o.kind.clone());
        self.kind_source = Some(match told {
            Some(k) => {
                self.statement.kind = k;
                "server".to_string()
            }
            None => "lexical".to_string(),
        });
    }
}

/// The kind a statement is counted as: what its outcome's tags told, else the lexical guess.
pub fn settled_kind(lexical: String, outcome: Option<&OutcomeRecord>) -> String {
    match outcome.and_then(|o| o.kind.clone()) {
        Some(k) => k,
        None => lexical,
    }
}

//! Tokens, SCRAM-SHA-256 server side, cleartext check.

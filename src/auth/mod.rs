//! Tokens, SCRAM-SHA-256 server side, cleartext check, the auth failure limiter.

pub mod ratelimit;
pub mod scram;
pub mod token;

pub use scram::{ScramError, ScramServer, ScramServerFirst};
pub use token::{
    is_token_id, new_secret, new_token_id, parse_full_token, ScramVerifier, TokenId, Verifier,
};

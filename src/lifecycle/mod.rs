//! lifecycle

//! The Postgres wire protocol, as far as the gateway needs it: bounded framing, startup
//! packets, and typed views parsed on demand from the raw bytes (which are what gets relayed).

pub mod frame;
pub mod messages;
pub mod scrub;
pub mod socket;
pub mod startup;

pub use frame::{Frame, FrameError, FrameReader};

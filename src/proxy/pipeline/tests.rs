//! Table tests of the pipeline: frames in, frames out, no I/O.

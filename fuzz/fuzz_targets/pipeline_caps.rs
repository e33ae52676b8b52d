//! cargo-fuzz target: see fuzz/src/targets.rs.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| sandpit_fuzz::pipeline_caps(data));

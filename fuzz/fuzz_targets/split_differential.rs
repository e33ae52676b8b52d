//! cargo-fuzz target: see fuzz/src/differential.rs.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| sandpit_fuzz::differential::split_differential(data));

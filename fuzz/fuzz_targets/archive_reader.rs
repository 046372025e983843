//! The run archive reader: `keel_archive::Archive::from_bytes`, then
//! `fold`, `points`, `materialize` and `owners` on what it decodes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::check_archive(data));

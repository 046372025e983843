//! The bundle loader: a `keel.toml` through `keel validate`'s checks
//! (`bundle_check::validate_text`) and `Bundle::from_text`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::check_bundle_toml(data));

//! The Anthropic Messages stream: SSE parser and typed-event decoder, fed
//! in arbitrary chunks (or as a JSON body), through
//! `keel_provider::anthropic::decode_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    keel_fuzz::check_provider_body(data, keel_provider::anthropic::decode_body);
});

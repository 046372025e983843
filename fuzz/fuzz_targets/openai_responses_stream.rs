//! The OpenAI Responses stream: SSE parser and typed-event decoder, fed in
//! arbitrary chunks (or as a JSON body), through
//! `keel_provider::openai_responses::decode_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    keel_fuzz::check_provider_body(data, keel_provider::openai_responses::decode_body);
});

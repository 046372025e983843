//! The OpenAI Chat Completions stream: SSE parser and chunk assembler, fed
//! in arbitrary chunks (or as a JSON body), through
//! `keel_provider::openai_chat::decode_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    keel_fuzz::check_provider_body(data, keel_provider::openai_chat::decode_body);
});

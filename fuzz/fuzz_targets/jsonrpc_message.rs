//! The JSON-RPC decoder of keel-server: one stdio line or WebSocket text
//! frame, through `keel_server::decode::decode_text`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::check_jsonrpc_text(data));

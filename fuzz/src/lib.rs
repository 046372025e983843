//! What keel's fuzz targets share: turning one fuzz input into the shape an
//! entry point takes (body chunks, archive frames) and the checks run on
//! what comes back.
//!
//! Each target in `fuzz_targets/` is one line calling a function here, so
//! the input conventions are documented once, below and in `README.md`.
//! A check that fails panics, which libFuzzer reports as a crash; so does
//! any panic inside keel.

use std::sync::Mutex;

use keel_archive::{Archive, Error as ArchiveError};
use keel_protocol::Item;
use keel_protocol::rpc::Response;
use keel_provider::{DeltaSink, ModelResponse, ProviderError, ResponseBody};
use keel_server::decode::{Incoming, Message, decode_text};
use serde_json::Value;

/// The first input byte that selects a whole `application/json` body
/// instead of an event stream: the `{` a JSON object starts with, so a
/// seed holding a plain JSON response is used as one.
const JSON_BODY: u8 = b'{';

/// The largest chunk for each value of the selector byte's low three bits;
/// `'0'`..`'7'` pick them in order, from one byte at a time to one chunk.
const MAX_CHUNK: [usize; 8] = [1, 2, 3, 5, 8, 64, 512, usize::MAX];

/// Splits `body` into non-empty chunks whose lengths a small xorshift
/// generator, seeded with `selector`, draws from `1..=MAX_CHUNK[selector & 7]`:
/// arbitrary network splits (inside UTF-8 sequences, inside a CRLF) that
/// the same input always reproduces.
pub fn split_chunks(selector: u8, body: &[u8]) -> Vec<&[u8]> {
    let max = MAX_CHUNK[usize::from(selector & 7)];
    let mut state = u32::from(selector) | 0x9e37_7900;
    let mut chunks = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let len = if max == usize::MAX { rest.len() } else { 1 + state as usize % max };
        let (chunk, tail) = rest.split_at(len.min(rest.len()));
        chunks.push(chunk);
        rest = tail;
    }
    chunks
}

/// A provider adapter's `decode_body`.
pub type DecodeBody = fn(ResponseBody<'_>, DeltaSink<'_>) -> Result<ModelResponse, ProviderError>;

/// Feeds `data` to one provider's decoder.
///
/// Input: when the first byte is `{`, the whole input is a non-streamed
/// JSON body. Otherwise the first byte picks the chunking (see
/// [`split_chunks`]) and the rest is the event stream. A stream is decoded
/// twice, in those chunks and in one piece, and both must agree: the SSE
/// parser promises that no split changes what it reads.
pub fn check_provider_body(data: &[u8], decode: DecodeBody) {
    let Some((&selector, stream)) = data.split_first() else { return };
    if selector == JSON_BODY {
        let _ = decode_collecting(decode, ResponseBody::Json(data));
        return;
    }
    let chunks = split_chunks(selector, stream);
    // This crate is built only by cargo-fuzz and has no unit tests, so the
    // splitter is checked here.
    assert!(chunks.iter().all(|c| !c.is_empty()) && chunks.concat() == stream, "the chunks are not the stream");
    let (split, split_deltas) = decode_collecting(decode, ResponseBody::Stream(&chunks));
    let (whole, whole_deltas) = decode_collecting(decode, ResponseBody::Stream(&[stream]));
    assert_eq!(split_deltas, whole_deltas, "the chunking changed the streamed text");
    match (&split, &whole) {
        (Ok(split), Ok(whole)) => assert_same_response(split, whole),
        (Err(split), Err(whole)) => assert_eq!(split, whole, "the chunking changed the error"),
        _ => panic!("the chunking changed the outcome: {split:?} against {whole:?}"),
    }
}

/// Decodes `body`, returning the outcome and every text delta, joined.
fn decode_collecting(decode: DecodeBody, body: ResponseBody<'_>) -> (Result<ModelResponse, ProviderError>, String) {
    let deltas = Mutex::new(String::new());
    let sink = |text: &str| {
        if let Ok(mut deltas) = deltas.lock() {
            deltas.push_str(text);
        }
    };
    let outcome = decode(body, &sink);
    (outcome, deltas.into_inner().unwrap_or_default())
}

/// Equal responses, except for call ids keel makes up for calls the
/// server sent without one (those are random).
fn assert_same_response(split: &ModelResponse, whole: &ModelResponse) {
    assert_eq!((&split.usage, &split.finish), (&whole.usage, &whole.finish), "the chunking changed the response");
    assert_eq!(split.items.len(), whole.items.len(), "the chunking changed the items");
    for (a, b) in split.items.iter().zip(&whole.items) {
        match (a, b) {
            (
                Item::FunctionCall { name: name_a, arguments: args_a, .. },
                Item::FunctionCall { name: name_b, arguments: args_b, .. },
            ) => assert_eq!((name_a, args_a), (name_b, args_b), "the chunking changed a call"),
            _ => assert_eq!(a, b, "the chunking changed an item"),
        }
    }
}

/// Decodes one JSON-RPC text as the server does and checks what it
/// answers. Input: the text a stdio line or WebSocket frame carries (both
/// are UTF-8; other bytes never reach the decoder).
pub fn check_jsonrpc_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match decode_text(text) {
        Incoming::Rejected(response) => {
            assert_eq!(response.id, Value::Null, "a rejected text has no id to answer");
            check_error_response(&response);
        }
        Incoming::Single(message) => check_message(&message),
        Incoming::Batch(messages) => {
            assert!(!messages.is_empty(), "an empty batch must be rejected");
            messages.iter().for_each(check_message);
        }
    }
}

fn check_message(message: &Message) {
    match message {
        Message::Request(request) => {
            assert_eq!(request.jsonrpc, "2.0");
            assert!(request.id.as_ref().is_none_or(valid_id), "request id {:?}", request.id);
        }
        Message::Invalid(response) => check_error_response(response),
    }
}

fn check_error_response(response: &Response) {
    assert!(response.error.is_some() && response.result.is_none(), "{response:?}");
    assert!(valid_id(&response.id), "response id {:?}", response.id);
    let text = serde_json::to_string(response).unwrap_or_default();
    assert!(serde_json::from_str::<Value>(&text).is_ok(), "the response does not encode: {response:?}");
}

fn valid_id(id: &Value) -> bool {
    matches!(id, Value::String(_) | Value::Number(_) | Value::Null)
}

/// Where the fuzzed `keel.toml` claims to live. It does not exist, so
/// loading does no I/O beyond a failing `canonicalize`.
const BUNDLE_DIR: &str = "/nonexistent/keel-fuzz-bundle";

/// Validates and loads `data` as a `keel.toml`, the way `keel validate` and
/// `keel run` do. Input: the file's text (`keel` reads it as UTF-8 and
/// stops at anything else, before these entry points). A bundle that
/// validates without problems must load.
pub fn check_bundle_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let dir = std::path::Path::new(BUNDLE_DIR);
    let providers = ["anthropic", "local", "openai", "openai-chat"].map(String::from);
    let tools = keel_runtime::builtin_tool_names();
    let file = dir.join(keel_runtime::bundle::BUNDLE_FILE);
    let problems = keel_runtime::bundle_check::validate_text(&file, text, &providers, &tools);
    for problem in &problems {
        let _ = problem.to_string();
    }
    match keel_runtime::Bundle::from_text(dir, text) {
        Ok(bundle) => {
            for spec in bundle.coworkers.values() {
                let _ = spec.digest();
            }
        }
        Err(error) => assert!(!problems.is_empty(), "validation passed but loading failed: {error}"),
    }
}

/// Decodes `data` as a run archive and folds and materialises what it
/// holds.
///
/// Input: bytes starting with the `KEELARCH` magic are an archive file as
/// is. Anything else is JSON records, one per line (empty lines skipped),
/// which are framed behind a valid preamble with correct lengths and
/// checksums, so the fuzzer reaches record decoding and state folding
/// instead of stopping at the CRC.
pub fn check_archive(data: &[u8]) {
    let framed;
    let bytes = if data.starts_with(keel_archive::MAGIC) {
        data
    } else {
        framed = frame_lines(data);
        &framed
    };
    let Ok(archive) = Archive::from_bytes(bytes) else { return };
    let _ = archive.fold();
    let _ = archive.owners();
    let points = archive.points();
    assert!(points.windows(2).all(|w| w[0] < w[1]), "points are not ascending: {points:?}");
    for &seq in points.iter().take(64) {
        if let Err(error @ ArchiveError::NoSuchPoint { .. }) = archive.materialize(seq) {
            panic!("points() listed {seq}, which materialize refuses: {error}");
        }
    }
    let _ = archive.materialize(u64::MAX);
}

/// A valid preamble, then each non-empty line of `lines` as one frame.
fn frame_lines(lines: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(lines.len() + 64);
    let _ = keel_archive::write_preamble(&mut bytes);
    for payload in lines.split(|b| *b == b'\n').filter(|line| !line.is_empty()) {
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        bytes.extend_from_slice(payload);
    }
    bytes
}

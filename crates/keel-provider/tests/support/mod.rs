//! Helpers shared by the provider tests: run one request against a
//! provider and collect what it streamed.

#![allow(dead_code)]

pub mod stories;

use std::sync::Mutex;

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use keel_protocol::{ImageRef, Item};
use keel_provider::{ImageData, ModelProvider, ModelRequest, ModelResponse, ProviderError};
use keel_testkit::{MockServer, RecordedRequest, Reply};

/// A request for `model` with one user message and nothing else.
pub fn ask(model: &str, text: &str) -> ModelRequest {
    ModelRequest {
        model: model.into(),
        instructions: String::new(),
        items: vec![Item::user_text(text)],
        tools: vec![],
        max_output_tokens: None,
        images: Default::default(),
    }
}

/// Runs one request and returns the outcome and the text deltas seen.
pub async fn run(
    provider: &dyn ModelProvider,
    request: &ModelRequest,
) -> (Result<ModelResponse, ProviderError>, Vec<String>) {
    let deltas = Mutex::new(Vec::new());
    let sink = |text: &str| {
        if let Ok(mut deltas) = deltas.lock() {
            deltas.push(text.to_owned());
        }
    };
    let result = provider.stream(request, &sink).await;
    (result, deltas.into_inner().unwrap_or_default())
}

/// Pushes `reply` and returns the failure of `request`, which must fail.
pub async fn failure_of(
    server: &MockServer,
    provider: &dyn ModelProvider,
    request: &ModelRequest,
    reply: Reply,
) -> anyhow::Result<ProviderError> {
    server.push(reply);
    match run(provider, request).await.0 {
        Ok(response) => anyhow::bail!("expected a failure, got {response:?}"),
        Err(error) => Ok(error),
    }
}

/// The one request the server received.
pub fn only_request(server: &MockServer) -> anyhow::Result<RecordedRequest> {
    let mut requests = server.requests();
    anyhow::ensure!(requests.len() == 1, "expected one request, got {}", requests.len());
    requests.pop().context("no request")
}

/// The bytes of the image [`screenshot_request`] may show: a PNG signature
/// and bytes that need base64 padding and its `+` and `/`.
pub const SCREENSHOT_PNG: &[u8] = &[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0xfb, 0xff];

/// A request whose history has one `screenshot` call, answered with the
/// text "two shots" and two images: `img_1` ([`SCREENSHOT_PNG`]), whose
/// bytes come with the request, and `img_2`, which has expired.
pub fn screenshot_request(model: &str) -> ModelRequest {
    let mut request = ask(model, "take two screenshots");
    request.items.push(Item::FunctionCall { call_id: "c1".into(), name: "screenshot".into(), arguments: "{}".into() });
    request.items.push(Item::FunctionCallOutput {
        call_id: "c1".into(),
        output: "two shots".into(),
        images: vec![
            ImageRef { id: "img_1".into(), mime_type: "image/png".into(), bytes: SCREENSHOT_PNG.len() as u64 },
            ImageRef { id: "img_2".into(), mime_type: "image/jpeg".into(), bytes: 2048 },
        ],
    });
    let png = ImageData { mime_type: "image/png".into(), data: SCREENSHOT_PNG.into() };
    request.images.insert("img_1".into(), png);
    request
}

/// The placeholder the expired `img_2` of [`screenshot_request`] becomes.
pub const EXPIRED_PLACEHOLDER: &str = "[image img_2 (image/jpeg) is no longer available]";

/// Decodes standard base64, as the providers send image bytes.
pub fn decode_base64(text: &str) -> anyhow::Result<Vec<u8>> {
    Ok(STANDARD.decode(text)?)
}

//! Helpers shared by the provider tests: run one request against a
//! provider and collect what it streamed.

#![allow(dead_code)]

pub mod stories;

use std::sync::Mutex;

use anyhow::Context;
use keel_protocol::Item;
use keel_provider::{ModelProvider, ModelRequest, ModelResponse, ProviderError};
use keel_testkit::{MockServer, RecordedRequest, Reply};

/// A request for `model` with one user message and nothing else.
pub fn ask(model: &str, text: &str) -> ModelRequest {
    ModelRequest {
        model: model.into(),
        instructions: String::new(),
        items: vec![Item::user_text(text)],
        tools: vec![],
        max_output_tokens: None,
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

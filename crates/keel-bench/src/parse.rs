//! What keel pays per streamed token, per wire format, and the local
//! model's speed.
//!
//! `parse` streams a 1,000-delta answer from the in-process wire-format
//! server through each provider adapter, many times, and reports the median
//! time per 1,000 tokens. That figure includes the loopback transfer and the
//! server encoding the stream, so it is an upper bound on the adapter's own
//! cost (SSE framing, JSON decoding, delta callbacks, item assembly).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use keel_protocol::Item;
use keel_provider::{
    Anthropic, AnthropicConfig, ModelProvider, ModelRequest, OpenAiChat, OpenAiChatConfig, OpenAiResponses,
    OpenAiResponsesConfig,
};
use keel_testkit::{MockServer, Reply};
use serde_json::json;

const TOKENS: usize = 1000;

fn request() -> ModelRequest {
    ModelRequest {
        model: "bench".into(),
        instructions: "bench".into(),
        items: vec![Item::user_text("stream a long answer")],
        tools: Vec::new(),
        max_output_tokens: None,
        images: Default::default(),
    }
}

pub async fn bench(requests: usize) -> Result<()> {
    let deltas: Vec<String> = (0..TOKENS).map(|n| format!("tok{n} ")).collect();
    let reply = Reply::text_deltas(deltas.clone());
    let mock = MockServer::builder().fallback(move |_| reply.clone()).record_requests(false).start().await?;
    let base = mock.base_url();
    let root = base.trim_end_matches("/v1").to_string();
    let providers: Vec<Arc<dyn ModelProvider>> = vec![
        Arc::new(OpenAiChat::new(OpenAiChatConfig::new(&base))?),
        Arc::new(OpenAiResponses::new(OpenAiResponsesConfig::new(&base))?),
        Arc::new(Anthropic::new(AnthropicConfig::new(&root))?),
    ];
    let mut results = serde_json::Map::new();
    for provider in providers {
        let request = request();
        let mut samples = Vec::with_capacity(requests);
        for _ in 0..requests + 10 {
            let counter = std::sync::atomic::AtomicUsize::new(0);
            let on_delta = |_: &str| {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            };
            let clock = Instant::now();
            let response = provider.stream(&request, &on_delta).await?;
            samples.push(clock.elapsed().as_secs_f64() * 1000.0);
            let count = counter.load(std::sync::atomic::Ordering::Relaxed);
            anyhow::ensure!(count == TOKENS, "{} streamed {count} deltas, expected {TOKENS}", provider.name());
            anyhow::ensure!(response.items.len() == 1, "one answer expected");
        }
        let mut samples: Vec<f64> = samples.split_off(10);
        samples.sort_by(|a, b| a.total_cmp(b));
        let median = samples[samples.len() / 2];
        let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
        results.insert(
            provider.name().to_string(),
            json!({"ms_per_1000_tokens_p50": crate::round(median), "ms_per_1000_tokens_p99": crate::round(p99)}),
        );
    }
    println!("{}", serde_json::to_string_pretty(&json!({"bench": "parse", "requests": requests, "formats": results}))?);
    Ok(())
}

#[cfg(feature = "local")]
pub async fn local(model: &str) -> Result<()> {
    let provider = keel_provider_local::LocalProvider::new(keel_provider_local::LocalConfig::from_env());
    let mut request = request();
    request.model = model.to_string();
    request.items = vec![Item::user_text("Write a short story about a lighthouse keeper.")];
    request.max_output_tokens = Some(128);
    // The first request loads the model; measure the second.
    provider.stream(&request, &|_| {}).await?;
    let clock = Instant::now();
    let response = provider.stream(&request, &|_| {}).await?;
    let seconds = clock.elapsed().as_secs_f64();
    let tokens = response.usage.output_tokens;
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "bench": "local",
            "model": model,
            "prompt_tokens": response.usage.input_tokens,
            "output_tokens": tokens,
            "seconds": crate::round(seconds),
            "tokens_per_second": crate::round((response.usage.input_tokens + tokens) as f64 / seconds),
            "output_tokens_per_second": crate::round(tokens as f64 / seconds),
        }))?
    );
    Ok(())
}

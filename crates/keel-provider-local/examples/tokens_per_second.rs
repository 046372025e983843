//! Measures local generation speed on this machine.
//!
//! `scripts/fetch-model && cargo run --release -p keel-provider-local --example tokens_per_second [model] [tokens] [threads]`
//!
//! Prints prompt and output token counts and output tokens per second (wall
//! time of the whole request, so prompt processing is included), once for
//! plain text and once with a tool declared (grammar-constrained).

use std::time::Instant;

use keel_protocol::{Item, ToolSpec};
use keel_provider::{ModelProvider, ModelRequest};
use keel_provider_local::{LocalConfig, LocalProvider};

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "local:smollm2".to_string());
    let tokens: u32 = args.next().map(|n| n.parse()).transpose()?.unwrap_or(256);
    let threads: Option<usize> = args.next().map(|n| n.parse()).transpose()?;
    let provider = LocalProvider::new(LocalConfig { threads, ..LocalConfig::from_env() });
    // Load the model outside the timed runs.
    let loading = Instant::now();
    provider.tokenize_count(&model, "warm up")?;
    println!("model loaded in {:.0} ms", loading.elapsed().as_secs_f64() * 1e3);

    let write_file = ToolSpec {
        name: "write_file".into(),
        description: "Write text content to a file at the given path.".into(),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": false
        }),
    };
    let cases = [
        ("plain", "Write a long story about a lighthouse keeper.", vec![]),
        ("grammar", "Write a file story.txt with a long story about a lighthouse keeper.", vec![write_file]),
    ];
    for (label, prompt, tools) in cases {
        let request = ModelRequest {
            model: model.clone(),
            instructions: "You are a helpful assistant.".into(),
            items: vec![Item::user_text(prompt)],
            tools,
            max_output_tokens: Some(tokens),
            images: Default::default(),
        };
        let started = Instant::now();
        let response = provider.stream(&request, &|_: &str| {}).await?;
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "{label}: {} prompt tokens, {} output tokens in {seconds:.2} s = {:.1} output tokens/s ({})",
            response.usage.input_tokens,
            response.usage.output_tokens,
            response.usage.output_tokens as f64 / seconds,
            response.finish.as_str(),
        );
    }
    Ok(())
}

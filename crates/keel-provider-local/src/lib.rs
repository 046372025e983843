//! A model provider that runs GGUF models in-process with llama.cpp: no
//! network, no key.
//!
//! [`LocalProvider`] implements [`ModelProvider`] for model names such as
//! `local:smollm2` (SmolLM2-135M-Instruct, installed by `scripts/fetch-model`).
//! The conversation is rendered with the model's own chat template. Without
//! tools the model writes plain text, streamed as it is generated. With tools
//! a step has two phases: first the output is constrained by a grammar
//! ([`tool_grammar`]) to a call list in the format small models were trained
//! on, holding one call of a declared tool with arguments valid for its
//! schema (so a small model can never produce a malformed call) or none;
//! only when it holds none, the model then writes its answer as plain text,
//! streamed, from a prompt without the tool listing.
//!
//! Inference is CPU-bound and blocking, so each request runs on a blocking
//! thread whose handle the request's future awaits; text comes back over a
//! channel. Dropping the future closes the channel and the thread stops before
//! its next token. [`LocalProvider::wait_idle`] waits for every such thread.

mod config;
mod engine;
mod error;
mod prompt;
mod text_stream;

pub mod tool_grammar;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keel_protocol::{Item, Usage};
use keel_provider::{BoxFuture, DeltaSink, FinishReason, ModelProvider, ModelRequest, ModelResponse, ProviderError};
use tokio::sync::{mpsc, watch};

pub use config::{DEFAULT_MODEL, LocalConfig, MODELS_DIR_ENV, SMOLLM2_FILE, default_models_dir};
pub use error::{LocalError, Result};

use engine::{DeltaMode, Ending, Generation, Job};
use tool_grammar::ConstrainedReply;

/// Runs local GGUF models; see the crate documentation.
#[derive(Clone)]
pub struct LocalProvider {
    config: LocalConfig,
    /// How many generation threads are running.
    running: Arc<watch::Sender<usize>>,
}

impl LocalProvider {
    /// A provider with `config`. Models load on first use.
    pub fn new(config: LocalConfig) -> LocalProvider {
        LocalProvider { config, running: Arc::new(watch::Sender::new(0)) }
    }

    pub fn config(&self) -> &LocalConfig {
        &self.config
    }

    /// The number of tokens `text` is for `model`'s own tokenizer, counted as
    /// message text (no special tokens added or interpreted).
    ///
    /// This blocks: the first call for a model loads it (about 0.1 s for
    /// SmolLM2). Call it from a blocking thread or after a first request.
    pub fn tokenize_count(&self, model: &str, text: &str) -> Result<usize, ProviderError> {
        let path = self.config.model_path(model)?;
        Ok(engine::load_model(&path)?.count_tokens(text))
    }

    /// The context size requests to `model` get: the configured size, or the
    /// model's training context when smaller. Blocks like
    /// [`tokenize_count`](Self::tokenize_count).
    pub fn context_tokens(&self, model: &str) -> Result<u32, ProviderError> {
        let path = self.config.model_path(model)?;
        Ok(self.config.context_tokens.min(engine::load_model(&path)?.train_context()))
    }

    /// Resolves when no generation thread of this provider is running, for
    /// example after the futures of cancelled requests were dropped.
    pub async fn wait_idle(&self) {
        let mut running = self.running.subscribe();
        // An error means the sender is gone, which cannot happen while `self`
        // holds it.
        let _ = running.wait_for(|count| *count == 0).await;
    }

    async fn run(&self, request: &ModelRequest, on_delta: DeltaSink<'_>) -> Result<ModelResponse, ProviderError> {
        let path = self.config.model_path(&request.model)?;
        let tools = request.tools.clone();
        let turns = prompt::chat_turns(request);
        let config = self.config.clone();
        let max_output_tokens = request.max_output_tokens.unwrap_or(config.max_output_tokens);
        let (delta_tx, mut delta_rx) = mpsc::unbounded_channel::<String>();
        let running = RunningGuard::start(Arc::clone(&self.running));
        let answer_turns = prompt::answer_turns(request);
        let last_call = last_answered_call(&request.items);
        let worker = tokio::task::spawn_blocking(move || -> Result<Steps> {
            let _running = running;
            let model = engine::load_model(&path)?;
            let job = |turns: Vec<prompt::ChatTurn>, grammar: Option<String>, delta_mode: DeltaMode| Job {
                model: Arc::clone(&model),
                delta_mode,
                grammar,
                turns,
                max_output_tokens,
                context_tokens: config.context_tokens,
                threads: config.threads.unwrap_or_else(default_threads),
                temperature: config.temperature,
                seed: config.seed,
            };
            if tools.is_empty() {
                let answer = engine::generate(&job(turns, None, DeltaMode::Plain), &delta_tx)?;
                return Ok(Steps { choice: None, answer: Some(answer) });
            }
            let grammar = tool_grammar::reply_grammar(&tools)?;
            let choice = engine::generate(&job(turns, Some(grammar), DeltaMode::Silent), &delta_tx)?;
            let answers = choice.ending == Ending::EndOfTurn
                && match tool_grammar::parse_reply(&choice.text, &tools) {
                    Some(ConstrainedReply::NoCall) => true,
                    Some(ConstrainedReply::ToolCall { name, arguments }) => {
                        repeats_last_call(&last_call, &name, &arguments)
                    }
                    None => false,
                };
            let answer = if answers {
                Some(engine::generate(&job(answer_turns, None, DeltaMode::Plain), &delta_tx)?)
            } else {
                None
            };
            Ok(Steps { choice: Some(choice), answer })
        });
        while let Some(delta) = delta_rx.recv().await {
            on_delta(&delta);
        }
        let steps = worker.await.map_err(|error| LocalError::Worker(error.to_string()))??;
        for generation in steps.choice.iter().chain(&steps.answer) {
            tracing::debug!(
                prompt_tokens = generation.prompt_tokens,
                output_tokens = generation.output_tokens,
                tokens_per_second = generation.output_tokens as f64 / generation.generation_seconds.max(1e-9),
                "local generation finished"
            );
        }
        Ok(response(steps, &request.tools))
    }
}

/// The turn's last call, when it is the last thing the model did and its
/// result is in: (name, arguments).
fn last_answered_call(items: &[Item]) -> Option<(String, String)> {
    let mut calls = items.iter().rev().take_while(|item| !matches!(item, Item::Message { .. }));
    let Some(Item::FunctionCallOutput { call_id: answered, .. }) = calls.next() else { return None };
    calls.find_map(|item| match item {
        Item::FunctionCall { call_id, name, arguments } if call_id == answered => {
            Some((name.clone(), arguments.clone()))
        }
        _ => None,
    })
}

/// Whether a chosen call is exactly the call whose result the model just
/// got. Small models loop on a call that worked (SmolLM2-135M wrote the same
/// file again at every step until the step limit); a repeat has nothing new
/// to do, so the step answers instead.
fn repeats_last_call(last: &Option<(String, String)>, name: &str, arguments: &str) -> bool {
    let Some((last_name, last_arguments)) = last else { return false };
    let parse = |text: &str| serde_json::from_str::<serde_json::Value>(text).ok();
    last_name == name && parse(last_arguments).is_some() && parse(last_arguments) == parse(arguments)
}

/// The generations of one model step: the tool choice (with tools) and the
/// plain answer (without tools, or when the choice was no call).
struct Steps {
    choice: Option<Generation>,
    answer: Option<Generation>,
}

impl ModelProvider for LocalProvider {
    fn name(&self) -> &str {
        "local"
    }

    /// Deltas: every piece of the plain answer as it is generated; nothing
    /// for a tool choice. The deltas concatenate to the final text.
    /// llama.cpp's tokenizer of the model file; the estimate when the file
    /// cannot be loaded (the request will then fail with the reason). Loads
    /// the model on first use: call it from a blocking thread.
    fn token_counter(&self, model: &str) -> Arc<dyn keel_provider::TokenCounter> {
        match self.config.model_path(model).map_err(|_| ()).and_then(|p| engine::load_model(&p).map_err(|_| ())) {
            Ok(loaded) => Arc::new(LlamaCounter(loaded)),
            Err(()) => Arc::new(keel_provider::tokens::Estimate),
        }
    }

    fn context_window(&self, model: &str) -> Option<u64> {
        self.context_tokens(model).ok().map(u64::from)
    }

    fn stream<'a>(
        &'a self,
        request: &'a ModelRequest,
        on_delta: DeltaSink<'a>,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        Box::pin(self.run(request, on_delta))
    }
}

/// Generations running in this process, across providers: they share the
/// cores.
static RUNNING_GENERATIONS: AtomicUsize = AtomicUsize::new(0);

/// Half the cores, shared among the generations running now, at least one
/// thread each. ggml's worker threads spin while they wait for each other, so
/// a thread that has to share its core with other work stalls the rest: on 2
/// cores, SmolLM2 made about 100 tokens/s with two threads on a quiet machine
/// but 1 to 6 tokens/s with two threads next to a build or a second keel
/// process, while one thread made about 50 quiet and 33 next to a build.
/// Leaving half the cores free keeps the slow case away; set
/// [`LocalConfig::threads`] on a machine that does nothing else.
fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map(usize::from).unwrap_or(1);
    let running = RUNNING_GENERATIONS.load(Ordering::Relaxed).max(1);
    (cores / 2 / running).max(1)
}

/// Turns a step's generations into keel items, with their usage summed.
fn response(steps: Steps, tools: &[keel_protocol::ToolSpec]) -> ModelResponse {
    let generations = || steps.choice.iter().chain(&steps.answer);
    let usage = Usage {
        input_tokens: generations().map(|g| g.prompt_tokens as u64).sum(),
        output_tokens: generations().map(|g| g.output_tokens as u64).sum(),
        ..Usage::default()
    };
    if let Some(answer) = &steps.answer {
        let items = if answer.text.is_empty() { vec![] } else { vec![Item::assistant_text(&answer.text)] };
        let finish = if answer.ending == Ending::Length { FinishReason::Length } else { FinishReason::Stop };
        return ModelResponse { items, usage, finish };
    }
    let parsed = steps.choice.as_ref().and_then(|choice| tool_grammar::parse_reply(&choice.text, tools));
    let (items, finish) = match parsed {
        Some(ConstrainedReply::ToolCall { name, arguments }) => {
            let call_id = keel_protocol::ids::new_id("call");
            (vec![Item::FunctionCall { call_id, name, arguments }], FinishReason::ToolCalls)
        }
        // A choice cut short by the output limit (or cancelled): never a
        // partial call.
        _ => (vec![], FinishReason::Length),
    };
    ModelResponse { items, usage, finish }
}

/// Counts a generation thread as running until dropped, which happens when the
/// thread's closure ends, however it ends.
struct RunningGuard(Arc<watch::Sender<usize>>);

impl RunningGuard {
    fn start(running: Arc<watch::Sender<usize>>) -> RunningGuard {
        running.send_modify(|count| *count += 1);
        RUNNING_GENERATIONS.fetch_add(1, Ordering::Relaxed);
        RunningGuard(running)
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        RUNNING_GENERATIONS.fetch_sub(1, Ordering::Relaxed);
        self.0.send_modify(|count| *count = count.saturating_sub(1));
    }
}

/// Counts with the model's own vocabulary.
struct LlamaCounter(Arc<engine::LoadedModel>);

impl keel_provider::TokenCounter for LlamaCounter {
    fn name(&self) -> &str {
        "llama.cpp"
    }

    fn count(&self, text: &str) -> u64 {
        self.0.count_tokens(text) as u64
    }
}

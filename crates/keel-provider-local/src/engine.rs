//! The blocking side: the llama.cpp backend, the model cache, and the token
//! loop.
//!
//! Everything here runs on a blocking thread. The llama.cpp backend is a
//! process-wide global, started once. A model file is loaded once per process
//! (memory-mapped) and stays loaded, shared by every request; each request
//! gets its own context (its KV cache), so requests run side by side. The loop
//! checks between tokens, and between prompt chunks, whether the caller still
//! listens, and stops at once when it does not.
//!
//! Known limit: the rendered prompt is tokenized with special-token parsing on
//! (the template's own markers must become control tokens), so a message that
//! contains a literal marker such as `<|im_end|>` is read as that marker.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use tokio::sync::mpsc::UnboundedSender;

use crate::error::{LocalError, Result};
use crate::prompt::ChatTurn;
use crate::text_stream::Utf8Stream;

/// Prompt tokens decoded per llama.cpp call; between calls the loop checks
/// for cancellation.
const PROMPT_CHUNK: usize = 512;

/// A model file loaded into memory.
pub struct LoadedModel {
    model: LlamaModel,
    template: LlamaChatTemplate,
    /// Held while a context is created: llama.cpp may write to the model while
    /// it builds a context, so two must not be built at once.
    context_creation: Mutex<()>,
}

impl LoadedModel {
    /// The number of tokens `text` is, as plain text (special-token markup in
    /// it is not interpreted).
    pub fn count_tokens(&self, text: &str) -> usize {
        self.model.vocab().tokenize(text.as_bytes(), false, false).len()
    }

    /// The model's training context length.
    pub fn train_context(&self) -> u32 {
        self.model.n_ctx_train()
    }
}

fn backend() -> Result<&'static LlamaBackend> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            // llama.cpp logs every tensor while loading; keep that in tracing
            // at debug level instead of on stderr.
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|error| error.to_string())
        })
        .as_ref()
        .map_err(|error| LocalError::Backend(error.clone()))
}

/// The loaded model at `path`, loading it on first use.
pub fn load_model(path: &Path) -> Result<Arc<LoadedModel>> {
    // The lock is held while loading (blocking, never across an await) so
    // that two first requests do not both load the same file.
    static MODELS: Mutex<BTreeMap<PathBuf, Arc<LoadedModel>>> = Mutex::new(BTreeMap::new());
    if !path.is_file() {
        return Err(LocalError::ModelMissing { path: path.to_path_buf() });
    }
    let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mut models = MODELS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(model) = models.get(&key) {
        return Ok(Arc::clone(model));
    }
    let backend = backend()?;
    let started = std::time::Instant::now();
    let model = LlamaModel::load_from_file(backend, &key, &LlamaModelParams::default())
        .map_err(|error| LocalError::ModelLoad { path: key.clone(), reason: error.to_string() })?;
    let template = match model.chat_template(None) {
        Ok(template) => template,
        Err(error) => {
            tracing::warn!(path = %key.display(), %error, "model has no chat template; using chatml");
            LlamaChatTemplate::new("chatml").map_err(|error| LocalError::ChatTemplate(error.to_string()))?
        }
    };
    tracing::info!(path = %key.display(), elapsed_ms = started.elapsed().as_millis() as u64, "loaded local model");
    let loaded = Arc::new(LoadedModel { model, template, context_creation: Mutex::new(()) });
    models.insert(key, Arc::clone(&loaded));
    Ok(loaded)
}

/// How generated text is streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaMode {
    /// Every piece of text as generated.
    Plain,
    /// Nothing (a grammar-constrained tool choice).
    Silent,
}

/// One generation to run.
pub struct Job {
    pub model: Arc<LoadedModel>,
    pub turns: Vec<ChatTurn>,
    /// A GBNF grammar with root `root` that constrains the output.
    pub grammar: Option<String>,
    pub delta_mode: DeltaMode,
    pub max_output_tokens: u32,
    pub context_tokens: u32,
    pub threads: usize,
    pub temperature: f32,
    pub seed: u32,
}

/// How a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The model ended its turn.
    EndOfTurn,
    /// The output token limit (or the context) was reached.
    Length,
    /// The caller went away.
    Cancelled,
}

/// What a generation produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub text: String,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub ending: Ending,
    /// Seconds spent producing output tokens, for throughput figures.
    pub generation_seconds: f64,
}

/// Runs `job`, sending streamed text to `deltas`. Stops early when `deltas`
/// is closed, that is when the awaiting future was dropped.
pub fn generate(job: &Job, deltas: &UnboundedSender<String>) -> Result<Generation> {
    let backend = backend()?;
    let model = &job.model.model;
    let prompt = render_prompt(&job.model, &job.turns)?;
    let tokens = model.vocab().tokenize(prompt.as_bytes(), true, true);
    let limit = job.context_tokens.min(model.n_ctx_train().max(1));
    if tokens.len() >= limit as usize {
        return Err(LocalError::ContextTooLong { prompt_tokens: tokens.len(), context_tokens: limit });
    }
    // Fits in u32: tokens.len() < limit.
    let room = limit - tokens.len() as u32;
    let max_output = job.max_output_tokens.clamp(1, room);
    let n_ctx = tokens.len() as u32 + max_output;
    let threads = i32::try_from(job.threads.max(1)).unwrap_or(i32::MAX);
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx))
        .with_n_batch(PROMPT_CHUNK as u32)
        .with_n_ubatch(PROMPT_CHUNK as u32)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut context = {
        let _creating = job.model.context_creation.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        model.new_context(backend, params).map_err(|error| LocalError::Inference(error.to_string()))?
    };
    let mut picker = TokenPicker::new(job)?;

    let inference = |error: &dyn std::fmt::Display| LocalError::Inference(error.to_string());
    let Some(last) = tokens.len().checked_sub(1) else {
        return Err(LocalError::ChatTemplate("the conversation rendered to an empty prompt".to_string()));
    };
    let mut batch = LlamaBatch::new(PROMPT_CHUNK, 1);
    for (chunk_index, chunk) in tokens.chunks(PROMPT_CHUNK).enumerate() {
        if deltas.is_closed() {
            return Ok(cancelled(tokens.len(), 0));
        }
        batch.clear();
        for (offset, &token) in chunk.iter().enumerate() {
            let position = chunk_index * PROMPT_CHUNK + offset;
            batch.add(token, position as i32, &[0], position == last).map_err(|e| inference(&e))?;
        }
        context.decode(&mut batch).map_err(|e| inference(&e))?;
    }

    let vocab = model.vocab();
    let mut utf8 = Utf8Stream::default();
    let mut text = String::new();
    let mut output_tokens = 0usize;
    let mut position = tokens.len() as i32;
    let started = std::time::Instant::now();
    let ending = loop {
        if deltas.is_closed() {
            return Ok(cancelled(tokens.len(), output_tokens));
        }
        let token = picker.next(&context)?;
        // Chat models end a turn with a control token (`<|im_end|>`); any
        // control token in plain output would start markup, not text.
        if vocab.is_eog(token) || vocab.is_control(token) {
            break Ending::EndOfTurn;
        }
        output_tokens += 1;
        let piece = utf8.push(&vocab.token_to_piece(token, false, None));
        emit(&piece, job.delta_mode, deltas);
        text.push_str(&piece);
        if output_tokens >= max_output as usize {
            break Ending::Length;
        }
        decode_one(&mut context, &mut batch, token, position).map_err(|e| inference(&e))?;
        position += 1;
    };
    let rest = utf8.finish();
    emit(&rest, job.delta_mode, deltas);
    text.push_str(&rest);
    Ok(Generation {
        text,
        prompt_tokens: tokens.len(),
        output_tokens,
        ending,
        generation_seconds: started.elapsed().as_secs_f64(),
    })
}

fn cancelled(prompt_tokens: usize, output_tokens: usize) -> Generation {
    tracing::debug!(prompt_tokens, output_tokens, "local generation cancelled");
    Generation { text: String::new(), prompt_tokens, output_tokens, ending: Ending::Cancelled, generation_seconds: 0.0 }
}

fn emit(piece: &str, mode: DeltaMode, deltas: &UnboundedSender<String>) {
    if mode == DeltaMode::Plain && !piece.is_empty() {
        // A send fails only when the caller went away; the loop notices that
        // before the next token.
        let _ = deltas.send(piece.to_string());
    }
}

fn decode_one(
    context: &mut LlamaContext<'_>,
    batch: &mut LlamaBatch<'_>,
    token: LlamaToken,
    position: i32,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    batch.clear();
    batch.add(token, position, &[0], true)?;
    context.decode(batch)?;
    Ok(())
}

fn render_prompt(model: &LoadedModel, turns: &[ChatTurn]) -> Result<String> {
    let chat_error = |error: &dyn std::fmt::Display| LocalError::ChatTemplate(error.to_string());
    let messages = turns
        .iter()
        .map(|turn| LlamaChatMessage::new(turn.role.to_string(), turn.content.clone()).map_err(|e| chat_error(&e)))
        .collect::<Result<Vec<_>>>()?;
    model.model.apply_chat_template(&model.template, &messages, true).map_err(|e| chat_error(&e))
}

/// Picks each next token: greedily or by temperature sampling, within the
/// grammar when there is one.
struct TokenPicker {
    choose: LlamaSampler,
    grammar: Option<LlamaSampler>,
}

impl TokenPicker {
    fn new(job: &Job) -> Result<TokenPicker> {
        let grammar = match &job.grammar {
            Some(grammar) => Some(
                LlamaSampler::grammar(&job.model.model, grammar, "root")
                    .map_err(|error| LocalError::Grammar(error.to_string()))?,
            ),
            None => None,
        };
        let pick = if job.temperature > 0.0 {
            LlamaSampler::chain_simple([LlamaSampler::temp(job.temperature), LlamaSampler::dist(job.seed)])
        } else {
            LlamaSampler::greedy()
        };
        // Small models decoding greedily fall into loops (a summary, or a
        // file's content inside a tool call, repeating one sentence until the
        // output limit). A mild penalty on the last 64 generated tokens breaks
        // them; prompt tokens are not penalized, so copying names and numbers
        // from the input stays cheap. Under a grammar the penalty only
        // reorders the tokens the grammar allows, so a call stays valid
        // (SmolLM2-135M's `content` looped to the limit without it).
        let choose =
            LlamaSampler::chain_simple([LlamaSampler::penalties(job.model.model.n_vocab(), 64, 1.15, 0.0, 0.0), pick]);
        Ok(TokenPicker { choose, grammar })
    }

    /// The next token after the last decode.
    fn next(&mut self, context: &LlamaContext<'_>) -> Result<LlamaToken> {
        let none_picked = || LocalError::Inference("the sampler picked no token".to_string());
        let mut candidates = context.token_data_array();
        candidates.apply_sampler(&mut self.choose);
        let picked = candidates.selected_token().ok_or_else(none_picked)?;
        let Some(grammar) = &mut self.grammar else {
            self.choose.accept(picked);
            return Ok(picked);
        };
        // Checking the one token the model prefers is far cheaper than masking
        // the whole vocabulary, and that token is usually allowed. Only when
        // it is not, the grammar masks every candidate and the pick is redone.
        let mut single = LlamaTokenDataArray::new(vec![LlamaTokenData::new(picked, 0.0, 0.0)], false);
        single.apply_sampler(grammar);
        let allowed = single.data.first().is_some_and(|data| data.logit().is_finite());
        let token = if allowed {
            picked
        } else {
            let mut candidates = context.token_data_array();
            candidates.apply_sampler(grammar);
            candidates.apply_sampler(&mut self.choose);
            candidates.selected_token().ok_or_else(none_picked)?
        };
        grammar.accept(token);
        self.choose.accept(token);
        Ok(token)
    }
}

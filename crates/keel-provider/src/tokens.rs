//! Token counting and context windows, per model family.
//!
//! OpenAI models are counted with their own BPE (`tiktoken-rs`, which
//! bundles the vocabularies, so nothing is downloaded at run time). Anthropic
//! publishes no local tokenizer, and an OpenAI-compatible server may run any
//! model, so those are estimated at 4 bytes a token, rounded up; the
//! estimate is named `estimate` wherever a count is shown, so nobody takes it
//! for exact. The local provider counts with llama.cpp's own tokenizer.

use std::sync::Arc;

use tiktoken_rs::CoreBPE;
use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};

/// Counts tokens of text for one model.
pub trait TokenCounter: Send + Sync {
    /// How tokens are counted, as shown to people (`tiktoken:o200k_base`,
    /// `llama.cpp`, `estimate`).
    fn name(&self) -> &str;
    fn count(&self, text: &str) -> u64;
}

/// About 4 bytes of UTF-8 a token, rounded up: close for English prose and
/// code under current BPE vocabularies, and on the high side for most other
/// text, which is the safe side for a context cap.
#[derive(Debug, Clone, Copy, Default)]
pub struct Estimate;

impl TokenCounter for Estimate {
    fn name(&self) -> &str {
        "estimate"
    }

    fn count(&self, text: &str) -> u64 {
        (text.len() as u64).div_ceil(4)
    }
}

/// An OpenAI BPE vocabulary.
struct Tiktoken {
    name: &'static str,
    bpe: &'static CoreBPE,
}

/// Runs of non-whitespace longer than this are estimated, not encoded:
/// byte-pair merging is quadratic in the length of one piece, and a pasted
/// blob (base64, minified JSON) is one piece.
const LONG_RUN: usize = 256;

impl TokenCounter for Tiktoken {
    fn name(&self) -> &str {
        self.name
    }

    fn count(&self, text: &str) -> u64 {
        let mut rest = String::new();
        let mut estimated = 0u64;
        let mut run_start = None;
        let flush = |rest: &mut String, estimated: &mut u64, run: &str| {
            if run.len() > LONG_RUN {
                // About 3 bytes a token for dense text; on the high side for
                // repetitive runs, which is the safe side for a cap.
                *estimated += (run.len() as u64).div_ceil(3);
            } else {
                rest.push_str(run);
            }
        };
        for (at, c) in text.char_indices() {
            match (c.is_whitespace(), run_start) {
                (false, None) => run_start = Some(at),
                (true, Some(start)) => {
                    flush(&mut rest, &mut estimated, &text[start..at]);
                    run_start = None;
                    rest.push(c);
                }
                (true, None) => rest.push(c),
                (false, Some(_)) => {}
            }
        }
        if let Some(start) = run_start {
            flush(&mut rest, &mut estimated, &text[start..]);
        }
        self.bpe.encode_ordinary(&rest).len() as u64 + estimated
    }
}

/// The counter for an OpenAI model name: its BPE when the name is one
/// OpenAI publishes, else the estimate.
pub fn openai_counter(model: &str) -> Arc<dyn TokenCounter> {
    match get_tokenizer(model) {
        Some(Tokenizer::O200kBase | Tokenizer::O200kHarmony) => {
            Arc::new(Tiktoken { name: "tiktoken:o200k_base", bpe: tiktoken_rs::o200k_base_singleton() })
        }
        Some(Tokenizer::Cl100kBase) => {
            Arc::new(Tiktoken { name: "tiktoken:cl100k_base", bpe: tiktoken_rs::cl100k_base_singleton() })
        }
        _ => Arc::new(Estimate),
    }
}

/// The context window of an OpenAI model OpenAI publishes, else `None`.
pub fn openai_context_window(model: &str) -> Option<u64> {
    get_tokenizer(model).map(|_| tiktoken_rs::model::get_context_size(model) as u64)
}

/// The context window of an Anthropic model: 200k tokens for every Claude
/// model (the 1M window of some models is an opt-in beta keel does not ask
/// for).
pub fn anthropic_context_window(model: &str) -> Option<u64> {
    model.starts_with("claude").then_some(200_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_models_use_their_vocabulary_and_others_are_estimated() {
        let gpt4o = openai_counter("gpt-4o-mini");
        assert_eq!(gpt4o.name(), "tiktoken:o200k_base");
        assert_eq!(gpt4o.count("hello world"), 2);
        assert_eq!(openai_counter("gpt-4-0613").name(), "tiktoken:cl100k_base");
        let other = openai_counter("qwen2.5-coder");
        assert_eq!(other.name(), "estimate");
        assert_eq!(other.count("hello world"), 3);
        assert_eq!(openai_context_window("gpt-4o"), Some(128_000));
        assert_eq!(openai_context_window("my-local-model"), None);
        assert_eq!(anthropic_context_window("claude-sonnet-4-5"), Some(200_000));
    }

    #[test]
    fn a_pasted_blob_is_estimated_instead_of_merged_for_minutes() {
        let counter = openai_counter("gpt-4o");
        let blob = "x".repeat(300 * 1024);
        let text = format!("hello world {blob} bye");
        assert_eq!(counter.count(&text), counter.count("hello world  bye") + (blob.len() as u64).div_ceil(3));
    }
}

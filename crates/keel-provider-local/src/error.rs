//! What can go wrong when running a local model, and how each failure maps to
//! the [`FailureKind`] the runtime acts on.
//!
//! Nothing here is retryable in the sense of a remote provider: a missing file
//! or an oversized prompt stays wrong on a second try. Only failures inside
//! llama.cpp while decoding (most likely memory pressure) are classed as
//! transient.

use std::path::PathBuf;

use keel_provider::{FailureKind, ProviderError};

/// A failure of the local provider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocalError {
    #[error(
        "the model file {path} does not exist; run scripts/fetch-model (or scripts/setup) in keel's checkout to download SmolLM2 into the XDG data folder, or set KEEL_MODELS_DIR to the folder that holds the model"
    )]
    ModelMissing { path: PathBuf },
    #[error(
        "unknown local model `{name}`; use `smollm2`, the name of a .gguf file in the models folder, or a path to a .gguf file"
    )]
    UnknownModel { name: String },
    #[error("llama.cpp could not load {path}: {reason}; check that it is a complete GGUF file")]
    ModelLoad { path: PathBuf, reason: String },
    #[error("the llama.cpp backend could not start: {0}")]
    Backend(String),
    #[error(
        "the prompt has {prompt_tokens} tokens but the context holds {context_tokens}; shorten the history or raise the context size"
    )]
    ContextTooLong { prompt_tokens: usize, context_tokens: u32 },
    #[error("the model's chat template could not render the conversation: {0}")]
    ChatTemplate(String),
    #[error("the tool schemas could not be turned into a grammar: {0}")]
    Grammar(String),
    #[error("llama.cpp failed while generating: {0}")]
    Inference(String),
    #[error("the generation thread stopped unexpectedly: {0}")]
    Worker(String),
}

impl LocalError {
    /// The runtime's view of this failure.
    pub fn kind(&self) -> FailureKind {
        match self {
            LocalError::ContextTooLong { .. } => FailureKind::ContextTooLong,
            LocalError::Inference(_) | LocalError::Worker(_) => FailureKind::Transient,
            LocalError::ModelMissing { .. }
            | LocalError::UnknownModel { .. }
            | LocalError::ModelLoad { .. }
            | LocalError::Backend(_)
            | LocalError::ChatTemplate(_)
            | LocalError::Grammar(_) => FailureKind::BadRequest,
        }
    }
}

impl From<LocalError> for ProviderError {
    fn from(error: LocalError) -> ProviderError {
        ProviderError::new(error.kind(), error.to_string())
    }
}

pub type Result<T, E = LocalError> = std::result::Result<T, E>;

//! How a runtime is put together: where its state lives, which bundles it
//! serves and which model providers it can reach.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use keel_core::TurnLimits;
use keel_provider::ModelProvider;

use crate::error::{Result, RuntimeError};

/// The model providers a runtime can use, by provider name.
#[derive(Clone, Default)]
pub struct ProviderSet {
    providers: HashMap<String, Arc<dyn ModelProvider>>,
}

impl ProviderSet {
    pub fn new() -> ProviderSet {
        ProviderSet::default()
    }

    /// Adds `provider` under its own name.
    pub fn with(mut self, provider: Arc<dyn ModelProvider>) -> ProviderSet {
        self.providers.insert(provider.name().to_string(), provider);
        self
    }

    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.providers.keys().cloned().collect();
        names.sort();
        names
    }

    /// Splits `provider:model` and finds the provider.
    pub fn resolve(&self, model_ref: &str) -> Result<(Arc<dyn ModelProvider>, String)> {
        let Some((provider, model)) = model_ref.split_once(':') else {
            return Err(RuntimeError::Config(format!(
                "the model {model_ref:?} does not name a provider; write it as provider:model, for example openai-chat:gpt-4o-mini"
            )));
        };
        match self.providers.get(provider) {
            Some(p) => Ok((p.clone(), model.to_string())),
            None => Err(RuntimeError::Config(format!(
                "the provider {provider:?} (from model {model_ref:?}) is not configured; configured providers: {}",
                self.names().join(", ")
            ))),
        }
    }
}

/// Everything [`crate::Runtime::open`] needs.
#[derive(Clone)]
pub struct RuntimeConfig {
    pub state_dir: PathBuf,
    /// Bundle directories; coworker ids must be unique across them.
    pub bundles: Vec<PathBuf>,
    pub providers: ProviderSet,
    /// Replaces every coworker's model (`provider:model`), for example to
    /// point the example bundle at a local server.
    pub model_override: Option<String>,
    /// Limits for coworkers that do not set their own.
    pub default_limits: TurnLimits,
    pub retry: crate::retry::RetryPolicy,
    /// Tools added to the built-in ones (embedders and tests). They run in
    /// keel's process: they are the embedder's code, not the model's.
    pub extra_tools: Vec<std::sync::Arc<dyn keel_tools::Tool>>,
    /// How to start the sandboxed runner that runs the built-in tools. By
    /// default this executable, which must call
    /// `keel_runner::run_if_requested` first thing in `main`.
    pub runner: keel_runner::RunnerCommand,
    /// How long a session's runner may sit idle before it is stopped.
    pub runner_idle: std::time::Duration,
    /// Secret values by name (provider API keys) that must never be
    /// journaled; see `crate::secrets`.
    pub secrets: Vec<(String, String)>,
    /// Where traces and metrics go (disabled by default; the CLI reads the
    /// standard `OTEL_*` variables). See `crate::telemetry`.
    pub telemetry: keel_telemetry::Telemetry,
}

impl RuntimeConfig {
    pub fn new(state_dir: impl Into<PathBuf>) -> RuntimeConfig {
        RuntimeConfig {
            state_dir: state_dir.into(),
            bundles: Vec::new(),
            providers: ProviderSet::new(),
            model_override: None,
            default_limits: TurnLimits::default(),
            retry: crate::retry::RetryPolicy::default(),
            extra_tools: Vec::new(),
            runner: keel_runner::RunnerCommand::this_executable().unwrap_or_else(|_| keel_runner::RunnerCommand {
                program: "keel".into(),
                args: vec![keel_runner::RUNNER_ARG.into()],
            }),
            runner_idle: std::time::Duration::from_secs(60),
            secrets: Vec::new(),
            telemetry: keel_telemetry::Telemetry::disabled(),
        }
    }
}

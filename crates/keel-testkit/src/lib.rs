//! Test support for keel: a local HTTP/1.1 server that speaks model-provider
//! wire formats exactly as the real APIs do, so providers, the runtime and
//! benchmarks run against real sockets without a network.
//!
//! [`MockServer`] binds `127.0.0.1:0`, records every request
//! ([`RecordedRequest`]) and answers from a queue of scripted [`Reply`]s,
//! then from a fallback [`Responder`] (see [`responders`]) once the queue is
//! empty. It serves three wire formats, each on its real path (with or
//! without the `/v1` prefix): OpenAI Chat Completions at
//! `/v1/chat/completions`, OpenAI Responses at `/v1/responses` and
//! Anthropic Messages at `/v1/messages`. Replies are format-neutral: the same
//! [`Reply`] comes out natively in whichever format was called, including
//! its endings (output limit, safety refusal) and errors ([`ScriptedError`]).
//!
//! The HTTP layer is written on raw tokio TCP, not hyper, so tests can make
//! the server misbehave in ways a correct HTTP library refuses to: cut a body
//! mid-chunk, send garbage, stall between bytes.

mod anthropic;
mod connection;
mod deltas;
mod errors;
mod http;
pub mod mcp_servers;
mod openai_chat;
mod openai_responses;
pub mod otlp;
mod recorded;
mod reply;
pub mod responders;
mod server;
mod wire;

pub use errors::ScriptedError;
pub use recorded::RecordedRequest;
pub use reply::{Reply, ScriptedUsage, ToolCall};
pub use responders::Responder;
pub use server::{MockServer, MockServerBuilder};

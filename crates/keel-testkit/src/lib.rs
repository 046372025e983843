//! Test support for keel: a local HTTP/1.1 server that speaks model-provider
//! wire formats exactly as the real APIs do, so providers, the runtime and
//! benchmarks run against real sockets without a network.
//!
//! [`MockServer`] binds `127.0.0.1:0`, records every request
//! ([`RecordedRequest`]) and answers from a queue of scripted [`Reply`]s,
//! then from a fallback [`Responder`] (see [`responders`]) once the queue is
//! empty. Today it serves the OpenAI Chat Completions format at
//! `/v1/chat/completions`; replies are format-neutral so other formats can be
//! added as encoders beside it.
//!
//! The HTTP layer is written on raw tokio TCP, not hyper, so tests can make
//! the server misbehave in ways a correct HTTP library refuses to: cut a body
//! mid-chunk, send garbage, stall between bytes.

mod connection;
mod http;
mod openai_chat;
mod recorded;
mod reply;
pub mod responders;
mod server;

pub use recorded::RecordedRequest;
pub use reply::{Reply, ScriptedUsage, ToolCall};
pub use responders::Responder;
pub use server::{MockServer, MockServerBuilder};

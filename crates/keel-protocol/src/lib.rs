//! Wire types shared by every keel crate: history items, statuses, journal
//! events and the JSON-RPC protocol.
//!
//! This crate does no I/O and has no async runtime in its dependencies, so
//! clients can depend on it without pulling in tokio or an HTTP stack.

pub mod context;
pub mod event;
pub mod ids;
pub mod interaction;
pub mod item;
pub mod rpc;
pub mod session;
pub mod status;

pub use context::{CompactionReason, CompactionRecord, ContextUsage, WorkingState};
pub use event::{Event, EventKind};
pub use interaction::{DecisionKind, InteractionInfo, InteractionKind, InteractionStatus};
pub use item::{ContentPart, Effect, ImageRef, Item, Role, ToolSpec};
pub use session::{CompactionSettings, Usage};
pub use status::{AttemptStatus, ToolCallStatus, TurnStatus};

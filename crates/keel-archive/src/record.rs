//! The records an archive holds, one JSON object per frame, tagged by
//! `"type"`: a header, full checkpoints, per-event diffs and ownership
//! changes.

use keel_protocol::session::ToolCallInfo;
use keel_protocol::{CompactionRecord, InteractionInfo, Item, TurnStatus, Usage};
use serde::{Deserialize, Serialize};

use crate::state::RunState;

/// One frame's payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// Who wrote the archive; always the first frame, and only there.
    Header(Header),
    /// A full state; the second frame, and again wherever a writer likes.
    /// (Boxed, like `Diff`, so a record list does not pay for the largest.)
    Checkpoint(Box<Checkpoint>),
    /// What one journal event changed.
    Diff(Box<Diff>),
    /// Another keel process took the run over.
    Ownership(Ownership),
}

impl Record {
    /// The record's `"type"` tag.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Header(_) => "header",
            Record::Checkpoint(_) => "checkpoint",
            Record::Diff(_) => "diff",
            Record::Ownership(_) => "ownership",
        }
    }

    /// The journal seq the record stands at (`None` for the header).
    pub fn seq(&self) -> Option<u64> {
        match self {
            Record::Header(_) => None,
            Record::Checkpoint(c) => Some(c.seq),
            Record::Diff(d) => Some(d.seq),
            Record::Ownership(o) => Some(o.seq),
        }
    }
}

impl From<Header> for Record {
    fn from(header: Header) -> Record {
        Record::Header(header)
    }
}

impl From<Checkpoint> for Record {
    fn from(checkpoint: Checkpoint) -> Record {
        Record::Checkpoint(Box::new(checkpoint))
    }
}

impl From<Diff> for Record {
    fn from(diff: Diff) -> Record {
        Record::Diff(Box::new(diff))
    }
}

impl From<Ownership> for Record {
    fn from(ownership: Ownership) -> Record {
        Record::Ownership(ownership)
    }
}

/// The archive's first frame: the session and the keel process that wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub session_id: String,
    pub machine_id: String,
    pub process_id: u32,
    /// A random id of the writing keel process (process ids are reused).
    pub instance_id: String,
    pub keel_version: String,
    pub created_at_ms: i64,
}

impl Header {
    /// The process that wrote the archive, as an [`Owner`].
    pub fn owner(&self) -> Owner {
        Owner {
            machine_id: self.machine_id.clone(),
            process_id: self.process_id,
            instance_id: self.instance_id.clone(),
        }
    }
}

/// A keel process that owns a run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub machine_id: String,
    pub process_id: u32,
    pub instance_id: String,
}

/// The full state of the run at journal seq `seq`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub seq: u64,
    pub state: RunState,
}

/// What one journal event changed. Fields the event did not touch are
/// absent from the JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Diff {
    pub seq: u64,
    pub at_ms: i64,
    /// The journal event kind, such as `item_added`.
    pub kind: String,
    /// History items appended, each with its index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<(u64, Item)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnChange>,
    /// Usage added by this event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Inserted, or replacing the interaction with the same id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction: Option<InteractionInfo>,
    /// The session's new latest compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionRecord>,
    /// Inserted, or replacing the tool call with the same call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call: Option<ToolCallInfo>,
    /// The journal event's own data, so an importer can rebuild the journal
    /// and `keel replay` can read it (for `item_added`, without the item,
    /// which is in `items`). Not applied to the state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

/// A turn started or changed status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnChange {
    pub turn_id: String,
    pub status: TurnStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission_id: Option<String>,
}

/// A different keel process took the run over at journal seq `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ownership {
    pub seq: u64,
    pub at_ms: i64,
    pub from: Owner,
    pub to: Owner,
}

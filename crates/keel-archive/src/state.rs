//! [`RunState`]: a run as an archive carries it, and how diffs and
//! ownership changes move it forward.
//!
//! `apply` checks before it changes anything, so a record it refuses leaves
//! the state as it was.

use keel_protocol::session::{SessionInfo, ToolCallInfo};
use keel_protocol::{CompactionRecord, InteractionInfo, Item, TurnStatus, Usage};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::record::{Checkpoint, Diff, Owner, Record};

/// The state of a run at journal seq `seq`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub session: SessionInfo,
    /// In start order.
    pub turns: Vec<TurnSummary>,
    pub history: Vec<Item>,
    /// Usage of the whole run (kept equal to `session.usage`).
    pub usage: Usage,
    pub interactions: Vec<InteractionInfo>,
    /// The latest compaction.
    pub compaction: Option<CompactionRecord>,
    pub tool_calls: Vec<ToolCallInfo>,
    /// The keel process that owns the run, once known.
    pub owner: Option<Owner>,
    pub seq: u64,
}

/// A turn as an archive keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnSummary {
    pub turn_id: String,
    pub submission_id: Option<String>,
    pub status: TurnStatus,
}

impl RunState {
    /// The state a checkpoint carries; the checkpoint's `seq` wins over the
    /// one inside its state.
    pub fn from_checkpoint(checkpoint: &Checkpoint) -> RunState {
        let mut state = checkpoint.state.clone();
        state.seq = checkpoint.seq;
        state
    }

    /// Applies a diff or an ownership change. Headers and checkpoints are
    /// not changes and are refused.
    pub fn apply(&mut self, record: &Record) -> Result<()> {
        match record {
            Record::Diff(diff) => self.apply_diff(diff),
            Record::Ownership(change) => {
                self.check_order(change.seq)?;
                self.owner = Some(change.to.clone());
                self.seq = change.seq;
                Ok(())
            }
            Record::Header(_) | Record::Checkpoint(_) => Err(Error::NotApplicable { kind: record.kind() }),
        }
    }

    fn check_order(&self, seq: u64) -> Result<()> {
        if seq < self.seq { Err(Error::OutOfOrder { seq, state_seq: self.seq }) } else { Ok(()) }
    }

    fn apply_diff(&mut self, diff: &Diff) -> Result<()> {
        self.check_order(diff.seq)?;
        let next = self.history.len() as u64;
        for (offset, (index, _)) in diff.items.iter().enumerate() {
            let expected = next + offset as u64;
            if *index != expected {
                return Err(Error::IndexGap { seq: diff.seq, expected, found: *index });
            }
        }
        self.history.extend(diff.items.iter().map(|(_, item)| item.clone()));
        self.session.history_len = self.history.len() as u64;
        if let Some(change) = &diff.turn {
            match self.turns.iter_mut().find(|t| t.turn_id == change.turn_id) {
                Some(turn) => {
                    turn.status = change.status;
                    if change.submission_id.is_some() {
                        turn.submission_id.clone_from(&change.submission_id);
                    }
                }
                None => {
                    // A turn seen for the first time has just started, so it
                    // is the session's current turn.
                    self.session.current_turn_id = Some(change.turn_id.clone());
                    self.turns.push(TurnSummary {
                        turn_id: change.turn_id.clone(),
                        submission_id: change.submission_id.clone(),
                        status: change.status,
                    });
                }
            }
        }
        if let Some(usage) = &diff.usage {
            self.usage.add(usage);
            self.session.usage.add(usage);
        }
        if let Some(interaction) = &diff.interaction {
            upsert(&mut self.interactions, interaction, |a, b| a.id == b.id);
        }
        if let Some(compaction) = &diff.compaction {
            self.compaction = Some(compaction.clone());
        }
        if let Some(call) = &diff.tool_call {
            upsert(&mut self.tool_calls, call, |a, b| a.call_id == b.call_id);
        }
        self.seq = diff.seq;
        Ok(())
    }
}

/// Replaces the element `same` as `value`, or appends `value`.
fn upsert<T: Clone>(list: &mut Vec<T>, value: &T, same: impl Fn(&T, &T) -> bool) {
    match list.iter_mut().find(|existing| same(existing, value)) {
        Some(existing) => existing.clone_from(value),
        None => list.push(value.clone()),
    }
}

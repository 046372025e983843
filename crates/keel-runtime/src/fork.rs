//! `session/fork`: a new session whose history is another's up to a point
//! of its journal, so a person can try a different path from any step.
//!
//! The fork pins the same coworker definition as the original (not the
//! bundle as it is now), keeps the original's workspace (files there are as
//! they are now, not as they were at the fork point: keel journals what the
//! coworker did, not the files), its settings, the sensitivity labels of the
//! copied items and the compaction in force at that point. Tool calls the
//! model had made by then without an output get one saying the session was
//! forked before they finished, so the next request is well formed. The new
//! session's journal starts with `session_created` (naming where it came
//! from) and an `item_added` for every copied item, all in one commit.

use std::sync::Arc;

use keel_protocol::ids::{new_id, now_ms};
use keel_protocol::session::SessionInfo;
use keel_protocol::{EventKind, Usage};
use keel_store::NewEvent;
use serde_json::json;

use crate::error::{Result, RuntimeError};
use crate::runtime::Runtime;

/// Journal events read per store call while looking for the fork point.
const PAGE: u32 = 1_000;

impl Runtime {
    /// Forks `session_id` as it was right after event `at_seq`.
    pub async fn fork_session(&self, session_id: &str, at_seq: u64) -> Result<SessionInfo> {
        let slot = self.slot(session_id)?;
        let original = slot.state().info;
        let last = self.store().last_seq(session_id.to_string()).await?;
        if at_seq == 0 || at_seq > last {
            return Err(RuntimeError::InvalidParams(format!(
                "at_seq {at_seq} is not in the session's journal (1..={last}); see `keel events {session_id}`"
            )));
        }
        // How much history existed at that point, and which compaction.
        let mut history_len = 0u64;
        let mut compaction_id = None;
        let mut after = 0;
        while after < at_seq {
            let events = self.store().events(session_id.to_string(), after, PAGE).await?;
            if events.is_empty() {
                break;
            }
            for event in events.iter().take_while(|e| e.seq <= at_seq) {
                match event.kind.as_str() {
                    "item_added" => history_len = event.data["index"].as_u64().map_or(history_len, |i| i + 1),
                    "compacted" => compaction_id = event.data["compaction_id"].as_str().map(str::to_string),
                    _ => {}
                }
            }
            after = events.last().map_or(at_seq, |e| e.seq);
        }
        let mut items = self.store().history(session_id.to_string(), 0).await?;
        items.truncate(history_len as usize);
        let closing = keel_core::recovery::close_unanswered(
            &items,
            &[],
            "the session was forked from another before this call finished",
        );
        items.extend(closing.into_iter().map(|(item, _)| item));
        let compaction = match compaction_id {
            Some(id) => {
                self.store().compactions(Some(session_id.to_string()), false).await?.into_iter().find(|c| c.id == id)
            }
            None => None,
        };
        let now = now_ms();
        let info = SessionInfo {
            id: new_id("ses"),
            name: format!("{} (fork at {at_seq})", original.name),
            provider_blocked: false,
            created_at_ms: now,
            updated_at_ms: now,
            current_turn_id: None,
            history_len: 0,
            usage: Usage::default(),
            labels: original.labels.range(..history_len).map(|(k, v)| (*k, *v)).collect(),
            ..original.clone()
        };
        let compaction = compaction.map(|mut record| {
            record.id = new_id("cmp");
            record.session_id = info.id.clone();
            record
        });
        let from = json!({ "forked_from": { "session_id": session_id, "seq": at_seq } });
        self.insert_session_with(info, from, |state, change| {
            for item in items {
                crate::driver::push_item(change, &mut state.info, "", item);
            }
            if let Some(record) = compaction {
                change.events.push(NewEvent::new(EventKind::Compacted, crate::compaction::compacted_event(&record)));
                change.compaction = Some(record.clone());
                state.compaction = Some(Arc::new(record));
            }
            Ok(())
        })
        .await
    }
}

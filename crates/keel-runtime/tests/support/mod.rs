//! Shared steps of the runtime's integration tests.

#![allow(dead_code, clippy::unwrap_used)]

use keel_protocol::session::SessionInfo;
use keel_runtime::{BusMessage, NewSession, Runtime};
use serde_json::Value;

/// An attended session of coworker `c` working in `workspace`.
/// A session of coworker `c` whose workspace is `<dir>/ws`.
pub async fn session(runtime: &Runtime, dir: &std::path::Path) -> SessionInfo {
    let workspace = dir.join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    runtime
        .create_session(NewSession {
            name: "s".into(),
            coworker: "c".into(),
            workspace: workspace.display().to_string(),
            attended: true,
            compaction: None,
        })
        .await
        .unwrap()
}

/// Starts a turn and waits for its `turn_finished` event; returns its data.
pub async fn turn(runtime: &Runtime, session: &str, submission: &str) -> Value {
    let mut events = runtime.subscribe(session, runtime.snapshot_last_seq(session).await.unwrap()).await.unwrap();
    runtime.start_turn(session, submission, "go").await.unwrap();
    loop {
        if let Some(BusMessage::Event(event)) = events.next().await.unwrap()
            && event.kind == "turn_finished"
        {
            return event.data;
        }
    }
}

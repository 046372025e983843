//! The store contract: atomic changes, gap-free seqs, isolated failures.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_protocol::session::SessionInfo;
use keel_protocol::{CompactionSettings, EventKind, Item, Usage};
use keel_store::{Change, Store, StoreError};
use keel_store_sqlite::SqliteStore;
use serde_json::json;

fn session(id: &str) -> SessionInfo {
    SessionInfo {
        id: id.into(),
        name: "n".into(),
        coworker: "c".into(),
        bundle_path: "/b".into(),
        bundle_digest: "sha256:0".into(),
        coworker_spec: std::sync::Arc::new(json!({})),
        workspace: "/w".into(),
        attended: true,
        compaction: CompactionSettings::default(),
        provider_blocked: false,
        created_at_ms: 1,
        updated_at_ms: 1,
        current_turn_id: None,
        history_len: 0,
        usage: Usage::default(),
        labels: Default::default(),
        owner: None,
    }
}

fn create(id: &str) -> Change {
    let mut change = Change::new(id).event(EventKind::SessionCreated, json!({}));
    change.session = Some(session(id));
    change.new_session = true;
    change
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seqs_are_gap_free_and_a_failed_change_rolls_back_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    store.commit(create("s1")).await.unwrap();
    let conn = rusqlite::Connection::open(store.path()).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER fail BEFORE INSERT ON events WHEN NEW.kind='turn_started' BEGIN SELECT RAISE(ABORT,'injected'); END;",
    )
    .unwrap();
    // Many changes at once, every third one refused by the trigger.
    let mut pending = Vec::new();
    for n in 0..30u64 {
        let mut change = Change::new("s1");
        change.history.push((n, Item::user_text(format!("m{n}"))));
        let kind = if n % 3 == 0 { EventKind::TurnStarted } else { EventKind::ItemAdded };
        change = change.event(kind, json!({"n": n}));
        let store = store.clone();
        // Spawned so the changes queue up together and share transactions.
        pending.push(tokio::spawn(async move { store.commit(change).await }));
    }
    let mut ok = 0;
    for (n, handle) in pending.into_iter().enumerate() {
        match handle.await.unwrap() {
            Ok(events) => {
                ok += 1;
                assert_eq!(events.len(), 1);
            }
            Err(StoreError::Rejected(message)) => {
                assert_eq!(n % 3, 0);
                assert!(message.contains("injected"), "{message}");
            }
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert_eq!(ok, 20);
    let events = store.events("s1".into(), 0, 1000).await.unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=21).collect::<Vec<_>>(), "gap-free from 1");
    let history = store.history("s1".into(), 0).await.unwrap();
    assert_eq!(history.len(), 20, "refused changes left no history");
    assert!(!events.iter().any(|e| e.kind == "turn_started"));
    let texts: Vec<String> = history.iter().filter_map(Item::message_text).collect();
    assert!(texts.iter().all(|t| t[1..].parse::<u64>().unwrap() % 3 != 0));
    assert_eq!(store.last_seq("s1".into()).await.unwrap(), 21);
}

#[tokio::test]
async fn duplicate_history_index_and_unknown_session_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    store.commit(create("s1")).await.unwrap();
    let mut change = Change::new("s1").event(EventKind::ItemAdded, json!({}));
    change.history.push((0, Item::user_text("a")));
    store.commit(change.clone()).await.unwrap();
    assert!(matches!(store.commit(change).await, Err(StoreError::Rejected(_))));
    let orphan = Change::new("nope").event(EventKind::ItemAdded, json!({}));
    assert!(matches!(store.commit(orphan).await, Err(StoreError::Rejected(_))));
    assert_eq!(store.last_seq("s1".into()).await.unwrap(), 2);
}

#[tokio::test]
async fn reopening_keeps_everything_and_read_only_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SqliteStore::open(dir.path()).unwrap();
        store.commit(create("s1")).await.unwrap();
    }
    let store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(store.sessions().await.unwrap().len(), 1);
    let reader = SqliteStore::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.session("s1".into()).await.unwrap().map(|s| s.id), Some("s1".to_string()));
    assert!(matches!(reader.commit(create("s2")).await, Err(StoreError::ReadOnly)));
}

fn ledger_row(
    call_id: &str,
    turn_id: &str,
    status: keel_protocol::ToolCallStatus,
) -> keel_protocol::session::ToolCallInfo {
    keel_protocol::session::ToolCallInfo {
        session_id: "s1".into(),
        call_id: call_id.into(),
        turn_id: turn_id.into(),
        name: "shell.run".into(),
        arguments: "{}".into(),
        status,
        output: None,
        is_error: false,
        started_at_ms: 1,
        finished_at_ms: None,
    }
}

/// A provider that reuses call ids must never make one call's ledger row
/// stand for another's: that once hid a dispatched side effect from
/// recovery. The same call moving through its statuses is fine.
#[tokio::test]
async fn a_ledger_row_is_never_overwritten_by_another_turns_call() {
    use keel_protocol::ToolCallStatus;
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    store.commit(create("s1")).await.unwrap();
    for status in [ToolCallStatus::Intended, ToolCallStatus::Started, ToolCallStatus::Completed] {
        let mut change = Change::new("s1").event(EventKind::ToolCallStarted, json!({}));
        change.tool_calls.push(ledger_row("call_1", "turn_a", status));
        store.commit(change).await.unwrap();
    }
    let mut change = Change::new("s1").event(EventKind::ToolCallStarted, json!({}));
    change.tool_calls.push(ledger_row("call_1", "turn_b", ToolCallStatus::Started));
    let refused = store.commit(change).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Rejected(m) if m.contains("call_1")), "{refused}");
    let ledger = store.tool_calls("s1".into(), None).await.unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].turn_id, "turn_a");
    assert_eq!(ledger[0].status, ToolCallStatus::Completed, "untouched by the refused change");
    assert_eq!(store.last_seq("s1".into()).await.unwrap(), 4, "the refused change burnt no seq");
}

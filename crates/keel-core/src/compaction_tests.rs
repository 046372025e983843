use keel_protocol::{CompactionReason, CompactionRecord, Item, Usage};

use super::*;

fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

fn call(id: &str, name: &str, args: &str) -> Item {
    Item::FunctionCall { call_id: id.into(), name: name.into(), arguments: args.into() }
}

fn record(boundary: u64, users: Vec<String>) -> CompactionRecord {
    CompactionRecord {
        id: "cmp_1".into(),
        session_id: "ses_1".into(),
        number: 1,
        boundary,
        summary: "We agreed on the plan.".into(),
        users,
        dropped_users: 0,
        working_state: WorkingState::default(),
        trimmed: false,
        reason: CompactionReason::Manual,
        tokens_before: 0,
        tokens_after: 0,
        model: None,
        usage: Usage::default(),
        history_len: 0,
        created_at_ms: 0,
        duration_ms: 0,
    }
}

#[test]
fn the_boundary_never_separates_a_call_from_its_output() {
    let history = vec![
        Item::user_text("one two three"),
        call("a", "fs__read_file", "{}"),
        call("b", "fs__read_file", "{}"),
        Item::tool_output("a", "x"),
        Item::tool_output("b", "y"),
        Item::assistant_text("done"),
    ];
    let tokens: Vec<u64> = history.iter().map(|i| item_tokens(i, &words)).collect();
    for cut in 0..=history.len() {
        let clean = is_clean_cut(&history, cut);
        assert_eq!(clean, !(2..=4).contains(&cut), "cut at {cut}");
    }
    // A budget that would keep only the second output moves the cut past it.
    let keep = tokens[4] + tokens[5];
    assert_eq!(choose_boundary(&history, &tokens, 0, keep), Some(5));
    // Nothing new to compact when the cut is not past the previous boundary.
    assert_eq!(choose_boundary(&history, &tokens, 5, keep), None);
    assert_eq!(choose_boundary(&history, &tokens, 0, u64::MAX), None);
}

#[test]
fn the_outbound_view_is_the_block_then_history_after_the_boundary() {
    let history = vec![Item::user_text("keep BLUE"), Item::assistant_text("ok"), Item::user_text("next")];
    assert_eq!(outbound(&history, None), history);
    let view = outbound(&history, Some(&record(2, vec!["keep BLUE".into()])));
    assert_eq!(view.len(), 2);
    let block = view[0].message_text().unwrap_or_default();
    assert!(block.contains("We agreed on the plan.") && block.contains("- keep BLUE"), "{block}");
    assert!(matches!(&view[0], Item::Message { runtime_notice: Some(n), .. } if n == COMPACTION_NOTICE));
    assert_eq!(view[1], history[2]);
}

#[test]
fn person_messages_keep_the_first_and_the_latest_within_the_cap() {
    let mut history = vec![Item::user_text("original task: never deploy")];
    for n in 0..10 {
        history.push(Item::assistant_text("reply"));
        history.push(Item::user_text(format!("step {n} a b c")));
    }
    // Each later message is 5 words; the first is 4.
    let (kept, dropped) = person_messages(&history, 4 + 15, &words);
    assert_eq!(kept, vec!["original task: never deploy", "step 7 a b c", "step 8 a b c", "step 9 a b c"]);
    assert_eq!(dropped, 7);
    let (all, none) = person_messages(&history, 1_000, &words);
    assert_eq!((all.len(), none), (11, 0));
}

#[test]
fn working_state_is_read_from_the_tool_calls() {
    let history = vec![
        call("1", "fs__write_file", r#"{"path":"notes/plan.md","content":"x"}"#),
        call("2", "fs__read_file", r#"{"path":"README.md"}"#),
        call("3", "fs__write_file", r#"{"path":"notes/plan.md","content":"y"}"#),
        call("4", "shell__run", r#"{"command":"cargo test"}"#),
        call("5", "broken", "{not json"),
    ];
    let state = working_state(&history);
    assert_eq!(state.files_written, vec!["notes/plan.md"]);
    assert_eq!(state.files_read, vec!["README.md"]);
    assert_eq!(state.commands_run, vec!["cargo test"]);
    assert_eq!(state.tool_calls.get("fs__write_file"), Some(&2));
    assert_eq!(state.tool_calls.get("broken"), Some(&1));
}

#[test]
fn a_long_transcript_leaves_out_the_middle_and_says_so() {
    let items: Vec<Item> = (0..50).map(|n| Item::user_text(format!("message {n} {}", "z".repeat(100)))).collect();
    let text = transcript(None, &items, 2_000);
    assert!(text.len() <= 2_200, "{}", text.len());
    assert!(text.contains("message 0 ") && text.contains("message 49 "));
    assert!(text.contains("items omitted for length"));
}

//! Outbound-only compaction: where to cut, what stands in for the cut part,
//! and the view the model is sent. Pure functions; the runtime counts
//! tokens, calls the summarizer and commits the record.
//!
//! The record keeps three things, so that losing the summary loses as little
//! as possible:
//! - the model's summary (may be empty when keel had to trim);
//! - the person's own messages before the boundary, verbatim: a model never
//!   paraphrases what the person asked for;
//! - a mechanical working state read from the tool calls: files written and
//!   read, commands run.
//!
//! The boundary never separates a tool call from its output: a provider
//! refuses a request whose output has no call.

use std::collections::{BTreeMap, HashSet};

use keel_protocol::{CompactionRecord, ContentPart, Item, Role, WorkingState};

/// The `_runtime_notice` of the compaction block, so a reader can tell it
/// is not the person speaking.
pub const COMPACTION_NOTICE: &str = "compaction";

/// Tokens counted for an image reference (an estimate: providers charge
/// roughly 250–1,600 per image depending on size).
pub const IMAGE_TOKENS: u64 = 800;

/// Most commands kept in the working state (the most recent ones).
const MAX_COMMANDS: usize = 40;
/// Most paths kept per list in the working state.
const MAX_PATHS: usize = 200;
/// Characters of one item kept in the summarizer's transcript.
const TRANSCRIPT_ITEM_CHARS: usize = 2_000;

/// The instructions the summarizer gets.
pub const SUMMARY_INSTRUCTIONS: &str = "You compact the early part of a conversation between a person and an AI coworker so the coworker can go on without it. Write a concise summary in plain text that keeps everything needed to continue the work: the task and its goal, every constraint, rule or preference the person stated (word for word when short), decisions made and why, names of files, paths, identifiers and values that matter, what was done, what failed, and what is still open. Do not add advice or anything that did not happen. Do not address the person.";

/// Tokens of one history item under `count`, with a small per-item
/// overhead for the wire format's framing.
pub fn item_tokens(item: &Item, count: &dyn Fn(&str) -> u64) -> u64 {
    match item {
        Item::Message { content, .. } => 4 + content.iter().map(|part| count(part.text())).sum::<u64>(),
        Item::FunctionCall { name, arguments, .. } => 8 + count(name) + count(arguments),
        Item::FunctionCallOutput { output, images, .. } => 6 + count(output) + IMAGE_TOKENS * images.len() as u64,
    }
}

/// The message that stands for everything before the record's boundary.
pub fn block_item(record: &CompactionRecord) -> Item {
    Item::Message {
        role: Role::User,
        content: vec![ContentPart::InputText { text: block_text(record) }],
        runtime_notice: Some(COMPACTION_NOTICE.into()),
    }
}

/// The text of the compaction block.
pub fn block_text(record: &CompactionRecord) -> String {
    let mut text = format!(
        "[keel: context compacted (#{})] The conversation before this point was replaced by this record to fit the model's context. It was written by keel, not by the person.\n\n## Summary\n",
        record.number
    );
    if record.trimmed || record.summary.trim().is_empty() {
        text.push_str("(No summary: the summarizer failed, so the oldest part of the conversation was dropped. The person's messages and the working state below are complete; ask the person if something else from earlier is needed.)\n");
    } else {
        text.push_str(record.summary.trim());
        text.push('\n');
    }
    if !record.users.is_empty() {
        text.push_str("\n## The person's messages before this point (verbatim, oldest first)\n");
        for (n, message) in record.users.iter().enumerate() {
            if n == 1 && record.dropped_users > 0 {
                text.push_str(&format!("({} messages in between are not shown)\n", record.dropped_users));
            }
            text.push_str(&format!("- {}\n", message.trim()));
        }
    }
    let state = &record.working_state;
    let lists = [("Files written", &state.files_written), ("Files read", &state.files_read)];
    if lists.iter().any(|(_, l)| !l.is_empty()) || !state.commands_run.is_empty() || !state.tool_calls.is_empty() {
        text.push_str("\n## Working state (recorded by keel from the tool calls)\n");
        for (label, list) in lists {
            if !list.is_empty() {
                text.push_str(&format!("{label}: {}\n", list.join(", ")));
            }
        }
        if !state.commands_run.is_empty() {
            text.push_str("Commands run");
            if state.commands_dropped > 0 {
                text.push_str(&format!(" (the last {}; {} earlier)", state.commands_run.len(), state.commands_dropped));
            }
            text.push_str(":\n");
            for command in &state.commands_run {
                text.push_str(&format!("- {command}\n"));
            }
        }
        if !state.tool_calls.is_empty() {
            let calls: Vec<String> = state.tool_calls.iter().map(|(name, n)| format!("{name} ×{n}")).collect();
            text.push_str(&format!("Tool calls: {}\n", calls.join(", ")));
        }
    }
    text
}

/// What the model is sent after the instructions: the compaction block,
/// then history from the boundary on. Without a record, all of history.
pub fn outbound(history: &[Item], record: Option<&CompactionRecord>) -> Vec<Item> {
    match record {
        None => history.to_vec(),
        Some(record) => {
            let from = (record.boundary as usize).min(history.len());
            let mut view = Vec::with_capacity(history.len() - from + 1);
            view.push(block_item(record));
            view.extend_from_slice(&history[from..]);
            view
        }
    }
}

/// Whether cutting at `boundary` keeps every tool output with its call.
pub fn is_clean_cut(history: &[Item], boundary: usize) -> bool {
    let before: HashSet<&str> = history[..boundary]
        .iter()
        .filter_map(|item| match item {
            Item::FunctionCall { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    !history[boundary..]
        .iter()
        .any(|item| matches!(item, Item::FunctionCallOutput { call_id, .. } if before.contains(call_id.as_str())))
}

/// The boundary for a compaction: the earliest clean cut after which the
/// kept history fits `keep_tokens` (`tokens[i]` is item `i`'s count).
/// `None` when that cut is not past `previous` (nothing new to compact).
pub fn choose_boundary(history: &[Item], tokens: &[u64], previous: u64, keep_tokens: u64) -> Option<u64> {
    let len = history.len();
    let mut boundary = len;
    let mut kept = 0u64;
    while boundary > 0 && kept + tokens[boundary - 1] <= keep_tokens {
        kept += tokens[boundary - 1];
        boundary -= 1;
    }
    while boundary < len && !is_clean_cut(history, boundary) {
        boundary += 1;
    }
    (boundary as u64 > previous).then_some(boundary as u64)
}

/// Whether an item is a person's own message (not a runtime notice).
pub fn is_person_message(item: &Item) -> bool {
    matches!(item, Item::Message { role: Role::User, runtime_notice: None, .. })
}

fn person_text(item: &Item) -> Option<String> {
    if is_person_message(item) { item.message_text() } else { None }
}

/// The person's messages in `history` (before the boundary), verbatim,
/// capped at `budget_tokens`: the first message (usually the task) and the
/// most recent ones are kept. Returns the kept messages, oldest first, and
/// how many were left out.
pub fn person_messages(history: &[Item], budget_tokens: u64, count: &dyn Fn(&str) -> u64) -> (Vec<String>, u32) {
    let all: Vec<String> = history.iter().filter_map(person_text).collect();
    let Some((first, rest)) = all.split_first() else { return (Vec::new(), 0) };
    let first_budget = budget_tokens.max(16);
    let mut spent = count(first);
    let first = if spent > first_budget {
        // Keep the start of an oversized first message; say it was cut.
        let keep = (first.len() as u64 * first_budget / spent.max(1)) as usize;
        let mut cut = keep.min(first.len());
        while !first.is_char_boundary(cut) {
            cut -= 1;
        }
        spent = first_budget;
        format!("{} […{} more characters not shown]", &first[..cut], first.len() - cut)
    } else {
        first.clone()
    };
    let mut recent = Vec::new();
    for message in rest.iter().rev() {
        let tokens = count(message);
        if spent + tokens > budget_tokens {
            break;
        }
        spent += tokens;
        recent.push(message.clone());
    }
    let dropped = (rest.len() - recent.len()) as u32;
    recent.reverse();
    let mut kept = vec![first];
    kept.extend(recent);
    (kept, dropped)
}

/// What the tool calls in `history` did, read from their names and
/// arguments. Names are model-visible (`fs__write_file`); a tool counts as
/// writing when its name says write/edit/create/append/patch and it has a
/// `path`, as reading when it says read, and as a command when it has a
/// `command` argument.
pub fn working_state(history: &[Item]) -> WorkingState {
    let mut state = WorkingState::default();
    let mut commands = Vec::new();
    let mut tool_calls: BTreeMap<String, u32> = BTreeMap::new();
    for item in history {
        let Item::FunctionCall { name, arguments, .. } = item else { continue };
        *tool_calls.entry(name.clone()).or_default() += 1;
        let Ok(args) = serde_json::from_str::<serde_json::Value>(arguments) else { continue };
        let tool = name.rsplit("__").next().unwrap_or(name).to_ascii_lowercase();
        let path = args.get("path").and_then(|p| p.as_str());
        if let Some(path) = path {
            let writes = ["write", "edit", "create", "append", "patch", "delete", "move"];
            if writes.iter().any(|w| tool.contains(w)) {
                push_unique(&mut state.files_written, path);
            } else if tool.contains("read") {
                push_unique(&mut state.files_read, path);
            }
        }
        if let Some(command) = args.get("command").and_then(|c| c.as_str()) {
            commands.push(command.to_string());
        }
    }
    if commands.len() > MAX_COMMANDS {
        state.commands_dropped = (commands.len() - MAX_COMMANDS) as u32;
        commands.drain(..commands.len() - MAX_COMMANDS);
    }
    state.commands_run = commands;
    state.tool_calls = tool_calls;
    state
}

fn push_unique(list: &mut Vec<String>, path: &str) {
    if list.len() < MAX_PATHS && !list.iter().any(|p| p == path) {
        list.push(path.to_string());
    }
}

/// The transcript the summarizer reads: the previous summary, then the
/// items being compacted, each cut to its share of `budget_chars` (at most
/// 2,000 characters). When the whole is still over, items in the middle are
/// left out (and counted).
pub fn transcript(previous: Option<&CompactionRecord>, items: &[Item], budget_chars: usize) -> String {
    // Share the budget so every item shows at least its start.
    let per_item = (budget_chars / items.len().max(1)).clamp(200, TRANSCRIPT_ITEM_CHARS);
    let mut lines: Vec<String> = items.iter().map(|item| render(item, per_item)).collect();
    let mut head = String::new();
    if let Some(previous) = previous.filter(|p| !p.summary.trim().is_empty()) {
        head = format!("[summary of the conversation before this part]\n{}\n\n", previous.summary.trim());
    }
    let total = |lines: &[String]| lines.iter().map(|l| l.len() + 1).sum::<usize>();
    let mut omitted = 0;
    while lines.len() > 2 && head.len() + total(&lines) > budget_chars {
        lines.remove(lines.len() / 2);
        omitted += 1;
    }
    if omitted > 0 {
        lines.insert(lines.len() / 2, format!("[… {omitted} items omitted for length …]"));
    }
    format!("{head}{}", lines.join("\n"))
}

fn render(item: &Item, max_chars: usize) -> String {
    let (label, text) = match item {
        Item::Message { role, runtime_notice, .. } => {
            let who = match (role, runtime_notice) {
                (_, Some(_)) => "keel notice",
                (Role::User, None) => "person",
                (Role::Assistant, None) => "coworker",
                (Role::System | Role::Developer, None) => "instructions",
            };
            (who.to_string(), item.message_text().unwrap_or_default())
        }
        Item::FunctionCall { name, arguments, .. } => (format!("tool call {name}"), arguments.clone()),
        Item::FunctionCallOutput { output, images, .. } => {
            let label =
                if images.is_empty() { "tool result".into() } else { format!("tool result, {} images", images.len()) };
            (label, output.clone())
        }
    };
    format!("[{label}] {}", clip(&text, max_chars))
}

fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{} […{} more characters]", &text[..cut], text.len() - cut)
}

#[cfg(test)]
#[path = "compaction_tests.rs"]
mod tests;

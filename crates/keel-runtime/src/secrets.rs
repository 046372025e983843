//! Secrets never reach the journal.
//!
//! keel knows which values are secret: the API keys of its providers, the
//! values of the environment variables a coworker's resource policy passes
//! to its tools, and the environment and header values of MCP servers. Any
//! of them appearing in something about to be journaled (a tool's output,
//! a model's text or call arguments, a person's message) is replaced by
//! `[redacted:<NAME>]` first, in the copy kept in memory too, so what keel
//! serves, what the model sees next and what is on disk agree. Values
//! shorter than 8 characters are not treated as secrets (they would match
//! ordinary words).
//!
//! The set is process-wide and only grows: a value registered by one
//! runtime stays secret for every runtime in the process.

use std::borrow::Cow;
use std::sync::{PoisonError, RwLock};

use keel_protocol::{ContentPart, Item};

/// The shortest value treated as a secret.
const MIN_LEN: usize = 8;

static SECRETS: RwLock<Vec<(String, String)>> = RwLock::new(Vec::new());

/// Adds `(name, value)` pairs to the secret set.
pub fn register(secrets: impl IntoIterator<Item = (String, String)>) {
    let mut set = SECRETS.write().unwrap_or_else(PoisonError::into_inner);
    for (name, value) in secrets {
        if value.len() >= MIN_LEN && !set.iter().any(|(_, v)| *v == value) {
            set.push((name, value));
        }
    }
    // Longest first, so a secret that contains another is replaced whole.
    set.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
}

/// `text` with every secret value replaced.
pub fn redact(text: &str) -> Cow<'_, str> {
    let set = SECRETS.read().unwrap_or_else(PoisonError::into_inner);
    let mut out: Cow<'_, str> = Cow::Borrowed(text);
    for (name, value) in set.iter() {
        if out.contains(value.as_str()) {
            out = Cow::Owned(out.replace(value.as_str(), &format!("[redacted:{name}]")));
        }
    }
    out
}

/// `item` with every secret value replaced in its text.
pub fn redact_item(item: Item) -> Item {
    let fix = |text: String| match redact(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(clean) => clean,
    };
    match item {
        Item::Message { role, content, runtime_notice } => Item::Message {
            role,
            content: content
                .into_iter()
                .map(|part| match part {
                    ContentPart::InputText { text } => ContentPart::InputText { text: fix(text) },
                    ContentPart::OutputText { text } => ContentPart::OutputText { text: fix(text) },
                })
                .collect(),
            runtime_notice,
        },
        Item::FunctionCall { call_id, name, arguments } => {
            Item::FunctionCall { call_id, name, arguments: fix(arguments) }
        }
        Item::FunctionCallOutput { call_id, output, images } => {
            Item::FunctionCallOutput { call_id, output: fix(output), images }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_values_are_replaced_everywhere_and_short_ones_ignored() {
        register([
            ("TEST_KEY".to_string(), "sk-test-secret-value-123".to_string()),
            ("SHORT".to_string(), "abc".to_string()),
        ]);
        assert_eq!(redact("key sk-test-secret-value-123 end"), "key [redacted:TEST_KEY] end");
        assert_eq!(redact("abc stays"), "abc stays");
        let item = redact_item(Item::tool_output("c", "printed sk-test-secret-value-123"));
        assert!(matches!(item, Item::FunctionCallOutput { output, .. } if output == "printed [redacted:TEST_KEY]"));
    }
}

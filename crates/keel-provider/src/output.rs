//! Assembling output items from a stream that numbers its output: the
//! `output_index` of the Responses API, the content block `index` of the
//! Anthropic Messages API.
//!
//! Each numbered block is text, a function call, or something keel does not
//! keep (reasoning, thinking). Text and arguments arrive as deltas; a later
//! "done" event may restate a block in full, and then it wins. Blocks come
//! out in index order; adjacent text blocks join into one assistant message,
//! since keel's history has no use for the split.

use std::collections::BTreeMap;

use keel_protocol::Item;

#[derive(Debug, Default)]
pub(crate) struct OutputBlocks {
    blocks: BTreeMap<u64, Block>,
}

#[derive(Debug)]
enum Block {
    Text(String),
    Call {
        id: Option<String>,
        name: String,
        arguments: String,
    },
    /// Reasoning and other blocks that are not stored.
    Ignored,
}

impl OutputBlocks {
    /// Starts a text block, unless deltas already started it.
    pub fn start_text(&mut self, index: u64) {
        self.blocks.entry(index).or_insert_with(|| Block::Text(String::new()));
    }

    /// Appends to a text block, starting it when its start was never seen.
    pub fn push_text(&mut self, index: u64, delta: &str) {
        match self.blocks.entry(index).or_insert_with(|| Block::Text(String::new())) {
            Block::Text(text) => text.push_str(delta),
            Block::Call { .. } | Block::Ignored => {}
        }
    }

    /// Replaces a text block with its complete text.
    pub fn set_text(&mut self, index: u64, text: String) {
        self.blocks.insert(index, Block::Text(text));
    }

    /// Starts (or restates) a function call; arguments seen so far are kept
    /// unless `arguments` is given in full.
    pub fn start_call(&mut self, index: u64, id: Option<String>, name: String, arguments: Option<String>) {
        let id = id.filter(|id| !id.is_empty());
        match self.blocks.get_mut(&index) {
            Some(Block::Call { id: old_id, name: old_name, arguments: old_arguments }) => {
                if id.is_some() {
                    *old_id = id;
                }
                if !name.is_empty() {
                    *old_name = name;
                }
                if let Some(arguments) = arguments {
                    *old_arguments = arguments;
                }
            }
            _ => {
                self.blocks.insert(index, Block::Call { id, name, arguments: arguments.unwrap_or_default() });
            }
        }
    }

    /// Appends a fragment of a call's arguments.
    pub fn push_arguments(&mut self, index: u64, fragment: &str) {
        if let Some(Block::Call { arguments, .. }) = self.blocks.get_mut(&index) {
            arguments.push_str(fragment);
        }
    }

    /// Replaces a call's arguments with their complete text.
    pub fn set_arguments(&mut self, index: u64, complete: String) {
        if let Some(Block::Call { arguments, .. }) = self.blocks.get_mut(&index) {
            *arguments = complete;
        }
    }

    /// Marks a block as one keel does not store.
    pub fn ignore(&mut self, index: u64) {
        self.blocks.insert(index, Block::Ignored);
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    pub fn has_calls(&self) -> bool {
        self.blocks.values().any(|block| matches!(block, Block::Call { .. }))
    }

    /// All the text, joined.
    pub fn text(&self) -> String {
        self.blocks
            .values()
            .filter_map(|block| match block {
                Block::Text(text) => Some(text.as_str()),
                Block::Call { .. } | Block::Ignored => None,
            })
            .collect()
    }

    /// Whether there is text or a call to keep.
    pub fn has_output(&self) -> bool {
        self.blocks.values().any(|block| match block {
            Block::Text(text) => !text.is_empty(),
            Block::Call { .. } => true,
            Block::Ignored => false,
        })
    }

    /// The items, in output order. A call without arguments gets `{}`, the
    /// empty object, which is what a call without parameters means; a call
    /// without an id gets a fresh one.
    pub fn into_items(self) -> Vec<Item> {
        let mut items = Vec::with_capacity(self.blocks.len());
        let mut text = String::new();
        for block in self.blocks.into_values() {
            match block {
                Block::Text(more) => text.push_str(&more),
                Block::Call { id, name, arguments } => {
                    if !text.is_empty() {
                        items.push(Item::assistant_text(std::mem::take(&mut text)));
                    }
                    let arguments = if arguments.trim().is_empty() { "{}".to_owned() } else { arguments };
                    let call_id = id.unwrap_or_else(|| keel_protocol::ids::new_id("call"));
                    items.push(Item::FunctionCall { call_id, name, arguments });
                }
                Block::Ignored => {}
            }
        }
        if !text.is_empty() {
            items.push(Item::assistant_text(text));
        }
        items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_out_in_index_order_with_adjacent_text_joined() {
        let mut blocks = OutputBlocks::default();
        blocks.start_call(3, Some("c1".into()), "read".into(), None);
        blocks.push_arguments(3, "{\"a\"");
        blocks.push_arguments(3, ":1}");
        blocks.push_text(1, "Hello");
        blocks.ignore(0);
        blocks.push_text(2, " there");
        blocks.start_call(4, None, "list".into(), None);
        blocks.push_text(5, "");
        assert!(blocks.has_calls() && blocks.has_output());
        let items = blocks.into_items();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0], Item::assistant_text("Hello there"));
        assert_eq!(
            items[1],
            Item::FunctionCall { call_id: "c1".into(), name: "read".into(), arguments: "{\"a\":1}".into() }
        );
        match &items[2] {
            Item::FunctionCall { call_id, name, arguments } => {
                assert!(call_id.starts_with("call_"), "{call_id}");
                assert_eq!((name.as_str(), arguments.as_str()), ("list", "{}"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn complete_restatements_win_over_deltas() {
        let mut blocks = OutputBlocks::default();
        blocks.push_text(0, "Hel");
        blocks.set_text(0, "Hello".into());
        blocks.start_call(1, Some("c".into()), "f".into(), None);
        blocks.push_arguments(1, "{\"x\":");
        blocks.set_arguments(1, "{\"x\":2}".into());
        blocks.start_call(1, None, String::new(), None);
        let items = blocks.into_items();
        assert_eq!(
            items,
            vec![
                Item::assistant_text("Hello"),
                Item::FunctionCall { call_id: "c".into(), name: "f".into(), arguments: "{\"x\":2}".into() }
            ]
        );
    }

    #[test]
    fn ignored_blocks_are_no_output() {
        let mut blocks = OutputBlocks::default();
        blocks.ignore(0);
        assert!(!blocks.is_empty() && !blocks.has_output() && !blocks.has_calls());
        assert_eq!(blocks.into_items(), vec![]);
    }
}

//! keel's own identity for every tool call.
//!
//! The effect ledger, recovery and the pairing of a call with its output all
//! key on a call's id, so that id must be unique within a session. Providers
//! do not promise that: OpenAI-compatible servers vary (some number calls per
//! response, so every response has a `call_1`), some send no id at all, and
//! a hostile or broken server can send anything. Trusting them once let a
//! crashed side-effecting call look "never dispatched" after a restart,
//! because an earlier turn's `call_1` owned the ledger row.
//!
//! So before a response's items are journaled, [`assign_call_ids`] keeps the
//! provider's id when it is usable (non-empty, at most
//! [`MAX_CALL_ID_LEN`] bytes of `[A-Za-z0-9_-]`, the set every provider
//! accepts back) and unused in the session and the response, and otherwise
//! gives the call a keel id derived from the turn, the step and the call's
//! position. The same id goes on the wire from then on, consistently for the
//! call and its output, which every provider accepts (they only require that
//! a call and its output match). The renames are returned so the driver can
//! journal which provider id became which keel id.
//!
//! Choice: rewriting only what is unusable keeps well-behaved providers'
//! ids (and so their logs and caches) untouched; always minting keel ids
//! would be simpler but would change every recorded run. The store refuses
//! any ledger write that would overwrite another call's row, as a second line.

use std::collections::HashSet;

use keel_protocol::Item;

/// The longest provider call id kept as it is.
pub const MAX_CALL_ID_LEN: usize = 64;

/// A provider's call id that keel replaced, and the id it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenamedCall {
    /// What the provider sent (cut to [`MAX_CALL_ID_LEN`] characters for the record).
    pub provider_call_id: String,
    /// The id keel uses for the call from now on.
    pub call_id: String,
}

/// Whether a provider's id can be kept as it is, uniqueness aside.
pub fn usable(call_id: &str) -> bool {
    !call_id.is_empty()
        && call_id.len() <= MAX_CALL_ID_LEN
        && call_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Makes every function call in `items` carry an id unused in the session.
///
/// `used` holds the call ids already in the session's history; `turn_id` and
/// `step` make a minted id deterministic, so a replay of the same journal
/// mints the same ids. Outputs in `items` that answer a renamed call (a
/// response cannot hold any today, but a provider adapter might) follow it.
pub fn assign_call_ids<'a>(
    items: &mut [Item],
    used: impl IntoIterator<Item = &'a str>,
    turn_id: &str,
    step: u32,
) -> Vec<RenamedCall> {
    // Most responses are plain answers: only a response with calls pays for
    // the session's ids (a walk over history).
    if !items.iter().any(|item| matches!(item, Item::FunctionCall { .. })) {
        return Vec::new();
    }
    let taken: HashSet<&str> = used.into_iter().collect();
    // Ids this response already claims, kept or minted.
    let mut claimed: HashSet<String> = HashSet::new();
    let free = |id: &str, claimed: &HashSet<String>| !taken.contains(id) && !claimed.contains(id);
    let mut renamed = Vec::new();
    // The turn id's last characters: unique enough with the step and index,
    // and the loop below settles any collision.
    let alnum: Vec<char> = turn_id.chars().filter(char::is_ascii_alphanumeric).collect();
    let turn_tag: String = alnum[alnum.len().saturating_sub(12)..].iter().collect();
    for (index, item) in items.iter_mut().enumerate() {
        let Item::FunctionCall { call_id, .. } = item else { continue };
        if usable(call_id) && free(call_id, &claimed) {
            claimed.insert(call_id.clone());
            continue;
        }
        let mut fresh = format!("kc_{turn_tag}_{step}_{index}");
        let mut n = 1;
        while !free(&fresh, &claimed) {
            fresh = format!("kc_{turn_tag}_{step}_{index}_{n}");
            n += 1;
        }
        claimed.insert(fresh.clone());
        let provider_call_id: String = call_id.chars().take(MAX_CALL_ID_LEN).collect();
        renamed.push(RenamedCall { provider_call_id, call_id: fresh.clone() });
        *call_id = fresh;
    }
    renamed
}

/// The call ids in `history`: the set [`assign_call_ids`] must avoid.
pub fn call_ids_in(history: &[Item]) -> impl Iterator<Item = &str> {
    history.iter().filter_map(|item| match item {
        Item::FunctionCall { call_id, .. } => Some(call_id.as_str()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> Item {
        Item::FunctionCall { call_id: id.into(), name: "shell__run".into(), arguments: "{}".into() }
    }

    fn ids(items: &[Item]) -> Vec<String> {
        items
            .iter()
            .filter_map(|i| match i {
                Item::FunctionCall { call_id, .. } => Some(call_id.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn unique_usable_ids_are_kept() {
        let mut items = vec![call("call_a"), call("toolu_01B-x")];
        let renamed = assign_call_ids(&mut items, ["call_z"], "turn_01ABC", 1);
        assert!(renamed.is_empty());
        assert_eq!(ids(&items), ["call_a", "toolu_01B-x"]);
    }

    #[test]
    fn an_id_used_by_an_earlier_turn_is_replaced() {
        let history = vec![call("call_1")];
        let mut items = vec![call("call_1")];
        let renamed = assign_call_ids(&mut items, call_ids_in(&history), "turn_01ABC", 2);
        assert_eq!(renamed.len(), 1);
        assert_eq!(renamed[0].provider_call_id, "call_1");
        let new = &ids(&items)[0];
        assert_ne!(new, "call_1");
        assert!(usable(new), "{new}");
    }

    #[test]
    fn repeats_within_one_response_get_distinct_ids() {
        let mut items = vec![call("call_1"), call("call_1"), call("call_1")];
        assign_call_ids(&mut items, [], "turn_01ABC", 1);
        let got = ids(&items);
        assert_eq!(got[0], "call_1", "the first keeps its id");
        let distinct: HashSet<_> = got.iter().collect();
        assert_eq!(distinct.len(), 3, "{got:?}");
    }

    #[test]
    fn empty_long_and_strange_ids_are_replaced() {
        let long = "x".repeat(MAX_CALL_ID_LEN + 1);
        let mut items = vec![call(""), call(&long), call("a b"), call("../../x"), call("id\u{0}")];
        let renamed = assign_call_ids(&mut items, [], "turn_01ABC", 1);
        assert_eq!(renamed.len(), 5);
        assert!(ids(&items).iter().all(|id| usable(id)));
        assert_eq!(renamed[1].provider_call_id.len(), MAX_CALL_ID_LEN);
    }

    #[test]
    fn minted_ids_avoid_ids_already_taken_and_are_deterministic() {
        // A provider that sends keel's own minted shape must not collide.
        let history = vec![call("kc_turn01ABC_3_0")];
        let mut first = vec![call("")];
        let mut second = vec![call("")];
        assign_call_ids(&mut first, call_ids_in(&history), "turn_01ABC", 3);
        assign_call_ids(&mut second, call_ids_in(&history), "turn_01ABC", 3);
        assert_eq!(ids(&first), ids(&second));
        assert_ne!(ids(&first)[0], "kc_turn01ABC_3_0");
    }
}

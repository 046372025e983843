//! Model-visible tool names.
//!
//! Providers accept tool names matching `^[a-zA-Z0-9_-]{1,64}$`, while keel
//! names a tool by its server and the server's own name for it (`fs` and
//! `write_file`, qualified `fs.write_file`). The rule:
//!
//! 1. `server__tool`, when both parts use only `[A-Za-z0-9_-]`, neither
//!    contains `__` nor starts or ends with `_`, and the result fits in 64
//!    characters. Such a name splits back at its only `__`, so no two
//!    (server, tool) pairs share it.
//! 2. Otherwise the parts are sanitised (other characters become `_`), cut
//!    to fit, and suffixed with `_` and 8 hex digits of the SHA-256 of
//!    `server \0 tool`. A plain name never ends in such a suffix by accident
//!    of rule 1 alone, and [`NameTable`] refuses the (astronomically rare)
//!    hash collision instead of shadowing a tool.
//!
//! Built-in tools follow the same rule: `fs.read_file` is `fs__read_file`.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The longest name providers accept.
pub const MAX_NAME: usize = 64;

fn plain(part: &str) -> bool {
    !part.is_empty()
        && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !part.contains("__")
        && !part.starts_with('_')
        && !part.ends_with('_')
}

fn sanitize(part: &str) -> String {
    part.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

/// The name a model sees for `tool` of `server`.
pub fn model_visible_name(server: &str, tool: &str) -> String {
    let direct = format!("{server}__{tool}");
    if plain(server) && plain(tool) && direct.len() <= MAX_NAME {
        return direct;
    }
    let digest = Sha256::digest(format!("{server}\0{tool}").as_bytes());
    let suffix: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let mut base = format!("{}__{}", sanitize(server), sanitize(tool));
    base.truncate(MAX_NAME - 1 - suffix.len());
    format!("{base}_{suffix}")
}

/// Model-visible names in use, and what each stands for.
#[derive(Debug, Default, Clone)]
pub struct NameTable {
    names: BTreeMap<String, (String, String)>,
}

impl NameTable {
    /// Assigns the name for (`server`, `tool`); fails if another pair holds it.
    pub fn assign(&mut self, server: &str, tool: &str) -> Result<String, String> {
        let name = model_visible_name(server, tool);
        match self.names.get(&name) {
            Some((s, t)) if s != server || t != tool => {
                Err(format!("the tools {s}.{t} and {server}.{tool} would both be called {name:?}; rename one of them"))
            }
            _ => {
                self.names.insert(name.clone(), (server.to_string(), tool.to_string()));
                Ok(name)
            }
        }
    }

    /// The (server, tool) behind a model-visible name.
    pub fn resolve(&self, name: &str) -> Option<(&str, &str)> {
        self.names.get(name).map(|(s, t)| (s.as_str(), t.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(name: &str) -> bool {
        (1..=MAX_NAME).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn simple_names_are_readable() {
        assert_eq!(model_visible_name("fs", "write_file"), "fs__write_file");
        assert_eq!(model_visible_name("git-hub", "list-issues"), "git-hub__list-issues");
    }

    #[test]
    fn awkward_names_are_hashed_valid_and_distinct() {
        let pairs = [
            ("a", "_b"),
            ("a_", "b"),
            ("my.server", "tool"),
            ("my_server", "tool"),
            ("x", "tool/with spaces"),
            ("a__b", "c"),
            ("a", "b__c"),
            (&"s".repeat(40)[..], &"t".repeat(40)[..]),
            (&"s".repeat(40)[..], &"t".repeat(41)[..]),
        ];
        let mut seen = std::collections::HashSet::new();
        for (server, tool) in pairs {
            let name = model_visible_name(server, tool);
            assert!(valid(&name), "{name}");
            assert!(seen.insert(name.clone()), "collision at {name}");
        }
        assert_ne!(model_visible_name("a", "_b"), model_visible_name("a_", "b"));
    }

    #[test]
    fn the_table_resolves_names_and_refuses_collisions() {
        let mut table = NameTable::default();
        let name = table.assign("fs", "read").unwrap_or_default();
        assert_eq!(table.resolve(&name), Some(("fs", "read")));
        assert_eq!(table.assign("fs", "read").as_deref(), Ok("fs__read"));
        table.names.insert("x__y".into(), ("other".into(), "thing".into()));
        assert!(table.assign("x", "y").is_err());
    }
}

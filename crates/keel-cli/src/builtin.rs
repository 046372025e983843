//! The coworker `keel run` uses when no bundle is given.
//!
//! It is `examples/assistant`'s bundle, compiled into the binary, so `keel
//! run "..."` works from any directory with no flags. The runtime reads
//! bundles from disk (it re-reads them when a session is created, so an
//! edited bundle takes effect for new sessions); the built-in text is
//! therefore written to `<state>/builtin/assistant/keel.toml`, replaced
//! atomically whenever this binary's copy differs. Sessions pin the
//! definition they were created with, so a newer keel with a changed
//! built-in asks for `session/upgrade` like any edited bundle.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The built-in bundle's text.
pub const ASSISTANT_BUNDLE: &str = include_str!("../../../examples/assistant/keel.toml");

/// The built-in coworker's id.
pub const ASSISTANT_COWORKER: &str = "assistant-example";

/// Writes the built-in bundle under `state` (if it is not already there as
/// this binary has it) and returns its folder.
pub fn assistant_bundle(state: &Path) -> anyhow::Result<PathBuf> {
    let dir = state.join("builtin").join("assistant");
    let file = dir.join("keel.toml");
    if std::fs::read_to_string(&file).is_ok_and(|text| text == ASSISTANT_BUNDLE) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| anyhow::anyhow!("cannot create {} for the built-in coworker: {e}", dir.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
    tmp.write_all(ASSISTANT_BUNDLE.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(&file).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))?;
    Ok(dir)
}

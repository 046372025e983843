//! The state directory: its location, its lock and its API token.
//!
//! One keel process owns a state directory at a time; the lock file
//! `keel.lock` is held with an OS file lock for the life of the process, so
//! a second `keel serve` on the same directory fails at once instead of
//! corrupting the first one's recovery. Read-only commands (`keel sessions`,
//! `keel show`) do not take the lock.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Result, RuntimeError};

/// The file holding the API token.
pub const TOKEN_FILE: &str = "token";

/// The default state directory: `$XDG_STATE_HOME/keel`, else
/// `~/.local/state/keel`.
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("keel");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/state/keel")
}

/// Creates the directory owner-only (0700): it holds the journal, the API
/// token and every session's scratch. An existing directory is not changed
/// (`--state` may name a folder that is not keel's alone); keel warns when
/// others can read it, and its own files are 0600 regardless.
pub fn ensure(dir: &Path) -> Result<()> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| RuntimeError::Config(format!("cannot create the state directory {}: {e}", dir.display())))?;
    }
    if let Ok(meta) = std::fs::metadata(dir)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            dir = %dir.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the state directory is open to other users; keel's files in it are owner-only, but `chmod 700` it"
        );
    }
    Ok(())
}

/// The held lock on a state directory; released when dropped.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

/// Takes the state directory's lock or says who holds it.
pub fn lock(dir: &Path) -> Result<StateLock> {
    let path = dir.join("keel.lock");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| RuntimeError::Config(format!("cannot open {}: {e}", path.display())))?;
    if file.try_lock().is_err() {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        return Err(RuntimeError::Config(format!(
            "the state directory {} is in use by another keel process (pid {}); stop it, or pass a different --state",
            dir.display(),
            holder.trim()
        )));
    }
    let _ = file.set_len(0);
    let _ = write!(file, "{}", std::process::id());
    Ok(StateLock { _file: file })
}

/// Reads the API token, creating a new random one (owner-only) if needed.
pub fn token(dir: &Path) -> Result<(String, PathBuf)> {
    let path = dir.join(TOKEN_FILE);
    if let Ok(existing) = std::fs::read_to_string(&path) {
        let existing = existing.trim().to_string();
        if existing.len() >= 32 {
            return Ok((existing, path));
        }
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| RuntimeError::Config(format!("cannot generate a token: {e}")))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| RuntimeError::Config(format!("cannot write {}: {e}", path.display())))?;
    file.write_all(token.as_bytes())
        .map_err(|e| RuntimeError::Config(format!("cannot write {}: {e}", path.display())))?;
    Ok((token, path))
}

/// The file holding this installation's machine id.
pub const MACHINE_ID_FILE: &str = "machine-id";

/// The id of this state directory's machine, made once: run archives and
/// ownership records name the keel that wrote them by it.
///
/// Made at most once and written atomically: under an exclusive lock on the
/// directory itself (so concurrent first calls, in threads or processes,
/// agree on one id), the id is written to a temporary file, fsynced and
/// renamed into place. A reader never sees half an id. An empty or blank
/// file (left by a crash mid-write of an older keel) is replaced.
pub fn machine_id(dir: &Path) -> Result<String> {
    let path = dir.join(MACHINE_ID_FILE);
    let failed = |e: std::io::Error| RuntimeError::Config(format!("cannot write {}: {e}", path.display()));
    if let Some(id) = read_machine_id(&path) {
        return Ok(id);
    }
    let guard = File::open(dir).map_err(failed)?;
    guard.lock().map_err(failed)?;
    if let Some(id) = read_machine_id(&path) {
        return Ok(id);
    }
    let id = keel_protocol::ids::new_id("mch");
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(failed)?;
    tmp.write_all(format!("{id}\n").as_bytes()).map_err(failed)?;
    tmp.as_file().sync_all().map_err(failed)?;
    tmp.persist(&path).map_err(|e| failed(e.error))?;
    let _ = guard.sync_all();
    Ok(id)
}

fn read_machine_id(path: &Path) -> Option<String> {
    let id = std::fs::read_to_string(path).ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_machine_id_is_made_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = machine_id(dir.path()).unwrap();
        assert!(first.starts_with("mch_"), "{first}");
        assert_eq!(std::fs::read_to_string(dir.path().join(MACHINE_ID_FILE)).unwrap(), format!("{first}\n"));
        assert_eq!(machine_id(dir.path()).unwrap(), first, "reused across restarts");
        let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(entries, [std::ffi::OsString::from(MACHINE_ID_FILE)], "no temporary file left behind");
    }

    #[test]
    fn an_empty_machine_id_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(MACHINE_ID_FILE), " \n").unwrap();
        let id = machine_id(dir.path()).unwrap();
        assert!(id.starts_with("mch_"), "{id}");
        assert_eq!(machine_id(dir.path()).unwrap(), id);
    }

    #[test]
    fn concurrent_first_calls_agree_on_one_id() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let ids: Vec<String> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..8).map(|_| scope.spawn(|| machine_id(dir.path()).unwrap())).collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
            assert_eq!(std::fs::read_to_string(dir.path().join(MACHINE_ID_FILE)).unwrap().trim(), ids[0]);
        }
    }
}

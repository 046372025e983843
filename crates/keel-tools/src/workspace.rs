//! Confinement of paths to a workspace directory.
//!
//! A path from a model is resolved lexically against the workspace (no
//! `..` may climb above it, absolute paths must already be inside it), then
//! every existing component is resolved through symlinks and checked again,
//! so a link that points outside the workspace is refused too.
//!
//! This is a check, not a sandbox: between the check and the use a racing
//! process could swap a directory for a link. The sandboxed runner (Landlock
//! confinement of a separate process) closes that gap; this check gives clear
//! errors and protects the in-process tools until then.

use std::io;
use std::path::{Component, Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    #[error("the path {0:?} is outside the workspace; use a path relative to the workspace")]
    Outside(String),
    #[error("the path {0:?} leads outside the workspace through a symbolic link")]
    SymlinkEscape(String),
    #[error("the path is empty; name a file inside the workspace")]
    Empty,
    #[error("the workspace {0} cannot be opened: {1}")]
    Workspace(String, String),
}

/// Resolves `requested` inside `workspace`, refusing any way out.
///
/// The result is absolute and may not exist yet (for a file about to be
/// written); every part of it that exists lies inside the workspace.
pub fn resolve(workspace: &Path, requested: &str) -> Result<PathBuf, PathError> {
    if requested.trim().is_empty() {
        return Err(PathError::Empty);
    }
    let root =
        workspace.canonicalize().map_err(|e| PathError::Workspace(workspace.display().to_string(), e.to_string()))?;
    let requested_path = Path::new(requested);
    let relative = if requested_path.is_absolute() {
        // Absolute paths are accepted only when they already name a place in
        // the workspace (models often echo back absolute paths they saw).
        let lexical = normalize(requested_path).ok_or_else(|| PathError::Outside(requested.into()))?;
        match lexical.strip_prefix(&root).or_else(|_| lexical.strip_prefix(workspace)) {
            Ok(rest) => rest.to_path_buf(),
            Err(_) => return Err(PathError::Outside(requested.into())),
        }
    } else {
        requested_path.to_path_buf()
    };
    let mut joined = root.clone();
    for component in relative.components() {
        match component {
            Component::Normal(part) => joined.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if joined == root {
                    return Err(PathError::Outside(requested.into()));
                }
                joined.pop();
            }
            Component::RootDir | Component::Prefix(_) => return Err(PathError::Outside(requested.into())),
        }
    }
    check_links(&root, &joined, requested)?;
    Ok(joined)
}

/// Follows symlinks in every existing prefix of `path` and checks each lands
/// inside `root`.
fn check_links(root: &Path, path: &Path, requested: &str) -> Result<(), PathError> {
    let mut probe = path.to_path_buf();
    loop {
        match probe.canonicalize() {
            Ok(real) => {
                return if real.starts_with(root) { Ok(()) } else { Err(PathError::SymlinkEscape(requested.into())) };
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // A dangling link is refused: it could be created outside later.
                if probe.symlink_metadata().is_ok() {
                    return Err(PathError::SymlinkEscape(requested.into()));
                }
                if !probe.pop() || !probe.starts_with(root) {
                    return Err(PathError::Outside(requested.into()));
                }
            }
            Err(_) => return Err(PathError::Outside(requested.into())),
        }
    }
}

/// Lexically removes `.` and `..` from an absolute path.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap_or_else(|e| panic!("{e}"));
        (dir, ws)
    }

    #[test]
    fn relative_paths_stay_inside() {
        let (_d, ws) = workspace();
        let root = ws.canonicalize().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(resolve(&ws, "sub/a.txt"), Ok(root.join("sub/a.txt")));
        assert_eq!(resolve(&ws, "./sub/../b.txt"), Ok(root.join("b.txt")));
        assert_eq!(resolve(&ws, &root.join("c.txt").display().to_string()), Ok(root.join("c.txt")));
    }

    #[test]
    fn escapes_are_refused() {
        let (_d, ws) = workspace();
        assert!(matches!(resolve(&ws, "../x"), Err(PathError::Outside(_))));
        assert!(matches!(resolve(&ws, "sub/../../x"), Err(PathError::Outside(_))));
        assert!(matches!(resolve(&ws, "/etc/passwd"), Err(PathError::Outside(_))));
        assert_eq!(resolve(&ws, ""), Err(PathError::Empty));
    }

    #[test]
    fn symlinks_out_of_the_workspace_are_refused() {
        let (dir, ws) = workspace();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(dir.path().join("nowhere"), ws.join("dangling")).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(resolve(&ws, "link/secret"), Err(PathError::SymlinkEscape(_))));
        assert!(matches!(resolve(&ws, "dangling"), Err(PathError::SymlinkEscape(_))));
        std::os::unix::fs::symlink(ws.join("sub"), ws.join("inner")).unwrap_or_else(|e| panic!("{e}"));
        assert!(resolve(&ws, "inner/file").is_ok());
    }
}

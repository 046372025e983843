//! The real MCP servers tests run against, installed from npm at pinned
//! versions by `scripts/mcp-servers`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

/// The folder `scripts/mcp-servers` installed the servers into (running it
/// once per test process). Panics, saying why, when node or npm is missing.
pub fn servers_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp-servers");
        let output = std::process::Command::new(&script)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|error| panic!("cannot run {}: {error}", script.display()));
        assert!(
            output.status.success(),
            "scripts/mcp-servers failed; these tests need node (18+) and npm:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
    })
}

/// The entry point of `@modelcontextprotocol/server-everything`.
pub fn everything_js() -> String {
    servers_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js").display().to_string()
}

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

/// Starts server-everything in streamable HTTP mode on `port` (its `/mcp`
/// endpoint) and returns once it listens; killed when dropped.
pub async fn start_http_everything(port: u16) -> tokio::process::Child {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new("node")
        .args([everything_js().as_str(), "streamableHttp"])
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start node: {error}"));
    let Some(stderr) = child.stderr.take() else { panic!("no stderr from server-everything") };
    let mut stderr = tokio::io::BufReader::new(stderr).lines();
    let listening = async {
        while let Ok(Some(line)) = stderr.next_line().await {
            if line.contains("listening on port") {
                return true;
            }
        }
        false
    };
    match tokio::time::timeout(std::time::Duration::from_secs(15), listening).await {
        Ok(true) => {}
        Ok(false) => panic!("server-everything exited before listening"),
        Err(_) => panic!("server-everything did not start listening within 15 s"),
    }
    // Keep draining its stderr so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    child
}

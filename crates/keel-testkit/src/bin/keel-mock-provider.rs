//! `keel-mock-provider`: the keel test server as a process, for trying keel
//! end to end without a model.
//!
//! Prints its base URL (one line on stdout) and answers every request with
//! the demo script until killed, in whichever format was called (OpenAI Chat
//! Completions, OpenAI Responses, Anthropic Messages): a user turn gets a
//! `fs.write_file` call that writes `hello.txt`, and the tool result gets a
//! final answer.
//!
//! Usage: `keel-mock-provider [--listen ADDR]` (default `127.0.0.1:0`).

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};

use anyhow::{Context, bail};
use keel_testkit::{MockServer, responders};

const USAGE: &str = "usage: keel-mock-provider [--listen ADDR]\n\nServes scripted OpenAI Chat Completions, OpenAI Responses and Anthropic Messages endpoints and prints their base URL.\n";

fn parse_listen(args: impl Iterator<Item = String>) -> anyhow::Result<Option<SocketAddr>> {
    let mut listen = "127.0.0.1:0".to_owned();
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--listen" => listen = args.next().context("--listen needs an address such as 127.0.0.1:8080")?,
            other => match other.strip_prefix("--listen=") {
                Some(value) => listen = value.to_owned(),
                None => bail!("unknown argument `{other}`\n\n{USAGE}"),
            },
        }
    }
    let addr = listen
        .to_socket_addrs()
        .with_context(|| format!("`{listen}` is not a listen address such as 127.0.0.1:8080"))?
        .next()
        .with_context(|| format!("`{listen}` resolved to no address"))?;
    Ok(Some(addr))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Some(listen) = parse_listen(std::env::args().skip(1))? else {
        print!("{USAGE}");
        return Ok(());
    };
    let arguments = serde_json::json!({"path": "hello.txt", "content": "Hello from keel"}).to_string();
    let server = MockServer::builder()
        .listen(listen)
        .record_requests(false)
        .fallback(responders::tool_then_answer_with(
            "fs__write_file",
            arguments,
            "I wrote hello.txt with the text \"Hello from keel\".",
        ))
        .start()
        .await
        .with_context(|| format!("could not listen on {listen}"))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", server.base_url())?;
    stdout.flush()?;
    drop(stdout);
    tokio::signal::ctrl_c().await.context("could not wait for Ctrl-C")?;
    server.shutdown().await;
    Ok(())
}

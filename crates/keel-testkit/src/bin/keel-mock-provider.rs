//! `keel-mock-provider`: the keel test server as a process, for trying keel
//! end to end without a model, and for benchmarks that compare runtimes
//! against the same server.
//!
//! Prints its base URL (one line on stdout) and answers every request with
//! the demo script until killed, in whichever format was called (OpenAI Chat
//! Completions, OpenAI Responses, Anthropic Messages): a request whose last
//! message is the user's gets a `fs.write_file` call that writes `hello.txt`,
//! and anything else (the tool result) gets a final answer. The flags change
//! the call, the answer and how long the server waits before the first byte
//! of each response, which stands in for a real model's time to first token.
//!
//! Usage: `keel-mock-provider [--listen ADDR] [--latency-ms N] [--tool NAME]
//! [--arguments JSON] [--answer TEXT]`.

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context, bail};
use keel_testkit::{MockServer, responders};

const USAGE: &str =
    "usage: keel-mock-provider [--listen ADDR] [--latency-ms N] [--tool NAME] [--arguments JSON] [--answer TEXT]

Serves scripted OpenAI Chat Completions, OpenAI Responses and Anthropic Messages endpoints and prints their base URL.
A request whose last message is the user's gets one call of the tool; any other request gets the answer.

  --listen ADDR      where to listen (default 127.0.0.1:0, a free port)
  --latency-ms N     wait N milliseconds before the first byte of every response (default 0)
  --tool NAME        the model-visible tool name to call (default fs__write_file)
  --arguments JSON   the call's arguments (default writes hello.txt)
  --answer TEXT      the final answer after the tool result
";

/// What the command line asked for.
#[derive(Debug)]
struct Options {
    listen: SocketAddr,
    latency: Duration,
    tool: String,
    arguments: String,
    answer: String,
}

/// Reads the flags; `None` means help was asked for.
fn parse_options(args: impl Iterator<Item = String>) -> anyhow::Result<Option<Options>> {
    let mut listen = "127.0.0.1:0".to_owned();
    let mut latency_ms = "0".to_owned();
    let mut tool = "fs__write_file".to_owned();
    let mut arguments = serde_json::json!({"path": "hello.txt", "content": "Hello from keel"}).to_string();
    let mut answer = "I wrote hello.txt with the text \"Hello from keel\".".to_owned();
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(None);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_owned(), Some(value.to_owned())),
            _ => (arg.clone(), None),
        };
        let target = match flag.as_str() {
            "--listen" => &mut listen,
            "--latency-ms" => &mut latency_ms,
            "--tool" => &mut tool,
            "--arguments" => &mut arguments,
            "--answer" => &mut answer,
            other => bail!("unknown argument `{other}`\n\n{USAGE}"),
        };
        *target = match inline {
            Some(value) => value,
            None => args.next().with_context(|| format!("{flag} needs a value\n\n{USAGE}"))?,
        };
    }
    let listen = listen
        .to_socket_addrs()
        .with_context(|| format!("`{listen}` is not a listen address such as 127.0.0.1:8080"))?
        .next()
        .with_context(|| format!("`{listen}` resolved to no address"))?;
    let latency_ms: u64 =
        latency_ms.parse().with_context(|| format!("--latency-ms takes whole milliseconds, not `{latency_ms}`"))?;
    serde_json::from_str::<serde_json::Value>(&arguments)
        .with_context(|| format!("--arguments must be JSON, such as {{\"path\":\"a.txt\"}}, not `{arguments}`"))?;
    Ok(Some(Options { listen, latency: Duration::from_millis(latency_ms), tool, arguments, answer }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Some(options) = parse_options(std::env::args().skip(1))? else {
        print!("{USAGE}");
        return Ok(());
    };
    let script = responders::tool_then_answer_with(options.tool, options.arguments, options.answer);
    let latency = options.latency;
    let server = MockServer::builder()
        .listen(options.listen)
        .record_requests(false)
        .fallback(move |request| script(request).delay_first_byte(latency))
        .start()
        .await
        .with_context(|| format!("could not listen on {}", options.listen))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", server.base_url())?;
    stdout.flush()?;
    drop(stdout);
    tokio::signal::ctrl_c().await.context("could not wait for Ctrl-C")?;
    server.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<Option<Options>> {
        parse_options(args.iter().map(|a| (*a).to_owned()))
    }

    #[test]
    fn defaults_serve_the_demo_without_latency() {
        let options = parse(&[]).unwrap().unwrap();
        assert_eq!(options.latency, Duration::ZERO);
        assert_eq!(options.tool, "fs__write_file");
        assert!(options.arguments.contains("hello.txt"));
    }

    #[test]
    fn flags_take_separate_or_inline_values() {
        let options = parse(&[
            "--latency-ms",
            "20",
            "--tool=bench__lookup",
            "--arguments",
            r#"{"city":"Paris"}"#,
            "--answer=Sunny",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(options.latency, Duration::from_millis(20));
        assert_eq!(options.tool, "bench__lookup");
        assert_eq!(options.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(options.answer, "Sunny");
    }

    #[test]
    fn bad_values_say_what_is_expected() {
        assert!(parse(&["--latency-ms", "fast"]).unwrap_err().to_string().contains("whole milliseconds"));
        assert!(parse(&["--arguments", "{"]).unwrap_err().to_string().contains("must be JSON"));
        assert!(parse(&["--latency-ms"]).unwrap_err().to_string().contains("needs a value"));
        assert!(parse(&["--frobnicate"]).unwrap_err().to_string().contains("unknown argument"));
    }
}

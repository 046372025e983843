//! Commands that talk to the `keel serve` owning a state directory:
//! `keel inbox`, `keel approve`, `keel deny`, `keel msg`, `keel compact`.
//!
//! The server writes its address to `<state>/serve.url` and its token to
//! `<state>/token`; these commands read both and make one JSON-RPC call over
//! WebSocket. An answer or a message continues a turn, which needs the
//! running keel, so without one they say how to start it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The file holding the running server's WebSocket address.
pub const ENDPOINT_FILE: &str = "serve.url";

#[derive(clap::Args)]
pub struct InboxArgs {
    /// Only this session's questions.
    #[arg(long)]
    session: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct DecideArgs {
    session: String,
    interaction: String,
    /// Grant the tool for the rest of the session (approve only).
    #[arg(long)]
    for_session: bool,
    /// For the model (deny), or with --decision enter_result, the result.
    #[arg(long)]
    message: Option<String>,
    /// Another decision: run_again, skip or enter_result (for a call cut
    /// off by a crash); retry or trim (for a compaction whose summary
    /// failed).
    #[arg(long)]
    decision: Option<String>,
    /// Print the server's answer as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct MsgArgs {
    session: String,
    /// The message.
    #[arg(required = true, num_args = 1..)]
    text: Vec<String>,
    /// Idempotency key; a new one by default.
    #[arg(long)]
    submission_id: Option<String>,
    /// Print the server's answer as JSON.
    #[arg(long)]
    json: bool,
}

async fn call(state: &Path, method: &str, params: Value) -> anyhow::Result<Value> {
    let url = std::fs::read_to_string(state.join(ENDPOINT_FILE)).map_err(|_| {
        anyhow!(
            "no keel is serving {} over WebSocket; start `keel serve --state {}` (answers and messages continue turns, which needs a running keel)",
            state.display(),
            state.display()
        )
    })?;
    let token = std::fs::read_to_string(state.join("token")).context("cannot read the API token")?;
    let mut request = url.trim().into_client_request()?;
    request.headers_mut().insert("Authorization", format!("Bearer {}", token.trim()).parse()?);
    let (mut ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .with_context(|| format!("cannot reach keel at {}; is `keel serve` still running?", url.trim()))?;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    ws.send(Message::Text(body.to_string().into())).await?;
    while let Some(frame) = ws.next().await {
        let Message::Text(text) = frame? else { continue };
        let reply: Value = serde_json::from_str(text.as_str())?;
        if reply["id"] != json!(1) {
            continue;
        }
        let _ = ws.close(None).await;
        if let Some(error) = reply.get("error") {
            bail!("{} (code {})", error["message"].as_str().unwrap_or("error"), error["code"]);
        }
        return Ok(reply["result"].clone());
    }
    bail!("keel closed the connection without answering")
}

pub async fn inbox(state: PathBuf, args: InboxArgs) -> anyhow::Result<ExitCode> {
    let result = call(&state, "inbox/list", json!({ "session_id": args.session })).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result["interactions"])?);
        return Ok(ExitCode::SUCCESS);
    }
    let items = result["interactions"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        println!("nothing waits for a decision");
    }
    for i in items {
        println!(
            "{}  session {}  {}  {}({})\n    why: {}",
            i["id"].as_str().unwrap_or("?"),
            i["session_id"].as_str().unwrap_or("?"),
            i["kind"].as_str().unwrap_or("?"),
            i["request"]["tool"].as_str().unwrap_or("?"),
            i["request"]["arguments"].as_str().unwrap_or(""),
            i["request"]["reason"].as_str().unwrap_or(""),
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn decide(state: PathBuf, args: DecideArgs, approve: bool) -> anyhow::Result<ExitCode> {
    let decision = match (&args.decision, approve, args.for_session) {
        (Some(other), _, _) => other.clone(),
        (None, true, true) => "allow_for_session".into(),
        (None, true, false) => "allow_once".into(),
        (None, false, _) => "deny".into(),
    };
    let params = json!({
        "session_id": args.session,
        "interaction_id": args.interaction,
        "decision": decision,
        "message": args.message,
    });
    let result = call(&state, "interaction/respond", params).await?;
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
        return Ok(ExitCode::SUCCESS);
    }
    match result["status"].as_str() {
        Some("reasked") => println!(
            "the policy or bundle changed since the question, so keel asks again as {}; answer that one",
            result["interaction"]["id"].as_str().unwrap_or("?")
        ),
        _ => println!("{decision} recorded; the turn is {}", result["turn_status"].as_str().unwrap_or("unchanged")),
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn msg(state: PathBuf, args: MsgArgs) -> anyhow::Result<ExitCode> {
    let submission_id = args.submission_id.unwrap_or_else(|| keel_protocol::ids::new_id("msg"));
    let params = json!({ "session_id": args.session, "submission_id": submission_id, "text": args.text.join(" ") });
    let result = call(&state, "turn/steer", params).await?;
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
        return Ok(ExitCode::SUCCESS);
    }
    let note = if result["duplicate"] == true { " (already delivered earlier)" } else { "" };
    println!("message for turn {} accepted{note}", result["turn_id"].as_str().unwrap_or("?"));
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct CompactArgs {
    session: String,
    #[arg(long)]
    json: bool,
}

/// `keel compact`: compacts a session's context now (`session/compact`).
pub async fn compact(state: PathBuf, args: CompactArgs) -> anyhow::Result<ExitCode> {
    let result = call(&state, "session/compact", json!({ "session_id": args.session })).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(ExitCode::SUCCESS);
    }
    let context = &result["context"];
    match result["status"].as_str().unwrap_or_default() {
        "applied" => {
            let record = &result["compaction"];
            println!(
                "compacted (#{}): {} -> {} tokens, {} of the person's messages kept verbatim{}, in {} ms",
                record["number"],
                record["tokens_before"],
                record["tokens_after"],
                record["users"].as_array().map(Vec::len).unwrap_or(0),
                if record["trimmed"] == true { ", trimmed without a summary" } else { "" },
                record["duration_ms"]
            );
        }
        "waiting" => println!(
            "the summary failed twice; answer {} with `keel approve {} {} --decision retry` or `--decision trim`",
            result["interaction"]["id"].as_str().unwrap_or("?"),
            args.session,
            result["interaction"]["id"].as_str().unwrap_or("?")
        ),
        other => println!("{}", other.replace('_', " ")),
    }
    if context.is_object() {
        println!(
            "context: {} of {} tokens used ({})",
            context["used_tokens"],
            context["cap_tokens"],
            context["tokenizer"].as_str().unwrap_or("?")
        );
    }
    Ok(ExitCode::SUCCESS)
}

//! The same turn through every remote provider keel speaks: OpenAI Chat
//! Completions, the OpenAI Responses API and the Anthropic Messages API,
//! each against a local server speaking that format.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use keel_testkit::{MockServer, Reply, ScriptedError};
use serde_json::{Value, json};
use support::Keel;

const PROVIDERS: [&str; 3] = ["openai-chat:m", "openai:m", "anthropic:m"];

async fn run_turn(model: &str, replies: Vec<Reply>) -> (Vec<Value>, Value, MockServer) {
    let mock = MockServer::start().await.unwrap();
    for reply in replies {
        mock.push(reply);
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("keel.toml"),
        format!("[coworkers.w]\nmodel = \"{model}\"\ninstructions = \"Be brief.\"\ntools = [\"fs.write_file\"]\npolicies = {{ \"fs.write_file\" = \"allow\" }}\n"),
    )
    .unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let keel =
        Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle, &[("KEEL_RETRY_BASE_MS", "1")]).unwrap();
    let mut client = keel.client().await.unwrap();
    let created = client.ok("session/create", json!({"name": "w", "coworker": "w", "workspace": ws})).await.unwrap();
    let session = created["session"]["id"].as_str().unwrap().to_string();
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    client.ok("turn/start", json!({"session_id": session, "submission_id": "1", "text": "write it"})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    assert_eq!(std::fs::read_to_string(ws.join("f.txt")).ok().as_deref(), Some("x"), "{model}: the tool ran");
    (events, snapshot, mock)
}

#[tokio::test]
async fn a_tool_turn_works_through_every_provider() {
    for model in PROVIDERS {
        let (events, snapshot, mock) = run_turn(
            model,
            vec![
                Reply::tool_call("call_a", "fs__write_file", r#"{"path":"f.txt","content":"x"}"#),
                Reply::text("Wrote f.txt."),
            ],
        )
        .await;
        assert_eq!(events.last().unwrap()["data"]["status"], "completed", "{model}");
        let history = snapshot["history"].as_array().unwrap();
        assert_eq!(history[1]["type"], "function_call", "{model}");
        assert_eq!(history[1]["arguments"], r#"{"path":"f.txt","content":"x"}"#, "{model}");
        assert_eq!(history[3]["content"][0]["text"], "Wrote f.txt.", "{model}");
        assert!(snapshot["session"]["usage"]["input_tokens"].as_u64().unwrap() > 0, "{model}");
        let paths: Vec<String> = mock.requests().iter().map(|r| r.path.clone()).collect();
        let expected = match model {
            "openai-chat:m" => "/v1/chat/completions",
            "openai:m" => "/v1/responses",
            _ => "/v1/messages",
        };
        assert!(paths.iter().all(|p| p == expected), "{model}: {paths:?}");
    }
}

#[tokio::test]
async fn overload_and_in_stream_errors_are_retried_in_every_format() {
    for model in PROVIDERS {
        let (events, snapshot, _mock) = run_turn(
            model,
            vec![
                Reply::http_error(ScriptedError::Overloaded),
                Reply::text("partial").in_stream_error(ScriptedError::Overloaded),
                Reply::tool_call("call_b", "fs__write_file", r#"{"path":"f.txt","content":"x"}"#),
                Reply::text("ok"),
            ],
        )
        .await;
        assert_eq!(events.last().unwrap()["data"]["status"], "completed", "{model}");
        let retries = events.iter().filter(|e| e["kind"] == "model_retrying").count();
        assert_eq!(retries, 2, "{model}");
        let statuses: Vec<&str> =
            snapshot["attempts"].as_array().unwrap().iter().map(|a| a["status"].as_str().unwrap()).collect();
        assert_eq!(statuses, ["failed", "failed", "completed", "completed"], "{model}");
        assert!(!snapshot["history"].to_string().contains("partial"), "{model}");
    }
}

#[tokio::test]
async fn refusals_and_output_limits_are_understood_in_every_format() {
    for model in PROVIDERS {
        let mock = MockServer::start().await.unwrap();
        mock.push(Reply::refusal());
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(bundle.join("keel.toml"), format!("[coworkers.w]\nmodel = \"{model}\"\ninstructions = \"x\"\n"))
            .unwrap();
        let keel = Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle, &[]).unwrap();
        let mut client = keel.client().await.unwrap();
        let created = client
            .ok("session/create", json!({"name": "w", "coworker": "w", "workspace": support::workspace(&dir)}))
            .await
            .unwrap();
        let session = created["session"]["id"].as_str().unwrap().to_string();
        client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
        client.ok("turn/start", json!({"session_id": session, "submission_id": "1", "text": "x"})).await.unwrap();
        let events = client.events_until("turn_finished").await.unwrap();
        assert_eq!(events.last().unwrap()["data"]["error"]["kind"], "provider_safety_blocked", "{model}");

        // A fresh session for the output limit (the first one is blocked).
        for _ in 0..3 {
            mock.push(Reply::text("more").output_limit());
        }
        let created = client
            .ok("session/create", json!({"name": "w2", "coworker": "w", "workspace": support::workspace(&dir)}))
            .await
            .unwrap();
        let second = created["session"]["id"].as_str().unwrap().to_string();
        client.ok("events/subscribe", json!({"session_id": second})).await.unwrap();
        client.ok("turn/start", json!({"session_id": second, "submission_id": "1", "text": "x"})).await.unwrap();
        let events = client.events_until("turn_finished").await.unwrap();
        assert_eq!(events.last().unwrap()["data"]["status"], "truncated", "{model}");
    }
}

//! Sessions keep the coworker and tool schemas they were created with until
//! a person upgrades them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::sync::Arc;

use keel_provider::{OpenAiChat, OpenAiChatConfig};
use keel_runtime::{ProviderSet, Runtime, RuntimeConfig};
use keel_testkit::{MockServer, Reply};
use keel_tools::{BoxFuture, Tool, ToolContext, ToolDescriptor, ToolOutput};
use serde_json::{Value, json};

/// A tool whose schema has a version number in it.
struct Versioned(u32);

impl Tool for Versioned {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: "test.versioned".into(),
            description: format!("version {}", self.0),
            version: "1".into(),
            input_schema: json!({"type": "object"}),
            effect: keel_protocol::Effect::ReadOnly,
        }
    }

    fn call<'a>(&'a self, _: &'a ToolContext, _: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async { ToolOutput::ok("ok") })
    }
}

fn write_bundle(dir: &Path, instructions: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("keel.toml"),
        format!(
            "[coworkers.c]\nmodel = \"openai-chat:m\"\ninstructions = \"{instructions}\"\ntools = [\"test.versioned\"]\n"
        ),
    )
    .unwrap();
}

async fn open(dir: &Path, mock: &MockServer, version: u32) -> Runtime {
    let mut config = RuntimeConfig::new(dir.join("state"));
    config.bundles = vec![dir.join("bundle")];
    config.providers =
        ProviderSet::new().with(Arc::new(OpenAiChat::new(OpenAiChatConfig::new(mock.base_url())).unwrap()));
    config.extra_tools = vec![Arc::new(Versioned(version))];
    Runtime::open(config).await.unwrap()
}

fn last_system(mock: &MockServer) -> String {
    let request = mock.requests().last().unwrap().json.clone().unwrap();
    request["messages"][0]["content"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_its_pinned_view_until_a_person_upgrades_it() {
    let mock = MockServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_bundle(&dir.path().join("bundle"), "Old instructions.");
    let runtime = open(dir.path(), &mock, 1).await;
    let session = support::session(&runtime, dir.path()).await;
    let pinned = session.bundle_digest.clone();
    runtime.shutdown().await;
    drop(runtime);

    // The bundle changes on disk and keel now has version 2 of the tool.
    write_bundle(&dir.path().join("bundle"), "New instructions.");
    let runtime = open(dir.path(), &mock, 2).await;
    let finished = support::turn(&runtime, &session.id, "1").await;
    assert_eq!(finished["status"], "failed");
    assert_eq!(finished["error"]["kind"], "session_outdated");
    assert!(mock.requests().is_empty(), "nothing was sent with a stale view");

    let upgraded = runtime.upgrade_session(&session.id).await.unwrap();
    assert_ne!(upgraded.bundle_digest, pinned);
    assert_eq!(upgraded.coworker_spec["instructions"], "New instructions.");
    mock.push(Reply::text("done"));
    let finished = support::turn(&runtime, &session.id, "2").await;
    assert_eq!(finished["status"], "completed");
    assert!(last_system(&mock).starts_with("New instructions."));
    runtime.shutdown().await;
    drop(runtime);

    // The upgrade is durable.
    let runtime = open(dir.path(), &mock, 2).await;
    let (info, _) = runtime.session_state(&session.id).unwrap();
    assert_eq!(info.bundle_digest, upgraded.bundle_digest);
    let snapshot = runtime.snapshot(&session.id).await.unwrap();
    assert_eq!(snapshot.session.coworker_spec["instructions"], "New instructions.");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_bundle_does_not_change_an_existing_session() {
    let mock = MockServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_bundle(&dir.path().join("bundle"), "Old instructions.");
    let runtime = open(dir.path(), &mock, 1).await;
    let session = support::session(&runtime, dir.path()).await;
    runtime.shutdown().await;
    drop(runtime);
    write_bundle(&dir.path().join("bundle"), "New instructions.");
    let runtime = open(dir.path(), &mock, 1).await;
    mock.push(Reply::text("done"));
    assert_eq!(support::turn(&runtime, &session.id, "1").await["status"], "completed");
    assert!(last_system(&mock).starts_with("Old instructions."));
    runtime.shutdown().await;
}

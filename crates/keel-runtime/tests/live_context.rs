//! A tool's live context reaches the model fresh on every attempt,
//! retries included, and never enters history.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keel_provider::{OpenAiChat, OpenAiChatConfig};
use keel_runtime::{ProviderSet, Runtime, RuntimeConfig};
use keel_testkit::{MockServer, Reply};
use keel_tools::{BoxFuture, Tool, ToolContext, ToolDescriptor, ToolOutput};
use serde_json::{Value, json};

/// Connected for the first request only.
struct Account(Arc<AtomicUsize>);

impl Tool for Account {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: "crm.account".into(),
            description: "test".into(),
            version: "1".into(),
            input_schema: json!({"type": "object"}),
            effect: keel_protocol::Effect::ReadOnly,
        }
    }

    fn call<'a>(&'a self, _: &'a ToolContext, _: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async { ToolOutput::error("not used") })
    }

    fn model_context(&self, _: &str) -> Option<Value> {
        let asked = self.0.fetch_add(1, Ordering::SeqCst);
        Some(json!({"connected": asked == 0}))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_context_is_fresh_on_each_retry_and_stays_out_of_history() {
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::openai_error(503, "server_error", "try again"));
    mock.push(Reply::text("done"));
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("keel.toml"),
        "[coworkers.c]\nmodel = \"openai-chat:m\"\ninstructions = \"Base instructions.\"\ntools = [\"crm.account\"]\n",
    )
    .unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let mut config = RuntimeConfig::new(dir.path().join("state"));
    config.bundles = vec![bundle];
    config.providers =
        ProviderSet::new().with(Arc::new(OpenAiChat::new(OpenAiChatConfig::new(mock.base_url())).unwrap()));
    config.retry.base_delay = std::time::Duration::from_millis(1);
    config.extra_tools = vec![Arc::new(Account(asked.clone()))];
    let runtime = Runtime::open(config).await.unwrap();
    let session = support::session(&runtime, dir.path()).await;
    assert_eq!(support::turn(&runtime, &session.id, "1").await["status"], "completed");
    let systems: Vec<String> = mock
        .requests()
        .iter()
        .map(|r| r.json.clone().unwrap()["messages"][0]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(systems.len(), 2);
    assert!(systems[0].starts_with("Base instructions."));
    assert!(systems[0].contains(r#""crm__account":{"connected":true}"#), "{}", systems[0]);
    assert!(systems[1].contains(r#""crm__account":{"connected":false}"#), "{}", systems[1]);
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    let snapshot = runtime.snapshot(&session.id).await.unwrap();
    assert_eq!(snapshot.history.len(), 2);
    assert!(!serde_json::to_string(&snapshot.history).unwrap().contains("connected"));
    runtime.shutdown().await;
}

/// Returns a PNG; shows it only while the count of asks is below a limit.
struct Camera {
    asked: Arc<AtomicUsize>,
    allowed_asks: usize,
}

const PNG: &[u8] = b"\x89PNG\r\n\x1a\nkeel-test-image-bytes";

impl Tool for Camera {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: "cam.snap".into(),
            description: "takes a picture".into(),
            version: "1".into(),
            input_schema: json!({"type": "object"}),
            effect: keel_protocol::Effect::ReadOnly,
        }
    }

    fn call<'a>(&'a self, _: &'a ToolContext, _: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async {
            ToolOutput {
                images: vec![keel_tools::ToolImage { mime_type: "image/png".into(), data: PNG.to_vec() }],
                ..ToolOutput::ok("snapped")
            }
        })
    }

    fn images_allowed(&self, _: &str) -> bool {
        self.asked.fetch_add(1, Ordering::SeqCst) < self.allowed_asks
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_consent_is_asked_on_every_attempt_and_a_withdrawn_image_becomes_a_placeholder() {
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "cam__snap", "{}"));
    mock.push(Reply::openai_error(503, "server_error", "try again"));
    mock.push(Reply::text("done"));
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("keel.toml"),
        "[coworkers.c]\nmodel = \"openai-chat:m\"\ninstructions = \"x\"\ntools = [\"cam.snap\"]\n",
    )
    .unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let mut config = RuntimeConfig::new(dir.path().join("state"));
    config.bundles = vec![bundle];
    config.providers =
        ProviderSet::new().with(Arc::new(OpenAiChat::new(OpenAiChatConfig::new(mock.base_url())).unwrap()));
    config.retry.base_delay = std::time::Duration::from_millis(1);
    // Consent holds for the first request after the call, and is withdrawn
    // before the retry.
    config.extra_tools = vec![Arc::new(Camera { asked: asked.clone(), allowed_asks: 1 })];
    let runtime = Runtime::open(config).await.unwrap();
    let session = support::session(&runtime, dir.path()).await;
    assert_eq!(support::turn(&runtime, &session.id, "1").await["status"], "completed");
    let bodies: Vec<String> = mock.requests().iter().map(|r| String::from_utf8_lossy(&r.body).into_owned()).collect();
    assert_eq!(bodies.len(), 3);
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(PNG);
    assert!(bodies[1].contains(&encoded), "shown while allowed");
    assert!(!bodies[2].contains(&encoded), "withdrawn on the retry");
    assert!(bodies[2].contains("is no longer available"), "{}", bodies[2]);
    assert_eq!(asked.load(Ordering::SeqCst), 2, "asked once per attempt");
    // History holds a reference, never the bytes.
    let snapshot = runtime.snapshot(&session.id).await.unwrap();
    let history = serde_json::to_string(&snapshot.history).unwrap();
    assert!(history.contains("\"mime_type\":\"image/png\"") && !history.contains(&encoded));
    runtime.shutdown().await;
}

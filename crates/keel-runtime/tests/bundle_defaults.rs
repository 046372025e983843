//! What a bundle sets for its coworkers' sessions: compaction defaults and
//! the resource policy, pinned at creation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use keel_protocol::CompactionSettings;
use keel_runtime::{NewSession, Runtime, RuntimeConfig};

#[tokio::test]
async fn a_coworker_s_compaction_defaults_and_resources_apply_unless_the_client_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("keel.toml"),
        "[coworkers.c]\nmodel = \"openai-chat:m\"\ninstructions = \"x\"\ntools = [\"shell.run\"]\ncompaction = { cap_tokens = 9000, auto_trim_on_failure = false }\n\n[coworkers.c.resources]\nnetwork = true\nread = [\"/usr/share\"]\n",
    )
    .unwrap();
    let mut config = RuntimeConfig::new(dir.path().join("state"));
    config.bundles = vec![bundle];
    let chat = keel_provider::OpenAiChat::new(keel_provider::OpenAiChatConfig::new("http://127.0.0.1:9/v1")).unwrap();
    config.providers = keel_runtime::ProviderSet::new().with(std::sync::Arc::new(chat));
    let runtime = Runtime::open(config).await.unwrap();
    let defaulted = support::session(&runtime, dir.path()).await;
    assert_eq!(
        defaulted.compaction,
        CompactionSettings { cap_tokens: Some(9000), auto_trim_on_failure: false, threshold_percent: None }
    );
    assert_eq!(defaulted.coworker_spec["resources"]["network"], true);
    assert_eq!(defaulted.coworker_spec["resources"]["read"][0], "/usr/share");
    assert!(defaulted.coworker_spec["tool_digests"]["shell.run"].as_str().unwrap().starts_with("sha256:"));
    let chosen = CompactionSettings { cap_tokens: Some(100), auto_trim_on_failure: true, threshold_percent: Some(90) };
    let overridden = runtime
        .create_session(NewSession {
            name: "o".into(),
            coworker: "c".into(),
            workspace: dir.path().join("ws").display().to_string(),
            attended: false,
            compaction: Some(chosen),
        })
        .await
        .unwrap();
    assert_eq!(overridden.compaction, chosen);
    runtime.shutdown().await;
}

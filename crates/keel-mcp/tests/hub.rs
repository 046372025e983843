//! Hub behaviour that needs no MCP server: refusals at start, shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use keel_mcp::{Backoff, HubConfig, McpError, McpHub, McpServerConfig, ServerState};
use serde_json::json;

#[test]
fn start_outside_a_runtime_fails_every_server_without_panicking() {
    let hub = McpHub::start(vec![McpServerConfig::stdio("a", "true", vec![])]);
    let [status] = hub.status().try_into().unwrap();
    let ServerState::Failed { error, next_retry_ms } = status.state else { panic!("{status:?}") };
    assert!(error.contains("outside a Tokio runtime"), "{error}");
    assert_eq!(next_retry_ms, u64::MAX);

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        hub.settled().await;
        tokio::time::timeout(Duration::from_secs(5), hub.shutdown()).await.expect("shutdown hung");
    });
    assert_eq!(hub.status()[0].state, ServerState::Stopped);
}

#[tokio::test]
async fn a_second_server_with_the_same_name_is_refused() {
    let config = HubConfig {
        backoff: Backoff { initial: Duration::from_secs(60), max: Duration::from_secs(60) },
        ..HubConfig::default()
    };
    let hub = McpHub::start_with(
        vec![
            McpServerConfig::stdio("twin", "keel-mcp-test-absent", vec![]),
            McpServerConfig::stdio("twin", "true", vec![]),
        ],
        config,
    );
    hub.settled().await;
    let statuses = hub.status();
    let ServerState::Failed { error, .. } = &statuses[0].state else { panic!("{statuses:#?}") };
    assert!(error.contains("command not found"), "{error}");
    let ServerState::Failed { error, next_retry_ms } = &statuses[1].state else { panic!("{statuses:#?}") };
    assert!(error.contains("another MCP server is also named `twin`"), "{error}");
    assert_eq!(*next_retry_ms, u64::MAX);

    // The first one is waiting out its backoff: calls say so, and when.
    let error = hub.call("twin", "anything", json!({})).await.unwrap_err();
    let McpError::Unavailable { reason, .. } = &error else { panic!("{error}") };
    assert!(reason.contains("keel tries again in 60 s"), "{reason}");

    tokio::time::timeout(Duration::from_secs(5), hub.shutdown()).await.expect("shutdown hung");
    assert!(hub.status().iter().all(|status| status.state == ServerState::Stopped));
    assert!(hub.tools().is_empty());
}

//! OpenTelemetry for `keel serve` and `keel run`, from the standard
//! `OTEL_*` variables (see `keel_telemetry::TelemetryConfig::from_env`).
//! Without `OTEL_EXPORTER_OTLP_ENDPOINT` it is off and costs nothing.

use std::time::Duration;

use anyhow::Context;
use keel_telemetry::{Telemetry, TelemetryConfig, TelemetryGuard};

/// How long a stopping keel waits for its last spans and metrics to leave.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts the exporter when the environment asks for one.
pub fn start() -> anyhow::Result<(Telemetry, Option<TelemetryGuard>)> {
    let mut config = TelemetryConfig::from_env().context("the OpenTelemetry settings are not usable")?;
    if !config.is_enabled() {
        return Ok((Telemetry::disabled(), None));
    }
    config.service_version = env!("CARGO_PKG_VERSION").to_string();
    let (telemetry, guard) = Telemetry::start(&config).context("cannot start the OpenTelemetry exporter")?;
    Ok((telemetry, Some(guard)))
}

/// Flushes what is left, within [`FLUSH_TIMEOUT`], and logs what was lost.
pub async fn finish(guard: Option<TelemetryGuard>) {
    let Some(guard) = guard else { return };
    let stats = tokio::task::spawn_blocking(move || guard.shutdown(FLUSH_TIMEOUT)).await;
    if let Ok(stats) = stats {
        if stats.spans_dropped > 0 || stats.export_failures > 0 {
            tracing::warn!(
                exported = stats.spans_exported,
                dropped = stats.spans_dropped,
                failed_exports = stats.export_failures,
                "telemetry: some spans were dropped (collector slow or unreachable)"
            );
        } else {
            tracing::debug!(exported = stats.spans_exported, "telemetry flushed");
        }
    }
}

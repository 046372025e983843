//! keel-telemetry against a real OTLP/HTTP collector on a local socket
//! (keel-testkit's `OtlpReceiver`), which decodes every body with the
//! official opentelemetry-proto types: what arrives there is what a real
//! collector would see.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Result;
use keel_telemetry::{
    KeyValue, SpanEvent, SpanKind, SpanRecord, SpanStatus, Telemetry, TelemetryConfig, TelemetryGuard, TelemetryStats,
    TraceId,
};
use keel_testkit::otlp::OtlpReceiver;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue as ProtoKeyValue, any_value::Value};
use opentelemetry_proto::tonic::metrics::v1::{AggregationTemporality, Metric, metric::Data, number_data_point};
use opentelemetry_proto::tonic::trace::v1::{Span, span, status::StatusCode};

/// Generous: only a guard against a hang, never a speed target.
const HANG_GUARD: Duration = Duration::from_secs(10);

fn fast_config(endpoint: &str) -> TelemetryConfig {
    TelemetryConfig {
        schedule_delay: Duration::from_millis(20),
        metric_export_interval: Duration::from_millis(50),
        service_name: "keel-test".to_owned(),
        ..TelemetryConfig::for_endpoint(endpoint)
    }
}

/// Shuts down off the runtime thread (shutdown blocks), under the hang guard.
async fn shutdown(guard: TelemetryGuard, timeout: Duration) -> TelemetryStats {
    let stopping = tokio::task::spawn_blocking(move || guard.shutdown(timeout));
    tokio::time::timeout(HANG_GUARD, stopping).await.expect("shutdown hung").expect("shutdown panicked")
}

fn attribute<'a>(attributes: &'a [ProtoKeyValue], key: &str) -> Option<&'a Value> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
}

fn string(text: &str) -> Value {
    Value::StringValue(text.to_owned())
}

#[tokio::test]
async fn a_span_tree_arrives_intact() -> Result<()> {
    let receiver = OtlpReceiver::start().await?;
    let (telemetry, guard) = Telemetry::start(&fast_config(&receiver.endpoint()))?;
    let trace = TraceId::random();
    let mut root = SpanRecord::new(trace, None, "invoke_agent keel", SpanKind::Server, 1_000, 9_000);
    root.status = SpanStatus::Ok;
    let mut chat = SpanRecord::new(trace, Some(root.span_id), "chat gpt-4o", SpanKind::Client, 2_000, 5_000);
    chat.attributes = vec![
        KeyValue::str("gen_ai.system", "openai"),
        KeyValue::i64("gen_ai.usage.input_tokens", 1234),
        KeyValue::f64("gen_ai.request.temperature", 0.25),
        KeyValue::bool("keel.replayed", true),
        KeyValue::strings("gen_ai.response.finish_reasons", ["stop", "length"]),
    ];
    chat.status = SpanStatus::Error { message: "rate limited".to_owned() };
    chat.events =
        vec![SpanEvent { name: "retry".to_owned(), time_unix_nanos: 3_000, attributes: vec![KeyValue::i64("n", 1)] }];
    let tool = SpanRecord::new(trace, Some(root.span_id), "execute_tool read", SpanKind::Internal, 6_000, 7_000);
    for span in [&chat, &tool, &root] {
        telemetry.record_span(span.clone());
    }

    let spans = receiver.wait_for_spans(3, HANG_GUARD).await.map_err(anyhow::Error::msg)?;
    let by_name: HashMap<&str, &Span> = spans.iter().map(|span| (span.name.as_str(), span)).collect();
    let (root_out, chat_out, tool_out) =
        (by_name["invoke_agent keel"], by_name["chat gpt-4o"], by_name["execute_tool read"]);
    for span in [root_out, chat_out, tool_out] {
        assert_eq!(span.trace_id, trace.to_bytes());
    }
    assert_eq!(root_out.span_id, root.span_id.to_bytes());
    assert!(root_out.parent_span_id.is_empty());
    assert_eq!(chat_out.parent_span_id, root.span_id.to_bytes());
    assert_eq!(tool_out.parent_span_id, root.span_id.to_bytes());
    assert_eq!(root_out.kind, span::SpanKind::Server as i32);
    assert_eq!(chat_out.kind, span::SpanKind::Client as i32);
    assert_eq!(tool_out.kind, span::SpanKind::Internal as i32);
    assert_eq!((chat_out.start_time_unix_nano, chat_out.end_time_unix_nano), (2_000, 5_000));

    let attributes = &chat_out.attributes;
    assert_eq!(attribute(attributes, "gen_ai.system"), Some(&string("openai")));
    assert_eq!(attribute(attributes, "gen_ai.usage.input_tokens"), Some(&Value::IntValue(1234)));
    assert_eq!(attribute(attributes, "gen_ai.request.temperature"), Some(&Value::DoubleValue(0.25)));
    assert_eq!(attribute(attributes, "keel.replayed"), Some(&Value::BoolValue(true)));
    let Some(Value::ArrayValue(reasons)) = attribute(attributes, "gen_ai.response.finish_reasons") else {
        panic!("finish reasons are not an array: {attributes:?}");
    };
    let reasons: Vec<_> = reasons.values.iter().map(|v: &AnyValue| v.value.clone()).collect();
    assert_eq!(reasons, [Some(string("stop")), Some(string("length"))]);

    let status = chat_out.status.as_ref().expect("the chat span has a status");
    assert_eq!((status.code, status.message.as_str()), (StatusCode::Error as i32, "rate limited"));
    assert_eq!(root_out.status.as_ref().map(|s| s.code), Some(StatusCode::Ok as i32));
    assert_eq!(tool_out.status, None, "unset status is left out");
    assert_eq!(chat_out.events.len(), 1);
    assert_eq!((chat_out.events[0].name.as_str(), chat_out.events[0].time_unix_nano), ("retry", 3_000));
    assert_eq!(attribute(&chat_out.events[0].attributes, "n"), Some(&Value::IntValue(1)));

    let export = &receiver.trace_requests()[0].resource_spans[0];
    let resource = &export.resource.as_ref().expect("a resource").attributes;
    assert_eq!(attribute(resource, "service.name"), Some(&string("keel-test")));
    assert_eq!(attribute(resource, "service.version"), Some(&string(env!("CARGO_PKG_VERSION"))));
    assert_eq!(export.scope_spans[0].scope.as_ref().map(|s| s.name.as_str()), Some("keel"));
    let request = &receiver.requests()[0];
    assert_eq!((request.method.as_str(), request.path.as_str()), ("POST", "/v1/traces"));
    assert_eq!(request.header("content-type"), Some("application/x-protobuf"));
    assert_eq!(receiver.decode_errors(), 0);

    let stats = shutdown(guard, Duration::from_secs(5)).await;
    assert_eq!((stats.spans_recorded, stats.spans_exported, stats.spans_dropped, stats.spans_queued), (3, 3, 0, 0));
    Ok(())
}

#[tokio::test]
async fn settings_from_the_environment_reach_the_collector() -> Result<()> {
    let receiver = OtlpReceiver::start().await?;
    let endpoint = receiver.endpoint();
    let env = HashMap::from([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret,x-keel-tenant=acme"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci"),
        ("OTEL_BSP_SCHEDULE_DELAY", "20"),
    ]);
    let config = TelemetryConfig::from_lookup(|name| env.get(name).map(|value| (*value).to_owned()))?;
    let (telemetry, guard) = Telemetry::start(&config)?;
    telemetry.record_span(SpanRecord::new(TraceId::random(), None, "turn", SpanKind::Server, 1, 2));
    receiver.wait_for_spans(1, HANG_GUARD).await.map_err(anyhow::Error::msg)?;

    let request = &receiver.requests()[0];
    assert_eq!(request.header("authorization"), Some("Bearer s3cret"));
    assert_eq!(request.header("x-keel-tenant"), Some("acme"));
    let export = &receiver.trace_requests()[0].resource_spans[0];
    let resource = &export.resource.as_ref().expect("a resource").attributes;
    assert_eq!(attribute(resource, "deployment.environment"), Some(&string("ci")));
    assert_eq!(attribute(resource, "service.name"), Some(&string("keel")));
    shutdown(guard, Duration::from_secs(5)).await;
    Ok(())
}

fn metric<'a>(metrics: &'a [Metric], name: &str) -> Option<&'a Metric> {
    metrics.iter().find(|metric| metric.name == name)
}

/// The value of the `keel.turns` series with `outcome=completed`.
fn completed_turns(metrics: &[Metric]) -> Option<i64> {
    let Some(Data::Sum(sum)) = metric(metrics, "keel.turns")?.data.as_ref() else { return None };
    let point = sum.data_points.iter().find(|p| attribute(&p.attributes, "outcome") == Some(&string("completed")))?;
    match point.value {
        Some(number_data_point::Value::AsInt(value)) => Some(value),
        _ => None,
    }
}

fn scope_metrics(
    export: &opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
) -> &[Metric] {
    &export.resource_metrics[0].scope_metrics[0].metrics
}

#[tokio::test]
async fn counters_and_histograms_are_cumulative_with_correct_buckets() -> Result<()> {
    let receiver = OtlpReceiver::start().await?;
    let (telemetry, guard) = Telemetry::start(&fast_config(&receiver.endpoint()))?;
    telemetry.register_counter("keel.turns", "{turn}", "Turns finished");
    telemetry.register_histogram("keel.turn.duration", "s", "Turn latency", &[0.1, 1.0, 10.0])?;
    let completed = [KeyValue::str("outcome", "completed"), KeyValue::str("model", "gpt-4o")];
    let reversed = [KeyValue::str("model", "gpt-4o"), KeyValue::str("outcome", "completed")];
    for seconds in [0.05, 0.1, 0.5, 2.0, 20.0] {
        telemetry.histogram_record("keel.turn.duration", seconds, &completed);
    }
    telemetry.histogram_record("keel.tokens", 7.0, &[]);
    telemetry.counter_add("keel.turns", 2, &completed);
    telemetry.counter_add("keel.turns", 1, &[KeyValue::str("outcome", "failed")]);
    // Last, so an export showing 5 completed turns holds everything above.
    telemetry.counter_add("keel.turns", 3, &reversed);

    let first = receiver.wait_for_metrics(HANG_GUARD, |e| completed_turns(scope_metrics(e)) == Some(5)).await;
    let first = first.map_err(anyhow::Error::msg)?;
    let metrics = scope_metrics(&first);
    let turns = metric(metrics, "keel.turns").expect("the counter");
    assert_eq!((turns.unit.as_str(), turns.description.as_str()), ("{turn}", "Turns finished"));
    let Some(Data::Sum(sum)) = &turns.data else { panic!("keel.turns is not a sum: {turns:?}") };
    assert!(sum.is_monotonic);
    assert_eq!(sum.aggregation_temporality, AggregationTemporality::Cumulative as i32);
    assert_eq!(sum.data_points.len(), 2, "attribute order does not split a series");

    let duration = metric(metrics, "keel.turn.duration").expect("the histogram");
    assert_eq!(duration.unit, "s");
    let Some(Data::Histogram(histogram)) = &duration.data else { panic!("not a histogram: {duration:?}") };
    assert_eq!(histogram.aggregation_temporality, AggregationTemporality::Cumulative as i32);
    let point = &histogram.data_points[0];
    assert_eq!(point.explicit_bounds, [0.1, 1.0, 10.0]);
    assert_eq!(point.bucket_counts, [2, 1, 1, 1], "buckets are upper-inclusive");
    assert_eq!((point.count, point.min, point.max), (5, Some(0.05), Some(20.0)));
    assert!((point.sum.unwrap_or_default() - 22.65).abs() < 1e-9, "{point:?}");
    assert_eq!(attribute(&point.attributes, "model"), Some(&string("gpt-4o")));
    let Some(Data::Histogram(tokens)) = metric(metrics, "keel.tokens").and_then(|m| m.data.as_ref()) else {
        panic!("keel.tokens is missing: {metrics:?}");
    };
    assert_eq!(tokens.data_points[0].explicit_bounds.len(), 15, "OTel's default boundaries");
    assert_eq!(tokens.data_points[0].bucket_counts[2], 1, "7 falls in (5, 10]");

    telemetry.counter_add("keel.turns", 10, &completed);
    let later = receiver.wait_for_metrics(HANG_GUARD, |e| completed_turns(scope_metrics(e)) == Some(15)).await;
    let later = later.map_err(anyhow::Error::msg)?;
    let start = |export: &opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest| {
        let Some(Data::Sum(sum)) = metric(scope_metrics(export), "keel.turns").and_then(|m| m.data.clone()) else {
            return (0, 0);
        };
        (sum.data_points[0].start_time_unix_nano, sum.data_points[0].time_unix_nano)
    };
    let ((first_start, first_time), (later_start, later_time)) = (start(&first), start(&later));
    assert_eq!(first_start, later_start, "cumulative series keep their start time");
    assert!(later_time > first_time);

    let stats = shutdown(guard, Duration::from_secs(5)).await;
    assert!(stats.metric_exports >= 2, "{stats:?}");
    assert_eq!(receiver.decode_errors(), 0);
    Ok(())
}

/// Records 100,000 spans as fast as a loop can; returns the stats right after.
fn record_many(telemetry: &Telemetry) -> TelemetryStats {
    let template = SpanRecord::new(TraceId::random(), None, "tool", SpanKind::Internal, 1, 2);
    for _ in 0..100_000 {
        telemetry.record_span(template.clone());
    }
    telemetry.stats()
}

fn assert_all_accounted_for(stats: TelemetryStats) {
    assert_eq!(stats.spans_recorded, 100_000, "{stats:?}");
    assert_eq!(stats.spans_exported + stats.spans_dropped, 100_000, "{stats:?}");
    assert_eq!(stats.spans_queued, 0, "{stats:?}");
}

#[tokio::test]
async fn a_collector_that_is_down_costs_dropped_spans_not_time() -> Result<()> {
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let config = TelemetryConfig::for_endpoint(&format!("http://127.0.0.1:{closed_port}"));
    let (telemetry, guard) = Telemetry::start(&config)?;

    let during = record_many(&telemetry);
    assert_eq!(during.spans_recorded, 100_000);
    assert!(during.spans_dropped > 0, "a full queue drops: {during:?}");
    assert_eq!(during.spans_exported, 0);

    let after = shutdown(guard, Duration::from_secs(1)).await;
    assert_all_accounted_for(after);
    assert_eq!(after.spans_exported, 0);
    assert!(after.export_failures >= 1, "{after:?}");
    telemetry.record_span(SpanRecord::new(TraceId::random(), None, "late", SpanKind::Internal, 1, 2));
    assert_eq!(telemetry.stats().spans_dropped, 100_001, "spans after shutdown are dropped and counted");
    Ok(())
}

#[tokio::test]
async fn a_slow_collector_costs_dropped_spans_and_shutdown_keeps_its_deadline() -> Result<()> {
    let receiver = OtlpReceiver::start().await?;
    receiver.set_delay(Duration::from_secs(30));
    let (telemetry, guard) = Telemetry::start(&TelemetryConfig::for_endpoint(&receiver.endpoint()))?;

    let during = record_many(&telemetry);
    assert_eq!(during.spans_recorded, 100_000);
    assert!(during.spans_dropped > 0, "a full queue drops: {during:?}");

    let after = shutdown(guard, Duration::from_secs(1)).await;
    assert_all_accounted_for(after);
    assert_eq!(after.spans_exported, 0, "the collector never answered: {after:?}");
    Ok(())
}

#[tokio::test]
async fn an_overloaded_collector_gets_one_retry_then_the_batch_is_dropped() -> Result<()> {
    let receiver = OtlpReceiver::start().await?;
    receiver.set_status(503);
    let (telemetry, guard) = Telemetry::start(&fast_config(&receiver.endpoint()))?;
    telemetry.record_span(SpanRecord::new(TraceId::random(), None, "turn", SpanKind::Server, 1, 2));
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while telemetry.stats().export_failures == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = shutdown(guard, Duration::from_secs(1)).await;
    assert_eq!((stats.export_failures, stats.spans_dropped, stats.spans_exported), (1, 1, 0), "{stats:?}");
    assert_eq!(receiver.requests().len(), 2, "one request and one retry");
    assert!(receiver.spans().is_empty());
    Ok(())
}

#[tokio::test]
async fn without_an_endpoint_everything_is_a_no_op() -> Result<()> {
    let config = TelemetryConfig::from_lookup(|_| None)?;
    let (telemetry, guard) = Telemetry::start(&config)?;
    assert!(!telemetry.is_enabled());
    telemetry.record_span(SpanRecord::new(TraceId::random(), None, "turn", SpanKind::Server, 1, 2));
    telemetry.counter_add("keel.turns", 1, &[]);
    telemetry.histogram_record("keel.turn.duration", 1.0, &[]);
    telemetry.register_histogram("keel.turn.duration", "s", "", &[2.0, 1.0])?;
    assert_eq!(telemetry.stats(), TelemetryStats::default());
    assert_eq!(shutdown(guard, Duration::from_secs(1)).await, TelemetryStats::default());
    drop(Telemetry::start(&config)?); // Dropping a guard never blocks.
    Ok(())
}

#[tokio::test]
async fn dropping_the_guard_stops_the_exporter_without_waiting() -> Result<()> {
    let receiver = OtlpReceiver::start().await?;
    receiver.set_delay(Duration::from_secs(30));
    let (telemetry, guard) = Telemetry::start(&TelemetryConfig::for_endpoint(&receiver.endpoint()))?;
    record_many(&telemetry);
    drop(guard);
    // The thread drops what it holds on its way out; wait for that, not a time.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while telemetry.stats().spans_queued > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_all_accounted_for(telemetry.stats());
    Ok(())
}

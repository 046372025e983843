//! From keel's records to OTLP request bodies: the resource and scope every
//! export carries, spans, and attributes.
//!
//! The messages are opentelemetry-proto's generated prost types (its
//! `tonic` module holds plain messages; keel enables no gRPC). Fields keel
//! never sets (links, flags, dropped counts, schema URLs) stay at their
//! defaults, which protobuf leaves off the wire.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{self as common, InstrumentationScope, any_value::Value};
use opentelemetry_proto::tonic::metrics::v1::{Metric, ResourceMetrics, ScopeMetrics};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{self as trace, ResourceSpans, ScopeSpans, span, status};
use prost::Message;

use crate::{AttrValue, KeyValue, SpanKind, SpanRecord, SpanStatus, TelemetryConfig};

/// Who is reporting: the resource and instrumentation scope of every export.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    resource: Resource,
    scope: InstrumentationScope,
}

impl Origin {
    pub fn new(config: &TelemetryConfig) -> Origin {
        let mut attributes = vec![
            KeyValue::str("service.name", &config.service_name),
            KeyValue::str("service.version", &config.service_version),
        ];
        attributes.extend(config.resource_attributes.iter().cloned());
        Origin {
            resource: Resource { attributes: key_values(&attributes), ..Resource::default() },
            scope: InstrumentationScope {
                name: "keel".to_owned(),
                version: config.service_version.clone(),
                ..InstrumentationScope::default()
            },
        }
    }

    /// An `ExportTraceServiceRequest` body.
    pub fn traces_body(&self, spans: &[SpanRecord]) -> Vec<u8> {
        let scope_spans = ScopeSpans {
            scope: Some(self.scope.clone()),
            spans: spans.iter().map(otlp_span).collect(),
            ..ScopeSpans::default()
        };
        let resource_spans = ResourceSpans {
            resource: Some(self.resource.clone()),
            scope_spans: vec![scope_spans],
            ..ResourceSpans::default()
        };
        ExportTraceServiceRequest { resource_spans: vec![resource_spans] }.encode_to_vec()
    }

    /// An `ExportMetricsServiceRequest` body.
    pub fn metrics_body(&self, metrics: Vec<Metric>) -> Vec<u8> {
        let scope_metrics = ScopeMetrics { scope: Some(self.scope.clone()), metrics, ..ScopeMetrics::default() };
        let resource_metrics = ResourceMetrics {
            resource: Some(self.resource.clone()),
            scope_metrics: vec![scope_metrics],
            ..ResourceMetrics::default()
        };
        ExportMetricsServiceRequest { resource_metrics: vec![resource_metrics] }.encode_to_vec()
    }
}

fn otlp_span(record: &SpanRecord) -> trace::Span {
    let kind = match record.kind {
        SpanKind::Internal => span::SpanKind::Internal,
        SpanKind::Client => span::SpanKind::Client,
        SpanKind::Server => span::SpanKind::Server,
    };
    let status = match &record.status {
        SpanStatus::Unset => None,
        SpanStatus::Ok => Some(trace::Status { message: String::new(), code: status::StatusCode::Ok.into() }),
        SpanStatus::Error { message } => {
            Some(trace::Status { message: message.clone(), code: status::StatusCode::Error.into() })
        }
    };
    let events = record.events.iter().map(|event| span::Event {
        time_unix_nano: event.time_unix_nanos,
        name: event.name.clone(),
        attributes: key_values(&event.attributes),
        ..span::Event::default()
    });
    trace::Span {
        trace_id: record.trace_id.to_bytes().to_vec(),
        span_id: record.span_id.to_bytes().to_vec(),
        parent_span_id: record.parent_span_id.map(|id| id.to_bytes().to_vec()).unwrap_or_default(),
        name: record.name.clone(),
        kind: kind.into(),
        start_time_unix_nano: record.start_unix_nanos,
        end_time_unix_nano: record.end_unix_nanos,
        attributes: key_values(&record.attributes),
        events: events.collect(),
        status,
        ..trace::Span::default()
    }
}

pub(crate) fn key_values(attributes: &[KeyValue]) -> Vec<common::KeyValue> {
    let key_value = |kv: &KeyValue| common::KeyValue {
        key: kv.key.clone(),
        value: Some(any_value(&kv.value)),
        ..common::KeyValue::default()
    };
    attributes.iter().map(key_value).collect()
}

fn any_value(value: &AttrValue) -> common::AnyValue {
    let value = match value {
        AttrValue::String(text) => Value::StringValue(text.clone()),
        AttrValue::Bool(flag) => Value::BoolValue(*flag),
        AttrValue::I64(number) => Value::IntValue(*number),
        AttrValue::F64(number) => Value::DoubleValue(*number),
        AttrValue::StringArray(items) => Value::ArrayValue(common::ArrayValue {
            values: items
                .iter()
                .map(|item| common::AnyValue { value: Some(Value::StringValue(item.clone())) })
                .collect(),
        }),
    };
    common::AnyValue { value: Some(value) }
}

//! From keel's records to OTLP request bodies: the resource and scope every
//! export carries, spans, and attributes.

use prost::Message;

use crate::proto::{self, any_value::Value};
use crate::{AttrValue, KeyValue, SpanKind, SpanRecord, SpanStatus, TelemetryConfig};

/// Who is reporting: the resource and instrumentation scope of every export.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    resource: proto::Resource,
    scope: proto::InstrumentationScope,
}

impl Origin {
    pub fn new(config: &TelemetryConfig) -> Origin {
        let mut attributes = vec![
            KeyValue::str("service.name", &config.service_name),
            KeyValue::str("service.version", &config.service_version),
        ];
        attributes.extend(config.resource_attributes.iter().cloned());
        Origin {
            resource: proto::Resource { attributes: key_values(&attributes) },
            scope: proto::InstrumentationScope { name: "keel".to_owned(), version: config.service_version.clone() },
        }
    }

    /// An `ExportTraceServiceRequest` body.
    pub fn traces_body(&self, spans: &[SpanRecord]) -> Vec<u8> {
        let scope_spans =
            proto::ScopeSpans { scope: Some(self.scope.clone()), spans: spans.iter().map(span).collect() };
        let resource_spans =
            proto::ResourceSpans { resource: Some(self.resource.clone()), scope_spans: vec![scope_spans] };
        proto::ExportTraceServiceRequest { resource_spans: vec![resource_spans] }.encode_to_vec()
    }

    /// An `ExportMetricsServiceRequest` body.
    pub fn metrics_body(&self, metrics: Vec<proto::Metric>) -> Vec<u8> {
        let scope_metrics = proto::ScopeMetrics { scope: Some(self.scope.clone()), metrics };
        let resource_metrics =
            proto::ResourceMetrics { resource: Some(self.resource.clone()), scope_metrics: vec![scope_metrics] };
        proto::ExportMetricsServiceRequest { resource_metrics: vec![resource_metrics] }.encode_to_vec()
    }
}

fn span(record: &SpanRecord) -> proto::Span {
    let kind = match record.kind {
        SpanKind::Internal => proto::SpanKind::Internal,
        SpanKind::Client => proto::SpanKind::Client,
        SpanKind::Server => proto::SpanKind::Server,
    };
    let status = match &record.status {
        SpanStatus::Unset => None,
        SpanStatus::Ok => Some(proto::Status { message: String::new(), code: proto::StatusCode::Ok.into() }),
        SpanStatus::Error { message } => {
            Some(proto::Status { message: message.clone(), code: proto::StatusCode::Error.into() })
        }
    };
    let events = record.events.iter().map(|event| proto::SpanEvent {
        time_unix_nano: event.time_unix_nanos,
        name: event.name.clone(),
        attributes: key_values(&event.attributes),
    });
    proto::Span {
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
    }
}

pub(crate) fn key_values(attributes: &[KeyValue]) -> Vec<proto::KeyValue> {
    attributes.iter().map(|kv| proto::KeyValue { key: kv.key.clone(), value: Some(any_value(&kv.value)) }).collect()
}

fn any_value(value: &AttrValue) -> proto::AnyValue {
    let value = match value {
        AttrValue::String(text) => Value::StringValue(text.clone()),
        AttrValue::Bool(flag) => Value::BoolValue(*flag),
        AttrValue::I64(number) => Value::IntValue(*number),
        AttrValue::F64(number) => Value::DoubleValue(*number),
        AttrValue::StringArray(items) => Value::ArrayValue(proto::ArrayValue {
            values: items
                .iter()
                .map(|item| proto::AnyValue { value: Some(Value::StringValue(item.clone())) })
                .collect(),
        }),
    };
    proto::AnyValue { value: Some(value) }
}

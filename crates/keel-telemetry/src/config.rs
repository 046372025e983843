//! [`TelemetryConfig`], read from the standard `OTEL_*` environment
//! variables. Parsing takes a lookup function rather than reading the
//! process environment, so it is tested without touching global state.
//!
//! keel refuses values it cannot honour (a protocol other than
//! http/protobuf, a queue size that is not a number) instead of guessing, so
//! a misconfigured collector shows up at start rather than as missing data.

use std::time::Duration;

use crate::{KeyValue, Result, TelemetryError};

/// Where and how to export. With neither endpoint set, telemetry is off.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Full URL spans are POSTed to; `None` turns traces off.
    pub traces_endpoint: Option<String>,
    /// Full URL metrics are POSTed to; `None` turns metrics off.
    pub metrics_endpoint: Option<String>,
    /// Sent with every export, e.g. an `authorization` header.
    pub headers: Vec<(String, String)>,
    /// Per export request.
    pub timeout: Duration,
    pub service_name: String,
    pub service_version: String,
    /// Extra resource attributes (`OTEL_RESOURCE_ATTRIBUTES`).
    pub resource_attributes: Vec<KeyValue>,
    /// Spans waiting for export; more are dropped and counted.
    pub max_queue_size: usize,
    /// How long a partial batch waits before it is sent.
    pub schedule_delay: Duration,
    pub max_export_batch_size: usize,
    pub metric_export_interval: Duration,
    /// Whether prompts and completions may be recorded in spans; keel decides
    /// what that means (`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`).
    pub capture_content: bool,
}

impl TelemetryConfig {
    /// Telemetry off: every call is a no-op.
    pub fn disabled() -> TelemetryConfig {
        TelemetryConfig {
            traces_endpoint: None,
            metrics_endpoint: None,
            headers: Vec::new(),
            timeout: Duration::from_millis(10_000),
            service_name: "keel".to_owned(),
            service_version: env!("CARGO_PKG_VERSION").to_owned(),
            resource_attributes: Vec::new(),
            max_queue_size: 2048,
            schedule_delay: Duration::from_millis(1000),
            max_export_batch_size: 512,
            metric_export_interval: Duration::from_millis(60_000),
            capture_content: false,
        }
    }

    /// Defaults, exporting both signals under the base URL `endpoint`
    /// (`<endpoint>/v1/traces` and `<endpoint>/v1/metrics`).
    pub fn for_endpoint(endpoint: &str) -> TelemetryConfig {
        let base = endpoint.trim_end_matches('/');
        TelemetryConfig {
            traces_endpoint: Some(format!("{base}/v1/traces")),
            metrics_endpoint: Some(format!("{base}/v1/metrics")),
            ..TelemetryConfig::disabled()
        }
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<TelemetryConfig> {
        TelemetryConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (name to value), as [`Self::from_env`]
    /// does with the process environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<TelemetryConfig> {
        let get = |name: &str| lookup(name).map(|value| value.trim().to_owned()).filter(|value| !value.is_empty());
        let mut config = TelemetryConfig::disabled();
        config.capture_content = parse_bool(get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"));
        if parse_bool(get("OTEL_SDK_DISABLED")) {
            return Ok(config); // Nothing else matters, not even a bad value.
        }
        if let Some(protocol) = get("OTEL_EXPORTER_OTLP_PROTOCOL").filter(|p| p != "http/protobuf") {
            return Err(TelemetryError::UnsupportedProtocol(protocol));
        }
        if let Some(headers) = get("OTEL_EXPORTER_OTLP_HEADERS") {
            config.headers = parse_pairs("OTEL_EXPORTER_OTLP_HEADERS", &headers)?;
        }
        if let Some(attributes) = get("OTEL_RESOURCE_ATTRIBUTES") {
            let pairs = parse_pairs("OTEL_RESOURCE_ATTRIBUTES", &attributes)?;
            for (key, value) in pairs {
                match key.as_str() {
                    "service.name" => config.service_name = value,
                    _ => config.resource_attributes.push(KeyValue::str(key, value)),
                }
            }
        }
        if let Some(name) = get("OTEL_SERVICE_NAME") {
            config.service_name = name;
        }
        let millis = |name: &'static str, default: Duration| -> Result<Duration> {
            Ok(get(name).map(|value| parse_number(name, &value)).transpose()?.map_or(default, Duration::from_millis))
        };
        config.timeout = millis("OTEL_EXPORTER_OTLP_TIMEOUT", config.timeout)?;
        config.schedule_delay = millis("OTEL_BSP_SCHEDULE_DELAY", config.schedule_delay)?;
        config.metric_export_interval = millis("OTEL_METRIC_EXPORT_INTERVAL", config.metric_export_interval)?;
        let count = |name: &'static str, default: usize| -> Result<usize> {
            let Some(value) = get(name) else { return Ok(default) };
            match parse_number(name, &value)? {
                0 => Err(invalid(name, &value, "it must be at least 1")),
                count => Ok(usize::try_from(count).unwrap_or(usize::MAX)),
            }
        };
        config.max_queue_size = count("OTEL_BSP_MAX_QUEUE_SIZE", config.max_queue_size)?;
        config.max_export_batch_size = count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", config.max_export_batch_size)?;

        let base = get("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| base.trim_end_matches('/').to_owned());
        let signal = |exporter: &'static str, endpoint: &str, path: &str| -> Result<Option<String>> {
            match get(exporter).as_deref() {
                None | Some("otlp") => {}
                Some("none") => return Ok(None),
                Some(other) => return Err(invalid(exporter, other, "keel exports with otlp or none")),
            }
            Ok(get(endpoint).or_else(|| base.as_ref().map(|base| format!("{base}{path}"))))
        };
        config.traces_endpoint = signal("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "/v1/traces")?;
        config.metrics_endpoint =
            signal("OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "/v1/metrics")?;
        Ok(config)
    }

    /// Whether anything will be exported.
    pub fn is_enabled(&self) -> bool {
        self.traces_endpoint.is_some() || self.metrics_endpoint.is_some()
    }
}

fn invalid(name: &'static str, value: &str, reason: &str) -> TelemetryError {
    TelemetryError::InvalidSetting { name, value: value.to_owned(), reason: reason.to_owned() }
}

/// The OTel rule: only `true`, in any case, is true.
fn parse_bool(value: Option<String>) -> bool {
    value.is_some_and(|value| value.eq_ignore_ascii_case("true"))
}

fn parse_number(name: &'static str, value: &str) -> Result<u64> {
    value.parse().map_err(|_| invalid(name, value, "it must be a whole number"))
}

/// `k1=v1,k2=v2` with percent-encoded values, as in W3C Baggage.
fn parse_pairs(name: &'static str, list: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|entry| !entry.is_empty()) {
        let (key, value) = entry.split_once('=').ok_or_else(|| invalid(name, list, "every entry must be key=value"))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(invalid(name, list, "a key is empty"));
        }
        let value =
            percent_decode(value.trim()).ok_or_else(|| invalid(name, list, "a value is badly percent-encoded"))?;
        pairs.push((key.to_owned(), value));
    }
    Ok(pairs)
}

/// Decodes `%XX` escapes; `None` for a broken escape or non-UTF-8 result.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = std::str::from_utf8(bytes.get(index + 1..index + 3)?).ok()?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<TelemetryConfig> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        TelemetryConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn no_endpoint_means_disabled_with_defaults() {
        let config = config(&[]).unwrap();
        assert!(!config.is_enabled());
        assert_eq!(config, TelemetryConfig::disabled());
        assert_eq!(config.service_name, "keel");
        assert_eq!((config.max_queue_size, config.max_export_batch_size), (2048, 512));
        assert_eq!(config.timeout, Duration::from_secs(10));
        assert_eq!(config.metric_export_interval, Duration::from_secs(60));
        assert!(!config.capture_content);
    }

    #[test]
    fn the_base_endpoint_gets_signal_paths_and_signal_endpoints_are_used_as_is() {
        let base = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]).unwrap();
        assert_eq!(base.traces_endpoint.as_deref(), Some("http://collector:4318/v1/traces"));
        assert_eq!(base.metrics_endpoint.as_deref(), Some("http://collector:4318/v1/metrics"));
        let signal = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:9999/custom"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ])
        .unwrap();
        assert_eq!(signal.traces_endpoint.as_deref(), Some("http://traces:9999/custom"));
        assert_eq!(signal.metrics_endpoint, None);
        let disabled = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ]);
        assert!(!disabled.unwrap().is_enabled());
    }

    #[test]
    fn every_setting_is_read() {
        let config = config(&[
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m/v1/metrics"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_SERVICE_NAME", "keel-prod"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=ignored, deployment.environment=prod%20eu"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "5000"),
            ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true"),
        ])
        .unwrap();
        assert_eq!(config.traces_endpoint, None);
        assert_eq!(config.metrics_endpoint.as_deref(), Some("http://m/v1/metrics"));
        assert_eq!(config.timeout, Duration::from_millis(2500));
        assert_eq!(config.service_name, "keel-prod");
        assert_eq!(config.resource_attributes, vec![KeyValue::str("deployment.environment", "prod eu")]);
        assert_eq!((config.max_queue_size, config.max_export_batch_size), (100, 10));
        assert_eq!(config.schedule_delay, Duration::from_millis(50));
        assert_eq!(config.metric_export_interval, Duration::from_secs(5));
        assert!(config.capture_content);
    }

    #[test]
    fn headers_are_split_trimmed_and_percent_decoded() {
        let config = config(&[("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20a%3Db , x-tenant=k%C3%A9el,")]);
        let headers = config.unwrap().headers;
        assert_eq!(headers, [("authorization".into(), "Bearer a=b".into()), ("x-tenant".into(), "kéel".into())]);
        assert_eq!(percent_decode("100%"), None);
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
    }

    #[test]
    fn unusable_values_are_clear_errors() {
        let grpc = config(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert_eq!(grpc, TelemetryError::UnsupportedProtocol("grpc".into()));
        assert!(grpc.to_string().contains("http/protobuf"), "{grpc}");
        for (name, value) in [
            ("OTEL_EXPORTER_OTLP_HEADERS", "no-equals-sign"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
            ("OTEL_TRACES_EXPORTER", "zipkin"),
        ] {
            let error = config(&[(name, value)]).unwrap_err();
            assert!(matches!(error, TelemetryError::InvalidSetting { name: n, .. } if n == name), "{error}");
        }
    }
}

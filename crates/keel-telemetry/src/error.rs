//! Why telemetry could not be configured or started. Exports that fail at
//! run time are not errors here: they are counted in
//! [`crate::TelemetryStats`] and the batch is dropped, because a collector
//! being down must never fail a turn.

pub type Result<T, E = TelemetryError> = std::result::Result<T, E>;

/// Why telemetry could not be configured or started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TelemetryError {
    /// An environment variable holds a value that cannot be used.
    #[error("{name}={value:?} is not valid: {reason}; fix or unset it")]
    InvalidSetting { name: &'static str, value: String, reason: String },
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` names a transport keel does not speak.
    #[error(
        "OTEL_EXPORTER_OTLP_PROTOCOL={0:?} is not supported: keel exports OTLP over http/protobuf only, set it to http/protobuf or unset it"
    )]
    UnsupportedProtocol(String),
    /// A trace or span id is not the right number of hex digits, or is all zero.
    #[error("{kind} {value:?} is not valid: expected {digits} hex digits, not all zero")]
    InvalidId { kind: &'static str, value: String, digits: usize },
    /// Histogram boundaries must be finite and strictly increasing.
    #[error("histogram {name} has invalid boundaries: they must be finite and strictly increasing")]
    InvalidBoundaries { name: String },
    /// The HTTP client or the exporter thread could not be set up.
    #[error("could not start the OTLP exporter: {0}")]
    Start(String),
}

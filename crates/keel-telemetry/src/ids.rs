//! Trace and span ids: random, never all zero (W3C Trace Context treats an
//! all-zero id as invalid), shown and serialized as lowercase hex.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::TelemetryError;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $len:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub [u8; $len]);

        impl $name {
            /// A fresh random id, never all zero.
            pub fn random() -> $name {
                let mut bytes = [0u8; $len];
                while bytes == [0u8; $len] {
                    fill_random(&mut bytes);
                }
                $name(bytes)
            }

            pub fn to_bytes(self) -> [u8; $len] {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({self})", stringify!($name))
            }
        }

        impl FromStr for $name {
            type Err = TelemetryError;

            fn from_str(text: &str) -> Result<$name, TelemetryError> {
                let invalid = || TelemetryError::InvalidId { kind: $kind, value: text.to_owned(), digits: $len * 2 };
                let mut bytes = [0u8; $len];
                if text.len() != $len * 2 || !text.is_ascii() {
                    return Err(invalid());
                }
                for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks(2)) {
                    let pair = std::str::from_utf8(pair).map_err(|_| invalid())?;
                    *byte = u8::from_str_radix(pair, 16).map_err(|_| invalid())?;
                }
                if bytes == [0u8; $len] {
                    return Err(invalid());
                }
                Ok($name(bytes))
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<$name, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

id_type!(
    /// A 16-byte trace id, shared by every span of one trace.
    TraceId, 16, "trace id"
);
id_type!(
    /// An 8-byte span id.
    SpanId, 8, "span id"
);

/// Fills `bytes` from the OS; if that fails, from std's randomly seeded
/// hasher, which is unpredictable enough for ids (they are not secrets).
fn fill_random(bytes: &mut [u8]) {
    if getrandom::fill(bytes).is_ok() {
        return;
    }
    for chunk in bytes.chunks_mut(8) {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
        );
        let random = hasher.finish().to_le_bytes();
        chunk.copy_from_slice(&random[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_lowercase_hex() {
        let trace = TraceId([0xAB; 16]);
        assert_eq!(trace.to_string(), "ab".repeat(16));
        assert_eq!("AB".repeat(16).parse::<TraceId>().unwrap(), trace);
        let span = SpanId([0, 1, 2, 3, 4, 5, 6, 0xff]);
        assert_eq!(span.to_string(), "00010203040506ff");
        assert_eq!(span.to_string().parse::<SpanId>().unwrap(), span);
        let json = serde_json::to_string(&span).unwrap();
        assert_eq!(json, "\"00010203040506ff\"");
        assert_eq!(serde_json::from_str::<SpanId>(&json).unwrap(), span);
    }

    #[test]
    fn bad_ids_are_refused() {
        assert!("0".repeat(32).parse::<TraceId>().is_err(), "all zero");
        assert!("ab".repeat(15).parse::<TraceId>().is_err(), "too short");
        assert!("zz".repeat(8).parse::<SpanId>().is_err(), "not hex");
        assert!("é".repeat(8).parse::<SpanId>().is_err(), "not ascii");
        assert!(serde_json::from_str::<SpanId>("\"00\"").is_err());
    }

    #[test]
    fn random_ids_differ_and_are_never_zero() {
        let (a, b) = (TraceId::random(), TraceId::random());
        assert_ne!(a, b);
        assert_ne!(SpanId::random().0, [0; 8]);
    }
}

//! Server-sent events framing (placeholder, being written).

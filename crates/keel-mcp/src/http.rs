//! Streamable HTTP servers: the HTTP client and the rmcp transport on it.
//!
//! rmcp's own default client would pick its TLS crypto from a process-wide
//! default and panic when there is none; keel builds the client itself, with
//! ring (as the rest of keel) and the platform's certificate verifier, so a
//! TLS problem is an error message instead. Redirects are not followed: an
//! MCP endpoint that redirects is misconfigured, and following it would
//! replay the session id and the configured headers (credentials) to
//! wherever it points.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp_reqwest as reqwest;
use rustls_platform_verifier::BuilderVerifierExt as _;

/// Headers the transport sets itself; configuring them would break the
/// session.
const RESERVED_HEADERS: [&str; 3] = ["accept", "mcp-session-id", "last-event-id"];

pub(crate) type HttpTransport = StreamableHttpClientTransport<reqwest::Client>;

pub(crate) fn transport(url: &str, headers: &BTreeMap<String, String>) -> Result<HttpTransport, String> {
    let headers = header_map(headers)?;
    let client = client().map_err(|error| format!("cannot set up an HTTP client for {url}: {error}"))?;
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    Ok(StreamableHttpClientTransport::with_client(client, config))
}

fn header_map(headers: &BTreeMap<String, String>) -> Result<HashMap<HeaderName, HeaderValue>, String> {
    headers
        .iter()
        .map(|(name, value)| {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("`{name}` is not a valid HTTP header name; fix the server's headers"))?;
            if RESERVED_HEADERS.contains(&header.as_str()) {
                return Err(format!(
                    "header `{name}` is set by the MCP transport itself; remove it from the server's headers"
                ));
            }
            // The value may be a credential: never quote it.
            let value = HeaderValue::from_str(value)
                .map_err(|_| format!("the value of header `{name}` is not a valid HTTP header value"))?;
            Ok((header, value))
        })
        .collect()
}

fn client() -> Result<reqwest::Client, Box<dyn std::error::Error + Send + Sync>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_platform_verifier()?
        .with_no_client_auth();
    // reqwest is built without HTTP/2 here.
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        // rmcp's advice: pooled connections whose previous body was not fully
        // read stall ~40 ms on delayed ACKs; MCP traffic gains little from them.
        .pool_max_idle_per_host(0)
        .build()?;
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_checked_without_quoting_values() {
        let ok = BTreeMap::from([("Authorization".to_owned(), "Bearer sk-1".to_owned())]);
        assert_eq!(header_map(&ok).unwrap().len(), 1);

        let reserved = BTreeMap::from([("Mcp-Session-Id".to_owned(), "x".to_owned())]);
        assert!(header_map(&reserved).unwrap_err().contains("set by the MCP transport"));

        let bad_value = BTreeMap::from([("Authorization".to_owned(), "Bearer sk-secret\n".to_owned())]);
        let error = header_map(&bad_value).unwrap_err();
        assert!(!error.contains("sk-secret"), "{error}");
    }

    #[test]
    fn https_client_builds() {
        client().unwrap();
    }
}

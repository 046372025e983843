//! Redaction: hiding secrets in what keel shows people.
//!
//! The audit view shows tool arguments and outputs, which is where secrets
//! end up: a model pastes an API key into a command, a command prints a
//! token. [`redact_json`] and [`redact_text`] replace them with
//! [`REDACTED`] before anything is shown. Both are pure and cannot fail.
//!
//! What counts as a secret:
//!
//! - **The value of a secret-looking key**, in JSON objects and in text
//!   (`key=value`, `key: value`, `"key": "value"`, `--key value`). A key is
//!   split into lowercase words (`x-api-key`, `apiKey`, `API_KEY` all give
//!   `api key`); see [`is_secret_key`] for the exact rule. In JSON, `null`,
//!   booleans and empty strings are kept: they hide nothing. In text, a bare
//!   value that reads as code (`token: &str`, `token = get_token()`,
//!   `api_key=api_key`, `$TOKEN`) is kept, so code stays readable; quoted
//!   values are always hidden. `Authorization`, `Proxy-Authorization`,
//!   `Cookie` and `Set-Cookie` hide the rest of their line.
//! - **Tokens by shape**, anywhere in a string, replaced in place: the
//!   prefixes in [`TOKEN_PREFIXES`], AWS key ids (`AKIA`/`ASIA` and 16
//!   upper-case letters or digits), JWTs (`eyJ…` with three dot-separated
//!   base64url segments), what follows `Bearer `, PEM private key blocks, the
//!   password in `scheme://user:password@host`.
//! - **Random-looking strings**: a run of at least [`MIN_RANDOM_LEN`]
//!   characters of `[A-Za-z0-9+/_-]` (plus `=` padding) that has upper-case
//!   letters, lower-case letters and digits, digits in at least two places
//!   between letters, a Shannon entropy of at least [`MIN_ENTROPY_BITS`]
//!   bits per character, and at least [`MIN_CLASS_CHANGES`] of its adjacent
//!   letter/digit pairs changing between upper, lower and digit. Random
//!   base64 and base62 measure 4.3–5.0 bits and 0.5–0.8 changes (a random
//!   32-character base62 string fails the digit rules about once in 200);
//!   file paths and long camelCase names reach the entropy but change class
//!   rarely (0.0–0.4) and keep their digits together.
//!
//! Deliberately left alone: hex strings (SHA-256 digests such as keel's
//! `sha256:…`, git hashes) and UUIDs, which have only one letter case, and
//! keel's ids (`ses_…`, lower-case base32). A secret of that shape is hidden
//! only by its key or its prefix. Redaction is a best effort for display:
//! it narrows what a reader sees, it does not make a value safe to publish.

use std::ops::Range;

use serde_json::Value;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Minimum Shannon entropy, in bits per character, of a random-looking run.
pub const MIN_ENTROPY_BITS: f64 = 4.0;

/// Minimum share of adjacent letter/digit pairs that change class (upper,
/// lower, digit) in a random-looking run.
pub const MIN_CLASS_CHANGES: f64 = 0.3;

/// Minimum length of a random-looking run.
pub const MIN_RANDOM_LEN: usize = 32;

/// Labels of digests (`sha256:…`, and `sha256-…` as in subresource
/// integrity) whose value is never redacted.
const DIGEST_LABELS: &[&str] = &["sha1:", "sha256:", "sha384:", "sha512:", "md5:"];
const INTEGRITY_PREFIXES: &[&str] = &["sha1-", "sha256-", "sha384-", "sha512-"];

/// Known token prefixes, with the fewest characters that must follow.
pub const TOKEN_PREFIXES: &[(&str, usize)] = &[
    ("sk-ant-", 16),     // Anthropic
    ("sk-", 16),         // OpenAI and others (sk-proj-…)
    ("sk_live_", 16),    // Stripe
    ("sk_test_", 16),    // Stripe
    ("rk_live_", 16),    // Stripe restricted
    ("github_pat_", 20), // GitHub fine-grained
    ("ghp_", 20),        // GitHub personal
    ("gho_", 20),        // GitHub OAuth
    ("ghu_", 20),        // GitHub user-to-server
    ("ghs_", 20),        // GitHub server-to-server
    ("ghr_", 20),        // GitHub refresh
    ("glpat-", 20),      // GitLab
    ("xoxb-", 10),       // Slack bot
    ("xoxp-", 10),       // Slack user
    ("xoxa-", 10),       // Slack app
    ("xapp-", 10),       // Slack app-level
    ("AIza", 30),        // Google API key
    ("hf_", 30),         // Hugging Face
    ("npm_", 30),        // npm
];

/// Keys that are secrets as a whole, compared with their words joined
/// (`api_key`, `apiKey` and `APIKEY` all become `apikey`).
const SECRET_KEYS: &[&str] = &[
    "apikey",
    "apikeys",
    "xapikey",
    "apitoken",
    "apisecret",
    "token",
    "accesstoken",
    "refreshtoken",
    "idtoken",
    "authtoken",
    "sessiontoken",
    "bearertoken",
    "secret",
    "secrets",
    "clientsecret",
    "password",
    "passwd",
    "passphrase",
    "authorization",
    "proxyauthorization",
    "auth",
    "cookie",
    "cookies",
    "setcookie",
    "privatekey",
    "credential",
    "credentials",
    "sessionkey",
];

/// Last words that make a key of two or more words secret.
const SECRET_LAST_WORDS: &[&str] =
    &["token", "secret", "password", "passwd", "passphrase", "key", "keys", "credential", "credentials", "cookie"];

/// Words before `token` that name something that is not a credential
/// (pagination cursors, cancellation, a tokenizer's special tokens).
const PLAIN_TOKEN_QUALIFIERS: &[&str] = &[
    "page",
    "next",
    "continuation",
    "pagination",
    "cancellation",
    "sync",
    "max",
    "min",
    "num",
    "total",
    "eos",
    "bos",
    "pad",
    "unk",
    "sep",
    "cls",
    "mask",
    "special",
    "stop",
];

/// Words before `key` that name something that is not a credential.
const PLAIN_KEY_QUALIFIERS: &[&str] = &[
    "primary",
    "foreign",
    "public",
    "sort",
    "partition",
    "cache",
    "idempotency",
    "dedup",
    "dedupe",
    "lookup",
    "hash",
    "map",
    "row",
    "range",
    "routing",
    "object",
    "s3",
    "group",
    "unique",
    "composite",
    "index",
    "hot",
    "shortcut",
    "translation",
    "i18n",
    "message",
    "field",
    "column",
    "sequence",
];

/// Header-like keys whose value runs to the end of the line.
const LINE_KEYS: &[&str] = &["authorization", "proxyauthorization", "cookie", "setcookie"];

/// Bare words after a secret key that are types or literals, not secrets.
const CODE_WORDS: &[&str] = &[
    "null",
    "None",
    "nil",
    "undefined",
    "true",
    "false",
    "True",
    "False",
    "str",
    "String",
    "string",
    "bytes",
    "int",
    "bool",
    "Option",
    "Optional",
    "Secret",
    "SecretString",
    "Self",
    "self",
    "any",
    "Any",
    "object",
    "number",
];

/// Whether a key names a secret.
///
/// The key is split into lowercase words at `_`, `-`, `.`, spaces and
/// camelCase boundaries. It is secret if its joined words are one of
/// `api_key(s)`, `x-api-key`, `api_token`, `api_secret`, `token`,
/// `access_token`, `refresh_token`, `id_token`, `auth_token`,
/// `session_token`, `bearer_token`, `secret(s)`, `client_secret`,
/// `password`, `passwd`, `passphrase`, `authorization`,
/// `proxy_authorization`, `auth`, `cookie(s)`, `set_cookie`, `private_key`,
/// `credential(s)`, `session_key`; or if it has two or more words and the
/// last is `token`, `secret`, `password`, `passwd`, `passphrase`, `key(s)`,
/// `credential(s)` or `cookie` — except `…_token` after a pagination,
/// cancellation or tokenizer word (`page_token`, `eos_token`), and `…_key`
/// after a word naming a non-secret key (`primary_key`, `public_key`,
/// `sort_key`, `cache_key`, `idempotency_key`, …). Plurals that count
/// (`input_tokens`) and bare `key` are not secret.
pub fn is_secret_key(key: &str) -> bool {
    let words = key_words(key);
    let joined = words.concat();
    if SECRET_KEYS.contains(&joined.as_str()) {
        return true;
    }
    let [.., before, last] = words.as_slice() else { return false };
    if !SECRET_LAST_WORDS.contains(&last.as_str()) {
        return false;
    }
    match last.as_str() {
        "token" => !PLAIN_TOKEN_QUALIFIERS.contains(&before.as_str()),
        "key" | "keys" => !PLAIN_KEY_QUALIFIERS.contains(&before.as_str()),
        _ => true,
    }
}

/// `X-Api-Key` → `["x", "api", "key"]`; `APIKey` → `["api", "key"]`.
fn key_words(key: &str) -> Vec<String> {
    let chars: Vec<char> = key.chars().collect();
    let mut words = Vec::new();
    let mut word = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_alphanumeric() {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            continue;
        }
        let prev = i.checked_sub(1).and_then(|p| chars.get(p)).copied().unwrap_or(' ');
        let next = chars.get(i + 1).copied().unwrap_or(' ');
        let camel = c.is_uppercase()
            && (prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next.is_lowercase()));
        if camel && !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        word.extend(c.to_lowercase());
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Redacts a JSON value: the values of secret keys, and secrets inside
/// every string (keys included), at any depth.
pub fn redact_json(value: &Value) -> Value {
    match value {
        Value::String(text) => Value::String(redact_text(text)),
        Value::Array(items) => Value::Array(items.iter().map(redact_json).collect()),
        Value::Object(map) => map
            .iter()
            .map(|(key, value)| {
                let hides_something = match value {
                    Value::Null | Value::Bool(_) => false,
                    Value::String(text) => !text.is_empty(),
                    _ => true,
                };
                let value = if is_secret_key(key) && hides_something {
                    Value::String(REDACTED.to_string())
                } else {
                    redact_json(value)
                };
                (redact_text(key), value)
            })
            .collect(),
        other => other.clone(),
    }
}

/// Redacts free text: tokens by shape, random-looking runs, and the values
/// of secret-looking keys, each replaced in place.
pub fn redact_text(text: &str) -> String {
    let mut spans = Vec::new();
    private_key_blocks(text, &mut spans);
    url_passwords(text, &mut spans);
    secret_assignments(text, &mut spans);
    shaped_tokens(text, &mut spans);
    random_runs(text, &mut spans);
    if spans.is_empty() {
        return text.to_string();
    }
    spans.retain(|s| s.start < s.end && text.is_char_boundary(s.start) && text.is_char_boundary(s.end));
    spans.sort_by_key(|s| (s.start, s.end));
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for span in spans {
        match merged.last_mut() {
            Some(last) if span.start <= last.end => last.end = last.end.max(span.end),
            _ => merged.push(span),
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for span in merged {
        out.push_str(&text[at..span.start]);
        out.push_str(REDACTED);
        at = span.end;
    }
    out.push_str(&text[at..]);
    out
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Length of the run of bytes from `from` that satisfy `accept`.
fn run_len(bytes: &[u8], from: usize, accept: impl Fn(u8) -> bool) -> usize {
    bytes.get(from..).map_or(0, |rest| rest.iter().take_while(|&&b| accept(b)).count())
}

/// `-----BEGIN … PRIVATE KEY-----` through its END line (or the end of the
/// text, when it was cut).
fn private_key_blocks(text: &str, spans: &mut Vec<Range<usize>>) {
    let mut from = 0;
    while let Some(found) = text[from..].find("-----BEGIN ") {
        let start = from + found;
        let line_end = text[start..].find('\n').map_or(text.len(), |n| start + n);
        if !text[start..line_end].contains("PRIVATE KEY") {
            from = line_end;
            continue;
        }
        let end = match text[line_end..].find("-----END ") {
            Some(n) => {
                let end_line = line_end + n + "-----END ".len();
                text[end_line..].find("-----").map_or(text.len(), |m| end_line + m + "-----".len())
            }
            None => text.len(),
        };
        spans.push(start..end);
        from = end;
    }
}

/// The password in `scheme://user:password@host`.
fn url_passwords(text: &str, spans: &mut Vec<Range<usize>>) {
    let mut from = 0;
    while let Some(found) = text[from..].find("://") {
        let start = from + found + 3;
        let authority_len = run_len(text.as_bytes(), start, |b| {
            !b.is_ascii_whitespace() && !matches!(b, b'/' | b'?' | b'#' | b'"' | b'\'' | b'\\' | b'<' | b'>')
        });
        let authority = &text[start..start + authority_len];
        if let Some(at) = authority.rfind('@')
            && let Some(colon) = authority[..at].find(':')
            && colon + 1 < at
        {
            spans.push(start + colon + 1..start + at);
        }
        from = start + authority_len;
    }
}

fn is_key_byte(b: u8) -> bool {
    is_word_byte(b) || b == b'-' || b == b'.'
}

/// Values of secret-looking keys: `key=value`, `key: value`,
/// `"key": "value"` (also with escaped quotes), `--key value`.
fn secret_assignments(text: &str, spans: &mut Vec<Range<usize>>) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if !is_key_byte(bytes[i]) || (i > 0 && is_key_byte(bytes[i - 1])) {
            i += 1;
            continue;
        }
        let key_end = i + run_len(bytes, i, is_key_byte);
        let key = &text[i..key_end];
        let flag = key.starts_with("--");
        i = key_end;
        if !is_secret_key(key) {
            continue;
        }
        let mut k = key_end;
        k += quote_len(bytes, k);
        let spaces = run_len(bytes, k, |b| b == b' ' || b == b'\t');
        k += spaces;
        let separated = match (bytes.get(k), bytes.get(k + 1)) {
            (Some(b'='), next) if next != Some(&b'=') => true,
            (Some(b':'), next) if !matches!(next, Some(b':' | b'=')) => true,
            _ => false,
        };
        if separated {
            k += 1;
            k += run_len(bytes, k, |b| b == b' ' || b == b'\t');
        } else if !(flag && spaces > 0) {
            continue;
        }
        let quote = quote_len(bytes, k);
        if quote > 0 {
            let open = &text[k..k + quote];
            let start = k + quote;
            let line_end = text[start..].find('\n').map_or(text.len(), |n| start + n);
            let end = closing_quote(&text[start..line_end], open).map_or(line_end, |n| start + n);
            spans.push(start..end);
            i = end;
            continue;
        }
        let line_value = LINE_KEYS.contains(&key_words(key).concat().as_str());
        let value_len = if line_value {
            let len = run_len(bytes, k, |b| !matches!(b, b'\n' | b'\r' | b'"' | b'\'' | b'\\'));
            text[k..k + len].trim_end().len()
        } else {
            run_len(bytes, k, |b| {
                !b.is_ascii_whitespace()
                    && !matches!(b, b',' | b';' | b'&' | b'|' | b'"' | b'\'' | b'`' | b'\\' | b')' | b']' | b'}' | b'>')
            })
        };
        let value = &text[k..k + value_len];
        if line_value || !(looks_like_code(value) || (flag && value.starts_with('-'))) {
            spans.push(k..k + value_len);
        }
        i = k + value_len;
    }
}

/// A quote (`"`, `'`, or a backslash-escaped one) at `at`: its length.
fn quote_len(bytes: &[u8], at: usize) -> usize {
    match (bytes.get(at), bytes.get(at + 1)) {
        (Some(b'"' | b'\''), _) => 1,
        (Some(b'\\'), Some(b'"' | b'\'')) => 2,
        _ => 0,
    }
}

/// Where `quote` closes in `rest`, skipping backslash-escaped quotes when
/// the quote itself is not escaped.
fn closing_quote(rest: &str, quote: &str) -> Option<usize> {
    if quote.len() == 2 {
        return rest.find(quote);
    }
    let q = quote.as_bytes().first().copied()?;
    let bytes = rest.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b if b == q => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// A bare value that reads as code or a reference, not a secret: a type, a
/// literal, a call, a variable (`$TOKEN`, `%TOKEN%`), or a name that is
/// itself secret-looking (`api_key=api_key`, `password=args.password`).
fn looks_like_code(value: &str) -> bool {
    if value.is_empty()
        || value.starts_with(['$', '%', '&', '*'])
        || value.contains(['(', ')', '<', '>', '[', ']', '{', '}'])
    {
        return true;
    }
    if CODE_WORDS.contains(&value) {
        return true;
    }
    let segments: Vec<&str> = value.split(['.', ':']).filter(|s| !s.is_empty()).collect();
    let identifiers = segments
        .iter()
        .all(|s| s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') && s.bytes().all(is_word_byte));
    identifiers && segments.last().is_some_and(|last| is_secret_key(last))
}

/// Tokens recognised by their prefix, AWS key ids, JWTs, and what follows
/// `Bearer `.
fn shaped_tokens(text: &str, spans: &mut Vec<Range<usize>>) {
    let bytes = text.as_bytes();
    let token_byte = |b: u8| is_word_byte(b) || b == b'-';
    let mut i = 0;
    while i < bytes.len() {
        if i > 0 && is_word_byte(bytes[i - 1]) {
            i += 1;
            continue;
        }
        let rest = &text[i..];
        let mut found = None;
        if let Some((prefix, min)) = TOKEN_PREFIXES.iter().find(|(p, _)| rest.starts_with(p)) {
            let body = run_len(bytes, i + prefix.len(), token_byte);
            if body >= *min {
                found = Some(prefix.len() + body);
            }
        } else if rest.starts_with("AKIA") || rest.starts_with("ASIA") {
            let body = run_len(bytes, i + 4, |b| b.is_ascii_uppercase() || b.is_ascii_digit());
            if body >= 16 && !bytes.get(i + 4 + body).is_some_and(|&b| is_word_byte(b)) {
                found = Some(4 + body);
            }
        } else if rest.starts_with("eyJ") {
            found = jwt_len(bytes, i);
        } else if rest.len() > 7 && rest.as_bytes()[..7].eq_ignore_ascii_case(b"bearer ") {
            let gap = run_len(bytes, i + 6, |b| b == b' ' || b == b'\t');
            let start = i + 6 + gap;
            let len = run_len(bytes, start, |b| token_byte(b) || matches!(b, b'.' | b'~' | b'+' | b'/' | b'='));
            if len >= 8 {
                spans.push(start..start + len);
                i = start + len;
                continue;
            }
        }
        match found {
            Some(len) => {
                spans.push(i..i + len);
                i += len;
            }
            None => i += 1,
        }
    }
}

/// A JWT at `at`: `eyJ…` header, payload and a (possibly empty) signature.
fn jwt_len(bytes: &[u8], at: usize) -> Option<usize> {
    let b64url = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    let header = run_len(bytes, at, b64url);
    if header < 10 || bytes.get(at + header) != Some(&b'.') {
        return None;
    }
    let payload_at = at + header + 1;
    let payload = run_len(bytes, payload_at, b64url);
    if payload < 10 || bytes.get(payload_at + payload) != Some(&b'.') {
        return None;
    }
    let signature = run_len(bytes, payload_at + payload + 1, b64url);
    Some(header + 1 + payload + 1 + signature)
}

/// Runs of base64-like characters that look random (see the module docs).
fn random_runs(text: &str, spans: &mut Vec<Range<usize>>) {
    let bytes = text.as_bytes();
    let run_byte = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'_' | b'-');
    let mut i = 0;
    while i < bytes.len() {
        let len = run_len(bytes, i, run_byte);
        if len == 0 {
            i += 1;
            continue;
        }
        let run = &text[i..i + len];
        let digest = DIGEST_LABELS.iter().any(|label| text[..i].ends_with(label))
            || INTEGRITY_PREFIXES.iter().any(|prefix| run.starts_with(prefix));
        if len >= MIN_RANDOM_LEN && !digest && looks_random(run) {
            let padding = run_len(bytes, i + len, |b| b == b'=').min(2);
            spans.push(i..i + len + padding);
        }
        i += len;
    }
}

fn looks_random(run: &str) -> bool {
    #[derive(PartialEq, Clone, Copy)]
    enum Class {
        Upper,
        Lower,
        Digit,
    }
    let class = |b: u8| match b {
        b'A'..=b'Z' => Some(Class::Upper),
        b'a'..=b'z' => Some(Class::Lower),
        b'0'..=b'9' => Some(Class::Digit),
        _ => None,
    };
    let bytes = run.as_bytes();
    let has = |c: Class| bytes.iter().any(|&b| class(b) == Some(c));
    if !(has(Class::Upper) && has(Class::Lower) && has(Class::Digit)) {
        return false;
    }
    let (mut pairs, mut changes, mut digit_edges) = (0usize, 0usize, 0usize);
    for pair in bytes.windows(2) {
        if let (Some(a), Some(b)) = (class(pair[0]), class(pair[1])) {
            pairs += 1;
            changes += usize::from(a != b);
            digit_edges += usize::from((a == Class::Digit) != (b == Class::Digit));
        }
    }
    // `Name123` has one edge between letters and digits; random text has many.
    if digit_edges < 2 || pairs == 0 || (changes as f64) < MIN_CLASS_CHANGES * pairs as f64 {
        return false;
    }
    shannon_entropy(bytes) >= MIN_ENTROPY_BITS
}

/// Bits per byte of `bytes`' own distribution.
fn shannon_entropy(bytes: &[u8]) -> f64 {
    let mut counts = [0usize; 256];
    for &b in bytes {
        counts[b as usize] += 1;
    }
    let n = bytes.len() as f64;
    counts.iter().filter(|&&c| c > 0).map(|&c| c as f64 / n).map(|p| -p * p.log2()).sum()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const JWT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c";

    #[test]
    fn each_token_kind_is_redacted_in_place() {
        let cases = [
            ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789", "[redacted]"),
            ("key: sk-proj-abcdefghijklmnop1234 ok", "key: [redacted] ok"),
            ("use sk_live_4eC39HqLyjWDarjtT1zdp7dc now", "use [redacted] now"),
            ("token ghp_0123456789abcdefghijABCDEFGHIJ012345 here", "token [redacted] here"),
            ("gho_16C7e42F292c6912E7710c838347Ae178B4a,", "[redacted],"),
            ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "[redacted]"),
            ("glpat-abcdefghij0123456789 x", "[redacted] x"),
            ("slack xoxb-123456789012-abcdefghijkl.", "slack [redacted]."),
            ("slack xoxp-123456789012-abcdefghijkl.", "slack [redacted]."),
            ("id AKIAIOSFODNN7EXAMPLE in logs", "id [redacted] in logs"),
            ("maps AIzaSyA-1234567890abcdefghijklmnopqrstu!", "maps [redacted]!"),
            ("hf_abcdefghijklmnopqrstuvwxyzABCDEF", "[redacted]"),
            (&format!("jwt={JWT};"), "jwt=[redacted];"),
            (&format!("the session {JWT} expired"), "the session [redacted] expired"),
            ("Bearer abcdef123456", "Bearer [redacted]"),
            ("header bearer abc.def-ghi_jkl~mno", "header bearer [redacted]"),
            ("Authorization: Basic dXNlcjpwYXNz", "Authorization: [redacted]"),
            (
                r#"curl -H "Authorization: Bearer $TOKEN" https://x.test"#,
                r#"curl -H "Authorization: [redacted]" https://x.test"#,
            ),
            ("Cookie: session=abc; theme=dark\nnext", "Cookie: [redacted]\nnext"),
            ("random Xy7Kp2Qm9Zr4Tn8Lw3Hv6Bj1Fd5Gs0Ac end", "random [redacted] end"),
            ("b64 aGVsbG8gd29ybGQgdGhpcyBpcyBiYXNlNjQgZW5jb2RlZA== end", "b64 [redacted] end"),
            ("postgres://admin:hunter2@db:5432/app", "postgres://admin:[redacted]@db:5432/app"),
            (
                "a\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\nabc\n-----END RSA PRIVATE KEY-----\nb",
                "a\n[redacted]\nb",
            ),
            ("cut -----BEGIN PRIVATE KEY-----\nMIIEvQIBADAN", "cut [redacted]"),
        ];
        for (input, expected) in cases {
            assert_eq!(redact_text(input), expected, "{input}");
        }
    }

    #[test]
    fn values_of_secret_keys_are_redacted_in_text() {
        let cases = [
            ("export OPENAI_API_KEY=abc123", "export OPENAI_API_KEY=[redacted]"),
            ("GITHUB_TOKEN = plainvalue", "GITHUB_TOKEN = [redacted]"),
            ("https://api.test/v1?api_key=abc123&q=1", "https://api.test/v1?api_key=[redacted]&q=1"),
            ("password: hunter2", "password: [redacted]"),
            ("Password=hunter2 user=bob", "Password=[redacted] user=bob"),
            (r#"{"password": "hunter 2", "user": "bob"}"#, r#"{"password": "[redacted]", "user": "bob"}"#),
            (r#"{\"client_secret\":\"s3cret\"}"#, r#"{\"client_secret\":\"[redacted]\"}"#),
            (r#"{"password": "a\"b", "n": 1}"#, r#"{"password": "[redacted]", "n": 1}"#),
            ("token: 'abc def'", "token: '[redacted]'"),
            ("X-Api-Key: abc123", "X-Api-Key: [redacted]"),
            ("mytool --token abc123 --verbose", "mytool --token [redacted] --verbose"),
            ("mytool --password=abc123", "mytool --password=[redacted]"),
            (r#"let api_key = "abc123";"#, r#"let api_key = "[redacted]";"#),
        ];
        for (input, expected) in cases {
            assert_eq!(redact_text(input), expected, "{input}");
        }
    }

    #[test]
    fn ordinary_text_paths_ids_digests_and_code_are_left_alone() {
        let kept = [
            "hello world, plain words and sentences.",
            "Password reset instructions were sent; the token expired.",
            "/usr/lib/x86_64-linux-gnu/libLLVM-17.so.1",
            "/home/user/projects/keel-runtime/src/audit_view2.rs",
            "crates/keel-runtime/src/driver/model_call.rs",
            "target/x86_64-unknown-linux-gnu/release/build/llama-cpp-sys-2-1a2b3c4d5e6f7a8b/out",
            "550e8400-e29b-41d4-a716-446655440000",
            "550E8400-E29B-41D4-A716-446655440000",
            "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "sha256:K7gNU3sdo+OL0wNhqoVWhr3g6s1xYv72ol/pe/Unols=",
            "integrity sha512-K7gNU3sdo+OL0wNhqoVWhr3g6s1xYv72ol/pe/Unols=",
            "commit e83c5163316f89bfbde7d9ab23ca2e25604af290",
            "ses_01jd8x9k2m3n4p5q6r7s8t9v0w int_01jd8x9k2m3n4p5q6r7s8t9v0x",
            "getUserAccountSettingsFromRemoteServer2 ThisIsAVeryLongCamelCaseIdentifierName123",
            "HTTPServerConfig2FactorAuthenticationHandler",
            "let token = tokenizer.next();",
            "fn login(password: &str, token: Option<String>) -> Result<()>",
            "self.api_key = api_key",
            "client = Client(api_key=api_key, token=args.token)",
            "def f(token: str = None, secret: bool = False):",
            "echo $GITHUB_TOKEN; TOKEN=$(cat token.txt)",
            "max_tokens: 100, input_tokens: 3",
            "primary_key: id, sort_key: created_at",
            "a task-list and sk-short",
            "https://example.com/path?q=1#frag ssh://git@github.com/org/repo.git",
            "Bearer of bad news",
            "-----BEGIN PUBLIC KEY-----",
            "",
        ];
        for text in kept {
            assert_eq!(redact_text(text), text);
        }
    }

    #[test]
    fn json_redacts_secret_keys_at_any_depth_and_tokens_in_any_string() {
        let value = json!({
            "API_KEY": "abc",
            "Authorization": "Bearer x",
            "nested": {
                "Password": "p",
                "list": [{"accessToken": 5}, "ghp_0123456789abcdefghijABCDEFGHIJ012345", ["sk-ant-abcdefghijklmnopqrstuvwx"]],
                "auth": {"user": "bob", "pass": "x"}
            },
            "primary_key": "id",
            "public_key": "ssh-ed25519 short",
            "input_tokens": 10,
            "page_token": "next-page",
            "eos_token": "</s>",
            "password": null,
            "secret": false,
            "token": "",
            "path": "/home/user/a.txt",
            "digest": "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "command": "curl -H 'Authorization: Bearer abcdefgh12345' https://x.test",
            "note": "my key is sk-ant-abcdefghijklmnopqrstuvwx, keep it",
            "sk-ant-abcdefghijklmnopqrstuvwx": 1
        });
        let expected = json!({
            "API_KEY": "[redacted]",
            "Authorization": "[redacted]",
            "nested": {
                "Password": "[redacted]",
                "list": [{"accessToken": "[redacted]"}, "[redacted]", ["[redacted]"]],
                "auth": "[redacted]"
            },
            "primary_key": "id",
            "public_key": "ssh-ed25519 short",
            "input_tokens": 10,
            "page_token": "next-page",
            "eos_token": "</s>",
            "password": null,
            "secret": false,
            "token": "",
            "path": "/home/user/a.txt",
            "digest": "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "command": "curl -H 'Authorization: [redacted]' https://x.test",
            "note": "my key is [redacted], keep it",
            "[redacted]": 1
        });
        assert_eq!(redact_json(&value), expected);
    }

    #[test]
    fn secret_keys_are_recognised_by_their_words_in_any_case() {
        let secret = [
            "api_key",
            "apiKey",
            "API_KEY",
            "apikey",
            "x-api-key",
            "X-Api-Key",
            "token",
            "Token",
            "access_token",
            "accessToken",
            "refresh_token",
            "secret",
            "client_secret",
            "clientSecret",
            "password",
            "PASSWORD",
            "passwd",
            "authorization",
            "Proxy-Authorization",
            "auth",
            "cookie",
            "Set-Cookie",
            "private_key",
            "credential",
            "credentials",
            "session_key",
            "github_token",
            "OPENAI_API_KEY",
            "aws_secret_access_key",
            "db_password",
            "ssh_key",
            "signingKey",
            "--token",
            "config.api_key",
        ];
        for key in secret {
            assert!(is_secret_key(key), "{key} should be secret");
        }
        let plain = [
            "key",
            "tokens",
            "input_tokens",
            "max_tokens",
            "primary_key",
            "public_key",
            "sort_key",
            "cache_key",
            "idempotency_key",
            "page_token",
            "next_page_token",
            "eos_token",
            "author",
            "session_id",
            "monkey",
            "tokenizer",
            "keyboard",
            "path",
            "content",
            "secret_name",
            "password_file",
        ];
        for key in plain {
            assert!(!is_secret_key(key), "{key} should not be secret");
        }
    }

    #[test]
    fn random_strings_with_digits_are_caught() {
        // Deterministic pseudo-random base62 strings. One without digits (or
        // with a single one at an end) is not caught by its shape: the rule
        // needs digits among the letters, which is what keeps camelCase
        // names out.
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut checked = 0;
        for len in [32usize, 40, 48, 64] {
            for _ in 0..50 {
                let token: String = (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        alphabet[(state % 62) as usize] as char
                    })
                    .collect();
                let digit_among_letters = token
                    .as_bytes()
                    .windows(3)
                    .any(|w| w[1].is_ascii_digit() && w[0].is_ascii_alphabetic() && w[2].is_ascii_alphabetic());
                if !digit_among_letters {
                    continue;
                }
                let redacted = redact_text(&format!("value {token} end"));
                assert_eq!(redacted, "value [redacted] end", "{token} was kept");
                checked += 1;
            }
        }
        assert!(checked >= 190, "only {checked} of 200 strings had digits among letters");
    }
}

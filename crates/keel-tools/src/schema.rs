//! Checking tool arguments against the tool's JSON Schema before a call.
//!
//! Validation is the [`jsonschema`] crate's, not keel's: MCP servers send
//! schemas that pydantic and zod generate, full of `$defs`/`$ref`, `anyOf`
//! with `null` for optional fields, `oneOf`, `allOf`, `pattern` and
//! `format`, and a hand-written subset let calls that break them through.
//! The draft is the schema's `$schema`, or 2020-12 (MCP's default); a
//! schema that names no draft and is invalid under 2020-12 is tried as
//! draft 7, then draft 4, before it is refused.
//!
//! How the validator is set up, and why:
//! - **Offline.** The crate is built without its HTTP and file resolvers and
//!   compiled with [`jsonschema::ValidationOptions::offline`]: a `$ref` to
//!   anything outside the schema (other than the bundled meta-schemas) makes
//!   the schema unusable instead of making keel fetch a URL or read a file an
//!   untrusted server named.
//! - **Formats are asserted**, as clients of real servers expect: `email`,
//!   `uri`, `date-time`, `uuid`, `ipv4` and the other formats the crate knows
//!   reject values that are not one. Unknown formats, and `idn-email`/
//!   `idn-hostname` (the crate's IDNA tables are left out), are annotations.
//! - **Patterns** run on fancy-regex (ECMA-style lookaround, which generated
//!   patterns use) with a capped number of backtracking steps, so a pathological
//!   pattern costs one refused call, not a stuck turn.
//! - **An invalid schema is an error**, never a panic: the schema is checked
//!   against its meta-schema when compiled, and compilation and validation
//!   run under `catch_unwind` because both inputs are untrusted (the schema
//!   from a server, the arguments from a model).
//!
//! Each schema is compiled once and cached by its digest (SHA-256 of its
//! compact JSON, whose keys serde_json keeps sorted; were `preserve_order`
//! ever enabled, equal schemas with different key order would only be
//! compiled twice, never confused). The cache is bounded and forgets the
//! oldest entry first. A failure names the path of each offending value
//! (`arguments.pets[1].name`) and what was expected, so the model can fix
//! its call; argument values are not echoed back (field names and the
//! schema's own values, such as an `enum`, are).

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{PatternOptions, ValidationError, Validator};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Compiled schemas kept at once; tool sets are far smaller.
const CACHE_CAPACITY: usize = 256;
/// Most violations listed in one message.
const MAX_REPORTED: usize = 8;
/// Backtracking steps a `pattern` may take on one value.
const PATTERN_BACKTRACK_LIMIT: usize = 1_000_000;
/// Longest message returned; alternatives nested in alternatives can grow.
const MAX_MESSAGE_CHARS: usize = 4000;

/// Checks `value` against `schema`; the error says where and why.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    let compiled = compiled(schema);
    let validator = compiled.as_ref().as_ref().map_err(Clone::clone)?;
    let errors = catch_unwind(AssertUnwindSafe(|| {
        let mut found = validator.iter_errors(value);
        let reported: Vec<String> =
            found.by_ref().take(MAX_REPORTED).map(|e| describe(&e, &Seen { schema, arguments: value })).collect();
        (reported, found.count())
    }));
    match errors {
        Ok((reported, _)) if reported.is_empty() => Ok(()),
        Ok((reported, more)) => {
            let mut message = reported.join("; ");
            if more > 0 {
                message.push_str(&format!("; and {more} more problem(s)"));
            }
            Err(truncate(message))
        }
        Err(_) => Err("the arguments could not be checked: the schema validator failed on them".into()),
    }
}

type Compiled = Arc<Result<Validator, String>>;

struct Cache {
    by_digest: HashMap<[u8; 32], Compiled>,
    oldest_first: VecDeque<[u8; 32]>,
}

static CACHE: LazyLock<Mutex<Cache>> =
    LazyLock::new(|| Mutex::new(Cache { by_digest: HashMap::new(), oldest_first: VecDeque::new() }));

/// The compiled validator for `schema`, from the cache or compiled now.
/// std's Mutex: nothing waits while it is held, and compiling happens
/// outside it (two threads may compile the same schema once each).
fn compiled(schema: &Value) -> Compiled {
    let digest: [u8; 32] = Sha256::digest(schema.to_string().as_bytes()).into();
    if let Some(hit) = CACHE.lock().unwrap_or_else(PoisonError::into_inner).by_digest.get(&digest) {
        return hit.clone();
    }
    let fresh: Compiled = Arc::new(compile(schema));
    let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    if cache.by_digest.insert(digest, fresh.clone()).is_none() {
        cache.oldest_first.push_back(digest);
    }
    while cache.oldest_first.len() > CACHE_CAPACITY {
        if let Some(old) = cache.oldest_first.pop_front() {
            cache.by_digest.remove(&old);
        }
    }
    fresh
}

/// Compiles under the schema's own draft; a schema that names none and is
/// invalid under 2020-12 is tried as draft 7 and then draft 4 before it is
/// refused, because older MCP servers emit those (`"exclusiveMinimum":
/// true` is draft 4's boolean form, invalid in 2020-12).
fn compile(schema: &Value) -> Result<Validator, String> {
    let first = compile_as(schema, None);
    if first.is_err() && schema.get("$schema").is_none() {
        for draft in [jsonschema::Draft::Draft7, jsonschema::Draft::Draft4] {
            if let Ok(validator) = compile_as(schema, Some(draft)) {
                return Ok(validator);
            }
        }
    }
    first
}

fn compile_as(schema: &Value, draft: Option<jsonschema::Draft>) -> Result<Validator, String> {
    let built = catch_unwind(|| {
        let mut options = jsonschema::options();
        if let Some(draft) = draft {
            options = options.with_draft(draft);
        }
        options
            .offline()
            .should_validate_formats(true)
            .with_pattern_options(PatternOptions::fancy_regex().backtrack_limit(PATTERN_BACKTRACK_LIMIT))
            .build(schema)
    });
    let unusable = |why: String| {
        truncate(format!(
            "the tool's input schema is invalid, so no call to it can be checked ({why}); \
             the tool's server must fix its schema"
        ))
    };
    match built {
        Ok(Ok(validator)) => Ok(validator),
        Ok(Err(error)) if matches!(error.kind(), ValidationErrorKind::Referencing(_)) => {
            Err(unusable(error.to_string()))
        }
        Ok(Err(error)) if error.instance_path().is_empty() => Err(unusable(error.to_string())),
        Ok(Err(error)) => Err(unusable(format!("at {}: {error}", error.instance_path()))),
        Err(_) => Err(unusable("the schema validator failed on it".into())),
    }
}

/// The documents an error's locations point into.
struct Seen<'a> {
    schema: &'a Value,
    arguments: &'a Value,
}

/// One violation, in words a model can act on.
fn describe(error: &ValidationError<'_>, seen: &Seen<'_>) -> String {
    describe_at(error, seen, model_path(error.instance_path().as_str(), seen.arguments))
}

/// Like [`describe`], with the offending value called `at`.
fn describe_at(error: &ValidationError<'_>, seen: &Seen<'_>, at: String) -> String {
    let value = error.instance();
    match error.kind() {
        ValidationErrorKind::Required { property } => {
            format!("{} is required", join_key(&at, property.as_str().unwrap_or_default()))
        }
        ValidationErrorKind::Type { kind } => {
            let expected: Vec<String> = match kind {
                TypeKind::Single(one) => vec![one.to_string()],
                TypeKind::Multiple(set) => set.iter().map(|t| t.to_string()).collect(),
            };
            match expected.as_slice() {
                [one] => format!("{at} must be {one}, got {}", type_name(value)),
                many => format!("{at} must be one of {}, got {}", many.join(", "), type_name(value)),
            }
        }
        ValidationErrorKind::Enum { options } => format!("{at} must be one of {options}"),
        ValidationErrorKind::Constant { expected_value } => format!("{at} must be {expected_value}"),
        ValidationErrorKind::Minimum { limit } => format!("{at} must be at least {limit}"),
        ValidationErrorKind::Maximum { limit } => format!("{at} must be at most {limit}"),
        ValidationErrorKind::ExclusiveMinimum { limit } => format!("{at} must be greater than {limit}"),
        ValidationErrorKind::ExclusiveMaximum { limit } => format!("{at} must be less than {limit}"),
        ValidationErrorKind::MultipleOf { multiple_of } => format!("{at} must be a multiple of {multiple_of}"),
        ValidationErrorKind::MinLength { limit } => format!("{at} must be at least {limit} character(s) long"),
        ValidationErrorKind::MaxLength { limit } => format!("{at} must be at most {limit} character(s) long"),
        ValidationErrorKind::MinItems { limit } => format!("{at} must have at least {limit} item(s)"),
        ValidationErrorKind::MaxItems { limit } => format!("{at} must have at most {limit} item(s)"),
        ValidationErrorKind::MinProperties { limit } => format!("{at} must have at least {limit} field(s)"),
        ValidationErrorKind::MaxProperties { limit } => format!("{at} must have at most {limit} field(s)"),
        ValidationErrorKind::UniqueItems => format!("{at} must not contain duplicate items"),
        ValidationErrorKind::Contains => format!("{at} must contain an item that matches its schema"),
        ValidationErrorKind::Pattern { pattern } => format!("{at} must match the regular expression {pattern:?}"),
        ValidationErrorKind::Format { format } => format!("{at} must be a valid {format}"),
        ValidationErrorKind::BacktrackLimitExceeded { .. } | ValidationErrorKind::RegexEngineFailure { .. } => {
            format!("{at} could not be checked against its pattern (too costly to evaluate); send a simpler value")
        }
        ValidationErrorKind::AdditionalProperties { unexpected }
        | ValidationErrorKind::UnevaluatedProperties { unexpected } => {
            let names: Vec<String> = unexpected.iter().map(|name| join_key(&at, name)).collect();
            let verb = if names.len() == 1 { "is" } else { "are" };
            let allowed = allowed_fields(error.schema_path().as_str(), seen.schema);
            match allowed {
                Some(known) => format!("{} {verb} not allowed (allowed: {known})", names.join(", ")),
                None => format!("{} {verb} not allowed", names.join(", ")),
            }
        }
        ValidationErrorKind::FalseSchema => format!("{at} is not allowed here"),
        ValidationErrorKind::AnyOf { context } | ValidationErrorKind::OneOfNotValid { context } => {
            let keyword = error.kind().keyword();
            let options: Vec<String> = context
                .iter()
                .enumerate()
                .map(|(index, errors)| {
                    let parts: Vec<String> = errors.iter().map(|e| describe(e, seen)).collect();
                    format!("({}) {}", index + 1, parts.join(" and "))
                })
                .collect();
            format!("{at} matches none of the alternatives its schema allows ({keyword}): {}", options.join(" or "))
        }
        ValidationErrorKind::OneOfMultipleValid { .. } => {
            format!("{at} matches more than one alternative of its schema (oneOf); it must match exactly one")
        }
        ValidationErrorKind::Not { schema } => format!("{at} must not match the schema {schema}"),
        ValidationErrorKind::PropertyNames { error } => {
            let name = format!("the field name {}", error.instance());
            format!("{at} has a field name its schema refuses: {}", describe_at(error, seen, name))
        }
        ValidationErrorKind::Referencing(reason) => format!("{at} could not be checked: {reason}"),
        _ => format!("{at}: {}", error.masked()),
    }
}

/// `arguments.a.b[2]` for the JSON pointer `/a/b/2` into `arguments`.
fn model_path(pointer: &str, arguments: &Value) -> String {
    let mut path = String::from("arguments");
    let mut here = Some(arguments);
    for raw in pointer.split('/').skip(1) {
        let segment = raw.replace("~1", "/").replace("~0", "~");
        // A segment of digits is an index only inside an array; an object
        // may have a field named "0".
        match (here, segment.parse::<usize>()) {
            (Some(Value::Array(items)), Ok(index)) => {
                path.push_str(&format!("[{index}]"));
                here = items.get(index);
            }
            _ => {
                path = join_key(&path, &segment);
                here = here.and_then(|v| v.get(&segment));
            }
        }
    }
    path
}

/// `at.name`, or `at["odd name"]` when the name would read ambiguously.
fn join_key(at: &str, name: &str) -> String {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain { format!("{at}.{name}") } else { format!("{at}[{}]", Value::from(name)) }
}

/// The `properties` beside the `additionalProperties` (or
/// `unevaluatedProperties`) keyword at `keyword_pointer` in `schema`.
fn allowed_fields(keyword_pointer: &str, schema: &Value) -> Option<String> {
    let (parent, keyword) = keyword_pointer.rsplit_once('/')?;
    let node = schema.pointer(parent)?;
    // The pointer is relative to the resource holding the keyword; outside
    // the root resource it may land elsewhere, so check it found the keyword.
    node.get(keyword)?;
    let properties = node.get("properties")?.as_object()?;
    Some(properties.keys().map(String::as_str).collect::<Vec<_>>().join(", "))
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn truncate(message: String) -> String {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{} [keel: message cut]", &message[..cut]),
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1},
                "mode": {"enum": ["a", "b"]},
                "count": {"type": "integer", "minimum": 1},
                "tags": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["path"],
            "additionalProperties": false
        })
    }

    #[test]
    fn valid_arguments_pass() {
        assert_eq!(validate(&schema(), &json!({"path": "x", "mode": "a", "count": 2, "tags": ["t"]})), Ok(()));
    }

    #[test]
    fn each_violation_names_its_place() {
        let cases = [
            (json!({}), "arguments.path is required"),
            (json!({"path": 3}), "arguments.path must be string, got integer"),
            (json!({"path": ""}), "arguments.path must be at least 1 character(s) long"),
            (json!({"path": "x", "mode": "c"}), "arguments.mode must be one of"),
            (json!({"path": "x", "count": 0}), "arguments.count must be at least 1"),
            (json!({"path": "x", "count": 1.5}), "arguments.count must be integer, got number"),
            (json!({"path": "x", "tags": ["a", 1]}), "arguments.tags[1] must be string"),
            (json!({"path": "x", "other": 1}), "arguments.other is not allowed (allowed: count, mode, path, tags)"),
            (json!([]), "arguments must be object, got array"),
        ];
        for (value, expected) in cases {
            let error = validate(&schema(), &value).expect_err("invalid");
            assert!(error.starts_with(expected), "{error:?} should start with {expected:?}");
        }
    }

    #[test]
    fn a_schema_compiles_once_whatever_its_key_order() {
        let one = json!({"type": "object", "required": ["x"]});
        let other: Value = serde_json::from_str(r#"{"required": ["x"], "type": "object"}"#).unwrap_or_default();
        assert!(Arc::ptr_eq(&compiled(&one), &compiled(&other)));
    }

    #[test]
    fn the_cache_stays_bounded() {
        for n in 0..CACHE_CAPACITY + 10 {
            compiled(&json!({"maxLength": n}));
        }
        let cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(cache.by_digest.len() <= CACHE_CAPACITY && cache.oldest_first.len() == cache.by_digest.len());
    }

    #[test]
    fn odd_field_names_and_numeric_keys_read_unambiguously() {
        let arguments = json!({"a.b": {"0": [1, {"x": 2}]}});
        assert_eq!(model_path("/a.b/0/1/x", &arguments), r#"arguments["a.b"]["0"][1].x"#);
    }

    #[test]
    fn an_old_draft_schema_without_its_name_still_checks_calls() {
        // Draft 4's boolean `exclusiveMinimum`, invalid under 2020-12.
        let schema = json!({
            "type": "object",
            "properties": {"n": {"type": "number", "minimum": 0, "exclusiveMinimum": true}},
            "required": ["n"]
        });
        assert!(validate(&schema, &json!({"n": 1})).is_ok());
        let refused = validate(&schema, &json!({"n": 0})).unwrap_err();
        assert!(refused.contains("n"), "{refused}");
        assert!(!refused.contains("schema is invalid"), "{refused}");
    }
}

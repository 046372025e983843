//! Tool arguments checked against schemas as real MCP servers emit them:
//! pydantic (FastMCP, the Python SDK) and zod-to-json-schema (the TypeScript
//! SDK). Every refusal here was let through by keel's former hand-written
//! subset, which ignored `$ref`, `anyOf`, `oneOf`, `allOf`, `pattern` and
//! `format`.

use keel_tools::schema::validate;
use serde_json::{Value, json};

/// What FastMCP sends for `def create_contact(name: str, address: Address,
/// nickname: str | None = None)` with a pydantic `Address` model.
fn pydantic_schema() -> Value {
    json!({
        "$defs": {
            "Address": {
                "properties": {
                    "street": {"title": "Street", "type": "string"},
                    "postcode": {"pattern": "^[0-9]{5}$", "title": "Postcode", "type": "string"}
                },
                "required": ["street", "postcode"],
                "title": "Address",
                "type": "object"
            }
        },
        "properties": {
            "name": {"title": "Name", "type": "string"},
            "address": {"$ref": "#/$defs/Address"},
            "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Nickname"}
        },
        "required": ["name", "address"],
        "title": "create_contactArguments",
        "type": "object"
    })
}

/// What zod-to-json-schema emits (draft-07) for a zod object with an email,
/// a URL, a regex-checked id, a union, a discriminated shape and an
/// intersection.
fn zod_schema() -> Value {
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email"},
            "homepage": {"type": "string", "format": "uri"},
            "id": {"type": "string", "pattern": "^usr_[a-z0-9]+$"},
            "limit": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "enum": ["all"]}]},
            "shape": {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {"kind": {"type": "string", "const": "circle"}, "radius": {"type": "number"}},
                        "required": ["kind", "radius"],
                        "additionalProperties": false
                    },
                    {
                        "type": "object",
                        "properties": {"kind": {"type": "string", "const": "square"}, "side": {"type": "number"}},
                        "required": ["kind", "side"],
                        "additionalProperties": false
                    }
                ]
            },
            "owner": {
                "allOf": [
                    {"type": "object", "properties": {"team": {"type": "string"}}, "required": ["team"]},
                    {"type": "object", "properties": {"person": {"type": "string"}}, "required": ["person"]}
                ]
            }
        },
        "required": ["email", "id"],
        "additionalProperties": false
    })
}

fn refusal(schema: &Value, arguments: Value) -> String {
    match validate(schema, &arguments) {
        Ok(()) => panic!("{arguments} should have been refused"),
        Err(message) => message,
    }
}

fn assert_mentions(message: &str, expected: &[&str]) {
    for part in expected {
        assert!(message.contains(part), "{message:?} should mention {part:?}");
    }
}

#[test]
fn pydantic_optional_field_takes_its_type_or_null_and_nothing_else() {
    let schema = pydantic_schema();
    let address = json!({"street": "Main St", "postcode": "12345"});
    assert_eq!(validate(&schema, &json!({"name": "Ada", "address": address})), Ok(()));
    assert_eq!(validate(&schema, &json!({"name": "Ada", "address": address, "nickname": null})), Ok(()));
    assert_eq!(validate(&schema, &json!({"name": "Ada", "address": address, "nickname": "A"})), Ok(()));
    let message = refusal(&schema, json!({"name": "Ada", "address": address, "nickname": 7}));
    assert_mentions(&message, &["arguments.nickname matches none of", "must be string, got integer", "must be null"]);
}

#[test]
fn pydantic_refs_into_defs_are_followed() {
    let schema = pydantic_schema();
    let message = refusal(&schema, json!({"name": "Ada", "address": {"street": "Main St"}}));
    assert_mentions(&message, &["arguments.address.postcode is required"]);
    let message = refusal(&schema, json!({"name": "Ada", "address": {"street": "Main St", "postcode": "1234"}}));
    assert_mentions(&message, &["arguments.address.postcode must match the regular expression \"^[0-9]{5}$\""]);
}

#[test]
fn every_problem_is_reported_at_once() {
    let message = refusal(&pydantic_schema(), json!({"name": 1, "address": {"street": "Main St"}}));
    assert_mentions(
        &message,
        &["arguments.name must be string, got integer", "arguments.address.postcode is required"],
    );
}

#[test]
fn zod_patterns_are_enforced() {
    let schema = zod_schema();
    assert_eq!(validate(&schema, &json!({"email": "ada@example.com", "id": "usr_42"})), Ok(()));
    let message = refusal(&schema, json!({"email": "ada@example.com", "id": "user-42"}));
    assert_mentions(&message, &["arguments.id must match the regular expression"]);
}

#[test]
fn formats_are_asserted_even_in_draft_7() {
    let schema = zod_schema();
    let message = refusal(&schema, json!({"email": "not an address", "id": "usr_1"}));
    assert_mentions(&message, &["arguments.email must be a valid email"]);
    let message = refusal(&schema, json!({"email": "ada@example.com", "id": "usr_1", "homepage": "not a uri"}));
    assert_mentions(&message, &["arguments.homepage must be a valid uri"]);
    let fine = json!({"email": "ada@example.com", "id": "usr_1", "homepage": "https://example.com/ada"});
    assert_eq!(validate(&schema, &fine), Ok(()));
}

#[test]
fn zod_unions_take_one_of_their_alternatives() {
    let schema = zod_schema();
    let base = |extra: Value| {
        let mut arguments = json!({"email": "ada@example.com", "id": "usr_1"});
        if let (Some(into), Some(from)) = (arguments.as_object_mut(), extra.as_object()) {
            into.extend(from.clone());
        }
        arguments
    };
    assert_eq!(validate(&schema, &base(json!({"limit": 3}))), Ok(()));
    assert_eq!(validate(&schema, &base(json!({"limit": "all"}))), Ok(()));
    let message = refusal(&schema, base(json!({"limit": 0})));
    assert_mentions(&message, &["arguments.limit matches none of", "anyOf", "must be at least 1"]);

    assert_eq!(validate(&schema, &base(json!({"shape": {"kind": "circle", "radius": 2}}))), Ok(()));
    let message = refusal(&schema, base(json!({"shape": {"kind": "circle", "side": 2}})));
    assert_mentions(
        &message,
        &["arguments.shape matches none of", "oneOf", "arguments.shape.radius is required", "must be \"square\""],
    );
}

#[test]
fn zod_intersections_need_every_part() {
    let schema = zod_schema();
    let arguments = |owner: Value| json!({"email": "ada@example.com", "id": "usr_1", "owner": owner});
    assert_eq!(validate(&schema, &arguments(json!({"team": "core", "person": "ada"}))), Ok(()));
    let message = refusal(&schema, arguments(json!({"team": "core"})));
    assert_mentions(&message, &["arguments.owner.person is required"]);
}

#[test]
fn an_invalid_schema_is_a_clear_error_not_a_panic() {
    let broken = [
        json!({"type": "strnig"}),
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}),
        json!({"type": "string", "pattern": "(unclosed"}),
        json!({"type": "integer", "minimum": "ten"}),
        json!({"$schema": "https://example.com/unknown-meta-schema", "type": "object"}),
    ];
    for schema in broken {
        let message = refusal(&schema, json!({"a": 1}));
        assert_mentions(&message, &["the tool's input schema is invalid"]);
    }
}

#[test]
fn remote_refs_are_never_fetched() {
    // A listener that would see the connection if the validator fetched.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    listener.set_nonblocking(true).unwrap_or_else(|e| panic!("{e}"));
    let port = listener.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
    // A file that would make the call fail differently if it were read.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("string.json");
    std::fs::write(&file, r#"{"type": "string"}"#).unwrap_or_else(|e| panic!("{e}"));

    for target in [format!("http://127.0.0.1:{port}/schema.json"), format!("file://{}", file.display())] {
        let schema = json!({"type": "object", "properties": {"a": {"$ref": target}}});
        let message = refusal(&schema, json!({"a": 1}));
        assert_mentions(&message, &["the tool's input schema is invalid"]);
        assert!(!message.contains("must be string"), "{message:?}: the file was read");
    }
    assert!(listener.accept().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock), "a fetch was attempted");
}

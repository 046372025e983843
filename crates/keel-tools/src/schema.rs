//! Checking tool arguments against the tool's JSON Schema before a call.
//!
//! keel validates the subset of JSON Schema that tool definitions use in
//! practice: `type` (one or a list), `properties`, `required`,
//! `additionalProperties` (false or a schema), `items`, `enum`, `const`,
//! `minimum`/`maximum`, `minLength`/`maxLength`, `minItems`/`maxItems`.
//! Keywords outside it are ignored, never guessed at: a call that passes
//! here may still be refused by the tool itself. A failure names the path of
//! the offending value so the model can correct it.

use serde_json::Value;

/// Checks `value` against `schema`; the error says where and why.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    check(schema, value, "arguments")
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

fn type_matches(expected: &str, value: &Value) -> bool {
    let actual = type_name(value);
    actual == expected || (expected == "number" && actual == "integer")
}

fn check(schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let Value::Object(schema) = schema else { return Ok(()) };
    match schema.get("type") {
        Some(Value::String(expected)) if !type_matches(expected, value) => {
            return Err(format!("{at} must be {expected}, got {}", type_name(value)));
        }
        Some(Value::Array(options)) if !options.iter().filter_map(Value::as_str).any(|t| type_matches(t, value)) => {
            let names: Vec<&str> = options.iter().filter_map(Value::as_str).collect();
            return Err(format!("{at} must be one of {}, got {}", names.join(", "), type_name(value)));
        }
        _ => {}
    }
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        return Err(format!("{at} must be one of {}", Value::Array(allowed.clone())));
    }
    if let Some(constant) = schema.get("const")
        && constant != value
    {
        return Err(format!("{at} must be {constant}"));
    }
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    if let Some(n) = value.as_f64()
        && (bound("minimum").is_some_and(|min| n < min) || bound("maximum").is_some_and(|max| n > max))
    {
        return Err(format!("{at} is out of range"));
    }
    if let Value::String(text) = value {
        let length = text.chars().count() as f64;
        if bound("minLength").is_some_and(|min| length < min) || bound("maxLength").is_some_and(|max| length > max) {
            return Err(format!("{at} has the wrong length"));
        }
    }
    if let Value::Array(items) = value {
        let count = items.len() as f64;
        if bound("minItems").is_some_and(|min| count < min) || bound("maxItems").is_some_and(|max| count > max) {
            return Err(format!("{at} has the wrong number of items"));
        }
        if let Some(item_schema) = schema.get("items") {
            for (index, item) in items.iter().enumerate() {
                check(item_schema, item, &format!("{at}[{index}]"))?;
            }
        }
    }
    if let Value::Object(fields) = value {
        if let Some(Value::Array(required)) = schema.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !fields.contains_key(name) {
                    return Err(format!("{at}.{name} is required"));
                }
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (name, field) in fields {
            let path = format!("{at}.{name}");
            match properties.and_then(|p| p.get(name)) {
                Some(field_schema) => check(field_schema, field, &path)?,
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        let known: Vec<&str> =
                            properties.map(|p| p.keys().map(String::as_str).collect()).unwrap_or_default();
                        return Err(format!("{path} is not allowed; allowed: {}", known.join(", ")));
                    }
                    Some(extra @ Value::Object(_)) => check(extra, field, &path)?,
                    _ => {}
                },
            }
        }
    }
    Ok(())
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
            (json!({"path": ""}), "arguments.path has the wrong length"),
            (json!({"path": "x", "mode": "c"}), "arguments.mode must be one of"),
            (json!({"path": "x", "count": 0}), "arguments.count is out of range"),
            (json!({"path": "x", "count": 1.5}), "arguments.count must be integer, got number"),
            (json!({"path": "x", "tags": ["a", 1]}), "arguments.tags[1] must be string"),
            (json!({"path": "x", "other": 1}), "arguments.other is not allowed; allowed: count, mode, path, tags"),
            (json!([]), "arguments must be object, got array"),
        ];
        for (value, expected) in cases {
            let error = validate(&schema(), &value).expect_err("invalid");
            assert!(error.starts_with(expected), "{error:?} should start with {expected:?}");
        }
    }
}

//! Pieces every tool's argument validation shares, so that each mistake is worded the same way
//! whichever tool it is made with.

use serde_json::Value;

use super::JsonObject;
use crate::model::Environment;

/// A JSON value's kind in words, for "must be a string, not a number".
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The first argument that is not one of `known`, if any.
pub fn unknown_argument<'a>(args: &'a JsonObject, known: &[&str]) -> Option<&'a str> {
    args.keys().map(String::as_str).find(|k| !known.contains(k))
}

/// The optional `environment` argument: sandbox when absent.
pub fn environment(args: &JsonObject) -> Result<Environment, String> {
    match args.get("environment") {
        None | Some(Value::Null) => Ok(Environment::Sandbox),
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            let names: Vec<&str> = Environment::ALL.iter().map(|e| e.as_str()).collect();
            format!(
                "argument `environment` is {v}; it must be one of {}",
                names.join(", ")
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn environments_parse_with_a_helpful_error() {
        let obj = |v: Value| v.as_object().cloned().unwrap_or_default();
        assert_eq!(environment(&obj(json!({}))), Ok(Environment::Sandbox));
        assert_eq!(
            environment(&obj(json!({"environment": "staging"}))),
            Ok(Environment::Staging)
        );
        let e = environment(&obj(json!({"environment": "prod"}))).unwrap_err();
        assert!(e.contains("sandbox, staging, production"), "{e}");
        assert_eq!(
            unknown_argument(&obj(json!({"a": 1, "b": 2})), &["a"]),
            Some("b")
        );
        assert_eq!(json_kind(&json!([])), "an array");
    }
}

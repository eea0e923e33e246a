//! Tool schemas that every client can digest. schemars writes Rust-specific integer formats
//! (`uint32`, `int64`, ...) that JSON Schema validators warn about and some model providers
//! reject; they carry nothing the `minimum`/`maximum` keywords do not already say.

use schemars::Schema;

/// Removes integer `format`s throughout a schema (a schemars container transform).
pub fn portable(schema: &mut Schema) {
    if let Some(map) = schema.as_object_mut() {
        if map.get("format").is_some_and(is_integer_format) {
            map.remove("format");
        }
        map.values_mut().for_each(strip_integer_formats);
    }
}

fn is_integer_format(format: &serde_json::Value) -> bool {
    matches!(
        format.as_str(),
        Some(
            "int8"
                | "int16"
                | "int32"
                | "int64"
                | "uint"
                | "uint8"
                | "uint16"
                | "uint32"
                | "uint64"
        )
    )
}

fn strip_integer_formats(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            if map.get("format").is_some_and(is_integer_format) {
                map.remove("format");
            }
            map.values_mut().for_each(strip_integer_formats);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_integer_formats),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_formats_go_other_formats_stay() {
        let mut s: Schema = serde_json::json!({
            "properties": {
                "a": {"type": "integer", "format": "uint32", "minimum": 0},
                "b": {"type": "string", "format": "date-time"},
                "c": {"items": [{"format": "int64"}]}
            }
        })
        .try_into()
        .unwrap();
        portable(&mut s);
        let v = s.as_value();
        assert!(v["properties"]["a"].get("format").is_none());
        assert_eq!(v["properties"]["a"]["minimum"], 0);
        assert_eq!(v["properties"]["b"]["format"], "date-time");
        assert!(v["properties"]["c"]["items"][0].get("format").is_none());
    }
}

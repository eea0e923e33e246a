//! MCP tools as OpenAI function definitions, and the checks a model's tool call must pass
//! before it is sent to the MCP server.
//!
//! OpenAI function names must match `^[a-zA-Z0-9_-]{1,64}$`; MCP names may not (dots, slashes,
//! length), so each tool gets a function name and the map back to its MCP name.

use async_openai::types::chat::{ChatCompletionTool, ChatCompletionTools, FunctionObject};
use rmcp::model::{JsonObject, Tool};
use serde_json::Value;

/// Longest function name the chat-completions API accepts.
const MAX_FUNCTION_NAME: usize = 64;

/// One MCP tool offered to the model.
#[derive(Clone, Debug, PartialEq)]
pub struct OfferedTool {
    /// The name the model calls.
    pub function_name: String,
    /// The name on the MCP server.
    pub mcp_name: String,
    /// The function definition sent with every request.
    pub definition: ChatCompletionTools,
}

/// The tools of one MCP server, as offered to the model.
#[derive(Clone, Debug, Default)]
pub struct Toolbox {
    tools: Vec<OfferedTool>,
}

/// A tool call that is not sent to the server; the text goes back to the model.
#[derive(Debug, PartialEq, Eq)]
pub struct Rejected(pub String);

impl Toolbox {
    /// Function definitions for every tool of the server.
    pub fn from_mcp(tools: &[Tool]) -> Self {
        let mut offered: Vec<OfferedTool> = Vec::with_capacity(tools.len());
        for tool in tools {
            let base = function_name(&tool.name);
            let mut name = base.clone();
            let mut n = 2;
            while offered.iter().any(|t| t.function_name == name) {
                let suffix = format!("_{n}");
                let keep = MAX_FUNCTION_NAME
                    .saturating_sub(suffix.len())
                    .min(base.len());
                name = format!("{}{suffix}", &base[..keep]);
                n += 1;
            }
            let description = tool
                .description
                .as_deref()
                .map(str::to_owned)
                .or_else(|| tool.title.clone());
            offered.push(OfferedTool {
                definition: ChatCompletionTools::Function(ChatCompletionTool {
                    function: FunctionObject {
                        name: name.clone(),
                        description,
                        parameters: Some(parameters(&tool.input_schema)),
                        strict: None,
                    },
                }),
                function_name: name,
                mcp_name: tool.name.to_string(),
            });
        }
        Self { tools: offered }
    }

    /// The definitions for a chat-completions request.
    pub fn definitions(&self) -> Vec<ChatCompletionTools> {
        self.tools.iter().map(|t| t.definition.clone()).collect()
    }

    /// The function names, for messages.
    pub fn names(&self) -> Vec<&str> {
        self.tools
            .iter()
            .map(|t| t.function_name.as_str())
            .collect()
    }

    /// Checks a model's call: the function must exist and the arguments must be a JSON object.
    /// Returns the MCP tool name and the arguments, or the text that tells the model what to
    /// fix.
    pub fn resolve(
        &self,
        function: &str,
        arguments: &str,
    ) -> Result<(String, JsonObject), Rejected> {
        let Some(tool) = self.tools.iter().find(|t| t.function_name == function) else {
            return Err(Rejected(format!(
                "error: there is no tool named `{function}`; the available tools are: {}. Call \
                 one of them by its exact name.",
                self.names().join(", ")
            )));
        };
        // Some models send an empty string for a call without arguments.
        if arguments.trim().is_empty() {
            return Ok((tool.mcp_name.clone(), JsonObject::new()));
        }
        match serde_json::from_str::<Value>(arguments) {
            Ok(Value::Object(map)) => Ok((tool.mcp_name.clone(), map)),
            Ok(other) => Err(Rejected(format!(
                "error: the arguments of `{function}` must be a JSON object matching its \
                 parameters schema, not {}; call it again with an object such as {{\"name\": value}}.",
                sandboxrun_core::tools::args::json_kind(&other)
            ))),
            Err(e) => Err(Rejected(format!(
                "error: the arguments of `{function}` are not valid JSON ({e}); nothing was run. \
                 Call it again with a complete JSON object matching its parameters schema."
            ))),
        }
    }
}

/// A valid function name for an MCP tool name: other characters become `_`, cut at 64.
fn function_name(mcp_name: &str) -> String {
    let mut name: String = mcp_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_FUNCTION_NAME)
        .collect();
    if name.is_empty() {
        name.push_str("tool");
    }
    name
}

/// The tool's input schema as function parameters. `$schema` is dropped (several
/// OpenAI-compatible servers reject it) and an object schema always has `properties`.
fn parameters(input_schema: &JsonObject) -> Value {
    let mut schema = input_schema.clone();
    schema.remove("$schema");
    if !schema.contains_key("type") {
        schema.insert("type".into(), Value::String("object".into()));
    }
    if schema.get("type").and_then(Value::as_str) == Some("object")
        && !schema.contains_key("properties")
    {
        schema.insert("properties".into(), Value::Object(JsonObject::new()));
    }
    Value::Object(schema)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use serde_json::json;

    fn tool(name: &str, schema: Value) -> Tool {
        let Value::Object(schema) = schema else {
            panic!("object expected")
        };
        Tool::new(name.to_owned(), format!("does {name}"), Arc::new(schema))
    }

    fn function(t: &OfferedTool) -> &FunctionObject {
        match &t.definition {
            ChatCompletionTools::Function(f) => &f.function,
            other => panic!("function expected, got {other:?}"),
        }
    }

    #[test]
    fn tools_become_functions_with_their_schema() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"code": {"type": "string"}},
            "required": ["code"]
        });
        let box_ = Toolbox::from_mcp(&[tool("run_python", schema)]);
        let f = function(&box_.tools[0]);
        assert_eq!(f.name, "run_python");
        assert_eq!(f.description.as_deref(), Some("does run_python"));
        assert_eq!(
            f.parameters,
            Some(json!({
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"]
            }))
        );
        // The wire form is what the chat-completions API documents.
        assert_eq!(
            serde_json::to_value(&box_.tools[0].definition).unwrap()["type"],
            "function"
        );
    }

    #[test]
    fn names_are_made_valid_and_unique() {
        let long = "x".repeat(80);
        let box_ = Toolbox::from_mcp(&[
            tool("db.query", json!({"type": "object"})),
            tool("db/query", json!({})),
            tool(&long, json!({"type": "object"})),
        ]);
        assert_eq!(box_.names(), ["db_query", "db_query_2", &"x".repeat(64)]);
        assert_eq!(
            function(&box_.tools[1]).parameters,
            Some(json!({"type": "object", "properties": {}}))
        );
        let (mcp, _) = box_.resolve("db_query_2", "{}").unwrap();
        assert_eq!(mcp, "db/query");
    }

    #[test]
    fn malformed_calls_are_explained() {
        let box_ = Toolbox::from_mcp(&[tool("run_python", json!({"type": "object"}))]);
        let Rejected(unknown) = box_.resolve("run_pyhton", "{}").unwrap_err();
        assert!(unknown.contains("no tool named `run_pyhton`"), "{unknown}");
        assert!(unknown.contains("run_python"), "{unknown}");
        let Rejected(bad) = box_
            .resolve("run_python", r#"{"code": "print(1)""#)
            .unwrap_err();
        assert!(bad.contains("not valid JSON"), "{bad}");
        let Rejected(array) = box_.resolve("run_python", "[1]").unwrap_err();
        assert!(array.contains("not an array"), "{array}");
        assert_eq!(
            box_.resolve("run_python", " ").unwrap().1,
            JsonObject::new()
        );
        assert_eq!(
            box_.resolve("run_python", r#"{"code":"print(1)"}"#)
                .unwrap()
                .1["code"],
            "print(1)"
        );
    }
}

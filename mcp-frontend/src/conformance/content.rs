//! Fixture tools whose results, notifications or requests to the client the suite checks: every
//! kind of content block, a tool error, log messages, progress, sampling and elicitation (2025-11-25
//! sessions), a call needing a client capability and one answering with an input request
//! (2026-07-28).

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ContentBlock,
    CreateMessageRequestParams, ElicitRequestParams, ElicitationAction, ElicitationSchema,
    InputRequests, InputRequiredResult, LoggingLevel, LoggingMessageNotificationParam,
    ProgressNotificationParam, ResourceContents, SamplingMessage,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::json;

use super::{Caller, IMAGE_PNG, ToolSpec, input_required, string_arg};

/// A short WAV file of silence, base64: the suite's audio content.
const AUDIO_WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEARKwAAIhYAQACABAAZGF0YQAAAAA=";

/// The logger the fixtures' log messages name.
const LOGGER: &str = "conformance-fixtures";

pub(super) const TOOLS: &[ToolSpec] = &[
    ToolSpec::plain("test_simple_text", "Returns simple text content"),
    ToolSpec::plain("test_image_content", "Returns image content"),
    ToolSpec::plain("test_audio_content", "Returns audio content"),
    ToolSpec::plain(
        "test_embedded_resource",
        "Returns embedded resource content",
    ),
    ToolSpec::plain(
        "test_multiple_content_types",
        "Returns multiple content types",
    ),
    ToolSpec::plain(
        "test_tool_with_logging",
        "Sends log messages during execution (to a client that asked for them)",
    ),
    ToolSpec::plain("test_error_handling", "Always returns an error"),
    ToolSpec::plain("test_tool_with_progress", "Reports progress notifications"),
    ToolSpec {
        name: "test_sampling",
        description: "Requests LLM sampling from the client",
        schema: Some(
            r#"{"type":"object","properties":{"prompt":{"type":"string","description":"The prompt to send"}},"required":["prompt"]}"#,
        ),
    },
    ToolSpec {
        name: "test_elicitation",
        description: "Requests user input from the client",
        schema: Some(
            r#"{"type":"object","properties":{"message":{"type":"string","description":"The message to show"}},"required":["message"]}"#,
        ),
    },
    ToolSpec::plain(
        "test_elicitation_sep1034_defaults",
        "Elicitation with default values (SEP-1034)",
    ),
    ToolSpec::plain(
        "test_elicitation_sep1330_enums",
        "Elicitation with the enum schemas of SEP-1330",
    ),
    ToolSpec {
        name: "json_schema_2020_12_tool",
        description: "Tool with JSON Schema 2020-12 features",
        schema: Some(
            r##"{
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {
                    "address": {
                        "$anchor": "address",
                        "type": "object",
                        "properties": {"street": {"type": "string"}, "city": {"type": "string"}}
                    }
                },
                "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
                "allOf": [{"anyOf": [{"required": ["name"]}, {"required": ["address"]}]}],
                "if": {"required": ["address"]},
                "then": {"properties": {"address": {"required": ["street"]}}},
                "else": {"required": ["name"]},
                "additionalProperties": false
            }"##,
        ),
    },
    ToolSpec::plain(
        "test_reconnection",
        "Takes a moment, for SSE reconnection tests",
    ),
    ToolSpec {
        name: "test_custom_header",
        description: "Echoes a parameter the client also sends as a header (SEP-2243)",
        schema: Some(
            r#"{"type":"object","properties":{"value":{"type":"string","x-mcp-header":"Value"}},"required":["value"]}"#,
        ),
    },
    ToolSpec::plain(
        "test_missing_capability",
        "Needs the client's sampling capability",
    ),
    ToolSpec::plain(
        "test_streaming_elicitation",
        "Answers with an input request for an elicitation",
    ),
    ToolSpec::plain(
        "test_logging_tool",
        "Sends a log message only when the request asked for a log level",
    ),
];

/// Calls the content fixture `request.name`.
pub(super) async fn call(
    caller: &Caller<'_>,
    request: CallToolRequestParams,
    context: RequestContext<RoleServer>,
) -> Result<CallToolResponse, ErrorData> {
    let args = request.arguments.unwrap_or_default();
    let result = match request.name.as_ref() {
        "test_simple_text" => CallToolResult::success(vec![ContentBlock::text(
            "This is a simple text response for testing.",
        )]),
        "test_image_content" => {
            CallToolResult::success(vec![ContentBlock::image(IMAGE_PNG, "image/png")])
        }
        "test_audio_content" => {
            CallToolResult::success(vec![ContentBlock::audio(AUDIO_WAV, "audio/wav")])
        }
        "test_embedded_resource" => {
            CallToolResult::success(vec![ContentBlock::resource(text_contents(
                "test://embedded-resource",
                "text/plain",
                "This is an embedded resource content.",
            ))])
        }
        "test_multiple_content_types" => CallToolResult::success(vec![
            ContentBlock::text("Multiple content types test:"),
            ContentBlock::image(IMAGE_PNG, "image/png"),
            ContentBlock::resource(text_contents(
                "test://mixed-content-resource",
                "application/json",
                r#"{"test":"data","value":123}"#,
            )),
        ]),
        "test_tool_with_logging" => {
            // The product's rule: log messages only to a client that asked (logging.rs).
            let threshold = crate::logging::requested(&context, caller.log_level);
            for text in [
                "Tool execution started",
                "Tool processing data",
                "Tool execution completed",
            ] {
                if threshold.is_some_and(|t| crate::logging::passes(LoggingLevel::Info, t)) {
                    let message =
                        LoggingMessageNotificationParam::new(LoggingLevel::Info, json!(text))
                            .with_logger(LOGGER);
                    if let Err(e) = context.peer.notify_logging_message(message).await {
                        tracing::debug!(error = %e, "could not send a fixture log message");
                    }
                }
                // Spaced out, so that the client sees messages arrive during the call.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            CallToolResult::success(vec![ContentBlock::text("Logging test completed")])
        }
        "test_error_handling" => CallToolResult::error(vec![ContentBlock::text(
            "This tool intentionally returns an error for testing",
        )]),
        "test_tool_with_progress" => {
            let token = context.meta.get_progress_token();
            for (progress, message) in [(0.0, "Starting"), (50.0, "Halfway"), (100.0, "Complete")] {
                if let Some(token) = &token {
                    let note = ProgressNotificationParam::new(token.clone(), progress)
                        .with_total(100.0)
                        .with_message(message);
                    if let Err(e) = context.peer.notify_progress(note).await {
                        tracing::debug!(error = %e, "could not send fixture progress");
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            CallToolResult::success(vec![ContentBlock::text("Progress test completed")])
        }
        "test_sampling" => {
            let prompt = string_arg(&args, "prompt").unwrap_or("Hello");
            let params =
                CreateMessageRequestParams::new(vec![SamplingMessage::user_text(prompt)], 100);
            match context.peer.create_message(params).await {
                Ok(answer) => {
                    let text = answer
                        .message
                        .content
                        .first()
                        .and_then(|c| c.as_text())
                        .map(|t| t.text.clone())
                        .unwrap_or_else(|| "No text response".into());
                    CallToolResult::success(vec![ContentBlock::text(format!(
                        "LLM response: {text}"
                    ))])
                }
                Err(e) => {
                    CallToolResult::error(vec![ContentBlock::text(format!("Sampling error: {e}"))])
                }
            }
        }
        "test_elicitation" => {
            let message = string_arg(&args, "message").unwrap_or("Please provide your information");
            let schema = schema(json!({
                "type": "object",
                "properties": {
                    "username": {"type": "string", "description": "User's response"},
                    "email": {"type": "string", "description": "User's email address"}
                },
                "required": ["username", "email"]
            }))?;
            elicit(&context, message, schema, |action, content| {
                format!("User response: action={action}, content={content}")
            })
            .await
        }
        "test_elicitation_sep1034_defaults" => {
            let schema = schema(json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "User's name", "default": "John Doe"},
                    "age": {"type": "integer", "description": "User's age", "default": 30},
                    "score": {"type": "number", "description": "User's score", "default": 95.5},
                    "status": {
                        "type": "string",
                        "description": "User's status",
                        "enum": ["active", "inactive", "pending"],
                        "default": "active"
                    },
                    "verified": {
                        "type": "boolean",
                        "description": "Whether user is verified",
                        "default": true
                    }
                }
            }))?;
            elicit(
                &context,
                "Please provide values (all have defaults)",
                schema,
                |action, content| {
                    format!("Elicitation completed: action={action}, content={content}")
                },
            )
            .await
        }
        "test_elicitation_sep1330_enums" => {
            let schema = schema(json!({
                "type": "object",
                "properties": {
                    "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                    "titledSingle": {
                        "type": "string",
                        "oneOf": [
                            {"const": "value1", "title": "First Option"},
                            {"const": "value2", "title": "Second Option"},
                            {"const": "value3", "title": "Third Option"}
                        ]
                    },
                    "legacyEnum": {
                        "type": "string",
                        "enum": ["opt1", "opt2", "opt3"],
                        "enumNames": ["Option One", "Option Two", "Option Three"]
                    },
                    "untitledMulti": {
                        "type": "array",
                        "items": {"type": "string", "enum": ["option1", "option2", "option3"]}
                    },
                    "titledMulti": {
                        "type": "array",
                        "items": {
                            "anyOf": [
                                {"const": "value1", "title": "First Choice"},
                                {"const": "value2", "title": "Second Choice"},
                                {"const": "value3", "title": "Third Choice"}
                            ]
                        }
                    }
                }
            }))?;
            elicit(
                &context,
                "Test enum schema improvements",
                schema,
                |action, _| format!("Enum elicitation completed: action={action}"),
            )
            .await
        }
        "json_schema_2020_12_tool" => {
            let name = string_arg(&args, "name").unwrap_or("world");
            CallToolResult::success(vec![ContentBlock::text(format!("Hello, {name}!"))])
        }
        "test_reconnection" => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            CallToolResult::success(vec![ContentBlock::text("Reconnection test completed")])
        }
        "test_custom_header" => {
            let value = string_arg(&args, "value")
                .ok_or_else(|| ErrorData::invalid_params("`value` must be a string", None))?;
            CallToolResult::success(vec![ContentBlock::text(value)])
        }
        "test_missing_capability" => {
            let declared = context
                .client_capabilities()
                .is_some_and(|caps| caps.sampling.is_some());
            if !declared {
                return Err(ErrorData::missing_required_client_capability(
                    ClientCapabilities::builder().enable_sampling().build(),
                ));
            }
            CallToolResult::success(vec![ContentBlock::text("Required capability declared")])
        }
        "test_streaming_elicitation" => {
            let mut requests = InputRequests::new();
            requests.insert(
                "streaming_elicitation".into(),
                input_required::elicitation("Provide a value", "value", "string"),
            );
            return Ok(InputRequiredResult::from_input_requests(requests).into());
        }
        "test_logging_tool" => {
            if let Some(level) = crate::logging::requested(&context, caller.log_level) {
                let message =
                    LoggingMessageNotificationParam::new(level, json!("logLevel was requested"))
                        .with_logger(LOGGER);
                if let Err(e) = context.peer.notify_logging_message(message).await {
                    tracing::debug!(error = %e, "could not send a fixture log message");
                }
            }
            CallToolResult::success(vec![ContentBlock::text("Logging tool completed")])
        }
        other => {
            return Err(ErrorData::invalid_params(
                format!("unknown fixture tool `{other}`"),
                None,
            ));
        }
    };
    Ok(result.into())
}

/// Text resource contents.
fn text_contents(uri: &str, mime_type: &str, text: &str) -> ResourceContents {
    ResourceContents::TextResourceContents {
        uri: uri.into(),
        mime_type: Some(mime_type.into()),
        text: text.into(),
        meta: None,
    }
}

/// A fixture's elicitation schema; one rmcp cannot represent is an internal error of the
/// fixture (it names what rmcp objected to), not a panic.
fn schema(value: serde_json::Value) -> Result<ElicitationSchema, ErrorData> {
    serde_json::from_value(value).map_err(|e| {
        ErrorData::internal_error(format!("the fixture's elicitation schema: {e}"), None)
    })
}

/// Asks the client to fill `schema` (a 2025-11-25 session's server-to-client request) and
/// describes the answer with `describe(action, content)`; a failed request is a tool error.
async fn elicit(
    context: &RequestContext<RoleServer>,
    message: &str,
    schema: ElicitationSchema,
    describe: impl FnOnce(&str, String) -> String,
) -> CallToolResult {
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: message.into(),
        requested_schema: schema,
    };
    match context.peer.create_elicitation(params).await {
        Ok(answer) => {
            let action = match answer.action {
                ElicitationAction::Accept => "accept",
                ElicitationAction::Decline => "decline",
                ElicitationAction::Cancel => "cancel",
                _ => "unknown",
            };
            let content = answer
                .content
                .map(|c| c.to_string())
                .unwrap_or_else(|| "none".into());
            CallToolResult::success(vec![ContentBlock::text(describe(action, content))])
        }
        Err(e) => {
            CallToolResult::error(vec![ContentBlock::text(format!("Elicitation error: {e}"))])
        }
    }
}

//! Fixtures of multi-round-trip requests (SEP-2322, 2026-07-28): a tool call or prompt that needs
//! something from the client answers with an `InputRequiredResult` naming what (an elicitation,
//! a sampling, the client's roots), and the client retries with `inputResponses`, echoing the
//! sealed `requestState` the server handed it. The state is the server's and is untrusted on its
//! way back: it must open with this process's key, or the retry is refused.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CreateMessageRequest,
    CreateMessageRequestParams, ElicitRequest, ElicitRequestParams, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, InputRequest, InputRequests, InputRequiredResult,
    InputResponses, ListRootsRequest, PromptMessage, RequestStateCodec, Role, SamplingMessage,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Map, Value, json};

use super::ToolSpec;

pub(super) const TOOLS: &[ToolSpec] = &[
    ToolSpec::plain(
        "test_input_required_result_elicitation",
        "Needs an elicitation answer (SEP-2322)",
    ),
    ToolSpec::plain(
        "test_input_required_result_sampling",
        "Needs a sampling answer (SEP-2322)",
    ),
    ToolSpec::plain(
        "test_input_required_result_list_roots",
        "Needs the client's roots (SEP-2322)",
    ),
    ToolSpec::plain(
        "test_input_required_result_request_state",
        "Hands out sealed requestState and needs it back untouched (SEP-2322)",
    ),
    ToolSpec::plain(
        "test_input_required_result_multiple_inputs",
        "Needs an elicitation, a sampling and the roots in one round (SEP-2322)",
    ),
    ToolSpec::plain(
        "test_input_required_result_multi_round",
        "Needs two rounds of input, its progress in requestState (SEP-2322)",
    ),
    ToolSpec::plain(
        "test_input_required_result_tampered_state",
        "Refuses a requestState that does not open with the server's key (SEP-2322)",
    ),
    ToolSpec::plain(
        "test_input_required_result_capabilities",
        "Asks only for inputs the client declared it can give (SEP-2322)",
    ),
];

/// The prompt that needs an elicitation answer (SEP-2322 on `prompts/get`).
pub(super) const PROMPT: &str = "test_input_required_result_prompt";

/// An elicitation request for one `field` of JSON type `kind`.
pub(super) fn elicitation(message: &str, field: &str, kind: &str) -> InputRequest {
    let schema = json!({
        "type": "object",
        "properties": { field: { "type": kind } },
        "required": [field],
    });
    InputRequest::Elicitation(ElicitRequest::new(
        ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: message.into(),
            requested_schema: serde_json::from_value(schema)
                .expect("a one-field elicitation schema is valid"),
        },
    ))
}

fn sampling(prompt: &str) -> InputRequest {
    InputRequest::CreateMessage(CreateMessageRequest::new(CreateMessageRequestParams::new(
        vec![SamplingMessage::user_text(prompt)],
        100,
    )))
}

fn roots() -> InputRequest {
    InputRequest::ListRoots(ListRootsRequest::default())
}

/// The response under `key`, if it is a result object. Anything else (a number, `null`) counts
/// as missing, so the input is asked for again rather than trusted.
fn response<'a>(
    responses: Option<&'a InputResponses>,
    key: &str,
) -> Option<&'a Map<String, Value>> {
    responses
        .and_then(|r| r.get(key))
        .and_then(Value::as_object)
}

/// A string field of an elicitation answer's `content`.
fn content_field<'a>(answer: &'a Map<String, Value>, field: &str) -> Option<&'a str> {
    answer
        .get("content")
        .and_then(|c| c.get(field))
        .and_then(Value::as_str)
}

fn text(text: impl Into<String>) -> CallToolResponse {
    CallToolResult::success(vec![ContentBlock::text(text)]).into()
}

fn ask(requests: InputRequests, state: Option<String>) -> CallToolResponse {
    InputRequiredResult::new(Some(requests), state).into()
}

fn one(key: &str, request: InputRequest) -> InputRequests {
    InputRequests::from([(key.to_owned(), request)])
}

/// The error of a `requestState` that does not open: the client changed it, or another server
/// (or an earlier run of this one) sealed it.
fn tampered() -> ErrorData {
    ErrorData::invalid_params(
        "requestState failed integrity verification: send back the requestState of this \
         server's last answer unchanged, or start over without one",
        None,
    )
}

fn seal(codec: &RequestStateCodec, state: Value) -> Result<String, ErrorData> {
    codec
        .seal_json(&state)
        .map_err(|e| ErrorData::internal_error(format!("cannot seal requestState: {e}"), None))
}

/// Calls the input-required fixture `request.name`.
pub(super) fn call(
    codec: &RequestStateCodec,
    request: CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, ErrorData> {
    let responses = request.input_responses.as_ref();
    let state = request.request_state.as_deref();
    Ok(match request.name.as_ref() {
        "test_input_required_result_elicitation" => match response(responses, "user_name") {
            Some(answer) => text(format!(
                "Hello, {}!",
                content_field(answer, "name").unwrap_or("friend")
            )),
            None => ask(
                one(
                    "user_name",
                    elicitation("What is your name?", "name", "string"),
                ),
                None,
            ),
        },
        "test_input_required_result_sampling" => match response(responses, "capital_question") {
            Some(answer) => text(format!(
                "Sampling response: {}",
                content_field(answer, "text").unwrap_or("(no sampling text)")
            )),
            None => ask(
                one(
                    "capital_question",
                    sampling("What is the capital of France?"),
                ),
                None,
            ),
        },
        "test_input_required_result_list_roots" => match response(responses, "client_roots") {
            Some(answer) => {
                let uris: Vec<&str> = answer
                    .get("roots")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|root| root.get("uri").and_then(Value::as_str))
                    .collect();
                text(format!("Client roots: [{}]", uris.join(", ")))
            }
            None => ask(one("client_roots", roots()), None),
        },
        "test_input_required_result_request_state"
        | "test_input_required_result_tampered_state" => match state {
            None => ask(
                one("confirm", elicitation("Please confirm", "ok", "boolean")),
                Some(seal(codec, json!({ "stage": "confirm" }))?),
            ),
            Some(sealed) => {
                codec.open(sealed).map_err(|_| tampered())?;
                text("Confirmed: state-ok")
            }
        },
        "test_input_required_result_multiple_inputs" => {
            if let Some(sealed) = state {
                codec.open(sealed).map_err(|_| tampered())?;
            }
            let all = ["user_name", "greeting", "client_roots"]
                .iter()
                .all(|key| response(responses, key).is_some());
            if all && state.is_some() {
                text("All inputs received")
            } else {
                let requests = InputRequests::from([
                    (
                        "user_name".to_owned(),
                        elicitation("What is your name?", "name", "string"),
                    ),
                    ("greeting".to_owned(), sampling("Generate a greeting")),
                    ("client_roots".to_owned(), roots()),
                ]);
                ask(requests, Some(seal(codec, json!({ "stage": "gather" }))?))
            }
        }
        "test_input_required_result_multi_round" => {
            let round = match state {
                None => 0,
                Some(sealed) => codec
                    .open_json::<Value>(sealed)
                    .map_err(|_| tampered())?
                    .get("round")
                    .and_then(Value::as_i64)
                    .unwrap_or(0),
            };
            match round {
                0 => ask(
                    one(
                        "step1",
                        elicitation("Step 1: What is your name?", "name", "string"),
                    ),
                    Some(seal(codec, json!({ "round": 1 }))?),
                ),
                1 => ask(
                    one(
                        "step2",
                        elicitation("Step 2: What is your favorite color?", "color", "string"),
                    ),
                    Some(seal(codec, json!({ "round": 2 }))?),
                ),
                _ => text("Multi-round flow complete"),
            }
        }
        "test_input_required_result_capabilities" => {
            if responses.is_some() {
                return Ok(text("Capability-aware flow complete"));
            }
            // Only what the request's client declared it can answer (SEP-2322).
            let caps = context.client_capabilities().unwrap_or_default();
            let mut requests = InputRequests::new();
            if caps.elicitation.is_some() {
                requests.insert(
                    "user_name".into(),
                    elicitation("What is your name?", "name", "string"),
                );
            }
            if caps.sampling.is_some() {
                requests.insert("greeting".into(), sampling("Generate a greeting"));
            }
            if caps.roots.is_some() {
                requests.insert("client_roots".into(), roots());
            }
            if requests.is_empty() {
                text("Client declared no MRTR-capable capabilities")
            } else {
                ask(requests, None)
            }
        }
        other => {
            return Err(ErrorData::invalid_params(
                format!("unknown fixture tool `{other}`"),
                None,
            ));
        }
    })
}

/// `prompts/get` of [`PROMPT`].
pub(super) fn prompt(request: &GetPromptRequestParams) -> GetPromptResponse {
    match response(request.input_responses.as_ref(), "user_context") {
        Some(answer) => GetPromptResult::new(vec![PromptMessage::new_text(
            Role::User,
            format!(
                "Prompt with elicited context: {}",
                content_field(answer, "context").unwrap_or("(no context)")
            ),
        )])
        .with_description("A prompt built from elicited context")
        .into(),
        None => InputRequiredResult::from_input_requests(one(
            "user_context",
            elicitation("What context should the prompt use?", "context", "string"),
        ))
        .into(),
    }
}

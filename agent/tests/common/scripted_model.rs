//! A local OpenAI-compatible chat-completions server with scripted turns, for driving the real
//! agent binary (real async-openai client, real HTTP) without a hosted model.
//!
//! Honesty checks, so the agent cannot pass against a server laxer than the real one:
//! - every request must deserialize into async-openai's `CreateChatCompletionRequest`, carry the
//!   API key, ask for a stream, offer well-formed function tools, and keep the conversation
//!   rules the real API enforces (each `tool` message answers a `tool_calls` id of the assistant
//!   message before it; every tool call is answered before the conversation goes on), else the
//!   server answers 400 like the real one and records the problem;
//! - every streamed chunk is checked against the API reference's shape of
//!   `chat.completion.chunk` (required fields and their types, see [`check_chunk`]) and must
//!   deserialize into async-openai's `CreateChatCompletionStreamResponse`, before it is sent.
//!
//! The wire format follows what the API streams: `data: {json}\n\n` events, the first chunk with
//! the role, tool calls as deltas by `index` (id, type and name first, arguments in pieces), a
//! last chunk with `finish_reason` and an empty delta, then `data: [DONE]`.

#![allow(dead_code)]

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_openai::types::chat::{
    ChatCompletionRequestMessage, CreateChatCompletionRequest, CreateChatCompletionStreamResponse,
};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use serde_json::{Value, json};

/// The API key the server accepts.
pub const API_KEY: &str = "sk-scripted-test-key";

/// What the model does on one turn.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Answers with this text (streamed in pieces); `finish_reason` `stop`.
    Text(String),
    /// Calls these functions: (name, arguments exactly as sent, possibly not valid JSON);
    /// `finish_reason` `tool_calls`.
    Calls(Vec<(String, String)>),
    /// Sends the first chunk, then nothing more (the test kills the agent meanwhile).
    Hang,
}

impl Reply {
    /// A text answer.
    pub fn text(text: impl Into<String>) -> Self {
        Reply::Text(text.into())
    }

    /// One call with JSON arguments.
    pub fn call(name: &str, arguments: Value) -> Self {
        Reply::Calls(vec![(name.to_owned(), arguments.to_string())])
    }
}

/// One request as the script sees it.
pub struct Turn {
    /// 0 for the first request the server got.
    pub index: usize,
    /// The request, parsed with async-openai's type.
    pub request: CreateChatCompletionRequest,
    /// The request body as sent.
    pub raw: Value,
}

impl Turn {
    /// The tool messages that follow the last assistant message: (tool_call_id, content).
    pub fn tool_results(&self) -> Vec<(String, String)> {
        let messages = self.raw["messages"].as_array().expect("messages");
        let start = messages
            .iter()
            .rposition(|m| m["role"] == "assistant")
            .map_or(0, |i| i + 1);
        messages[start..]
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                (
                    m["tool_call_id"].as_str().unwrap_or_default().to_owned(),
                    content_text(&m["content"]),
                )
            })
            .collect()
    }

    /// The content of the only tool result of the previous turn.
    pub fn tool_result(&self) -> String {
        let results = self.tool_results();
        assert_eq!(results.len(), 1, "one tool result expected: {results:?}");
        results.into_iter().next().unwrap().1
    }

    /// (role, text) of every message, in order.
    pub fn messages(&self) -> Vec<(String, String)> {
        self.raw["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap_or_default().to_owned(),
                    content_text(&m["content"]),
                )
            })
            .collect()
    }

    /// Names of the offered functions.
    pub fn tool_names(&self) -> Vec<String> {
        self.raw["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .map(|t| {
                        t["function"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned()
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Message content as text: a string, or the text parts of an array.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

type Script = dyn Fn(&Turn) -> Reply + Send + Sync;

struct Shared {
    script: Box<Script>,
    requests: Mutex<Vec<Value>>,
    problems: Mutex<Vec<String>>,
    next_id: AtomicUsize,
}

/// A running scripted model server.
pub struct ScriptedModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl ScriptedModel {
    /// Starts a server on a free loopback port that answers each request with `script`.
    pub async fn start(script: impl Fn(&Turn) -> Reply + Send + Sync + 'static) -> Self {
        let shared = Arc::new(Shared {
            script: Box::new(script),
            requests: Mutex::new(Vec::new()),
            problems: Mutex::new(Vec::new()),
            next_id: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            addr,
            shared,
            server,
        }
    }

    /// The value for `OPENAI_BASE_URL`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request body received so far; fails the test if any request or chunk broke the
    /// API's rules.
    pub fn requests(&self) -> Vec<Value> {
        let problems = self.shared.problems.lock().unwrap().clone();
        assert!(
            problems.is_empty(),
            "the scripted model saw problems: {problems:#?}"
        );
        self.shared.requests.lock().unwrap().clone()
    }
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// An error body in the API's format.
fn api_error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            .to_string(),
    )
        .into_response()
}

async fn completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if auth != Some(&format!("Bearer {API_KEY}")) {
        return api_error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "Incorrect API key provided. You can find your API key at \
             https://platform.openai.com/account/api-keys.",
        );
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(&shared, format!("the body is not JSON: {e}")),
    };
    let request: CreateChatCompletionRequest = match serde_json::from_value(raw.clone()) {
        Ok(r) => r,
        Err(e) => {
            return bad_request(
                &shared,
                format!("not a chat completion request ({e}): {raw}"),
            );
        }
    };
    if let Err(problem) = check_request(&raw) {
        return bad_request(&shared, problem);
    }
    let index = {
        let mut requests = shared.requests.lock().unwrap();
        requests.push(raw.clone());
        requests.len() - 1
    };
    let turn = Turn {
        index,
        request,
        raw,
    };
    let reply = (shared.script)(&turn);
    let id = format!(
        "chatcmpl-scripted{}",
        shared.next_id.fetch_add(1, Ordering::Relaxed)
    );
    let chunks = chunks(&id, &turn.request.model, &reply);
    for chunk in &chunks {
        if let Err(problem) = check_chunk(chunk) {
            shared.problems.lock().unwrap().push(problem.clone());
            panic!("{problem}");
        }
    }
    let hang = matches!(reply, Reply::Hang);
    let mut events: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    if !hang {
        events.push("data: [DONE]\n\n".to_owned());
    }
    // Small pauses between events, so the client really reads a stream in pieces.
    let stream = futures::stream::iter(events).then(|event| async move {
        tokio::time::sleep(Duration::from_millis(3)).await;
        Ok::<_, Infallible>(Bytes::from(event))
    });
    let body = if hang {
        Body::from_stream(stream.chain(futures::stream::pending()))
    } else {
        Body::from_stream(stream)
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap()
}

fn bad_request(shared: &Shared, problem: String) -> Response {
    shared.problems.lock().unwrap().push(problem.clone());
    api_error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "invalid_request",
        &problem,
    )
}

/// The rules the real API enforces on a request, as far as the agent's requests go.
pub fn check_request(raw: &Value) -> Result<(), String> {
    if raw["model"].as_str().is_none_or(str::is_empty) {
        return Err("`model` is required".into());
    }
    if raw["stream"] != json!(true) {
        return Err(format!(
            "the agent must stream (stream: true), got {}",
            raw["stream"]
        ));
    }
    let tools = raw["tools"].as_array().cloned().unwrap_or_default();
    for tool in &tools {
        let name = tool["function"]["name"].as_str().unwrap_or_default();
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if tool["type"] != "function" || !valid_name {
            return Err(format!("invalid tool definition: {tool}"));
        }
        if let Some(parameters) = tool["function"].get("parameters")
            && parameters["type"] != "object"
        {
            return Err(format!(
                "function parameters must be an object schema: {tool}"
            ));
        }
    }
    let messages = raw["messages"]
        .as_array()
        .ok_or("`messages` must be an array")?;
    if messages.is_empty() {
        return Err("`messages` must not be empty".into());
    }
    // Tool call ids the conversation still owes a `tool` message.
    let mut open: HashSet<String> = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or_default();
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            if !open.remove(id) {
                return Err(format!(
                    "messages[{i}]: messages with role 'tool' must be a response to a preceding \
                     message with 'tool_calls' (id {id:?})"
                ));
            }
            continue;
        }
        if !open.is_empty() {
            return Err(format!(
                "messages[{i}]: an assistant message with 'tool_calls' must be followed by tool \
                 messages responding to each 'tool_call_id'; missing {open:?}"
            ));
        }
        if role == "assistant" {
            for call in m["tool_calls"].as_array().into_iter().flatten() {
                let id = call["id"].as_str().unwrap_or_default();
                if id.is_empty()
                    || call["type"] != "function"
                    || call["function"]["name"].as_str().is_none()
                    || call["function"]["arguments"].as_str().is_none()
                {
                    return Err(format!("messages[{i}]: malformed tool call {call}"));
                }
                open.insert(id.to_owned());
            }
            if m.get("content").is_none_or(Value::is_null) && open.is_empty() {
                return Err(format!(
                    "messages[{i}]: an assistant message needs content or tool_calls"
                ));
            }
        }
    }
    if !open.is_empty() {
        return Err(format!("the last tool calls were not answered: {open:?}"));
    }
    // Round trip through async-openai's message type must keep every message.
    let parsed: Vec<ChatCompletionRequestMessage> =
        serde_json::from_value(Value::Array(messages.clone()))
            .map_err(|e| format!("messages do not parse: {e}"))?;
    if parsed.len() != messages.len() {
        return Err("messages were lost in parsing".into());
    }
    Ok(())
}

/// Splits text into pieces of at most `n` characters (at character boundaries).
fn pieces(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(n).map(|c| c.iter().collect()).collect()
}

/// The chunks of one streamed reply.
pub fn chunks(id: &str, model: &str, reply: &Reply) -> Vec<Value> {
    let created = jiff::Timestamp::now().as_second();
    let chunk = |delta: Value, finish_reason: Value| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "service_tier": "default",
            "system_fingerprint": "fp_scripted",
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
        })
    };
    let mut out = Vec::new();
    match reply {
        Reply::Text(text) => {
            out.push(chunk(
                json!({"role": "assistant", "content": "", "refusal": null}),
                Value::Null,
            ));
            for piece in pieces(text, 7) {
                out.push(chunk(json!({"content": piece}), Value::Null));
            }
            out.push(chunk(json!({}), json!("stop")));
        }
        Reply::Calls(calls) => {
            for (n, (name, arguments)) in calls.iter().enumerate() {
                let first = json!({
                    "index": n,
                    "id": format!("call_{id}_{n}"),
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                });
                let delta = if n == 0 {
                    json!({"role": "assistant", "content": null, "tool_calls": [first], "refusal": null})
                } else {
                    json!({"tool_calls": [first]})
                };
                out.push(chunk(delta, Value::Null));
                for piece in pieces(arguments, 9) {
                    out.push(chunk(
                        json!({"tool_calls": [{"index": n, "function": {"arguments": piece}}]}),
                        Value::Null,
                    ));
                }
            }
            out.push(chunk(json!({}), json!("tool_calls")));
        }
        Reply::Hang => {
            out.push(chunk(
                json!({"role": "assistant", "content": "", "refusal": null}),
                Value::Null,
            ));
        }
    }
    out
}

/// Checks a chunk against the API reference's `chat.completion.chunk` object: required `id`
/// (string), `choices` (array), `created` (integer, Unix seconds), `model` (string), `object`
/// (always `chat.completion.chunk`); each choice has `index` (integer), `delta` (object) and
/// `finish_reason` (present; null or one of stop, length, tool_calls, content_filter,
/// function_call); each tool call delta has `index`, and when it opens a call its `id`,
/// `type: function` and `function.name`. Then it must deserialize into async-openai's type.
pub fn check_chunk(chunk: &Value) -> Result<(), String> {
    let fail = |what: &str| {
        Err(format!(
            "chunk violates the API reference ({what}): {chunk}"
        ))
    };
    if !chunk["id"].is_string() {
        return fail("id");
    }
    if chunk["object"] != "chat.completion.chunk" {
        return fail("object");
    }
    if !chunk["created"].is_u64() {
        return fail("created");
    }
    if !chunk["model"].is_string() {
        return fail("model");
    }
    let Some(choices) = chunk["choices"].as_array() else {
        return fail("choices");
    };
    for choice in choices {
        if !choice["index"].is_u64() || !choice["delta"].is_object() {
            return fail("choice index/delta");
        }
        match choice.get("finish_reason") {
            Some(Value::Null) => {}
            Some(Value::String(r))
                if [
                    "stop",
                    "length",
                    "tool_calls",
                    "content_filter",
                    "function_call",
                ]
                .contains(&r.as_str()) => {}
            _ => return fail("finish_reason"),
        }
        for call in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if !call["index"].is_u64() {
                return fail("tool call index");
            }
            if call.get("id").is_some()
                && (call["type"] != "function" || !call["function"]["name"].is_string())
            {
                return fail("tool call opening");
            }
        }
    }
    let parsed: CreateChatCompletionStreamResponse = serde_json::from_value(chunk.clone())
        .map_err(|e| format!("async-openai cannot parse the chunk ({e}): {chunk}"))?;
    if parsed.choices.len() != choices.len() {
        return fail("choices lost in parsing");
    }
    Ok(())
}

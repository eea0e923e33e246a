//! The chat-completions side: one streamed model turn at a time, with async-openai over
//! reqwest, against any OpenAI-compatible endpoint (`OPENAI_BASE_URL`, `OPENAI_API_KEY`).
//!
//! A turn's deltas are assembled here (text as it arrives, tool calls by their `index`), so
//! the loop only ever sees whole assistant messages.

use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionTools, CreateChatCompletionRequest, FinishReason,
};
use futures::StreamExt;

use crate::error::{AgentError, causes};

/// The endpoint used when `OPENAI_BASE_URL` is not set.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// How long a streamed response may stay silent before the turn fails. Models can think for a
/// while before the first token, so this is generous.
const READ_TIMEOUT: Duration = Duration::from_secs(300);

/// A tool call as the model made it; nothing is checked yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestedCall {
    /// The call's id, echoed in the tool message that answers it.
    pub id: String,
    /// The function the model named.
    pub name: String,
    /// The arguments exactly as the model wrote them (meant to be a JSON object).
    pub arguments: String,
}

/// One complete assistant turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AssistantTurn {
    /// The text of the turn (possibly empty when it only calls tools).
    pub content: String,
    /// The tools it calls, in the model's order.
    pub tool_calls: Vec<RequestedCall>,
    /// Why the model stopped.
    pub finish_reason: Option<FinishReason>,
}

/// A chat-completions endpoint and the model to use on it.
pub struct Model {
    client: Client<OpenAIConfig>,
    model: String,
    base_url: String,
}

impl Model {
    /// The endpoint from `OPENAI_API_KEY` and `OPENAI_BASE_URL`. A missing key is an error here,
    /// before anything else starts.
    pub fn from_env(model: &str, connect_timeout: Duration) -> Result<Self, AgentError> {
        let key = std::env::var("OPENAI_API_KEY")
            .ok()
            .filter(|k| !k.trim().is_empty())
            .ok_or_else(|| {
                AgentError::Config(
                    "OPENAI_API_KEY is not set: export the API key of your OpenAI-compatible \
                     endpoint (and OPENAI_BASE_URL when it is not api.openai.com)"
                        .to_owned(),
                )
            })?;
        let base_url = std::env::var("OPENAI_BASE_URL")
            .ok()
            .map(|u| u.trim().trim_end_matches('/').to_owned())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(AgentError::Config(format!(
                "OPENAI_BASE_URL must be an http:// or https:// URL such as {DEFAULT_BASE_URL}, \
                 not `{base_url}`"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| AgentError::Config(format!("cannot set up HTTP: {}", causes(&e))))?;
        let config = OpenAIConfig::new()
            .with_api_key(key.trim())
            .with_api_base(&base_url);
        Ok(Self {
            client: Client::with_config(config).with_http_client(http),
            model: model.to_owned(),
            base_url,
        })
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.model
    }

    /// One streamed turn: sends the conversation and the tools, calls `on_text` with each piece
    /// of text as it arrives, and returns the whole turn.
    pub async fn turn(
        &self,
        messages: &[ChatCompletionRequestMessage],
        tools: &[ChatCompletionTools],
        mut on_text: impl FnMut(&str),
    ) -> Result<AssistantTurn, AgentError> {
        let request = CreateChatCompletionRequest {
            model: self.model.clone(),
            messages: messages.to_vec(),
            tools: (!tools.is_empty()).then(|| tools.to_vec()),
            stream: Some(true),
            ..Default::default()
        };
        let mut stream = self
            .client
            .chat()
            .create_stream(request)
            .await
            .map_err(|e| self.error(e))?;
        let mut turn = AssistantTurn::default();
        // Tool calls by their `index` in the deltas: the id and name come first, the arguments
        // in pieces.
        let mut calls: Vec<(u32, RequestedCall)> = Vec::new();
        let mut finished = false;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.error(e))?;
            // Only the first choice is used (the request asks for one).
            let Some(choice) = chunk.choices.into_iter().find(|c| c.index == 0) else {
                continue;
            };
            if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                on_text(&text);
                turn.content.push_str(&text);
            }
            for delta in choice.delta.tool_calls.unwrap_or_default() {
                let pos = match calls.iter().position(|(i, _)| *i == delta.index) {
                    Some(pos) => pos,
                    None => {
                        calls.push((
                            delta.index,
                            RequestedCall {
                                id: String::new(),
                                name: String::new(),
                                arguments: String::new(),
                            },
                        ));
                        calls.len() - 1
                    }
                };
                let call = &mut calls[pos].1;
                if let Some(id) = delta.id.filter(|id| !id.is_empty()) {
                    call.id = id;
                }
                if let Some(function) = delta.function {
                    if let Some(name) = function.name {
                        call.name.push_str(&name);
                    }
                    if let Some(arguments) = function.arguments {
                        call.arguments.push_str(&arguments);
                    }
                }
            }
            if let Some(reason) = choice.finish_reason {
                turn.finish_reason = Some(reason);
                finished = true;
            }
        }
        if !finished {
            return Err(AgentError::Model(format!(
                "the response from the model endpoint {} ended before the model finished (no \
                 finish_reason); the connection may have been cut, try again",
                self.base_url
            )));
        }
        calls.sort_by_key(|(i, _)| *i);
        turn.tool_calls = calls
            .into_iter()
            .enumerate()
            .map(|(n, (_, mut call))| {
                // Some compatible servers omit ids; the tool message still needs one.
                if call.id.is_empty() {
                    call.id = format!("call_{n}");
                }
                call
            })
            .collect();
        Ok(turn)
    }

    /// An endpoint failure as one line that says what to check.
    fn error(&self, e: OpenAIError) -> AgentError {
        let base = &self.base_url;
        AgentError::Model(match e {
            OpenAIError::Reqwest(e) if e.is_connect() => format!(
                "cannot reach the model endpoint {base}: {}; check OPENAI_BASE_URL and that the \
                 endpoint is up",
                causes(&e)
            ),
            OpenAIError::Reqwest(e) if e.is_timeout() => format!(
                "the model endpoint {base} did not answer in time ({}); try again later",
                causes(&e)
            ),
            OpenAIError::Reqwest(e) => format!(
                "the request to the model endpoint {base} failed: {}",
                causes(&e)
            ),
            OpenAIError::ApiError(r) => {
                let hint = match r.status_code.as_u16() {
                    401 | 403 => "; check OPENAI_API_KEY",
                    404 => "; check --model and OPENAI_BASE_URL (it usually ends in /v1)",
                    429 => "; the endpoint is rate limiting or out of quota, try again later",
                    _ => "",
                };
                format!(
                    "the model endpoint {base} refused the request ({}): {}{hint}",
                    r.status_code, r.api_error.message
                )
            }
            OpenAIError::JSONDeserialize(e, body) => format!(
                "the model endpoint {base} answered something that is not a chat completion \
                 ({e}): {}",
                body.chars().take(200).collect::<String>()
            ),
            OpenAIError::StreamError(e) => {
                format!("the response stream from the model endpoint {base} broke: {e}")
            }
            other => format!("the model endpoint {base} failed: {other}"),
        })
    }
}

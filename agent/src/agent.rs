//! The loop: ask the model, run the tools it calls through MCP, give it the results, repeat
//! until it answers or the step limit is reached.
//!
//! Nothing a model does ends the run: an unknown tool, arguments that are not a JSON object and
//! tool errors (`isError`) all go back to it as tool messages, so it can correct itself. Only
//! the endpoint, the MCP connection or the store failing ends a run early.

use std::io::Write;
use std::time::Instant;

use async_openai::types::chat::{
    ChatCompletionMessageToolCall, ChatCompletionMessageToolCalls,
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestAssistantMessageContent,
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestSystemMessageContent, ChatCompletionRequestToolMessage,
    ChatCompletionRequestToolMessageContent, ChatCompletionRequestUserMessage,
    ChatCompletionRequestUserMessageContent, FinishReason, FunctionCall,
};
use serde::Serialize;

use crate::error::AgentError;
use crate::files::{FileSaver, SavedFile, saved_note};
use crate::mcp::{Session, ToolOutcome};
use crate::model::{AssistantTurn, Model};
use crate::progress::Progress;
use crate::store::ThreadStore;
use crate::tools::{Rejected, Toolbox};

/// The agent's own instructions; the server's follow them.
const SYSTEM_PROMPT: &str = "You are sandboxrun-agent. Answer the user's question. When the \
answer needs computation or data, call the tools and base the answer on what they return; do not \
guess results you could compute. When a tool returns an error, read it, fix the call and try \
again.";

/// The messages of a conversation, written to the thread store (when there is one) as they are
/// added.
pub struct Conversation {
    messages: Vec<ChatCompletionRequestMessage>,
    store: Option<ThreadStore>,
    /// Index of the first message of this run.
    run_start: usize,
}

impl Conversation {
    /// A conversation that starts from `history` (a resumed thread) and is kept in `store`.
    pub fn new(history: Vec<ChatCompletionRequestMessage>, store: Option<ThreadStore>) -> Self {
        let run_start = history.len();
        Self {
            messages: history,
            store,
            run_start,
        }
    }

    /// Adds a message, stored durably first.
    async fn push(&mut self, message: ChatCompletionRequestMessage) -> Result<(), AgentError> {
        if let Some(store) = &mut self.store {
            store.append(&message).await?;
        }
        self.messages.push(message);
        Ok(())
    }

    /// Whether the conversation has no message yet.
    fn is_new(&self) -> bool {
        self.messages.is_empty()
    }

    /// The messages added by this run.
    pub fn this_run(&self) -> &[ChatCompletionRequestMessage] {
        &self.messages[self.run_start..]
    }
}

/// How the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StopReason {
    /// The model answered without calling a tool.
    Answered,
    /// The model was still calling tools when the step limit was reached.
    MaxSteps,
}

/// One tool call of the run, for the transcript.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallRecord {
    /// The model's id of the call.
    pub id: String,
    /// The function the model called.
    pub name: String,
    /// The arguments as the model wrote them.
    pub arguments: String,
    /// Whether the result was an error (including calls refused before reaching the server).
    pub is_error: bool,
    /// Whether the call was refused by the agent (unknown tool, malformed arguments).
    pub rejected: bool,
    /// Milliseconds the call took.
    pub duration_ms: u64,
    /// The text given back to the model.
    pub result: String,
    /// The images it returned, as saved on this machine.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub saved_files: Vec<SavedFile>,
}

/// The outcome of a run.
#[derive(Debug)]
pub struct RunReport {
    /// How it ended.
    pub stop: StopReason,
    /// The final answer (the last assistant text when answered).
    pub answer: Option<String>,
    /// Model calls made.
    pub steps: u32,
    /// Tool calls, in order.
    pub tool_calls: Vec<ToolCallRecord>,
}

/// Settings of one run.
pub struct RunOptions {
    /// Most model calls.
    pub max_steps: u32,
    /// Stream the answer to stdout (off for `--json`).
    pub stream_to_stdout: bool,
    /// Where images that tools return are saved.
    pub files: FileSaver,
}

/// Runs one question through the loop.
pub async fn run(
    model: &Model,
    session: &Session,
    toolbox: &Toolbox,
    conversation: &mut Conversation,
    question: &str,
    options: &RunOptions,
    progress: &Progress,
) -> Result<RunReport, AgentError> {
    if conversation.is_new() {
        let mut prompt = SYSTEM_PROMPT.to_owned();
        if let Some(instructions) = session.instructions() {
            prompt.push_str("\n\nThe tool server's instructions: ");
            prompt.push_str(&instructions);
        }
        conversation
            .push(ChatCompletionRequestMessage::System(
                ChatCompletionRequestSystemMessage {
                    content: ChatCompletionRequestSystemMessageContent::Text(prompt),
                    name: None,
                },
            ))
            .await?;
    }
    conversation
        .push(ChatCompletionRequestMessage::User(
            ChatCompletionRequestUserMessage {
                content: ChatCompletionRequestUserMessageContent::Text(question.to_owned()),
                name: None,
            },
        ))
        .await?;

    let definitions = toolbox.definitions();
    let mut records = Vec::new();
    for step in 1..=options.max_steps {
        progress.start(format!("asking {}", model.name()));
        let mut printed_any = false;
        let mut ends_with_newline = true;
        let turn = model
            .turn(&conversation.messages, &definitions, |text| {
                if options.stream_to_stdout {
                    progress.clear();
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(text.as_bytes());
                    let _ = out.flush();
                    printed_any = true;
                    ends_with_newline = text.ends_with('\n');
                }
            })
            .await;
        progress.clear();
        if printed_any && !ends_with_newline {
            println!();
        }
        let turn = turn?;
        conversation.push(assistant_message(&turn)).await?;
        if turn.tool_calls.is_empty() {
            if turn.finish_reason == Some(FinishReason::Length) {
                eprintln!(
                    "sandboxrun-agent: note: the model stopped at its output length limit; the \
                     answer may be cut short"
                );
            }
            return Ok(RunReport {
                stop: StopReason::Answered,
                answer: Some(turn.content),
                steps: step,
                tool_calls: records,
            });
        }
        for call in &turn.tool_calls {
            let started = Instant::now();
            let (outcome, rejected) = match toolbox.resolve(&call.name, &call.arguments) {
                Err(Rejected(text)) => (ToolOutcome::text(text, true), true),
                Ok((mcp_name, arguments)) => {
                    progress.start(format!("{} running", call.name));
                    (session.call(&mcp_name, arguments).await?, false)
                }
            };
            let elapsed = started.elapsed();
            progress.finish_tool(&call.name, elapsed, outcome.is_error);
            let (outcome, saved_files) = save_images(outcome, &options.files, progress);
            conversation
                .push(ChatCompletionRequestMessage::Tool(
                    ChatCompletionRequestToolMessage {
                        content: ChatCompletionRequestToolMessageContent::Text(
                            outcome.text.clone(),
                        ),
                        tool_call_id: call.id.clone(),
                    },
                ))
                .await?;
            records.push(ToolCallRecord {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                is_error: outcome.is_error,
                rejected,
                duration_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
                result: outcome.text,
                saved_files,
            });
        }
    }
    Ok(RunReport {
        stop: StopReason::MaxSteps,
        answer: None,
        steps: options.max_steps,
        tool_calls: records,
    })
}

/// Saves the images of a tool's outcome, says on stderr where each went, and tells the model in
/// the tool message (it cannot see them). Returns the outcome with that text and what was saved.
fn save_images(
    mut outcome: ToolOutcome,
    files: &FileSaver,
    progress: &Progress,
) -> (ToolOutcome, Vec<SavedFile>) {
    let mut saved_files = Vec::new();
    for (index, image) in std::mem::take(&mut outcome.images).iter().enumerate() {
        let saved = files.save(image, index);
        progress.clear();
        match &saved {
            Ok(file) => eprintln!(
                "sandboxrun-agent: saved {} → {}",
                file.name,
                file.path.display()
            ),
            Err(e) => eprintln!("sandboxrun-agent: could not save an image: {e}"),
        }
        outcome.text.push('\n');
        outcome.text.push_str(&saved_note(image, &saved));
        saved_files.extend(saved.ok());
    }
    (outcome, saved_files)
}

/// The assistant message for the history: its text and its tool calls, exactly as the model
/// made them (also the malformed ones: the model must see what it sent).
fn assistant_message(turn: &AssistantTurn) -> ChatCompletionRequestMessage {
    let tool_calls: Vec<ChatCompletionMessageToolCalls> = turn
        .tool_calls
        .iter()
        .map(|c| {
            ChatCompletionMessageToolCalls::Function(ChatCompletionMessageToolCall {
                id: c.id.clone(),
                function: FunctionCall {
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                },
            })
        })
        .collect();
    #[allow(deprecated)] // `function_call` is deprecated but still a field of the type.
    ChatCompletionRequestMessage::Assistant(ChatCompletionRequestAssistantMessage {
        content: (!turn.content.is_empty())
            .then(|| ChatCompletionRequestAssistantMessageContent::Text(turn.content.clone())),
        tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
        ..Default::default()
    })
}

//! The `--json` output: one JSON object describing the run, for scripts and tests.

use async_openai::types::chat::ChatCompletionRequestMessage;
use serde::Serialize;

use crate::agent::{Conversation, RunReport, StopReason, ToolCallRecord};
use crate::cli::Cli;

/// A finished run.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Transcript<'a> {
    /// The question of this run.
    pub question: &'a str,
    /// The model asked.
    pub model: &'a str,
    /// The thread, when the run kept one.
    pub thread: Option<&'a str>,
    /// `answered` or `maxSteps`.
    pub stop: StopReason,
    /// The model's answer (absent when the step limit stopped it).
    pub answer: Option<&'a str>,
    /// Model calls made.
    pub steps: u32,
    /// Every tool call, in order, with what went back to the model.
    pub tool_calls: &'a [ToolCallRecord],
    /// The messages this run added, in the chat-completions wire format.
    pub messages: &'a [ChatCompletionRequestMessage],
}

impl<'a> Transcript<'a> {
    /// The transcript of `report`.
    pub fn new(
        cli: &'a Cli,
        question: &'a str,
        report: &'a RunReport,
        conversation: &'a Conversation,
    ) -> Self {
        Self {
            question,
            model: &cli.model,
            thread: cli.thread.as_deref(),
            stop: report.stop,
            answer: report.answer.as_deref(),
            steps: report.steps,
            tool_calls: &report.tool_calls,
            messages: conversation.this_run(),
        }
    }
}

//! The one call pipeline every tool goes through: parse the raw arguments (the tool's own
//! validation, in core) → run the call on the backend (which judges it by policy: the operator in
//! a cluster, the tool's embedded executor on this machine) → record it in the call record →
//! count it in the metrics → turn the output into the MCP result. A handler in `server.rs` is one
//! call of [`SandboxRunServer::call`] with its tool type.

use std::sync::Arc;
use std::time::Instant;

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, ProgressNotificationParam};
use rmcp::service::RequestContext;
use sandboxrun_api::ClusterTool;
use sandboxrun_core::metrics::CallRecord;
use sandboxrun_core::tools::CallSummary;
use sandboxrun_core::{Environment, OutputChunk, OutputFn, Phase, Verdict};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::backend::{BackendError, ProgressFn};
use crate::metrics::Outcome;
use crate::server::SandboxRunServer;

/// The `phase` label of calls that ended without a run phase (see `CALLS_METRIC`).
const INVALID: &str = "InvalidArguments";
const CANCELLED: &str = "Cancelled";
const UNAVAILABLE: &str = "Unavailable";
const THROTTLED: &str = "Throttled";
const NOT_PERMITTED: &str = "EnvironmentNotPermitted";
const SCOPE_MISSING: &str = "ScopeNotGranted";

impl SandboxRunServer {
    /// Runs one call of tool `T` with the raw `args` through the whole pipeline.
    pub(crate) async fn call<T: ClusterTool>(
        &self,
        args: JsonObject,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let tool = T::TOOL.mcp_name();
        let agent = self.caller(&ctx);
        let span =
            tracing::info_span!("tool_call", tool, agent = %agent, run = tracing::field::Empty);
        self.pipeline::<T>(args, ctx, agent).instrument(span).await
    }

    async fn pipeline<T: ClusterTool>(
        &self,
        args: JsonObject,
        ctx: RequestContext<RoleServer>,
        agent: String,
    ) -> CallToolResult {
        let started = Instant::now();
        let shared = &self.shared;
        let tool = T::TOOL.mcp_name();
        let _in_flight = shared.metrics.call_started(tool);
        let grant = self.grant(&ctx);
        // An access token's scopes bind which tools its bearer may call at all.
        if let Some(message) = grant.as_ref().and_then(|g| g.tool_refusal(&agent, T::TOOL)) {
            shared
                .metrics
                .observe_call(tool, Outcome::Rejected, started.elapsed());
            self.record::<T>(&agent, Environment::Sandbox, None, SCOPE_MISSING);
            return CallToolResult::error(vec![ContentBlock::text(message)]);
        }
        let parse = shared.policy.parse_context();
        let call = match T::parse(&args, &parse) {
            Ok(call) => call,
            Err(message) => {
                shared
                    .metrics
                    .observe_call(tool, Outcome::InvalidArguments, started.elapsed());
                self.record::<T>(&agent, Environment::Sandbox, None, INVALID);
                return CallToolResult::error(vec![ContentBlock::text(message)]);
            }
        };
        let environment = T::environment(&call);
        // What an agent may target is bound to its credential (its access token's scopes, its
        // API key entry), not to what it asks for: the caller chooses the environment argument.
        if let Some(message) = grant
            .as_ref()
            .and_then(|g| g.environment_refusal(&agent, environment))
        {
            shared
                .metrics
                .observe_call(tool, Outcome::Rejected, started.elapsed());
            self.record::<T>(&agent, environment, None, NOT_PERMITTED);
            return CallToolResult::error(vec![ContentBlock::text(message)]);
        }
        if let Some(allowed) = shared.environments.get(&agent)
            && !allowed.contains(&environment)
        {
            let allowed: Vec<&str> = allowed.iter().map(|e| e.as_str()).collect();
            shared
                .metrics
                .observe_call(tool, Outcome::Rejected, started.elapsed());
            self.record::<T>(&agent, environment, None, NOT_PERMITTED);
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "agent {agent} may not target the {environment} environment: its API key allows \
                 only {}; call again with one of those, or ask an operator to extend the key's \
                 environments",
                allowed.join(", ")
            ))]);
        }
        // Held until the call ends, however it ends (the slot frees its place when dropped).
        let Some(_slot) = shared.in_flight.acquire(&agent) else {
            let max = shared.in_flight.max();
            tracing::warn!(
                max,
                "agent has the most calls in flight it may have; refused"
            );
            shared
                .metrics
                .observe_call(tool, Outcome::Throttled, started.elapsed());
            self.record::<T>(&agent, environment, None, THROTTLED);
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "agent {agent} already has {max} calls in flight, the most this server allows at \
                 a time: wait for one of them to finish, then retry this call"
            ))]);
        };
        tracing::info!(backend = shared.backend.name(), %environment, "tool call");
        let (progress, output, forwarder) = progress_forwarder(&ctx);
        // Notifications go out while the run goes on (and while it waits for an approval); the
        // forwarder ends once the backend has dropped the progress function, so they all
        // precede the result (on Streamable HTTP the response closes the request's stream).
        let (result, ()) = tokio::join!(
            shared
                .backend
                .call::<T>(&agent, call.clone(), progress, output, ctx.ct.clone()),
            forwarder
        );
        let (outcome, tool_result) = match result {
            Ok(output) => {
                let CallSummary {
                    phase,
                    verdict,
                    run_name,
                } = T::summary(&output);
                tracing::Span::current().record("run", run_name.as_str());
                self.record::<T>(&agent, environment, verdict, phase.as_str());
                let text = T::error_text(&call, &output, &parse);
                let value = serde_json::to_value(&output).unwrap_or(Value::Null);
                (Outcome::of(phase), tool_result(value, text))
            }
            Err(BackendError::Cancelled) => {
                self.record::<T>(&agent, environment, None, CANCELLED);
                (
                    Outcome::Cancelled,
                    CallToolResult::error(vec![ContentBlock::text(
                        "the call was cancelled and its run stopped",
                    )]),
                )
            }
            Err(BackendError::Unavailable(message)) => {
                tracing::warn!(%message, "backend unavailable");
                self.record::<T>(&agent, environment, None, UNAVAILABLE);
                (
                    Outcome::Unavailable,
                    CallToolResult::error(vec![ContentBlock::text(format!(
                        "{tool} could not be run: {message}; retrying later may help"
                    ))]),
                )
            }
        };
        shared
            .metrics
            .observe_call(tool, outcome, started.elapsed());
        tool_result
    }

    /// Records a finished call in the call record `fetch_metrics` reads (`phase`: how it ended).
    fn record<T: ClusterTool>(
        &self,
        agent: &str,
        environment: Environment,
        verdict: Option<Verdict>,
        phase: &str,
    ) {
        self.shared.calls.record(&CallRecord::new(
            T::TOOL,
            agent,
            environment,
            verdict,
            phase,
        ));
    }
}

/// The MCP result of a call: `structuredContent` always (and the same JSON as text); anything
/// but a success is an error result whose first block says what happened and what to change.
pub fn tool_result(output: Value, error_text: Option<String>) -> CallToolResult {
    match error_text {
        None => CallToolResult::structured(output),
        Some(text) => {
            let mut result = CallToolResult::structured_error(output);
            result.content.insert(0, ContentBlock::text(text));
            result
        }
    }
}

/// What the forwarder sends, in the order it happened.
enum Note {
    Phase(Phase, String),
    Output(OutputChunk),
}

/// Turns backend phases, and the output a run prints while it runs, into
/// `notifications/progress` when the request carries a progress token (no token: neither is
/// collected). Notifications go out in order from one task; the returned future ends once the
/// backend has dropped both functions and everything queued was sent.
fn progress_forwarder(
    ctx: &RequestContext<RoleServer>,
) -> (
    ProgressFn,
    Option<OutputFn>,
    impl Future<Output = ()> + use<>,
) {
    let token = ctx.meta.get_progress_token();
    let peer = ctx.peer.clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<Note>();
    let (progress, output): (ProgressFn, Option<OutputFn>) = if token.is_some() {
        let out = tx.clone();
        (
            Arc::new(move |phase, run| {
                let _ = tx.send(Note::Phase(phase, run.to_owned()));
            }),
            Some(Arc::new(move |chunk| {
                let _ = out.send(Note::Output(chunk));
            })),
        )
    } else {
        (Arc::new(|_, _| {}), None)
    };
    let forward = async move {
        let Some(token) = token else { return };
        let mut step = 0.0;
        while let Some(note) = rx.recv().await {
            let message = match note {
                Note::Phase(phase, run) => progress_message(phase, &run),
                Note::Output(chunk) => Some(output_message(&chunk)),
            };
            let Some(message) = message else { continue };
            step += 1.0;
            let param = ProgressNotificationParam::new(token.clone(), step).with_message(message);
            if let Err(e) = peer.notify_progress(param).await {
                tracing::debug!(error = %e, "could not send progress notification");
            }
        }
    };
    (progress, output, forward)
}

/// The progress message of output printed while the code runs: the stream, then the text as
/// printed (clients show progress messages as they come; the result holds all of it again).
fn output_message(chunk: &OutputChunk) -> String {
    format!("{}: {}", chunk.stream.as_str(), chunk.text)
}

/// The progress message of a phase: the phase first (clients may match on it), then what it
/// means; an approval names the run a person has to approve.
fn progress_message(phase: Phase, run: &str) -> Option<String> {
    Some(match phase {
        Phase::Pending => "Pending: preparing the sandbox".to_owned(),
        Phase::Running => "Running: the code is executing".to_owned(),
        Phase::AwaitingApproval => format!(
            "AwaitingApproval: {run} waits for a person to approve it \
             (spec.approval.approved: true approves, false denies)"
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxrun_core::runner::{Observed, RunnerResult};
    use sandboxrun_core::tools::python::{PythonOutput, classify};

    #[test]
    fn progress_while_awaiting_approval_names_the_run() {
        let m = progress_message(Phase::AwaitingApproval, "run-x7k2q").unwrap();
        // Clients match on the phase first, then find the run a person must approve.
        assert!(m.starts_with("AwaitingApproval: run-x7k2q "), "{m}");
        assert!(m.contains("spec.approval.approved"), "{m}");
        assert!(
            progress_message(Phase::Pending, "run-x")
                .unwrap()
                .starts_with("Pending: ")
        );
        assert_eq!(progress_message(Phase::Succeeded, "run-x"), None);
    }

    #[test]
    fn errors_lead_with_the_sentence_and_keep_the_structure() {
        let result = tool_result(serde_json::json!({"x": 1}), Some("why".into()));
        assert_eq!(result.is_error, Some(true));
        assert_eq!(result.structured_content, Some(serde_json::json!({"x": 1})));
        assert_eq!(result.content[0].as_text().unwrap().text, "why");
        let ok = tool_result(serde_json::json!({"x": 1}), None);
        assert_eq!(ok.is_error, Some(false));
    }

    #[test]
    fn failures_are_tool_errors_with_structured_content() {
        let envelope = RunnerResult {
            version: 1,
            exit_code: 3,
            stdout: String::new(),
            stderr: "boom\n".into(),
            stdout_truncated: false,
            stderr_truncated: false,
            signal: None,
            oom_kill: None,
            timed_out: false,
            duration_millis: Some(12),
        };
        let limits = sandboxrun_core::Limits::default();
        let out = |e: &RunnerResult| {
            PythonOutput::from_classified(
                "local-1".into(),
                classify(Some(e), &Observed::default(), &limits),
                0,
            )
        };
        let failed = out(&envelope);
        let r = tool_result(
            serde_json::to_value(&failed).unwrap(),
            failed.error_text(30, 600),
        );
        assert_eq!(r.is_error, Some(true));
        assert_eq!(r.structured_content.as_ref().unwrap()["exitCode"], 3);
        let first = serde_json::to_value(&r.content[0]).unwrap();
        assert_eq!(first["text"], "the code exited with status 3; stderr: boom");
        let ok = out(&RunnerResult {
            exit_code: 0,
            ..envelope
        });
        let r = tool_result(serde_json::to_value(&ok).unwrap(), ok.error_text(30, 600));
        assert_eq!(r.is_error, Some(false));
        assert_eq!(r.content.len(), 1);
    }
}

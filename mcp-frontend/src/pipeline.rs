//! The one call pipeline every tool goes through: parse the raw arguments (the tool's own
//! validation, in core) → run the call on the backend (which judges it by policy: the operator in
//! a cluster, the tool's embedded executor on this machine) → record it in the call record →
//! count it in the metrics → turn the output into the MCP result. A handler in `server.rs` is one
//! call of [`SandboxRunServer::call`] with its tool type.

use std::sync::Arc;
use std::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use rmcp::RoleServer;
use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, ProgressNotificationParam, ResourceContents,
};
#[allow(deprecated)] // SEP-2577 deprecates logging; see logging.rs
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::RequestContext;
use sandboxrun_api::ClusterTool;
use sandboxrun_core::files;
use sandboxrun_core::metrics::CallRecord;
use sandboxrun_core::tools::{Attachment, CallSummary};
use sandboxrun_core::{Environment, OutputChunk, OutputFn, Phase, Stream, Verdict};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::backend::{BackendError, ProgressFn};
use crate::metrics::Outcome;
use crate::scope::{CallScope, Reporter};
use crate::server::SandboxRunServer;

/// The `phase` label of calls that ended without a run phase (see `CALLS_METRIC`).
const INVALID: &str = "InvalidArguments";
const CANCELLED: &str = "Cancelled";
const UNAVAILABLE: &str = "Unavailable";
const THROTTLED: &str = "Throttled";
const NOT_PERMITTED: &str = "EnvironmentNotPermitted";
const SCOPE_MISSING: &str = "ScopeNotGranted";

impl SandboxRunServer {
    /// Runs one call of tool `T` with the raw `args` through the whole pipeline, for the caller
    /// of the request `ctx`, reporting on that request.
    pub(crate) async fn call<T: ClusterTool>(
        &self,
        args: JsonObject,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let scope = CallScope {
            agent: self.caller(&ctx),
            grant: self.grant(&ctx),
            reporter: Reporter::Request {
                peer: ctx.peer.clone(),
                token: ctx.meta.get_progress_token(),
                log: crate::logging::requested(&ctx, &self.log_level),
            },
            cancel: ctx.ct.clone(),
            approval_wait: None,
        };
        self.call_in::<T>(args, scope).await.1
    }

    /// Runs one call of tool `T` in `scope` (a request's, or a task's): how it ended, and its
    /// MCP result.
    pub(crate) async fn call_in<T: ClusterTool>(
        &self,
        args: JsonObject,
        scope: CallScope,
    ) -> (Outcome, CallToolResult) {
        let tool = T::TOOL.mcp_name();
        let span = tracing::info_span!("tool_call", tool, agent = %scope.agent, run = tracing::field::Empty);
        self.pipeline::<T>(args, scope).instrument(span).await
    }

    async fn pipeline<T: ClusterTool>(
        &self,
        args: JsonObject,
        scope: CallScope,
    ) -> (Outcome, CallToolResult) {
        let CallScope {
            agent,
            grant,
            reporter,
            cancel,
            approval_wait,
        } = scope;
        let started = Instant::now();
        let shared = &self.shared;
        let tool = T::TOOL.mcp_name();
        let _in_flight = shared.metrics.call_started(tool);
        // An access token's scopes bind which tools its bearer may call at all.
        if let Some(message) = grant.as_ref().and_then(|g| g.tool_refusal(&agent, T::TOOL)) {
            shared
                .metrics
                .observe_call(tool, Outcome::Rejected, started.elapsed());
            self.record::<T>(&agent, Environment::Sandbox, None, SCOPE_MISSING);
            return (
                Outcome::Rejected,
                CallToolResult::error(vec![ContentBlock::text(message)]),
            );
        }
        let parse = shared.policy.parse_context();
        let call = match T::parse(&args, &parse) {
            Ok(call) => call,
            Err(message) => {
                shared
                    .metrics
                    .observe_call(tool, Outcome::InvalidArguments, started.elapsed());
                self.record::<T>(&agent, Environment::Sandbox, None, INVALID);
                return (
                    Outcome::InvalidArguments,
                    CallToolResult::error(vec![ContentBlock::text(message)]),
                );
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
            return (
                Outcome::Rejected,
                CallToolResult::error(vec![ContentBlock::text(message)]),
            );
        }
        if let Some(allowed) = shared.environments.get(&agent)
            && !allowed.contains(&environment)
        {
            let allowed: Vec<&str> = allowed.iter().map(|e| e.as_str()).collect();
            shared
                .metrics
                .observe_call(tool, Outcome::Rejected, started.elapsed());
            self.record::<T>(&agent, environment, None, NOT_PERMITTED);
            return (
                Outcome::Rejected,
                CallToolResult::error(vec![ContentBlock::text(format!(
                    "agent {agent} may not target the {environment} environment: its API key allows \
                 only {}; call again with one of those, or ask an operator to extend the key's \
                 environments",
                    allowed.join(", ")
                ))]),
            );
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
            return (
                Outcome::Throttled,
                CallToolResult::error(vec![ContentBlock::text(format!(
                    "agent {agent} already has {max} calls in flight, the most this server allows at \
                 a time: wait for one of them to finish, then retry this call"
                ))]),
            );
        };
        tracing::info!(backend = shared.backend.name(), %environment, "tool call");
        let (progress, output, forwarder) = progress_forwarder(reporter);
        // Notifications go out while the run goes on (and while it waits for an approval); the
        // forwarder ends once the backend has dropped the progress function, so they all
        // precede the result (on Streamable HTTP the response closes the request's stream).
        let (result, ()) = tokio::join!(
            shared.backend.call::<T>(
                &agent,
                call.clone(),
                progress,
                output,
                cancel,
                approval_wait
            ),
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
                let attachments = T::attachments(&output);
                // Embedded, this process keeps the files for their agent to read again as
                // resources; a cluster keeps them in the run's status.
                if let crate::backend::Backend::Local(_) = shared.backend {
                    shared.run_files.keep(&agent, &run_name, &attachments);
                }
                (Outcome::of(phase), tool_result(value, text, attachments))
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
        let elapsed = started.elapsed();
        // One line per answered call, with the span's tool, agent and run: how long the server
        // took, from the request to the answer (what a client measures beyond it is its own
        // network and CPU).
        tracing::info!(
            outcome = outcome.as_str(),
            elapsed_ms = elapsed.as_millis() as u64,
            "tool call answered"
        );
        shared.metrics.observe_call(tool, outcome, elapsed);
        (outcome, tool_result)
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
/// The call's attachments (the files its run returned, a note on those left out) follow as one
/// content block each, in order.
pub fn tool_result(
    output: Value,
    error_text: Option<String>,
    attachments: Vec<Attachment>,
) -> CallToolResult {
    let mut result = match error_text {
        None => CallToolResult::structured(output),
        Some(text) => {
            let mut result = CallToolResult::structured_error(output);
            result.content.insert(0, ContentBlock::text(text));
            result
        }
    };
    result
        .content
        .extend(attachments.into_iter().map(attachment_block));
    result
}

/// The content block of one attachment: an image as image content, a text file as an embedded
/// text resource, any other file as an embedded blob resource (both named
/// `file:///tmp/outputs/NAME`), a note as text. The last check before a client: image content
/// only for the raster image the bytes are (never SVG or anything a client would run), text
/// only with an inert text type, other bytes as `application/octet-stream`.
pub fn attachment_block(attachment: Attachment) -> ContentBlock {
    let blob = |name: &str, data: &[u8]| {
        ContentBlock::resource(
            ResourceContents::blob(BASE64.encode(data), Attachment::uri(name))
                .with_mime_type("application/octet-stream"),
        )
    };
    match attachment {
        Attachment::Image {
            name,
            mime_type,
            data,
        } => match files::raster_image_type(&data) {
            Some(image) if image == mime_type => ContentBlock::image(BASE64.encode(data), image),
            _ => blob(&name, &data),
        },
        Attachment::Text {
            name,
            mime_type,
            text,
        } => ContentBlock::resource(
            ResourceContents::text(text, Attachment::uri(&name))
                .with_mime_type(files::inert_text_type(&mime_type)),
        ),
        Attachment::Binary { name, data, .. } => blob(&name, &data),
        Attachment::Note(text) => ContentBlock::text(text),
    }
}

/// What the forwarder sends, in the order it happened.
enum Note {
    Phase(Phase, String, Option<String>),
    Output(OutputChunk),
}

/// Turns backend phases, and the output a run prints while it runs, into notifications on the
/// request, or into the status message of the call's task. On a request, output goes as
/// `notifications/message` when the client asked for log messages at its level (`logging.rs`),
/// else as `notifications/progress`; phases go as progress; progress needs a progress token.
/// What nothing would carry is not collected. Notifications go out in order from one task; the
/// returned future ends once the backend has dropped both functions and everything queued was
/// sent.
fn progress_forwarder(
    reporter: Reporter,
) -> (
    ProgressFn,
    Option<OutputFn>,
    impl Future<Output = ()> + use<>,
) {
    let collect = match &reporter {
        Reporter::Request { token, log, .. } => token.is_some() || log.is_some(),
        Reporter::Task(_) => true,
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<Note>();
    let (progress, output): (ProgressFn, Option<OutputFn>) = if collect {
        let out = tx.clone();
        (
            Arc::new(move |phase, run, detail| {
                let _ = tx.send(Note::Phase(
                    phase,
                    run.to_owned(),
                    detail.map(str::to_owned),
                ));
            }),
            Some(Arc::new(move |chunk| {
                let _ = out.send(Note::Output(chunk));
            })),
        )
    } else {
        (Arc::new(|_, _, _| {}), None)
    };
    let forward = async move {
        let mut step = 0.0;
        // The run's name, once a phase has named it: the logger of its output's log messages.
        let mut run_name: Option<String> = None;
        while let Some(note) = rx.recv().await {
            if let (
                Reporter::Request {
                    peer,
                    log: Some(threshold),
                    ..
                },
                Note::Output(chunk),
            ) = (&reporter, &note)
            {
                let level = output_level(chunk);
                if crate::logging::passes(level, *threshold) {
                    let message = output_log_message(chunk, level, run_name.as_deref());
                    crate::logging::send(peer, message).await;
                    continue;
                }
            }
            let message = match note {
                Note::Phase(phase, run, detail) => {
                    let message = progress_message(phase, &run, detail.as_deref());
                    run_name = Some(run);
                    message
                }
                Note::Output(chunk) => Some(output_message(&chunk)),
            };
            let Some(message) = message else { continue };
            match &reporter {
                Reporter::Request {
                    peer,
                    token: Some(token),
                    ..
                } => {
                    step += 1.0;
                    let param =
                        ProgressNotificationParam::new(token.clone(), step).with_message(message);
                    if let Err(e) = peer.notify_progress(param).await {
                        tracing::debug!(error = %e, "could not send progress notification");
                    }
                }
                Reporter::Request { token: None, .. } => {}
                // The latest message is the task's status: a phase, or the last line printed.
                Reporter::Task(status) => {
                    let line = message.strip_suffix('\n').unwrap_or(&message);
                    status.send_replace(line.to_owned());
                }
            }
        }
    };
    (progress, output, forward)
}

/// The log level of output printed while the code runs: standard error is where programs
/// report what went wrong, so a client that asked for warnings only still sees it.
#[allow(deprecated)] // SEP-2577 deprecates logging; see logging.rs
fn output_level(chunk: &OutputChunk) -> LoggingLevel {
    match chunk.stream {
        Stream::Stdout => LoggingLevel::Info,
        Stream::Stderr => LoggingLevel::Warning,
    }
}

/// The log message of output printed while the code runs: the stream and the text as printed,
/// logged under the run's name when a phase has named it.
#[allow(deprecated)] // SEP-2577 deprecates logging; see logging.rs
fn output_log_message(
    chunk: &OutputChunk,
    level: LoggingLevel,
    run: Option<&str>,
) -> LoggingMessageNotificationParam {
    let data = serde_json::json!({ "stream": chunk.stream.as_str(), "text": chunk.text });
    LoggingMessageNotificationParam::new(level, data).with_logger(run.unwrap_or("sandboxrun"))
}

/// The progress message of output printed while the code runs: the stream, then the text as
/// printed (clients show progress messages as they come; the result holds all of it again).
fn output_message(chunk: &OutputChunk) -> String {
    format!("{}: {}", chunk.stream.as_str(), chunk.text)
}

/// The progress message of a phase: the phase first (clients may match on it), then what it
/// means; an approval names the run a person has to approve.
fn progress_message(phase: Phase, run: &str, detail: Option<&str>) -> Option<String> {
    Some(match phase {
        // The operator's word on a run waiting for a sandbox: its place, its expected wait.
        Phase::Pending => match detail {
            Some(detail) => format!("Pending: {detail}"),
            None => "Pending: preparing the sandbox".to_owned(),
        },
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
        let m = progress_message(Phase::AwaitingApproval, "run-x7k2q", None).unwrap();
        // Clients match on the phase first, then find the run a person must approve.
        assert!(m.starts_with("AwaitingApproval: run-x7k2q "), "{m}");
        assert!(m.contains("spec.approval.approved"), "{m}");
        assert!(
            progress_message(Phase::Pending, "run-x", None)
                .unwrap()
                .starts_with("Pending: ")
        );
        assert_eq!(progress_message(Phase::Succeeded, "run-x", None), None);
        // A run waiting for a sandbox: the operator's word on its place.
        let queued = "waiting for a sandbox: the namespace's quota or its nodes have no room for another one; number 3 in the queue";
        assert_eq!(
            progress_message(Phase::Pending, "run-x", Some(queued)).unwrap(),
            format!("Pending: {queued}")
        );
    }

    #[test]
    fn errors_lead_with_the_sentence_and_keep_the_structure() {
        let result = tool_result(serde_json::json!({"x": 1}), Some("why".into()), vec![]);
        assert_eq!(result.is_error, Some(true));
        assert_eq!(result.structured_content, Some(serde_json::json!({"x": 1})));
        assert_eq!(result.content[0].as_text().unwrap().text, "why");
        let ok = tool_result(serde_json::json!({"x": 1}), None, vec![]);
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
            files: Vec::new(),
            files_omitted: Vec::new(),
            not_run: None,
            call: None,
            session: None,
        };
        let limits = sandboxrun_core::Limits::default();
        let out = |e: &RunnerResult| {
            PythonOutput::from_classified(
                "local-1".into(),
                classify(
                    Some(e),
                    &Observed::default(),
                    &limits,
                    sandboxrun_core::files::FileCaps::default(),
                ),
                0,
            )
        };
        let failed = out(&envelope);
        let r = tool_result(
            serde_json::to_value(&failed).unwrap(),
            failed.error_text(30, 600),
            vec![],
        );
        assert_eq!(r.is_error, Some(true));
        assert_eq!(r.structured_content.as_ref().unwrap()["exitCode"], 3);
        let first = serde_json::to_value(&r.content[0]).unwrap();
        assert_eq!(first["text"], "the code exited with status 3; stderr: boom");
        let ok = out(&RunnerResult {
            exit_code: 0,
            ..envelope
        });
        let r = tool_result(
            serde_json::to_value(&ok).unwrap(),
            ok.error_text(30, 600),
            vec![],
        );
        assert_eq!(r.is_error, Some(false));
        assert_eq!(r.content.len(), 1);
    }

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    fn attachments() -> Vec<Attachment> {
        vec![
            Attachment::Image {
                name: "chart.png".into(),
                mime_type: "image/png".into(),
                data: PNG.to_vec(),
            },
            Attachment::Text {
                name: "totals.csv".into(),
                mime_type: "text/csv".into(),
                text: "region,total\nnorth,12\n".into(),
            },
            Attachment::Binary {
                name: "model.bin".into(),
                mime_type: "application/octet-stream".into(),
                data: vec![0, 159, 146, 150, 255],
            },
            Attachment::Note("1 file(s) in /tmp/outputs were not returned: x".into()),
        ]
    }

    #[test]
    fn attachments_follow_the_structured_output_as_their_kind_of_block() {
        let output = serde_json::json!({"stdout": "ok\n", "files": [{"name": "chart.png"}]});
        let r = tool_result(output.clone(), None, attachments());
        assert_eq!(r.is_error, Some(false));
        // structuredContent unchanged, the same JSON as text first.
        assert_eq!(r.structured_content, Some(output.clone()));
        let blocks: Vec<Value> = r
            .content
            .iter()
            .map(|b| serde_json::to_value(b).unwrap())
            .collect();
        assert_eq!(blocks.len(), 5, "{blocks:?}");
        assert_eq!(blocks[0]["type"], "text");
        assert_eq!(
            serde_json::from_str::<Value>(blocks[0]["text"].as_str().unwrap()).unwrap(),
            output
        );
        // The wire forms of the MCP specification (2025-11-25 ContentBlock).
        assert_eq!(
            blocks[1],
            serde_json::json!({
                "type": "image",
                "data": BASE64.encode(PNG),
                "mimeType": "image/png",
            })
        );
        assert_eq!(
            blocks[2],
            serde_json::json!({
                "type": "resource",
                "resource": {
                    "uri": "file:///tmp/outputs/totals.csv",
                    "mimeType": "text/csv",
                    "text": "region,total\nnorth,12\n",
                },
            })
        );
        assert_eq!(
            blocks[3],
            serde_json::json!({
                "type": "resource",
                "resource": {
                    "uri": "file:///tmp/outputs/model.bin",
                    "mimeType": "application/octet-stream",
                    "blob": "AJ+Slv8=",
                },
            })
        );
        assert_eq!(
            blocks[4],
            serde_json::json!({
                "type": "text",
                "text": "1 file(s) in /tmp/outputs were not returned: x",
            })
        );
    }

    #[test]
    fn an_error_keeps_its_sentence_first_then_the_attachments() {
        let r = tool_result(
            serde_json::json!({"exitCode": 1}),
            Some("the code exited with status 1".into()),
            attachments(),
        );
        assert_eq!(r.is_error, Some(true));
        assert_eq!(
            r.content[0].as_text().unwrap().text,
            "the code exited with status 1"
        );
        assert!(r.content[1].as_text().is_some());
        let image = r.content[2].as_image().expect("the image third");
        assert_eq!(BASE64.decode(&image.data).unwrap(), PNG);
        assert!(r.content[3].as_resource().is_some());
        assert!(r.content[4].as_resource().is_some());
        assert_eq!(r.content.len(), 6);
    }

    #[test]
    fn only_raster_images_become_image_blocks_and_active_types_never_leave() {
        let svg = b"<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>".to_vec();
        let block = |a: Attachment| serde_json::to_value(attachment_block(a)).unwrap();
        // Declared as images but not one: opaque bytes.
        for (mime, data) in [
            ("image/svg+xml", svg.clone()),
            ("image/png", svg.clone()),
            ("image/png", b"GIF89a....".to_vec()),
            ("text/html", PNG.to_vec()),
        ] {
            let b = block(Attachment::Image {
                name: "x.png".into(),
                mime_type: mime.into(),
                data,
            });
            assert_eq!(b["type"], "resource", "{mime}: {b}");
            assert_eq!(b["resource"]["mimeType"], "application/octet-stream");
        }
        // Text with an active type: plain text.
        for mime in [
            "text/html",
            "image/svg+xml",
            "application/xhtml+xml",
            "text/javascript",
        ] {
            let b = block(Attachment::Text {
                name: "x.svg".into(),
                mime_type: mime.into(),
                text: String::from_utf8(svg.clone()).unwrap(),
            });
            assert_eq!(b["resource"]["mimeType"], "text/plain", "{mime}");
        }
        let b = block(Attachment::Binary {
            name: "x.html".into(),
            mime_type: "text/html".into(),
            data: vec![0xff, 0xfe],
        });
        assert_eq!(b["resource"]["mimeType"], "application/octet-stream");
        // A real file through the whole path: an SVG (even named .png) comes back as text.
        use sandboxrun_core::files::OutputFile;
        for name in ["plot.svg", "plot.png", "page.html"] {
            let file = OutputFile::new(name.into(), svg.clone());
            let b = block(Attachment::of(&file));
            assert_eq!(b["type"], "resource", "{name}");
            assert_eq!(b["resource"]["mimeType"], "text/plain", "{name}");
            assert_eq!(
                b["resource"]["text"],
                String::from_utf8(svg.clone()).unwrap()
            );
        }
    }

    #[test]
    fn a_python_output_with_files_becomes_blocks() {
        use sandboxrun_core::files::{OmitReason, OmittedFile, OutputFile};
        use sandboxrun_core::tools::ToolSpec;
        use sandboxrun_core::tools::python::RunPython;
        let mut output = PythonOutput::rejected(
            "local-1".into(),
            sandboxrun_core::Reason::PolicyBlocked,
            "x".into(),
        );
        output.files = vec![
            OutputFile::new("chart.png".into(), PNG.to_vec()),
            OutputFile::new("out.csv".into(), b"a,b\n1,2\n".to_vec()),
            OutputFile::new("blob.dat".into(), vec![1, 2, 3]),
        ];
        output.files_omitted = vec![OmittedFile {
            name: "link".into(),
            size: None,
            reason: OmitReason::NotARegularFile,
        }];
        let value = serde_json::to_value(&output).unwrap();
        // The structured output lists the files without their bytes.
        assert_eq!(
            value["files"],
            serde_json::json!([
                {"name": "chart.png", "mimeType": "image/png", "size": PNG.len()},
                {"name": "out.csv", "mimeType": "text/csv", "size": 8},
                {"name": "blob.dat", "mimeType": "application/octet-stream", "size": 3},
            ])
        );
        let r = tool_result(value, None, RunPython::attachments(&output));
        let kinds: Vec<Value> = r
            .content
            .iter()
            .map(|b| serde_json::to_value(b).unwrap()["type"].clone())
            .collect();
        assert_eq!(
            kinds,
            ["text", "image", "resource", "resource", "text"].map(Value::from)
        );
        let note = &r.content[4].as_text().unwrap().text;
        assert!(note.contains("link (notARegularFile)"), "{note}");
    }
}

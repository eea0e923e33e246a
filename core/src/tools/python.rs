//! `run_python`: a Python 3 program run once in a single-use sandbox.
//!
//! This module is the tool: its arguments and their validation ([`parse_args`]), the call
//! ([`PythonCall`]), the result agents see ([`PythonOutput`]) and the words a model reads about a
//! failure ([`PythonOutput::error_text`]), and [`classify`], the one place that says how a run
//! ended from what the runner reported ([`RunnerResult`]) and what the platform saw
//! ([`Observed`]). The operator classifies a sandbox Pod with it and the embedded mode a local
//! sandbox, so both report the same phase and reason for the same end.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::args::{json_kind, unknown_argument};
pub use super::python_session::SessionArg;
use super::{Attachment, CallSummary, Embedded, JsonObject, ParseContext, ToolSpec};
use crate::files::{
    FileCaps, InputFile, MAX_INPUT_FILES, MAX_NAME_BYTES, OmittedFile, OutputFile, Profile,
    check_inputs, check_name, input_bytes, omitted_note,
};
use crate::limits::STATUS_OUTPUT_BUDGET_BYTES;
use crate::limits::{Limits, MAX_CODE_BYTES, MAX_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS};
use crate::model::{Environment, Phase, Reason, Tool, Verdict};
use crate::output::{cap_str, fit_json_budget};
use crate::policy::CallContext;
use crate::policy::{PythonRequest, SessionUse};
use crate::runner::Program;
use crate::runner::{NotRun, NotRunReason, Observed, RunnerResult};

/// How much of stderr the error text quotes: enough for a traceback's last frames, short
/// enough not to drown the message (the full stderr is in `structuredContent`).
const STDERR_TAIL_CHARS: usize = 2_000;
/// Most bytes of the platform's own output quoted in a NoResult message.
const DETAIL_TAIL_BYTES: usize = 1024;

/// The `run_python` tool.
pub struct RunPython;

/// Arguments of `run_python` (the tool's `inputSchema`). The tool parses the raw arguments
/// itself (see [`parse_args`]) so each mistake gets its own actionable message.
#[derive(Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::portable)]
pub struct RunPythonArgs {
    /// Python 3 source code to run, as a complete program (at most 262144 bytes). Print the
    /// results you need: stdout, stderr and the exit code are returned.
    #[schemars(length(min = 1, max = MAX_CODE_BYTES))]
    pub code: String,
    /// Wall-clock limit in seconds (default 30). The run is stopped and reported as TimedOut
    /// past it.
    // Optional, not nullable: `["integer", "null"]` types trip single-type schema dialects.
    #[serde(default)]
    #[schemars(with = "u32", range(min = MIN_TIMEOUT_SECONDS, max = MAX_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<u32>,
    /// The sandbox image: `minimal` (the standard library only, the default) or `data` (numpy,
    /// pandas, scipy, matplotlib with the Agg backend), as the server's policy allows.
    #[serde(default)]
    #[schemars(with = "Profile")]
    pub profile: Option<Profile>,
    /// Input files, placed read-only in /tmp/inputs before the code runs (at most 20 files and
    /// 256 KiB together, or fewer as the server's policy says). Each has a `name` (letters,
    /// digits, '.', '_', '-') and either `text` (UTF-8) or `base64` content.
    #[serde(default)]
    #[schemars(with = "Vec<InputFileArg>", length(max = MAX_INPUT_FILES))]
    pub files: Option<Vec<InputFile>>,
    /// Keep state between calls: `"new"` starts a session (its id comes back as `session`),
    /// the id of one of your open sessions runs the code in it, with the variables, imports and
    /// files earlier calls left (one call at a time; threads and processes a call starts end with
    /// it). Absent: a fresh sandbox for this call alone. End a session with `close_session`.
    #[serde(default)]
    #[schemars(with = "String", length(min = 1, max = 63))]
    pub session: Option<SessionArg>,
}

/// One input file as agents pass it.
#[derive(Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::portable)]
pub struct InputFileArg {
    /// The file's name in /tmp/inputs: letters, digits, '.', '_' and '-' (for example
    /// `sales.csv`).
    #[schemars(length(min = 1, max = MAX_NAME_BYTES))]
    pub name: String,
    /// The content as text (UTF-8); give this or `base64`.
    #[serde(default)]
    #[schemars(with = "String")]
    pub text: Option<String>,
    /// The content in base64, for binary files; give this or `text`.
    #[serde(default)]
    #[schemars(with = "String")]
    pub base64: Option<String>,
}

/// A validated `run_python` call: the code and the limits it asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonCall {
    /// The Python source.
    pub code: String,
    /// The sandbox profile.
    pub profile: Profile,
    /// The input files.
    pub files: Vec<InputFile>,
    /// The limits of the run (the server's defaults with the caller's timeout).
    pub limits: Limits,
    /// The largest timeout the caller could have asked for, for the timeout advice.
    pub max_timeout_seconds: u32,
    /// The session the call runs in, if any.
    pub session: Option<SessionArg>,
}

impl PythonCall {
    /// What policy looks at to judge this call, made by `agent` (embedded runs are the
    /// sandbox's).
    pub fn context(&self, agent: &str) -> CallContext {
        call_context(
            agent,
            Environment::Sandbox,
            self.limits.clone(),
            self.profile,
            &self.files,
            self.session.as_ref().map(SessionArg::usage),
        )
    }
}

/// What policy sees of a python call: who asks, in which environment, with which limits, for
/// which sandbox profile and how many input bytes. The one builder of a python call's context:
/// the embedded server and the operator both judge through it.
pub fn call_context(
    agent: &str,
    environment: Environment,
    limits: Limits,
    profile: Profile,
    files: &[InputFile],
    session: Option<SessionUse>,
) -> CallContext {
    let mut context = CallContext::new(agent, Tool::Python, environment);
    context.limits = limits;
    context.python = Some(PythonRequest {
        profile,
        input_files: u32::try_from(files.len()).unwrap_or(u32::MAX),
        input_bytes: input_bytes(files),
        session,
    });
    context
}

/// Validates the raw arguments of `run_python`: returns the code and the requested timeout, or
/// a message that says exactly what to fix.
pub fn parse_args(args: &JsonObject, max_timeout: u32) -> Result<RunPythonArgs, String> {
    const EXAMPLE: &str = r#"for example {"code": "print(6*7)"}"#;
    if let Some(unknown) = unknown_argument(
        args,
        &["code", "timeoutSeconds", "profile", "files", "session"],
    ) {
        return Err(format!(
            "unknown argument `{unknown}`; run_python accepts `code` (string, required), \
             `timeoutSeconds` (integer), `profile` (\"minimal\" or \"data\"), `files` (a \
             list of {{\"name\", \"text\" or \"base64\"}}) and `session` (\"new\" or a session \
             id)"
        ));
    }
    let code = match args.get("code") {
        None | Some(Value::Null) => {
            return Err(format!(
                "missing required argument `code`: pass the Python source to run as a string, \
                 {EXAMPLE}"
            ));
        }
        Some(Value::String(code)) => code,
        Some(other) => {
            return Err(format!(
                "argument `code` must be a string of Python source, not {}; {EXAMPLE}",
                json_kind(other)
            ));
        }
    };
    if code.trim().is_empty() {
        return Err(format!(
            "argument `code` is empty: pass the Python source to run, {EXAMPLE}"
        ));
    }
    if code.len() > MAX_CODE_BYTES as usize {
        return Err(format!(
            "argument `code` is {} bytes; the limit is {MAX_CODE_BYTES} bytes (256 KiB): send \
             shorter code, or generate large data inside the program instead of embedding it",
            code.len()
        ));
    }
    let range = format!("an integer number of seconds from {MIN_TIMEOUT_SECONDS} to {max_timeout}");
    let timeout = match args.get("timeoutSeconds") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(t) if (u64::from(MIN_TIMEOUT_SECONDS)..=u64::from(max_timeout)).contains(&t) => {
                u32::try_from(t).ok()
            }
            _ => {
                return Err(format!(
                    "argument `timeoutSeconds` is {n}; it must be {range}"
                ));
            }
        },
        Some(other) => {
            return Err(format!(
                "argument `timeoutSeconds` must be {range}, not {}",
                json_kind(other)
            ));
        }
    };
    let profile = match args.get("profile") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) => Some(Profile::parse(p).ok_or_else(|| {
            format!("argument `profile` is {p:?}; it must be \"minimal\" (the standard library) or \"data\" (numpy, pandas, scipy, matplotlib)")
        })?),
        Some(other) => {
            return Err(format!(
                "argument `profile` must be the string \"minimal\" or \"data\", not {}",
                json_kind(other)
            ));
        }
    };
    let files = match args.get("files") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(parse_files(items)?),
        Some(other) => {
            return Err(format!(
                "argument `files` must be a list of {{\"name\": ..., \"text\": ...}} objects, not {}",
                json_kind(other)
            ));
        }
    };
    let session = match args.get("session") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(SessionArg::parse(s)?),
        Some(other) => {
            return Err(format!(
                "argument `session` must be the string \"new\" or a session id from an earlier \
                 result, not {}",
                json_kind(other)
            ));
        }
    };
    Ok(RunPythonArgs {
        code: code.clone(),
        timeout_seconds: timeout,
        profile,
        files,
        session,
    })
}

/// The `files` argument: each item a name with text or base64 content, checked against the
/// global bounds (a policy rule may set lower ones).
fn parse_files(items: &[Value]) -> Result<Vec<InputFile>, String> {
    const EXAMPLE: &str = r#"for example {"name": "data.csv", "text": "a,b\n1,2\n"}"#;
    if items.len() > MAX_INPUT_FILES as usize {
        return Err(format!(
            "argument `files` has {} files; at most {MAX_INPUT_FILES} are allowed: combine them",
            items.len()
        ));
    }
    let mut files = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(o) = item else {
            return Err(format!(
                "files[{i}] must be an object with `name` and `text` or `base64`, not {}; {EXAMPLE}",
                json_kind(item)
            ));
        };
        if let Some(unknown) = unknown_argument(o, &["name", "text", "base64"]) {
            return Err(format!(
                "files[{i}] has the unknown field `{unknown}`; a file has `name` and `text` or \
                 `base64`"
            ));
        }
        let Some(Value::String(name)) = o.get("name") else {
            return Err(format!("files[{i}] needs a `name` string; {EXAMPLE}"));
        };
        check_name(name).map_err(|e| format!("files[{i}] has the name {name:?}: {e}"))?;
        let content = match (o.get("text"), o.get("base64")) {
            (Some(Value::String(t)), None) => t.clone().into_bytes(),
            (None, Some(Value::String(b))) => BASE64.decode(b.trim().as_bytes()).map_err(|e| {
                format!("files[{i}] ({name}) has `base64` that is not valid base64: {e}")
            })?,
            (Some(_), Some(_)) => {
                return Err(format!(
                    "files[{i}] ({name}) has both `text` and `base64`; give one"
                ));
            }
            _ => {
                return Err(format!(
                    "files[{i}] ({name}) needs its content as a `text` or `base64` string; {EXAMPLE}"
                ));
            }
        };
        files.push(InputFile {
            name: name.clone(),
            content,
        });
    }
    check_inputs(&files).map_err(|e| format!("argument `files`: {e}"))?;
    Ok(files)
}

/// The result of one `run_python` call (the tool's `outputSchema`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::portable)]
pub struct PythonOutput {
    /// Standard output of the code (capped; see `truncated`).
    pub stdout: String,
    /// Standard error of the code (capped; see `truncated`).
    pub stderr: String,
    /// Exit status of the code: 128 + signal number when a signal killed it; absent when the
    /// code never ran (rejected) or no status was recorded.
    // Optional rather than nullable, for schema dialects with one `type` per property.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "i32")]
    pub exit_code: Option<i32>,
    /// Whether stdout or stderr was cut at the output cap.
    pub truncated: bool,
    /// Execution time in milliseconds.
    pub duration_ms: u64,
    /// The run's name: the SandboxRun's name (cluster) or a generated id (embedded).
    pub run_name: String,
    /// Terminal phase: Succeeded, Failed, TimedOut or Rejected.
    pub phase: Phase,
    /// Machine-readable reason of the phase (for example `OOMKilled`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub reason: Option<String>,
    /// Human-readable explanation from the run; used in the error text only.
    #[serde(skip)]
    #[schemars(skip)]
    pub message: Option<String>,
    /// The files the code wrote in /tmp/outputs, returned as content blocks (raster images as
    /// images, text, including SVG and HTML as plain text, as embedded resources, anything else
    /// as base64 resources).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<OutputFile>,
    /// Files it wrote there that were not returned, and why (a cap, not a regular file, a name
    /// that is not a plain file name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_omitted: Vec<OmittedFile>,
    /// A call refused for capacity (reason `NoCapacity`: no sandbox could start it in time):
    /// after how many seconds a new call may expect one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u32")]
    pub retry_after_seconds: Option<u32>,
    /// The session the call ran in (the id to pass as `session` next time), when it used one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub session: Option<String>,
    /// Why the session ended with this call (a timeout, code that ended the interpreter), when
    /// it did: its state is gone, and a new call needs `session: "new"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub session_ended: Option<String>,
}

impl PythonOutput {
    /// Whether the agent should see this result as a tool error (`isError: true`).
    pub fn is_error(&self) -> bool {
        self.phase != Phase::Succeeded
    }

    /// The output of a classified run.
    pub fn from_classified(run_name: String, c: Classified, fallback_duration_ms: u64) -> Self {
        Self {
            stdout: c.stdout,
            stderr: c.stderr,
            exit_code: c.exit_code,
            truncated: c.truncated,
            duration_ms: c.duration_millis.unwrap_or(fallback_duration_ms),
            run_name,
            phase: c.phase,
            reason: Some(c.reason.as_str().to_owned()).filter(|_| c.phase != Phase::Succeeded),
            message: Some(c.message),
            files: c.files,
            files_omitted: c.files_omitted,
            retry_after_seconds: None,
            session: None,
            session_ended: None,
        }
    }

    /// The output of a run refused before anything executed.
    pub fn rejected(run_name: String, reason: Reason, message: String) -> Self {
        Self {
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            truncated: false,
            duration_ms: 0,
            run_name,
            phase: Phase::Rejected,
            reason: Some(reason.as_str().to_owned()),
            message: Some(message),
            files: Vec::new(),
            files_omitted: Vec::new(),
            retry_after_seconds: None,
            session: None,
            session_ended: None,
        }
    }

    fn has_reason(&self, reason: Reason) -> bool {
        self.reason.as_deref() == Some(reason.as_str())
    }

    /// Text a model can act on for a result that is not a success; `None` for a success.
    /// `timeout_seconds` is the run's budget and `max_timeout_seconds` the server's maximum, so
    /// a timeout message can say what to change.
    pub fn error_text(&self, timeout_seconds: u32, max_timeout_seconds: u32) -> Option<String> {
        let detail = |fallback: &str| {
            self.message
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| fallback.to_owned())
        };
        let text = match self.phase {
            Phase::Succeeded => return None,
            Phase::TimedOut => format!(
                "the code did not finish within its {timeout_seconds}s timeout and was stopped; \
                 make it faster, print partial results early, or pass a larger timeoutSeconds \
                 (at most {max_timeout_seconds}){}",
                self.stdout_hint()
            ),
            Phase::Rejected => format!(
                "the run was rejected ({}) and nothing was executed: {}",
                self.reason.as_deref().unwrap_or("Rejected"),
                detail("no reason was given")
            ),
            Phase::Failed if self.has_reason(Reason::OomKilled) => format!(
                "{}; use less memory (process data in chunks, avoid building huge lists){}",
                detail("the code was killed for exceeding its memory limit"),
                self.stderr_hint()
            ),
            Phase::Failed => match self.exit_code {
                // The classification words exits and signal deaths (see `classify`).
                Some(code) if self.has_reason(Reason::NonZeroExit) => format!(
                    "{}{}",
                    detail(&format!("the code exited with status {code}")),
                    self.stderr_hint()
                ),
                Some(code) => format!("the code exited with status {code}{}", self.stderr_hint()),
                None => format!(
                    "the run failed ({}): {}",
                    self.reason.as_deref().unwrap_or("Failed"),
                    detail("no result was recorded")
                ),
            },
            // A person (or another client of the same run) stopped it; the caller itself is gone.
            Phase::Cancelled => format!(
                "the run was cancelled before it finished: {}{}",
                detail("spec.cancelled was set"),
                self.stdout_hint()
            ),
            // Non-terminal phases never reach the agent; say so rather than panic.
            other => format!("the run ended in the unexpected phase {other}"),
        };
        Some(match &self.session_ended {
            Some(why) => format!(
                "{text}. The session ended with this call ({why}): its variables and files are \
                 gone; pass session \"new\" to start another"
            ),
            None => text,
        })
    }

    fn stderr_hint(&self) -> String {
        let stderr = self.stderr.trim_end();
        if stderr.is_empty() {
            return " and printed nothing to stderr".to_owned();
        }
        let chars = stderr.chars().count();
        let tail: String = if chars > STDERR_TAIL_CHARS {
            let skip = chars - STDERR_TAIL_CHARS;
            format!("...{}", stderr.chars().skip(skip).collect::<String>())
        } else {
            stderr.to_owned()
        };
        format!("; stderr: {tail}")
    }

    fn stdout_hint(&self) -> String {
        if self.stdout.is_empty() {
            String::new()
        } else {
            "; the output printed before the stop is in stdout".to_owned()
        }
    }
}

/// How a run ended: the one classification of a sandbox's end, with its output capped for the
/// status (see [`classify`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classified {
    /// Succeeded, Failed or TimedOut.
    pub phase: Phase,
    /// Why.
    pub reason: Reason,
    /// For people and for the model that called the tool.
    pub message: String,
    /// The code's exit status, when the runner reported one.
    pub exit_code: Option<i32>,
    /// Captured stdout, capped.
    pub stdout: String,
    /// Captured stderr, capped.
    pub stderr: String,
    /// Whether output was cut.
    pub truncated: bool,
    /// The code's run time measured by the runner.
    pub duration_millis: Option<u64>,
    /// The files it returned, within the run's caps.
    pub files: Vec<OutputFile>,
    /// The files it wrote that were left out, and why.
    pub files_omitted: Vec<OmittedFile>,
}

impl Classified {
    /// A run that reported nothing of its own: no exit status, no output, no files.
    fn without_output(phase: Phase, reason: Reason, message: String) -> Self {
        Self {
            phase,
            reason,
            message,
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            truncated: false,
            duration_millis: None,
            files: Vec::new(),
            files_omitted: Vec::new(),
        }
    }
}

/// Says how a run ended, from the runner's envelope (`None` when none could be read) and what
/// the platform saw. The rules, in order:
///
/// - with an envelope: the runner's timeout is `TimedOut`/`DeadlineExceeded`; exit 0 is
///   `Succeeded`; a SIGKILL the runner did not send is `OOMKilled` unless the memory cgroup
///   says it was no OOM kill (inside a sandbox nothing else sends SIGKILL; code that kills
///   itself so is reported the same); another signal, or a non-zero exit, is `NonZeroExit`;
/// - without one: an OOM kill the platform saw is `OOMKilled`, the platform's deadline
///   `TimedOut`, anything else `NoResult`, quoting what the platform saw;
/// - an OOM kill the platform reports turns any other failure into `OOMKilled` (the kubelet
///   or the cgroup saw the sandbox run out of memory, whatever the runner made of it); a success
///   or the runner's own timeout stands (a child process killed for memory inside a program
///   that handled it and exited 0 is that program's business).
///
/// Output is capped at `limits.outputBytes` per stream and, together, within the status budget;
/// returned files within `files` ([`crate::files::collect`]).
pub fn classify(
    envelope: Option<&RunnerResult>,
    seen: &Observed,
    limits: &Limits,
    files: FileCaps,
) -> Classified {
    let mut c = match envelope {
        Some(r) => from_envelope(r, seen, limits),
        None => without_envelope(seen),
    };
    if let Some(r) = envelope.filter(|r| r.not_run.is_none()) {
        (c.files, c.files_omitted) = crate::files::collect(&r.files, &r.files_omitted, files);
    }
    if seen.oom_killed == Some(true) && c.phase == Phase::Failed {
        c.phase = Phase::Failed;
        c.reason = Reason::OomKilled;
        c.message = format!(
            "the sandbox exceeded its memory limit of {} and was killed",
            limits.memory
        );
    }
    c
}

fn from_envelope(r: &RunnerResult, seen: &Observed, limits: &Limits) -> Classified {
    if let Some(not_run) = &r.not_run {
        return never_ran(not_run);
    }
    // The runner already capped each stream; cap again (a runner from another image version
    // must not be able to grow the status) and keep the encoded total within the status budget.
    let cap = limits.output_bytes as usize;
    let (out, err) = (cap_str(&r.stdout, cap), cap_str(&r.stderr, cap));
    let (out_fit, err_fit) = fit_json_budget(&out.text, &err.text, STATUS_OUTPUT_BUDGET_BYTES);
    let truncated =
        r.truncated() || out.truncated || err.truncated || out_fit.truncated || err_fit.truncated;
    let sigkill_oom = r.oom_kill.or(seen.oom_killed) != Some(false);
    let (phase, reason, message) = if r.timed_out {
        (
            Phase::TimedOut,
            Reason::DeadlineExceeded,
            format!(
                "the code ran longer than its timeout of {}s and was stopped",
                limits.timeout_seconds
            ),
        )
    } else if r.exit_code == 0 {
        (
            Phase::Succeeded,
            Reason::Succeeded,
            "the code exited with status 0".to_owned(),
        )
    } else if r.signal == Some(9) && sigkill_oom {
        (
            Phase::Failed,
            Reason::OomKilled,
            format!(
                "the code was killed by SIGKILL, most likely for exceeding its memory limit of {}",
                limits.memory
            ),
        )
    } else if let Some(sig) = r.signal {
        (
            Phase::Failed,
            Reason::NonZeroExit,
            format!(
                "the code was killed by signal {sig} (exit code {})",
                r.exit_code
            ),
        )
    } else {
        (
            Phase::Failed,
            Reason::NonZeroExit,
            format!("the code exited with status {}", r.exit_code),
        )
    };
    Classified {
        phase,
        reason,
        message,
        exit_code: Some(r.exit_code),
        stdout: out_fit.text,
        stderr: err_fit.text,
        truncated,
        duration_millis: r.duration_millis,
        files: Vec::new(),
        files_omitted: Vec::new(),
    }
}

/// A run whose runner reported that it never started the code: nothing ran, nothing is
/// returned.
fn never_ran(not_run: &NotRun) -> Classified {
    let reason = match not_run.reason {
        NotRunReason::IsolationNotInForce => Reason::IsolationNotInForce,
        // A session's call that never ran: the message says why and what to do.
        NotRunReason::BadProgram | NotRunReason::SessionBroken | NotRunReason::Other => {
            Reason::NoResult
        }
    };
    Classified::without_output(
        Phase::Failed,
        reason,
        cap_str(&not_run.message, DETAIL_TAIL_BYTES).text,
    )
}

fn without_envelope(seen: &Observed) -> Classified {
    let (phase, reason, mut message) = if seen.oom_killed == Some(true) {
        (
            Phase::Failed,
            Reason::OomKilled,
            "the sandbox ran out of memory and was killed".to_owned(),
        )
    } else if seen.deadline_hit {
        (
            Phase::TimedOut,
            Reason::DeadlineExceeded,
            "the sandbox did not finish in time and was killed".to_owned(),
        )
    } else {
        let status = match (seen.exit_code, seen.platform_reason.as_deref()) {
            (Some(code), Some(why)) => format!("exit code {code}, {why}"),
            (Some(code), None) => format!("exit code {code}"),
            (None, Some(why)) => why.to_owned(),
            (None, None) => "no exit status".to_owned(),
        };
        let mut m = format!("the sandbox ended ({status}) without reporting a result");
        if seen.pids_limit_hit {
            // gVisor's Sentry dies when the host refuses it threads for a fork bomb.
            m.push_str(" after reaching its process limit");
        }
        if let Some(e) = &seen.envelope_error {
            m.push_str(": ");
            m.push_str(e);
        }
        (Phase::Failed, Reason::NoResult, m)
    };
    let tail = tail(&seen.detail);
    if reason == Reason::NoResult && !tail.is_empty() {
        message.push_str("; last output: ");
        message.push_str(tail);
    }
    Classified::without_output(phase, reason, message)
}

/// The last [`DETAIL_TAIL_BYTES`] of a text, on a character boundary, trimmed.
fn tail(text: &str) -> &str {
    let mut start = text.len().saturating_sub(DETAIL_TAIL_BYTES);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].trim()
}

impl ToolSpec for RunPython {
    const TOOL: Tool = Tool::Python;
    const INSTRUCTIONS: &'static str = INSTRUCTIONS;
    type Args = RunPythonArgs;
    type Call = PythonCall;
    type Output = PythonOutput;

    fn parse(args: &JsonObject, ctx: &ParseContext) -> Result<PythonCall, String> {
        let max = ctx.max_timeout_seconds;
        let parsed = parse_args(args, max)?;
        let mut limits = ctx.defaults.clone();
        if let Some(t) = parsed.timeout_seconds {
            limits.timeout_seconds = t.clamp(MIN_TIMEOUT_SECONDS, max);
        }
        Ok(PythonCall {
            code: parsed.code,
            profile: parsed.profile.unwrap_or_default(),
            files: parsed.files.unwrap_or_default(),
            limits,
            max_timeout_seconds: max,
            session: parsed.session,
        })
    }

    fn environment(_: &PythonCall) -> Environment {
        Environment::Sandbox
    }

    fn timeout_seconds(call: &PythonCall) -> u32 {
        call.limits.timeout_seconds
    }

    fn summary(output: &PythonOutput) -> CallSummary {
        // A rejection is a block (or an escalation nobody could answer), anything that ran was
        // allowed.
        let verdict = match output.phase {
            Phase::Rejected if output.has_reason(Reason::ApprovalUnavailable) => Verdict::Escalate,
            Phase::Rejected => Verdict::Block,
            Phase::AwaitingApproval => Verdict::Escalate,
            _ => Verdict::Allow,
        };
        CallSummary::of(output.phase, Some(verdict), &output.run_name)
    }

    fn error_text(call: &PythonCall, output: &PythonOutput, _: &ParseContext) -> Option<String> {
        output.error_text(call.limits.timeout_seconds, call.max_timeout_seconds)
    }

    fn attachments(output: &PythonOutput) -> Vec<Attachment> {
        let mut blocks: Vec<Attachment> = output.files.iter().map(Attachment::of).collect();
        if let Some(note) = omitted_note(&output.files_omitted) {
            blocks.push(Attachment::Note(note));
        }
        blocks
    }

    async fn run_embedded(
        embedded: &Embedded,
        agent: &str,
        run_name: String,
        call: PythonCall,
        output: Option<crate::runner::OutputFn>,
    ) -> Result<PythonOutput, String> {
        let context = call.context(agent);
        let decision = embedded.policy.evaluate(&context);
        tracing::info!(run = %run_name, agent, decision = %decision, "run_python decision");
        match decision.verdict {
            Verdict::Allow => {}
            Verdict::Block => {
                return Ok(PythonOutput::rejected(
                    run_name,
                    Reason::PolicyBlocked,
                    format!("blocked by rule {}: {}", decision.rule, decision.reason),
                ));
            }
            Verdict::Escalate => {
                return Ok(PythonOutput::rejected(
                    run_name,
                    Reason::ApprovalUnavailable,
                    format!(
                        "policy rule {} escalated this run for a human approval ({}); awaiting \
                         approval is only available in cluster mode (--backend kube), so nothing \
                         was executed: ask an operator for a rule that allows this call",
                        decision.rule, decision.reason
                    ),
                ));
            }
        }
        let Some(sandbox) = embedded.sandbox.as_ref() else {
            return Err("run_python has no local sandbox on this server".to_owned());
        };
        if let Err(why) = sandbox.profile_available(call.profile) {
            return Ok(PythonOutput::rejected(
                run_name,
                Reason::ProfileUnavailable,
                format!(
                    "this server cannot run the {} profile ({why}); call again without \
                     `profile` (the standard library only), or ask its operator to install it",
                    call.profile
                ),
            ));
        }
        let program = Program {
            code: &call.code,
            inputs: &call.files,
            outputs: decision.files,
        };
        if let Some(session) = &call.session {
            return Ok(run_in_session(
                embedded, sandbox, agent, run_name, &call, session, &decision, &program, output,
            )
            .await);
        }
        // The decision's limits: the requested ones, lowered to the rule's ceilings.
        let run = sandbox
            .run(&program, call.profile, &decision.limits, output)
            .await
            .map_err(|e| format!("the local sandbox failed: {e}"))?;
        let classified = classify(
            run.envelope.as_ref(),
            &run.observed,
            &decision.limits,
            decision.files,
        );
        Ok(PythonOutput::from_classified(
            run_name,
            classified,
            run.duration_ms,
        ))
    }
}

/// Runs an allowed call in its session on this machine (see [`super::python_session`]): opens
/// the session for `"new"`, else finds the caller's open one, then runs the call in its sandbox.
#[allow(clippy::too_many_arguments)]
async fn run_in_session(
    embedded: &Embedded,
    sandbox: &crate::local::LocalSandbox,
    agent: &str,
    run_name: String,
    call: &PythonCall,
    session: &SessionArg,
    decision: &crate::policy::Decision,
    program: &Program<'_>,
    output: Option<crate::runner::OutputFn>,
) -> PythonOutput {
    use super::python_session::{OpenError, not_found};
    let (id, slot) = match session {
        SessionArg::New => {
            // Allowed means the deciding rule has a sessions section: its bounds are recorded.
            let rules = decision.sessions.unwrap_or_default();
            match embedded
                .sessions
                .open(agent, call.profile, &decision.limits, rules, sandbox)
            {
                Ok(opened) => opened,
                Err(OpenError::Limit(why)) => {
                    return PythonOutput::rejected(run_name, Reason::SessionLimit, why);
                }
                Err(OpenError::Unavailable(why)) => {
                    return PythonOutput::rejected(run_name, Reason::SessionUnavailable, why);
                }
            }
        }
        SessionArg::Named(id) => match embedded.sessions.find(agent, id) {
            Some(slot) => (id.clone(), slot),
            None => {
                return PythonOutput::rejected(run_name, Reason::SessionNotFound, not_found(id));
            }
        },
    };
    if call.profile != Profile::Minimal && call.profile != slot.profile() {
        return PythonOutput::rejected(
            run_name,
            Reason::ProfileUnavailable,
            format!(
                "session {id} runs the {} profile; call it without `profile`, or start a new \
                 session with profile {}",
                slot.profile(),
                call.profile
            ),
        );
    }
    // One call at a time: a second call waits here for the first to end.
    let mut guard = CallInSession {
        sandbox: slot.lock().await,
        done: false,
    };
    let Some(local) = guard.sandbox.as_mut() else {
        return PythonOutput::rejected(run_name, Reason::SessionNotFound, not_found(&id));
    };
    let result = slot
        .unless_ended(local.call(&run_name, program, &decision.limits, output))
        .await;
    let Some(result) = result else {
        // Closed while it ran: the guard drops the sandbox, which stops the code.
        return PythonOutput {
            phase: Phase::Cancelled,
            session: Some(id.clone()),
            session_ended: Some("the session was closed while the call ran".to_owned()),
            ..PythonOutput::rejected(
                run_name,
                Reason::CallCancelled,
                format!("session {id} was closed while this call ran, and the call was stopped"),
            )
        };
    };
    guard.done = true;
    slot.touch();
    let (classified, duration_ms, ended) = match result {
        Ok(done) => (
            classify(
                done.run.envelope.as_ref(),
                &done.run.observed,
                &decision.limits,
                decision.files,
            ),
            done.run.duration_ms,
            done.ended,
        ),
        Err(e) => {
            guard.sandbox.take();
            embedded.sessions.forget(&id);
            return PythonOutput::rejected(run_name, Reason::SessionNotFound, e.to_string());
        }
    };
    if ended.is_some() {
        // Its sandbox is already stopped; the slot goes.
        guard.sandbox.take();
        embedded.sessions.forget(&id);
    }
    PythonOutput {
        session: Some(id),
        session_ended: ended,
        ..PythonOutput::from_classified(run_name, classified, duration_ms)
    }
}

/// A session's sandbox held for one call. Should the call's future be dropped before the call
/// ended (the caller cancelled it), the sandbox is dropped with it, which kills it: the code in it
/// cannot be stopped any other way, so the session ends.
struct CallInSession<'a> {
    sandbox: tokio::sync::MutexGuard<'a, Option<crate::local::LocalSession>>,
    done: bool,
}

impl Drop for CallInSession<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.sandbox.take();
        }
    }
}

/// The tool's part of the server's instructions ([`ToolSpec::INSTRUCTIONS`]).
pub const INSTRUCTIONS: &str = "run_python runs untrusted Python code in a single-use sandbox \
with no network, a read-only filesystem (only /tmp is writable and small), and CPU, memory, \
process and time limits. Put the source in `code`; print what you need. Each call starts from a \
clean sandbox unless it runs in a session. The default profile has the Python standard \
library only; pass `profile: \"data\"` for numpy, pandas, scipy and matplotlib. To keep \
state between calls (variables, imports, files in /tmp), pass `session: \"new\"` and then the \
returned `session` id in later calls; they run one at a time in a sandbox of your own, threads \
and processes a call starts end with it, a call that times out ends the session, and \
close_session ends it when you are done (it also ends after a while without calls). Pass input \
files in `files` ([{\"name\": \"data.csv\", \"text\": \"...\"}], or `base64` for binary data): they are \
read-only in /tmp/inputs. Files the code writes directly in /tmp/outputs come back with the result: \
raster images (PNG, JPEG, GIF, WebP) as images, text and CSV as embedded resources (SVG, HTML and \
XML as plain text, never rendered), anything else as base64; save charts there as PNG with \
matplotlib's savefig.";

/// What a model reads about the tool before calling it (the tool's `description`).
pub const DESCRIPTION: &str = "Run a Python 3 program in a fresh, isolated sandbox (no network, read-only \
filesystem except a small /tmp, limited CPU, memory, processes and time) and return its stdout, \
stderr and exit code. The default profile has the standard library only; profile \"data\" adds \
numpy, pandas, scipy and matplotlib. Input files (`files`) are placed read-only in /tmp/inputs; \
files the code writes in /tmp/outputs are returned (images as images, e.g. \
plt.savefig('/tmp/outputs/chart.png')). Print what you need. To keep variables and files between \
calls (exploring data step by step), pass session \"new\", then the returned `session` id; close \
it with close_session. A non-zero exit, a timeout or a rejection is reported as an error result \
that says what to change.";

#[cfg(test)]
#[path = "python_tests.rs"]
mod tests;

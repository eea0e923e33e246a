//! The tools, one module each: what `run_python` ([`python`]), `execute_sql` ([`sql`]) and
//! `fetch_metrics` ([`metrics`]) mean. Each module owns its tool's typed arguments (with the
//! schema agents see), the validation of raw arguments, its output, the one classification of
//! its results, its one executor (called by the operator in a cluster and by the frontend
//! embedded) and the words a model reads about it.
//!
//! [`ToolSpec`] is what the rest of the system knows of a tool: the frontend's call pipeline,
//! its backends and the resource mapping in `sandboxrun-api` are generic over it, so adding a
//! tool means one module here, one `ClusterTool` impl in `sandboxrun-api`, one branch in the
//! operator's executor and one `#[tool]` function in the frontend.

pub mod args;
pub mod governed;
pub mod metrics;
pub mod python;
pub mod python_session;
pub mod sql;
pub mod sql_schema;

use std::future::Future;

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::Serialize;

use crate::limits::Limits;
use crate::local::LocalSandbox;
use crate::metrics::CallStore;
use crate::model::{Environment, Phase, Tool, Verdict};
use crate::policy::PolicyStore;
use crate::query::Databases;

/// Raw MCP tool arguments, as a JSON object.
pub type JsonObject = serde_json::Map<String, serde_json::Value>;

/// What argument validation needs besides the arguments: the caller's limits and the clock.
#[derive(Clone, Debug)]
pub struct ParseContext {
    /// Largest `timeoutSeconds` a caller may ask for.
    pub max_timeout_seconds: u32,
    /// Limits of a run that asks for nothing.
    pub defaults: Limits,
    /// When the call arrived (relative metrics times are resolved against it).
    pub now: Timestamp,
}

impl Default for ParseContext {
    fn default() -> Self {
        Self {
            max_timeout_seconds: crate::limits::MAX_TIMEOUT_SECONDS,
            defaults: Limits::default(),
            now: Timestamp::now(),
        }
    }
}

/// How a call ended, in the terms every tool shares: for metrics, logs and the call record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallSummary {
    /// The run's terminal phase (or AwaitingApproval).
    pub phase: Phase,
    /// What policy decided; `None` when the tool's output does not say.
    pub verdict: Option<Verdict>,
    /// The run's name.
    pub run_name: String,
}

impl CallSummary {
    /// The summary of a call that ended in `phase` after policy decided `verdict`.
    pub fn of(phase: Phase, verdict: Option<Verdict>, run_name: &str) -> Self {
        Self {
            phase,
            verdict,
            run_name: run_name.to_owned(),
        }
    }
}

/// What the embedded mode executes with: the policy every call is judged by, and each tool's
/// resources (`None`: the tool is not offered).
pub struct Embedded {
    /// The policy (`--policy-file`, or [`crate::policy::embedded::EMBEDDED_POLICY`]).
    pub policy: PolicyStore,
    /// The local sandbox `run_python` runs in.
    pub sandbox: Option<LocalSandbox>,
    /// The databases `execute_sql` queries.
    pub databases: Option<Databases>,
    /// Every tool call of this process, which `fetch_metrics` queries.
    pub calls: CallStore,
    /// `run_python`'s open sessions.
    pub sessions: python_session::Sessions,
}

/// Content a call returns besides its structured output, independent of MCP: the frontend
/// turns each into a content block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attachment {
    /// A raster image a client can show (PNG, JPEG, GIF, WebP, checked by its bytes); never a
    /// format with active content such as SVG.
    Image {
        /// Its file name.
        name: String,
        /// Its MIME type.
        mime_type: String,
        /// Its bytes.
        data: Vec<u8>,
    },
    /// A text file (UTF-8), as an embedded text resource.
    Text {
        /// Its file name.
        name: String,
        /// Its MIME type.
        mime_type: String,
        /// Its text.
        text: String,
    },
    /// Any other file, as an embedded binary resource.
    Binary {
        /// Its file name.
        name: String,
        /// Its MIME type.
        mime_type: String,
        /// Its bytes.
        data: Vec<u8>,
    },
    /// A sentence for the model (what was left out, and why).
    Note(String),
}

impl Attachment {
    /// The attachment of a returned file, by its kind, with the type its name and bytes give
    /// ([`crate::files::mime_type`]): SVG, HTML and other active content become text.
    pub fn of(file: &crate::files::OutputFile) -> Self {
        let (name, mime_type) = (file.name.clone(), file.content_type().to_owned());
        match file.kind() {
            crate::files::FileKind::Image => Attachment::Image {
                name,
                mime_type,
                data: file.data.clone(),
            },
            crate::files::FileKind::Text => match String::from_utf8(file.data.clone()) {
                Ok(text) => Attachment::Text {
                    name,
                    mime_type,
                    text,
                },
                Err(e) => Attachment::Binary {
                    name,
                    mime_type,
                    data: e.into_bytes(),
                },
            },
            crate::files::FileKind::Binary => Attachment::Binary {
                name,
                mime_type,
                data: file.data.clone(),
            },
        }
    }

    /// The `file:///tmp/outputs/NAME` URI of a file attachment, as resources name it.
    pub fn uri(name: &str) -> String {
        format!("file://{}/{name}", crate::files::OUTPUT_DIR)
    }
}

/// One tool: its arguments, its validated call, its output and its embedded executor.
pub trait ToolSpec: Send + Sync + 'static {
    /// Which tool this is.
    const TOOL: Tool;
    /// How to use the tool, in a sentence or three: the server's instructions to a client's model
    /// are a short preamble plus this text of every tool the server offers.
    const INSTRUCTIONS: &'static str;
    /// The arguments as agents send them (the tool's `inputSchema`).
    type Args: JsonSchema;
    /// A validated call, ready to execute.
    type Call: Clone + Send + Sync + 'static;
    /// The result an agent sees (the tool's `outputSchema` and `structuredContent`).
    type Output: Serialize + JsonSchema + Send + 'static;

    /// Validates raw arguments into a call, or says exactly what to fix.
    fn parse(args: &JsonObject, ctx: &ParseContext) -> Result<Self::Call, String>;

    /// The environment the call targets.
    fn environment(call: &Self::Call) -> Environment;

    /// The wall-clock budget of the call in seconds (a backend waits this long plus its grace);
    /// the default budget unless the call carries its own.
    fn timeout_seconds(_call: &Self::Call) -> u32 {
        crate::limits::DEFAULT_TIMEOUT_SECONDS
    }

    /// Phase, verdict and name of a finished call.
    fn summary(output: &Self::Output) -> CallSummary;

    /// Text a model can act on when the call did not succeed; `None` for a success.
    fn error_text(call: &Self::Call, output: &Self::Output, ctx: &ParseContext) -> Option<String>;

    /// Content returned besides the structured output (files the run wrote, notes about them),
    /// in order; none by default.
    fn attachments(_output: &Self::Output) -> Vec<Attachment> {
        Vec::new()
    }

    /// Judges and executes the call on this machine (embedded mode), as run `run_name`. `Err`
    /// means the tool could not run at all (its resource is missing or broken); the message
    /// says what to check. A tool whose runs print as they go hands that output to `output`
    /// while the call runs.
    fn run_embedded(
        embedded: &Embedded,
        agent: &str,
        run_name: String,
        call: Self::Call,
        output: Option<crate::runner::OutputFn>,
    ) -> impl Future<Output = Result<Self::Output, String>> + Send;
}

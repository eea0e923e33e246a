//! The desired state of a run: who asks, for what tool, within which limits.

use kube::{CustomResource, KubeSchema};
use sandboxrun_core::files::{self, InputFile, Profile};
use sandboxrun_core::limits::{self as lim, Limits};
use sandboxrun_core::{Environment, Tool};
use serde::{Deserialize, Serialize};

use crate::approval::Approval;
use crate::status::SandboxRunStatus;

/// CEL: a quantity string within [min, max], inclusive.
fn quantity_rule(field: &str, min: &str, max: &str, example: &str) -> kube::core::Rule {
    kube::core::Rule::new(format!(
        "isQuantity(self) && quantity(self).compareTo(quantity('{min}')) >= 0 && \
         quantity(self).compareTo(quantity('{max}')) <= 0"
    ))
    .message(kube::core::Message::Message(format!(
        "{field} must be a Kubernetes quantity between {min} and {max} (for example {example})"
    )))
}

pub(crate) fn cpu_rule() -> kube::core::Rule {
    quantity_rule("cpu", lim::MIN_CPU, lim::MAX_CPU, lim::DEFAULT_CPU)
}

pub(crate) fn memory_rule() -> kube::core::Rule {
    quantity_rule(
        "memory",
        lim::MIN_MEMORY,
        lim::MAX_MEMORY,
        lim::DEFAULT_MEMORY,
    )
}

/// CEL on the spec: exactly one tool.
const ONE_TOOL_RULE: &str =
    "[has(self.python), has(self.sql), has(self.metrics)].filter(x, x).size() == 1";

/// CEL transition rule on the spec: the tool cannot be swapped for another (each tool's own
/// content is immutable through its field rule, which only runs when old and new both have it).
const SAME_TOOL_RULE: &str = "has(self.python) == has(oldSelf.python) && has(self.sql) == has(oldSelf.sql) && has(self.metrics) == has(oldSelf.metrics)";

/// CEL on the spec, also at creation (`optionalOldSelf`): a run cannot be created approved, nor
/// denied. An approval is a person's answer to a run that waits for one; written by the creator
/// in the same breath it would be no answer at all.
const NO_APPROVAL_AT_CREATE_RULE: &str = "oldSelf.hasValue() || !has(self.approval)";

/// CEL transition rule on the whole object: `spec.approval` changes only while the run awaits
/// approval (its status says so), so an approval is always written after the run began waiting
/// for it; never before (where it would wait to be counted once the run is escalated), never
/// after the run went on or ended (a finished run is the audit trail).
pub const APPROVAL_WHILE_AWAITING_RULE: &str = "(has(self.spec.approval) == has(oldSelf.spec.approval) && \
(!has(self.spec.approval) || self.spec.approval == oldSelf.spec.approval)) || \
(has(oldSelf.status) && has(oldSelf.status.phase) && oldSelf.status.phase == 'AwaitingApproval')";

/// A tool call to execute: exactly one of `python`, `sql` or `metrics`. Everything but
/// `approval` and `cancelled` is immutable once created.
// Clippy reads the repeated `type_ = ...` inside separate printcolumn(...) groups as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "sandboxrun.dev",
    version = "v1alpha1",
    kind = "SandboxRun",
    plural = "sandboxruns",
    shortname = "sbr",
    category = "sandboxrun",
    namespaced,
    status = "SandboxRunStatus",
    doc = "A tool call (Python, SQL or metrics) executed in isolation by the sandboxrun operator",
    printcolumn(name = "Agent", type_ = "string", json_path = ".spec.agent"),
    printcolumn(name = "Tool", type_ = "string", json_path = ".status.tool"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Exit", type_ = "integer", json_path = ".status.exitCode"),
    printcolumn(
        name = "Path",
        type_ = "string",
        json_path = ".status.path",
        priority = 1
    ),
    printcolumn(
        name = "Duration(ms)",
        type_ = "integer",
        json_path = ".status.durationMillis"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[kube(validation = kube::core::Rule::new(APPROVAL_WHILE_AWAITING_RULE).message("spec.approval can be set or changed only while the run awaits approval (status.phase AwaitingApproval)"))]
#[x_kube(validation = kube::core::Rule::new(NO_APPROVAL_AT_CREATE_RULE).optional_old_self(true).message("spec.approval cannot be set when a run is created: a person approves or denies a run once it awaits approval"))]
#[x_kube(validation = kube::core::Rule::new(ONE_TOOL_RULE).message("exactly one of python, sql or metrics must be set"))]
#[x_kube(validation = kube::core::Rule::new(SAME_TOOL_RULE).message("the tool of a SandboxRun cannot be changed; create a new one"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxRunSpec {
    /// Identity of the calling agent, set by the frontend from the caller's credentials: 1 to 253
    /// ASCII letters, digits and . _ : @ + | / # = -, starting with a letter or digit (no spaces,
    /// control, invisible or non-ASCII characters; see sandboxrun_core::agent_name).
    #[schemars(
        length(min = 1, max = 253),
        pattern(sandboxrun_core::AGENT_NAME_PATTERN)
    )]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("agent is immutable"))]
    pub agent: String,

    /// Environment the call targets: sandbox (default), staging or production.
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("environment is immutable"))]
    pub environment: Environment,

    /// Run a Python snippet in a single-use sandbox Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("python is immutable"))]
    pub python: Option<PythonSpec>,

    /// Run a read-only SQL query, judged by policy and executed by the operator against a database
    /// it is configured with (without databases the run ends Rejected, ToolNotImplemented).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("sql is immutable"))]
    pub sql: Option<SqlSpec>,

    /// Run a PromQL query, executed by the operator against the Prometheus it is configured with
    /// (`--prometheus-url`; without one the run ends Rejected, ToolNotImplemented).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("metrics is immutable"))]
    pub metrics: Option<MetricsSpec>,

    /// Resource limits; every field has a default.
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("limits are immutable"))]
    pub limits: LimitsSpec,

    /// Seconds a finished run is kept before the operator deletes it (default 3600).
    #[serde(default = "default_ttl")]
    #[schemars(range(min = 0, max = lim::MAX_TTL_SECONDS_AFTER_FINISHED))]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("ttlSecondsAfterFinished is immutable"))]
    pub ttl_seconds_after_finished: u32,

    /// Approval of an escalated run, set by a person with RBAC rights while the run awaits
    /// approval (never at creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,

    /// Stops the run: set by its caller (the frontend, when the MCP request is cancelled or its
    /// connection drops) or a person. The operator ends an unfinished run `Cancelled` (reason
    /// `CallCancelled`), stops its sandbox and writes its audit line; a finished run keeps its
    /// result. It can be set, never unset.
    // The schema default makes the transition rule run on every update: without it, a run
    // created without the field has no old value and the rule is skipped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(extend("default" = false))]
    #[x_kube(validation = kube::core::Rule::new("self || !oldSelf").message("a cancelled run stays cancelled"))]
    pub cancelled: bool,
}

fn default_ttl() -> u32 {
    lim::DEFAULT_TTL_SECONDS_AFTER_FINISHED
}

impl SandboxRunSpec {
    /// The tool this run asks for (the schema guarantees exactly one is set; should an object
    /// bypass validation, python wins, then sql, then metrics).
    pub fn tool(&self) -> Option<Tool> {
        if self.python.is_some() {
            Some(Tool::Python)
        } else if self.sql.is_some() {
            Some(Tool::Sql)
        } else if self.metrics.is_some() {
            Some(Tool::Metrics)
        } else {
            None
        }
    }
}

/// The name of a SandboxSession as a run's `spec.python.session` names it: a DNS-1123 subdomain
/// (lower-case letters, digits, '-' and '.', starting and ending with a letter or digit), as
/// Kubernetes requires of an object's name.
pub const SESSION_NAME_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A Python snippet, the sandbox profile it runs in and its input files.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PythonSpec {
    /// Source code, run as `python3 -I -c CODE` (at most 262144 characters).
    #[schemars(length(min = 1, max = lim::MAX_CODE_BYTES))]
    pub code: String,
    /// The sandbox image: `minimal` (the standard library only; the default) or `data` (numpy,
    /// pandas, scipy, matplotlib). Policy decides which profiles an agent may use
    /// (`python.profiles` of a rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
    /// Input files, placed read-only in /tmp/inputs before the code runs: at most 20, with
    /// distinct plain names, 256 KiB together (or less, as policy says).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "input_files_schema")]
    pub files: Vec<InputFile>,
    /// The SandboxSession (in the run's namespace) the code runs in, with the state earlier calls
    /// left there; absent: a fresh single-use sandbox. The session must belong to the run's
    /// agent (`spec.agent`), and the calls of one session run one at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(SESSION_NAME_PATTERN))]
    pub session: Option<String>,
}

impl PythonSpec {
    /// The run's sandbox profile (`minimal` when none is set).
    pub fn sandbox_profile(&self) -> Profile {
        self.profile.unwrap_or_default()
    }
}

/// CEL-free bounds of `spec.python.files`: the count, each name's alphabet (one path component,
/// see `sandboxrun_core::files::check_name`), each content as base64 of at most the total input
/// bytes, and distinct names (a map list keyed by name). The total is policy's to check.
fn input_files_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let max_content = files::MAX_INPUT_BYTES.div_ceil(3) * 4;
    schemars::json_schema!({
        "description": "Input files, placed read-only in /tmp/inputs before the code runs: at most 20, with distinct plain names, 256 KiB together (or less, as policy says).",
        "type": "array",
        "maxItems": files::MAX_INPUT_FILES,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
        "items": {
            "type": "object",
            "required": ["name", "content"],
            "properties": {
                "name": {
                    "description": "The file's name in /tmp/inputs: letters, digits, '.', '_' and '-', starting with a letter or digit.",
                    "type": "string",
                    "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
                },
                "content": {
                    "description": "The file's content, base64-encoded.",
                    "type": "string",
                    "format": "byte",
                    "maxLength": max_content,
                },
            },
        },
    })
}

/// A read-only SQL query, or a read of what queries may read (`schema: true`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = kube::core::Rule::new(QUERY_OR_SCHEMA_RULE).message("set exactly one of query or schema: true"))]
pub struct SqlSpec {
    /// Name of a database configured in the operator.
    #[schemars(length(min = 1, max = 253))]
    pub database: String,
    /// The query; only read-only statements pass policy. Empty for a schema read.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 65536))]
    pub query: String,
    /// Instead of a query: read the tables and columns the agent's queries may read in the
    /// database, with their types (the MCP resource `sandboxrun://databases/{name}/schema`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub schema: bool,
}

/// A run's `spec.sql` asks for a query or for the schema, never both or neither.
const QUERY_OR_SCHEMA_RULE: &str =
    "(has(self.schema) && self.schema) != (has(self.query) && size(self.query) > 0)";

/// A metrics query: an instant query (at `time`, default when it executes), or a range query
/// when `range` is set.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MetricsSpec {
    /// The PromQL expression.
    #[schemars(length(min = 1, max = 65536))]
    pub query: String,
    /// Evaluation time of an instant query (RFC 3339 timestamp or unix seconds); absent means
    /// when the operator executes the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time: Option<String>,
    /// Time range for a range query; absent means an instant query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<MetricsRange>,
}

/// Time range of a metrics range query.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MetricsRange {
    /// Start of the range (RFC 3339 timestamp or unix seconds).
    #[schemars(length(min = 1, max = 64))]
    pub start: String,
    /// End of the range (RFC 3339 timestamp or unix seconds).
    #[schemars(length(min = 1, max = 64))]
    pub end: String,
    /// Resolution step as a duration (for example `30s`) or seconds.
    #[schemars(length(min = 1, max = 32))]
    pub step: String,
}

/// Resource limits of the run. Defaults and maxima come from `sandboxrun_core::limits`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LimitsSpec {
    /// Wall-clock limit in seconds, 1 to 600 (default 30); the run ends TimedOut past it.
    #[serde(default = "default_timeout")]
    #[schemars(range(min = lim::MIN_TIMEOUT_SECONDS, max = lim::MAX_TIMEOUT_SECONDS))]
    pub timeout_seconds: u32,
    /// CPU limit (= request) as a quantity, up to 4 (default 500m).
    #[serde(default = "default_cpu")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = cpu_rule())]
    pub cpu: String,
    /// Memory limit (= request) as a quantity, 16Mi to 4Gi (default 256Mi).
    #[serde(default = "default_memory")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = memory_rule())]
    pub memory: String,
    /// Maximum number of processes of the code, 1 to 1024 (default 64).
    #[serde(default = "default_pids")]
    #[schemars(range(min = lim::MIN_PIDS, max = lim::MAX_PIDS))]
    pub pids: u32,
    /// Cap on each of stdout and stderr in bytes, 1 to 1048576 (default 65536).
    #[serde(default = "default_output_bytes")]
    #[schemars(range(min = lim::MIN_OUTPUT_BYTES, max = lim::MAX_OUTPUT_BYTES))]
    pub output_bytes: u32,
}

fn default_timeout() -> u32 {
    lim::DEFAULT_TIMEOUT_SECONDS
}
fn default_cpu() -> String {
    lim::DEFAULT_CPU.to_owned()
}
fn default_memory() -> String {
    lim::DEFAULT_MEMORY.to_owned()
}
fn default_pids() -> u32 {
    lim::DEFAULT_PIDS
}
fn default_output_bytes() -> u32 {
    lim::DEFAULT_OUTPUT_BYTES
}

impl Default for LimitsSpec {
    fn default() -> Self {
        Limits::default().into()
    }
}

impl From<Limits> for LimitsSpec {
    fn from(l: Limits) -> Self {
        Self {
            timeout_seconds: l.timeout_seconds,
            cpu: l.cpu,
            memory: l.memory,
            pids: l.pids,
            output_bytes: l.output_bytes,
        }
    }
}

impl LimitsSpec {
    /// The effective limits, numbers clamped into their accepted ranges.
    pub fn effective(&self) -> Limits {
        Limits {
            timeout_seconds: self.timeout_seconds,
            cpu: self.cpu.clone(),
            memory: self.memory.clone(),
            pids: self.pids,
            output_bytes: self.output_bytes,
        }
        .clamped()
    }
}

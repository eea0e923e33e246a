//! The observed state of a run, written only by the operator (server-side apply, field manager
//! `sandboxrun-operator`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::KubeSchema;
use sandboxrun_core::files::{self, FileCaps, OmittedFile};
use sandboxrun_core::limits::Limits;
use sandboxrun_core::metrics::scope::MetricsRules;
use sandboxrun_core::policy::SessionRules;
use sandboxrun_core::sql::SqlRules;
use sandboxrun_core::{Environment, Phase, Tool, Verdict};

use crate::approval::ApprovalRequest;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition type: the code started executing (True) or not yet / never (False).
pub const CONDITION_STARTED: &str = "Started";
/// Condition type: the run reached a terminal phase (True, reason says how) or not yet (False).
pub const CONDITION_COMPLETED: &str = "Completed";
/// Condition type: the run's audit line. The terminal status is written with it False (the line
/// is owed), and it turns True once the line is out; whichever replica reconciles a terminal run
/// that still owes its line writes it, so a crash between the status and the line loses nothing.
pub const CONDITION_AUDITED: &str = "Audited";

/// A run's status only moves forward, whoever writes it and whenever a write arrives: the phase
/// never goes back (AwaitingApproval, Pending, Running, then one terminal phase that is final)
/// and the sandbox Pod, once recorded, stays the run's. A status write can commit after its
/// answer was lost, so a late write of an older status would otherwise undo a newer one: a
/// finished run would run again (a second end, a second audit line), or a run whose Pod is
/// recorded would get a second Pod. The API server refuses such a write (422); the operator
/// reads the run again and goes on from what it finds. The record of when the run began waiting
/// for approval is written once and never changed: an approval counts only after it.
pub const STATUS_FORWARD_RULE: &str = "(!has(oldSelf.phase) || (has(self.phase) && \
(oldSelf.phase in ['Succeeded', 'Failed', 'TimedOut', 'Rejected', 'Cancelled'] \
? self.phase == oldSelf.phase \
: {'AwaitingApproval': 1, 'Pending': 2, 'Running': 3, 'Succeeded': 4, 'Failed': 4, 'TimedOut': 4, 'Rejected': 4, 'Cancelled': 4}[self.phase] \
>= {'AwaitingApproval': 1, 'Pending': 2, 'Running': 3}[oldSelf.phase]))) \
&& (!has(oldSelf.podName) || (has(self.podName) && self.podName == oldSelf.podName)) \
&& (!has(oldSelf.approvalRequest) || (has(self.approvalRequest) && self.approvalRequest == oldSelf.approvalRequest))";

/// What happened to a run. Absent fields are unknown or not applicable yet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(STATUS_FORWARD_RULE).message("a run's status only moves forward: its phase never goes back, a terminal phase is final, its recorded sandbox Pod stays its own and the record of when it began waiting for approval is never changed"))]
pub struct SandboxRunStatus {
    /// Where the run is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The tool the run uses (python, sql or metrics), for printer columns and selectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<Tool>,
    /// What policy decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// When the run began waiting for a person's approval (written with `AwaitingApproval`): an
    /// approval counts only if it was written after this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_request: Option<ApprovalRequest>,
    /// Kubernetes conditions (`Started`, `Completed`) with reasons and observedGeneration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Exit code of the code: 128 + signal number when a signal killed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Standard output of the code, capped at `limits.outputBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// Standard error of the code, capped at `limits.outputBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// Whether stdout or stderr was cut at the cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// When the code started executing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the run reached its terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Execution time in milliseconds, from start to completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_millis: Option<i64>,
    /// Name of the sandbox Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// How the python run got its sandbox: `Warm` (claimed from a pool, already started) or
    /// `Cold` (started for this run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<SandboxPath>,
    /// The SandboxPool a warm sandbox came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// When the python run joined its namespace's queue for a sandbox (the quota or the nodes
    /// had no room): accepted, it waits there until it gets one, refused only as a last resort
    /// at twice the operator's `--max-queue-wait-seconds` from then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_at: Option<Time>,
    /// Its place in that queue while it waits (1: the next to get a sandbox); updated as it
    /// moves up, when the change is large or it is near the front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<u32>,
    /// A run refused for capacity (reason `NoCapacity`): after how many seconds a new call may
    /// expect a sandbox in time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u32>,
    /// A python run in a session: the SandboxSession the call ran in (for `spec.python.session:
    /// new`, the one the operator opened for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// A python run in a session that ended with this call (its code ended the interpreter, or
    /// it ran past its timeout): why. Absent: the session goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_ended: Option<String>,
    /// Machine-readable reason of the current phase (for example `OOMKilled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable explanation of the current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Files a python run's code wrote in /tmp/outputs, within the caps of its policy rule
    /// (at most 20 files and 384 KiB together).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = files::MAX_OUTPUT_FILES))]
    pub files: Vec<StatusFile>,
    /// Files the code wrote there that were not returned, and why (`fileCount`, `byteCount`,
    /// `notARegularFile`, `badName`, `unreadable`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = files::MAX_OMITTED))]
    pub files_omitted: Vec<OmittedFile>,
    /// Structured result of sql and metrics runs (rows, samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub result: Option<serde_json::Value>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl SandboxRunStatus {
    /// `status.result` read as the tool's typed result (`None`: there is none).
    pub fn typed_result<T: serde::de::DeserializeOwned>(
        &self,
    ) -> Option<Result<T, serde_json::Error>> {
        self.result
            .as_ref()
            .map(|v| serde_json::from_value(v.clone()))
    }
}

/// A file a python run returned.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusFile {
    /// Its name in /tmp/outputs.
    pub name: String,
    /// Its MIME type, from its name checked against its content.
    pub mime_type: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its content, base64-encoded.
    pub data: String,
}

impl std::fmt::Debug for StatusFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusFile")
            .field("name", &self.name)
            .field("mime_type", &self.mime_type)
            .field("size", &self.size)
            .finish()
    }
}

impl StatusFile {
    /// The status form of a returned file.
    pub fn of(file: &files::OutputFile) -> Self {
        Self {
            name: file.name.clone(),
            mime_type: file.mime_type.clone(),
            size: file.size,
            data: file.base64(),
        }
    }

    /// The returned file, its content decoded (its MIME type derived again, so a status written
    /// by hand cannot make a client render something as what it is not); `None` when `data` is
    /// not base64.
    pub fn output(&self) -> Option<files::OutputFile> {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD
            .decode(self.data.as_bytes())
            .ok()?;
        Some(files::OutputFile::new(self.name.clone(), data))
    }
}

/// How a python run got its sandbox.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SandboxPath {
    /// Claimed from a SandboxPool: started before the run, used by it alone.
    Warm,
    /// Started for this run.
    Cold,
}

/// Policy's judgement of a run, taken once on the run's full context and recorded whole: every
/// later stage (the gate, the sandbox Pod, the query) executes from this record, never from a
/// second judgement (a later re-check may only tighten it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct Decision {
    /// Allow, Block or Escalate.
    pub verdict: Verdict,
    /// The policy rule that decided.
    #[serde(default)]
    pub rule: String,
    /// Why the rule decided so.
    #[serde(default)]
    pub reason: String,
    /// What the decision lets the run do (absent on runs decided before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
}

/// What a decision lets a run do: the part of policy's judgement that the execution needs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// The environment the run was judged in: the one it names, or the one of its database or
    /// Prometheus when that is more sensitive.
    pub environment: Environment,
    /// The limits the run executes with (the requested ones, lowered to the rule's ceilings).
    pub limits: Limits,
    /// sql: the most rows the result keeps.
    #[serde(default)]
    pub max_rows: u64,
    /// sql: the checked query as the guard rewrote it, the only text that is executed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// python: the bounds on the files the run returns.
    #[serde(default)]
    pub files: FileCaps,
    /// metrics: what the query may read (the deciding rule's `metrics` section; absent: any
    /// metric).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsRules>,
    /// sql schema read: the deciding rule's `sql` settings, what the read shows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "sql_rules")]
    pub schema: Option<SqlRules>,
    /// python in a session: the deciding rule's `python.sessions`, the bounds the session is
    /// held to (how many one agent may hold, how long one lives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<SessionRules>,
}

impl Grant {
    /// The grant of `decision`, judged in `environment`.
    pub fn of(decision: &sandboxrun_core::Decision, environment: Environment) -> Self {
        Self {
            environment,
            limits: decision.limits.clone(),
            max_rows: decision.max_rows,
            query: decision.rewritten_query.clone(),
            files: decision.files,
            metrics: decision.metrics.clone(),
            schema: decision.schema.clone(),
            sessions: decision.sessions,
        }
    }
}

impl Decision {
    /// The record of `decision`, judged in `environment`.
    pub fn record(decision: &sandboxrun_core::Decision, environment: Environment) -> Self {
        Self {
            verdict: decision.verdict,
            rule: decision.rule.clone(),
            reason: decision.reason.clone(),
            grant: Some(Grant::of(decision, environment)),
        }
    }

    /// The decision as it was taken, rebuilt from the record (`None`: the record has no grant,
    /// from an operator that did not record one).
    pub fn taken(&self) -> Option<sandboxrun_core::Decision> {
        let grant = self.grant.as_ref()?;
        Some(sandboxrun_core::Decision {
            verdict: self.verdict,
            rule: self.rule.clone(),
            reason: self.reason.clone(),
            limits: grant.limits.clone(),
            max_rows: grant.max_rows,
            rewritten_query: grant.query.clone(),
            schema: grant.schema.clone(),
            metrics: grant.metrics.clone(),
            files: grant.files,
            sessions: grant.sessions,
        })
    }
}

/// Schema of a rule's `sql` settings in a grant, kept as policy wrote them (a column list is
/// `"*"` or an array: no structural schema can say that, so the API server keeps it as is and
/// the operator reads it back typed).
fn sql_rules(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "The deciding rule's sql settings (tables, columns, row cap) a schema read shows.",
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Schema of a free-form JSON value the API server keeps as is.
fn free_form(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Structured result of sql and metrics runs (rows, samples).",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

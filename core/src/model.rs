//! The vocabulary of a run: which tool, in which environment, how policy judged it and where it
//! is in its life. JSON Schema is derived so the API crate and the frontend's tool schemas reuse
//! these exact types; nothing here knows about Kubernetes.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The kind of work a run performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    /// A Python snippet executed in a single-use sandbox.
    Python,
    /// A read-only SQL query against a configured database.
    Sql,
    /// A metrics query (PromQL or the service's own counters).
    Metrics,
}

impl Tool {
    /// Every tool, in the order the server lists them.
    pub const ALL: [Tool; 3] = [Tool::Python, Tool::Sql, Tool::Metrics];

    /// The lowercase name used in the resource (`spec`), status, printer columns and policy.
    pub fn as_str(self) -> &'static str {
        match self {
            Tool::Python => "python",
            Tool::Sql => "sql",
            Tool::Metrics => "metrics",
        }
    }

    /// The MCP tool's name, as agents call it and as the `tool` label of call metrics says it.
    pub fn mcp_name(self) -> &'static str {
        match self {
            Tool::Python => "run_python",
            Tool::Sql => "execute_sql",
            Tool::Metrics => "fetch_metrics",
        }
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The environment a run targets; policy is stricter the closer it is to production. Ordered
/// from least to most sensitive (`Sandbox < Staging < Production`): a call that reaches a
/// database or a Prometheus bound to a more sensitive environment than it names is judged in that
/// one (`CallContext::reaching`, in the policy module).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Environment {
    /// Throw-away data and code; the default.
    #[default]
    Sandbox,
    /// Pre-production systems.
    Staging,
    /// Production systems.
    Production,
}

impl Environment {
    /// Every environment, least to most sensitive.
    pub const ALL: [Environment; 3] = [
        Environment::Sandbox,
        Environment::Staging,
        Environment::Production,
    ];

    /// The lowercase name used in the resource, policy files, logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Environment::Sandbox => "sandbox",
            Environment::Staging => "staging",
            Environment::Production => "production",
        }
    }
}

impl fmt::Display for Environment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What policy decided about a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Verdict {
    /// The run may proceed.
    Allow,
    /// The run is refused.
    Block,
    /// The run waits for a person to approve it.
    Escalate,
}

impl Verdict {
    /// The name as it appears in the API (`status.decision.verdict`), audit lines and metric
    /// labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "Allow",
            Verdict::Block => "Block",
            Verdict::Escalate => "Escalate",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a run is in its life. The terminal phases never change again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    /// Accepted; its sandbox is being prepared.
    Pending,
    /// Policy escalated it; it waits for `spec.approval.approved`.
    AwaitingApproval,
    /// The code is executing.
    Running,
    /// The code ran to completion with exit code 0.
    Succeeded,
    /// The run ended without success: non-zero exit, out of memory, lost sandbox, no result.
    Failed,
    /// The run exceeded its timeout and was stopped.
    TimedOut,
    /// The run was refused before anything executed (policy, or a tool not available).
    Rejected,
    /// The caller went away (the MCP request was cancelled or its connection dropped) before the
    /// run ended; whatever was executing was stopped.
    Cancelled,
}

impl Phase {
    /// Whether the phase is final.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Phase::Succeeded | Phase::Failed | Phase::TimedOut | Phase::Rejected | Phase::Cancelled
        )
    }

    /// Every phase, in lifecycle order (for metrics that report each one).
    pub const ALL: [Phase; 8] = [
        Phase::Pending,
        Phase::AwaitingApproval,
        Phase::Running,
        Phase::Succeeded,
        Phase::Failed,
        Phase::TimedOut,
        Phase::Rejected,
        Phase::Cancelled,
    ];

    /// The name as it appears in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::AwaitingApproval => "AwaitingApproval",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::TimedOut => "TimedOut",
            Phase::Rejected => "Rejected",
            Phase::Cancelled => "Cancelled",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a run is in its phase (`status.reason`), for the reasons sandboxrun itself gives. The
/// kubelet's own reasons for a failed Pod (`Evicted`, ...) are passed through as text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The code exited with status 0.
    Succeeded,
    /// The code exited with a non-zero status or was killed by a signal it was not sent for
    /// memory.
    NonZeroExit,
    /// The sandbox was killed for exceeding its memory limit.
    OomKilled,
    /// The code or its sandbox ran past the deadline.
    DeadlineExceeded,
    /// The sandbox ended without a readable result.
    NoResult,
    /// The sandbox Pod was deleted before the run finished.
    PodDeleted,
    /// The sandbox Pod failed without a result (evicted, lost with its node).
    PodFailed,
    /// The sandbox image cannot be pulled.
    ImageUnavailable,
    /// The API server refused the sandbox Pod for good.
    PodCreationFailed,
    /// The run waits in its namespace's fair queue for a sandbox (`status.queuePosition`).
    Queued,
    /// No sandbox could start the run within the time it may wait for one: refused, nothing
    /// executed, to be retried after `status.retryAfterSeconds`.
    NoCapacity,
    /// The sandbox Pod was created and waits to start.
    PodCreated,
    /// The run claimed an idle, started sandbox of a SandboxPool.
    WarmSandboxClaimed,
    /// The sandbox's container started.
    ContainerStarted,
    /// Policy blocked the run.
    PolicyBlocked,
    /// A person denied the escalated run.
    ApprovalDenied,
    /// Nobody decided on the escalated run in time.
    ApprovalTimedOut,
    /// The run needs a person's approval, which this mode cannot offer (embedded).
    ApprovalUnavailable,
    /// The run asks for a tool this installation does not execute.
    ToolNotImplemented,
    /// The run sets no tool.
    NoTool,
    /// The run's tool section is missing.
    NoQuery,
    /// The run needs a policy and the operator has none.
    PolicyRequired,
    /// The caller cancelled the call (`spec.cancelled`) before the run ended.
    CallCancelled,
    /// An operator replica claimed the query and is executing it.
    QueryStarted,
    /// The replica that claimed the query stopped before recording its result: the query ran at
    /// most once, and may not have.
    QueryInterrupted,
    /// A query returned its result.
    QueryCompleted,
    /// A query ran past its statement timeout.
    QueryTimedOut,
    /// A query failed in the database or the metrics source.
    QueryFailed,
    /// A metrics query or its times are not valid.
    InvalidQuery,
    /// The Prometheus could not be reached.
    PrometheusUnavailable,
    /// The run asks for a sandbox profile this installation has no image for.
    ProfileUnavailable,
    /// The sandbox's network isolation could not be shown to hold (its NetworkPolicy was not in
    /// force yet when its time to wait ran out): its runner never read the code.
    IsolationNotInForce,
    /// A call named a session that is not one of the caller's open sessions (unknown, another
    /// agent's, or ended).
    SessionNotFound,
    /// A call would open more sessions than policy lets the agent hold at once.
    SessionLimit,
    /// The session's sandbox could not be started.
    SessionUnavailable,
}

impl Reason {
    /// The CamelCase name written into `status.reason` and conditions.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Succeeded => "Succeeded",
            Reason::NonZeroExit => "NonZeroExit",
            Reason::OomKilled => "OOMKilled",
            Reason::DeadlineExceeded => "DeadlineExceeded",
            Reason::NoResult => "NoResult",
            Reason::PodDeleted => "PodDeleted",
            Reason::PodFailed => "PodFailed",
            Reason::ImageUnavailable => "ImageUnavailable",
            Reason::PodCreationFailed => "PodCreationFailed",
            Reason::Queued => "Queued",
            Reason::NoCapacity => "NoCapacity",
            Reason::PodCreated => "PodCreated",
            Reason::WarmSandboxClaimed => "WarmSandboxClaimed",
            Reason::ContainerStarted => "ContainerStarted",
            Reason::PolicyBlocked => "PolicyBlocked",
            Reason::ApprovalDenied => "ApprovalDenied",
            Reason::ApprovalTimedOut => "ApprovalTimedOut",
            Reason::ApprovalUnavailable => "ApprovalUnavailable",
            Reason::ToolNotImplemented => "ToolNotImplemented",
            Reason::NoTool => "NoTool",
            Reason::NoQuery => "NoQuery",
            Reason::PolicyRequired => "PolicyRequired",
            Reason::CallCancelled => "CallCancelled",
            Reason::QueryStarted => "QueryStarted",
            Reason::QueryInterrupted => "QueryInterrupted",
            Reason::QueryCompleted => "QueryCompleted",
            Reason::QueryTimedOut => "QueryTimedOut",
            Reason::QueryFailed => "QueryFailed",
            Reason::InvalidQuery => "InvalidQuery",
            Reason::PrometheusUnavailable => "PrometheusUnavailable",
            Reason::ProfileUnavailable => "ProfileUnavailable",
            Reason::IsolationNotInForce => "IsolationNotInForce",
            Reason::SessionNotFound => "SessionNotFound",
            Reason::SessionLimit => "SessionLimit",
            Reason::SessionUnavailable => "SessionUnavailable",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<Reason> for str {
    fn eq(&self, other: &Reason) -> bool {
        self == other.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_phases() {
        let terminal: Vec<_> = Phase::ALL.into_iter().filter(|p| p.is_terminal()).collect();
        assert_eq!(
            terminal,
            [
                Phase::Succeeded,
                Phase::Failed,
                Phase::TimedOut,
                Phase::Rejected,
                Phase::Cancelled
            ]
        );
    }

    #[test]
    fn wire_names() {
        for p in Phase::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
        assert_eq!(serde_json::to_value(Tool::Python).unwrap(), "python");
        assert_eq!(
            serde_json::to_value(Environment::default()).unwrap(),
            "sandbox"
        );
        for v in [Verdict::Allow, Verdict::Block, Verdict::Escalate] {
            assert_eq!(serde_json::to_value(v).unwrap(), v.as_str());
        }
        for e in Environment::ALL {
            assert_eq!(serde_json::to_value(e).unwrap(), e.as_str());
        }
        for t in Tool::ALL {
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
        assert_eq!(Tool::Sql.mcp_name(), "execute_sql");
    }
}

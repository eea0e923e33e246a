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
    /// The lowercase name used in labels, status and printer columns.
    pub fn as_str(self) -> &'static str {
        match self {
            Tool::Python => "python",
            Tool::Sql => "sql",
            Tool::Metrics => "metrics",
        }
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The environment a run targets; policy is stricter the closer it is to production.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
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
}

impl Phase {
    /// Whether the phase is final.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Phase::Succeeded | Phase::Failed | Phase::TimedOut | Phase::Rejected
        )
    }

    /// Every phase, in lifecycle order (for metrics that report each one).
    pub const ALL: [Phase; 7] = [
        Phase::Pending,
        Phase::AwaitingApproval,
        Phase::Running,
        Phase::Succeeded,
        Phase::Failed,
        Phase::TimedOut,
        Phase::Rejected,
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
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
                Phase::Rejected
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
        assert_eq!(serde_json::to_value(Verdict::Escalate).unwrap(), "Escalate");
    }
}

//! The policy gate, pure: what the operator asks policy about a run, and how the recorded
//! decision and the run's approval turn into the next step. The operator is the authoritative
//! gate: a run created directly (not through the frontend) is judged here all the same.
//!
//! - `Allow`: the run proceeds, with the decision's limits (never above the requested ones).
//! - `Block`: the run ends `Rejected` (`PolicyBlocked`), no Pod is ever created.
//! - `Escalate`: the run waits in `AwaitingApproval` (no Pod) until a person sets
//!   `spec.approval.approved`: `true` proceeds, `false` ends it `Rejected` (`ApprovalDenied`);
//!   no answer within the approval timeout ends it `Rejected` (`ApprovalTimedOut`). The words
//!   the person gave (`spec.approval.reason`) go into the `Approved` condition, the message of a
//!   denied run, its Events and its audit line.
//!
//! An approval only counts when a person wrote it after the run began waiting for one: the
//! operator records when waiting began (`status.approvalRequest`: the time, the run's generation
//! and any approval the run already carried), and an approval counts only at a later generation
//! and when it is not the one already there ([`approval_state`]). The schema backs this up: no
//! approval at creation, and `spec.approval` changes only while the run awaits approval
//! (`crds/src/run.rs`); the chart's admission policy checks who writes it.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sandboxrun_api::{
    Approval, ApprovalRequest, CONDITION_COMPLETED, CONDITION_STARTED, SandboxRunSpec,
    SandboxRunStatus,
};
use sandboxrun_core::policy::DEFAULT_ROWS;
use sandboxrun_core::policy::SessionUse;
use sandboxrun_core::tools::python as python_tool;
use sandboxrun_core::tools::python_session::NEW_SESSION;
use sandboxrun_core::{CallContext, FileCaps, Phase, Reason, Tool, Verdict};

use crate::outcome::{Outcome, rejected, set_condition};

/// Condition type: a person approved the run (True), or not (False, reason says why).
pub const CONDITION_APPROVED: &str = "Approved";
/// Reason of the `Approved=True` condition (core's [`Reason`] names why runs end, not this).
pub const APPROVED: &str = "Approved";
/// Rule name of the decisions taken when the operator runs without a policy file.
pub const NO_POLICY_RULE: &str = "no-policy";

/// The call as the run states it: its agent, tool and environment, the limits it requests and,
/// for sql runs, the query; for python runs (through core's builder), the sandbox profile and
/// the input files. What only the configuration knows (a database's dialect and environment, the
/// Prometheus's environment) is added by the tool's own builder in core
/// (`Context::call_context`).
pub fn call_context(spec: &SandboxRunSpec, tool: Tool) -> CallContext {
    let limits = spec.limits.effective();
    if let Some(python) = spec.python.as_ref().filter(|_| tool == Tool::Python) {
        return python_tool::call_context(
            &spec.agent,
            spec.environment,
            limits,
            python.sandbox_profile(),
            &python.files,
            python.session.as_ref().map(|name| match name.as_str() {
                NEW_SESSION => SessionUse::Open,
                _ => SessionUse::Continue,
            }),
        );
    }
    let mut call = CallContext::new(spec.agent.clone(), tool, spec.environment);
    call.limits = limits;
    if let Some(sql) = spec.sql.as_ref().filter(|_| tool == Tool::Sql) {
        call = if sql.schema {
            call.with_schema_read(sql.database.clone())
        } else {
            call.with_sql(sql.database.clone(), sql.query.clone())
        };
    }
    call
}

/// Everything policy sees of a run: the call as the run states it ([`call_context`]), completed
/// by the tool's one context builder in core with what the operator's configuration knows of its
/// target (an sql run's database: dialect and environment; a metrics run's Prometheus, when
/// there is one: `prometheus`, its environment). The embedded server builds the same context with
/// the same core functions.
pub fn full_context(
    spec: &SandboxRunSpec,
    tool: Tool,
    databases: Option<&sandboxrun_core::Databases>,
    prometheus: Option<sandboxrun_core::Environment>,
) -> CallContext {
    let call = call_context(spec, tool);
    match tool {
        Tool::Python => call,
        Tool::Sql => match databases {
            Some(databases) => sandboxrun_core::tools::sql::call_context(databases, call),
            None => call,
        },
        Tool::Metrics => sandboxrun_core::tools::metrics::call_context(prometheus, call),
    }
}

/// The decision when the operator has no policy file and was told to allow everything
/// (`--allow-all-without-policy`): allow, with the requested limits.
pub fn allow_all(call: &CallContext) -> sandboxrun_core::Decision {
    sandboxrun_core::Decision {
        verdict: Verdict::Allow,
        rule: NO_POLICY_RULE.to_owned(),
        reason: "the operator runs without a policy file (--policy-file) and was told to allow \
                 every run (--allow-all-without-policy)"
            .to_owned(),
        limits: call.limits.clamped(),
        max_rows: call.rows.unwrap_or(DEFAULT_ROWS),
        rewritten_query: None,
        schema: None,
        metrics: None,
        files: FileCaps::default(),
        sessions: None,
    }
}

/// The decision for every run when the operator has no policy and no explicit opt-in: the
/// operator fails closed.
pub fn block_all(call: &CallContext) -> sandboxrun_core::Decision {
    sandboxrun_core::Decision {
        verdict: Verdict::Block,
        rule: NO_POLICY_RULE.to_owned(),
        reason: "the operator runs without a policy file (--policy-file), so it blocks every run: \
                 install a policy (chart value policy.enabled), or, for a test cluster only, \
                 start the operator with --allow-all-without-policy"
            .to_owned(),
        limits: call.limits.clamped(),
        max_rows: 0,
        rewritten_query: None,
        schema: None,
        metrics: None,
        files: FileCaps::default(),
        sessions: None,
    }
}

/// Where a person's approval of a run stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApprovalState {
    /// Nobody answered yet (or the answer was part of the run as created, which does not count).
    Pending,
    /// A person (`by`) set `spec.approval.approved: true`.
    Approved {
        /// Who approved (`spec.approval.by`).
        by: String,
        /// Why, in their words (`spec.approval.reason`), if they said.
        reason: Option<String>,
    },
    /// A person (`by`) set `spec.approval.approved: false`.
    Denied {
        /// Who denied (`spec.approval.by`).
        by: String,
        /// Why, in their words (`spec.approval.reason`), if they said.
        reason: Option<String>,
    },
}

impl ApprovalState {
    /// Who decided, if anyone did.
    pub fn by(&self) -> Option<&str> {
        match self {
            Self::Pending => None,
            Self::Approved { by, .. } | Self::Denied { by, .. } => Some(by),
        }
    }

    /// Why the person decided so, if anyone decided and said why.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Pending => None,
            Self::Approved { reason, .. } | Self::Denied { reason, .. } => reason.as_deref(),
        }
    }
}

/// The reason of an approval as recorded: trimmed, and none when blank.
fn given_reason(approval: &Approval) -> Option<String> {
    approval
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_owned)
}

/// `text`, followed by `: reason` when the person gave one.
fn with_reason(text: String, reason: Option<&str>) -> String {
    match reason {
        Some(reason) => format!("{text}: {reason}"),
        None => text,
    }
}

/// What the `Approved=True` condition and the `Approved` Event say: who approved, and why.
pub fn approved_message(by: &str, reason: Option<&str>) -> String {
    with_reason(
        format!("{by} approved the run (spec.approval.approved: true)"),
        reason,
    )
}

/// Who decided, as recorded (an approval from before `by` existed names nobody).
fn approver(approval: &Approval) -> String {
    if approval.by.is_empty() {
        "a person (spec.approval.by not set)".to_owned()
    } else {
        approval.by.clone()
    }
}

/// The approval state of a run from its `spec.approval`, its `metadata.generation` and the
/// record of when it began waiting (`status.approvalRequest`). An approval counts only if the
/// run began waiting before it was written: a later generation than the one recorded then, and
/// not the approval the run already carried then. So nothing written at creation, or before the
/// run was escalated, counts, however many other changes raise the generation afterwards.
pub fn approval_state(
    approval: Option<&Approval>,
    request: Option<&ApprovalRequest>,
    generation: Option<i64>,
) -> ApprovalState {
    let Some(request) = request else {
        // The run never began waiting: nobody was asked yet.
        return ApprovalState::Pending;
    };
    let written_since = generation.is_some_and(|g| g > request.generation);
    match approval {
        Some(_) if !written_since => ApprovalState::Pending,
        Some(a) if request.void.as_ref() == Some(a) => ApprovalState::Pending,
        Some(a) if a.approved => ApprovalState::Approved {
            by: approver(a),
            reason: given_reason(a),
        },
        Some(a) => ApprovalState::Denied {
            by: approver(a),
            reason: given_reason(a),
        },
        None => ApprovalState::Pending,
    }
}

/// The next step of a run that has a decision.
#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// Go on: create the Pod (or execute the tool).
    Proceed,
    /// Wait for a person, at most until `deadline`.
    Await {
        /// When the wait ends `Rejected` (`ApprovalTimedOut`).
        deadline: Timestamp,
    },
    /// End the run without executing anything.
    Reject(Outcome),
}

/// Decides the next step from the recorded decision and the approval. `since` is when the run
/// was escalated (see [`awaiting_since`]).
pub fn gate(
    decision: &sandboxrun_api::Decision,
    approval: ApprovalState,
    since: Timestamp,
    timeout: SignedDuration,
    now: Timestamp,
) -> Gate {
    match decision.verdict {
        Verdict::Allow => Gate::Proceed,
        Verdict::Block => Gate::Reject(rejected(
            Reason::PolicyBlocked,
            format!(
                "blocked by policy rule {}: {}",
                decision.rule, decision.reason
            ),
            now,
        )),
        Verdict::Escalate => match approval {
            ApprovalState::Approved { .. } => Gate::Proceed,
            ApprovalState::Denied { by, reason } => Gate::Reject(rejected(
                Reason::ApprovalDenied,
                with_reason(
                    format!(
                        "policy rule {} escalated the run ({}) and {by} denied it (spec.approval.approved: false)",
                        decision.rule, decision.reason
                    ),
                    reason.as_deref(),
                ),
                now,
            )),
            ApprovalState::Pending => {
                let deadline = since.checked_add(timeout).unwrap_or(since);
                if now >= deadline {
                    Gate::Reject(rejected(
                        Reason::ApprovalTimedOut,
                        format!(
                            "policy rule {} escalated the run ({}) and nobody approved it within {:#}",
                            decision.rule, decision.reason, timeout
                        ),
                        now,
                    ))
                } else {
                    Gate::Await { deadline }
                }
            }
        },
    }
}

/// When the run started waiting for approval: its record of it, else the transition time of its
/// `Approved=False` condition, else its creation, else `now`.
pub fn awaiting_since(
    status: &SandboxRunStatus,
    created: Option<&Time>,
    now: Timestamp,
) -> Timestamp {
    status
        .approval_request
        .as_ref()
        .map(|r| r.since.0)
        .or_else(|| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == CONDITION_APPROVED && c.status == "False")
                .map(|c| c.last_transition_time.0)
        })
        .or(created.map(|t| t.0))
        .unwrap_or(now)
}

/// The record that the run begins waiting now, at `generation`, carrying `approval` already
/// (which will never count).
pub fn approval_request(
    approval: Option<&Approval>,
    generation: i64,
    now: Timestamp,
) -> ApprovalRequest {
    ApprovalRequest {
        since: Time(now),
        generation,
        void: approval.cloned(),
    }
}

/// The status that records a fresh decision; nothing else changes.
pub fn decided_status(
    prev: &SandboxRunStatus,
    tool: Tool,
    decision: sandboxrun_api::Decision,
    generation: Option<i64>,
) -> SandboxRunStatus {
    SandboxRunStatus {
        tool: Some(tool),
        decision: Some(decision),
        observed_generation: generation,
        ..prev.clone()
    }
}

/// The status of a run waiting for a person's approval (`approve` is the command to approve it),
/// since `request`.
pub fn awaiting_status(
    prev: &SandboxRunStatus,
    tool: Tool,
    approve: &str,
    request: ApprovalRequest,
    generation: Option<i64>,
    now: Timestamp,
) -> SandboxRunStatus {
    let mut s = SandboxRunStatus {
        phase: Some(Phase::AwaitingApproval),
        tool: Some(tool),
        decision: prev.decision.clone(),
        approval_request: Some(request),
        conditions: prev.conditions.clone(),
        observed_generation: generation,
        ..Default::default()
    };
    let (rule, reason) = prev
        .decision
        .as_ref()
        .map_or(("", ""), |d| (d.rule.as_str(), d.reason.as_str()));
    let message = format!(
        "policy rule {rule} escalated the run ({reason}); it waits for a person: {approve} (or \"approved\":false to deny)"
    );
    // The phase is its own reason: the run waits for a person.
    let reason = Phase::AwaitingApproval.as_str();
    s.reason = Some(reason.to_owned());
    s.message = Some(message.clone());
    for type_ in [CONDITION_APPROVED, CONDITION_STARTED, CONDITION_COMPLETED] {
        set_condition(
            &mut s.conditions,
            type_,
            false,
            reason,
            &message,
            generation,
            now,
        );
    }
    s
}

/// Marks the approval by `by` (who said `reason`, if anything) on a status (the condition
/// `Approved=True`), before the run proceeds.
pub fn mark_approved(
    status: &mut SandboxRunStatus,
    by: &str,
    reason: Option<&str>,
    generation: Option<i64>,
    now: Timestamp,
) {
    set_condition(
        &mut status.conditions,
        CONDITION_APPROVED,
        true,
        APPROVED,
        &approved_message(by, reason),
        generation,
        now,
    );
}

/// Marks a rejection of the approval (`ApprovalDenied`, `ApprovalTimedOut`) on a status.
pub fn mark_not_approved(
    status: &mut SandboxRunStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    set_condition(
        &mut status.conditions,
        CONDITION_APPROVED,
        false,
        reason,
        message,
        generation,
        now,
    );
}

/// The one-liner that approves a run, recording who runs it (`kubectl auth whoami`): the chart's
/// identity policy admits an approval only when `by` is the writer's own name.
pub fn approve_command(name: &str, namespace: &str) -> String {
    let whoami = "$(kubectl auth whoami -o jsonpath='{.status.userInfo.username}')";
    format!(
        r#"kubectl patch sandboxrun {name} -n {namespace} --type merge -p "{{\"spec\":{{\"approval\":{{\"approved\":true,\"by\":\"{whoami}\"}}}}}}""#
    )
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;

//! `approve` and `deny`: write `spec.approval` of a run that awaits approval, naming the caller
//! as the one who decided (the chart's admission policy admits an approval only when `by` is the
//! writer's own user name), with their reason. The patch is conditional on the run being the one
//! that was checked (its resourceVersion), so a decision never lands on a run that changed in
//! between (someone else decided, the approval timed out).

use anyhow::{Result, bail};
use kube::api::{Patch, PatchParams};
use kube::{Client, ResourceExt};
use sandboxrun_api::SandboxRun;
use sandboxrun_core::Phase;
use serde_json::{Value, json};

use crate::cluster::{self, Doing, explain};
use crate::term::{note, say};

/// Attempts when the run changes between the check and the write.
const ATTEMPTS: u32 = 3;

/// Approves (`approved`) or denies the run `name` in `namespace` as the caller, with `reason`.
pub async fn decide(
    client: &Client,
    namespace: &str,
    name: &str,
    approved: bool,
    reason: Option<&str>,
) -> Result<()> {
    let me = cluster::whoami(client).await?;
    let api = cluster::runs(client, namespace);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let run = api
            .get(name)
            .await
            .map_err(|e| explain(e, &Doing::runs("get", namespace, Some(name))))?;
        if let Err(why) = check_decidable(&run) {
            bail!(why);
        }
        let rv = run.resource_version();
        let patch = approval_patch(approved, &me, reason, rv.as_deref());
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => break,
            // Changed since it was read: look again (it may no longer await approval).
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < ATTEMPTS => continue,
            Err(e) => return Err(explain(e, &Doing::runs("patch", namespace, Some(name)))),
        }
    }
    if approved {
        say!("SandboxRun {name} approved by {me}");
        note!("follow it: kubectl sandboxrun logs {name} -n {namespace} -f");
    } else {
        say!(
            "SandboxRun {name} denied by {me}: {}",
            reason.unwrap_or_default()
        );
    }
    Ok(())
}

/// The merge patch that records the decision. `reason: null` removes an earlier reason (one
/// written at creation, which never counts), so the record says only what this person said.
pub fn approval_patch(
    approved: bool,
    by: &str,
    reason: Option<&str>,
    resource_version: Option<&str>,
) -> Value {
    let mut patch = json!({
        "spec": { "approval": { "approved": approved, "by": by, "reason": reason } }
    });
    if let Some(rv) = resource_version {
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    patch
}

/// Whether the run can be approved or denied now, else why not, in words a person acts on.
pub fn check_decidable(run: &SandboxRun) -> Result<(), String> {
    let name = run.name_any();
    let status = run.status.clone().unwrap_or_default();
    let not_awaiting = format!("SandboxRun {name} is not AwaitingApproval");
    match status.phase {
        None => Err(format!(
            "{not_awaiting}: the operator has not judged it yet (is the sandboxrun operator \
             running and watching namespace {}?); try again in a moment",
            run.namespace().unwrap_or_default()
        )),
        Some(phase) if phase.is_terminal() => {
            let reason = status.reason.as_deref().unwrap_or("no reason given");
            Err(format!(
                "{not_awaiting}: it already ended {phase} ({reason}); nothing to decide"
            ))
        }
        Some(Phase::AwaitingApproval) => match decided_by(run) {
            Some((approved, by)) => Err(format!(
                "SandboxRun {name} was already {} by {by}; the operator has not acted on it yet",
                if approved { "approved" } else { "denied" }
            )),
            None => Ok(()),
        },
        Some(phase) => {
            let why = match decided_by(run) {
                Some((true, by)) => format!("{by} approved it already"),
                _ => "policy allowed it, so it needs no approval".to_owned(),
            };
            Err(format!("{not_awaiting} but {phase}: {why}"))
        }
    }
}

/// The decision recorded in the spec that counts (one written at creation does not, as the
/// operator has it: `metadata.generation` above 1), and who made it.
fn decided_by(run: &SandboxRun) -> Option<(bool, String)> {
    let approval = run.spec.approval.as_ref()?;
    (run.metadata.generation.unwrap_or(1) > 1).then(|| (approval.approved, approval.by.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(status: Value, spec_extra: Value, generation: i64) -> SandboxRun {
        let mut spec = json!({"agent": "e2e", "python": {"code": "print(1)"}});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
            spec.extend(extra.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "sandboxrun.dev/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": "run-1", "namespace": "runs", "generation": generation},
            "spec": spec,
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn an_awaiting_run_can_be_decided() {
        let r = run(json!({"phase": "AwaitingApproval"}), json!({}), 1);
        assert_eq!(check_decidable(&r), Ok(()));
        // An approval written at creation does not count: still open.
        let r = run(
            json!({"phase": "AwaitingApproval"}),
            json!({"approval": {"approved": true, "by": "e2e"}}),
            1,
        );
        assert_eq!(check_decidable(&r), Ok(()));
    }

    #[test]
    fn a_run_that_does_not_await_approval_is_refused_with_why() {
        let ended = run(
            json!({"phase": "Rejected", "reason": "ApprovalTimedOut"}),
            json!({}),
            1,
        );
        assert_eq!(
            check_decidable(&ended).unwrap_err(),
            "SandboxRun run-1 is not AwaitingApproval: it already ended Rejected (ApprovalTimedOut); nothing to decide"
        );
        let allowed = run(json!({"phase": "Running"}), json!({}), 1);
        assert_eq!(
            check_decidable(&allowed).unwrap_err(),
            "SandboxRun run-1 is not AwaitingApproval but Running: policy allowed it, so it needs no approval"
        );
        let approved = run(
            json!({"phase": "Pending"}),
            json!({"approval": {"approved": true, "by": "alice"}}),
            2,
        );
        assert_eq!(
            check_decidable(&approved).unwrap_err(),
            "SandboxRun run-1 is not AwaitingApproval but Pending: alice approved it already"
        );
        let fresh = run(json!({}), json!({}), 1);
        assert!(
            check_decidable(&fresh)
                .unwrap_err()
                .contains("the operator has not judged it yet"),
        );
    }

    #[test]
    fn a_decision_the_operator_has_not_seen_yet_is_not_overwritten() {
        let r = run(
            json!({"phase": "AwaitingApproval"}),
            json!({"approval": {"approved": false, "by": "bob"}}),
            2,
        );
        assert_eq!(
            check_decidable(&r).unwrap_err(),
            "SandboxRun run-1 was already denied by bob; the operator has not acted on it yet"
        );
    }

    #[test]
    fn the_patch_names_the_caller_and_is_conditional() {
        assert_eq!(
            approval_patch(false, "bob", Some("no ticket"), Some("42")),
            json!({
                "metadata": {"resourceVersion": "42"},
                "spec": {"approval": {"approved": false, "by": "bob", "reason": "no ticket"}}
            })
        );
        // Without a reason, an earlier one is removed.
        assert_eq!(
            approval_patch(true, "alice", None, None),
            json!({"spec": {"approval": {"approved": true, "by": "alice", "reason": null}}})
        );
        // The API types read it back as the operator will.
        let patch = approval_patch(false, "bob", Some("no ticket"), None);
        let approval: sandboxrun_api::Approval =
            serde_json::from_value(patch["spec"]["approval"].clone()).unwrap();
        assert_eq!(
            (
                approval.approved,
                approval.by.as_str(),
                approval.reason.as_deref()
            ),
            (false, "bob", Some("no ticket"))
        );
    }
}

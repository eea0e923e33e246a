//! The operator as the authoritative policy gate, on a real cluster with the chart's default
//! policy (values.yaml `policy:`: python in `sandbox` allowed for any agent, `production`
//! escalated, everything else blocked). Runs are created directly, as `kubectl apply` would: the
//! frontend is not the only gate.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use anyhow::{Result, ensure};
use kube::Client;
use sandboxrun_api::SandboxRun;
use sandboxrun_core::{Phase, Verdict};
use sandboxrun_e2e::client;
use sandboxrun_e2e::governance::*;
use sandboxrun_e2e::runs::*;
use serde_json::json;

const DECIDE_TIMEOUT: Duration = Duration::from_secs(60);
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// The run left exactly one audit line, with this verdict, phase and reason.
async fn audited(
    client: &Client,
    name: &str,
    verdict: &str,
    phase: &str,
    reason: &str,
) -> Result<()> {
    let line = the_audit_line(client, name).await?;
    ensure!(
        line["tool"] == "python" && line["verdict"] == verdict && line["phase"] == phase,
        "{line}"
    );
    ensure!(line["phase_reason"] == reason, "{line}");
    Ok(())
}

fn status(run: &SandboxRun) -> sandboxrun_api::SandboxRunStatus {
    run.status.clone().unwrap_or_default()
}

/// Creates a production run and waits until it awaits approval, without a Pod.
async fn awaiting_production_run(
    client: &Client,
    prefix: &str,
    extra: serde_json::Value,
) -> Result<String> {
    let run = python_run_in(prefix, "production", "print('approved run')", extra);
    let name = create(client, &run).await?;
    let run = wait_for(client, &name, DECIDE_TIMEOUT, |p| {
        p == Phase::AwaitingApproval
    })
    .await?;
    let d = decision(&run);
    ensure!(
        d.as_ref().is_some_and(|d| d.verdict == Verdict::Escalate),
        "decision {d:?}"
    );
    ensure!(status(&run).pod_name.is_none(), "{:?}", status(&run));
    // Still waiting a moment later, and still without a Pod.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = runs(client).get(&name).await?;
    ensure!(
        run_phase(&again) == Some(Phase::AwaitingApproval),
        "{:?}",
        again.status
    );
    ensure!(
        pods_of(client, &name).await?.is_empty(),
        "a Pod exists before approval"
    );
    wait_events(client, &name, &["PolicyEscalated"], EVENT_TIMEOUT).await?;
    Ok(name)
}

#[tokio::test]
async fn a_run_violating_policy_is_rejected_without_a_pod() -> Result<()> {
    let client = client().await?;
    let run = python_run_in("gov-staging", "staging", "print('must not run')", json!({}));
    let name = create(&client, &run).await?;
    let run = wait_terminal(&client, &name, DECIDE_TIMEOUT).await?;
    let st = status(&run);
    ensure!(run_phase(&run) == Some(Phase::Rejected), "{st:?}");
    ensure!(st.reason.as_deref() == Some("PolicyBlocked"), "{st:?}");
    let d = decision(&run).expect("a decision is recorded");
    ensure!(d.verdict == Verdict::Block, "{d:?}");
    ensure!(!d.rule.is_empty() && !d.reason.is_empty(), "{d:?}");
    ensure!(
        st.message.as_deref().is_some_and(|m| m.contains(&d.reason)),
        "the message carries the policy's reason: {st:?}"
    );
    ensure!(st.pod_name.is_none() && st.exit_code.is_none(), "{st:?}");
    ensure!(pods_of(&client, &name).await?.is_empty(), "a Pod exists");
    let events = wait_events(&client, &name, &["PolicyBlocked"], EVENT_TIMEOUT).await?;
    ensure!(
        !events.iter().any(|r| r == "PodCreated"),
        "a Pod was created: {events:?}"
    );
    audited(&client, &name, "Block", "Rejected", "PolicyBlocked").await
}

#[tokio::test]
async fn an_escalated_run_waits_and_runs_after_approval() -> Result<()> {
    let client = client().await?;
    let name = awaiting_production_run(&client, "gov-approve", json!({})).await?;
    set_approval(&client, &name, true).await?;
    let run = wait_terminal(&client, &name, RUN_TIMEOUT).await?;
    let st = status(&run);
    ensure!(run_phase(&run) == Some(Phase::Succeeded), "{st:?}");
    ensure!(st.stdout.as_deref() == Some("approved run\n"), "{st:?}");
    ensure!(
        decision(&run).is_some_and(|d| d.verdict == Verdict::Escalate),
        "the decision stays on record: {st:?}"
    );
    ensure!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Approved" && c.status == "True"),
        "{:?}",
        st.conditions
    );
    // A sandbox after the approval: a cold one created, or a warm one claimed.
    let events = wait_events(&client, &name, &["Approved", "Succeeded"], EVENT_TIMEOUT).await?;
    ensure!(
        events
            .iter()
            .any(|r| r == "PodCreated" || r == "WarmSandboxClaimed"),
        "no sandbox: {events:?}"
    );
    wait_no_pods(&client, &name, Duration::from_secs(30)).await?;
    let reason = st.reason.clone().unwrap_or_default();
    audited(&client, &name, "Escalate", "Succeeded", &reason).await
}

#[tokio::test]
async fn an_escalated_run_is_rejected_after_a_denial() -> Result<()> {
    let client = client().await?;
    let name = awaiting_production_run(&client, "gov-deny", json!({})).await?;
    set_approval(&client, &name, false).await?;
    let run = wait_terminal(&client, &name, DECIDE_TIMEOUT).await?;
    let st = status(&run);
    ensure!(run_phase(&run) == Some(Phase::Rejected), "{st:?}");
    ensure!(st.reason.as_deref() == Some("ApprovalDenied"), "{st:?}");
    ensure!(st.pod_name.is_none(), "{st:?}");
    ensure!(pods_of(&client, &name).await?.is_empty(), "a Pod exists");
    audited(&client, &name, "Escalate", "Rejected", "ApprovalDenied").await
}

#[tokio::test]
async fn an_approval_counts_only_when_written_while_the_run_waits() -> Result<()> {
    let client = client().await?;
    // Whoever may create runs must not be able to approve their own escalated run: an approval
    // at creation is refused by the API server, approved or denied.
    for approved in [true, false] {
        let run = python_run_in(
            "gov-self",
            "production",
            "print('must not run')",
            json!({"approval": {"approved": approved, "by": "gov-self"}}),
        );
        let refused = create(&client, &run).await;
        let message = format!("{:?}", refused.err());
        ensure!(
            message.contains("spec.approval cannot be set when a run is created"),
            "an approval at creation was not refused: {message}"
        );
    }
    // Nor before the run waits for one, or once it went on: an allowed run, running or done.
    let allowed = python_run_in("gov-early", "sandbox", "print('ran')", json!({}));
    let early = create(&client, &allowed).await?;
    wait_for(&client, &early, RUN_TIMEOUT, |p| {
        p == Phase::Running || p.is_terminal()
    })
    .await?;
    let refused = set_approval(&client, &early, true).await;
    let message = format!("{:?}", refused.err());
    ensure!(
        message.contains("only while the run awaits approval"),
        "an approval of a run that never waited was not refused: {message}"
    );
    // A run that waits records when it began, at which generation and with no approval on it.
    let name = awaiting_production_run(&client, "gov-wait", json!({})).await?;
    let run = runs(&client).get(&name).await?;
    let request = status(&run)
        .approval_request
        .expect("the wait is recorded in the status");
    ensure!(
        request.void.is_none() && Some(request.generation) == run.metadata.generation,
        "{request:?}"
    );
    // A person's approval while it waits counts, and the condition, the Event and the audit line
    // name that person.
    set_approval(&client, &name, true).await?;
    let me = sandboxrun_e2e::identity::whoami(&client).await?;
    let done = wait_terminal(&client, &name, RUN_TIMEOUT).await?;
    let st = status(&done);
    ensure!(run_phase(&done) == Some(Phase::Succeeded), "{st:?}");
    let condition = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Approved" && c.status == "True")
        .expect("an Approved condition");
    ensure!(
        condition
            .message
            .starts_with(&format!("{me} approved the run")),
        "{condition:?}"
    );
    ensure!(
        condition.observed_generation > Some(request.generation),
        "the approval's own version is recorded: {condition:?}"
    );
    let line = the_audit_line(&client, &name).await?;
    ensure!(line["decided_by"] == me.as_str(), "{line}");
    ensure!(line["judged_in"] == "production", "{line}");
    Ok(())
}

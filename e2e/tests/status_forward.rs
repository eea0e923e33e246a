//! A run's status only moves forward (the CRD's `STATUS_FORWARD_RULE`), checked by the real API
//! server: every way a late or stale status write could undo a newer one is refused with the
//! rule's message, and every forward step is admitted. The run lives in a test namespace no
//! operator watches, so only this test writes its status.

use anyhow::{Result, ensure};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use sandboxrun_e2e::runs::python_run;
use sandboxrun_e2e::{TestNamespace, client};
use serde_json::{Value, json};

const MESSAGE: &str = "a run's status only moves forward";

async fn write(runs: &Api<sandboxrun_api::SandboxRun>, name: &str, status: Value) -> Result<()> {
    runs.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await?;
    Ok(())
}

/// Writes `status` and expects the rule's refusal.
async fn refused(
    runs: &Api<sandboxrun_api::SandboxRun>,
    name: &str,
    status: Value,
    what: &str,
) -> Result<()> {
    match write(runs, name, status).await {
        Ok(()) => anyhow::bail!("{what}: admitted"),
        Err(e) => {
            let text = format!("{e:#}");
            ensure!(text.contains(MESSAGE), "{what}: refused otherwise: {text}");
            Ok(())
        }
    }
}

#[tokio::test]
async fn a_status_never_goes_back() -> Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "status-forward", &[]).await?;
    let runs: Api<sandboxrun_api::SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let name = runs
        .create(
            &PostParams::default(),
            &python_run("forward", "print(1)", json!({})),
        )
        .await?
        .name_any();

    // Forward: awaiting approval, pending with its Pod, running.
    write(&runs, &name, json!({"phase": "AwaitingApproval"})).await?;
    write(&runs, &name, json!({"phase": "Pending", "podName": "p-1"})).await?;
    refused(
        &runs,
        &name,
        json!({"phase": "AwaitingApproval"}),
        "Pending back to AwaitingApproval",
    )
    .await?;
    write(&runs, &name, json!({"phase": "Running"})).await?;
    refused(
        &runs,
        &name,
        json!({"phase": "Pending"}),
        "Running back to Pending",
    )
    .await?;
    refused(&runs, &name, json!({"podName": "p-2"}), "another Pod").await?;
    refused(&runs, &name, json!({"podName": null}), "the Pod dropped").await?;
    refused(&runs, &name, json!({"phase": null}), "the phase dropped").await?;
    // Other fields move freely while the phase holds.
    write(&runs, &name, json!({"message": "still running"})).await?;
    // The end, once.
    write(&runs, &name, json!({"phase": "Succeeded", "exitCode": 0})).await?;
    for (phase, what) in [
        ("Running", "a finished run running again"),
        ("Failed", "a second end"),
        ("Cancelled", "cancelled after it ended"),
    ] {
        refused(&runs, &name, json!({ "phase": phase }), what).await?;
    }
    write(
        &runs,
        &name,
        json!({"phase": "Succeeded", "message": "done"}),
    )
    .await?;
    let run = runs.get(&name).await?;
    let status = run.status.expect("a status");
    ensure!(status.phase == Some(sandboxrun_core::Phase::Succeeded));
    ensure!(status.pod_name.as_deref() == Some("p-1"));
    Ok(())
}

//! The chart's RBAC, tested by acting as each service account (token from the TokenRequest API)
//! against the installation from e2e/install.sh: the frontend may only handle SandboxRuns, the
//! operator may do its job in the sandbox namespace and nothing more. Writes use server-side
//! dry-run, so nothing is left behind; the authorizer runs before dry-run is honoured.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, Error};
use sandboxrun_e2e::identity::{can_i, client_as};
use sandboxrun_e2e::runs::{RUNS_NAMESPACE, SYSTEM_NAMESPACE, python_run};
use sandboxrun_e2e::{SANDBOX_IMAGE, client, unique_name};
use serde_json::json;

/// Service accounts of the release `sandboxrun` (the chart names them `<release>-...`).
const FRONTEND_SA: &str = "sandboxrun-mcp";
const OPERATOR_SA: &str = "sandboxrun-operator";
/// The frontend's own API-key Secret, in the release namespace.
const API_KEYS_SECRET: &str = "sandboxrun-mcp-api-keys";

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

/// A Pod that passes the restricted Pod Security profile, the namespace's quota and the sandbox
/// Pod policy (labels, owner, read-only root: as the operator builds them), so that the only
/// possible refusal is the authorizer's.
fn sandbox_like_pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": unique_name("rbac-probe"),
            "labels": {
                "app.kubernetes.io/managed-by": "sandboxrun-operator",
                "sandboxrun.dev/pool": "rbac-probe",
                "sandboxrun.dev/tool": "python",
            },
            "ownerReferences": [{
                "apiVersion": "sandboxrun.dev/v1alpha1", "kind": "SandboxPool",
                "name": "rbac-probe", "uid": "00000000-0000-4000-8000-000000000000",
                "controller": true,
            }],
        },
        "spec": {
            "runtimeClassName": "gvisor",
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65532,
                "seccompProfile": { "type": "RuntimeDefault" }
            },
            "containers": [{
                "name": "probe", "image": SANDBOX_IMAGE,
                "command": ["python3", "-c", "print(1)"],
                "resources": {
                    "requests": { "cpu": "100m", "memory": "64Mi" },
                    "limits": { "cpu": "100m", "memory": "64Mi" }
                },
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": { "drop": ["ALL"] }
                }
            }]
        }
    }))
    .expect("probe Pod is valid")
}

/// Passes when the call was refused by RBAC (403 Forbidden), fails on success or other errors.
fn forbidden<T>(result: Result<T, Error>, what: &str) -> Result<()> {
    match result {
        Err(Error::Api(e)) if e.code == 403 => Ok(()),
        Err(e) => bail!("{what}: expected 403 Forbidden, got error {e}"),
        Ok(_) => bail!("{what}: expected 403 Forbidden, but it was allowed"),
    }
}

async fn as_frontend() -> Result<Client> {
    client_as(&client().await?, SYSTEM_NAMESPACE, FRONTEND_SA).await
}

async fn as_operator() -> Result<Client> {
    client_as(&client().await?, SYSTEM_NAMESPACE, OPERATOR_SA).await
}

#[tokio::test]
async fn frontend_cannot_create_pods_or_read_secrets() -> Result<()> {
    let fe = as_frontend().await?;
    for ns in [RUNS_NAMESPACE, SYSTEM_NAMESPACE] {
        let pods: Api<Pod> = Api::namespaced(fe.clone(), ns);
        forbidden(
            pods.create(&dry_run(), &sandbox_like_pod()).await,
            &format!("frontend creates a Pod in {ns}"),
        )?;
        forbidden(
            pods.list(&ListParams::default()).await,
            &format!("frontend lists Pods in {ns}"),
        )?;
        let secrets: Api<Secret> = Api::namespaced(fe.clone(), ns);
        forbidden(
            secrets.list(&ListParams::default()).await,
            &format!("frontend lists Secrets in {ns}"),
        )?;
    }
    // Not even its own API-key Secret: it gets the hashes through the mounted volume.
    let own: Api<Secret> = Api::namespaced(fe.clone(), SYSTEM_NAMESPACE);
    forbidden(
        own.get(API_KEYS_SECRET).await,
        "frontend reads its API-key Secret",
    )?;
    // It cannot forge a result (the status is the operator's), delete a run (the audit trail),
    // nor exec into a sandbox. It may patch runs, to cancel them; the identity admission policy
    // narrows that to spec.cancelled on its own unfinished runs (tests/identity.rs).
    ensure!(
        !can_i(
            &fe,
            "patch",
            "sandboxrun.dev",
            "sandboxruns",
            "status",
            RUNS_NAMESPACE
        )
        .await?,
        "frontend may patch sandboxruns/status"
    );
    ensure!(
        !can_i(
            &fe,
            "delete",
            "sandboxrun.dev",
            "sandboxruns",
            "",
            RUNS_NAMESPACE
        )
        .await?,
        "frontend may delete sandboxruns (the audit trail)"
    );
    ensure!(
        !can_i(&fe, "create", "", "pods", "exec", RUNS_NAMESPACE).await?,
        "frontend may exec into Pods"
    );
    ensure!(
        !can_i(&fe, "create", "", "pods", "attach", RUNS_NAMESPACE).await?,
        "frontend may attach to Pods"
    );
    // It reads sandbox logs (a run's output while it runs), and only in the sandbox namespace.
    ensure!(
        can_i(&fe, "get", "", "pods", "log", RUNS_NAMESPACE).await?,
        "frontend may not read sandbox logs (live output)"
    );
    ensure!(
        !can_i(&fe, "get", "", "pods", "log", SYSTEM_NAMESPACE).await?,
        "frontend may read logs in its own namespace"
    );
    Ok(())
}

#[tokio::test]
async fn frontend_can_create_and_follow_sandboxruns() -> Result<()> {
    // The positive control: the same token is accepted for what the frontend is for, so the
    // 403s above come from RBAC and not from a broken token.
    let fe = as_frontend().await?;
    let runs: Api<sandboxrun_api::SandboxRun> = Api::namespaced(fe.clone(), RUNS_NAMESPACE);
    runs.create(
        &dry_run(),
        &python_run("rbac-frontend", "print(1)", json!({})),
    )
    .await?;
    runs.list(&ListParams::default().limit(1)).await?;
    for verb in ["watch", "patch"] {
        ensure!(
            can_i(
                &fe,
                verb,
                "sandboxrun.dev",
                "sandboxruns",
                "",
                RUNS_NAMESPACE
            )
            .await?,
            "frontend may not {verb} sandboxruns"
        );
    }
    Ok(())
}

#[tokio::test]
async fn operator_can_do_what_it_needs() -> Result<()> {
    let op = as_operator().await?;
    // Sandbox Pods: create (admission, quota and Pod Security included, dry-run), list.
    let pods: Api<Pod> = Api::namespaced(op.clone(), RUNS_NAMESPACE);
    pods.create(&dry_run(), &sandbox_like_pod()).await?;
    pods.list(&ListParams::default().limit(1)).await?;
    let runs: Api<sandboxrun_api::SandboxRun> = Api::namespaced(op.clone(), RUNS_NAMESPACE);
    runs.list(&ListParams::default().limit(1)).await?;
    let needs = [
        ("watch", "", "pods", "", RUNS_NAMESPACE),
        ("delete", "", "pods", "", RUNS_NAMESPACE),
        ("get", "", "pods", "log", RUNS_NAMESPACE),
        ("create", "", "pods", "attach", RUNS_NAMESPACE),
        ("patch", "", "pods", "", RUNS_NAMESPACE),
        (
            "watch",
            "sandboxrun.dev",
            "sandboxpools",
            "",
            RUNS_NAMESPACE,
        ),
        (
            "patch",
            "sandboxrun.dev",
            "sandboxpools",
            "status",
            RUNS_NAMESPACE,
        ),
        // A pool that follows demand: its replicas, through the scale subresource only.
        (
            "patch",
            "sandboxrun.dev",
            "sandboxpools",
            "scale",
            RUNS_NAMESPACE,
        ),
        ("watch", "sandboxrun.dev", "sandboxruns", "", RUNS_NAMESPACE),
        (
            "delete",
            "sandboxrun.dev",
            "sandboxruns",
            "",
            RUNS_NAMESPACE,
        ),
        (
            "patch",
            "sandboxrun.dev",
            "sandboxruns",
            "status",
            RUNS_NAMESPACE,
        ),
        ("create", "events.k8s.io", "events", "", RUNS_NAMESPACE),
        // The runner's ConfigMap (operator/src/runner_files.rs): made, watched, made again.
        ("create", "", "configmaps", "", RUNS_NAMESPACE),
        ("watch", "", "configmaps", "", RUNS_NAMESPACE),
        ("delete", "", "configmaps", "", RUNS_NAMESPACE),
        (
            "create",
            "coordination.k8s.io",
            "leases",
            "",
            SYSTEM_NAMESPACE,
        ),
        (
            "patch",
            "coordination.k8s.io",
            "leases",
            "",
            SYSTEM_NAMESPACE,
        ),
        ("get", "coordination.k8s.io", "leases", "", SYSTEM_NAMESPACE),
        // A standby watches the Lease to take it once released (operator/src/leader.rs).
        (
            "watch",
            "coordination.k8s.io",
            "leases",
            "",
            SYSTEM_NAMESPACE,
        ),
    ];
    for (verb, group, resource, sub, ns) in needs {
        ensure!(
            can_i(&op, verb, group, resource, sub, ns).await?,
            "operator may not {verb} {group}/{resource}/{sub} in {ns}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn operator_is_confined_to_the_sandbox_namespace_and_reads_no_secrets() -> Result<()> {
    let op = as_operator().await?;
    // Secrets it needs (the databases file) come through a volume, never through the API.
    for ns in [RUNS_NAMESPACE, SYSTEM_NAMESPACE] {
        let secrets: Api<Secret> = Api::namespaced(op.clone(), ns);
        forbidden(
            secrets.list(&ListParams::default()).await,
            &format!("operator lists Secrets in {ns}"),
        )?;
    }
    ensure!(
        !can_i(&op, "create", "", "configmaps", "", SYSTEM_NAMESPACE).await?,
        "operator may make ConfigMaps outside the sandbox namespace"
    );
    let elsewhere: Api<Pod> = Api::namespaced(op.clone(), SYSTEM_NAMESPACE);
    forbidden(
        elsewhere.create(&dry_run(), &sandbox_like_pod()).await,
        "operator creates a Pod outside the sandbox namespace",
    )?;
    ensure!(
        !can_i(&op, "create", "", "pods", "exec", RUNS_NAMESPACE).await?,
        "operator may exec into sandbox Pods"
    );
    for verb in ["patch", "update"] {
        ensure!(
            !can_i(
                &op,
                verb,
                "sandboxrun.dev",
                "sandboxruns",
                "",
                RUNS_NAMESPACE
            )
            .await?,
            "operator may {verb} sandboxruns (the approval privilege is for people)"
        );
        ensure!(
            !can_i(
                &op,
                verb,
                "sandboxrun.dev",
                "sandboxpools",
                "",
                RUNS_NAMESPACE
            )
            .await?,
            "operator may {verb} sandboxpools (their spec is for people)"
        );
    }
    ensure!(
        !can_i(&op, "update", "", "pods", "", RUNS_NAMESPACE).await?,
        "operator may update sandbox Pods (they are only ever replaced)"
    );
    Ok(())
}

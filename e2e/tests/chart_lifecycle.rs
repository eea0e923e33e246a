//! `helm upgrade` and `helm uninstall` of the release installed by e2e/install.sh (release
//! `sandboxrun` in `sandboxrun-system`). They change the installation, so they are #[ignore]d in
//! the normal suite; run-tests.sh runs them last, one at a time, upgrade first:
//!
//!   cargo test -p sandboxrun-e2e --test chart_lifecycle -- --ignored --exact upgrade_...
//!   cargo test -p sandboxrun-e2e --test chart_lifecycle -- --ignored --exact uninstall_...
//!
//! After the uninstall test, reinstall with e2e/install.sh.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use sandboxrun_core::Phase;
use sandboxrun_e2e::client;
use sandboxrun_e2e::runs::*;
use serde_json::{Value, json};

const RELEASE: &str = "sandboxrun";
/// The operator reloads the policy only after the kubelet refreshes the mounted ConfigMap: up to
/// its sync period (1 min) plus the ConfigMap cache TTL, then the operator's poll (5 s).
const POLICY_PROPAGATION: Duration = Duration::from_secs(180);

/// helm from the local cluster's bin directory (next to KUBECONFIG), else $HELM, else PATH.
fn helm() -> Command {
    if let Some(helm) = std::env::var_os("HELM") {
        return Command::new(helm);
    }
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_default();
    let bin = std::path::Path::new(&kubeconfig)
        .with_file_name("bin")
        .join("helm");
    Command::new(if bin.exists() {
        bin.into_os_string()
    } else {
        "helm".into()
    })
}

fn run_helm(args: &[&str]) -> Result<String> {
    let out = helm()
        .args(args)
        .args(["--namespace", SYSTEM_NAMESPACE])
        .output()
        .context("running helm")?;
    ensure!(
        out.status.success(),
        "helm {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `helm upgrade` of the installed release with `policy.rules` replaced. The chart's defaults
/// plus the release's own values (image tags, frontend keys), not `--reuse-values`: that one
/// drops defaults the chart has gained since the release was installed.
fn upgrade_rules(rules: &Value) -> Result<()> {
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/sandboxrun");
    let set = format!("policy.rules={rules}");
    run_helm(&[
        "upgrade",
        RELEASE,
        chart,
        "--reset-then-reuse-values",
        "--set-json",
        &set,
        "--wait",
        "--timeout",
        "3m",
    ])?;
    Ok(())
}

const OPERATOR_SELECTOR: &str = "app.kubernetes.io/component=operator";

/// The operator's Deployment, ReplicaSets and Pods in a few lines: what `helm --wait` judges.
async fn describe_operator(client: &Client) -> String {
    let ns = SYSTEM_NAMESPACE;
    let lp = ListParams::default().labels(OPERATOR_SELECTOR);
    let mut out = Vec::new();
    match Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
    {
        Ok(list) => out.extend(list.items.iter().map(|d| {
            format!(
                "deployment {} generation {:?} spec.replicas {:?} status {}",
                d.name_any(),
                d.metadata.generation,
                d.spec.as_ref().and_then(|s| s.replicas),
                serde_json::to_string(&d.status).unwrap_or_default()
            )
        })),
        Err(e) => out.push(format!("deployments: {e}")),
    }
    match Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
    {
        Ok(list) => out.extend(list.items.iter().map(|r| {
            format!(
                "replicaset {} revision {:?} spec.replicas {:?} status {}",
                r.name_any(),
                r.annotations().get("deployment.kubernetes.io/revision"),
                r.spec.as_ref().and_then(|s| s.replicas),
                serde_json::to_string(&r.status).unwrap_or_default()
            )
        })),
        Err(e) => out.push(format!("replicasets: {e}")),
    }
    match Api::<Pod>::namespaced(client.clone(), ns).list(&lp).await {
        Ok(list) => out.extend(list.items.iter().map(|p| {
            format!(
                "pod {} owner {:?} phase {:?} deleting since {:?} conditions {}",
                p.name_any(),
                p.owner_references().first().map(|o| o.name.clone()),
                p.status.as_ref().and_then(|s| s.phase.clone()),
                p.metadata.deletion_timestamp.as_ref().map(|t| t.0),
                serde_json::to_string(&p.status.as_ref().map(|s| &s.conditions))
                    .unwrap_or_default()
            )
        })),
        Err(e) => out.push(format!("pods: {e}")),
    }
    out.join("\n")
}

/// Waits until the operator's Deployment has rolled out and holds no extra Pods, which is what
/// `helm upgrade --wait` will require of it. Earlier tests kill operator Pods; an upgrade must
/// start from a settled release, or its failure would be blamed on the upgrade.
async fn wait_operator_settled(client: &Client, timeout: Duration) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let lp = ListParams::default().labels(OPERATOR_SELECTOR);
    let deadline = Instant::now() + timeout;
    loop {
        let settled = deployments.list(&lp).await?.items.iter().all(|d| {
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            d.status.as_ref().is_some_and(|s| {
                s.observed_generation >= d.metadata.generation
                    && s.replicas == Some(want)
                    && s.updated_replicas == Some(want)
                    && s.available_replicas == Some(want)
            })
        });
        if settled {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the operator's Deployment did not settle within {timeout:?} before the upgrade:\n{}",
                describe_operator(client).await
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// [`upgrade_rules`], with the operator's state in the error when the upgrade fails.
async fn upgrade_rules_explained(client: &Client, rules: &Value) -> Result<()> {
    match upgrade_rules(rules) {
        Ok(()) => Ok(()),
        Err(e) => Err(e.context(format!(
            "the operator after the failed upgrade:\n{}",
            describe_operator(client).await
        ))),
    }
}

/// A Python run of `agent` in the sandbox environment.
fn run_of(agent: &str, code: &str, timeout_seconds: u32) -> sandboxrun_api::SandboxRun {
    python_run(
        &format!("chart-{agent}"),
        code,
        json!({ "agent": agent, "limits": { "timeoutSeconds": timeout_seconds } }),
    )
}

#[tokio::test]
#[ignore = "changes the release's policy; run-tests.sh runs it near the end"]
async fn upgrade_with_a_new_policy_keeps_in_flight_runs_and_applies_to_new_ones() -> Result<()> {
    let client = client().await?;
    let values: Value =
        serde_json::from_str(&run_helm(&["get", "values", RELEASE, "-a", "-o", "json"])?)?;
    let original = values["policy"]["rules"].clone();
    ensure!(
        original.is_array(),
        "the release has no policy.rules: {values}"
    );

    // Before: the agent is allowed (the chart's default policy lets anyone run python here).
    let agent = "e2e-chart-upgrade";
    let before = create(&client, &run_of(agent, "print(1)", 30)).await?;
    let before = wait_terminal(&client, &before, Duration::from_secs(120)).await?;
    ensure!(
        run_phase(&before) == Some(Phase::Succeeded),
        "before the upgrade, {agent}'s run should succeed: {:?}",
        before.status
    );

    // A run that is still going when the upgrade happens, and long enough to outlive the policy
    // reload.
    let long = create(
        &client,
        &run_of("e2e", "import time\ntime.sleep(60)\nprint('survived')", 300),
    )
    .await?;
    wait_for(&client, &long, Duration::from_secs(120), |p| {
        p == Phase::Running
    })
    .await?;
    wait_operator_settled(&client, Duration::from_secs(180)).await?;
    let operators = operator_pods(&client).await?;

    // The upgrade: a rule blocking the agent goes first.
    let rule_name = "chart-upgrade-blocks-agent";
    let mut rules = vec![json!({
        "name": rule_name, "agents": [agent], "tools": ["python"], "environments": ["*"],
        "verdict": "block", "reason": "blocked by the upgraded policy (e2e chart_lifecycle)",
    })];
    rules.extend(original.as_array().cloned().unwrap_or_default());
    upgrade_rules_explained(&client, &Value::Array(rules)).await?;
    let result = async {
        // It really was in flight: still running once the upgrade is done.
        let now = runs(&client).get(&long).await?;
        ensure!(
            run_phase(&now) == Some(Phase::Running),
            "the long run was no longer running after the upgrade: {:?}",
            now.status
        );
        // The upgrade kept the operator's count limit in the chart's quota (a field the chart
        // does not set, owned by the operator's own field manager).
        let quota = Api::<ResourceQuota>::namespaced(client.clone(), RUNS_NAMESPACE)
            .get("sandboxrun-runs")
            .await?;
        let hard = quota.spec.and_then(|s| s.hard).unwrap_or_default();
        ensure!(
            hard.contains_key("count/sandboxruns.sandboxrun.dev") && hard.contains_key("pods"),
            "the upgrade changed the runs quota: {hard:?}"
        );
        // New runs of the agent are rejected by the new rule, once the operator has it.
        let deadline = Instant::now() + POLICY_PROPAGATION;
        loop {
            let name = create(&client, &run_of(agent, "print(2)", 30)).await?;
            let run = wait_terminal(&client, &name, Duration::from_secs(120)).await?;
            let rule = run.status.as_ref().and_then(|s| s.decision.as_ref()).map(|d| d.rule.clone());
            if run_phase(&run) == Some(Phase::Rejected) {
                ensure!(
                    rule.as_deref() == Some(rule_name),
                    "rejected, but by rule {rule:?} instead of {rule_name}"
                );
                break;
            }
            if Instant::now() > deadline {
                bail!("the upgraded policy did not apply within {POLICY_PROPAGATION:?}: last run {:?}", run.status);
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }

        // The in-flight run finished normally: nothing restarted or lost it.
        let long = wait_terminal(&client, &long, Duration::from_secs(300)).await?;
        let status = long.status.clone().unwrap_or_default();
        ensure!(
            run_phase(&long) == Some(Phase::Succeeded) && status.stdout.as_deref() == Some("survived\n"),
            "the run in flight during the upgrade did not complete: {status:?}"
        );
        let after = operator_pods(&client).await?;
        ensure!(
            after == operators,
            "the upgrade restarted the operator: before {operators:?}, after {after:?}"
        );
        Ok(())
    }
    .await;
    // Put the original policy back, whatever happened.
    let restored = upgrade_rules_explained(&client, &original).await;
    result.and(restored)
}

#[tokio::test]
#[ignore = "uninstalls the release; run-tests.sh runs it last"]
async fn uninstall_leaves_no_sandbox_pods_behind() -> Result<()> {
    let client = client().await?;
    // A run in flight: its sandbox Pod must not outlive the release.
    let name = create(&client, &run_of("e2e", "import time\ntime.sleep(300)", 600)).await?;
    wait_for(&client, &name, Duration::from_secs(120), |p| {
        p == Phase::Running
    })
    .await?;
    ensure!(
        !pods_of(&client, &name).await?.is_empty(),
        "run {name} has no Pod"
    );

    run_helm(&["uninstall", RELEASE, "--wait", "--timeout", "3m"])?;

    // The chart owned the sandbox namespace: deleting it takes every SandboxRun and Pod with it.
    // The release's own Pods (operator, frontend) may take their grace period to go.
    let all_pods: Api<Pod> = Api::all(client.clone());
    let sandbox_pods =
        ListParams::default().labels("app.kubernetes.io/managed-by=sandboxrun-operator");
    let release_pods = ListParams::default().labels("app.kubernetes.io/instance=sandboxrun");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names = |pods: Vec<Pod>| -> Vec<String> {
        pods.iter()
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let sandboxes = names(all_pods.list(&sandbox_pods).await?.items);
        let release = names(all_pods.list(&release_pods).await?.items);
        let ns_left = namespaces.get_opt(RUNS_NAMESPACE).await?.is_some();
        if sandboxes.is_empty() && release.is_empty() && !ns_left {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "after helm uninstall: sandbox Pods {sandboxes:?}, release Pods {release:?}, \
                 namespace {RUNS_NAMESPACE} still there: {ns_left}"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

//! The count limit on stored SandboxRuns works from the first install (operator/src/run_quota.rs):
//! on the freshly installed release of run-tests.sh, the sandbox namespace's quota carries
//! `count/sandboxruns.sandboxrun.dev` with a usage the quota controller keeps, runs are admitted
//! (no "status unknown for quota"), and the operator's probe quota is gone.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, ListParams, PostParams};
use sandboxrun_core::Phase;
use sandboxrun_e2e::client;
use sandboxrun_e2e::runs::*;
use serde_json::json;

const COUNT: &str = "count/sandboxruns.sandboxrun.dev";
/// The chart's default `sandboxNamespace.resourceQuota.maxStoredRuns`.
const MAX_STORED_RUNS: &str = "1k";

#[tokio::test]
async fn the_run_count_limit_holds_from_the_first_install() -> Result<()> {
    let client = client().await?;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), RUNS_NAMESPACE);
    // The operator adds the limit once the quota controller knows the CRD: within about a
    // discovery period (30 s) of the install, plus a probe or two.
    let deadline = Instant::now() + Duration::from_secs(120);
    let quota = loop {
        let q = quotas.get("sandboxrun-runs").await?;
        let status = q.status.clone().unwrap_or_default();
        let hard = status.hard.unwrap_or_default();
        let used = status.used.unwrap_or_default();
        if hard.contains_key(COUNT) && used.contains_key(COUNT) {
            break q;
        }
        if Instant::now() > deadline {
            bail!("no counted {COUNT} limit on sandboxrun-runs after 120 s: {q:?}");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let spec_hard = quota.spec.unwrap_or_default().hard.unwrap_or_default();
    ensure!(
        spec_hard.get(COUNT).map(|q| q.0.as_str()) == Some(MAX_STORED_RUNS),
        "{spec_hard:?}"
    );
    // The chart's own limits are still there beside it.
    ensure!(spec_hard.contains_key("pods"), "{spec_hard:?}");

    // Counted, so a new run is admitted and counted: the usage is at least the runs listed.
    let name = create(&client, &python_run("e2e-quota", "print(1)", json!({}))).await?;
    let run = wait_terminal(&client, &name, Duration::from_secs(120)).await?;
    ensure!(
        run_phase(&run) == Some(Phase::Succeeded),
        "{:?}",
        run.status
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = runs(&client)
            .list(&ListParams::default())
            .await?
            .items
            .len();
        let used = quotas
            .get("sandboxrun-runs")
            .await?
            .status
            .and_then(|s| s.used)
            .and_then(|u| u.get(COUNT).cloned())
            .and_then(|q| q.0.parse::<usize>().ok())
            .unwrap_or(0);
        if used >= 1 && used.abs_diff(listed) <= 4 {
            break;
        }
        if Instant::now() > deadline {
            bail!("quota usage {used} does not follow the {listed} stored runs");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // The probe in the operator's namespace was removed once it had served.
    let probes: Api<ResourceQuota> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    ensure!(
        probes
            .get_opt("sandboxrun-run-count-probe")
            .await?
            .is_none(),
        "the probe quota was left behind"
    );
    // A dry-run create shows the API server checks runs against the limit and admits them.
    runs(&client)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &python_run("e2e-quota-dry", "print(1)", json!({})),
        )
        .await?;
    Ok(())
}

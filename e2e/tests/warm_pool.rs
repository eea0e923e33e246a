//! Warm pools on a real cluster: SandboxPools kept filled by the operator, claimed by runs whose
//! limits fit, each sandbox used once. Every test makes its own pool with a profile no other
//! test uses (its own `pids`), so tests running side by side never claim each other's sandboxes
//! (the chart's default pool serves the other tests' default-limit runs).

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use sandboxrun_api::{SandboxPath, SandboxPool, SandboxRun, SandboxRunStatus};
use sandboxrun_core::Phase;
use sandboxrun_e2e::runs::*;
use sandboxrun_e2e::*;
use serde_json::json;

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const FILL_TIMEOUT: Duration = Duration::from_secs(120);

fn pools(client: &Client) -> Api<SandboxPool> {
    Api::namespaced(client.clone(), RUNS_NAMESPACE)
}

fn pods(client: &Client) -> Api<Pod> {
    Api::namespaced(client.clone(), RUNS_NAMESPACE)
}

/// A pool of `replicas` sandboxes whose profile only runs asking for `pids` processes fit.
struct TestPool {
    client: Client,
    name: String,
    pids: u32,
}

impl TestPool {
    async fn create(client: &Client, prefix: &str, pids: u32, replicas: i32) -> Result<Self> {
        let name = unique_name(prefix);
        let pool: SandboxPool = serde_json::from_value(json!({
            "apiVersion": "sandboxrun.dev/v1alpha1",
            "kind": "SandboxPool",
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "pids": pids},
        }))?;
        pools(client).create(&PostParams::default(), &pool).await?;
        Ok(Self {
            client: client.clone(),
            name,
            pids,
        })
    }

    /// The pool's idle Pods (not being deleted).
    async fn idle(&self) -> Result<Vec<Pod>> {
        let lp = ListParams::default().labels(&format!("sandboxrun.dev/pool={}", self.name));
        Ok(pods(&self.client)
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }

    /// Waits until the pool holds exactly `n` idle Pods, all running; returns their names.
    async fn wait_ready(&self, n: usize) -> Result<BTreeSet<String>> {
        let deadline = Instant::now() + FILL_TIMEOUT;
        loop {
            let idle = self.idle().await?;
            let running = idle
                .iter()
                .filter(|p| {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        && p.status
                            .as_ref()
                            .and_then(|s| s.container_statuses.as_ref())
                            .is_some_and(|cs| {
                                cs.iter()
                                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                            })
                })
                .count();
            if idle.len() == n && running == n {
                let status = pools(&self.client).get(&self.name).await?.status;
                if status.is_some_and(|s| s.ready_replicas == i32::try_from(n).unwrap()) {
                    return Ok(idle.iter().map(ResourceExt::name_any).collect());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "pool {} has {} idle Pods ({running} running), not {n}, after {FILL_TIMEOUT:?}",
                    self.name,
                    idle.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A run that fits this pool alone.
    fn run(&self, code: &str) -> SandboxRun {
        python_run("e2e-warm", code, json!({"limits": {"pids": self.pids}}))
    }

    async fn scale(&self, replicas: i32) -> Result<()> {
        let out = kubectl()
            .args([
                "-n",
                RUNS_NAMESPACE,
                "scale",
                "sandboxpool",
                &self.name,
                &format!("--replicas={replicas}"),
            ])
            .output()?;
        ensure!(
            out.status.success(),
            "kubectl scale: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    async fn delete(self) -> Result<()> {
        pools(&self.client)
            .delete(&self.name, &DeleteParams::foreground())
            .await?;
        Ok(())
    }
}

fn kubectl() -> std::process::Command {
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_default();
    let bin = std::path::Path::new(&kubeconfig)
        .with_file_name("bin")
        .join("kubectl");
    std::process::Command::new(if bin.exists() {
        bin.into_os_string()
    } else {
        "kubectl".into()
    })
}

fn status(run: &SandboxRun) -> SandboxRunStatus {
    run.status.clone().unwrap_or_default()
}

const BOOT_ID: &str = "print(open('/proc/sys/kernel/random/boot_id').read().strip())";

#[tokio::test]
async fn two_warm_runs_run_in_different_sandboxes_and_each_is_gone_after_its_run() -> Result<()> {
    let client = client().await?;
    let pool = TestPool::create(&client, "e2e-pool-two", 41, 2).await?;
    let idle = pool.wait_ready(2).await?;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let name = create(&client, &pool.run(BOOT_ID)).await?;
        let run = wait_terminal(&client, &name, RUN_TIMEOUT).await?;
        let st = status(&run);
        ensure!(st.phase == Some(Phase::Succeeded), "{st:?}");
        ensure!(st.path == Some(SandboxPath::Warm), "not warm: {st:?}");
        ensure!(st.pool.as_deref() == Some(pool.name.as_str()), "{st:?}");
        let pod = st.pod_name.clone().context("no pod name")?;
        ensure!(
            idle.contains(&pod) || !seen.iter().any(|(p, _)| p == &pod),
            "{st:?}"
        );
        wait_no_pods(&client, &name, Duration::from_secs(60)).await?;
        seen.push((pod, st.stdout.unwrap_or_default()));
    }
    ensure!(seen[0].0 != seen[1].0, "one Pod ran two programs: {seen:?}");
    ensure!(
        seen[0].1 != seen[1].1 && !seen[0].1.is_empty(),
        "the same boot id twice: {seen:?}"
    );
    // Refilled with new Pods, never the used ones.
    let refilled = pool.wait_ready(2).await?;
    ensure!(
        !seen.iter().any(|(p, _)| refilled.contains(p)),
        "a used sandbox is back in the pool: {refilled:?} {seen:?}"
    );
    let claimed = pools(&client)
        .get(&pool.name)
        .await?
        .status
        .unwrap()
        .claimed_total;
    // Counted by the operator in memory and written by the pool's next reconcile, a moment
    // later: a test killing the operator in between (they run side by side) loses one.
    ensure!((1..=2).contains(&claimed), "claimedTotal {claimed}");
    pool.delete().await
}

#[tokio::test]
async fn a_warm_sandbox_killed_while_idle_is_replaced() -> Result<()> {
    let client = client().await?;
    let pool = TestPool::create(&client, "e2e-pool-kill", 42, 1).await?;
    let before = pool.wait_ready(1).await?;
    let victim = before.iter().next().unwrap().clone();
    pods(&client)
        .delete(
            &victim,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await?;
    let after = pool.wait_ready(1).await?;
    ensure!(!after.contains(&victim), "{after:?}");
    // And the new one serves a run.
    let name = create(&client, &pool.run("print('ok')")).await?;
    let st = status(&wait_terminal(&client, &name, RUN_TIMEOUT).await?);
    ensure!(
        st.phase == Some(Phase::Succeeded) && st.path == Some(SandboxPath::Warm),
        "{st:?}"
    );
    pool.delete().await
}

#[tokio::test]
async fn two_runs_racing_for_the_last_sandbox_one_warm_one_cold_both_succeed() -> Result<()> {
    let client = client().await?;
    let pool = TestPool::create(&client, "e2e-pool-race", 43, 1).await?;
    pool.wait_ready(1).await?;
    let (run_a, run_b) = (pool.run("print('a')"), pool.run("print('b')"));
    let (a, b) = tokio::try_join!(create(&client, &run_a), create(&client, &run_b))?;
    let (ra, rb) = tokio::try_join!(
        wait_terminal(&client, &a, RUN_TIMEOUT),
        wait_terminal(&client, &b, RUN_TIMEOUT),
    )?;
    let (sa, sb) = (status(&ra), status(&rb));
    ensure!(
        sa.phase == Some(Phase::Succeeded) && sb.phase == Some(Phase::Succeeded),
        "{sa:?} {sb:?}"
    );
    let mut paths = [sa.path, sb.path];
    paths.sort_by_key(|p| *p != Some(SandboxPath::Warm));
    ensure!(
        paths == [Some(SandboxPath::Warm), Some(SandboxPath::Cold)],
        "{sa:?} {sb:?}"
    );
    ensure!(sa.pod_name != sb.pod_name, "{sa:?} {sb:?}");
    pool.delete().await
}

#[tokio::test]
async fn kubectl_scale_up_down_and_to_zero() -> Result<()> {
    let client = client().await?;
    let pool = TestPool::create(&client, "e2e-pool-scale", 44, 1).await?;
    pool.wait_ready(1).await?;
    pool.scale(3).await?;
    pool.wait_ready(3).await?;
    pool.scale(1).await?;
    pool.wait_ready(1).await?;
    pool.scale(0).await?;
    let deadline = Instant::now() + FILL_TIMEOUT;
    while !pool.idle().await?.is_empty() {
        ensure!(Instant::now() < deadline, "Pods left at replicas 0");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // With none left, a fitting run goes cold and still succeeds.
    let name = create(&client, &pool.run("print('cold')")).await?;
    let st = status(&wait_terminal(&client, &name, RUN_TIMEOUT).await?);
    ensure!(
        st.phase == Some(Phase::Succeeded) && st.path == Some(SandboxPath::Cold),
        "{st:?}"
    );
    pool.delete().await
}

#[tokio::test]
async fn a_changed_profile_replaces_the_idle_sandboxes() -> Result<()> {
    let client = client().await?;
    let pool = TestPool::create(&client, "e2e-pool-profile", 45, 2).await?;
    let before = pool.wait_ready(2).await?;
    pools(&client)
        .patch(
            &pool.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxIdleSeconds": 1800}})),
        )
        .await?;
    let deadline = Instant::now() + FILL_TIMEOUT;
    loop {
        let now = pool.wait_ready(2).await?;
        if now.is_disjoint(&before) {
            break;
        }
        ensure!(Instant::now() < deadline, "old sandboxes kept: {now:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    pool.delete().await
}

#[tokio::test]
async fn two_hundred_kib_of_code_runs_warm() -> Result<()> {
    let client = client().await?;
    let pool = TestPool::create(&client, "e2e-pool-big", 46, 1).await?;
    pool.wait_ready(1).await?;
    let filler = format!("# {}\n", "x".repeat(1000)).repeat(210);
    let code = format!("{filler}print(len(open('/proc/self/cmdline','rb').read()) < 65536)");
    ensure!(code.len() > 200 * 1024);
    let name = create(&client, &pool.run(&code)).await?;
    let st = status(&wait_terminal(&client, &name, RUN_TIMEOUT).await?);
    ensure!(
        st.phase == Some(Phase::Succeeded) && st.path == Some(SandboxPath::Warm),
        "{st:?}"
    );
    ensure!(st.stdout.as_deref() == Some("True\n"), "{st:?}");
    pool.delete().await
}

#[tokio::test]
async fn hostile_and_forging_code_is_contained_on_the_warm_path() -> Result<()> {
    // The cold path's checks (operator.rs), in claimed sandboxes: no network, read-only root,
    // no service account token, and the runner's result cannot be forged or hidden.
    let client = client().await?;
    let pool = TestPool::create(&client, "e2e-pool-hostile", 47, 1).await?;
    pool.wait_ready(1).await?;
    let code = r#"
import json, os, socket
out = {}
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2); out["net"] = "open"
except OSError as e:
    out["net"] = "error"
try:
    open("/usr/evil", "w"); out["root"] = "writable"
except OSError:
    out["root"] = "error"
out["token"] = os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token")
print(json.dumps(out))
"#;
    let name = create(&client, &pool.run(code)).await?;
    let st = status(&wait_terminal(&client, &name, RUN_TIMEOUT).await?);
    ensure!(st.path == Some(SandboxPath::Warm), "{st:?}");
    let out: serde_json::Value = serde_json::from_str(st.stdout.as_deref().unwrap_or("{}"))?;
    ensure!(
        out == json!({"net": "error", "root": "error", "token": false}),
        "{st:?}"
    );
    for sig in ["SIGINT", "SIGTERM", "SIGKILL"] {
        pool.wait_ready(1).await?;
        let code =
            include_str!("../../core/tests/fixtures/forge_result.py").replace("THE_SIGNAL", sig);
        let mut run = pool.run(&code);
        run.spec.limits.timeout_seconds = 10;
        let name = create(&client, &run).await?;
        let st = status(&wait_terminal(&client, &name, RUN_TIMEOUT).await?);
        ensure!(st.path == Some(SandboxPath::Warm), "{sig}: {st:?}");
        let stdout = st.stdout.clone().unwrap_or_default();
        ensure!(
            !stdout.contains("FORGED") && st.phase != Some(Phase::Succeeded),
            "{sig}: forged: {st:?}"
        );
        if sig == "SIGKILL" && st.exit_code.is_none() {
            ensure!(st.reason.as_deref() == Some("NoResult"), "{sig}: {st:?}");
            continue;
        }
        ensure!(
            st.phase == Some(Phase::Failed) && st.exit_code == Some(3),
            "{sig}: not the code's own result: {st:?}"
        );
        ensure!(
            stdout.contains("shut /proc/") && !stdout.contains("OPEN"),
            "{sig}: a door of the runner was open: {stdout}"
        );
    }
    pool.delete().await
}

#[tokio::test]
async fn a_warm_run_ends_exactly_once_when_the_operator_is_killed_in_flight() -> Result<()> {
    let client = client().await?;
    let pool = TestPool::create(&client, "e2e-pool-restart", 48, 1).await?;
    pool.wait_ready(1).await?;
    // Long enough that the killed operator is gone before the code ends: the new one ends it.
    let code = "import time\ntime.sleep(8)\nprint('survived')";
    let name = create(&client, &pool.run(code)).await?;
    // Killed while the operator holds the stream to the claimed sandbox, before any result.
    let deadline = Instant::now() + RUN_TIMEOUT;
    loop {
        let st = status(&runs(&client).get(&name).await?);
        if st.reason.as_deref() == Some("WarmSandboxClaimed") || st.phase == Some(Phase::Running) {
            break;
        }
        ensure!(
            Instant::now() < deadline && !st.phase.is_some_and(Phase::is_terminal),
            "never claimed: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let operators: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let lp = ListParams::default().labels("app.kubernetes.io/component=operator");
    for pod in operators.list(&lp).await?.items {
        operators
            .delete(
                &pod.name_any(),
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await?;
    }
    let run = wait_terminal(&client, &name, Duration::from_secs(180)).await?;
    let st = status(&run);
    ensure!(st.phase == Some(Phase::Succeeded), "{st:?}");
    ensure!(st.stdout.as_deref() == Some("survived\n"), "{st:?}");
    ensure!(st.path == Some(SandboxPath::Warm), "{st:?}");
    wait_no_pods(&client, &name, Duration::from_secs(60)).await?;
    // One end: exactly one audit line for the run, whichever replica wrote it.
    let lines = sandboxrun_e2e::governance::audit_lines(&client, &name).await?;
    ensure!(lines.len() == 1, "audit lines: {lines:?}");
    pool.delete().await
}

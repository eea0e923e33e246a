//! Warm pools on a real cluster: SandboxPools kept filled by the operator, claimed by runs whose
//! limits fit, each sandbox used once. Every test makes its own pool with a profile no other
//! test uses (its own `pids`), so tests running side by side never claim each other's sandboxes
//! (the chart's default pool serves the other tests' default-limit runs). The hostile-code and
//! result-forging tests run on both paths in `operator.rs`.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use sandboxrun_api::{SandboxPath, SandboxRun, SandboxRunStatus};
use sandboxrun_core::Phase;
use sandboxrun_e2e::pools::{FILL_TIMEOUT, TestPool, pools};
use sandboxrun_e2e::runs::*;
use sandboxrun_e2e::*;
use serde_json::json;

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

fn pods(client: &Client) -> Api<Pod> {
    Api::namespaced(client.clone(), RUNS_NAMESPACE)
}

fn status(run: &SandboxRun) -> SandboxRunStatus {
    run.status.clone().unwrap_or_default()
}

const BOOT_ID: &str = "print(open('/proc/sys/kernel/random/boot_id').read().strip())";

#[tokio::test]
async fn two_warm_runs_run_in_different_sandboxes_and_each_is_gone_after_its_run() -> Result<()> {
    let client = client().await?;
    let operators_before = operator_pods(&client).await?;
    let pool = TestPool::create(&client, "e2e-pool-two", 41, 2).await?;
    let idle = pool.wait_ready(2).await?;
    let held_before = operator_metric(&client, HELD_HANDOVERS).await?;
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
    // Counted by the operator in memory and written by the pool's next reconcile, a moment
    // later: both counts are there unless a test killed the operator in between (they run side
    // by side), which loses what it had not written yet.
    let deadline = Instant::now() + Duration::from_secs(20);
    let claimed = loop {
        let claimed = pools(&client)
            .get(&pool.name)
            .await?
            .status
            .map_or(0, |s| s.claimed_total);
        if claimed == 2 || Instant::now() > deadline {
            break claimed;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let held = operator_metric(&client, HELD_HANDOVERS).await? - held_before;
    let restarted = operator_pods(&client).await? != operators_before;
    ensure!(
        claimed == 2 || (restarted && (0..2).contains(&claimed)),
        "claimedTotal {claimed} (operator restarted meanwhile: {restarted})"
    );
    // Each program went over the stream the pool opened while its sandbox idled (other tests'
    // warm runs may add to the count, never take from it), unless an operator was replaced.
    ensure!(
        held >= 2.0 || restarted,
        "{held} programs over held streams, expected both runs' (pool_streams.rs)"
    );
    pool.delete().await
}

/// Programs handed to warm sandboxes over the streams their pools held (operator metrics).
const HELD_HANDOVERS: &str = r#"sandboxrun_warm_handovers_total{stream="held"}"#;

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
    // Whether the filler is on the process's command line (built so that this line is not).
    let code = format!("{filler}print(b'x' * 1000 in open('/proc/self/cmdline','rb').read())");
    ensure!(code.len() > 200 * 1024);
    let name = create(&client, &pool.run(&code)).await?;
    let st = status(&wait_terminal(&client, &name, RUN_TIMEOUT).await?);
    ensure!(
        st.phase == Some(Phase::Succeeded) && st.path == Some(SandboxPath::Warm),
        "{st:?}"
    );
    ensure!(st.stdout.as_deref() == Some("False\n"), "{st:?}");
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

#[tokio::test]
async fn a_pool_that_follows_demand_grows_under_a_burst_and_shrinks_back_when_idle() -> Result<()> {
    let client = client().await?;
    // One idle sandbox at least, four at most; a burst keeps it large for 10 s.
    let pool = TestPool::create_autoscaled(&client, "e2e-pool-demand", 57, (1, 4), 10).await?;
    pool.wait_ready(1).await?;
    // Five runs at once: one takes the idle sandbox, four find the pool empty and start cold,
    // and the pool grows to its maximum to meet the next burst.
    let burst: Vec<SandboxRun> = (0..5)
        .map(|i| pool.run(&format!("import time\ntime.sleep(1)\nprint({i})")))
        .collect();
    let names = futures::future::try_join_all(burst.iter().map(|r| create(&client, r))).await?;
    // Grown to its maximum, and its status says why (written a moment after the size).
    let (mut grown, mut held_to_max, mut why) = (0, false, None::<String>);
    let deadline = Instant::now() + FILL_TIMEOUT;
    while grown < 4 || !held_to_max {
        ensure!(
            Instant::now() < deadline,
            "the pool stayed at {grown} under a burst of 5 ({why:?})"
        );
        let now = pool.get().await?;
        grown = grown.max(now.spec.replicas);
        why = now.status.and_then(|s| s.scale_reason);
        held_to_max |= why
            .as_deref()
            .is_some_and(|r| r.contains("its maxReplicas"));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for name in &names {
        let st = status(&wait_terminal(&client, name, RUN_TIMEOUT).await?);
        ensure!(st.phase == Some(Phase::Succeeded), "{st:?}");
    }
    // Idle: once the burst is older than the delay, back to its minimum. (Whether all four
    // sandboxes started before that depends on the machine's speed: not checked.)
    let deadline = Instant::now() + FILL_TIMEOUT;
    loop {
        let now = pool.get().await?;
        if now.spec.replicas == 1 && pool.idle().await?.len() == 1 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "still at {} idle sandboxes ({:?})",
            now.spec.replicas,
            now.status.and_then(|s| s.scale_reason)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    pool.delete().await
}

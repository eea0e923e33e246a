//! The operator on a real cluster, installed with `helm install` (see e2e/install.sh): every
//! test creates SandboxRuns and asserts what the operator recorded and what it left behind.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use sandboxrun_api::{SandboxPath, SandboxRun};
use sandboxrun_core::Phase;
use sandboxrun_e2e::pools::TestPool;
use sandboxrun_e2e::runs::*;
use sandboxrun_e2e::*;
use serde_json::json;

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// Delete at once, like a crash or `kubectl delete --grace-period=0`.
fn delete_now() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    }
}

fn status(run: &SandboxRun) -> sandboxrun_api::SandboxRunStatus {
    run.status.clone().unwrap_or_default()
}

/// Runs `code` with the given extra spec and waits for the terminal state.
async fn run_to_end(
    client: &Client,
    name: &str,
    code: &str,
    extra: serde_json::Value,
) -> Result<SandboxRun> {
    let name = create(client, &python_run(name, code, extra)).await?;
    wait_terminal(client, &name, RUN_TIMEOUT).await
}

fn kubectl() -> Command {
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_default();
    let bin = std::path::Path::new(&kubeconfig)
        .with_file_name("bin")
        .join("kubectl");
    Command::new(if bin.exists() {
        bin.into_os_string()
    } else {
        "kubectl".into()
    })
}

#[tokio::test]
async fn hello_sample_succeeds_shows_columns_and_is_cleaned_up() -> Result<()> {
    let client = client().await?;
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/samples/hello.yaml");
    // The sample has a fixed name: start from a clean slate if an earlier run left it.
    let _ = runs(&client)
        .delete("hello", &DeleteParams::background())
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while runs(&client).get_opt("hello").await?.is_some() {
        ensure!(Instant::now() < deadline, "old hello run is not going away");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = kubectl().args(["apply", "-f", sample]).output()?;
    ensure!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let run = wait_terminal(&client, "hello", RUN_TIMEOUT).await?;
    let st = status(&run);
    ensure!(st.phase == Some(Phase::Succeeded), "status {st:?}");
    ensure!(
        st.stdout.as_deref() == Some("hello from sandboxrun\n"),
        "stdout {:?}",
        st.stdout
    );
    ensure!(st.exit_code == Some(0), "exit {:?}", st.exit_code);
    let completed = Instant::now();

    let table = kubectl()
        .args(["-n", RUNS_NAMESPACE, "get", "sandboxruns", "hello"])
        .output()?;
    let table = String::from_utf8(table.stdout)?;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        header
            == [
                "NAME",
                "AGENT",
                "TOOL",
                "PHASE",
                "EXIT",
                "DURATION(MS)",
                "AGE"
            ],
        "{table}"
    );
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        row[..5] == ["hello", "sample", "python", "Succeeded", "0"],
        "{table}"
    );

    wait_no_pods(&client, "hello", Duration::from_secs(30)).await?;
    ensure!(
        completed.elapsed() < Duration::from_secs(30),
        "pod lingered {:?}",
        completed.elapsed()
    );

    // ttlSecondsAfterFinished: 30 in the sample.
    let gone = |r: Option<&SandboxRun>| r.is_none();
    tokio::time::timeout(
        Duration::from_secs(60),
        kube::runtime::wait::await_condition(runs(&client), "hello", gone),
    )
    .await
    .context("hello was not deleted after its TTL")??;
    Ok(())
}

/// Every sandbox Pod mounts the runner's ConfigMap (operator/src/runner_files.rs): the operator
/// makes it again when it is deleted, and the sandboxes made after that run.
#[tokio::test]
async fn the_runners_config_map_is_made_again_when_deleted() -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = client().await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), RUNS_NAMESPACE);
    let name = sandboxrun_core::runner::pod_runner_config_map();
    let is_the_runners = |cm: &ConfigMap| {
        let data = cm.data.clone().unwrap_or_default();
        cm.immutable == Some(true)
            && data.len() == 2
            && sandboxrun_core::runner::pod_runner_files()
                .iter()
                .all(|(file, source)| data.get(*file).map(String::as_str) == Some(*source))
    };
    let before = config_maps
        .get_opt(name)
        .await?
        .context("the runner's ConfigMap is not in the sandbox namespace")?;
    ensure!(is_the_runners(&before), "{:?}", before.metadata);
    config_maps.delete(name, &DeleteParams::default()).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match config_maps.get_opt(name).await? {
            Some(again) if again.uid() != before.uid() => {
                ensure!(is_the_runners(&again), "{:?}", again.metadata);
                break;
            }
            _ if Instant::now() > deadline => {
                bail!("the runner's ConfigMap was not made again within 30 s of its deletion")
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    // Runs go on: their sandboxes, warm or cold, mount it.
    let run = run_to_end(&client, "e2e-runner-files", "print(6 * 7)", json!({})).await?;
    let st = status(&run);
    ensure!(st.phase == Some(Phase::Succeeded), "{st:?}");
    ensure!(st.stdout.as_deref() == Some("42\n"), "{st:?}");
    Ok(())
}

#[tokio::test]
async fn stderr_and_exit_code_are_reported_separately() -> Result<()> {
    let client = client().await?;
    let code = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(3)";
    let run = run_to_end(&client, "e2e-exit", code, json!({})).await?;
    let st = status(&run);
    ensure!(st.phase == Some(Phase::Failed), "{st:?}");
    ensure!(st.exit_code == Some(3), "{st:?}");
    ensure!(st.stdout.as_deref() == Some("to stdout\n"), "{st:?}");
    ensure!(st.stderr.as_deref() == Some("to stderr\n"), "{st:?}");
    ensure!(st.reason.as_deref() == Some("NonZeroExit"), "{st:?}");
    wait_no_pods(&client, &run.name_any(), Duration::from_secs(15)).await
}

#[tokio::test]
async fn busy_loop_times_out_and_its_pod_is_removed() -> Result<()> {
    let client = client().await?;
    let started = Instant::now();
    let run = run_to_end(
        &client,
        "e2e-loop",
        "while True: pass",
        json!({"limits": {"timeoutSeconds": 5}}),
    )
    .await?;
    let st = status(&run);
    ensure!(st.phase == Some(Phase::TimedOut), "{st:?}");
    ensure!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    wait_no_pods(&client, &run.name_any(), Duration::from_secs(15)).await
}

#[tokio::test]
async fn allocating_a_gib_under_256mi_is_oom_killed() -> Result<()> {
    let client = client().await?;
    let code = "b = bytearray(1024 * 1024 * 1024)\nprint(len(b))";
    let run = run_to_end(
        &client,
        "e2e-oom",
        code,
        json!({"limits": {"memory": "256Mi"}}),
    )
    .await?;
    let st = status(&run);
    ensure!(st.phase == Some(Phase::Failed), "{st:?}");
    ensure!(st.reason.as_deref() == Some("OOMKilled"), "{st:?}");
    ensure!(
        st.stdout.as_deref().unwrap_or_default().is_empty(),
        "{st:?}"
    );
    Ok(())
}

#[tokio::test]
async fn fork_bomb_is_stopped_and_the_node_stays_healthy() -> Result<()> {
    let client = client().await?;
    // Every process forks until the kernel (gVisor's, here) refuses, then reports once and stops.
    let code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError as e:\n        print('refused:', e.strerror, flush=True)\n        break";
    let run = run_to_end(
        &client,
        "e2e-forkbomb",
        code,
        // Few enough processes that their memory (each a Python process with about 10 MB of
        // its own once it runs) stays well under the memory limit (256Mi): the pid limit must be
        // what stops it, whatever the runner's size (32 of them came within a few MB of it).
        json!({"limits": {"timeoutSeconds": 20, "pids": 16}}),
    )
    .await?;
    let st = status(&run);
    let stdout = st.stdout.clone().unwrap_or_default();
    // The pid limit stopped it: forks were refused, and never more processes than the limit.
    ensure!(
        stdout.contains("refused: Resource temporarily unavailable"),
        "{st:?}"
    );
    let processes = stdout.lines().filter(|l| l.starts_with("refused:")).count();
    ensure!(
        processes <= 16,
        "{processes} processes under a limit of 16: {st:?}"
    );
    wait_no_pods(&client, &run.name_any(), Duration::from_secs(20)).await?;
    // The node is still fine: Ready, and the next run works.
    let out = kubectl()
        .args([
            "wait",
            "--for=condition=Ready",
            "node",
            "--all",
            "--timeout=10s",
        ])
        .output()?;
    ensure!(out.status.success(), "node not Ready after the fork bomb");
    let next = run_to_end(&client, "e2e-after-bomb", "print('still fine')", json!({})).await?;
    ensure!(
        status(&next).phase == Some(Phase::Succeeded),
        "{:?}",
        status(&next)
    );
    Ok(())
}

/// The code cannot forge its run's result or hide it: it writes a forged envelope through every
/// door of the runner it can name, then signals the runner; the run still reports the code's own
/// exit (3) and output, and every door was shut (see `core/tests/fixtures/forge_result.py`).
#[tokio::test]
async fn the_code_cannot_forge_or_hide_its_result() -> Result<()> {
    let client = client().await?;
    // Both paths: a cold Pod (limits no pool has), and a warm one claimed from a pool.
    let pool = TestPool::create(&client, "e2e-pool-forge", 49, 1).await?;
    for (path, sig) in [SandboxPath::Cold, SandboxPath::Warm]
        .into_iter()
        .flat_map(|p| ["SIGINT", "SIGTERM", "SIGKILL"].map(|s| (p, s)))
    {
        let code =
            include_str!("../../core/tests/fixtures/forge_result.py").replace("THE_SIGNAL", sig);
        let run = run_on(&client, &pool, path, "e2e-forge", &code, 10).await?;
        let st = status(&run);
        ensure!(st.path == Some(path), "{sig}: not {path:?}: {st:?}");
        let killed = sig == "SIGKILL";
        let sig = format!("{sig} ({path:?})");
        let stdout = st.stdout.clone().unwrap_or_default();
        // Never the forged result.
        ensure!(
            !stdout.contains("FORGED") && st.phase != Some(Phase::Succeeded),
            "{sig}: forged: {st:?}"
        );
        // SIGKILL cannot be ignored, and gVisor delivers it to the container's init: the run
        // then ends without a result (an honest failure). Otherwise: the code's own exit, and
        // every door was shut.
        if killed && st.exit_code.is_none() {
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

/// Runs `code` (with `timeout` seconds) on `path`: cold with limits no pool has (pids 63), warm
/// in a ready sandbox of `pool`. Waits for the end.
async fn run_on(
    client: &Client,
    pool: &TestPool,
    path: SandboxPath,
    name: &str,
    code: &str,
    timeout: u32,
) -> Result<SandboxRun> {
    let mut run = match path {
        SandboxPath::Cold => python_run(name, code, json!({"limits": {"pids": 63}})),
        SandboxPath::Warm => {
            pool.wait_ready(1).await?;
            pool.run(code)
        }
    };
    run.spec.limits.timeout_seconds = timeout;
    let name = create(client, &run).await?;
    wait_terminal(client, &name, RUN_TIMEOUT).await
}

#[tokio::test]
async fn hostile_code_is_contained() -> Result<()> {
    let client = client().await?;
    let node_ip = node_internal_ip(&client).await?;
    // A listener this test owns on the node's cluster address, counting what connects.
    let listener = TcpListener::bind(format!("{node_ip}:0"))?;
    let port = listener.local_addr()?.port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if conn.is_ok() {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        }
    });

    let code = format!(
        r#"
import json, os, socket
out = {{}}
out["env"] = sorted(os.environ)
try:
    out["traversal"] = open("../../../../etc/shadow").read()[:200]
except OSError as e:
    out["traversal"] = "error: %s" % e.strerror
out["passwd"] = open("/../../etc/passwd").read()
try:
    socket.create_connection(("{node_ip}", {port}), timeout=3).close()
    out["tcp"] = "connected"
except OSError as e:
    out["tcp"] = "failed: %s" % e
for path in ("/etc/evil", "/usr/evil", "/evil"):
    try:
        open(path, "w").write("x")
        out[path] = "written"
    except OSError as e:
        out[path] = "error: %s" % e.strerror
try:
    with open("/tmp/fill", "wb") as f:
        for _ in range(64):
            f.write(b"\0" * (1024 * 1024))
            f.flush()
    out["tmpfill"] = "wrote 64 MiB"
except OSError as e:
    out["tmpfill"] = "error: %s" % e.strerror
print(json.dumps(out))
"#
    );
    // Both paths: a cold Pod (limits no pool has), and a warm one claimed from a pool.
    let pool = TestPool::create(&client, "e2e-pool-hostile", 47, 1).await?;
    for path in [SandboxPath::Cold, SandboxPath::Warm] {
        let run = run_on(&client, &pool, path, "e2e-hostile", &code, 30).await?;
        contained(&run, path, &hits)?;
    }
    pool.delete().await
}

/// What `hostile_code_is_contained` asserts of one run.
fn contained(run: &SandboxRun, path: SandboxPath, hits: &AtomicUsize) -> Result<()> {
    let st = status(run);
    ensure!(st.path == Some(path), "not {path:?}: {st:?}");
    ensure!(st.phase == Some(Phase::Succeeded), "{st:?}");
    let out: serde_json::Value =
        serde_json::from_str(st.stdout.as_deref().unwrap_or_default().trim())?;

    // Only the runner's minimal environment: nothing of the node, the Pod or the operator.
    let env: Vec<String> = serde_json::from_value(out["env"].clone())?;
    for name in &env {
        ensure!(
            ["PATH", "HOME", "LANG", "LC_CTYPE", "PWD"].contains(&name.as_str()),
            "leaked env var {name}: {env:?}"
        );
    }
    // Traversal ends at the sandbox root: the image's shadow is unreadable to uid 65532, and the
    // passwd file is the image's (it has the sandbox user, and not the node's users).
    let traversal = out["traversal"].as_str().unwrap_or_default();
    ensure!(
        traversal.starts_with("error"),
        "read /etc/shadow: {traversal}"
    );
    let passwd = out["passwd"].as_str().unwrap_or_default();
    ensure!(
        passwd.contains(":65532:"),
        "not the image's passwd: {passwd}"
    );
    let host_passwd = std::fs::read_to_string("/etc/passwd")?;
    ensure!(passwd != host_passwd, "saw the node's /etc/passwd");

    ensure!(
        out["tcp"]
            .as_str()
            .unwrap_or_default()
            .starts_with("failed"),
        "{out}"
    );
    ensure!(
        hits.load(Ordering::SeqCst) == 0,
        "listener accepted a sandbox connection ({path:?})"
    );
    for path in ["/etc/evil", "/usr/evil", "/evil"] {
        ensure!(
            out[path].as_str().unwrap_or_default().starts_with("error"),
            "{path}: {out}"
        );
    }
    ensure!(
        out["tmpfill"]
            .as_str()
            .unwrap_or_default()
            .starts_with("error"),
        "/tmp limit: {out}"
    );
    Ok(())
}

#[tokio::test]
async fn two_hundred_kib_of_code_runs_and_the_pod_spec_holds_none_of_it() -> Result<()> {
    // More than an argv string may hold (128 KiB): the operator sends the code to the runner's
    // stdin over the attach stream; the Pod spec carries none of it.
    let client = client().await?;
    let marker = unique_name("code-marker");
    let filler = format!("# {marker} {}\n", "x".repeat(1000)).repeat(210);
    // Longer than the operator's inline read of a warm sandbox (3 s): a run that ends within it
    // goes from Pending to its end without ever being Running, and this test looks at the Pod
    // while the run is Running.
    let code = format!(
        "{filler}import time\ntime.sleep(8)\nprint(b'x' * 1000 in open('/proc/self/cmdline','rb').read())"
    );
    ensure!(code.len() > 200 * 1024);
    let name = create(&client, &python_run("e2e-bigcode", &code, json!({}))).await?;
    wait_for(&client, &name, RUN_TIMEOUT, |p| p == Phase::Running).await?;
    let pods = pods_of(&client, &name).await?;
    let spec = serde_json::to_string(&pods.first().context("no pod")?.spec)?;
    ensure!(!spec.contains(&marker), "the code is in the Pod spec");
    let run = wait_terminal(&client, &name, RUN_TIMEOUT).await?;
    let st = status(&run);
    ensure!(st.phase == Some(Phase::Succeeded), "{st:?}");
    ensure!(st.stdout.as_deref() == Some("False\n"), "{st:?}");
    Ok(())
}

#[tokio::test]
async fn output_over_the_cap_is_truncated_and_flagged() -> Result<()> {
    let client = client().await?;
    let run = run_to_end(
        &client,
        "e2e-big",
        "print('x' * 100000)",
        json!({"limits": {"outputBytes": 1000}}),
    )
    .await?;
    let st = status(&run);
    ensure!(st.phase == Some(Phase::Succeeded), "{st:?}");
    ensure!(st.truncated == Some(true), "{st:?}");
    ensure!(
        st.stdout.as_deref().map(str::len) == Some(1000),
        "len {:?}",
        st.stdout.map(|s| s.len())
    );
    Ok(())
}

#[tokio::test]
async fn run_completes_when_the_operator_is_killed_mid_run() -> Result<()> {
    let client = client().await?;
    let code = "import time\ntime.sleep(8)\nprint('survived')";
    let name = create(&client, &python_run("e2e-restart", code, json!({}))).await?;
    wait_for(&client, &name, RUN_TIMEOUT, |p| p == Phase::Running).await?;

    let operators: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let lp = ListParams::default().labels("app.kubernetes.io/component=operator");
    let killed: Vec<String> = operators
        .list(&lp)
        .await?
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    ensure!(
        !killed.is_empty(),
        "no operator pod found in {SYSTEM_NAMESPACE}"
    );
    for pod in &killed {
        operators.delete(pod, &delete_now()).await?;
    }

    let run = wait_terminal(&client, &name, Duration::from_secs(180)).await?;
    let st = status(&run);
    ensure!(st.phase == Some(Phase::Succeeded), "{st:?}");
    ensure!(st.stdout.as_deref() == Some("survived\n"), "{st:?}");
    wait_no_pods(&client, &name, Duration::from_secs(30)).await?;
    // A new operator pod replaced the killed ones.
    let now: Vec<String> = operators
        .list(&lp)
        .await?
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    ensure!(
        now.iter().all(|p| !killed.contains(p)),
        "operator pods {now:?} killed {killed:?}"
    );
    Ok(())
}

#[tokio::test]
async fn deleting_the_sandbox_pod_fails_the_run_with_pod_deleted() -> Result<()> {
    let client = client().await?;
    let name = create(
        &client,
        &python_run("e2e-poddel", "import time\ntime.sleep(60)", json!({})),
    )
    .await?;
    wait_for(&client, &name, RUN_TIMEOUT, |p| p == Phase::Running).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), RUNS_NAMESPACE);
    let pod_name = pods_of(&client, &name)
        .await?
        .first()
        .map(|p| p.name_any())
        .context("no pod")?;
    pods.delete(&pod_name, &delete_now()).await?;

    let run = wait_terminal(&client, &name, Duration::from_secs(60)).await?;
    let st = status(&run);
    ensure!(st.phase == Some(Phase::Failed), "{st:?}");
    ensure!(st.reason.as_deref() == Some("PodDeleted"), "{st:?}");
    Ok(())
}

#[tokio::test]
async fn deleting_a_run_garbage_collects_its_pod() -> Result<()> {
    let client = client().await?;
    let name = create(
        &client,
        &python_run("e2e-rundel", "import time\ntime.sleep(60)", json!({})),
    )
    .await?;
    wait_for(&client, &name, RUN_TIMEOUT, |p| p == Phase::Running).await?;
    ensure!(
        !pods_of(&client, &name).await?.is_empty(),
        "running run has no pod"
    );
    runs(&client)
        .delete(&name, &DeleteParams::background())
        .await?;
    wait_no_pods(&client, &name, Duration::from_secs(60)).await
}

#[tokio::test]
async fn invalid_runs_are_rejected_by_the_api_server() -> Result<()> {
    let client = client().await?;
    let cases = [
        (
            "no tool",
            json!({"agent": "e2e"}),
            "exactly one of python, sql or metrics",
        ),
        (
            "two tools",
            json!({"agent": "e2e", "python": {"code": "print(1)"}, "sql": {"database": "d", "query": "select 1"}}),
            "exactly one of python, sql or metrics",
        ),
        (
            "negative timeout",
            json!({"agent": "e2e", "python": {"code": "print(1)"}, "limits": {"timeoutSeconds": -5}}),
            "timeoutSeconds",
        ),
        (
            "timeout above the maximum",
            json!({"agent": "e2e", "python": {"code": "print(1)"}, "limits": {"timeoutSeconds": 100000}}),
            "timeoutSeconds",
        ),
    ];
    // Sent as raw JSON: the typed client could not even express some of these.
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        RUNS_NAMESPACE,
        &kube::api::ApiResource::erase::<SandboxRun>(&()),
    );
    for (what, spec, expected) in cases {
        let obj: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "sandboxrun.dev/v1alpha1", "kind": "SandboxRun",
            "metadata": {"name": unique_name("e2e-invalid")}, "spec": spec,
        }))?;
        match api.create(&Default::default(), &obj).await {
            Ok(_) => bail!("{what}: the API server accepted an invalid SandboxRun"),
            Err(kube::Error::Api(status)) => {
                ensure!(status.code == 422, "{what}: {status:?}");
                ensure!(
                    status.message.contains(expected),
                    "{what}: message {:?}",
                    status.message
                );
            }
            Err(other) => bail!("{what}: unexpected error {other}"),
        }
    }
    Ok(())
}

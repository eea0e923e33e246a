//! `kubectl sandboxrun`, the plugin (`kubectl-plugin/`), run through the cluster's own `kubectl`
//! binary with the plugin's directory first on PATH, so kubectl's plugin discovery is part of
//! the test: a file run as a SandboxRun of the caller (output and exit code), an escalated run
//! approved with `approve` that then runs, one denied with `deny --reason` that ends Rejected with
//! the reason in its status, Event and audit line, `top agents`, Ctrl-C cancelling a run, and
//! the errors a person gets (no such run, a run not awaiting approval, RBAC refusing a verb).
//!
//! Environment (set by e2e/run-tests.sh): `KUBECONFIG`; `KUBECTL` or `$(dirname
//! $KUBECONFIG)/bin/kubectl`, else `kubectl` on PATH. The plugin binary is
//! target/debug/kubectl-sandboxrun (`cargo build -p sandboxrun-kubectl`).

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Event, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::config::{AuthInfo, Kubeconfig, NamedAuthInfo};
use kube::{Client, ResourceExt};
use sandboxrun_api::SandboxRun;
use sandboxrun_core::{Phase, Verdict};
use sandboxrun_e2e::governance::{decision, python_run_in, the_audit_line};
use sandboxrun_e2e::identity::{run_account, token_for, whoami};
use sandboxrun_e2e::runs::{RUNS_NAMESPACE, create, runs, wait_for, wait_terminal};
use sandboxrun_e2e::{client, unique_name};
use serde_json::json;

const DECIDE_TIMEOUT: Duration = Duration::from_secs(60);
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// A plugin command that follows a run: a cold sandbox, on a busy two-core machine.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(240);

/// The directory of the plugin binary: this test's build directory (target/debug).
fn plugin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("no target directory")?
        .to_path_buf();
    let plugin = dir.join("kubectl-sandboxrun");
    ensure!(
        plugin.is_file(),
        "{} is missing: cargo build -p sandboxrun-kubectl",
        plugin.display()
    );
    Ok(dir)
}

/// The cluster's kubectl: `KUBECTL`, else the harness's next to the kubeconfig, else PATH's.
fn kubectl() -> PathBuf {
    if let Some(k) = std::env::var_os("KUBECTL") {
        return k.into();
    }
    std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .and_then(|k| k.parent().map(|d| d.join("bin/kubectl")))
        .filter(|k| k.is_file())
        .unwrap_or_else(|| "kubectl".into())
}

/// PATH with the plugin's directory first.
fn path_with_plugin() -> Result<OsString> {
    let mut dirs = vec![plugin_dir()?];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    Ok(std::env::join_paths(dirs)?)
}

struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// `kubectl ARGS`, with the plugin first on PATH.
async fn kubectl_with_plugin(args: &[&str]) -> Result<Output> {
    let output = tokio::time::timeout(
        COMMAND_TIMEOUT,
        tokio::process::Command::new(kubectl())
            .args(args)
            .env("PATH", path_with_plugin()?)
            .env_remove("SANDBOXRUN_NAMESPACE")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("kubectl {args:?} did not finish within {COMMAND_TIMEOUT:?}"))??;
    Ok(Output {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// `kubectl sandboxrun ARGS -n <the runs namespace>`.
async fn sandboxrun(args: &[&str]) -> Result<Output> {
    let mut all = vec!["sandboxrun"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-n", RUNS_NAMESPACE]);
    kubectl_with_plugin(&all).await
}

/// A file with `code`, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(code: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(format!("{}.py", unique_name("e2e-kubectl")));
        std::fs::write(&path, code)?;
        Ok(Self(path))
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The run `kubectl sandboxrun run` created: its first stderr line is `NAME: created ...`.
fn created_run(out: &Output) -> Result<String> {
    out.stderr
        .lines()
        .find_map(|l| l.split_once(": created in namespace ").map(|(n, _)| n))
        .map(str::to_owned)
        .with_context(|| format!("no run named: {out:?}"))
}

/// A production run of agent `e2e` (escalated by the chart's default policy), awaiting approval.
async fn awaiting_run(admin: &Client, prefix: &str, code: &str) -> Result<String> {
    let name = create(admin, &python_run_in(prefix, "production", code, json!({}))).await?;
    let run = wait_for(admin, &name, DECIDE_TIMEOUT, |p| {
        p == Phase::AwaitingApproval
    })
    .await?;
    ensure!(
        decision(&run).is_some_and(|d| d.verdict == Verdict::Escalate),
        "{:?}",
        run.status
    );
    Ok(name)
}

fn condition<'a>(
    run: &'a SandboxRun,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    run.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// The message of the run's Event with `reason`, once there is one.
async fn event_message(client: &Client, name: &str, reason: &str) -> Result<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), RUNS_NAMESPACE);
    let lp = ListParams::default().fields(&format!(
        "involvedObject.name={name},involvedObject.kind=SandboxRun"
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let items = events.list(&lp).await?.items;
        if let Some(e) = items.iter().find(|e| e.reason.as_deref() == Some(reason)) {
            return Ok(e.message.clone().unwrap_or_default());
        }
        if tokio::time::Instant::now() > deadline {
            let seen: Vec<_> = items.iter().filter_map(|e| e.reason.clone()).collect();
            bail!("run {name}: no {reason} Event; saw {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn kubectl_finds_the_plugin_and_runs_a_file_as_the_callers_own() -> Result<()> {
    let admin = client().await?;
    let me = whoami(&admin).await?;
    // kubectl's discovery sees the plugin first on PATH.
    let list = kubectl_with_plugin(&["plugin", "list"]).await?;
    let plugin = plugin_dir()?.join("kubectl-sandboxrun");
    ensure!(
        list.stdout.contains(plugin.to_str().unwrap()),
        "kubectl plugin list: {list:?}"
    );

    let file = TempFile::new(
        "import sys\nprint('hello from the plugin')\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n",
    )?;
    let out = sandboxrun(&["run", file.path(), "--timeout", "60"]).await?;
    ensure!(out.code == Some(3), "the code's exit code: {out:?}");
    ensure!(out.stdout == "hello from the plugin\n", "{out:?}");
    ensure!(out.stderr.contains("to stderr\n"), "{out:?}");
    ensure!(out.stderr.contains(": Failed (NonZeroExit)"), "{out:?}");
    let name = created_run(&out)?;
    let run = runs(&admin).get(&name).await?;
    ensure!(run.spec.agent == me, "the caller's own run: {:?}", run.spec);
    ensure!(
        run.spec.limits.timeout_seconds == 60,
        "{:?}",
        run.spec.limits
    );
    ensure!(
        run.labels()
            .get("app.kubernetes.io/created-by")
            .map(String::as_str)
            == Some("kubectl-sandboxrun"),
        "{:?}",
        run.metadata.labels
    );
    ensure!(
        run.status.as_ref().and_then(|s| s.exit_code) == Some(3),
        "{:?}",
        run.status
    );

    // The same output again, from the stored run.
    let logs = sandboxrun(&["logs", &name]).await?;
    ensure!(logs.code == Some(3), "{logs:?}");
    ensure!(logs.stdout == "hello from the plugin\n", "{logs:?}");
    ensure!(logs.stderr.contains("to stderr\n"), "{logs:?}");

    // A run that succeeds exits 0.
    let ok = TempFile::new("print(6 * 7)\n")?;
    let out = sandboxrun(&["run", ok.path()]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(out.stdout == "42\n", "{out:?}");

    // top agents: the caller's row, with both runs.
    let top = sandboxrun(&["top", "agents"]).await?;
    ensure!(top.code == Some(0), "{top:?}");
    let mut lines = top.stdout.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        header[..4] == ["AGENT", "RUNS", "SUCCEEDED", "FAILED"],
        "{top:?}"
    );
    let row: Vec<&str> = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&me.as_str()))
        .with_context(|| format!("no row for {me}: {top:?}"))?;
    let count = |column: &str| -> u64 {
        let i = header.iter().position(|h| *h == column).unwrap();
        row[i].parse().unwrap()
    };
    ensure!(
        count("RUNS") >= 2 && count("SUCCEEDED") >= 1 && count("FAILED") >= 1,
        "{top:?}"
    );

    // Errors a person can act on.
    let missing = sandboxrun(&["logs", "no-such-run-e2e"]).await?;
    ensure!(missing.code == Some(1), "{missing:?}");
    ensure!(
        missing.stderr.contains(&format!(
            "no SandboxRun no-such-run-e2e in namespace {RUNS_NAMESPACE}"
        )),
        "{missing:?}"
    );
    let not_awaiting = sandboxrun(&["approve", &name]).await?;
    ensure!(not_awaiting.code == Some(1), "{not_awaiting:?}");
    ensure!(
        not_awaiting.stderr.contains(&format!(
            "SandboxRun {name} is not AwaitingApproval: it already ended Failed (NonZeroExit)"
        )),
        "{not_awaiting:?}"
    );
    Ok(())
}

#[tokio::test]
async fn an_escalated_run_approved_with_the_plugin_runs() -> Result<()> {
    let admin = client().await?;
    let me = whoami(&admin).await?;
    let name = awaiting_run(&admin, "e2e-kubectl-approve", "print('approved run')").await?;
    // Not finished yet: logs without -f says how to wait.
    let early = sandboxrun(&["logs", &name]).await?;
    ensure!(
        early.code == Some(1)
            && early.stderr.contains("AwaitingApproval")
            && early.stderr.contains("-f"),
        "{early:?}"
    );
    let out = sandboxrun(&["approve", &name]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(
        out.stdout
            .contains(&format!("SandboxRun {name} approved by {me}")),
        "{out:?}"
    );
    // Followed to its end: its output, its exit code, its phases on stderr.
    let logs = sandboxrun(&["logs", &name, "-f"]).await?;
    ensure!(logs.code == Some(0), "{logs:?}");
    ensure!(logs.stdout == "approved run\n", "{logs:?}");
    ensure!(
        logs.stderr.contains(&format!("{name}: Succeeded")),
        "{logs:?}"
    );
    let run = wait_terminal(&admin, &name, RUN_TIMEOUT).await?;
    ensure!(
        run.status.as_ref().and_then(|s| s.phase) == Some(Phase::Succeeded),
        "{:?}",
        run.status
    );
    let approval = run.spec.approval.clone().unwrap_or_default();
    ensure!(approval.approved && approval.by == me, "{approval:?}");
    let approved = condition(&run, "Approved").context("no Approved condition")?;
    ensure!(
        approved.status == "True" && approved.message.starts_with(&format!("{me} approved")),
        "{approved:?}"
    );
    Ok(())
}

#[tokio::test]
async fn an_escalated_run_denied_with_a_reason_ends_rejected_saying_why() -> Result<()> {
    let admin = client().await?;
    let me = whoami(&admin).await?;
    let name = awaiting_run(&admin, "e2e-kubectl-deny", "print('must not run')").await?;
    let why = format!("no production runs without a change ticket ({name})");
    let out = sandboxrun(&["deny", &name, "--reason", &why]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(
        out.stdout
            .contains(&format!("SandboxRun {name} denied by {me}: {why}")),
        "{out:?}"
    );
    let run = wait_terminal(&admin, &name, DECIDE_TIMEOUT).await?;
    let st = run.status.clone().unwrap_or_default();
    ensure!(
        st.phase == Some(Phase::Rejected) && st.reason.as_deref() == Some("ApprovalDenied"),
        "{st:?}"
    );
    ensure!(st.pod_name.is_none() && st.exit_code.is_none(), "{st:?}");
    let message = st.message.clone().unwrap_or_default();
    ensure!(
        message.contains(&format!("{me} denied it")) && message.contains(&why),
        "the status says who and why: {message}"
    );
    let approved = condition(&run, "Approved").context("no Approved condition")?;
    ensure!(
        approved.status == "False" && approved.message.contains(&why),
        "{approved:?}"
    );
    ensure!(
        run.spec.approval.as_ref().and_then(|a| a.reason.as_deref()) == Some(why.as_str()),
        "{:?}",
        run.spec.approval
    );
    let event = event_message(&admin, &name, "ApprovalDenied").await?;
    ensure!(event.contains(&why), "the Event says why: {event}");
    let line = the_audit_line(&admin, &name).await?;
    ensure!(
        line["phase_reason"] == "ApprovalDenied"
            && line["decided_by"] == me.as_str()
            && line["approval_reason"] == why.as_str(),
        "the audit line says who and why: {line}"
    );
    // logs of the denied run: no output, the reason on stderr, not a success.
    let logs = sandboxrun(&["logs", &name]).await?;
    ensure!(logs.code == Some(1) && logs.stdout.is_empty(), "{logs:?}");
    ensure!(logs.stderr.contains(&why), "{logs:?}");
    // Once decided, it cannot be decided again.
    let again = sandboxrun(&["approve", &name]).await?;
    ensure!(
        again.code == Some(1)
            && again
                .stderr
                .contains("already ended Rejected (ApprovalDenied)"),
        "{again:?}"
    );
    Ok(())
}

#[tokio::test]
async fn ctrl_c_cancels_the_run() -> Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    let admin = client().await?;
    let file = TempFile::new("import time\nprint('started', flush=True)\ntime.sleep(120)\n")?;
    let mut child = tokio::process::Command::new(kubectl())
        .args(["sandboxrun", "run", file.path(), "--timeout", "120"])
        .args(["-n", RUNS_NAMESPACE])
        .env("PATH", path_with_plugin()?)
        .env_remove("SANDBOXRUN_NAMESPACE")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stderr = BufReader::new(child.stderr.take().context("no stderr")?);
    let mut seen = String::new();
    let name = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).await? == 0 {
            bail!("the plugin ended before it created a run: {seen}");
        }
        seen.push_str(&line);
        if let Some((name, _)) = line.split_once(": created in namespace ") {
            break name.to_owned();
        }
    };
    wait_for(&admin, &name, RUN_TIMEOUT, |p| p == Phase::Running).await?;
    // kubectl execs its plugins: the process is the plugin's own, as a terminal's Ctrl-C finds it.
    let pid = child.id().context("no pid")?;
    let kill = tokio::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .await?;
    ensure!(kill.success(), "kill -INT {pid}");
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .context("the plugin did not end within 60 s of Ctrl-C")??;
    stderr.read_to_string(&mut seen).await?;
    ensure!(status.code() == Some(130), "{status:?}\n{seen}");
    ensure!(seen.contains(&format!("{name}: cancelling")), "{seen}");
    let run = wait_terminal(&admin, &name, DECIDE_TIMEOUT).await?;
    let st = run.status.clone().unwrap_or_default();
    ensure!(
        run.spec.cancelled
            && st.phase == Some(Phase::Cancelled)
            && st.reason.as_deref() == Some("CallCancelled"),
        "{st:?}"
    );
    Ok(())
}

/// A service account that may read SandboxRuns in the runs namespace and nothing else, with a
/// kubeconfig of its own; removed when dropped.
struct Viewer {
    name: String,
    kubeconfig: PathBuf,
    admin: Client,
}

impl Viewer {
    async fn create(admin: &Client) -> Result<Self> {
        let name = unique_name("e2e-kubectl-viewer");
        // Read rights only, in force before the plugin runs as it, so every refusal below is
        // the one under test.
        run_account(admin, RUNS_NAMESPACE, &name, &["get", "list", "watch"]).await?;
        let token = token_for(admin, RUNS_NAMESPACE, &name).await?;
        // The admin's kubeconfig (server, CA), with the service account's token as its user.
        let mut config = Kubeconfig::read().context("reading KUBECONFIG")?;
        config.auth_infos = vec![NamedAuthInfo {
            name: name.clone(),
            auth_info: Some(AuthInfo {
                token: Some(token.into()),
                ..AuthInfo::default()
            }),
            other: Default::default(),
        }];
        for context in &mut config.contexts {
            if let Some(c) = context.context.as_mut() {
                c.user = Some(name.clone());
            }
        }
        let kubeconfig = std::env::temp_dir().join(format!("{name}.kubeconfig"));
        std::fs::write(&kubeconfig, serde_json::to_vec(&config)?)?;
        Ok(Self {
            name,
            kubeconfig,
            admin: admin.clone(),
        })
    }

    fn kubeconfig(&self) -> &str {
        self.kubeconfig.to_str().unwrap()
    }

    async fn remove(self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
        let dp = DeleteParams::default();
        let ns = RUNS_NAMESPACE;
        let _ = Api::<RoleBinding>::namespaced(self.admin.clone(), ns)
            .delete(&self.name, &dp)
            .await;
        let _ = Api::<Role>::namespaced(self.admin.clone(), ns)
            .delete(&self.name, &dp)
            .await;
        let _ = Api::<ServiceAccount>::namespaced(self.admin.clone(), ns)
            .delete(&self.name, &dp)
            .await;
    }
}

#[tokio::test]
async fn rbac_refusals_name_the_verb_and_the_resource() -> Result<()> {
    let admin = client().await?;
    let viewer = Viewer::create(&admin).await?;
    let name = awaiting_run(&admin, "e2e-kubectl-rbac", "print('x')").await?;
    let outcome = async {
        let kubeconfig = viewer.kubeconfig();
        // It may read the run...
        let logs = sandboxrun(&["logs", &name, "--kubeconfig", kubeconfig]).await?;
        ensure!(logs.stderr.contains("AwaitingApproval"), "{logs:?}");
        // ...not decide it...
        let out = sandboxrun(&["approve", &name, "--kubeconfig", kubeconfig]).await?;
        ensure!(out.code == Some(1), "{out:?}");
        ensure!(
            out.stderr.contains(&format!(
                "forbidden by RBAC: you may not patch sandboxruns.sandboxrun.dev in namespace \
                 {RUNS_NAMESPACE}"
            )),
            "{out:?}"
        );
        // ...nor create one.
        let file = TempFile::new("print(1)\n")?;
        let out = sandboxrun(&["run", file.path(), "--kubeconfig", kubeconfig]).await?;
        ensure!(out.code == Some(1), "{out:?}");
        ensure!(
            out.stderr.contains(&format!(
                "forbidden by RBAC: you may not create sandboxruns.sandboxrun.dev in namespace \
                 {RUNS_NAMESPACE}"
            )),
            "{out:?}"
        );
        // Nothing was written: the run still waits for a person.
        let run = runs(&admin).get(&name).await?;
        ensure!(
            run.spec.approval.is_none()
                && run.status.as_ref().and_then(|s| s.phase) == Some(Phase::AwaitingApproval),
            "{:?}",
            run.spec.approval
        );
        Ok(())
    }
    .await;
    viewer.remove().await;
    // Not left waiting for its approval timeout.
    let by = whoami(&admin).await?;
    let deny =
        json!({"spec": {"approval": {"approved": false, "by": by, "reason": "e2e cleanup"}}});
    let _ = runs(&admin)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&deny))
        .await;
    outcome
}

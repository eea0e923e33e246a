//! `run FILE.py`: the file's code as a SandboxRun of the caller's own (`spec.agent` is the
//! caller's user name: the chart's identity policy admits nothing else from creators it does not
//! trust), followed until it ends; Ctrl-C cancels it (`spec.cancelled`, as the MCP frontend does
//! for a call that went away), and the operator ends it `Cancelled` and stops its sandbox.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use sandboxrun_api::{LimitsSpec, PythonSpec, SandboxRun, SandboxRunSpec};
use sandboxrun_core::limits::{DEFAULT_TTL_SECONDS_AFTER_FINISHED, MAX_CODE_BYTES};
use sandboxrun_core::{Environment, Limits};

use crate::cli;
use crate::cluster::{self, Doing, explain};
use crate::follow;
use crate::term::note;

/// Label on the runs this plugin creates (the frontend's say `sandboxrun-mcp`).
pub const CREATED_BY: (&str, &str) = ("app.kubernetes.io/created-by", "kubectl-sandboxrun");

/// Exit status after Ctrl-C cancelled the run (128 + SIGINT, as shells report it).
pub const CANCELLED_EXIT: u8 = 130;

/// How long a cancelled run is followed to its end before the plugin gives up on the operator.
const CANCEL_WAIT: Duration = Duration::from_secs(30);

/// Reads the code: the file, or standard input for `-`.
pub fn read_code(path: &Path) -> Result<String> {
    let code = if path == Path::new("-") {
        let mut code = String::new();
        std::io::stdin()
            .read_to_string(&mut code)
            .context("reading the code from standard input")?;
        code
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    check_code(&code, path)?;
    Ok(code)
}

/// A SandboxRun accepts code of 1 to [`MAX_CODE_BYTES`] characters.
fn check_code(code: &str, path: &Path) -> Result<()> {
    if code.trim().is_empty() {
        bail!("{} holds no code", path.display());
    }
    let chars = code.chars().count();
    if chars > MAX_CODE_BYTES as usize {
        bail!(
            "{} has {chars} characters; a SandboxRun takes at most {MAX_CODE_BYTES}",
            path.display()
        );
    }
    Ok(())
}

/// The SandboxRun of `agent` for `code`: a name of its own (`kubectl-` and 20 hex digits, so a
/// retried create meets its first attempt), the plugin's label, the default limits but for the
/// timeout.
pub fn build_run(
    agent: &str,
    code: String,
    environment: Environment,
    timeout: Option<u32>,
) -> SandboxRun {
    let mut limits = Limits::default();
    if let Some(timeout) = timeout {
        limits.timeout_seconds = timeout;
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (key, value) = CREATED_BY;
    SandboxRun {
        metadata: ObjectMeta {
            name: Some(format!("kubectl-{}", &id[..20])),
            labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
            ..ObjectMeta::default()
        },
        spec: SandboxRunSpec {
            agent: agent.to_owned(),
            environment,
            python: Some(PythonSpec {
                code,
                ..PythonSpec::default()
            }),
            sql: None,
            metrics: None,
            limits: LimitsSpec::from(limits),
            ttl_seconds_after_finished: DEFAULT_TTL_SECONDS_AFTER_FINISHED,
            approval: None,
            cancelled: false,
        },
        status: None,
    }
}

/// `run FILE`: creates the run, follows it, prints its output; returns the exit status.
pub async fn run(client: &Client, namespace: &str, args: &cli::Run) -> Result<u8> {
    let code = read_code(&args.file)?;
    let me = cluster::whoami(client).await?;
    // The API server would refuse it as spec.agent (the CRD's pattern); say why first.
    if let Err(e) = sandboxrun_core::validate_agent_name(&me) {
        bail!(
            "your user name cannot be a run's agent (spec.agent is your user name): {e}; run it \
             as another user, or through the MCP frontend"
        );
    }
    let run = build_run(&me, code, args.environment, args.timeout);
    let name = run.metadata.name.clone().unwrap_or_default();
    let api = cluster::runs(client, namespace);
    match api.create(&PostParams::default(), &run).await {
        Ok(_) => {}
        // A create retried after its answer was lost: the first attempt made it.
        Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => {}
        Err(e) => return Err(explain(e, &Doing::runs("create", namespace, None))),
    }
    note!("{name}: created in namespace {namespace} for agent {me}");
    let finished = tokio::select! {
        run = follow::wait(&api, namespace, &name) => Some(run?),
        interrupted = tokio::signal::ctrl_c() => {
            interrupted.context("listening for Ctrl-C")?;
            None
        }
    };
    let Some(done) = finished else {
        return cancel(&api, namespace, &name, args.raw).await;
    };
    follow::print_output(&done, args.raw)?;
    Ok(follow::exit_status(done.status.as_ref()))
}

/// Cancels the run after Ctrl-C and follows it to its end (a second Ctrl-C stops waiting).
async fn cancel(api: &kube::Api<SandboxRun>, namespace: &str, name: &str, raw: bool) -> Result<u8> {
    note!("{name}: cancelling (spec.cancelled)");
    let patch = serde_json::json!({ "spec": { "cancelled": true } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| explain(e, &Doing::runs("patch", namespace, Some(name))))?;
    tokio::select! {
        ended = tokio::time::timeout(CANCEL_WAIT, follow::wait(api, namespace, name)) => {
            match ended {
                Ok(run) => follow::print_output(&run?, raw)?,
                Err(_) => note!(
                    "{name}: still not ended {}s after the cancellation: is the sandboxrun \
                     operator running?",
                    CANCEL_WAIT.as_secs()
                ),
            }
        }
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(CANCELLED_EXIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

    #[test]
    fn the_run_is_the_callers_own_with_the_plugins_label() {
        let run = build_run(
            "system:serviceaccount:team:bot",
            "print(1)".into(),
            Environment::Staging,
            Some(7),
        );
        assert_eq!(run.spec.agent, "system:serviceaccount:team:bot");
        assert_eq!(run.spec.environment, Environment::Staging);
        assert_eq!(run.spec.python.as_ref().unwrap().code, "print(1)");
        assert_eq!(run.spec.limits.timeout_seconds, 7);
        assert_eq!(run.spec.limits.cpu, Limits::default().cpu);
        assert!(!run.spec.cancelled && run.spec.approval.is_none());
        let name = run.name_any();
        assert!(name.starts_with("kubectl-") && name.len() == 28, "{name}");
        assert_eq!(
            run.labels()
                .get("app.kubernetes.io/created-by")
                .map(String::as_str),
            Some("kubectl-sandboxrun")
        );
        // Two runs never share a name.
        assert_ne!(
            build_run("a", "x".into(), Environment::Sandbox, None).name_any(),
            name
        );
        // Without --timeout, the default.
        let default = build_run("a", "x".into(), Environment::Sandbox, None);
        assert_eq!(
            default.spec.limits.timeout_seconds,
            Limits::default().timeout_seconds
        );
    }

    #[test]
    fn code_must_fit_a_sandboxrun() {
        let path = Path::new("job.py");
        assert!(check_code("print(1)\n", path).is_ok());
        let empty = check_code(" \n", path).unwrap_err().to_string();
        assert_eq!(empty, "job.py holds no code");
        let big = "#".repeat(MAX_CODE_BYTES as usize + 1);
        let err = check_code(&big, path).unwrap_err().to_string();
        assert!(err.contains("at most 262144"), "{err}");
        // Characters, not bytes, as the API server counts them.
        assert!(check_code(&"é".repeat(MAX_CODE_BYTES as usize), path).is_ok());
    }

    #[test]
    fn read_code_names_a_missing_file() {
        let err = read_code(Path::new("/nonexistent/job.py")).unwrap_err();
        assert!(
            format!("{err:#}").starts_with("reading /nonexistent/job.py"),
            "{err:#}"
        );
    }
}

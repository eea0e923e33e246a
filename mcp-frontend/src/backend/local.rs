//! The embedded backend: runs each call on this machine through `sandboxrun_core::local`
//! (gVisor `runsc` when present, else bubblewrap), with the same limits as a cluster run.
//! The sandbox itself lives in `sandboxrun-core` so the operator's tests and the frontend share
//! one implementation; this file only adapts its result to a [`RunOutput`].

use std::path::PathBuf;

use futures::{FutureExt, future::BoxFuture};
use sandboxrun_core::Phase;
use sandboxrun_core::local::{LocalRun, LocalSandbox, LocalSandboxConfig, Preference};
use tokio_util::sync::CancellationToken;

use super::{Backend, BackendError, ProgressFn, RunOutput, RunRequest};

/// Settings of the local sandbox, from the command line.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// Root filesystem with python3 for the sandbox; `None` uses the driver's default.
    pub rootfs: Option<PathBuf>,
    /// `auto`, `gvisor` or `bubblewrap`.
    pub isolation: String,
    /// Path of `runsc`, when not on PATH.
    pub runsc: Option<PathBuf>,
    /// Path of `bwrap`, when not on PATH.
    pub bwrap: Option<PathBuf>,
    /// Size of the sandbox's private memory-backed /tmp, in bytes.
    pub tmp_size_bytes: u64,
    /// Directory for the sandbox's runtime state; `None` uses the driver's default.
    pub state_dir: Option<PathBuf>,
}

/// Runs code in a sandbox on this machine.
#[derive(Clone)]
pub struct LocalBackend {
    sandbox: LocalSandbox,
}

impl LocalBackend {
    /// Finds a usable isolation (gVisor, then bubblewrap, unless one is forced) and checks the
    /// root filesystem, so a missing piece is reported at start-up, not on the first call.
    pub async fn detect(opts: LocalOptions) -> anyhow::Result<Self> {
        let preference: Preference = opts.isolation.parse().map_err(anyhow::Error::msg)?;
        let config = LocalSandboxConfig {
            rootfs: opts
                .rootfs
                .unwrap_or_else(LocalSandboxConfig::default_rootfs),
            preference,
            runsc: opts.runsc,
            bwrap: opts.bwrap,
            tmp_size_bytes: opts.tmp_size_bytes,
            state_dir: opts
                .state_dir
                .unwrap_or_else(LocalSandboxConfig::default_state_dir),
        };
        let sandbox = LocalSandbox::detect(config).await?;
        tracing::info!(isolation = %sandbox.isolation(), "local sandbox ready");
        Ok(Self { sandbox })
    }

    async fn run(
        &self,
        req: RunRequest,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<RunOutput, BackendError> {
        let run_name = format!("local-{}", uuid::Uuid::new_v4().simple());
        progress(Phase::Pending, &run_name);
        progress(Phase::Running, &run_name);
        tracing::info!(run = %run_name, agent = %req.agent, "starting local sandbox");
        // Dropping the driver's future kills the sandbox, so losing the race to `cancel`
        // leaves nothing running.
        tokio::select! {
            r = self.sandbox.run_python(&req.code, &req.limits) => match r {
                Ok(run) => Ok(to_output(run, run_name)),
                Err(e) => Err(BackendError::Unavailable(format!("the local sandbox failed: {e}"))),
            },
            () = cancel.cancelled() => Err(BackendError::Cancelled),
        }
    }
}

/// Maps the driver's result to the agent's view.
fn to_output(run: LocalRun, run_name: String) -> RunOutput {
    let r = &run.result;
    let message = match r.signal {
        Some(sig) if run.outcome == Phase::Failed && run.reason.as_deref() != Some("OOMKilled") => {
            Some(format!(
                "the code was killed by signal {sig} (exit code {})",
                r.exit_code
            ))
        }
        _ => None,
    };
    RunOutput {
        stdout: r.stdout.clone(),
        stderr: r.stderr.clone(),
        exit_code: (run.outcome != Phase::Rejected).then_some(r.exit_code),
        truncated: r.truncated(),
        // The code's own run time, as the operator reports it; the sandbox's when unknown.
        duration_ms: r.duration_millis.unwrap_or(run.duration_ms),
        run_name,
        phase: run.outcome,
        reason: run.reason,
        message,
    }
}

impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    fn run_python(
        &self,
        req: RunRequest,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<RunOutput, BackendError>> {
        self.run(req, progress, cancel).boxed()
    }
}

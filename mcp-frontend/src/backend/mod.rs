//! Where a tool call is executed. The call pipeline only knows [`Backend`], and the backends
//! only know the tool traits (`ToolSpec` in core, `ClusterTool` in the API crate), not any
//! tool: a call becomes a SandboxRun in a cluster (`kube`) or runs on this machine (`local`).

pub mod kube;
pub mod live_log;
pub mod local;
pub mod run_watch;

use std::sync::Arc;
use std::time::Duration;

use sandboxrun_api::ClusterTool;
use sandboxrun_core::{OutputFn, Phase};
use tokio_util::sync::CancellationToken;

/// Receives the non-terminal phases a run passes through (Pending, Running, and
/// AwaitingApproval while a call waits for a person) with the run's name and, for a run that
/// waits in the queue for a sandbox, the operator's word on its place, so the tool can turn
/// them into MCP progress notifications. Pending comes first, again each time a queued run's
/// place changes; Running at most once; AwaitingApproval repeats while the wait lasts.
pub type ProgressFn = Arc<dyn Fn(Phase, &str, Option<&str>) + Send + Sync>;

/// Why a backend could not produce a result. A result with a failed phase (non-zero exit,
/// timeout, rejection) is not an error: it is the tool's output.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The caller cancelled the request; the run was deleted or killed.
    #[error("the run was cancelled")]
    Cancelled,
    /// The backend cannot run the call right now (API server unreachable, sandbox missing,
    /// ...). The message says what to check.
    #[error("{0}")]
    Unavailable(String),
}

/// Executes tool calls: every tool, in one of two places.
pub enum Backend {
    /// Each call becomes a SandboxRun that the operator executes.
    Kube(Box<kube::KubeBackend>),
    /// Each call is judged and executed on this machine.
    Local(local::LocalBackend),
}

impl Backend {
    /// Ends the session `id` of `agent` (`run_python`'s `session`) and destroys its sandbox;
    /// `Err` says why not, in words a model can act on (an id that is none of the agent's
    /// sessions gets the same words whoever holds it).
    pub async fn close_session(&self, agent: &str, id: &str) -> Result<(), String> {
        match self {
            Backend::Local(local) => local.embedded().sessions.close(agent, id).await,
            Backend::Kube(kube) => kube.close_session(agent, id).await,
        }
    }

    /// Short name for logs and metrics (`kube` or `local`).
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Kube(_) => "kube",
            Backend::Local(_) => "local",
        }
    }

    /// Runs `call` for `agent` to its result. `progress` hears the run's phases, `output` what
    /// the code prints while it runs (run_python; in the cluster from the sandbox's log); when `cancel`
    /// fires the run is deleted (kube) or killed (local) and [`BackendError::Cancelled`] is
    /// returned. Dropping the future cleans up the same way. `approval_wait` replaces the
    /// configured approval wait for this call (kube; embedded runs never await a person).
    pub async fn call<T: ClusterTool>(
        &self,
        agent: &str,
        call: T::Call,
        progress: ProgressFn,
        output: Option<OutputFn>,
        cancel: CancellationToken,
        approval_wait: Option<Duration>,
    ) -> Result<T::Output, BackendError> {
        match self {
            Backend::Kube(kube) => {
                kube.call::<T>(agent, call, progress, output, cancel, approval_wait)
                    .await
            }
            Backend::Local(local) => local.call::<T>(agent, call, progress, output, cancel).await,
        }
    }
}

//! Where a `run_python` call is executed. The MCP layer only knows this trait, so the tool code
//! is the same whether a call becomes a SandboxRun in a cluster (`kube`) or a sandbox on this
//! machine (`local`).

pub mod kube;
pub mod local;
pub mod outcome;

use std::sync::Arc;

use futures::future::BoxFuture;
use sandboxrun_core::{Limits, Phase};
use tokio_util::sync::CancellationToken;

pub use outcome::RunOutput;

/// One request to run Python code, already validated against the frontend's policy.
#[derive(Clone, Debug)]
pub struct RunRequest {
    /// Identity of the caller, recorded in `spec.agent` (kube) and in logs.
    pub agent: String,
    /// The Python source.
    pub code: String,
    /// Effective limits of the run.
    pub limits: Limits,
}

/// Receives the non-terminal phases a run passes through (Pending, Running, and
/// AwaitingApproval while a call waits for a person) with the run's name, so the tool can turn
/// them into MCP progress notifications. Pending and Running are reported at most once each, in
/// order; AwaitingApproval repeats while the wait lasts.
pub type ProgressFn = Arc<dyn Fn(Phase, &str) + Send + Sync>;

/// Why a backend could not produce a result. A result with a failed phase (non-zero exit,
/// timeout, rejection) is not an error: it is a [`RunOutput`].
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The caller cancelled the request; the run was deleted or killed.
    #[error("the run was cancelled")]
    Cancelled,
    /// The backend cannot run code right now (API server unreachable, sandbox missing, ...).
    /// The message says what to check.
    #[error("{0}")]
    Unavailable(String),
}

/// Executes Python snippets in isolation.
pub trait Backend: Send + Sync + 'static {
    /// Short name for logs and metrics (`kube` or `local`).
    fn name(&self) -> &'static str;

    /// Runs `req` to a terminal phase. `progress` hears Pending and Running; when `cancel`
    /// fires the run is deleted (kube) or killed (local) and [`BackendError::Cancelled`] is
    /// returned. Dropping the future must clean up the same way.
    fn run_python(
        &self,
        req: RunRequest,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<RunOutput, BackendError>>;
}

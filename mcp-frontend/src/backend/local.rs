//! The embedded backend: each call is judged by the policy and executed on this machine by its
//! tool's own embedded executor (`ToolSpec::run_embedded` in core: the local gVisor or
//! bubblewrap sandbox, the configured databases, this process's call record).

use std::sync::Arc;

use sandboxrun_core::tools::{Embedded, ToolSpec};
use sandboxrun_core::{OutputFn, Phase};
use tokio_util::sync::CancellationToken;

use super::{BackendError, ProgressFn};

/// Runs calls on this machine.
#[derive(Clone)]
pub struct LocalBackend {
    embedded: Arc<Embedded>,
}

impl LocalBackend {
    /// A backend over the embedded resources (see `crate::embedded`).
    pub fn new(embedded: Arc<Embedded>) -> Self {
        Self { embedded }
    }

    /// The embedded resources calls run with (the policy, the databases).
    pub fn embedded(&self) -> &Embedded {
        &self.embedded
    }

    /// Judges and runs one call.
    pub async fn call<T: ToolSpec>(
        &self,
        agent: &str,
        call: T::Call,
        progress: ProgressFn,
        output: Option<OutputFn>,
        cancel: CancellationToken,
    ) -> Result<T::Output, BackendError> {
        let run_name = format!("local-{}", uuid::Uuid::new_v4().simple());
        progress(Phase::Pending, &run_name, None);
        progress(Phase::Running, &run_name, None);
        // Dropping the executor's future kills its sandbox or query, so losing the race to
        // `cancel` leaves nothing running.
        tokio::select! {
            r = T::run_embedded(&self.embedded, agent, run_name, call, output) => {
                r.map_err(BackendError::Unavailable)
            }
            () = cancel.cancelled() => Err(BackendError::Cancelled),
        }
    }
}

//! Who makes a call, and where what happens while it runs goes: a request's progress
//! notifications, or the status of the MCP task the call runs as. The pipeline (`pipeline.rs`)
//! takes a [`CallScope`]; the handler (`server.rs`) makes one for each way a call arrives.

use std::time::Duration;

#[allow(deprecated)] // SEP-2577 deprecates logging; see logging.rs
use rmcp::model::LoggingLevel;
use rmcp::model::ProgressToken;
use rmcp::{Peer, RoleServer};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Who makes a call, and where what happens while it runs goes.
pub struct CallScope {
    /// The caller.
    pub agent: String,
    /// What the caller's access token allows (`None`: an API key or the local user).
    pub grant: Option<crate::grant::Grant>,
    /// Where the run's phases and output go while it runs.
    pub reporter: Reporter,
    /// Fires when the caller gives the call up: the run is then stopped.
    pub cancel: CancellationToken,
    /// Replaces the configured approval wait (a task follows an approval for its lifetime).
    pub approval_wait: Option<Duration>,
}

/// Where a call's phases and output go while it runs.
pub enum Reporter {
    /// MCP notifications on the request: the output a run prints as log messages when the
    /// client asked for log messages of its level (`log` names the least severe level it wants,
    /// `logging.rs`), else as progress notifications; phases as progress notifications.
    /// Progress needs a progress token.
    Request {
        peer: Peer<RoleServer>,
        token: Option<ProgressToken>,
        #[allow(deprecated)]
        log: Option<LoggingLevel>,
    },
    /// The status message of the MCP task the call runs as (`tasks/get` shows the latest).
    Task(watch::Sender<String>),
}

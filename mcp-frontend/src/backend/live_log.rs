//! A running sandbox's output, as it is printed: the frontend follows the sandbox Pod's log (the
//! runner's output lines, see `sandboxrun_core::runner`) and hands each chunk to the call, which
//! sends it to the client as progress. Only the runner writes that log, so what is read is the
//! code's real output, capped by the runner like the final result; the final result still comes
//! from the run's status, and is the same whether or not any of this arrived.

use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use sandboxrun_core::{OutputFn, parse_output_line};
use tokio::task::JoinHandle;

/// The sandbox Pod's one container (`operator/src/python/pod.rs`).
const CONTAINER: &str = "sandbox";
/// Pause before following again after the log could not be opened (container not started yet)
/// or broke off.
const RETRY: Duration = Duration::from_millis(250);
/// How long a finished call waits for the log's last lines before it returns its result.
pub const DRAIN: Duration = Duration::from_secs(1);

/// Follows one Pod's log in the background until it ends or the handle is dropped.
pub struct LogFollower {
    task: JoinHandle<()>,
}

impl LogFollower {
    /// Starts following `pod`'s log, handing its output lines to `output`.
    pub fn start(pods: Api<Pod>, pod: String, output: OutputFn) -> Self {
        Self {
            task: tokio::spawn(follow(pods, pod, output)),
        }
    }

    /// Waits up to [`DRAIN`] for the log's last output line (the runner's envelope ends the
    /// output, and the sandbox finishes before its result is written, so it is usually read
    /// already), then stops following.
    pub async fn finish(mut self) {
        let _ = tokio::time::timeout(DRAIN, &mut self.task).await;
    }
}

impl Drop for LogFollower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn follow(pods: Api<Pod>, pod: String, output: OutputFn) {
    let params = LogParams {
        container: Some(CONTAINER.to_owned()),
        follow: true,
        ..LogParams::default()
    };
    // Output lines already handed on: a log followed again starts from its beginning.
    let mut delivered = 0usize;
    loop {
        match pods.log_stream(&pod, &params).await {
            Ok(stream) => {
                let mut lines = stream.lines();
                let mut seen = 0usize;
                let mut broke = false;
                while let Some(line) = lines.next().await {
                    let Ok(line) = line else {
                        broke = true;
                        break;
                    };
                    // The envelope is the runner's last line: no output follows it.
                    if line.starts_with("{\"sandboxrun\":") {
                        return;
                    }
                    if let Some(chunk) = parse_output_line(&line) {
                        seen += 1;
                        if seen > delivered {
                            delivered = seen;
                            output(chunk);
                        }
                    }
                }
                if !broke {
                    // The container ended: its log is complete.
                    return;
                }
            }
            // Forbidden: this frontend may not read sandbox logs (an older chart); the result
            // still comes, only without live output.
            Err(kube::Error::Api(e)) if e.code == 403 => {
                tracing::warn!(%pod, message = %e.message, "cannot follow the sandbox's log; output comes with the result only");
                return;
            }
            // Not started yet (400 "waiting to start"), or gone: try again until the call ends.
            Err(e) => tracing::debug!(%pod, error = %e, "sandbox log not readable yet"),
        }
        tokio::time::sleep(RETRY).await;
    }
}

//! Talking to a session's runner: a call goes over an attach stream of its own
//! ([`session_frame`], named after the run's uid), and its result comes back on that stream or,
//! for an operator that restarted or a call longer than a reconcile waits, from the sandbox's
//! log. The runner prints `sandboxrun-program-received <CALL>` once it has the whole frame and
//! runs a call of a name it already had never again, so a frame can be sent again safely.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, AttachedProcess, LogParams};
use sandboxrun_core::{PROGRAM_RECEIVED, parse_call_envelope};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::python::feed::FeedError;
use crate::python::pod::CONTAINER;

/// How long the API server may take to open an attach stream.
const ATTACH_WITHIN: Duration = Duration::from_secs(10);

/// What the runner's output says of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    /// Its envelope line.
    Envelope(String),
    /// The runner has it, and has not answered yet.
    Received,
    /// Nothing of it.
    Nothing,
}

/// What `text` (the runner's output) says of `call`.
pub fn heard(text: &str, call: &str) -> Heard {
    let received = format!("{PROGRAM_RECEIVED} {call}");
    let mut got = false;
    for line in text.lines() {
        let line = line.trim_end();
        if line == received {
            got = true;
        } else if line.starts_with("{\"sandboxrun\"") && parse_call_envelope(line, call).is_ok() {
            return Heard::Envelope(line.to_owned());
        }
    }
    if got { Heard::Received } else { Heard::Nothing }
}

/// An attach stream to a session's runner.
pub struct Attached {
    process: AttachedProcess,
}

impl Attached {
    /// Attaches to `pod`'s runner: with `stdin` to send a call, without to listen only.
    pub async fn open(pods: &Api<Pod>, pod: &str, stdin: bool) -> Result<Self, FeedError> {
        let params = AttachParams::default()
            .container(CONTAINER)
            .stdin(stdin)
            .stdout(true)
            .stderr(false);
        let process = tokio::time::timeout(ATTACH_WITHIN, pods.attach(pod, &params))
            .await
            .map_err(|_| {
                FeedError::NotStarted(format!(
                    "the attach was not answered within {ATTACH_WITHIN:?}"
                ))
            })??;
        Ok(Self { process })
    }

    /// Sends `frame` to the runner. The stream stays open (the session's stdin is not closed by
    /// it: `stdinOnce` is off), to read the answer.
    pub async fn send(&mut self, frame: &[u8]) -> Result<(), FeedError> {
        let mut stdin = self
            .process
            .stdin()
            .ok_or_else(|| FeedError::Unconfirmed("no stdin stream".into()))?;
        stdin.write_all(frame).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Reads the runner's output until `call`'s envelope, at most `within`: `None` when it did
    /// not come (or the stream ended). Only the line being read is kept: the output lines of
    /// the call are not needed here (the envelope has the output), so at most `most` bytes.
    pub async fn until_envelope(
        &mut self,
        call: &str,
        within: Duration,
        most: usize,
    ) -> Option<String> {
        let mut stdout = self.process.stdout()?;
        let read = async {
            let mut line: Vec<u8> = Vec::new();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let n = match stdout.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => n,
                };
                for &b in &chunk[..n] {
                    if b != b'\n' {
                        if line.len() < most {
                            line.push(b);
                        }
                        continue;
                    }
                    if let Heard::Envelope(envelope) = heard(&String::from_utf8_lossy(&line), call)
                    {
                        return Some(envelope);
                    }
                    line.clear();
                }
            }
        };
        tokio::time::timeout(within, read).await.ok().flatten()
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.process.abort();
    }
}

/// The session sandbox's log since `since` (a second earlier: the log's times are whole
/// seconds), at most `limit` bytes, read within `timeout`.
pub async fn log_since(
    pods: &Api<Pod>,
    pod: &str,
    since: Timestamp,
    limit: i64,
    timeout: Duration,
) -> Result<String, kube::Error> {
    let params = LogParams {
        container: Some(CONTAINER.to_owned()),
        limit_bytes: Some(limit),
        since_time: Some(since - jiff::SignedDuration::from_secs(1)),
        ..Default::default()
    };
    crate::python::log::read(pods, pod, &params, timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_calls_own_lines_count() {
        let envelope = |call: &str| {
            let mut result = sandboxrun_core::runner::fixtures::envelope(0);
            result.call = Some(call.to_owned());
            serde_json::to_string(&result).unwrap()
        };
        let log = format!(
            "{PROGRAM_RECEIVED} a\n{}\n{PROGRAM_RECEIVED} b\nsandboxrun-out 1 eA==\n",
            envelope("a")
        );
        assert_eq!(heard(&log, "b"), Heard::Received);
        assert_eq!(heard(&log, "a"), Heard::Envelope(envelope("a")));
        assert_eq!(heard(&log, "c"), Heard::Nothing);
        // A line that only starts like the confirmation is not one.
        assert_eq!(
            heard(&format!("{PROGRAM_RECEIVED} bb\n"), "b"),
            Heard::Nothing
        );
    }
}

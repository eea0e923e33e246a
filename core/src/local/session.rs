//! A session's local sandbox: one engine (bubblewrap or gVisor) whose runner keeps an
//! interpreter between calls (`runner_session.py`), with the same isolation and limits as a
//! single run's sandbox. The calls of a session are run one at a time (`&mut self`); each is sent
//! with [`session_frame`] and its result is the envelope that names it. The sandbox is killed and
//! removed when the session is closed, when its runner ends it (a call that timed out or killed
//! its interpreter), or when the [`LocalSession`] is dropped.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::{
    Cleanup, ENGINE_STDERR_BYTES, LineSplitter, LocalRun, LocalSandbox, LocalSandboxError, Started,
    exit_code_of,
};
use crate::files::{ENVELOPE_FILES_MAX_BYTES, Profile};
use crate::limits::Limits;
use crate::runner::{
    Observed, OutputFn, Program, RunnerResult, SESSION_CLOSE, parse_call_envelope,
    parse_output_line, session_argv, session_ended_message, session_frame, valid_call_name,
};

/// Beyond the call's own timeout, how long a call may take: the runner's clean-up after the code
/// (a fork of an interpreter the call left with threads, at most 30 s in runner_session.py) and, for the
/// first call, the engine's start.
const CALL_GRACE: Duration = Duration::from_secs(30);

/// How long a closed session's runner has to exit before it is killed.
const CLOSE_WITHIN: Duration = Duration::from_secs(2);

/// One call's outcome in a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionCall {
    /// What the runner reported and the driver saw, classified like a single run.
    pub run: LocalRun,
    /// Why the session ended with this call; `None` while it goes on.
    pub ended: Option<String>,
}

/// A session's sandbox, started and waiting for calls.
#[derive(Debug)]
pub struct LocalSession {
    child: Child,
    /// Kills and removes the sandbox when dropped (moved to a blocking thread by `Drop`).
    cleanup: Option<Cleanup>,
    _inherited: Vec<OwnedFd>,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    /// The runner's stdout between calls: a line may end in a later read.
    lines: LineSplitter,
    /// The engine's stderr, its latest bytes (read on a task of its own: nothing may block on it).
    stderr: Arc<Mutex<Vec<u8>>>,
    /// The session's limits: cpu, memory and pids for its life, the largest timeout and output
    /// cap of its calls.
    limits: Limits,
    /// Why the session is over, once it is.
    ended: Option<String>,
    calls: u64,
}

impl LocalSandbox {
    /// Starts a session's sandbox of `profile` under `limits` (its cpu, memory and pids hold for
    /// the whole session, its timeout and output cap are each call's ceilings). The runner
    /// preloads the profile's libraries and forks its interpreter while it waits for the first
    /// call.
    pub fn open_session(
        &self,
        profile: Profile,
        limits: &Limits,
    ) -> Result<LocalSession, LocalSandboxError> {
        let limits = limits.clamped();
        let Started {
            mut child,
            cleanup,
            _inherited,
        } = self.start(&limits, profile, session_argv(&limits, profile))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut engine_stderr = child.stderr.take().expect("stderr is piped");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let tail = Arc::clone(&stderr);
        tokio::spawn(async move {
            let mut chunk = vec![0u8; 16 * 1024];
            while let Ok(n) = engine_stderr.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                let mut kept = tail.lock().expect("not poisoned");
                kept.extend_from_slice(&chunk[..n]);
                if kept.len() > 2 * ENGINE_STDERR_BYTES {
                    let cut = kept.len() - ENGINE_STDERR_BYTES;
                    kept.drain(..cut);
                }
            }
        });
        Ok(LocalSession {
            child,
            cleanup: Some(cleanup),
            _inherited,
            stdin,
            stdout,
            lines: LineSplitter::new(envelope_max(&limits)),
            stderr,
            limits,
            ended: None,
            calls: 0,
        })
    }
}

impl LocalSession {
    /// Why the session is over, once it is (no further call can run in it).
    pub fn ended(&self) -> Option<&str> {
        self.ended.as_deref()
    }

    /// How many calls ran in it.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Runs `program` as the session's next call, named `call` (a
    /// [`crate::runner::valid_call_name`]), under `limits`' timeout and output cap (each no
    /// higher than the session's), handing what the code prints to `output` as it comes.
    /// `Err` only when the call could not be sent: the session is over (see
    /// [`LocalSession::ended`]) or the name is not valid. Whatever the code does is an `Ok`,
    /// whose [`SessionCall::ended`] says whether the session ended with it.
    pub async fn call(
        &mut self,
        call: &str,
        program: &Program<'_>,
        limits: &Limits,
        output: Option<OutputFn>,
    ) -> Result<SessionCall, LocalSandboxError> {
        if let Some(why) = &self.ended {
            return Err(LocalSandboxError::SessionEnded(why.clone()));
        }
        if !valid_call_name(call) {
            return Err(LocalSandboxError::Io {
                context: format!("invalid call name {call:?}"),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        let limits = Limits {
            timeout_seconds: limits.timeout_seconds.min(self.limits.timeout_seconds),
            output_bytes: limits.output_bytes.min(self.limits.output_bytes),
            ..self.limits.clone()
        }
        .clamped();
        self.calls += 1;
        let began = Instant::now();
        let oom_before = self.oom_killed();
        let frame = session_frame(call, program, &limits);
        let deadline = Duration::from_secs(u64::from(limits.timeout_seconds)) + CALL_GRACE;
        let stdin = self.stdin.as_mut().expect("open while the session is");
        let (lines, stdout) = (&mut self.lines, &mut self.stdout);
        let outcome = tokio::time::timeout(deadline, async {
            // A runner that died first makes this a broken pipe: what it left says why.
            let _ = stdin.write_all(&frame).await;
            let _ = stdin.flush().await;
            read_call(stdout, lines, call, output.as_ref()).await
        })
        .await;
        let (envelope, deadline_hit) = match outcome {
            Ok(found) => (found, false),
            Err(_) => (None, true),
        };
        let ended = match &envelope {
            Some(result) => result
                .session
                .as_ref()
                .filter(|state| !state.alive)
                .map(|state| session_ended_message(state.ended, state.message.as_deref())),
            None if deadline_hit => Some(format!(
                "the session's sandbox did not answer within {}s of the call, so it was stopped",
                deadline.as_secs()
            )),
            None => Some("the session's sandbox exited".to_owned()),
        };
        let mut exit_code = envelope.as_ref().map(|e| e.exit_code);
        if ended.is_some() {
            exit_code = self.stop().await.or(exit_code);
        }
        let oom = self
            .oom_killed()
            .map(|after| after && oom_before != Some(true));
        let detail = String::from_utf8_lossy(&self.stderr.lock().expect("not poisoned"))
            .trim()
            .to_owned();
        let observed = Observed {
            oom_killed: oom,
            deadline_hit,
            pids_limit_hit: self
                .cleanup
                .as_ref()
                .and_then(|c| c.cgroup.as_ref())
                .is_some_and(super::cgroup::RunCgroup::pids_limit_hit),
            exit_code,
            platform_reason: None,
            envelope_error: envelope
                .is_none()
                .then(|| "the runner printed no result for the call".to_owned()),
            detail: if envelope.is_none() {
                detail
            } else {
                String::new()
            },
        };
        self.ended.clone_from(&ended);
        Ok(SessionCall {
            run: LocalRun {
                envelope,
                observed,
                duration_ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
            },
            ended,
        })
    }

    /// Ends the session: its runner kills the interpreter and exits, and the sandbox is removed.
    pub async fn close(mut self) {
        if self.ended.is_none() {
            if let Some(stdin) = self.stdin.as_mut() {
                let _ = stdin.write_all(SESSION_CLOSE).await;
            }
            self.ended = Some("closed".to_owned());
        }
        self.stop().await;
    }

    /// Waits a moment for the engine to exit (its runner ended the session), kills it if it does
    /// not, and removes the sandbox; the engine's exit code.
    async fn stop(&mut self) -> Option<i32> {
        drop(self.stdin.take());
        let status = match tokio::time::timeout(CLOSE_WITHIN, self.child.wait()).await {
            Ok(Ok(status)) => {
                if let Some(cleanup) = self.cleanup.as_mut() {
                    cleanup.reaped = true;
                }
                Some(exit_code_of(status))
            }
            _ => None,
        };
        if let Some(cleanup) = self.cleanup.take() {
            // Blocking (`runsc delete`, waiting for the cgroup to empty): off the runtime.
            let _ = tokio::task::spawn_blocking(move || drop(cleanup)).await;
        }
        status
    }

    fn oom_killed(&self) -> Option<bool> {
        let group = self.cleanup.as_ref()?.cgroup.as_ref()?;
        Some(group.oom_killed())
    }
}

impl Drop for LocalSession {
    fn drop(&mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            // The cleanup kills and removes synchronously; off the runtime when there is one.
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || drop(cleanup))),
                Err(_) => drop(cleanup),
            }
        }
    }
}

/// The longest line a session's runner prints: an envelope (both streams escaped, the files in
/// base64).
fn envelope_max(limits: &Limits) -> usize {
    12 * limits.output_bytes as usize
        + 4096
        + usize::try_from(ENVELOPE_FILES_MAX_BYTES).unwrap_or(usize::MAX / 4)
}

/// Reads the runner's stdout until the envelope of `call`, handing output lines to `output`;
/// `None` when the stdout ends first (the engine exited).
async fn read_call(
    stdout: &mut ChildStdout,
    lines: &mut LineSplitter,
    call: &str,
    output: Option<&OutputFn>,
) -> Option<RunnerResult> {
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match stdout.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => n,
        };
        let mut found = None;
        lines.push(&chunk[..n], |line| {
            let text = String::from_utf8_lossy(line);
            if line.starts_with(b"{\"sandboxrun\"") {
                if let Ok(result) = parse_call_envelope(&text, call) {
                    found = Some(result);
                }
            } else if let Some(output) = output
                && found.is_none()
                && let Some(chunk) = parse_output_line(&text)
            {
                output(chunk);
            }
        });
        if found.is_some() {
            return found;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::SessionEnd;

    #[test]
    fn the_runners_reasons_read_as_messages() {
        assert_eq!(
            session_ended_message(Some(SessionEnd::TimedOut), None),
            "the session ended (timedOut)"
        );
        assert_eq!(
            session_ended_message(Some(SessionEnd::TimedOut), Some("it ran too long")),
            "it ran too long"
        );
    }
}

//! The result of a run as the agent sees it, and how it is read from a SandboxRun status.
//! Both backends produce a [`RunOutput`]; the tool turns it into `structuredContent` and, for
//! anything but success, into text a model can act on.

use sandboxrun_api::SandboxRunStatus;
use sandboxrun_core::Phase;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How much of stderr the error text quotes: enough for a traceback's last frames, short
/// enough not to drown the message (the full stderr is in `structuredContent`).
const STDERR_TAIL_CHARS: usize = 2_000;

/// The result of one `run_python` call (the tool's `outputSchema`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::portable)]
pub struct RunOutput {
    /// Standard output of the code (capped; see `truncated`).
    pub stdout: String,
    /// Standard error of the code (capped; see `truncated`).
    pub stderr: String,
    /// Exit status of the code: 128 + signal number when a signal killed it; absent when the
    /// code never ran (rejected) or no status was recorded.
    // Optional rather than nullable, for schema dialects with one `type` per property.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "i32")]
    pub exit_code: Option<i32>,
    /// Whether stdout or stderr was cut at the output cap.
    pub truncated: bool,
    /// Execution time in milliseconds.
    pub duration_ms: u64,
    /// The run's name: the SandboxRun's name (kube) or a generated id (local).
    pub run_name: String,
    /// Terminal phase: Succeeded, Failed, TimedOut or Rejected.
    pub phase: Phase,
    /// Machine-readable reason of the phase (for example `OOMKilled`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub reason: Option<String>,
    /// Human-readable explanation from the backend; used in the error text only.
    #[serde(skip)]
    #[schemars(skip)]
    pub message: Option<String>,
}

impl RunOutput {
    /// Whether the agent should see this result as a tool error (`isError: true`).
    pub fn is_error(&self) -> bool {
        self.phase != Phase::Succeeded
    }

    /// Text a model can act on for a result that is not a success; `None` for a success.
    /// `timeout_seconds` is the run's budget and `max_timeout_seconds` the policy maximum, so a
    /// timeout message can say what to change.
    pub fn error_text(&self, timeout_seconds: u32, max_timeout_seconds: u32) -> Option<String> {
        let detail = |fallback: &str| {
            self.message
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| fallback.to_owned())
        };
        let text = match self.phase {
            Phase::Succeeded => return None,
            Phase::TimedOut => format!(
                "the code did not finish within its {timeout_seconds}s timeout and was stopped; \
                 make it faster, print partial results early, or pass a larger timeoutSeconds \
                 (at most {max_timeout_seconds}){}",
                self.stdout_hint()
            ),
            Phase::Rejected => format!(
                "the run was rejected ({}) and nothing was executed: {}",
                self.reason.as_deref().unwrap_or("Rejected"),
                detail("no reason was given")
            ),
            Phase::Failed if self.reason.as_deref() == Some("OOMKilled") => format!(
                "{}; use less memory (process data in chunks, avoid building huge lists){}",
                detail("the code was killed for exceeding its memory limit"),
                self.stderr_hint()
            ),
            Phase::Failed => match (self.exit_code, self.message.as_deref()) {
                // The operator and the local driver word signal deaths themselves.
                (Some(_), Some(m)) if m.contains("killed by signal") => {
                    format!("{m}{}", self.stderr_hint())
                }
                (Some(code), _) => {
                    format!("the code exited with status {code}{}", self.stderr_hint())
                }
                (None, _) => format!(
                    "the run failed ({}): {}",
                    self.reason.as_deref().unwrap_or("Failed"),
                    detail("no result was recorded")
                ),
            },
            // Non-terminal phases never reach the agent; say so rather than panic.
            other => format!("the run ended in the unexpected phase {other}"),
        };
        Some(text)
    }

    fn stderr_hint(&self) -> String {
        let stderr = self.stderr.trim_end();
        if stderr.is_empty() {
            return " and printed nothing to stderr".to_owned();
        }
        let chars = stderr.chars().count();
        let tail: String = if chars > STDERR_TAIL_CHARS {
            let skip = chars - STDERR_TAIL_CHARS;
            format!("...{}", stderr.chars().skip(skip).collect::<String>())
        } else {
            stderr.to_owned()
        };
        format!("; stderr: {tail}")
    }

    fn stdout_hint(&self) -> String {
        if self.stdout.is_empty() {
            String::new()
        } else {
            "; the output printed before the stop is in stdout".to_owned()
        }
    }
}

/// Reads the result of a finished SandboxRun. `None` while the run is not terminal.
pub fn from_status(name: &str, status: &SandboxRunStatus) -> Option<RunOutput> {
    let phase = status.phase?;
    if !phase.is_terminal() {
        return None;
    }
    Some(RunOutput {
        stdout: status.stdout.clone().unwrap_or_default(),
        stderr: status.stderr.clone().unwrap_or_default(),
        exit_code: status.exit_code,
        truncated: status.truncated.unwrap_or(false),
        duration_ms: status
            .duration_millis
            .map(|d| u64::try_from(d).unwrap_or(0))
            .unwrap_or(0),
        run_name: name.to_owned(),
        phase,
        reason: status.reason.clone(),
        message: status.message.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(phase: Phase) -> SandboxRunStatus {
        SandboxRunStatus {
            phase: Some(phase),
            ..Default::default()
        }
    }

    #[test]
    fn non_terminal_status_has_no_output() {
        assert!(from_status("run-x", &SandboxRunStatus::default()).is_none());
        assert!(from_status("run-x", &status(Phase::Pending)).is_none());
        assert!(from_status("run-x", &status(Phase::Running)).is_none());
        assert!(from_status("run-x", &status(Phase::AwaitingApproval)).is_none());
    }

    #[test]
    fn success_maps_every_field() {
        let st = SandboxRunStatus {
            exit_code: Some(0),
            stdout: Some("42\n".into()),
            stderr: Some(String::new()),
            truncated: Some(false),
            duration_millis: Some(812),
            ..status(Phase::Succeeded)
        };
        let out = from_status("run-abc", &st).unwrap();
        assert_eq!(out.stdout, "42\n");
        assert_eq!(out.exit_code, Some(0));
        assert_eq!(out.duration_ms, 812);
        assert_eq!(out.run_name, "run-abc");
        assert!(!out.is_error());
        assert_eq!(out.error_text(30, 600), None);
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"stdout": "42\n", "stderr": "", "exitCode": 0, "truncated": false,
                "durationMs": 812, "runName": "run-abc", "phase": "Succeeded"})
        );
    }

    #[test]
    fn missing_fields_default_safely() {
        let st = SandboxRunStatus {
            duration_millis: Some(-5),
            ..status(Phase::Failed)
        };
        let out = from_status("r", &st).unwrap();
        assert_eq!(
            (out.stdout.as_str(), out.exit_code, out.duration_ms),
            ("", None, 0)
        );
        assert!(
            out.error_text(30, 600)
                .unwrap()
                .contains("no result was recorded")
        );
    }

    #[test]
    fn non_zero_exit_quotes_stderr() {
        let st = SandboxRunStatus {
            exit_code: Some(3),
            stderr: Some("Traceback...\nValueError: bad\n".into()),
            ..status(Phase::Failed)
        };
        let text = from_status("r", &st).unwrap().error_text(30, 600).unwrap();
        assert_eq!(
            text,
            "the code exited with status 3; stderr: Traceback...\nValueError: bad"
        );
    }

    #[test]
    fn long_stderr_is_quoted_by_its_tail() {
        let st = SandboxRunStatus {
            exit_code: Some(1),
            stderr: Some(format!("{}END", "x".repeat(10_000))),
            ..status(Phase::Failed)
        };
        let text = from_status("r", &st).unwrap().error_text(30, 600).unwrap();
        assert!(text.ends_with("END"));
        assert!(text.len() < STDERR_TAIL_CHARS + 100);
    }

    #[test]
    fn timeout_rejection_and_oom_explain_what_to_do() {
        let t = from_status("r", &status(Phase::TimedOut)).unwrap();
        assert!(t.is_error());
        let text = t.error_text(5, 600).unwrap();
        assert!(
            text.contains("5s timeout") && text.contains("at most 600"),
            "{text}"
        );

        let st = SandboxRunStatus {
            reason: Some("PolicyBlocked".into()),
            message: Some("imports of socket are not allowed".into()),
            ..status(Phase::Rejected)
        };
        let text = from_status("r", &st).unwrap().error_text(5, 600).unwrap();
        assert!(
            text.contains("PolicyBlocked") && text.contains("socket"),
            "{text}"
        );

        let st = SandboxRunStatus {
            reason: Some("OOMKilled".into()),
            exit_code: Some(137),
            ..status(Phase::Failed)
        };
        let text = from_status("r", &st).unwrap().error_text(5, 600).unwrap();
        assert!(text.contains("memory limit"), "{text}");
    }

    #[test]
    fn reason_is_serialized_only_when_present() {
        let st = SandboxRunStatus {
            reason: Some("DeadlineExceeded".into()),
            ..status(Phase::TimedOut)
        };
        let json = serde_json::to_value(from_status("r", &st).unwrap()).unwrap();
        assert_eq!(json["reason"], "DeadlineExceeded");
        assert!(json.get("exitCode").is_none());
        let json =
            serde_json::to_value(from_status("r", &status(Phase::Succeeded)).unwrap()).unwrap();
        assert!(json.get("reason").is_none());
    }
}

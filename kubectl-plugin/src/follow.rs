//! `logs`: a run's output from its status (the operator writes stdout, stderr and the exit code
//! there when the run ends), and following a run until it ends, its phase changes on stderr.

use std::time::Duration;

use anyhow::{Result, bail};
use futures::StreamExt;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use sandboxrun_api::{SandboxRun, SandboxRunStatus};
use sandboxrun_core::Phase;

use crate::cluster::{self, Doing, explain};
use crate::term::{self, note};

/// Exit status of a run that has no exit code of its own (rejected, cancelled, no result).
pub const NO_EXIT_CODE: u8 = 1;

/// After this long without a phase, say where to look: the operator may not be running.
const NO_PHASE_HINT_AFTER: Duration = Duration::from_secs(30);

/// `logs RUN [-f]`: prints the output of the run and returns its exit status.
/// `raw`: the run's output byte for byte, else with its control characters escaped
/// ([`crate::term`]).
pub async fn logs(
    client: &Client,
    namespace: &str,
    name: &str,
    follow: bool,
    raw: bool,
) -> Result<u8> {
    let api = cluster::runs(client, namespace);
    let run = if follow {
        wait(&api, namespace, name).await?
    } else {
        let run = api
            .get(name)
            .await
            .map_err(|e| explain(e, &Doing::runs("get", namespace, Some(name))))?;
        let status = run.status.clone().unwrap_or_default();
        if !status.phase.is_some_and(Phase::is_terminal) {
            let phase = status.phase.map_or("not judged yet", Phase::as_str);
            bail!(
                "SandboxRun {name} is {phase}: its output is recorded when it ends; wait for it \
                 with: kubectl sandboxrun logs {name} -n {namespace} -f"
            );
        }
        // How it ended, unless it simply succeeded (following printed it already).
        if status.phase != Some(Phase::Succeeded)
            && let Some(line) = phase_line(&run)
        {
            note!("{line}");
        }
        run
    };
    print_output(&run, raw)?;
    Ok(exit_status(run.status.as_ref()))
}

/// Follows the run until its phase is terminal and returns it; each phase it passes is printed
/// on stderr.
pub async fn wait(api: &Api<SandboxRun>, namespace: &str, name: &str) -> Result<SandboxRun> {
    let mut stream = watcher::watch_object(api.clone(), name).boxed();
    let mut shown: Option<Option<Phase>> = None;
    let hint = tokio::time::sleep(NO_PHASE_HINT_AFTER);
    tokio::pin!(hint);
    let mut hinted = false;
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            () = &mut hint, if !hinted => {
                hinted = true;
                if shown.as_ref().is_none_or(Option::is_none) {
                    note!(
                        "{name}: no phase after {}s: is the sandboxrun operator running and \
                         watching namespace {namespace}?",
                        NO_PHASE_HINT_AFTER.as_secs()
                    );
                }
                continue;
            }
        };
        let run = match event {
            Some(Ok(Some(run))) => run,
            Some(Ok(None)) if shown.is_none() => {
                // Never seen: ask once more, for the error a person reads (404, 403).
                api.get(name)
                    .await
                    .map_err(|e| explain(e, &Doing::runs("get", namespace, Some(name))))?
            }
            Some(Ok(None)) => bail!("SandboxRun {name} was deleted before it finished"),
            // Following takes list and watch (a watch of the one name), not only get.
            Some(Err(watcher::Error::InitialListFailed(e))) => {
                return Err(explain(e, &Doing::runs("list", namespace, Some(name))));
            }
            Some(Err(watcher::Error::WatchStartFailed(e))) => {
                return Err(explain(e, &Doing::runs("watch", namespace, Some(name))));
            }
            // A watch that broke: the watcher starts it again on the next poll.
            Some(Err(_)) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            None => bail!("the watch of SandboxRun {name} ended before it finished"),
        };
        let status = run.status.clone().unwrap_or_default();
        if shown != Some(status.phase) {
            if let Some(line) = phase_line(&run) {
                note!("{line}");
            }
            shown = Some(status.phase);
        }
        if status.phase.is_some_and(Phase::is_terminal) {
            return Ok(run);
        }
    }
}

/// The line printed when the run enters its current phase (`None`: not judged yet).
pub fn phase_line(run: &SandboxRun) -> Option<String> {
    let name = run.name_any();
    let status = run.status.clone().unwrap_or_default();
    let phase = status.phase?;
    Some(match phase {
        Phase::AwaitingApproval => {
            let (rule, why) = status
                .decision
                .as_ref()
                .map_or(("?", ""), |d| (d.rule.as_str(), d.reason.as_str()));
            format!(
                "{name}: AwaitingApproval: policy rule {rule} escalated it ({why}); a person \
                 decides: kubectl sandboxrun approve {name} -n {ns} (or deny {name} --reason ...)",
                ns = run.namespace().unwrap_or_default()
            )
        }
        p if p.is_terminal() => {
            let reason = status.reason.as_deref().unwrap_or(p.as_str());
            match status.message.as_deref().filter(|m| !m.is_empty()) {
                Some(message) => format!("{name}: {p} ({reason}): {message}"),
                None => format!("{name}: {p} ({reason})"),
            }
        }
        p => format!("{name}: {p}"),
    })
}

/// Writes the run's stdout to stdout and its stderr to stderr (a query's result as JSON on
/// stdout), control characters escaped unless `raw` ([`crate::term`]), and says on stderr when
/// output was cut.
pub fn print_output(run: &SandboxRun, raw: bool) -> Result<()> {
    let (stdout, stderr) = output_bodies(run)?;
    term::stdout_body(&stdout, raw)?;
    term::stderr_body(&stderr, raw)?;
    let status = run.status.as_ref();
    if status.and_then(|s| s.truncated) == Some(true) {
        note!(
            "{}: output was cut at limits.outputBytes ({} bytes per stream)",
            run.name_any(),
            run.spec.limits.output_bytes
        );
    }
    Ok(())
}

/// What goes to stdout (the code's stdout, then a query's result as indented JSON) and to
/// stderr, as the run recorded them.
fn output_bodies(run: &SandboxRun) -> Result<(String, String)> {
    let status = run.status.clone().unwrap_or_default();
    let mut stdout = status.stdout.unwrap_or_default();
    if let Some(result) = &status.result {
        // JSON escapes control characters in strings, not bidirectional ones: still escaped.
        stdout.push_str(&serde_json::to_string_pretty(result)?);
        stdout.push('\n');
    }
    Ok((stdout, status.stderr.unwrap_or_default()))
}

/// The exit status for a finished run: the code's own exit code (0 to 255), else 0 for a
/// success and [`NO_EXIT_CODE`] for any other end.
pub fn exit_status(status: Option<&SandboxRunStatus>) -> u8 {
    let Some(status) = status else {
        return NO_EXIT_CODE;
    };
    match status.exit_code {
        Some(code) => u8::try_from(code).unwrap_or(NO_EXIT_CODE),
        None if status.phase == Some(Phase::Succeeded) => 0,
        None => NO_EXIT_CODE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn run(status: Value) -> SandboxRun {
        serde_json::from_value(json!({
            "apiVersion": "sandboxrun.dev/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": "run-1", "namespace": "runs"},
            "spec": {"agent": "a", "python": {"code": "print(1)"}},
            "status": status,
        }))
        .unwrap()
    }

    fn status(v: Value) -> SandboxRunStatus {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_exit_status_is_the_codes_own() {
        let exit = |v: Value| exit_status(Some(&status(v)));
        assert_eq!(exit(json!({"phase": "Succeeded", "exitCode": 0})), 0);
        assert_eq!(exit(json!({"phase": "Failed", "exitCode": 3})), 3);
        assert_eq!(exit(json!({"phase": "Failed", "exitCode": 137})), 137);
        // Out of the range of a process's status: an error all the same.
        assert_eq!(exit(json!({"phase": "Failed", "exitCode": 300})), 1);
        assert_eq!(exit(json!({"phase": "Failed", "exitCode": -1})), 1);
        // No code of its own: a query that succeeded, a rejection, a cancellation.
        assert_eq!(exit(json!({"phase": "Succeeded"})), 0);
        assert_eq!(
            exit(json!({"phase": "Rejected", "reason": "ApprovalDenied"})),
            1
        );
        assert_eq!(exit(json!({"phase": "Cancelled"})), 1);
        assert_eq!(exit_status(None), 1);
    }

    #[test]
    fn a_runs_output_and_messages_cannot_drive_the_terminal() {
        let r = run(json!({
            "phase": "Failed", "reason": "Error\u{1b}[2K",
            "message": "boom\r\u{1b}]0;all good\u{7}run-1: Succeeded",
            "stdout": "title\u{1b}]0;pwned\u{7}\nclip\u{1b}]52;c;cm0gLXJmIH4=\u{7}\ncol\tumn\n",
            "stderr": "Traceback: failed\r\u{1b}[1A\u{1b}[2KAll tests passed\n",
            "result": {"rows": [["\u{202e}fdp.exe", "\u{9b}2J"]]},
        }));
        let (out, err) = output_bodies(&r).unwrap();
        let shown = |text: &str| {
            let mut buf = Vec::new();
            term::write_output(&mut buf, text, false).unwrap();
            String::from_utf8(buf).unwrap()
        };
        let (out, err) = (shown(&out), shown(&err));
        for text in [&out, &err] {
            assert!(
                text.chars()
                    .all(|c| !term::is_unsafe(c) || c == '\n' || c == '\t'),
                "{text:?}"
            );
        }
        assert!(
            out.contains("title\\x1b]0;pwned\\x07\nclip\\x1b]52;"),
            "{out}"
        );
        assert!(out.contains("col\tumn\n"), "tabs and newlines stay: {out}");
        assert!(
            out.contains("\\u{202e}fdp.exe") && out.contains("\\u{9b}2J"),
            "{out}"
        );
        assert!(err.contains("failed\\r\\x1b[1A"), "{err}");
        // The status line is one line: its newlines and returns are shown, not obeyed.
        let line = term::escape(&phase_line(&r).unwrap(), false);
        assert_eq!(
            line,
            "run-1: Failed (Error\\x1b[2K): boom\\r\\x1b]0;all good\\x07run-1: Succeeded"
        );
        // --raw: exactly what the run wrote.
        let (raw_out, _) = output_bodies(&r).unwrap();
        let mut buf = Vec::new();
        term::write_output(&mut buf, &raw_out, true).unwrap();
        assert!(String::from_utf8(buf).unwrap().contains("\u{1b}]52;c;"));
    }

    #[test]
    fn phase_lines() {
        assert_eq!(phase_line(&run(json!({}))), None);
        assert_eq!(
            phase_line(&run(json!({"phase": "Running"}))).unwrap(),
            "run-1: Running"
        );
        assert_eq!(
            phase_line(&run(json!({
                "phase": "Rejected", "reason": "ApprovalDenied",
                "message": "bob denied it: no ticket"
            })))
            .unwrap(),
            "run-1: Rejected (ApprovalDenied): bob denied it: no ticket"
        );
        assert_eq!(
            phase_line(&run(json!({"phase": "Succeeded", "reason": "Succeeded"}))).unwrap(),
            "run-1: Succeeded (Succeeded)"
        );
        let awaiting = phase_line(&run(json!({
            "phase": "AwaitingApproval",
            "decision": {"verdict": "Escalate", "rule": "prod", "reason": "needs a person"}
        })))
        .unwrap();
        assert_eq!(
            awaiting,
            "run-1: AwaitingApproval: policy rule prod escalated it (needs a person); a person \
             decides: kubectl sandboxrun approve run-1 -n runs (or deny run-1 --reason ...)"
        );
    }
}

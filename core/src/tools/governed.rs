//! What a model reads when a governed call (`execute_sql`, `fetch_metrics`) did not succeed. One
//! place, so that both tools explain a block, an escalation, a denial or a failure in the same
//! words and with the same advice.

use crate::model::{Phase, Verdict};

/// The parts of a governed call's output that decide what the model is told.
pub struct Summary<'a> {
    /// What was asked for, in words: "query", "metrics query".
    pub subject: &'a str,
    /// Where the answer of an approved run ends up: "its rows", "its result".
    pub delivers: &'a str,
    /// The run's phase.
    pub phase: Phase,
    /// What policy decided.
    pub verdict: Verdict,
    /// The run's name (a person approves it by this name).
    pub run_name: &'a str,
    /// The rule that decided.
    pub rule: &'a str,
    /// Why it decided so.
    pub reason: &'a str,
    /// The run's own message (the operator's or the executor's), if it has one.
    pub message: Option<&'a str>,
}

impl Summary<'_> {
    /// Text a model can act on, or None for a success.
    pub fn error_text(&self) -> Option<String> {
        let Summary {
            subject,
            delivers,
            run_name,
            rule,
            reason,
            ..
        } = self;
        let text = match (self.phase, self.verdict) {
            (Phase::Succeeded, _) => return None,
            (Phase::AwaitingApproval, _) => format!(
                "awaiting approval: {run_name} (rule {rule}: {reason}); nothing runs until a \
                 person with rights approves the SandboxRun{}; {delivers} are then written to its \
                 status.result",
                self.message.map(|m| format!(" ({m})")).unwrap_or_default()
            ),
            (_, Verdict::Block) => format!(
                "the {subject} was blocked by policy (verdict Block, rule {rule}) and nothing was \
                 executed: {reason}"
            ),
            // Cluster mode: a person denied the run, nobody approved it in time, or it ran after
            // the approval and failed; the operator's message says which.
            (phase, Verdict::Escalate) if self.message.is_some() => format!(
                "policy rule {rule} escalated this {subject} for a human approval ({reason}) and \
                 it ended {phase}: {}",
                self.message.unwrap_or_default()
            ),
            (_, Verdict::Escalate) => format!(
                "policy rule {rule} escalated this {subject} for a human approval ({reason}); \
                 awaiting approval is only available in cluster mode (--backend kube), so nothing \
                 was executed: use the sandbox environment or ask an operator for a rule that \
                 allows this call"
            ),
            (phase, Verdict::Allow) => format!(
                "the {subject} was allowed by rule {rule} but ended {phase}: {}",
                self.message.unwrap_or("no reason was given")
            ),
        };
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(phase: Phase, verdict: Verdict, message: Option<&str>) -> Summary<'_> {
        Summary {
            subject: "query",
            delivers: "its rows",
            phase,
            verdict,
            run_name: "run-1",
            rule: "prod",
            reason: "production needs a person",
            message,
        }
    }

    #[test]
    fn a_denied_escalation_says_how_it_ended_not_that_cluster_mode_is_needed() {
        let text = summary(Phase::Rejected, Verdict::Escalate, Some("denied by alice"))
            .error_text()
            .unwrap();
        assert!(text.contains("ended Rejected: denied by alice"), "{text}");
        assert!(!text.contains("cluster mode"), "{text}");
    }

    #[test]
    fn each_outcome_has_its_own_advice() {
        assert!(
            summary(Phase::Succeeded, Verdict::Allow, None)
                .error_text()
                .is_none()
        );
        let waiting = summary(Phase::AwaitingApproval, Verdict::Escalate, None)
            .error_text()
            .unwrap();
        assert!(waiting.starts_with("awaiting approval: run-1"), "{waiting}");
        let blocked = summary(Phase::Rejected, Verdict::Block, None)
            .error_text()
            .unwrap();
        assert!(blocked.contains("blocked by policy (verdict Block, rule prod)"));
        let embedded = summary(Phase::Rejected, Verdict::Escalate, None)
            .error_text()
            .unwrap();
        assert!(
            embedded.contains("only available in cluster mode"),
            "{embedded}"
        );
        let failed = summary(Phase::Failed, Verdict::Allow, Some("statement timeout"))
            .error_text()
            .unwrap();
        assert!(
            failed.ends_with("ended Failed: statement timeout"),
            "{failed}"
        );
    }
}

//! TTL of finished runs, pure: when a run may be deleted, and how long until then.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

/// Longest retention of a run that policy blocked or that was invalid (no tool, no query): it
/// ran nothing, its audit line has the record, and a key that floods refusals must not fill etcd
/// for an hour.
pub const REFUSED_TTL_SECONDS: u32 = 300;

/// The retention of a finished run: its own `ttlSecondsAfterFinished`, at most
/// [`REFUSED_TTL_SECONDS`] when it was refused before anything ran (blocked by policy, or
/// rejected without a decision: invalid). Denied or timed-out approvals keep their own TTL: a
/// person's decision stays visible.
pub fn retention(
    ttl_seconds: u32,
    phase: Option<sandboxrun_core::Phase>,
    verdict: Option<sandboxrun_core::Verdict>,
) -> u32 {
    use sandboxrun_core::{Phase, Verdict};
    let refused = matches!(
        (phase, verdict),
        (_, Some(Verdict::Block)) | (Some(Phase::Rejected), None)
    );
    if refused {
        ttl_seconds.min(REFUSED_TTL_SECONDS)
    } else {
        ttl_seconds
    }
}

/// When a run that completed at `completion` may be deleted.
pub fn expiry(completion: Timestamp, ttl_seconds: u32) -> Timestamp {
    completion
        .checked_add(SignedDuration::from_secs(i64::from(ttl_seconds)))
        .unwrap_or(Timestamp::MAX)
}

/// Time left before deletion, or `None` when the run is due now.
pub fn time_left(completion: Timestamp, ttl_seconds: u32, now: Timestamp) -> Option<Duration> {
    let left = expiry(completion, ttl_seconds).duration_since(now);
    if left.is_positive() {
        // Round up to whole milliseconds so a requeue never fires just before the expiry.
        Some(Duration::from_millis(
            left.as_millis().clamp(1, u64::MAX as i128) as u64,
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn refused_runs_are_kept_briefly_and_decided_ones_for_their_ttl() {
        use sandboxrun_core::{Phase, Verdict};
        let r = |phase, verdict| retention(3600, Some(phase), verdict);
        assert_eq!(r(Phase::Rejected, Some(Verdict::Block)), 300);
        assert_eq!(r(Phase::Rejected, None), 300);
        assert_eq!(r(Phase::Rejected, Some(Verdict::Escalate)), 3600);
        assert_eq!(r(Phase::Succeeded, Some(Verdict::Allow)), 3600);
        assert_eq!(
            retention(60, Some(Phase::Rejected), Some(Verdict::Block)),
            60
        );
    }

    #[test]
    fn expires_ttl_after_completion() {
        assert_eq!(
            expiry(t("2026-11-29T08:00:00Z"), 30),
            t("2026-11-29T08:00:30Z")
        );
        assert_eq!(
            expiry(t("2026-11-29T08:00:00Z"), 0),
            t("2026-11-29T08:00:00Z")
        );
    }

    #[test]
    fn time_left_counts_down_to_none() {
        let done = t("2026-11-29T08:00:00Z");
        assert_eq!(time_left(done, 3600, done), Some(Duration::from_secs(3600)));
        assert_eq!(
            time_left(done, 30, t("2026-11-29T08:00:29.5Z")),
            Some(Duration::from_millis(500))
        );
        assert_eq!(time_left(done, 30, t("2026-11-29T08:00:30Z")), None);
        assert_eq!(time_left(done, 30, t("2026-11-29T09:00:00Z")), None);
        assert_eq!(time_left(done, 0, done), None);
    }
}

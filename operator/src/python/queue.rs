//! A python run's turn for a sandbox: the I/O around [`crate::admission`]. A run asks before it
//! claims a warm sandbox or creates a Pod; while others wait ahead of it, it waits in the queue
//! with its place in its status (`Pending`, reason `Queued`, `status.queuePosition`), and a run
//! the queue judges cannot get one within its allowance (on arrival, or as a last resort) ends
//! `Rejected` with reason `NoCapacity` and `status.retryAfterSeconds`: nothing ran, and the
//! caller knows when to try again.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use sandboxrun_api::{SandboxRun, SandboxRunStatus};
use sandboxrun_core::{Phase, Reason, Tool};
use tracing::info;

use crate::admission::{Ask, HEAD_RETRY, Place, REFRESH, Refusal, Room};
use crate::controller::{Error, Reconcile};
use crate::outcome::Outcome;
use crate::python::pod;

/// What a run that needs a sandbox does next.
pub enum Turn {
    /// Ask for one now, with this status to build on (its queue place dropped).
    Go(Box<SandboxRunStatus>),
    /// Not now: the reconcile ends with this.
    Done(Action),
}

/// Whether `status` says its run waits in the queue and has never asked for a Pod: such a run
/// has no Pod to read.
pub fn waiting_without_pod(status: &SandboxRunStatus) -> bool {
    status.reason.as_deref() == Some(Reason::Queued.as_str())
        && status.path.is_none()
        && status.pod_name.is_none()
}

impl Reconcile<'_> {
    pub(crate) fn run_ref(&self) -> ObjectRef<SandboxRun> {
        ObjectRef::new(&self.name).within(&self.ns)
    }

    /// May this run ask for a sandbox now? Waits in the queue, or ends refused, otherwise.
    /// `quota`: the room for it as last seen, if known ([`crate::quota_room`], and the pools'
    /// ready sandboxes).
    pub async fn turn(&self, prev: SandboxRunStatus, quota: Option<Room>) -> Result<Turn, Error> {
        let ask = self.ctx.admission.ask(
            &self.run_ref(),
            &self.uid(),
            &self.run.spec.agent,
            prev.queued_at.as_ref().map(|t| t.0),
            self.longest_hold(),
            quota,
            // The clock now, not when the reconcile began: its reads before may have taken
            // seconds under load, and the queue tells a run whose reconcile is late by it.
            Timestamp::now(),
        );
        match ask {
            Ask::Go | Ask::Head => Ok(Turn::Go(Box::new(SandboxRunStatus {
                queue_position: None,
                ..prev
            }))),
            Ask::Wait(place) => self.wait(&prev, &place).await.map(Turn::Done),
            Ask::Refuse(refusal) => self.refuse(&prev, &refusal).await.map(Turn::Done),
        }
    }

    /// The quota had no room for the run's Pod: it waits in the queue (ahead of runs that come
    /// later, behind those already there), or is refused when it could not get a sandbox in time.
    pub async fn no_room(&self, prev: &SandboxRunStatus, message: &str) -> Result<Action, Error> {
        info!(run = %self.name, reason = %message, "no room in the namespace's quota; the run joins the queue");
        let ask = self.ctx.admission.no_room(
            &self.run_ref(),
            &self.uid(),
            &self.run.spec.agent,
            prev.queued_at.as_ref().map(|t| t.0),
            self.longest_hold(),
            Timestamp::now(),
        );
        match ask {
            Ask::Wait(place) => self.wait(prev, &place).await,
            Ask::Refuse(refusal) => self.refuse(prev, &refusal).await,
            // Not answered after a refusal for quota: the run asks again when its turn comes.
            Ask::Go | Ask::Head => Ok(Action::requeue(HEAD_RETRY)),
        }
    }

    /// The most this run can hold a sandbox: its timeout and its Pod's start-up grace.
    fn longest_hold(&self) -> Duration {
        pod::longest_hold(&self.run.spec.limits.effective())
    }

    /// Records the run's place (when it changed enough to be worth a write) and looks again
    /// soon: at once when it heads the queue, at [`REFRESH`] otherwise (or when woken).
    async fn wait(&self, prev: &SandboxRunStatus, place: &Place) -> Result<Action, Error> {
        let status = queued_status(prev, place, self.generation);
        if worth_writing(prev, &status) {
            self.apply(&status).await?;
            if prev.queued_at.is_none() {
                self.ctx.metrics.queued.inc();
            }
        }
        Ok(Action::requeue(if place.position == 1 {
            HEAD_RETRY
        } else {
            REFRESH
        }))
    }

    /// Ends the run `Rejected`, reason `NoCapacity`, with its retry hint.
    async fn refuse(&self, prev: &SandboxRunStatus, refusal: &Refusal) -> Result<Action, Error> {
        let allowance = self.ctx.admission.allowance();
        info!(run = %self.name, position = refusal.position, retry_after = refusal.retry_after_seconds,
            "no sandbox can start the run within its allowance; refused");
        let outcome = Outcome::of(
            Phase::Rejected,
            Reason::NoCapacity,
            refusal.message(allowance),
            None,
            self.now,
        );
        let mut status = self.terminal(prev, Some(Tool::Python), &outcome, None);
        status.retry_after_seconds = Some(refusal.retry_after_seconds);
        // Over the run as this reconcile last read or wrote it, or decided it on (a run refused
        // on arrival: its cached copy): not read once more on the refusal's path, which has to
        // be quick under load; a run changed since is looked at again.
        let action = self
            .finish_over(status, &outcome, None, self.known_version())
            .await?;
        self.ctx.metrics.capacity_refusals.inc();
        Ok(action)
    }
}

/// The status of a run waiting at `place`.
fn queued_status(
    prev: &SandboxRunStatus,
    place: &Place,
    generation: Option<i64>,
) -> SandboxRunStatus {
    let expected = match place.expected {
        Some(d) if d.as_secs() < 24 * 3600 => {
            format!(", about {} s at the recent pace", d.as_secs())
        }
        _ => String::new(),
    };
    SandboxRunStatus {
        phase: Some(Phase::Pending),
        tool: Some(Tool::Python),
        reason: Some(Reason::Queued.as_str().to_owned()),
        message: Some(format!(
            "waiting for a sandbox: the namespace's quota or its nodes have no room for \
             another one; number {} in the queue{expected}",
            place.position
        )),
        queued_at: Some(Time(place.since)),
        queue_position: Some(place.position),
        observed_generation: generation,
        ..prev.clone()
    }
}

/// Whether the new place is worth a status write: on joining the queue, and then when it moved
/// half the way or more, or into the first three. A place rewritten on every move would cost one
/// write per waiting run for every run admitted; on every quarter, a run 80 deep still wrote it
/// 13 times (a run of the load suite's bursts wrote its status 16 times in all); halves make it 7.
fn worth_writing(prev: &SandboxRunStatus, next: &SandboxRunStatus) -> bool {
    let (Some(old), Some(new)) = (prev.queue_position, next.queue_position) else {
        return true;
    };
    // As the status keeps it: a Time is written in whole seconds, and the queue's own `since`
    // has the nanoseconds of the run's arrival. Compared as they were, every reconcile of a
    // waiting run rewrote its status (the full load suite: 56,166 status writes for 2,770 runs).
    let second = |status: &SandboxRunStatus| status.queued_at.as_ref().map(|t| t.0.as_second());
    if prev.reason != next.reason || second(prev) != second(next) {
        return true;
    }
    old != new && (new <= 3 || old.abs_diff(new) * 2 >= old)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(position: u32) -> Place {
        Place {
            position,
            since: "2026-12-04T12:00:00Z".parse().unwrap(),
            expected: Some(std::time::Duration::from_secs(12)),
        }
    }

    #[test]
    fn a_queued_status_says_where_the_run_stands() {
        let s = queued_status(&SandboxRunStatus::default(), &place(7), Some(1));
        assert_eq!(s.phase, Some(Phase::Pending));
        assert_eq!(s.reason.as_deref(), Some("Queued"));
        assert_eq!(s.queue_position, Some(7));
        let message = s.message.unwrap();
        assert!(
            message.contains("number 7 in the queue, about 12 s"),
            "{message}"
        );
        assert!(waiting_without_pod(&queued_status(
            &SandboxRunStatus::default(),
            &place(7),
            None
        )));
    }

    #[test]
    fn a_place_read_back_from_the_status_is_not_rewritten() {
        // The status as the API server has it after the write: the time in whole seconds.
        let arrived: Timestamp = "2026-12-04T12:00:00.734Z".parse().unwrap();
        let place = Place {
            position: 7,
            since: arrived,
            expected: None,
        };
        let written = queued_status(&SandboxRunStatus::default(), &place, Some(1));
        let read: SandboxRunStatus =
            serde_json::from_value(serde_json::to_value(&written).unwrap()).unwrap();
        assert_eq!(
            read.queued_at.as_ref().unwrap().0,
            "2026-12-04T12:00:00Z".parse::<Timestamp>().unwrap(),
            "k8s-openapi writes a Time in whole seconds"
        );
        assert!(!worth_writing(
            &read,
            &queued_status(&read, &place, Some(1))
        ));
        // Another second is another time.
        let later = Place {
            since: "2026-12-04T12:00:01.2Z".parse().unwrap(),
            ..place
        };
        assert!(worth_writing(&read, &queued_status(&read, &later, Some(1))));
    }

    #[test]
    fn a_place_is_rewritten_only_when_it_moved_enough() {
        let at = |p| queued_status(&SandboxRunStatus::default(), &place(p), None);
        assert!(
            worth_writing(&SandboxRunStatus::default(), &at(40)),
            "joining"
        );
        assert!(!worth_writing(&at(40), &at(40)));
        assert!(!worth_writing(&at(40), &at(35)), "an eighth");
        assert!(!worth_writing(&at(40), &at(30)), "a quarter");
        assert!(worth_writing(&at(40), &at(20)), "a half");
        assert!(worth_writing(&at(10), &at(15)), "moved back by half");
        assert!(!worth_writing(&at(8), &at(7)));
        assert!(worth_writing(&at(4), &at(3)), "near the front, every move");
        assert!(worth_writing(&at(2), &at(1)));
    }
}

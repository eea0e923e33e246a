//! `python` runs: the sandbox Pod state machine. [`pod`] builds the Pod (pure), [`phase`] says
//! what to do next from the run's status and its Pod (pure; the end of a sandbox is classified by
//! core), [`log`] reads a finished sandbox's log; the stage below does the I/O in between.

pub mod feed;
pub mod log;
pub mod phase;
pub mod pod;
pub mod queue;
pub mod warm;

use jiff::SignedDuration;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use sandboxrun_api::{SandboxPath, SandboxRunStatus};
use sandboxrun_core::runner::Program;
use sandboxrun_core::{Decision, FileCaps, Limits, Phase, Reason, Tool};
use tracing::info;

use crate::pool::FROM_POOL_ANNOTATION;

use self::feed::{FeedState, OwnedProgram};
use self::phase::{Exited, Next, Progress};
use self::queue::Turn;
use crate::admission::{Room, Sandbox};
use crate::controller::{Decided, Error, Reconcile, is_terminal, refused_for_good, until};
use crate::outcome::Outcome;
use crate::quota_room::Needs;

impl Reconcile<'_> {
    /// The execute stage of a python run: one step of the Pod state machine. `decided` is the
    /// decision taken in this reconciliation, if any (its limits build the Pod).
    pub async fn python(
        &self,
        mut prev: SandboxRunStatus,
        decided: Option<Decided>,
    ) -> Result<Action, Error> {
        // An Allow taken now and not yet written: `prev` carries it, and the first status write
        // below records it, before a sandbox is created or sent anything; a warm one is claimed
        // first and recorded with it (`Decided::unrecorded`).
        let unrecorded = decided.as_ref().is_some_and(|d| d.unrecorded);
        let decided = decided.map(|d| d.decision);
        // A call in a session runs in the session's sandbox, never in one of its own (where its
        // state would be silently missing).
        if self.is_session_call() {
            return self.session_call(prev, decided).await;
        }
        // A run waiting in the queue that never asked for a Pod has none to read: its turn is
        // all there is to look at (every few seconds while it waits, for many runs at once).
        // Not when the queue says it got a sandbox: then the cached status lags the operator's
        // own record of it (a Pod's event came first), and the run is read as any other is;
        // taken for waiting, it would join the queue again and stand in it as nobody.
        let mut admitted = false;
        if decided.is_none()
            && queue::waiting_without_pod(&prev)
            && !self.ctx.admission.holds(&self.run_ref(), &self.uid())
        {
            match self.turn(prev, None).await? {
                Turn::Go(next) => (prev, admitted) = (*next, true),
                Turn::Done(action) => return Ok(action),
            }
        }
        // A warm sandbox has its pool's name for it; a cold one is named after the run.
        let pod_name = prev
            .pod_name
            .clone()
            .unwrap_or_else(|| pod::pod_name(&self.name));
        // The reconcile that took the decision has just written the status: it is current.
        let first = decided.is_some() && prev.pod_name.is_none();
        // Not read in the reconcile that decided the run: no Pod of its own can exist before
        // its decision, and a warm sandbox does not need the read (it is made before going
        // cold).
        let pod = if first {
            None
        } else {
            self.read_pod(&pod_name).await?
        };
        // A Pod no node has room for: the cluster is full, whatever the quota says, and runs
        // after this one wait in the queue until it is placed; until a node takes it, it frees
        // no room (admission.rs).
        if let Some(p) = pod.as_ref().filter(|p| pod::belongs_to(p, self.run)) {
            self.ctx.admission.scheduling(
                &self.run_ref(),
                &self.uid(),
                phase::placement(p),
                self.now,
            );
        }
        if let Some(stale) = pod.as_ref().filter(|p| !pod::belongs_to(p, self.run)) {
            // An earlier run's Pod under this run's name: never read it as ours. It is an
            // orphan (its owner is gone), so remove it, and build ours once it is gone.
            info!(run = %self.name, pod = %pod_name, owner = ?stale.metadata.owner_references,
                "a Pod of another run holds this run's name; deleting it");
            self.delete_pod(&pod_name).await?;
            return Ok(Action::requeue(std::time::Duration::from_secs(1)));
        }
        // How the run got its sandbox, if the status does not say yet (its first write was lost).
        if let Some(p) = pod.as_ref().filter(|_| prev.path.is_none()) {
            let pool = p.annotations().get(FROM_POOL_ANNOTATION).cloned();
            prev.path = Some(if pool.is_some() {
                SandboxPath::Warm
            } else {
                SandboxPath::Cold
            });
            prev.pool = pool;
        }
        // The limits the Pod was built with (policy may have lowered the requested ones).
        let limits = pod
            .as_ref()
            .and_then(pod::limits_of)
            .unwrap_or_else(|| self.run.spec.limits.effective());
        if pod.is_none() && !first {
            // The cached run may lag our own last status write (for example the terminal one,
            // just before we deleted the Pod): decide on the run as it is now.
            match self.fresh_status().await? {
                Some(fresh) => prev = fresh,
                None => return Ok(Action::await_change()),
            }
            if is_terminal(&prev) {
                return self.finished(&prev).await;
            }
            if prev.pod_name.as_deref().is_some_and(|p| p != pod_name) {
                // The cache had not seen our record of a warm sandbox yet: what was read above
                // is not the run's Pod. Look again with the record, rather than end the run
                // PodDeleted for a Pod that is there.
                return Ok(Action::requeue(std::time::Duration::from_millis(200)));
            }
        }
        let pod_name = pod_name.as_str();
        // The early feeder read the runner's envelope off the attach stream of this Pod: the
        // run ends on it now, not once the kubelet noticed that the container ended and its log
        // was read (nor as PodDeleted if the Pod is gone since: the code ran to its end).
        if let Some(answer) = self.ctx.feeds.answer(&self.uid())
            && prev.pod_name.as_deref() == Some(pod_name)
        {
            let files = self.file_caps(pod.as_ref(), &prev, decided.as_ref());
            return self
                .end_on_answer(&prev, &answer, &limits, files, pod_name)
                .await;
        }
        match phase::next(&prev, pod.as_ref(), &limits, self.now) {
            Next::CreatePod => {
                // Not for a run recorded cold: it was recorded so only after no claim was made
                // (or a claim in doubt was settled), and claims nothing after. A run waiting in
                // the queue after the quota refused its Pod is reconciled every few seconds:
                // the list would be one more request each time.
                if !first
                    && prev.path != Some(SandboxPath::Cold)
                    && let Some(claimed) = self.earlier_claim().await?
                {
                    // An operator before a restart claimed this sandbox and stopped before it
                    // recorded the claim, so it sent nothing there: take it up, never a second.
                    info!(run = %self.name, pod = %claimed.claimed.pod, "taking up a warm sandbox claimed before a restart");
                    self.ctx.claims_in_doubt.remove(&self.uid());
                    let limits = pod::limits_of(&claimed.object).unwrap_or(limits);
                    let files = self.file_caps(Some(&claimed.object), &prev, decided.as_ref());
                    return self.run_warm(&prev, &claimed.claimed, &limits, files).await;
                }
                // The decision as recorded when policy judged the run (taken in this
                // reconciliation, or read back from the status).
                let decision = match decided {
                    Some(d) => d,
                    None => self.ctx.recorded(self.run, &prev, Tool::Python),
                };
                let (limits, files) = (decision.limits, decision.files);
                // Decided in this reconcile, not recorded: a sandbox claimed on an earlier
                // decision whose record failed (or whose operator stopped) is taken up if it
                // was claimed with this decision's limits and caps, or given up (it got nothing).
                if unrecorded && let Some(claimed) = self.unrecorded_claim().await? {
                    let object = &claimed.object;
                    if pod::limits_of(object).as_ref() == Some(&limits)
                        && pod::file_caps_of(object) == Some(files)
                    {
                        info!(run = %self.name, pod = %claimed.claimed.pod, "taking up a warm sandbox claimed before the run's decision was recorded");
                        self.ctx.claims_in_doubt.remove(&self.uid());
                        self.ctx.admission.admitted(
                            &self.run_ref(),
                            &self.uid(),
                            Sandbox::Claimed,
                            self.now,
                        );
                        return self.run_warm(&prev, &claimed.claimed, &limits, files).await;
                    }
                    info!(run = %self.name, pod = %claimed.claimed.pod, "giving up a warm sandbox claimed on another decision");
                    self.delete_pod(&claimed.claimed.pod).await?;
                }
                let profile = pod::profile_of(self.run);
                if self.ctx.sandbox.image_for(profile).is_none() {
                    let outcome = Outcome::of(
                        Phase::Rejected,
                        Reason::ProfileUnavailable,
                        format!(
                            "this installation has no sandbox image for the {profile} profile \
                             (operator flag --sandbox-image-data, chart value \
                             sandbox.dataImage): run without a profile (the standard library \
                             only), or ask an operator to install it"
                        ),
                        None,
                        self.now,
                    );
                    return self.end(&prev, Some(Tool::Python), &outcome, None).await;
                }
                // What its own Pod would be, and the room there is for the run: the quota's
                // for that Pod, and the sandboxes ready in the pools it may claim from (a run
                // recorded cold claims none).
                let desired = pod::build_with_limits(self.run, &self.ctx.sandbox, &limits, files)?;
                let quota = self
                    .ctx
                    .quota_room
                    .room(&self.ns, &Needs::of(&desired))
                    .map(|room| {
                        let warm = match prev.path {
                            Some(SandboxPath::Cold) => 0,
                            _ => self.warm_sandboxes(profile, &limits),
                        };
                        Room {
                            sandboxes: room.sandboxes.saturating_add(warm),
                            warm,
                            ..room
                        }
                    });
                // Its turn: nobody waits for a sandbox (and the quota has room, as far as the
                // operator has seen), or it heads the queue.
                if !admitted {
                    match self.turn(prev, quota).await? {
                        Turn::Go(next) => prev = *next,
                        // Its place in the queue or its refusal, written with the decision.
                        Turn::Done(action) => return Ok(action),
                    }
                }
                // Cold once recorded cold: a Pod asked for earlier may still appear under the
                // run's name (below), so no warm sandbox is claimed beside it. Otherwise the
                // pools with a sandbox to claim, as the watch has them; a claim of this run's
                // whose answer was lost is settled whatever they say.
                let pools = if prev.path == Some(SandboxPath::Cold) {
                    Vec::new()
                } else {
                    self.warm_pools(profile, &limits)
                };
                let may_claim =
                    !pools.is_empty() || self.ctx.claims_in_doubt.get(&self.uid()).is_some();
                // A decision taken now is recorded with the claim (`run_warm`), or with the
                // cold path below: one write fewer on the call's path. Nothing is sent to a
                // sandbox before that record, and nothing is claimed on a decision taken on a
                // copy of the run someone changed since.
                if may_claim {
                    if unrecorded {
                        self.unchanged_since_decided().await?;
                    }
                    if let Some(claimed) = self.claim_warm(&pools, &limits, files).await? {
                        self.ctx.admission.admitted(
                            &self.run_ref(),
                            &self.uid(),
                            Sandbox::Claimed,
                            self.now,
                        );
                        return self.run_warm(&prev, &claimed, &limits, files).await;
                    }
                }
                // Cold from here, recorded before the Pod is asked for; a decision not written
                // yet is recorded in the same write (no pool had a sandbox: the usual case
                // under load, one write fewer per cold run).
                let prev = self.record_cold(prev).await?;
                self.create_pod(&prev, desired, &limits, files, pod_name, first)
                    .await
            }
            Next::Progress(progress) => {
                // Started: the runner waits for its program. Sent before Running is recorded, so
                // an operator that dies in between sends it again (stdinOnce makes that a no-op
                // if the first one arrived).
                if progress.phase == Phase::Running
                    && prev.phase != Some(Phase::Running)
                    && pod.as_ref().is_some_and(pod::takes_program_on_stdin)
                {
                    if prev.pod_name.as_deref() != Some(pod_name) {
                        // The operator stopped between creating the Pod and recording it. Record
                        // it before anything runs: a recorded Pod that goes missing ends the run
                        // PodDeleted, so the code can never run in a second Pod.
                        let created = Progress {
                            phase: Phase::Pending,
                            reason: Reason::PodCreated.as_str().to_owned(),
                            message: format!("created sandbox Pod {pod_name}"),
                            started_at: None,
                            deadline: progress.deadline,
                        };
                        let recorded = phase::progress_status(
                            &prev,
                            &created,
                            pod_name,
                            self.generation,
                            self.now,
                        );
                        self.apply(&recorded).await?;
                        prev = recorded;
                    }
                    match self.ctx.feeds.state(&self.uid()) {
                        Some(FeedState::Fed | FeedState::Answered(_)) => {}
                        // Almost there: look again in a moment rather than attach twice.
                        Some(FeedState::Feeding) => {
                            return Ok(Action::requeue(std::time::Duration::from_millis(100)));
                        }
                        // Nobody here sent it; an operator before a restart may have.
                        None => {
                            if feed::already_received(&self.pods, pod_name).await? {
                                self.ctx.feeds.mark_fed(&self.uid());
                            } else {
                                let files = self.file_caps(pod.as_ref(), &prev, decided.as_ref());
                                self.feed(pod_name, &limits, files).await?;
                            }
                        }
                    }
                }
                self.progress_to(&prev, &progress, pod_name).await
            }
            Next::Collect(exited) => {
                let files = self.file_caps(pod.as_ref(), &prev, decided.as_ref());
                self.collect(&prev, &exited, &limits, files, pod_name).await
            }
            Next::Finish(outcome) => {
                self.end(&prev, Some(Tool::Python), &outcome, Some(pod_name))
                    .await
            }
        }
    }

    /// The Pod named `name`, as the controller's watch has it if it has the run's own Pod there
    /// (its change was stored before it woke this reconcile: `watched_pods.rs`), else as the
    /// API server has it. Only presence is taken from the watch: "no Pod" must mean no Pod
    /// (the run is ended PodDeleted, or a Pod is created, on it), and a Pod of another owner
    /// under the run's name (a deleted run's, or a pool's the watch saw before this run
    /// claimed it) is read again before it is acted on.
    async fn read_pod(&self, name: &str) -> Result<Option<Pod>, Error> {
        if let Some(watched) = self.ctx.watched_pods.get(&self.ns, name)
            && pod::belongs_to(&watched, self.run)
        {
            return Ok(Some(Pod::clone(&watched)));
        }
        Ok(self.pods.get_opt(name).await?)
    }

    /// The caps on the files the run returns: recorded on its Pod (from the decision that built
    /// or claimed it), else the decision taken in this reconciliation, else the recorded one.
    fn file_caps(
        &self,
        pod: Option<&Pod>,
        prev: &SandboxRunStatus,
        decided: Option<&Decision>,
    ) -> FileCaps {
        pod.and_then(pod::file_caps_of)
            .or_else(|| decided.map(|d| d.files))
            .unwrap_or_else(|| self.ctx.recorded(self.run, prev, Tool::Python).files)
    }

    /// Records that the run takes a cold sandbox, before its Pod is asked for. A create whose
    /// answer never arrives (a timeout, a reconcile cut short, a connection lost) may still
    /// commit later, under the run's name: the run must then never claim a warm sandbox too, or
    /// it would own two (found by the fault suite: a create held 8 s by the fault proxy
    /// committed after the retry had claimed a warm one). With the record, every later
    /// reconcile and every later operator asks for the same Pod again (AlreadyExists is that
    /// Pod) and waits for it. A run that waits for room in the quota stays cold too.
    async fn record_cold(&self, prev: SandboxRunStatus) -> Result<SandboxRunStatus, Error> {
        if prev.path == Some(SandboxPath::Cold) {
            return Ok(prev);
        }
        let recorded = SandboxRunStatus {
            path: Some(SandboxPath::Cold),
            ..prev
        };
        self.apply(&recorded).await?;
        Ok(recorded)
    }

    /// Creates the sandbox Pod, with the decision's limits (the requested ones, lowered to the
    /// policy rule's ceilings) and caps on returned files. `first`: in the reconcile that decided
    /// the run, which has not read the Pod's name (no Pod of the run's own can exist yet).
    async fn create_pod(
        &self,
        prev: &SandboxRunStatus,
        desired: Pod,
        limits: &Limits,
        files: FileCaps,
        pod_name: &str,
        first: bool,
    ) -> Result<Action, Error> {
        let (run, ctx, now) = (self.run, self.ctx, self.now);
        match ctx.runner_files.ensure(&self.ns).await {
            Ok(()) => {}
            // Refused for good (RBAC without ConfigMaps, an admission policy): no sandbox of
            // this operator could start here; said on the run, as a refused Pod is.
            Err(kube::Error::Api(e)) if refused_for_good(&e) => {
                let outcome = Outcome::of(
                    Phase::Failed,
                    Reason::PodCreationFailed,
                    crate::runner_files::refused(&e.message),
                    None,
                    now,
                );
                return self.end(prev, Some(Tool::Python), &outcome, None).await;
            }
            Err(e) => return Err(e.into()),
        }
        match self.pods.create(&PostParams::default(), &desired).await {
            Ok(_) => {
                info!(run = %self.name, namespace = %self.ns, pod = %pod_name, "created sandbox pod");
                // Counted against the room until the Pods' watch has it (quota_room.rs).
                ctx.admission.admitted(
                    &self.run_ref(),
                    &self.uid(),
                    Sandbox::Created(pod_name),
                    jiff::Timestamp::now(),
                );
                // Counted here, once per Pod: a lagging cache can show "no phase" again.
                ctx.metrics.entered(Phase::Pending);
                ctx.events.pod_created(run, pod_name).await;
            }
            // In the reconcile that decided the run: an earlier run's Pod under this run's name
            // (asked for without a read first: a round trip fewer on every cold run's path). The
            // next reconcile reads it as any other does, and removes it.
            Err(kube::Error::Api(e)) if e.code == 409 && e.reason == "AlreadyExists" && first => {
                return Ok(Action::requeue(std::time::Duration::from_millis(100)));
            }
            // Created before a restart, or by a concurrent reconcile: same Pod, same name (its
            // owner is checked when it is read). Any other 409 (a conflict on the namespace's
            // ResourceQuota object, say) is not a Pod: retried.
            Err(kube::Error::Api(e)) if e.code == 409 && e.reason == "AlreadyExists" => {}
            // The namespace's quota has no room now: the cluster is busy, not wrong. The run
            // waits in the queue for its turn (queue.rs).
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("exceeded quota") => {
                return self.no_room(prev, &e.message).await;
            }
            // Refused for good (admission, quota, Pod Security, unknown RuntimeClass): retrying
            // would fail the same way.
            Err(kube::Error::Api(e)) if refused_for_good(&e) => {
                let outcome = Outcome::of(
                    Phase::Failed,
                    Reason::PodCreationFailed,
                    format!("the API server refused the sandbox Pod: {}", e.message),
                    None,
                    now,
                );
                return self.end(prev, Some(Tool::Python), &outcome, None).await;
            }
            Err(e) => return Err(e.into()),
        }
        let progress = Progress {
            phase: Phase::Pending,
            reason: Reason::PodCreated.as_str().to_owned(),
            message: format!("created sandbox Pod {pod_name}"),
            started_at: None,
            deadline: created_deadline(limits, now),
        };
        let prev = SandboxRunStatus {
            path: Some(SandboxPath::Cold),
            ..prev.clone()
        };
        let action = self.progress_to(&prev, &progress, pod_name).await?;
        // Recorded: the program may go as soon as the container runs.
        if let Some(python) = run.spec.python.as_ref().filter(|_| ctx.early_feed) {
            // Its output is read as long as the code may run.
            let read_for = pod::longest_hold(limits);
            ctx.feeds.start_early(
                self.pods.clone(),
                pod_name.to_owned(),
                (self.run_ref(), self.uid()),
                OwnedProgram {
                    code: python.code.clone(),
                    inputs: python.files.clone(),
                    outputs: files,
                },
                limits.clone(),
                read_for,
            );
        }
        Ok(action)
    }

    /// The run's program: its Python code and input files (none for a run that has no python
    /// section: it never gets this far), returning files within `outputs`.
    pub(crate) fn program(&self, outputs: FileCaps) -> Program<'_> {
        match self.run.spec.python.as_ref() {
            Some(p) => Program {
                code: &p.code,
                inputs: &p.files,
                outputs,
            },
            None => Program {
                outputs,
                ..Program::code("")
            },
        }
    }

    /// Sends the run's program to the runner of its started Pod (feed.rs).
    async fn feed(&self, pod_name: &str, limits: &Limits, files: FileCaps) -> Result<(), Error> {
        let program = self.program(files);
        self.timed_feed(pod_name, feed::feed(&self.pods, pod_name, &program, limits))
            .await
    }

    /// Awaits `sending` (a program on its way to the runner of `pod_name`), timed as
    /// `program_feed`; its failure is the reconcile's (retried).
    pub(crate) async fn timed_feed<T>(
        &self,
        pod_name: &str,
        sending: impl Future<Output = Result<T, feed::FeedError>>,
    ) -> Result<T, Error> {
        let started = std::time::Instant::now();
        let sent = sending.await.map_err(|source| Error::Feed {
            pod: pod_name.to_owned(),
            source,
        })?;
        self.ctx
            .metrics
            .program_feed
            .observe(started.elapsed().as_secs_f64());
        Ok(sent)
    }

    /// Counts the run's code started in `pod_name` at `at` (metrics, and its Started event):
    /// once a run, on whichever path first sees it start.
    async fn started(&self, pod_name: &str, at: jiff::Timestamp) {
        self.ctx
            .metrics
            .started(self.run.metadata.creation_timestamp.as_ref(), at);
        self.ctx.events.started(self.run, pod_name).await;
    }

    /// Records a non-terminal state (only when it changed) and waits for the Pod to move.
    async fn progress_to(
        &self,
        prev: &SandboxRunStatus,
        progress: &Progress,
        pod_name: &str,
    ) -> Result<Action, Error> {
        let status = phase::progress_status(prev, progress, pod_name, self.generation, self.now);
        if &status != prev {
            self.apply(&status).await?;
        }
        if prev.phase != Some(progress.phase) && progress.phase == Phase::Running {
            self.started(pod_name, progress.started_at.unwrap_or(self.now))
                .await;
        }
        Ok(Action::requeue(until(progress.deadline, self.now)))
    }

    /// Ends the run on what its early feeder read off the attach stream ([`feed::Answer`]): the
    /// runner printed its envelope and exited. What the kubelet would report later adds nothing
    /// the envelope does not say, except an OOM kill of the whole sandbox, which leaves no
    /// envelope (and then no answer: the kubelet's view decides). As on the warm path.
    async fn end_on_answer(
        &self,
        prev: &SandboxRunStatus,
        answer: &feed::Answer,
        limits: &Limits,
        files: FileCaps,
        pod_name: &str,
    ) -> Result<Action, Error> {
        if prev.phase != Some(Phase::Running) {
            // It ran, though the kubelet had not said so yet.
            self.started(pod_name, answer.sent_at).await;
        }
        let exited = Exited {
            exit_code: answer.exit_code,
            reason: None,
            started_at: Some(answer.sent_at),
            finished_at: answer.read_at,
        };
        let outcome = phase::collected(&exited, &answer.log, limits, files);
        self.end(prev, Some(Tool::Python), &outcome, Some(pod_name))
            .await
    }

    /// Reads the log of an ended sandbox and ends the run with its classification; an
    /// unreadable log is retried (as a reconcile error) until the retry window closes.
    async fn collect(
        &self,
        prev: &SandboxRunStatus,
        exited: &Exited,
        limits: &Limits,
        files: FileCaps,
        pod_name: &str,
    ) -> Result<Action, Error> {
        let outcome =
            match log::read_log(&self.pods, pod_name, limits, self.ctx.log_read_timeout).await {
                Ok(log) => phase::collected(exited, &log, limits, files),
                Err(source) => match phase::log_unreadable(exited, &source.to_string(), self.now) {
                    Some(outcome) => outcome,
                    None => {
                        return Err(Error::LogUnreadable {
                            pod: pod_name.to_owned(),
                            source,
                        });
                    }
                },
            };
        self.end(prev, Some(Tool::Python), &outcome, Some(pod_name))
            .await
    }
}

/// When the operator stops waiting for a Pod it just created: its timeout, the start-up grace of
/// `activeDeadlineSeconds` and the operator's slack, from now.
fn created_deadline(limits: &Limits, now: jiff::Timestamp) -> jiff::Timestamp {
    let seconds = i64::from(limits.timeout_seconds + pod::ACTIVE_DEADLINE_GRACE_SECONDS)
        + phase::OPERATOR_DEADLINE_SLACK_SECONDS;
    now.checked_add(SignedDuration::from_secs(seconds))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_pod_is_waited_for_past_its_own_deadline() {
        let now: jiff::Timestamp = "2026-11-29T08:00:00Z".parse().unwrap();
        let limits = Limits {
            timeout_seconds: 5,
            ..Limits::default()
        };
        // 5 s timeout + 10 s start-up grace + 30 s slack.
        assert_eq!(
            created_deadline(&limits, now),
            "2026-11-29T08:00:45Z".parse::<jiff::Timestamp>().unwrap()
        );
    }
}

//! A python run in a session (`spec.python.session`): the run side. The run is judged and
//! audited like any other; instead of a sandbox of its own it opens a session (`new`) or names
//! one of its agent's, takes the session (one call at a time: `activeRun`, written only over the
//! status it read), sends its program to the session's runner as a call named after its uid,
//! and ends with that call's result; then it gives the session back (or records its end, when
//! the call ended the interpreter). The run's end is recorded first, so the next call may find
//! the session still held by an ended run: it acts on that run's record (its `sessionEnded`, or
//! for a run gone since, its call's envelope in the log), ending the session instead of taking
//! over a gone interpreter.
//!
//! Exactly once through restarts: the call is sent only by a run that holds the session; an
//! operator that finds its run holding it reads the sandbox's log first: the envelope ends the
//! run, a confirmation means the call runs (it listens for the end), and nothing at all means
//! the frame did not arrive whole (the runner drops a cut one), so it is sent again (the runner
//! never runs a call name twice).

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::Action;
use sandboxrun_api::{
    SandboxRunStatus, SandboxSession, SandboxSessionSpec, SandboxSessionStatus, SessionEndReason,
    SessionPhase,
};
use sandboxrun_core::policy::SessionRules;
use sandboxrun_core::runner::{Program, session_ended_message, session_frame};
use sandboxrun_core::tools::python_session::{NEW_SESSION, not_found};
use sandboxrun_core::{Decision, FileCaps, Limits, Phase, Reason, Tool, parse_call_envelope};
use tracing::info;

use super::controller::{self as sessions, write_status};
use super::exchange::{self, Attached, Heard};
use super::lifecycle;
use crate::controller::{Error, Reconcile, is_terminal, refused_for_good};
use crate::outcome::Outcome;
use crate::python::log::log_limit_bytes;
use crate::python::phase::{self, Exited, OPERATOR_DEADLINE_SLACK_SECONDS};
use crate::python::pod::{self, ACTIVE_DEADLINE_GRACE_SECONDS};

/// The most a reconcile listens for a call's end on its stream; a longer call is listened to
/// again by the next reconcile (after a look at the log), so that a reconcile stays bounded and
/// a cancel is seen.
const LISTEN: Duration = Duration::from_secs(15);
/// Between looks at a session that is starting, or busy with another call.
pub(crate) const WAIT: Duration = Duration::from_millis(100);

/// The name of the session a run opens with `session: new`: from its uid, so that every
/// reconcile (and every operator) opens the same one, and an id nobody can guess.
pub fn opened_name(run_uid: &str) -> String {
    format!("sbs-{}", run_uid.replace('-', "").to_ascii_lowercase())
}

/// The limits of one call in `session`: the run's (as policy lowered them) for its timeout and
/// output cap, each at most the session's; the sandbox's cpu, memory and pids are the
/// session's.
pub fn call_limits(run: &Limits, session: &Limits) -> Limits {
    Limits {
        timeout_seconds: run.timeout_seconds.min(session.timeout_seconds),
        output_bytes: run.output_bytes.min(session.output_bytes),
        ..session.clone()
    }
    .clamped()
}

impl Reconcile<'_> {
    fn sessions(&self) -> Api<SandboxSession> {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    /// The execute stage of a python run in a session.
    pub async fn session_call(
        &self,
        mut prev: SandboxRunStatus,
        decided: Option<Decision>,
    ) -> Result<Action, Error> {
        let asked = self
            .run
            .spec
            .python
            .as_ref()
            .and_then(|p| p.session.clone())
            .unwrap_or_default();
        let decision = match decided {
            Some(d) => d,
            None => self.ctx.recorded(self.run, &prev, Tool::Python),
        };
        let Some(rules) = decision.sessions else {
            // Policy gives bounds to every call it allows in a session; none is a refusal.
            return self
                .call_ends(
                    &prev,
                    Phase::Rejected,
                    Reason::SessionUnavailable,
                    "the policy rule that allowed this call allows no sessions \
                     (python.sessions); call run_python without session"
                        .to_owned(),
                )
                .await;
        };
        let uid = self.uid();
        let api = self.sessions();
        let name = prev.session.clone().unwrap_or_else(|| {
            if asked == NEW_SESSION {
                opened_name(&uid)
            } else {
                asked.clone()
            }
        });
        let mut found = api.get_opt(&name).await?;
        if found.is_none() && asked == NEW_SESSION && prev.session.is_none() {
            match self.open(&api, &name, &decision, &rules).await? {
                Ok(opened) => found = Some(opened),
                Err(outcome) => return self.end(&prev, Some(Tool::Python), &outcome, None).await,
            }
        }
        if found.is_none() && prev.phase == Some(Phase::Running) {
            // Its call was running when the session was closed (deleted, its Pod with it).
            let closed = "the session was closed while the call ran: its sandbox was deleted";
            return self
                .call_ends(
                    &prev,
                    Phase::Cancelled,
                    Reason::CallCancelled,
                    closed.to_owned(),
                )
                .await;
        }
        // Another agent's session is, to this run, no session at all: the same words.
        let Some(session) = found.filter(|s| s.spec.agent == self.run.spec.agent) else {
            return self.no_such_session(&prev, &name).await;
        };
        // Recorded with the run's next status write (waiting, running or its end).
        prev.session.get_or_insert_with(|| name.clone());
        let status = session.status.clone().unwrap_or_default();
        let holding = status.active_run_uid.as_deref() == Some(uid.as_str());
        if status.ended() {
            if holding || prev.phase == Some(Phase::Running) {
                return self.ended_under_call(&prev, &session).await;
            }
            if name == opened_name(&uid) && status.calls.unwrap_or(0) == 0 {
                // The session this run opened could not start: say why, not "no such session".
                return self
                    .call_ends(
                        &prev,
                        Phase::Failed,
                        Reason::SessionUnavailable,
                        status
                            .message
                            .unwrap_or_else(|| "the session could not start".to_owned()),
                    )
                    .await;
            }
            return self.no_such_session(&prev, &name).await;
        }
        if holding {
            return self.listen(prev, &session, &decision, false).await;
        }
        if prev.phase == Some(Phase::Running) {
            // Its call was sent under a lease it no longer holds: given back, or taken over,
            // only once its call had ended. Its result is in the log.
            return self.after_lease(prev, &session, &decision).await;
        }
        if self.run.spec.environment != session.spec.environment {
            return self
                .call_ends(
                    &prev,
                    Phase::Rejected,
                    Reason::SessionUnavailable,
                    format!(
                        "session {name} runs calls in the {} environment, not {}: open another \
                         session for this one",
                        session.spec.environment, self.run.spec.environment
                    ),
                )
                .await;
        }
        let ready = matches!(status.phase, Some(SessionPhase::Ready | SessionPhase::Busy));
        if !ready || status.pod_name.is_none() {
            let waiting = format!("waiting for the sandbox of session {name} to start");
            self.pending(&prev, &waiting).await?;
            return Ok(Action::requeue(WAIT));
        }
        let mut calls = status.calls.unwrap_or(0);
        if let (Some(holder), Some(holder_uid)) = (&status.active_run, &status.active_run_uid) {
            let last = match self.holder(holder, holder_uid).await? {
                Holder::Running => {
                    let waiting = format!("waiting for the call running in session {name} to end");
                    self.pending(&prev, &waiting).await?;
                    return Ok(Action::requeue(WAIT));
                }
                // It ended and has not given the session back yet (it does right after its
                // end): its call is over (a cancelled one ended the session if it was not),
                // and its recorded end says whether the interpreter lived through it.
                Holder::Ended { session_ended } => LastCall::over(session_ended),
                // Gone without giving the session back: its call may be over, or its code may
                // still run.
                Holder::Gone => self.last_call(&session, holder_uid).await?,
            };
            // The session ends here when its holder's call left nothing to take over; this run
            // then sees it ended (the unknown-id answer), as every later call does.
            if let Some((reason, why)) = last.session_end() {
                let pods = self.pods.clone();
                sessions::end(&api, &pods, &session, reason, &why, self.now).await?;
                return Ok(Action::requeue(Duration::ZERO));
            }
            calls += 1;
        }
        // Take it: only over the status read, so two runs never both hold it.
        let mut busy = SandboxSessionStatus {
            phase: Some(SessionPhase::Busy),
            active_run: Some(self.name.clone()),
            active_run_uid: Some(uid.clone()),
            active_since: Some(Time(self.now)),
            calls: Some(calls),
            message: Some(format!("run {} calls it", self.name)),
            ..status
        };
        busy.expiry_time = Some(Time(lifecycle::lifetime_end(
            &session.spec,
            &busy,
            lifecycle::created(&session, self.now),
        )));
        let Some(taken) = write_status(&api, &session, busy).await? else {
            return Ok(Action::requeue(Duration::from_millis(20)));
        };
        self.listen(prev, &taken, &decision, true).await
    }

    /// Opens the session `name` for this run, within `rules` (the agent's open sessions
    /// counted first); `Err` is the run's refusal.
    async fn open(
        &self,
        api: &Api<SandboxSession>,
        name: &str,
        decision: &Decision,
        rules: &SessionRules,
    ) -> Result<Result<SandboxSession, Outcome>, Error> {
        // One opening at a time in this operator: two calls of one agent cannot both pass the
        // count (only the leader reconciles).
        let _one = self.ctx.sessions_opening.lock().await;
        let agent = &self.run.spec.agent;
        let open = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|s| &s.spec.agent == agent)
            .filter(|s| !s.status.as_ref().is_some_and(SandboxSessionStatus::ended))
            .count();
        if open >= rules.max_per_agent as usize {
            return Ok(Err(Outcome::of(
                Phase::Rejected,
                Reason::SessionLimit,
                format!(
                    "you have {open} open sessions, the most policy allows: close one with \
                     close_session, or call without session"
                ),
                None,
                self.now,
            )));
        }
        let mut session = SandboxSession::new(
            name,
            SandboxSessionSpec {
                agent: agent.clone(),
                environment: self.run.spec.environment,
                profile: self.run.spec.python.as_ref().and_then(|p| p.profile),
                limits: decision.limits.clone().into(),
                idle_timeout_seconds: Some(
                    rules.idle_timeout_seconds.min(rules.max_lifetime_seconds),
                ),
                max_lifetime_seconds: Some(rules.max_lifetime_seconds),
            },
        );
        session.metadata.labels = Some(
            [
                (pod::LABEL_MANAGED_BY.to_owned(), pod::MANAGER.to_owned()),
                (pod::LABEL_AGENT.to_owned(), pod::label_value(agent)),
            ]
            .into(),
        );
        session.metadata.annotations =
            Some([(OPENED_BY_ANNOTATION.to_owned(), self.name.clone())].into());
        match api.create(&PostParams::default(), &session).await {
            Ok(created) => {
                info!(run = %self.name, session = %name, agent = %agent, "opened session");
                Ok(Ok(created))
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Ok(api.get(name).await?)),
            Err(kube::Error::Api(e)) if refused_for_good(&e) => Ok(Err(Outcome::of(
                Phase::Rejected,
                Reason::SessionUnavailable,
                format!("the API server refused the session: {}", e.message),
                None,
                self.now,
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Where the run `name` (uid `uid`) that holds a session stands.
    async fn holder(&self, name: &str, uid: &str) -> Result<Holder, Error> {
        let run = self
            .runs
            .get_opt(name)
            .await?
            .filter(|r| r.metadata.uid.as_deref() == Some(uid));
        Ok(match run {
            None => Holder::Gone,
            Some(r) if r.status.as_ref().is_some_and(is_terminal) => Holder::Ended {
                session_ended: r.status.and_then(|s| s.session_ended),
            },
            Some(r) if r.metadata.deletion_timestamp.is_some() || r.spec.cancelled => Holder::Gone,
            Some(_) => Holder::Running,
        })
    }

    /// How the call `call` of a gone run left `session`: over once its envelope is in the log
    /// (which says whether the interpreter lived through it).
    async fn last_call(&self, session: &SandboxSession, call: &str) -> Result<LastCall, Error> {
        let status = session.status.clone().unwrap_or_default();
        let (Some(pod), Some(since)) = (status.pod_name, status.active_since) else {
            return Ok(LastCall::Over);
        };
        let limit = 3 * log_limit_bytes(&super::pod::limits(session));
        let log = exchange::log_since(&self.pods, &pod, since.0, limit, self.ctx.log_read_timeout)
            .await?;
        Ok(match exchange::heard(&log, call) {
            Heard::Envelope(line) => LastCall::over(interpreter_ended(&line, call)),
            Heard::Received | Heard::Nothing => LastCall::Running,
        })
    }

    /// Holding `session`: sends the call if it was not received (`fresh`: taken just now, so
    /// not sent yet), then listens for its end.
    async fn listen(
        &self,
        prev: SandboxRunStatus,
        session: &SandboxSession,
        decision: &Decision,
        fresh: bool,
    ) -> Result<Action, Error> {
        let uid = self.uid();
        let status = session.status.clone().unwrap_or_default();
        let pod_name = status.pod_name.clone().unwrap_or_default();
        let since = status.active_since.as_ref().map_or(self.now, |t| t.0);
        let limits = call_limits(&decision.limits, &super::pod::limits(session));
        let files = decision.files;
        let most = usize::try_from(log_limit_bytes(&limits)).unwrap_or(usize::MAX);
        let deadline = since
            .saturating_add(SignedDuration::from_secs(
                i64::from(limits.timeout_seconds + ACTIVE_DEADLINE_GRACE_SECONDS)
                    + OPERATOR_DEADLINE_SLACK_SECONDS,
            ))
            .unwrap_or(since);
        let listen = LISTEN.min(crate::controller::until(deadline, self.now));
        let program = self.program(files);
        let mut attached;
        let mut written = None;
        let prev = if fresh {
            // The run's Running status is for people and the frontend; the session's record
            // (its lease, written above) is what every later step acts on: the two go together.
            let (recorded, sent) = tokio::join!(self.running(&prev, since, session), async {
                let mut attached = self.attach(&pod_name, true).await?;
                self.send(&mut attached, &pod_name, &uid, &program, &limits)
                    .await?;
                Ok::<_, Error>(attached)
            });
            attached = sent?;
            let (status, rv) = recorded?;
            written = rv;
            status
        } else {
            let prev = if prev.phase == Some(Phase::Running) {
                prev
            } else {
                self.running(&prev, since, session).await?.0
            };
            // Listening first, then the log: whatever the log does not have yet, the stream
            // will carry.
            attached = self.attach(&pod_name, true).await?;
            let log = exchange::log_since(
                &self.pods,
                &pod_name,
                since,
                3 * i64::try_from(most).unwrap_or(i64::MAX / 4),
                self.ctx.log_read_timeout,
            )
            .await?;
            match exchange::heard(&log, &uid) {
                Heard::Envelope(line) => {
                    return self
                        .ended_call(prev, None, session, &line, &limits, files)
                        .await;
                }
                Heard::Received => {}
                // Never sent, or sent over a stream that broke before the frame was through
                // (the runner drops a frame cut short): again. A frame that did arrive whole
                // and is not confirmed yet is dropped by the runner as a name it had.
                Heard::Nothing => {
                    info!(run = %self.name, pod = %pod_name, "the session's runner has not got the call; sending it again");
                    self.send(&mut attached, &pod_name, &uid, &program, &limits)
                        .await?;
                }
            }
            prev
        };
        if let Some(line) = attached.until_envelope(&uid, listen, most).await {
            return self
                .ended_call(prev, written, session, &line, &limits, files)
                .await;
        }
        drop(attached);
        if Timestamp::now() >= deadline {
            // The runner ends every call by its timeout: one that said nothing by now is broken.
            let api = self.sessions();
            let why = "a call got no answer from its runner";
            sessions::end(
                &api,
                &self.pods,
                session,
                SessionEndReason::SandboxLost,
                why,
                self.now,
            )
            .await?;
            return self
                .call_ends(
                    &prev,
                    Phase::Failed,
                    Reason::NoResult,
                    format!("the session's sandbox gave no result for the call by {deadline}: the session was ended"),
                )
                .await;
        }
        Ok(Action::requeue(Duration::from_millis(50)))
    }

    async fn attach(&self, pod_name: &str, stdin: bool) -> Result<Attached, Error> {
        Attached::open(&self.pods, pod_name, stdin)
            .await
            .map_err(|source| Error::Feed {
                pod: pod_name.to_owned(),
                source,
            })
    }

    async fn send(
        &self,
        attached: &mut Attached,
        pod_name: &str,
        uid: &str,
        program: &Program<'_>,
        limits: &Limits,
    ) -> Result<(), Error> {
        let frame = session_frame(uid, program, limits);
        self.timed_feed(pod_name, attached.send(&frame)).await
    }

    /// A run whose call ran under a lease it no longer holds: its result, from the session's
    /// log since the call started.
    async fn after_lease(
        &self,
        prev: SandboxRunStatus,
        session: &SandboxSession,
        decision: &Decision,
    ) -> Result<Action, Error> {
        let status = session.status.clone().unwrap_or_default();
        let limits = call_limits(&decision.limits, &super::pod::limits(session));
        let since = prev.start_time.as_ref().map_or(self.now, |t| t.0);
        let heard = match status.pod_name.as_deref() {
            Some(pod) => {
                let limit = 3 * log_limit_bytes(&limits);
                let log =
                    exchange::log_since(&self.pods, pod, since, limit, self.ctx.log_read_timeout)
                        .await?;
                exchange::heard(&log, &self.uid())
            }
            None => Heard::Nothing,
        };
        match heard {
            Heard::Envelope(line) => {
                self.ended_call(prev, None, session, &line, &limits, decision.files)
                    .await
            }
            _ => {
                self.call_ends(
                    &prev,
                    Phase::Failed,
                    Reason::NoResult,
                    "the call's result is not in its session's log any more".to_owned(),
                )
                .await
            }
        }
    }

    /// Records that the run's call runs in `session` (since `since`).
    async fn running(
        &self,
        prev: &SandboxRunStatus,
        since: Timestamp,
        session: &SandboxSession,
    ) -> Result<(SandboxRunStatus, Option<String>), Error> {
        let mut status = crate::outcome::base(prev, Some(Tool::Python), self.generation);
        status.phase = Some(Phase::Running);
        status.reason = Some(Reason::ContainerStarted.as_str().to_owned());
        status.message = Some(format!("the code runs in session {}", session.name_any()));
        status.start_time = Some(Time(since));
        let written = self.apply_recorded(&status).await?;
        self.ctx
            .metrics
            .started(self.run.metadata.creation_timestamp.as_ref(), since);
        Ok((status, written))
    }

    /// Records that the run waits (for its session's sandbox, or its turn), once.
    async fn pending(&self, prev: &SandboxRunStatus, message: &str) -> Result<(), Error> {
        if prev.phase == Some(Phase::Pending) && prev.message.as_deref() == Some(message) {
            return Ok(());
        }
        let mut status = crate::outcome::base(prev, Some(Tool::Python), self.generation);
        status.phase = Some(Phase::Pending);
        status.reason = Some(Reason::Queued.as_str().to_owned());
        status.message = Some(message.to_owned());
        self.apply(&status).await
    }

    /// The call's envelope `line` came: the run ends with the call's result (over `written`,
    /// the run's resourceVersion after this reconcile's own last write, if it made one). The
    /// session is given back (or ended, when the call ended its interpreter) once the end is
    /// recorded, by the reconcile that sees it ([`Reconcile::session_call_ended`]), or by the
    /// next call from this run's record: never before, or this run, not ended yet, could take
    /// it again.
    async fn ended_call(
        &self,
        mut prev: SandboxRunStatus,
        written: Option<String>,
        session: &SandboxSession,
        line: &str,
        limits: &Limits,
        files: FileCaps,
    ) -> Result<Action, Error> {
        let uid = self.uid();
        let result = parse_call_envelope(line, &uid).ok();
        let ended = interpreter_ended(line, &uid);
        let since = prev.start_time.as_ref().map(|t| t.0).or_else(|| {
            let status = session.status.as_ref()?;
            status.active_since.as_ref().map(|t| t.0)
        });
        let exited = Exited {
            exit_code: result.as_ref().map_or(1, |r| r.exit_code),
            reason: None,
            started_at: since,
            finished_at: Timestamp::now(),
        };
        let outcome = phase::collected(&exited, line, limits, files);
        prev.session_ended.clone_from(&ended);
        let status = self.terminal(&prev, Some(Tool::Python), &outcome, None);
        self.finish_over(status, &outcome, None, written).await
    }

    /// A run in a session that has ended: gives the session back if it still holds it (it
    /// ended and stopped before it could).
    pub async fn session_call_ended(&self, status: &SandboxRunStatus) -> Result<(), Error> {
        let Some(name) = status.session.as_deref() else {
            return Ok(());
        };
        let Some(session) = self.sessions().get_opt(name).await? else {
            return Ok(());
        };
        self.give_back(&session, status.session_ended.as_deref())
            .await
    }

    /// Gives `session` back after this run's call: one more call, its end the last activity;
    /// or its end, when the call ended it (`ended`: why), and its sandbox deleted.
    async fn give_back(&self, session: &SandboxSession, ended: Option<&str>) -> Result<(), Error> {
        let api = self.sessions();
        let uid = self.uid();
        let mut current = session.clone();
        for _ in 0..5 {
            let status = current.status.clone().unwrap_or_default();
            if status.active_run_uid.as_deref() != Some(uid.as_str()) || status.ended() {
                return Ok(());
            }
            let now = Timestamp::now();
            let mut next = SandboxSessionStatus {
                phase: Some(SessionPhase::Ready),
                active_run: None,
                active_run_uid: None,
                active_since: None,
                calls: Some(status.calls.unwrap_or(0) + 1),
                last_call_time: Some(Time(now)),
                message: Some("its sandbox waits for a call".to_owned()),
                ..status
            };
            if let Some(why) = ended {
                next = sessions::ended_status(
                    &next,
                    SessionEndReason::InterpreterExited,
                    why,
                    current.metadata.generation,
                    now,
                );
            } else {
                next.expiry_time = Some(Time(lifecycle::expiry(
                    &current.spec,
                    &next,
                    lifecycle::created(&current, now),
                )));
            }
            if write_status(&api, &current, next).await?.is_some() {
                if ended.is_some()
                    && let Some(pod) = current.status.as_ref().and_then(|s| s.pod_name.clone())
                {
                    self.delete_pod(&pod).await?;
                }
                return Ok(());
            }
            match api.get_opt(&current.name_any()).await? {
                Some(fresh) => current = fresh,
                None => return Ok(()),
            }
        }
        // Still held by this run: the next call takes it over once this run has ended.
        Ok(())
    }

    /// The session ended while this run's call was in it: its result, if the log has it, else
    /// the run ends with the session's reason (closed: Cancelled, as a closed embedded session's
    /// call).
    async fn ended_under_call(
        &self,
        prev: &SandboxRunStatus,
        session: &SandboxSession,
    ) -> Result<Action, Error> {
        let status = session.status.clone().unwrap_or_default();
        let (phase, reason) = match status.end_reason {
            Some(SessionEndReason::Closed) => (Phase::Cancelled, Reason::CallCancelled),
            _ => (Phase::Failed, Reason::SessionUnavailable),
        };
        let mut prev = prev.clone();
        prev.session_ended = status.message.clone();
        self.call_ends(
            &prev,
            phase,
            reason,
            status
                .message
                .unwrap_or_else(|| "the session ended while the call ran".to_owned()),
        )
        .await
    }

    /// Ends the run refused: `name` is none of its agent's open sessions (the same words for
    /// an unknown id, another agent's session and an ended one).
    async fn no_such_session(&self, prev: &SandboxRunStatus, name: &str) -> Result<Action, Error> {
        self.call_ends(
            prev,
            Phase::Rejected,
            Reason::SessionNotFound,
            not_found(name),
        )
        .await
    }

    /// Ends the run without a result of its call.
    async fn call_ends(
        &self,
        prev: &SandboxRunStatus,
        phase: Phase,
        reason: Reason,
        message: String,
    ) -> Result<Action, Error> {
        let started = prev.start_time.as_ref().map(|t| t.0);
        let outcome = Outcome::of(phase, reason, message, started, self.now);
        self.end(prev, Some(Tool::Python), &outcome, None).await
    }

    /// A cancelled run whose call holds its session: the code cannot be stopped but with the
    /// interpreter, so the session ends (as an embedded one does).
    pub async fn cancel_session_call(&self, prev: &SandboxRunStatus) -> Result<(), Error> {
        let Some(name) = prev.session.as_deref() else {
            return Ok(());
        };
        let api = self.sessions();
        let Some(session) = api.get_opt(name).await? else {
            return Ok(());
        };
        let uid = self.uid();
        let held = session
            .status
            .as_ref()
            .is_some_and(|s| s.active_run_uid.as_deref() == Some(uid.as_str()) && !s.ended());
        if !held {
            return Ok(());
        }
        if let Some((reason, why)) = self.last_call(&session, &uid).await?.session_end() {
            sessions::end(&api, &self.pods, &session, reason, &why, self.now).await?;
        }
        Ok(())
    }
}

/// Where the run holding a session stands.
enum Holder {
    /// It runs its call.
    Running,
    /// It ended (its call with it); `session_ended`: why, when its call ended the interpreter.
    Ended { session_ended: Option<String> },
    /// It is gone, cancelled or being deleted: its call may still run.
    Gone,
}

/// Where the last call of a session's holder left the session.
enum LastCall {
    /// Its code may still run.
    Running,
    /// Over, the interpreter waiting for the next call.
    Over,
    /// Over, and the interpreter with it (why).
    EndedInterpreter(String),
}

impl LastCall {
    fn over(interpreter_ended: Option<String>) -> Self {
        interpreter_ended.map_or(Self::Over, Self::EndedInterpreter)
    }

    /// How the session ends when no run is left to end it: `None` when it can take another
    /// call.
    fn session_end(self) -> Option<(SessionEndReason, String)> {
        match self {
            Self::Over => None,
            // Only the end of the interpreter stops code that still runs.
            Self::Running => Some((
                SessionEndReason::CallCancelled,
                "a call was cancelled while it ran in it".to_owned(),
            )),
            // Its holder would end it as it gave it back; a later call never sends to it.
            Self::EndedInterpreter(why) => Some((SessionEndReason::InterpreterExited, why)),
        }
    }
}

/// Why the call `call` whose envelope is `line` ended its session's interpreter; `None` when
/// the interpreter lived through it (or the envelope says nothing of it).
fn interpreter_ended(line: &str, call: &str) -> Option<String> {
    let state = parse_call_envelope(line, call).ok()?.session?;
    (!state.alive).then(|| session_ended_message(state.ended, state.message.as_deref()))
}

/// Annotation of a session opened by a run (`session: new`): the run's name.
pub const OPENED_BY_ANNOTATION: &str = "sandboxrun.dev/opened-by";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_session_is_named_after_its_uid() {
        let name = opened_name("0D6F1A2B-1111-2222-3333-444455556666");
        assert_eq!(name, "sbs-0d6f1a2b111122223333444455556666");
        assert!(matches!(
            sandboxrun_core::tools::python_session::SessionArg::parse(&name),
            Ok(sandboxrun_core::tools::python_session::SessionArg::Named(_))
        ));
    }

    #[test]
    fn a_call_is_bounded_by_its_session() {
        let session = Limits {
            timeout_seconds: 20,
            output_bytes: 1000,
            memory: "512Mi".to_owned(),
            ..Limits::default()
        };
        let run = Limits {
            timeout_seconds: 60,
            output_bytes: 100,
            memory: "2Gi".to_owned(),
            ..Limits::default()
        };
        let call = call_limits(&run, &session);
        assert_eq!((call.timeout_seconds, call.output_bytes), (20, 100));
        assert_eq!(call.memory, "512Mi", "the sandbox is the session's");
    }
}

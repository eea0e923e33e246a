//! Hands a started sandbox its program. The code never travels in the Pod spec or a command
//! line (an argv string holds at most 128 KiB, and a spec is readable by anyone who may get
//! Pods): the runner waits on stdin, and the operator writes the framed program
//! ([`sandboxrun_core::program_frame`]) once, over the Pod's attach stream, when the container
//! has started.
//!
//! Once: the container has `stdinOnce`, so its stdin closes when the first attach session
//! ends, and no second program can follow. Whole or not at all: the runner runs only a program
//! of exactly the announced length; one cut short (the operator died mid-write) ends the run
//! without a result, never as a prefix of the code. The runner prints
//! [`PROGRAM_RECEIVED`] once it has the program; that is when the session is closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, AttachedProcess};
use kube::runtime::reflector::ObjectRef;
use sandboxrun_api::SandboxRun;
use sandboxrun_core::runner::Program;
use sandboxrun_core::{
    FileCaps, InputFile, Limits, PROGRAM_RECEIVED, parse_envelope, program_frame,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::log::log_limit_bytes;
use super::pod::CONTAINER;

/// A program to hand over, owned: the early feeder sends it from its own task.
#[derive(Clone, Debug)]
pub struct OwnedProgram {
    /// The code.
    pub code: String,
    /// The input files.
    pub inputs: Vec<InputFile>,
    /// The caps on the files it returns.
    pub outputs: FileCaps,
}

impl OwnedProgram {
    /// The program, borrowed.
    pub fn program(&self) -> Program<'_> {
        Program {
            code: &self.code,
            inputs: &self.inputs,
            outputs: self.outputs,
        }
    }
}

/// How long the runner may take to confirm a program, beyond the time to send it.
const CONFIRM_WITHIN: Duration = Duration::from_secs(20);
/// The same for the early feeder. An attach the API server opened may never reach the
/// container: under load (the kubelet starting sandboxes 17 s late), the container runtime's log
/// shows no stream for the program at all until a second attach, which delivers it at once, and
/// the runner's log no confirmation. So the feeder hangs up after this, looks in the log (an
/// attach that was connected delivered the program into the container's stdin, and the runner
/// confirms it there), and attaches again.
const EARLY_CONFIRM_WITHIN: Duration = Duration::from_secs(2);
/// How long the early feeder looks in the log for a confirmation it did not see on the stream,
/// before it attaches again.
const EARLY_LOG_CONFIRM_WITHIN: Duration = Duration::from_secs(1);
/// How many attaches that opened but were not confirmed the early feeder tries before it leaves
/// the hand-over to the reconcile.
const EARLY_UNCONFIRMED_TRIES: u32 = 3;
/// How long a feeder that kept its stream looks in the log for a confirmation it did not see.
const LOG_CONFIRM_WITHIN: Duration = Duration::from_secs(3);
/// How long the API server may take to open an attach stream (it takes well under a second).
const ATTACH_WITHIN: Duration = Duration::from_secs(20);
/// Between attempts to attach to a sandbox that has not started yet: a tenth of the time it has
/// waited so far ([`ATTACH_RETRY_DIVISOR`]), within these bounds. So a sandbox gets its program
/// at most about a tenth of its start later than it could, and one that starts slowly (a burst
/// on two cores: 5-10 s) is not tried every 100 ms: the load suite's short form made about 14
/// attaches a cold Pod at a fixed 100 ms for the first 5 s, 2,777 in one run where starts were
/// slow, each a new connection through the API server and the kubelet to containerd.
const ATTACH_RETRY: Duration = Duration::from_millis(100);
const ATTACH_RETRY_SLOW: Duration = Duration::from_millis(500);
const ATTACH_RETRY_DIVISOR: u32 = 10;
/// How long after its creation a sandbox is tried: its image and runtime start within this.
const START_WITHIN: Duration = Duration::from_secs(120);
/// How many of the latest cold sandboxes' start times [`StartTimes`] keeps.
const START_TIMES_KEPT: usize = 16;
/// The share of the quickest of them an early feeder waits before its first attach.
const FIRST_ATTACH_SHARE: f64 = 0.7;

/// How long the latest cold sandboxes took from their early feeder's start to the attach that
/// reached their container. Every attach before that fails, and each costs the API server and
/// the kubelet a new connection (the upgrade cannot share one): polling from the Pod's creation
/// every [`ATTACH_RETRY`], a cold Pod took about 13 attaches in a quiet benchmark and 22 in the
/// load suite's opening burst, whose cold starts take longer just when the API server has least
/// to spare. So the
/// first attach waits for [`FIRST_ATTACH_SHARE`] of the quickest recent start: learned on the
/// machine and its load as they are, not a constant, and only a sandbox quicker than that
/// share of the quickest is handed its program later than before.
#[derive(Clone, Debug, Default)]
pub struct StartTimes(Arc<Mutex<std::collections::VecDeque<Duration>>>);

impl StartTimes {
    /// How long a new early feeder waits before its first attach (none before a first start).
    pub fn first_attach_after(&self) -> Duration {
        let times = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        times.iter().min().map_or(Duration::ZERO, |quickest| {
            quickest.mul_f64(FIRST_ATTACH_SHARE)
        })
    }

    /// Records a sandbox whose container an attach reached `after` its feeder's start.
    pub fn record(&self, after: Duration) {
        let mut times = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if times.len() == START_TIMES_KEPT {
            times.pop_front();
        }
        times.push_back(after);
    }
}

/// Where handing a run's program over stands, by run uid (shared by the reconciles and the
/// early feeders they start), and the runs whose early feeder read their answer, to reconcile.
#[derive(Clone, Debug)]
pub struct Feeds {
    states: Arc<Mutex<HashMap<String, FeedState>>>,
    start_times: StartTimes,
    answered: tokio::sync::mpsc::UnboundedSender<ObjectRef<SandboxRun>>,
    wakeups: Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<ObjectRef<SandboxRun>>>>,
}

impl Default for Feeds {
    fn default() -> Self {
        let (answered, wakeups) = tokio::sync::mpsc::unbounded_channel();
        Self {
            states: Arc::default(),
            start_times: StartTimes::default(),
            answered,
            wakeups: Arc::new(tokio::sync::Mutex::new(wakeups)),
        }
    }
}

/// The state of one run's program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FeedState {
    /// An early feeder is trying to hand it over.
    Feeding,
    /// The runner confirmed it.
    Fed,
    /// The runner confirmed it, and the early feeder read its envelope off the stream.
    Answered(Arc<Answer>),
}

/// What a cold sandbox's runner printed, read off the attach stream by the early feeder: the
/// run ends on it as soon as it is read, not once the kubelet noticed that the container ended
/// (it looks once a second) and the log was read.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    /// The runner's output, its envelope last (what the container's log holds).
    pub log: String,
    /// The code's exit status, as the envelope says.
    pub exit_code: i32,
    /// When the program was sent.
    pub sent_at: jiff::Timestamp,
    /// When the envelope was read.
    pub read_at: jiff::Timestamp,
}

impl Feeds {
    /// The state of run `uid`'s program (`None`: nobody is at it, e.g. after a restart).
    pub fn state(&self, uid: &str) -> Option<FeedState> {
        self.states.lock().expect("not poisoned").get(uid).cloned()
    }

    /// What the early feeder read from run `uid`'s runner, if it read its envelope.
    pub fn answer(&self, uid: &str) -> Option<Arc<Answer>> {
        match self.state(uid) {
            Some(FeedState::Answered(answer)) => Some(answer),
            _ => None,
        }
    }

    /// Runs whose answer an early feeder read: the controller reconciles each at once.
    pub fn wakeups(&self) -> impl futures::Stream<Item = ObjectRef<SandboxRun>> + Send + use<> {
        futures::stream::unfold(self.wakeups.clone(), |wakeups| async move {
            let next = wakeups.lock().await.recv().await;
            next.map(|run| (run, wakeups))
        })
    }

    fn set(&self, uid: &str, state: Option<FeedState>) {
        let mut map = self.states.lock().expect("not poisoned");
        match state {
            Some(s) => map.insert(uid.to_owned(), s),
            None => map.remove(uid),
        };
    }

    /// Keeps `answer` for run `uid` (`run`) and has the controller reconcile it, if its
    /// program is still [`FeedState::Fed`]: not for a run that ended meanwhile.
    pub fn answered(&self, run: ObjectRef<SandboxRun>, uid: &str, answer: Answer) -> bool {
        let answered = FeedState::Answered(Arc::new(answer));
        let kept = self.advance(uid, &FeedState::Fed, Some(answered));
        if kept {
            // The receiver lives as long as the controller.
            let _ = self.answered.send(run);
        }
        kept
    }

    /// Moves run `uid` from `from` to `to` (`None`: forgotten), only if it is still at `from`:
    /// a run that ended (or that a reconcile took over) meanwhile is left as it is.
    fn advance(&self, uid: &str, from: &FeedState, to: Option<FeedState>) -> bool {
        let mut map = self.states.lock().expect("not poisoned");
        if map.get(uid) != Some(from) {
            return false;
        }
        match to {
            Some(to) => map.insert(uid.to_owned(), to),
            None => map.remove(uid),
        };
        true
    }

    /// Records that run `uid`'s program was handed over (by the warm path, inline).
    pub fn mark_fed(&self, uid: &str) {
        self.set(uid, Some(FeedState::Fed));
    }

    /// Forgets run `uid` (it ended).
    pub fn forget(&self, uid: &str) {
        self.set(uid, None);
    }

    /// Hands `program` to the sandbox `pod` of run `run` (uid `uid`) as soon as its container
    /// runs, in the background, then reads its output off the same stream until the envelope
    /// (for at most `read_for`): the kubelet reports a started container only at its next
    /// relist, and an ended one at the one after (each up to a second later), and the code
    /// should wait for neither. With the envelope read, the run is marked
    /// [`FeedState::Answered`] and reconciled at once ([`Feeds::wakeups`]). Attaching to a
    /// container that has not started fails at once and is retried, and so is an attach that
    /// opened but whose program the runner confirmed neither on the stream nor in its log (a
    /// few times: then the reconcile that sees the container running takes over). A stream
    /// that ends without the envelope leaves the run to the kubelet's view and the log.
    pub fn start_early(
        &self,
        pods: Api<Pod>,
        pod: String,
        (run, uid): (ObjectRef<SandboxRun>, String),
        program: OwnedProgram,
        limits: Limits,
        read_for: Duration,
    ) {
        self.set(&uid, Some(FeedState::Feeding));
        let feeds = self.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let mut unconfirmed = 0;
            let mut reached = false;
            tokio::time::sleep(feeds.start_times.first_attach_after()).await;
            loop {
                // The run ended (or a reconcile took over): nothing left to hand over.
                if feeds.state(&uid) != Some(FeedState::Feeding) {
                    return;
                }
                let sent_at = jiff::Timestamp::now();
                let attempt_at = started.elapsed();
                // Marked fed as soon as the runner confirms: the reconciles that see the
                // container running go on, while this task reads what the code prints.
                let sent = session(
                    &pods,
                    &pod,
                    &program.program(),
                    &limits,
                    Some(read_for),
                    EARLY_CONFIRM_WITHIN,
                    None,
                    || {
                        feeds.advance(&uid, &FeedState::Feeding, Some(FeedState::Fed));
                    },
                )
                .await;
                if !reached && !matches!(sent, Err(FeedError::Attach(_) | FeedError::NotStarted(_)))
                {
                    reached = true;
                    feeds.start_times.record(attempt_at);
                }
                // An output is returned only once it holds a whole envelope.
                if let Ok(Some(log)) = &sent
                    && let Ok(envelope) = parse_envelope(log)
                {
                    let answer = Answer {
                        exit_code: envelope.exit_code,
                        log: log.clone(),
                        sent_at,
                        read_at: jiff::Timestamp::now(),
                    };
                    feeds.answered(run, &uid, answer);
                    return;
                }
                let confirmed = confirmed_in_log(&pods, &pod, sent).await;
                match after_attempt(&confirmed, unconfirmed, started.elapsed()) {
                    Then::Fed => {
                        // Only if still wanted: the run may have ended meanwhile.
                        feeds.advance(&uid, &FeedState::Feeding, Some(FeedState::Fed));
                        return;
                    }
                    Then::AttachAgain(after) => {
                        if let Err(FeedError::Unconfirmed(why)) = &confirmed {
                            unconfirmed += 1;
                            tracing::info!(pod = %pod, reason = %why, attempt = unconfirmed, "the program's stream was not confirmed; attaching again");
                        }
                        tokio::time::sleep(after).await;
                    }
                    Then::GiveUp => {
                        let error = confirmed.err().map(|e| e.to_string()).unwrap_or_default();
                        tracing::info!(pod = %pod, %error, "early program hand-over did not complete; the reconcile takes over");
                        feeds.advance(&uid, &FeedState::Feeding, None);
                        return;
                    }
                }
            }
        });
    }
}

/// What the early feeder does after an attempt to hand the program over.
#[derive(Debug, PartialEq)]
enum Then {
    /// The runner confirmed it.
    Fed,
    /// Attach again after this long.
    AttachAgain(Duration),
    /// Leave the hand-over to the reconcile that sees the container running.
    GiveUp,
}

/// What follows `attempt` (as the log settled it, [`confirmed_in_log`]), made `since_start`
/// after the first, after `unconfirmed` attaches that opened but were not confirmed.
fn after_attempt(attempt: &Result<(), FeedError>, unconfirmed: u32, since_start: Duration) -> Then {
    let in_time = since_start < START_WITHIN;
    match attempt {
        Ok(()) => Then::Fed,
        // Attached, but confirmed neither on the stream nor in the log: the stream may never
        // have reached the container. Another attach is safe: the runner takes one program
        // (stdinOnce closed its stdin with a session that did reach it, and one that reads it
        // then sees the first one's confirmation, or the log does).
        Err(FeedError::Unconfirmed(_)) if in_time && unconfirmed + 1 < EARLY_UNCONFIRMED_TRIES => {
            Then::AttachAgain(Duration::ZERO)
        }
        // Not started yet: again after a tenth of the wait so far.
        Err(FeedError::Attach(_) | FeedError::NotStarted(_)) if in_time => Then::AttachAgain(
            (since_start / ATTACH_RETRY_DIVISOR).clamp(ATTACH_RETRY, ATTACH_RETRY_SLOW),
        ),
        Err(_) => Then::GiveUp,
    }
}

/// Whether the runner of `pod` already confirmed a program (its log starts with the
/// confirmation): then a program was handed over, by an operator that stopped before recording
/// it, and sending another is pointless (stdinOnce closed the runner's stdin with that session).
pub async fn already_received(pods: &Api<Pod>, pod: &str) -> Result<bool, kube::Error> {
    let params = kube::api::LogParams {
        container: Some(CONTAINER.to_owned()),
        limit_bytes: Some(256),
        ..Default::default()
    };
    let head = tokio::time::timeout(CONFIRM_WITHIN, pods.logs(pod, &params))
        .await
        .map_err(|_| kube::Error::Service("reading the log timed out".into()))??;
    Ok(head
        .lines()
        .any(|l| l.starts_with(&format!("{PROGRAM_RECEIVED} "))))
}

/// The early feeder's result: a confirmation missing on the stream may still be in the log (the
/// program went through when the session ended).
async fn confirmed_in_log(
    pods: &Api<Pod>,
    pod: &str,
    sent: Result<Option<String>, FeedError>,
) -> Result<(), FeedError> {
    let Err(FeedError::Unconfirmed(why)) = sent else {
        return sent.map(|_| ());
    };
    let deadline = tokio::time::Instant::now() + EARLY_LOG_CONFIRM_WITHIN;
    while tokio::time::Instant::now() < deadline {
        if already_received(pods, pod).await.unwrap_or(false) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(FeedError::Unconfirmed(why))
}

/// Why a program could not be handed over.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// The attach stream could not be opened or broke.
    #[error("attaching to the sandbox: {0}")]
    Attach(#[from] kube::Error),
    /// Writing or reading the stream failed.
    #[error("streaming the program: {0}")]
    Stream(#[from] std::io::Error),
    /// The stream ended, or time ran out, before the runner confirmed the program.
    #[error("the runner did not confirm the program ({0})")]
    Unconfirmed(String),
    /// The kubelet could not reach the container (not started yet): nothing was attached, so
    /// its stdin is still open and trying again is safe.
    #[error("the sandbox container is not reachable yet: {0}")]
    NotStarted(String),
}

/// Sends `program` to the runner of `pod` and waits until it confirms all of it.
pub async fn feed(
    pods: &Api<Pod>,
    pod: &str,
    program: &Program<'_>,
    limits: &Limits,
) -> Result<(), FeedError> {
    session(
        pods,
        pod,
        program,
        limits,
        None,
        CONFIRM_WITHIN,
        None,
        || {},
    )
    .await
    .map(|_| ())
}

/// Sends `program` to the runner of `pod`, then keeps the stream open and reads the runner's
/// output until it exits (at most `within`): what it returns is the container's log, envelope
/// included, without waiting for the kubelet to notice that the container ended (it looks once
/// a second). `Ok(None)`: the program was handed over but the output did not end in time or
/// the stream broke; the kubelet's view and the log then decide, as for any run. `held`: a
/// stream opened to the sandbox while it idled (`pool_streams.rs`), used instead of a new one.
pub async fn feed_and_read(
    pods: &Api<Pod>,
    pod: &str,
    program: &Program<'_>,
    limits: &Limits,
    within: Duration,
    held: Option<AttachedProcess>,
) -> Result<Option<String>, FeedError> {
    let read = session(
        pods,
        pod,
        program,
        limits,
        Some(within),
        CONFIRM_WITHIN,
        held,
        || {},
    )
    .await;
    let Err(FeedError::Unconfirmed(why)) = read else {
        return read;
    };
    // The stream ended (or went quiet) before its confirmation came through, yet the program
    // may have (seen in bursts: a warm `print(1)` confirmed, ran and ended in its log while its
    // stream ended with nothing, and the run waited a retry and the kubelet's view, 2 s more).
    // The log says, as it does for the early feeder ([`confirmed_in_log`]).
    let log = super::log::read_log(pods, pod, limits, LOG_CONFIRM_WITHIN).await;
    let found = log.map(|log| in_log(log, program.code.len()));
    if let Ok(InLog::Result(_) | InLog::Received) = &found {
        tracing::info!(pod, stream = %why, ended = matches!(found, Ok(InLog::Result(_))), "the program's stream ended unconfirmed; its log shows it handed over");
    }
    match found {
        Ok(InLog::Result(log)) => Ok(Some(log)),
        Ok(InLog::Received) => Ok(None),
        Ok(InLog::Nothing) | Err(_) => Err(FeedError::Unconfirmed(why)),
    }
}

/// How far into a session's output (or a sandbox's log) its confirmation may come.
const CONFIRMATION_WITHIN_BYTES: usize = 4096;

/// What a sandbox's log says of a program whose stream ended unconfirmed.
#[derive(Debug, PartialEq)]
enum InLog {
    /// The runner confirmed it and its envelope is there: the whole log.
    Result(String),
    /// The runner confirmed it; its result is not in yet.
    Received,
    /// The runner did not confirm it.
    Nothing,
}

/// Reads `log` (a sandbox's whole log) for the confirmation of a program of `bytes` bytes of code
/// near its start (what the stream's reader accepts, [`confirmation`]: the log also has what
/// the interpreter wrote to stderr before it), and the envelope after it.
fn in_log(log: String, bytes: usize) -> InLog {
    let expected = format!("{PROGRAM_RECEIVED} {bytes}");
    let mut read = 0;
    let confirmed = log.lines().any(|line| {
        let near_start = read <= CONFIRMATION_WITHIN_BYTES;
        read += line.len() + 1;
        near_start && line.trim_end() == expected
    });
    if !confirmed {
        return InLog::Nothing;
    }
    if parse_envelope(&log).is_ok() {
        InLog::Result(log)
    } else {
        InLog::Received
    }
}

/// One attach session (`held`, or a new one): send the framed program, wait for its
/// confirmation (then call `confirmed`) and, with `read_for`, read the output that follows until
/// the envelope or the end of the stream.
#[allow(clippy::too_many_arguments)]
async fn session(
    pods: &Api<Pod>,
    pod: &str,
    program: &Program<'_>,
    limits: &Limits,
    read_for: Option<Duration>,
    confirm_within: Duration,
    held: Option<AttachedProcess>,
    confirmed: impl FnOnce(),
) -> Result<Option<String>, FeedError> {
    let began = std::time::Instant::now();
    let was_held = held.is_some();
    let mut attached = match held {
        Some(attached) => attached,
        None => {
            let params = AttachParams::default()
                .container(CONTAINER)
                .stdin(true)
                .stdout(true)
                .stderr(false);
            // The client has no read timeout, and the node may leave an attach unanswered:
            // bounded, so that a feeder (which the reconcile waits for) cannot hang.
            // Unanswered, it wrote nothing.
            tokio::time::timeout(ATTACH_WITHIN, pods.attach(pod, &params))
                .await
                .map_err(|_| {
                    FeedError::NotStarted(format!(
                        "the attach was not answered within {ATTACH_WITHIN:?}"
                    ))
                })??
        }
    };
    let attach_ms = began.elapsed().as_millis();
    let status = attached.take_status();
    let mut stdout = attached.stdout();
    let result = tokio::time::timeout(confirm_within, async {
        let mut stdin = attached
            .stdin()
            .ok_or_else(|| FeedError::Unconfirmed("no stdin stream".into()))?;
        let stdout = stdout
            .as_mut()
            .ok_or_else(|| FeedError::Unconfirmed("no stdout stream".into()))?;
        stdin.write_all(&program_frame(program, limits)).await?;
        stdin.shutdown().await?;
        drop(stdin);
        // The runner confirms the code's bytes once it has read the whole program, files too.
        confirmation(stdout, program.code.len()).await
    })
    .await
    .unwrap_or_else(|_| {
        Err(FeedError::Unconfirmed(format!(
            "nothing within {confirm_within:?}"
        )))
    });
    let confirmed_ms = began.elapsed().as_millis();
    if result.is_ok() {
        confirmed();
    }
    let output = match (&result, read_for, stdout.as_mut()) {
        (Ok(seen), Some(within), Some(stdout)) => {
            let most = usize::try_from(log_limit_bytes(limits)).unwrap_or(usize::MAX);
            tokio::time::timeout(within, until_envelope(stdout, seen.clone(), most))
                .await
                .ok()
                .flatten()
        }
        _ => None,
    };
    tracing::debug!(
        pod,
        was_held,
        attach_ms,
        confirmed_ms,
        read_ms = began.elapsed().as_millis(),
        "program session"
    );
    // Hang up either way: stdinOnce closes the container's stdin with this session.
    attached.abort();
    match result {
        Ok(_) => Ok(output),
        // The stream ended early: the kubelet's own words say why (say, not running yet).
        Err(FeedError::Unconfirmed(why)) => {
            let said = match status {
                Some(status) => tokio::time::timeout(Duration::from_millis(200), status)
                    .await
                    .ok()
                    .flatten(),
                None => None,
            };
            let message = said
                .as_ref()
                .and_then(|s| s.message.clone())
                .unwrap_or_default();
            // The API server could not open the stream to the container at all.
            if message.contains("unable to upgrade connection") {
                return Err(FeedError::NotStarted(message));
            }
            Err(FeedError::Unconfirmed(if message.is_empty() {
                why
            } else {
                format!("{why}: {message}")
            }))
        }
        Err(other) => Err(other),
    }
}

/// Reads the runner's output after `seen` until it holds the envelope (the runner's last line;
/// the code cannot write to the runner's stdout, so the first complete envelope is the one) or
/// the stream ends: `None` when it ended without one, or when more than `most` bytes came (what a
/// log read takes at most, returned files included: the log then decides, as for any run).
/// Waiting for the end of the stream instead would add the sandbox's teardown to every call.
async fn until_envelope(
    stdout: &mut (impl tokio::io::AsyncRead + Unpin),
    mut seen: Vec<u8>,
    most: usize,
) -> Option<String> {
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if seen.ends_with(b"\n") {
            let text = String::from_utf8_lossy(&seen);
            if parse_envelope(&text).is_ok() {
                return Some(text.into_owned());
            }
        }
        match stdout.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                let text = String::from_utf8_lossy(&seen).into_owned();
                return parse_envelope(&text).is_ok().then_some(text);
            }
            Ok(n) => seen.extend_from_slice(&chunk[..n]),
        }
        if seen.len() > most {
            return None;
        }
    }
}

/// Reads the stream until the runner's confirmation of `bytes` bytes; returns what it read (the
/// confirmation and whatever the runner printed after it in the same reads).
async fn confirmation(
    stdout: &mut (impl tokio::io::AsyncRead + Unpin),
    bytes: usize,
) -> Result<Vec<u8>, FeedError> {
    let expected = format!("{PROGRAM_RECEIVED} {bytes}");
    let mut seen = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let n = stdout.read(&mut chunk).await?;
        if n == 0 {
            return Err(FeedError::Unconfirmed("the stream ended".into()));
        }
        seen.extend_from_slice(&chunk[..n]);
        if String::from_utf8_lossy(&seen)
            .lines()
            .any(|l| l.trim_end() == expected)
        {
            return Ok(seen);
        }
        // The confirmation is the runner's first line; anything long without it is not ours.
        if seen.len() > CONFIRMATION_WITHIN_BYTES {
            return Err(FeedError::Unconfirmed("unexpected output".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unconfirmed_attach_is_tried_again_a_few_times_then_left_to_the_reconcile() {
        let unconfirmed = || Err(FeedError::Unconfirmed("nothing within 2s".into()));
        let early = Duration::from_secs(1);
        assert_eq!(after_attempt(&Ok(()), 0, early), Then::Fed);
        assert_eq!(
            after_attempt(&unconfirmed(), 0, early),
            Then::AttachAgain(Duration::ZERO)
        );
        assert_eq!(
            after_attempt(&unconfirmed(), EARLY_UNCONFIRMED_TRIES - 2, early),
            Then::AttachAgain(Duration::ZERO)
        );
        assert_eq!(
            after_attempt(&unconfirmed(), EARLY_UNCONFIRMED_TRIES - 1, early),
            Then::GiveUp
        );
        // A container not started yet: tried again after a tenth of the wait so far, never
        // sooner than 100 ms nor later than 500 ms, then given up.
        let not_started = || Err(FeedError::NotStarted("container not found".into()));
        let again =
            |waited_ms| match after_attempt(&not_started(), 0, Duration::from_millis(waited_ms)) {
                Then::AttachAgain(after) => after.as_millis(),
                other => panic!("{other:?}"),
            };
        assert_eq!(again(300), 100);
        assert_eq!(again(1_000), 100);
        assert_eq!(again(2_500), 250);
        assert_eq!(again(8_000), 500);
        assert_eq!(again(60_000), 500);
        assert_eq!(after_attempt(&not_started(), 0, START_WITHIN), Then::GiveUp);
        assert_eq!(after_attempt(&unconfirmed(), 0, START_WITHIN), Then::GiveUp);
        // A stream that broke while the program was written: the reconcile decides.
        let broken = Err(FeedError::Stream(std::io::Error::other("reset")));
        assert_eq!(after_attempt(&broken, 0, early), Then::GiveUp);
    }

    #[test]
    fn the_first_attach_waits_for_part_of_the_quickest_recent_start() {
        let times = StartTimes::default();
        assert_eq!(times.first_attach_after(), Duration::ZERO, "none known yet");
        times.record(Duration::from_millis(1500));
        times.record(Duration::from_millis(1000));
        times.record(Duration::from_millis(2500));
        assert_eq!(times.first_attach_after(), Duration::from_millis(700));
        // Only the latest are kept: a quick start long ago stops counting.
        for _ in 0..START_TIMES_KEPT {
            times.record(Duration::from_millis(2000));
        }
        assert_eq!(times.first_attach_after(), Duration::from_millis(1400));
    }

    fn answer() -> Answer {
        Answer {
            log: "ok\n".into(),
            exit_code: 0,
            sent_at: jiff::Timestamp::now(),
            read_at: jiff::Timestamp::now(),
        }
    }

    #[tokio::test]
    async fn an_answer_is_kept_and_its_run_reconciled_only_for_a_program_that_was_fed() {
        use futures::StreamExt as _;
        let feeds = Feeds::default();
        let run = |name: &str| ObjectRef::<SandboxRun>::new(name).within("ns");
        let mut wakeups = Box::pin(feeds.wakeups());
        // Not confirmed yet, or ended (forgotten): nothing kept, nobody woken.
        feeds.set("feeding", Some(FeedState::Feeding));
        assert!(!feeds.answered(run("feeding"), "feeding", answer()));
        assert!(!feeds.answered(run("ended"), "ended", answer()));
        assert_eq!(feeds.state("feeding"), Some(FeedState::Feeding));
        assert_eq!(feeds.state("ended"), None);
        // Confirmed: kept, and the run reconciled.
        feeds.set("fed", Some(FeedState::Fed));
        assert!(feeds.answered(run("fed"), "fed", answer()));
        assert_eq!(feeds.answer("fed").unwrap().log, "ok\n");
        assert_eq!(wakeups.next().await, Some(run("fed")));
        // Once: a second answer changes nothing.
        assert!(!feeds.answered(run("fed"), "fed", answer()));
        feeds.forget("fed");
        assert_eq!(feeds.answer("fed"), None);
        let more = tokio::time::timeout(Duration::from_millis(50), wakeups.next()).await;
        assert!(more.is_err(), "{more:?}");
    }

    #[test]
    fn a_log_names_the_program_it_confirmed_and_holds_its_result_once_ended() {
        let confirmed = format!("{PROGRAM_RECEIVED} 8\n");
        assert_eq!(in_log(String::new(), 8), InLog::Nothing);
        assert_eq!(in_log(confirmed.clone(), 8), InLog::Received);
        // Another program's length, or the confirmation not first: not this program's.
        assert_eq!(in_log(confirmed.clone(), 9), InLog::Nothing);
        let late = format!("{}\n{confirmed}", "x".repeat(CONFIRMATION_WITHIN_BYTES));
        assert_eq!(in_log(late, 8), InLog::Nothing);
        // After what the interpreter wrote to stderr first: found.
        let warned = format!("a warning\n{confirmed}");
        assert_eq!(in_log(warned, 8), InLog::Received);
        let envelope =
            serde_json::to_string(&sandboxrun_core::runner::fixtures::envelope(0)).unwrap();
        let ended = format!("{confirmed}{envelope}\n");
        assert_eq!(in_log(ended.clone(), 8), InLog::Result(ended));
    }

    #[tokio::test]
    async fn the_confirmation_must_name_the_whole_program() {
        let mut ok = &b"sandboxrun-program-received 12\n"[..];
        confirmation(&mut ok, 12).await.unwrap();
        // Split across reads.
        let (mut r, mut w) = tokio::io::simplex(4);
        let writer = tokio::spawn(async move {
            w.write_all(b"sandboxrun-program-received 7\n")
                .await
                .unwrap();
        });
        confirmation(&mut r, 7).await.unwrap();
        writer.await.unwrap();
        // Another size, nothing, or noise: not confirmed.
        let mut short = &b"sandboxrun-program-received 11\n"[..];
        assert!(confirmation(&mut short, 12).await.is_err());
        let mut empty = &b""[..];
        assert!(confirmation(&mut empty, 1).await.is_err());
        let noise = vec![b'x'; 5000];
        assert!(confirmation(&mut &noise[..], 1).await.is_err());
    }

    #[test]
    fn the_frame_carries_the_input_files_and_the_caps() {
        let owned = OwnedProgram {
            code: "print(open('/tmp/inputs/a.csv').read())".into(),
            inputs: vec![InputFile {
                name: "a.csv".into(),
                content: b"x,y\n".to_vec(),
            }],
            outputs: FileCaps {
                max_files: 2,
                max_bytes: 4096,
            },
        };
        let limits = Limits {
            timeout_seconds: 7,
            output_bytes: 100,
            ..Limits::default()
        };
        let frame = program_frame(&owned.program(), &limits);
        let header = format!("{} 7 100 13 2 4096\n", owned.code.len());
        assert!(frame.starts_with(header.as_bytes()), "{frame:?}");
        assert!(frame.ends_with(b"5 4\na.csvx,y\n"), "{frame:?}");
        // The code travels nowhere but in the frame, right after the header.
        assert_eq!(
            &frame[header.len()..header.len() + owned.code.len()],
            owned.code.as_bytes()
        );
    }

    #[tokio::test]
    async fn an_envelope_with_files_is_read_whole_within_the_bound() {
        let data = "QUFB".repeat(100_000);
        let envelope = format!(
            "{{\"sandboxrun\":1,\"exitCode\":0,\"stdout\":\"\",\"stderr\":\"\",\"stdoutTruncated\":false,\"stderrTruncated\":false,\"signal\":null,\"oomKill\":null,\"timedOut\":false,\"files\":[{{\"name\":\"a.bin\",\"size\":300000,\"data\":\"{data}\"}}]}}\n"
        );
        let most = usize::try_from(log_limit_bytes(&Limits::default())).unwrap();
        let read = until_envelope(&mut envelope.as_bytes(), Vec::new(), most).await;
        let read = read.expect("the envelope");
        assert_eq!(parse_envelope(&read).unwrap().files[0].data.len(), 400_000);
        // Past the bound the stream is left to the log.
        assert_eq!(
            until_envelope(&mut envelope.as_bytes(), Vec::new(), 1000).await,
            None
        );
    }
}

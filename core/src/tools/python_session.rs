//! `run_python`'s sessions: the `session` argument, and the sessions of an embedded server (this
//! process's local sandboxes, one per session, kept between calls).
//!
//! A session belongs to the agent that opened it: another agent naming it gets the answer an
//! unknown id gets. Its calls run one at a time (its sandbox is locked for the length of a call).
//! It ends when it is closed (`close_session`; a call running in it is stopped), when a call ends it (a timeout, code that ends
//! the interpreter), when a call on it is cancelled (its interpreter is killed: a call cannot be
//! stopped otherwise), after its policy's idle timeout without a call, and at its policy's
//! longest lifetime; its sandbox is killed and removed then. The bounds are the deciding rule's
//! `python.sessions`, as recorded in the decision of the call that opened it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::files::Profile;
use crate::limits::{Limits, MAX_OUTPUT_BYTES, MAX_TIMEOUT_SECONDS};
use crate::local::{LocalSandbox, LocalSession};
use crate::policy::{SessionRules, SessionUse};

/// The `session` argument of `run_python`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum SessionArg {
    /// `"new"`: open a session and run the call in it.
    New,
    /// The id of an open session of the caller's.
    Named(String),
}

/// The argument that opens a session.
pub const NEW_SESSION: &str = "new";

impl SessionArg {
    /// `"new"`, or a session id: a lowercase DNS label (what a session's name is in a cluster).
    pub fn parse(value: &str) -> Result<Self, String> {
        if value == NEW_SESSION {
            return Ok(Self::New);
        }
        let label = (1..=63).contains(&value.len())
            && value
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !value.starts_with('-')
            && !value.ends_with('-');
        if label {
            Ok(Self::Named(value.to_owned()))
        } else {
            Err(format!(
                "argument `session` is {:?}; pass \"new\" to start a session, or the `session` id \
                 an earlier result returned",
                value.chars().take(80).collect::<String>()
            ))
        }
    }

    /// How policy sees the call's use of a session.
    pub fn usage(&self) -> SessionUse {
        match self {
            Self::New => SessionUse::Open,
            Self::Named(_) => SessionUse::Continue,
        }
    }
}

impl TryFrom<String> for SessionArg {
    type Error = String;

    fn try_from(value: String) -> Result<Self, String> {
        Self::parse(&value)
    }
}

/// The answer to a session id that is not one of the caller's open sessions, whoever asks and
/// whatever the reason (unknown, another agent's, ended): the same words, so an id reveals
/// nothing about sessions of others.
pub fn not_found(id: &str) -> String {
    format!(
        "there is no open session {id} of yours (it may have ended: idle too long, closed, or \
         ended by a call); pass session \"new\" to start one"
    )
}

/// The sessions of an embedded server.
#[derive(Debug, Default)]
pub struct Sessions {
    map: Arc<Mutex<HashMap<String, Arc<Slot>>>>,
    sweeping: AtomicBool,
}

/// One open session.
#[derive(Debug)]
pub struct Slot {
    agent: String,
    profile: Profile,
    rules: SessionRules,
    opened: Instant,
    last_call: Mutex<Instant>,
    /// The sandbox; `None` once the session ended. Locked for the length of a call.
    sandbox: tokio::sync::Mutex<Option<LocalSession>>,
    /// Set when the session is being ended (closed, expired): a call in it stops.
    ending: AtomicBool,
    /// Wakes a call waiting in the session when `ending` is set.
    ended: tokio::sync::Notify,
}

impl Slot {
    /// The session's profile.
    pub fn profile(&self) -> Profile {
        self.profile
    }

    /// Its sandbox, locked for one call: `None` when the session has ended.
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, Option<LocalSession>> {
        self.sandbox.lock().await
    }

    /// Runs `call` unless the session is ended first (closed while it runs): `None` then, and
    /// the caller drops the sandbox, which kills the code.
    pub async fn unless_ended<T>(&self, call: impl std::future::Future<Output = T>) -> Option<T> {
        let ended = self.ended.notified();
        tokio::pin!(ended);
        // Registered before the flag is read: an end between the two still wakes it.
        ended.as_mut().enable();
        if self.ending.load(Ordering::SeqCst) {
            return None;
        }
        tokio::select! {
            out = call => Some(out),
            () = ended => None,
        }
    }

    /// Marks the session as ending and stops a call running in it.
    fn stop(&self) {
        self.ending.store(true, Ordering::SeqCst);
        self.ended.notify_waiters();
    }

    /// Records a call's end: the idle timeout counts from here.
    pub fn touch(&self) {
        *self.last_call.lock().expect("not poisoned") = Instant::now();
    }

    fn expired(&self, now: Instant) -> bool {
        let last = *self.last_call.lock().expect("not poisoned");
        now.duration_since(last) >= Duration::from_secs(self.rules.idle_timeout_seconds.into())
            || now.duration_since(self.opened)
                >= Duration::from_secs(self.rules.max_lifetime_seconds.into())
    }
}

/// The limits a session's sandbox starts with: the opening call's cpu, memory and pids (fixed
/// for its life), and the largest timeout and output cap (each call's own come with it).
pub fn session_limits(opening: &Limits) -> Limits {
    Limits {
        timeout_seconds: MAX_TIMEOUT_SECONDS,
        output_bytes: MAX_OUTPUT_BYTES,
        ..opening.clone()
    }
}

impl Sessions {
    /// Opens a session of `profile` for `agent` within `rules` (from the opening call's
    /// decision): its id and slot, or why not (the agent holds as many as `rules` allow, or the
    /// sandbox could not start).
    pub fn open(
        &self,
        agent: &str,
        profile: Profile,
        limits: &Limits,
        rules: SessionRules,
        sandbox: &LocalSandbox,
    ) -> Result<(String, Arc<Slot>), OpenError> {
        self.sweep();
        let held = self.held_by(agent);
        if held >= rules.max_per_agent as usize {
            return Err(OpenError::Limit(format!(
                "agent {agent} holds {held} open sessions, the most policy allows at once: close \
                 one with close_session, or call without `session`"
            )));
        }
        let local = sandbox
            .open_session(profile, &session_limits(limits))
            .map_err(|e| OpenError::Unavailable(format!("the session's sandbox: {e}")))?;
        let id = new_id();
        let now = Instant::now();
        let slot = Arc::new(Slot {
            agent: agent.to_owned(),
            profile,
            rules,
            opened: now,
            last_call: Mutex::new(now),
            sandbox: tokio::sync::Mutex::new(Some(local)),
            ending: AtomicBool::new(false),
            ended: tokio::sync::Notify::new(),
        });
        self.map
            .lock()
            .expect("not poisoned")
            .insert(id.clone(), Arc::clone(&slot));
        self.start_sweeping();
        tracing::info!(session = %id, agent, %profile, "session opened");
        Ok((id, slot))
    }

    /// The open session `id` of `agent`; `None` for an unknown id, another agent's session, or
    /// one that ended.
    pub fn find(&self, agent: &str, id: &str) -> Option<Arc<Slot>> {
        self.sweep();
        let map = self.map.lock().expect("not poisoned");
        map.get(id).filter(|slot| slot.agent == agent).cloned()
    }

    /// Ends the session `id` of `agent`: `Err` with [`not_found`]'s words when it is none of
    /// theirs. A call running in it is stopped with it.
    pub async fn close(&self, agent: &str, id: &str) -> Result<(), String> {
        let slot = {
            let mut map = self.map.lock().expect("not poisoned");
            match map.get(id) {
                Some(slot) if slot.agent == agent => map.remove(id),
                _ => None,
            }
        };
        let Some(slot) = slot else {
            return Err(not_found(id));
        };
        tracing::info!(session = %id, agent, "session closed");
        end(slot).await;
        Ok(())
    }

    /// Forgets `id` (its session ended with a call).
    pub fn forget(&self, id: &str) {
        self.map.lock().expect("not poisoned").remove(id);
    }

    /// How many open sessions `agent` holds.
    pub fn held_by(&self, agent: &str) -> usize {
        let map = self.map.lock().expect("not poisoned");
        map.values().filter(|slot| slot.agent == agent).count()
    }

    /// Ends the sessions that are idle past their timeout or past their lifetime (not those in
    /// a call: they are looked at again once it ends).
    fn sweep(&self) {
        sweep(&self.map);
    }

    /// Sweeps once a second in the background, from the first session on.
    fn start_sweeping(&self) {
        if self.sweeping.swap(true, Ordering::SeqCst) {
            return;
        }
        let map = Arc::downgrade(&self.map);
        tokio::spawn(sweep_every_second(map));
    }
}

/// Why a session could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// The agent holds as many sessions as policy allows.
    Limit(String),
    /// Its sandbox could not start.
    Unavailable(String),
}

async fn sweep_every_second(map: Weak<Mutex<HashMap<String, Arc<Slot>>>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(map) = map.upgrade() else { return };
        sweep(&map);
    }
}

fn sweep(map: &Mutex<HashMap<String, Arc<Slot>>>) {
    let now = Instant::now();
    let ended: Vec<(String, Arc<Slot>)> = {
        let mut map = map.lock().expect("not poisoned");
        let gone: Vec<String> = map
            .iter()
            .filter(|(_, slot)| {
                // In a call (locked): not idle; its end is looked at after the call.
                match slot.sandbox.try_lock() {
                    Ok(sandbox) => sandbox.is_none() || slot.expired(now),
                    Err(_) => false,
                }
            })
            .map(|(id, _)| id.clone())
            .collect();
        gone.into_iter()
            .filter_map(|id| map.remove(&id).map(|slot| (id, slot)))
            .collect()
    };
    for (id, slot) in ended {
        tracing::info!(session = %id, agent = %slot.agent, "session ended (idle timeout or lifetime)");
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(end(slot));
        }
    }
}

/// Closes a session's sandbox; a call running in it is stopped first.
async fn end(slot: Arc<Slot>) {
    slot.stop();
    let local = slot.sandbox.lock().await.take();
    if let Some(local) = local {
        local.close().await;
    }
}

/// A session id: `sbs-` and a random UUID's 32 hex digits (unguessable, and a valid Kubernetes
/// name).
fn new_id() -> String {
    format!("sbs-{}", uuid::Uuid::new_v4().simple())
}

/// The name of the tool that ends a session.
pub const CLOSE_TOOL: &str = "close_session";

/// Arguments of `close_session` (its `inputSchema`).
#[derive(Debug, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[schemars(transform = crate::schema::portable)]
pub struct CloseSessionArgs {
    /// The id of one of your open sessions, as run_python returned it in `session`.
    #[schemars(length(min = 1, max = 63))]
    pub session: String,
}

/// What `close_session` returns (its `outputSchema`).
#[derive(Debug, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[schemars(transform = crate::schema::portable)]
pub struct CloseSessionOutput {
    /// The session that was closed.
    pub session: String,
    /// Always true: a session that could not be closed is an error result instead.
    pub closed: bool,
}

/// The `session` argument of a `close_session` call: an id (not `"new"`), or what to fix.
pub fn parse_close_args(
    args: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, String> {
    use super::args::{json_kind, unknown_argument};
    if let Some(unknown) = unknown_argument(args, &["session"]) {
        return Err(format!(
            "unknown argument `{unknown}`; close_session accepts `session` (the id run_python \
             returned)"
        ));
    }
    match args.get("session") {
        Some(serde_json::Value::String(id)) => match SessionArg::parse(id)? {
            SessionArg::Named(id) => Ok(id),
            SessionArg::New => Err(
                "argument `session` names the session to close: the id run_python returned in \
                 `session`, not \"new\""
                    .to_owned(),
            ),
        },
        None | Some(serde_json::Value::Null) => Err(
            "missing required argument `session`: the id run_python returned in `session`"
                .to_owned(),
        ),
        Some(other) => Err(format!(
            "argument `session` must be a session id string, not {}",
            json_kind(other)
        )),
    }
}

/// What a model reads about `close_session`.
pub const CLOSE_DESCRIPTION: &str = "End a Python session that run_python started with \
session \"new\": its sandbox and everything in it (variables, files) are destroyed. Sessions \
also end on their own after a while without calls; close one as soon as you are done with it.";

/// `close_session`'s part of the server's instructions.
pub const CLOSE_INSTRUCTIONS: &str = "close_session ends a run_python session (argument \
`session`: its id) and destroys its sandbox.";

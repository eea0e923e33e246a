//! `SandboxSession`: an agent's state kept between python calls, in one sandbox only that agent
//! uses. Each call is still a SandboxRun, whose `spec.python.session` names the session; the
//! session holds what lives longer than a call (its sandbox Pod, its interpreter, its files) and
//! ends when it is closed (deleted), when no call came for `idleTimeoutSeconds`, or at
//! `maxLifetimeSeconds` from its start.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::SignedDuration;
use kube::{CustomResource, KubeSchema};
use sandboxrun_core::Environment;
use sandboxrun_core::files::Profile;
use sandboxrun_core::policy::{
    DEFAULT_SESSION_IDLE_SECONDS, MAX_SESSION_IDLE_SECONDS, MAX_SESSION_LIFETIME_SECONDS,
    MIN_SESSION_IDLE_SECONDS, MIN_SESSION_LIFETIME_SECONDS,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::run::LimitsSpec;

/// CEL on the spec: an idle timeout past the lifetime would never fire, so it is refused rather
/// than silently ignored (as policy refuses it in a rule's `python.sessions`).
const IDLE_WITHIN_LIFETIME_RULE: &str = "!has(self.idleTimeoutSeconds) || \
self.idleTimeoutSeconds <= (has(self.maxLifetimeSeconds) ? self.maxLifetimeSeconds : 3600)";

/// CEL on the status: a session's end is final and its sandbox Pod, once recorded, stays its
/// own. A status write can commit after its answer was lost; a late write of an older status
/// must not bring an ended session back to life or give it a second Pod.
pub const SESSION_STATUS_FORWARD_RULE: &str = "(!has(oldSelf.phase) || oldSelf.phase != 'Ended' \
|| (has(self.phase) && self.phase == 'Ended')) \
&& (!has(oldSelf.podName) || (has(self.podName) && self.podName == oldSelf.podName))";

/// State kept between one agent's python calls. Its spec is immutable: to change it, close the
/// session and open another.
// Clippy reads the repeated `type_ = ...` inside separate printcolumn(...) groups as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "sandboxrun.dev",
    version = "v1alpha1",
    kind = "SandboxSession",
    plural = "sandboxsessions",
    shortname = "sbs",
    // No category: `sandboxrun` is the SandboxRun's, and a category shared with another kind
    // would make `kubectl get sandboxrun NAME` ambiguous.
    namespaced,
    status = "SandboxSessionStatus",
    doc = "An agent's state kept between python calls, in a sandbox only that agent uses",
    printcolumn(name = "Agent", type_ = "string", json_path = ".spec.agent"),
    printcolumn(name = "Profile", type_ = "string", json_path = ".spec.profile"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Calls", type_ = "integer", json_path = ".status.calls"),
    printcolumn(
        name = "Last Call",
        type_ = "date",
        json_path = ".status.lastCallTime"
    ),
    printcolumn(name = "Expires", type_ = "date", json_path = ".status.expiryTime"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("the spec of a SandboxSession is immutable: close it and open another"))]
#[x_kube(validation = kube::core::Rule::new(IDLE_WITHIN_LIFETIME_RULE).message("idleTimeoutSeconds must not exceed maxLifetimeSeconds (default 3600): a session cannot stay idle longer than it may live"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxSessionSpec {
    /// Identity of the agent the session belongs to, set by the frontend from the caller's
    /// credentials (bound by the admission policy for direct creators): 1 to 253 ASCII letters,
    /// digits and . _ : @ + | / # = -, starting with a letter or digit. Only runs of the same
    /// agent may use the session.
    #[schemars(
        length(min = 1, max = 253),
        pattern(sandboxrun_core::AGENT_NAME_PATTERN)
    )]
    pub agent: String,

    /// Environment the session's calls target: sandbox (default), staging or production. Each
    /// call is judged by policy in it.
    #[serde(default)]
    pub environment: Environment,

    /// The sandbox image: `minimal` (the standard library only; the default) or `data` (numpy,
    /// pandas, scipy, matplotlib). Every call of the session runs with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,

    /// Resource limits of the session's sandbox (cpu, memory, pids hold for its whole life;
    /// timeout and output cap are each call's); every field has a default.
    #[serde(default)]
    pub limits: LimitsSpec,

    /// Seconds without a call after which the session ends (its sandbox is deleted): 10 to
    /// 3600, default 600, at most `maxLifetimeSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_SESSION_IDLE_SECONDS, max = MAX_SESSION_IDLE_SECONDS))]
    pub idle_timeout_seconds: Option<u32>,

    /// Seconds from its start after which the session ends, whatever it does: 60 to 3600,
    /// default 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_SESSION_LIFETIME_SECONDS, max = MAX_SESSION_LIFETIME_SECONDS))]
    pub max_lifetime_seconds: Option<u32>,
}

impl SandboxSessionSpec {
    /// The session's sandbox profile (`minimal` when none is set).
    pub fn sandbox_profile(&self) -> Profile {
        self.profile.unwrap_or_default()
    }

    /// The effective idle timeout in seconds: the one set (default 600), within its bounds and
    /// at most the effective lifetime (the schema refuses anything else; an object that
    /// bypassed validation is still held to them).
    pub fn idle_timeout(&self) -> u32 {
        self.idle_timeout_seconds
            .unwrap_or(DEFAULT_SESSION_IDLE_SECONDS)
            .clamp(MIN_SESSION_IDLE_SECONDS, MAX_SESSION_IDLE_SECONDS)
            .min(self.max_lifetime())
    }

    /// The effective longest life in seconds: the one set (default 3600), within its bounds.
    pub fn max_lifetime(&self) -> u32 {
        self.max_lifetime_seconds
            .unwrap_or(MAX_SESSION_LIFETIME_SECONDS)
            .clamp(MIN_SESSION_LIFETIME_SECONDS, MAX_SESSION_LIFETIME_SECONDS)
    }

    /// When a session that started at `start` and was last active at `last_activity` (its last
    /// call's end, or its start) ends if nothing else happens: the earlier of the idle timeout
    /// after its last activity and its longest life after its start.
    pub fn expiry_time(&self, start: &Time, last_activity: &Time) -> Time {
        let idle = last_activity
            .0
            .saturating_add(SignedDuration::from_secs(self.idle_timeout().into()))
            .unwrap_or(last_activity.0);
        let lifetime = start
            .0
            .saturating_add(SignedDuration::from_secs(self.max_lifetime().into()))
            .unwrap_or(start.0);
        Time(idle.min(lifetime))
    }
}

/// Where a session is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SessionPhase {
    /// Its sandbox is starting.
    Pending,
    /// Idle: its sandbox waits for a call.
    Ready,
    /// A call runs in it.
    Busy,
    /// It ended (`endReason` says why) and its sandbox is gone or going; final.
    Ended,
}

impl SessionPhase {
    /// The phase as the status writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Ready => "Ready",
            Self::Busy => "Busy",
            Self::Ended => "Ended",
        }
    }
}

/// Why a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SessionEndReason {
    /// It was closed (the `close_session` tool, `kubectl sandboxrun sessions close`).
    Closed,
    /// No call came for `idleTimeoutSeconds`.
    IdleTimeout,
    /// It reached `maxLifetimeSeconds` from its start.
    MaxLifetime,
    /// A call's code ended the interpreter (exited, or was killed).
    InterpreterExited,
    /// Its sandbox Pod disappeared or failed.
    SandboxLost,
    /// It was refused before it started (policy, or no sandbox could be given to it).
    Rejected,
    /// A call was cancelled (or its run deleted) while it ran: its code could not be stopped
    /// but with the interpreter.
    CallCancelled,
}

/// What the operator last saw of a session. Absent fields are unknown or not applicable yet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(SESSION_STATUS_FORWARD_RULE).message("a session's status only moves forward: an ended session stays ended and its recorded sandbox Pod stays its own"))]
pub struct SandboxSessionStatus {
    /// Where the session is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SessionPhase>,
    /// Name of the session's sandbox Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// Calls run in the session so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<u64>,
    /// When the last call ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_call_time: Option<Time>,
    /// The run whose call holds the session now (phase `Busy`): calls run one at a time, and a
    /// run takes the session only with a write conditional on the status it read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_run: Option<String>,
    /// That run's uid (a run of the same name created later is another run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_run_uid: Option<String>,
    /// When that run took the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_since: Option<Time>,
    /// When the session's sandbox was ready for its first call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the session ends if nothing else happens: the earlier of its last activity plus
    /// `idleTimeoutSeconds` and its start plus `maxLifetimeSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry_time: Option<Time>,
    /// Why the session ended (with phase `Ended`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<SessionEndReason>,
    /// Human-readable explanation of the current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Kubernetes conditions with reasons and observedGeneration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl SandboxSessionStatus {
    /// Whether the session has ended.
    pub fn ended(&self) -> bool {
        self.phase == Some(SessionPhase::Ended)
    }
}

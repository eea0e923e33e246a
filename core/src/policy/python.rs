//! A rule's `python` section: which sandbox profiles its calls may use, how many files they may
//! pass in and get back, and whether they may keep state between calls in a session.
//!
//! ```yaml
//! python:
//!   profiles: [minimal, data]   # default: [minimal]
//!   maxInputFiles: 5            # default and most: crate::files::MAX_INPUT_FILES
//!   maxInputBytes: 65536        # default and most: crate::files::MAX_INPUT_BYTES
//!   maxOutputFiles: 5           # default and most: crate::files::MAX_OUTPUT_FILES
//!   maxOutputBytes: 131072      # default and most: crate::files::MAX_OUTPUT_BYTES
//!   sessions:                   # absent: the rule's calls may not open or use sessions
//!     maxPerAgent: 3            # open sessions one agent may hold at once: 1 to 20, default 3
//!     maxLifetimeSeconds: 3600  # longest a session lives from its start: 60 to 3600 (default)
//!     idleTimeoutSeconds: 600   # a session with no call for this long ends: 10 to 3600,
//!                               # default 600, and not above maxLifetimeSeconds
//! ```

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{CallContext, Rule};
use crate::files::{
    FileCaps, MAX_INPUT_BYTES, MAX_INPUT_FILES, MAX_OUTPUT_BYTES, MAX_OUTPUT_FILES, Profile,
};
use crate::model::Tool;

/// Default of [`SessionRules::max_per_agent`].
pub const DEFAULT_SESSIONS_PER_AGENT: u32 = 3;
/// Most open sessions a rule may let one agent hold at once.
pub const MAX_SESSIONS_PER_AGENT: u32 = 20;
/// Default, and most, of [`SessionRules::max_lifetime_seconds`]: an hour.
pub const MAX_SESSION_LIFETIME_SECONDS: u32 = 3_600;
/// Least [`SessionRules::max_lifetime_seconds`] a rule may set.
pub const MIN_SESSION_LIFETIME_SECONDS: u32 = 60;
/// Default of [`SessionRules::idle_timeout_seconds`]: ten minutes.
pub const DEFAULT_SESSION_IDLE_SECONDS: u32 = 600;
/// Most [`SessionRules::idle_timeout_seconds`] a rule may set.
pub const MAX_SESSION_IDLE_SECONDS: u32 = 3_600;
/// Least [`SessionRules::idle_timeout_seconds`] a rule may set.
pub const MIN_SESSION_IDLE_SECONDS: u32 = 10;

/// What a `python` call asks for beyond its limits: its profile, its input files and its session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PythonRequest {
    /// The sandbox profile.
    pub profile: Profile,
    /// How many input files it passes.
    pub input_files: u32,
    /// How many bytes they hold together.
    pub input_bytes: u64,
    /// How the call uses a session (absent: it runs in a fresh sandbox of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionUse>,
}

/// How a python call uses a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SessionUse {
    /// The call starts a new session (`session: "new"`) and runs in it.
    Open,
    /// The call runs in a session the agent opened before.
    Continue,
}

/// A rule's `python.sessions` section: its calls may keep state between calls in a session, within
/// these bounds (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionRules {
    /// Most open sessions one agent may hold at once.
    #[serde(default = "default_sessions_per_agent")]
    pub max_per_agent: u32,
    /// Longest a session may live from its start, in seconds.
    #[serde(default = "default_session_lifetime")]
    pub max_lifetime_seconds: u32,
    /// Seconds without a call after which a session ends.
    #[serde(default = "default_session_idle")]
    pub idle_timeout_seconds: u32,
}

fn default_sessions_per_agent() -> u32 {
    DEFAULT_SESSIONS_PER_AGENT
}
fn default_session_lifetime() -> u32 {
    MAX_SESSION_LIFETIME_SECONDS
}
fn default_session_idle() -> u32 {
    DEFAULT_SESSION_IDLE_SECONDS
}

impl Default for SessionRules {
    fn default() -> Self {
        Self {
            max_per_agent: DEFAULT_SESSIONS_PER_AGENT,
            max_lifetime_seconds: MAX_SESSION_LIFETIME_SECONDS,
            idle_timeout_seconds: DEFAULT_SESSION_IDLE_SECONDS,
        }
    }
}

impl SessionRules {
    /// Checks each bound, and that a session can go idle for as long as it may live at most.
    pub fn validate(&self) -> Result<(), String> {
        let within = |what: &str, value: u32, min: u32, max: u32| {
            if value > max {
                Some(format!(
                    "python.sessions.{what} is {value}; the most allowed is {max}"
                ))
            } else if value < min {
                Some(format!(
                    "python.sessions.{what} is {value}; the least allowed is {min}"
                ))
            } else {
                None
            }
        };
        let problem = within("maxPerAgent", self.max_per_agent, 1, MAX_SESSIONS_PER_AGENT)
            .or_else(|| {
                within(
                    "maxLifetimeSeconds",
                    self.max_lifetime_seconds,
                    MIN_SESSION_LIFETIME_SECONDS,
                    MAX_SESSION_LIFETIME_SECONDS,
                )
            })
            .or_else(|| {
                within(
                    "idleTimeoutSeconds",
                    self.idle_timeout_seconds,
                    MIN_SESSION_IDLE_SECONDS,
                    MAX_SESSION_IDLE_SECONDS,
                )
            })
            .or_else(|| {
                // An idle timeout past the lifetime would never fire: a sign the operator meant
                // something else, so it is refused rather than silently ignored.
                (self.idle_timeout_seconds > self.max_lifetime_seconds).then(|| {
                    format!(
                        "python.sessions.idleTimeoutSeconds is {}, above maxLifetimeSeconds {}: a \
                     session cannot stay idle longer than it may live",
                        self.idle_timeout_seconds, self.max_lifetime_seconds
                    )
                })
            });
        problem.map_or(Ok(()), Err)
    }
}

fn minimal() -> Vec<Profile> {
    vec![Profile::Minimal]
}

/// A rule's `python` section (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PythonRules {
    /// The profiles the rule's calls may use.
    #[serde(default = "minimal")]
    pub profiles: Vec<Profile>,
    /// Most input files per call.
    #[serde(default = "max_input_files")]
    pub max_input_files: u32,
    /// Most input bytes per call, all files together.
    #[serde(default = "max_input_bytes")]
    pub max_input_bytes: u64,
    /// Most files returned per call.
    #[serde(default = "max_output_files")]
    pub max_output_files: u32,
    /// Most bytes returned per call, all files together.
    #[serde(default = "max_output_bytes")]
    pub max_output_bytes: u64,
    /// Whether, and within which bounds, the rule's calls may use sessions (absent: they may
    /// not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<SessionRules>,
}

fn max_input_files() -> u32 {
    MAX_INPUT_FILES
}
fn max_input_bytes() -> u64 {
    MAX_INPUT_BYTES
}
fn max_output_files() -> u32 {
    MAX_OUTPUT_FILES
}
fn max_output_bytes() -> u64 {
    MAX_OUTPUT_BYTES
}

impl Default for PythonRules {
    fn default() -> Self {
        Self {
            profiles: minimal(),
            max_input_files: MAX_INPUT_FILES,
            max_input_bytes: MAX_INPUT_BYTES,
            max_output_files: MAX_OUTPUT_FILES,
            max_output_bytes: MAX_OUTPUT_BYTES,
            sessions: None,
        }
    }
}

impl PythonRules {
    /// Checks the bounds against the global maxima.
    pub fn validate(&self) -> Result<(), String> {
        if self.profiles.is_empty() {
            return Err("python.profiles is empty; list minimal and/or data".to_owned());
        }
        let over = |what: &str, value: u64, max: u64| {
            (value > max).then(|| format!("python.{what} is {value}; the most allowed is {max}"))
        };
        let problem = over(
            "maxInputFiles",
            self.max_input_files.into(),
            MAX_INPUT_FILES.into(),
        )
        .or_else(|| over("maxInputBytes", self.max_input_bytes, MAX_INPUT_BYTES))
        .or_else(|| {
            over(
                "maxOutputFiles",
                self.max_output_files.into(),
                MAX_OUTPUT_FILES.into(),
            )
        })
        .or_else(|| over("maxOutputBytes", self.max_output_bytes, MAX_OUTPUT_BYTES));
        if let Some(problem) = problem {
            return Err(problem);
        }
        self.sessions
            .as_ref()
            .map_or(Ok(()), SessionRules::validate)
    }

    /// The bounds on the files a call returns.
    pub fn output_caps(&self) -> FileCaps {
        FileCaps {
            max_files: self.max_output_files,
            max_bytes: self.max_output_bytes,
        }
        .clamped()
    }
}

/// Why `rule` (or, with none, the defaults) refuses the profile, the input files or the session of
/// a python `call`; `None` when it does not, or the call is not a python call.
pub(super) fn refusal(rule: Option<&Rule>, call: &CallContext) -> Option<String> {
    if call.tool != Tool::Python {
        return None;
    }
    let request = call.python.clone().unwrap_or_default();
    let defaults = PythonRules::default();
    let rules = rule.and_then(|r| r.python.as_ref()).unwrap_or(&defaults);
    let by = rule.map_or_else(
        || "the policy default".to_owned(),
        |r| format!("rule {}", r.name),
    );
    if !rules.profiles.contains(&request.profile) {
        let allowed: Vec<&str> = rules.profiles.iter().map(|p| p.as_str()).collect();
        return Some(format!(
            "the {} profile is not allowed by {by}: use profile {} (or ask an operator for a \
             rule whose python.profiles includes {})",
            request.profile,
            allowed.join(" or "),
            request.profile
        ));
    }
    if request.input_files > rules.max_input_files {
        return Some(format!(
            "{} input files were passed; {by} allows at most {}: pass fewer, or combine them",
            request.input_files, rules.max_input_files
        ));
    }
    if request.input_bytes > rules.max_input_bytes {
        return Some(format!(
            "the input files hold {} bytes; {by} allows at most {} bytes together: pass less \
             data, or a sample of it",
            request.input_bytes, rules.max_input_bytes
        ));
    }
    if request.session.is_some() && rules.sessions.is_none() {
        return Some(format!(
            "sessions are not allowed by {by}: call run_python without session (each call then \
             runs in a fresh sandbox), or ask an operator for a rule with a python.sessions \
             section"
        ));
    }
    None
}

/// The session bounds a python `call` that uses a session runs under: the deciding `rule`'s
/// `python.sessions` (`None` for a call without a session, or when the rule has none, in which
/// case [`refusal`] refused the call).
pub(super) fn session_rules(rule: &Rule, call: &CallContext) -> Option<SessionRules> {
    let uses_session = call
        .python
        .as_ref()
        .is_some_and(|request| request.session.is_some());
    if call.tool != Tool::Python || !uses_session {
        return None;
    }
    rule.python.as_ref().and_then(|python| python.sessions)
}

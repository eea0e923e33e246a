//! The policy engine: which agent may use which tool in which environment, with which limits,
//! and (for SQL) which databases, tables and columns.
//!
//! A policy is a YAML file (see `config/policy/policy.yaml`) of agent `groups`, an ordered list
//! of `rules` and a `default` verdict. **Rules are evaluated top to bottom and the first rule that
//! matches the call's agent, tool and environment decides**; later rules are not consulted. When
//! no rule matches, the `default` verdict applies (`block` unless the file says otherwise), and
//! the reason says so.
//!
//! For an SQL call that the matching rule allows or escalates, the SQL guard
//! ([`crate::sql::guard`]) then checks the query against the rule's `sql` settings; a violation
//! turns the decision into `Block` with the rule `<rule>/sql-guard` and the guard's reason, and an
//! accepted query comes back rewritten (with its `LIMIT`) in [`Decision::rewritten_query`].
//!
//! For a `python` call, the matching rule's `python` section ([`PythonRules`]) bounds the
//! profiles and files, and says whether the call may open or use a session (state kept between
//! calls in a sandbox only that agent uses):
//!
//! ```yaml
//! python:
//!   profiles: [minimal, data]
//!   sessions:                   # absent: no sessions under this rule
//!     maxPerAgent: 3            # open sessions one agent may hold at once (1 to 20)
//!     maxLifetimeSeconds: 3600  # longest a session lives from its start (60 to 3600)
//!     idleTimeoutSeconds: 600   # a session with no call this long ends (10 to 3600, at most
//!                               # maxLifetimeSeconds)
//! ```
//!
//! A call that uses a session under a rule without `python.sessions` (or under the default,
//! which has none) is blocked; an allowed one carries the rule's bounds in
//! [`Decision::sessions`].
//!
//! Unknown fields anywhere in the file are errors, so a typo can never silently weaken policy;
//! a malformed file is refused with the line, the column and the problem.

pub mod embedded;
mod file;
mod python;
mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::files::FileCaps;
use crate::limits::{
    self, DEFAULT_MEMORY, MAX_MEMORY, MAX_OUTPUT_BYTES, MAX_TIMEOUT_SECONDS, MIN_MEMORY,
    MIN_OUTPUT_BYTES, MIN_TIMEOUT_SECONDS,
};
use crate::metrics::scope::MetricsRules;
use crate::model::{Environment, Tool, Verdict};
use crate::quantity::memory_bytes;
use crate::sql::{self, SqlDialect, SqlRules};

pub use file::LimitOverrides;
pub use python::{
    DEFAULT_SESSION_IDLE_SECONDS, DEFAULT_SESSIONS_PER_AGENT, MAX_SESSION_IDLE_SECONDS,
    MAX_SESSION_LIFETIME_SECONDS, MAX_SESSIONS_PER_AGENT, MIN_SESSION_IDLE_SECONDS,
    MIN_SESSION_LIFETIME_SECONDS, PythonRequest, PythonRules, SessionRules, SessionUse,
};
pub use store::PolicyStore;

/// Row cap of a query when neither the rule nor the call sets one.
pub const DEFAULT_ROWS: u64 = 1_000;
/// Largest row cap a rule may set.
pub const MAX_ROWS: u64 = sql::MAX_LIMIT;
/// The rule name reported when no rule matched.
pub const DEFAULT_RULE: &str = "default";

/// Why a policy file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("cannot read policy file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed or does not fit the policy format (unknown field, wrong type).
    #[error("policy {origin} is malformed at line {line}, column {column}: {message}")]
    Syntax {
        /// The file name, or `<string>`.
        origin: String,
        /// 1-based line of the problem (0 when the parser gave none).
        line: u64,
        /// 1-based column of the problem (0 when the parser gave none).
        column: u64,
        /// The problem.
        message: String,
    },
    /// The YAML is well-formed but the policy is inconsistent (unknown group, limits above the
    /// maxima, duplicate rule names, ...).
    #[error("policy {origin} is invalid: {message}")]
    Invalid {
        /// The file name, or `<string>`.
        origin: String,
        /// The problem, naming the rule and its line.
        message: String,
    },
}

/// Who matches a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
enum AgentMatch {
    /// Every agent (`*`).
    Any,
    /// One agent by name.
    Name(String),
    /// The members of a group (`group:NAME`).
    Group(String),
}

/// One validated rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// The rule's unique name, reported in decisions.
    pub name: String,
    /// The line of the rule in its file (0 when unknown).
    pub line: u64,
    agents: Vec<AgentMatch>,
    /// `None`: every tool.
    tools: Option<Vec<Tool>>,
    /// `None`: every environment.
    environments: Option<Vec<Environment>>,
    /// What the rule decides.
    pub verdict: Verdict,
    /// The operator's explanation, used as the decision's reason.
    pub reason: Option<String>,
    /// Ceilings on the limits of matching calls.
    pub limits: LimitOverrides,
    /// SQL settings, for rules that can match `sql` calls.
    pub sql: Option<SqlRules>,
    /// What metrics queries may read, for rules that can match `metrics` calls (absent: any
    /// metric, and embedded only the caller's own calls).
    pub metrics: Option<MetricsRules>,
    /// Sandbox profiles and file bounds, for rules that can match `python` calls (absent: the
    /// minimal profile and the global file bounds).
    pub python: Option<PythonRules>,
}

impl Rule {
    fn matches(&self, call: &CallContext, groups: &BTreeMap<String, BTreeSet<String>>) -> bool {
        let agent_ok = self.agents.iter().any(|m| match m {
            AgentMatch::Any => true,
            AgentMatch::Name(n) => *n == call.agent,
            AgentMatch::Group(g) => groups
                .get(g)
                .is_some_and(|members| members.contains(&call.agent)),
        });
        agent_ok
            && self.tools.as_ref().is_none_or(|t| t.contains(&call.tool))
            && self
                .environments
                .as_ref()
                .is_none_or(|e| e.contains(&call.environment))
    }

    fn covers_tool(&self, tool: Tool) -> bool {
        self.tools.as_ref().is_none_or(|t| t.contains(&tool))
    }
}

/// A validated policy, ready to judge calls.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    default: Verdict,
    groups: BTreeMap<String, BTreeSet<String>>,
    rules: Vec<Rule>,
}

/// An SQL query an agent wants to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SqlRequest {
    /// The configured database name.
    pub database: String,
    /// The query text as the agent sent it.
    pub query: String,
    /// The dialect of that database.
    #[serde(default)]
    pub dialect: SqlDialect,
    /// A read of what queries may read in the database (its schema resource), not a query:
    /// `query` is then empty and judged by no guard.
    #[serde(default)]
    pub schema: bool,
}

/// Everything policy looks at to judge one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallContext {
    /// The calling agent's identity (from its credentials, never from its input).
    pub agent: String,
    /// The tool called.
    pub tool: Tool,
    /// The targeted environment.
    pub environment: Environment,
    /// The query, for `sql` calls.
    pub sql: Option<SqlRequest>,
    /// The limits the call asks for (defaults filled in).
    pub limits: limits::Limits,
    /// The row cap the call asks for, if any.
    pub rows: Option<u64>,
    /// For `python` calls: the profile, the input files and the session asked for (absent: the
    /// minimal profile, no files, no session).
    #[serde(default)]
    pub python: Option<PythonRequest>,
}

impl CallContext {
    /// A call with default limits and no query.
    pub fn new(agent: impl Into<String>, tool: Tool, environment: Environment) -> Self {
        Self {
            agent: agent.into(),
            tool,
            environment,
            sql: None,
            limits: limits::Limits::default(),
            rows: None,
            python: None,
        }
    }

    /// The same call, judged in the environment of what it reaches (a database, a Prometheus)
    /// when that one is more sensitive than the environment the call names: a caller can raise
    /// the bar by naming a stricter environment, never lower it by naming a laxer one. Every
    /// tool's context builder (`tools::sql::call_context`, `tools::metrics::call_context`) binds
    /// its target through this one function.
    pub fn reaching(mut self, target: Environment) -> Self {
        self.environment = self.environment.max(target);
        self
    }

    /// The same call carrying a query for `database` (PostgreSQL dialect).
    pub fn with_sql(mut self, database: impl Into<String>, query: impl Into<String>) -> Self {
        self.sql = Some(SqlRequest {
            database: database.into(),
            query: query.into(),
            dialect: SqlDialect::Postgres,
            schema: false,
        });
        self
    }

    /// The same call reading the schema of `database`: what its queries may read there.
    pub fn with_schema_read(mut self, database: impl Into<String>) -> Self {
        self.sql = Some(SqlRequest {
            database: database.into(),
            query: String::new(),
            dialect: SqlDialect::Postgres,
            schema: true,
        });
        self
    }
}

/// What policy decided about one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Allow, block or escalate.
    pub verdict: Verdict,
    /// The rule that decided: a rule name, `<rule>/sql-guard`, or `default`.
    pub rule: String,
    /// Why, in words a person and a model can act on.
    pub reason: String,
    /// The limits the run gets: the requested ones, lowered to the rule's ceilings.
    pub limits: limits::Limits,
    /// The row cap of the run. For `sql`: the most rows the result keeps (the rule's cap, or the
    /// smaller LIMIT the query asked for).
    pub max_rows: u64,
    /// For an allowed or escalated `sql` call: the checked query to execute, with its LIMIT at
    /// most one row above `max_rows` (that row, when it exists, marks the result truncated).
    pub rewritten_query: Option<String>,
    /// For a `metrics` call: the deciding rule's `metrics` section (what the query may read);
    /// `None` when no rule decided or the rule has none (any metric; embedded, own calls only).
    #[serde(default)]
    pub metrics: Option<MetricsRules>,
    /// For a `python` call: the bounds on the files it returns (the rule's, or the global ones).
    #[serde(default)]
    pub files: FileCaps,
    /// For an allowed schema read ([`SqlRequest::schema`]): the deciding rule's `sql` settings,
    /// what the read shows (the tables and columns queries may read, the row cap).
    #[serde(default)]
    pub schema: Option<SqlRules>,
    /// For an allowed or escalated `python` call that uses a session
    /// ([`PythonRequest::session`]): the deciding rule's `python.sessions`, the bounds the caller
    /// enforces (how many sessions the agent may hold, how long one lives) from this record
    /// rather than from a second judgement. `None` for every other call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<SessionRules>,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} by {}: {}",
            self.verdict.as_str(),
            self.rule,
            self.reason
        )
    }
}

impl Policy {
    /// A policy with no rules that blocks everything.
    pub fn deny_all() -> Self {
        Self {
            default: Verdict::Block,
            groups: BTreeMap::new(),
            rules: Vec::new(),
        }
    }

    /// Parses and validates a policy from YAML text; `origin` names it in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, PolicyError> {
        file::parse(text, origin)
    }

    /// Reads, parses and validates a policy file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// The verdict when no rule matches.
    pub fn default_verdict(&self) -> Verdict {
        self.default
    }

    /// The rules, in evaluation order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The members of each agent group.
    pub fn groups(&self) -> &BTreeMap<String, BTreeSet<String>> {
        &self.groups
    }

    /// Judges one call: the first matching rule decides, then (for SQL) the SQL guard checks the
    /// query against that rule's settings.
    pub fn evaluate(&self, call: &CallContext) -> Decision {
        let who = format!(
            "agent {} calling {} in {}",
            call.agent,
            call.tool,
            call.environment.as_str()
        );
        let Some(rule) = self.rules.iter().find(|r| r.matches(call, &self.groups)) else {
            let mut decision = Decision {
                verdict: self.default,
                rule: DEFAULT_RULE.to_owned(),
                reason: format!(
                    "no policy rule matches {who}; the policy default is {}",
                    self.default.as_str()
                ),
                limits: call.limits.clamped(),
                max_rows: call.rows.unwrap_or(DEFAULT_ROWS).min(DEFAULT_ROWS),
                rewritten_query: None,
                schema: None,
                metrics: None,
                files: FileCaps::default(),
                // The defaults have no sessions: a call that uses one is refused below.
                sessions: None,
            };
            if self.default == Verdict::Block {
                decision
                    .reason
                    .push_str(": ask an operator for a rule that covers this call");
            } else if let Some(why) = python::refusal(None, call) {
                decision.verdict = Verdict::Block;
                decision.reason = why;
            } else if call.tool == Tool::Sql {
                decision.verdict = Verdict::Block;
                decision.reason.push_str(
                    ", but SQL needs a rule with sql settings (databases, tables, columns) to check the query: ask an operator to add one",
                );
            }
            return decision;
        };
        let reason = rule.reason.clone().unwrap_or_else(|| {
            format!(
                "rule {} says {} for {who}",
                rule.name,
                rule.verdict.as_str()
            )
        });
        let (limits, max_rows, lowered) = effective_limits(rule, call);
        let mut decision = Decision {
            verdict: rule.verdict,
            rule: rule.name.clone(),
            reason,
            limits,
            max_rows,
            rewritten_query: None,
            schema: None,
            metrics: rule.metrics.clone(),
            files: rule
                .python
                .as_ref()
                .map_or_else(FileCaps::default, PythonRules::output_caps),
            sessions: None,
        };
        if rule.verdict == Verdict::Block {
            return decision;
        }
        if call.tool == Tool::Python
            && let Some(why) = python::refusal(Some(rule), call)
        {
            decision.verdict = Verdict::Block;
            decision.rule = format!("{}/python", rule.name);
            decision.reason = why;
            return decision;
        }
        decision.sessions = python::session_rules(rule, call);
        if !lowered.is_empty() {
            decision.reason = format!(
                "{} (limits lowered by rule {}: {})",
                decision.reason,
                rule.name,
                lowered.join(", ")
            );
        }
        if call.tool == Tool::Sql {
            let guard_rule = format!("{}/sql-guard", rule.name);
            let block = |reason: String| Decision {
                verdict: Verdict::Block,
                rule: guard_rule.clone(),
                reason,
                limits: decision.limits.clone(),
                max_rows,
                rewritten_query: None,
                schema: None,
                metrics: None,
                files: FileCaps::default(),
                sessions: None,
            };
            let Some(request) = &call.sql else {
                return block(
                    "an execute_sql call needs a database and a query: send both".to_owned(),
                );
            };
            let Some(sql_rules) = &rule.sql else {
                return block(format!(
                    "rule {} has no sql settings (databases, tables, columns), so no query can be checked: ask an operator to add an sql section",
                    rule.name
                ));
            };
            if !sql_rules.allows_database(&request.database) {
                return block(format!(
                    "the database {} is not allowed by rule {}: use one of {}",
                    request.database,
                    rule.name,
                    sql_rules.databases.join(", ")
                ));
            }
            let capped;
            let effective_rules = if sql_rules.max_limit > max_rows {
                capped = SqlRules {
                    max_limit: max_rows.max(1),
                    ..sql_rules.clone()
                };
                &capped
            } else {
                sql_rules
            };
            if request.schema {
                // Reading what a rule lets queries read is not reading data: a rule that
                // escalates its queries to a person still shows its tables, so the model can
                // write a query worth a person's time.
                decision.verdict = Verdict::Allow;
                if rule.verdict == Verdict::Escalate {
                    decision.reason = format!(
                        "{} (the schema is shown; each query under rule {} needs a person's approval)",
                        decision.reason, rule.name
                    );
                }
                decision.schema = Some(effective_rules.clone());
                return decision;
            }
            if let Err(violation) = sql::guard(&request.query, request.dialect, effective_rules) {
                return block(violation.message_for_rule(&rule.name));
            }
            // The query runs with a LIMIT one row above the cap and the executor keeps at most
            // `max_rows` (the cap, or the smaller LIMIT asked for): a result cut off at the cap
            // is then flagged `truncated` instead of looking complete. (Checked above with the
            // cap itself, so that the guard's messages name the real cap.)
            let probe = SqlRules {
                max_limit: effective_rules.max_limit.saturating_add(1),
                ..effective_rules.clone()
            };
            match sql::guard(&request.query, request.dialect, &probe) {
                Ok(guarded) => {
                    decision.max_rows = guarded.limit.min(effective_rules.max_limit);
                    decision.rewritten_query = Some(guarded.sql);
                }
                Err(violation) => return block(violation.message_for_rule(&rule.name)),
            }
        }
        decision
    }
}

/// The requested limits lowered to the rule's ceilings, the row cap, and what was lowered.
fn effective_limits(rule: &Rule, call: &CallContext) -> (limits::Limits, u64, Vec<String>) {
    let mut lowered = Vec::new();
    let mut limits = call.limits.clamped();
    let ceilings = &rule.limits;
    if let Some(max) = ceilings.timeout_seconds
        && limits.timeout_seconds > max
    {
        lowered.push(format!("timeoutSeconds {} → {max}", limits.timeout_seconds));
        limits.timeout_seconds = max;
    }
    if let Some(max) = ceilings.output_bytes
        && limits.output_bytes > max
    {
        lowered.push(format!("outputBytes {} → {max}", limits.output_bytes));
        limits.output_bytes = max;
    }
    let max_memory = ceilings.memory.as_deref().unwrap_or(MAX_MEMORY);
    let ceiling_bytes = memory_bytes(max_memory).unwrap_or(0);
    match memory_bytes(&limits.memory) {
        Some(bytes) if bytes <= ceiling_bytes => {}
        Some(_) => {
            lowered.push(format!("memory {} → {max_memory}", limits.memory));
            limits.memory = max_memory.to_owned();
        }
        None => {
            let fallback = if memory_bytes(DEFAULT_MEMORY).unwrap_or(0) <= ceiling_bytes {
                DEFAULT_MEMORY
            } else {
                max_memory
            };
            lowered.push(format!("memory {:?} → {fallback}", limits.memory));
            limits.memory = fallback.to_owned();
        }
    }
    let row_ceiling = ceilings.rows.unwrap_or(DEFAULT_ROWS);
    let rows = match call.rows {
        Some(r) if r > row_ceiling => {
            lowered.push(format!("rows {r} → {row_ceiling}"));
            row_ceiling
        }
        Some(r) => r,
        None => row_ceiling,
    };
    (limits, rows, lowered)
}

/// The checks every rule's limit ceilings must pass at load time.
fn validate_limits(l: &LimitOverrides) -> Result<(), String> {
    if let Some(t) = l.timeout_seconds
        && !(MIN_TIMEOUT_SECONDS..=MAX_TIMEOUT_SECONDS).contains(&t)
    {
        return Err(format!(
            "limits.timeoutSeconds is {t}: it must be between {MIN_TIMEOUT_SECONDS} and {MAX_TIMEOUT_SECONDS}"
        ));
    }
    if let Some(o) = l.output_bytes
        && !(MIN_OUTPUT_BYTES..=MAX_OUTPUT_BYTES).contains(&o)
    {
        return Err(format!(
            "limits.outputBytes is {o}: it must be between {MIN_OUTPUT_BYTES} and {MAX_OUTPUT_BYTES}"
        ));
    }
    if let Some(m) = &l.memory {
        let Some(bytes) = memory_bytes(m) else {
            return Err(format!(
                "limits.memory is {m:?}: write a quantity such as 256Mi or 1Gi"
            ));
        };
        let min = memory_bytes(MIN_MEMORY).unwrap_or(0);
        let max = memory_bytes(MAX_MEMORY).unwrap_or(u64::MAX);
        if bytes < min || bytes > max {
            return Err(format!(
                "limits.memory is {m}: it must be between {MIN_MEMORY} and {MAX_MEMORY}"
            ));
        }
    }
    if let Some(r) = l.rows
        && !(1..=MAX_ROWS).contains(&r)
    {
        return Err(format!(
            "limits.rows is {r}: it must be between 1 and {MAX_ROWS}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

//! The policy file format (YAML, read with serde-saphyr) and its validation into a [`Policy`].

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::{AgentMatch, Policy, PolicyError, PythonRules, Rule, validate_limits};
use crate::metrics::scope::MetricsRules;
use crate::model::{Environment, Tool, Verdict};
use crate::sql::SqlRules;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PolicyFile {
    /// The verdict when no rule matches; block when absent.
    #[serde(default)]
    default: Option<VerdictSpec>,
    /// Agent groups: name → member agent names.
    #[serde(default)]
    groups: BTreeMap<String, Vec<String>>,
    /// The rules, evaluated in order; the first match decides.
    #[serde(default)]
    rules: Vec<RuleSpec>,
}

/// A verdict as written in the file.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum VerdictSpec {
    Allow,
    Block,
    Escalate,
}

impl From<VerdictSpec> for Verdict {
    fn from(v: VerdictSpec) -> Self {
        match v {
            VerdictSpec::Allow => Verdict::Allow,
            VerdictSpec::Block => Verdict::Block,
            VerdictSpec::Escalate => Verdict::Escalate,
        }
    }
}

/// A tool as written in a rule: a tool name or `*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ToolSpec {
    #[serde(rename = "*")]
    Any,
    Python,
    Sql,
    Metrics,
}

/// An environment as written in a rule: a name or `*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum EnvironmentSpec {
    #[serde(rename = "*")]
    Any,
    Sandbox,
    Staging,
    Production,
}

fn any() -> Vec<String> {
    vec!["*".to_owned()]
}

fn any_tool() -> Vec<ToolSpec> {
    vec![ToolSpec::Any]
}

fn any_environment() -> Vec<EnvironmentSpec> {
    vec![EnvironmentSpec::Any]
}

/// One rule as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RuleSpec {
    name: Spanned<String>,
    /// Agent names, `group:NAME`, or `*`; every agent when absent.
    #[serde(default = "any")]
    agents: Vec<String>,
    /// Tools (`python`, `sql`, `metrics`) or `*`; every tool when absent.
    #[serde(default = "any_tool")]
    tools: Vec<ToolSpec>,
    /// Environments (`sandbox`, `staging`, `production`) or `*`; every one when absent.
    #[serde(default = "any_environment")]
    environments: Vec<EnvironmentSpec>,
    verdict: VerdictSpec,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    limits: LimitOverrides,
    #[serde(default)]
    sql: Option<SqlRules>,
    #[serde(default)]
    metrics: Option<MetricsRules>,
    #[serde(default)]
    python: Option<PythonRules>,
}

/// Ceilings a rule puts on the limits of the calls it matches; each must lie within the global
/// maxima of [`crate::limits`] (checked when the policy is loaded).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitOverrides {
    /// Largest wall-clock budget, in seconds.
    #[serde(default)]
    pub timeout_seconds: Option<u32>,
    /// Largest memory limit, as a Kubernetes quantity (`256Mi`).
    #[serde(default)]
    pub memory: Option<String>,
    /// Largest cap on each of stdout and stderr, in bytes.
    #[serde(default)]
    pub output_bytes: Option<u32>,
    /// Largest number of rows a query returns.
    #[serde(default)]
    pub rows: Option<u64>,
}

pub(super) fn parse(text: &str, origin: &str) -> Result<Policy, PolicyError> {
    let file: PolicyFile = serde_saphyr::from_str(text).map_err(|e| {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        PolicyError::Syntax {
            origin: origin.to_owned(),
            line,
            column,
            message: bare_message(&e, line, column),
        }
    })?;
    validate(file).map_err(|message| PolicyError::Invalid {
        origin: origin.to_owned(),
        message,
    })
}

/// The parser's message without the source snippet and without the location prefix (the
/// error carries line and column separately), so it fits on one log line.
fn bare_message(e: &serde_saphyr::Error, line: u64, column: u64) -> String {
    let text = e.without_snippet().to_string();
    let text = text.trim();
    let text = text.strip_prefix("error: ").unwrap_or(text);
    let text = text
        .strip_prefix(&format!("line {line} column {column}: "))
        .unwrap_or(text);
    let text = text.lines().next().unwrap_or_default();
    text.strip_suffix(&format!(" at line {line}, column {column}"))
        .unwrap_or(text)
        .to_owned()
}

fn validate(file: PolicyFile) -> Result<Policy, String> {
    let mut groups = BTreeMap::new();
    for (name, members) in file.groups {
        if name.trim().is_empty() || name.contains(':') || name == "*" {
            return Err(format!(
                "the group name {name:?} is not usable: use letters, digits and dashes"
            ));
        }
        let members: BTreeSet<String> = members.into_iter().collect();
        groups.insert(name, members);
    }
    let mut names = BTreeSet::new();
    let mut rules = Vec::new();
    for spec in file.rules {
        let line = spec.name.referenced.line();
        let name = spec.name.value.clone();
        let at = format!("rule {name:?} (line {line})");
        if name.trim().is_empty() || name.contains('/') {
            return Err(format!("{at}: a rule needs a non-empty name without '/'"));
        }
        if !names.insert(name.clone()) {
            return Err(format!("{at}: another rule has the same name"));
        }
        let mut agents = Vec::new();
        if spec.agents.is_empty() {
            return Err(format!(
                "{at}: agents is empty; list agents, group:NAME, or \"*\""
            ));
        }
        for agent in &spec.agents {
            agents.push(if agent == "*" {
                AgentMatch::Any
            } else if let Some(group) = agent.strip_prefix("group:") {
                if !groups.contains_key(group) {
                    return Err(format!(
                        "{at}: agents names the unknown group {group:?} (known groups: {})",
                        groups.keys().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
                AgentMatch::Group(group.to_owned())
            } else if agent.trim().is_empty() {
                return Err(format!("{at}: agents contains an empty name"));
            } else {
                AgentMatch::Name(agent.clone())
            });
        }
        if spec.tools.is_empty() {
            return Err(format!("{at}: tools is empty; list tools or \"*\""));
        }
        let tools = (!spec.tools.contains(&ToolSpec::Any)).then(|| {
            spec.tools
                .iter()
                .filter_map(|t| match t {
                    ToolSpec::Any => None,
                    ToolSpec::Python => Some(Tool::Python),
                    ToolSpec::Sql => Some(Tool::Sql),
                    ToolSpec::Metrics => Some(Tool::Metrics),
                })
                .collect::<Vec<_>>()
        });
        if spec.environments.is_empty() {
            return Err(format!(
                "{at}: environments is empty; list environments or \"*\""
            ));
        }
        let environments = (!spec.environments.contains(&EnvironmentSpec::Any)).then(|| {
            spec.environments
                .iter()
                .filter_map(|e| match e {
                    EnvironmentSpec::Any => None,
                    EnvironmentSpec::Sandbox => Some(Environment::Sandbox),
                    EnvironmentSpec::Staging => Some(Environment::Staging),
                    EnvironmentSpec::Production => Some(Environment::Production),
                })
                .collect::<Vec<_>>()
        });
        validate_limits(&spec.limits).map_err(|e| format!("{at}: {e}"))?;
        let verdict = Verdict::from(spec.verdict);
        let rule = Rule {
            name,
            line,
            agents,
            tools,
            environments,
            verdict,
            reason: spec.reason,
            limits: spec.limits,
            sql: spec.sql,
            metrics: spec.metrics,
            python: spec.python,
        };
        if let Some(python) = &rule.python {
            if !rule.covers_tool(Tool::Python) {
                return Err(format!(
                    "{at}: has a python section but its tools do not include python"
                ));
            }
            python.validate().map_err(|e| format!("{at}: {e}"))?;
        }
        if let Some(metrics) = &rule.metrics {
            if !rule.covers_tool(Tool::Metrics) {
                return Err(format!(
                    "{at}: has a metrics section but its tools do not include metrics"
                ));
            }
            metrics.validate().map_err(|e| format!("{at}: {e}"))?;
        }
        match &rule.sql {
            Some(sql) => {
                if !rule.covers_tool(Tool::Sql) {
                    return Err(format!(
                        "{at}: has an sql section but its tools do not include sql"
                    ));
                }
                sql.validate().map_err(|e| format!("{at}: {e}"))?;
            }
            None if verdict != Verdict::Block && rule.covers_tool(Tool::Sql) => {
                return Err(format!(
                    "{at}: it can {} sql calls but has no sql section; add sql.databases and sql.tables (or exclude sql from its tools)",
                    verdict.as_str()
                ));
            }
            None => {}
        }
        rules.push(rule);
    }
    Ok(Policy {
        default: file.default.map_or(Verdict::Block, Verdict::from),
        groups,
        rules,
    })
}

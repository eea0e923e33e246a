//! What an OAuth access token lets its bearer do: the token's scopes, mapped to tools and
//! environments by the scope map (`--oauth-scopes-file`, else [`ScopeMap::default`]). The HTTP
//! layer turns a verified token into a [`Grant`]; the call pipeline refuses a call whose tool or
//! environment the grant does not cover, naming the scope that would. The caller chooses a
//! call's tool and environment, so what it may choose is bound to its credential here, the way
//! an API key's entry binds its environments.

use std::sync::Arc;

use sandboxrun_core::{Environment, Tool};
use serde::Deserialize;

/// What one scope grants.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct ScopeEntry {
    /// MCP tool names (`run_python`, `execute_sql`, `fetch_metrics`).
    #[serde(default)]
    tools: Vec<String>,
    /// Environments beyond `sandbox`, which every granted tool may target.
    #[serde(default)]
    environments: Vec<Environment>,
}

/// Scope name to what it grants, in the order configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeMap {
    entries: Vec<(String, Vec<Tool>, Vec<Environment>)>,
}

impl Default for ScopeMap {
    /// `sandboxrun:<tool>` for each tool, `sandboxrun:staging` and `sandboxrun:production` for
    /// the environments past the sandbox.
    fn default() -> Self {
        let mut entries: Vec<_> = Tool::ALL
            .into_iter()
            .map(|t| (format!("sandboxrun:{}", t.mcp_name()), vec![t], vec![]))
            .collect();
        for e in [Environment::Staging, Environment::Production] {
            entries.push((format!("sandboxrun:{}", e.as_str()), vec![], vec![e]));
        }
        Self { entries }
    }
}

impl ScopeMap {
    /// Parses a scope file: a YAML map of scope name to `{tools: [...], environments: [...]}`.
    /// `source` only labels errors.
    pub fn parse(yaml: &str, source: &str) -> Result<Self, String> {
        let raw: ordered::OrderedMap = serde_saphyr::from_str(yaml).map_err(|e| {
            format!("{source} is not a YAML map of scope name to {{tools, environments}}: {e}")
        })?;
        let mut entries = Vec::new();
        for (scope, entry) in raw.0 {
            if scope.is_empty()
                || scope
                    .chars()
                    .any(|c| c.is_whitespace() || c == '"' || c == '\\')
            {
                return Err(format!(
                    "{source}: scope {scope:?} is not a valid OAuth scope (no spaces, quotes or \
                     backslashes)"
                ));
            }
            let mut tools = Vec::new();
            for name in &entry.tools {
                let tool = Tool::ALL
                    .into_iter()
                    .find(|t| t.mcp_name() == name)
                    .ok_or_else(|| {
                        let known: Vec<&str> = Tool::ALL.iter().map(|t| t.mcp_name()).collect();
                        format!(
                            "{source}: scope {scope} names the tool {name:?}; the tools are {}",
                            known.join(", ")
                        )
                    })?;
                tools.push(tool);
            }
            if tools.is_empty() && entry.environments.is_empty() {
                return Err(format!(
                    "{source}: scope {scope} grants nothing: list tools, environments or both"
                ));
            }
            entries.push((scope, tools, entry.environments));
        }
        if !entries.iter().any(|(_, tools, _)| !tools.is_empty()) {
            return Err(format!(
                "{source}: no scope grants a tool, so no token could call anything"
            ));
        }
        Ok(Self { entries })
    }

    /// Every scope this server knows, for the protected resource metadata.
    pub fn scopes(&self) -> Vec<&str> {
        self.entries.iter().map(|(s, _, _)| s.as_str()).collect()
    }

    /// The scopes that grant a tool: what a client should ask for.
    pub fn tool_scopes(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(_, tools, _)| !tools.is_empty())
            .map(|(s, _, _)| s.as_str())
            .collect()
    }

    /// What a token holding `scopes` may do. Scopes this server does not know are ignored.
    pub fn grant<'a>(self: &Arc<Self>, scopes: impl IntoIterator<Item = &'a str>) -> Grant {
        let mut tools = Vec::new();
        let mut environments = vec![Environment::Sandbox];
        for scope in scopes {
            for (name, t, e) in &self.entries {
                if name == scope {
                    for t in t {
                        if !tools.contains(t) {
                            tools.push(*t);
                        }
                    }
                    for e in e {
                        if !environments.contains(e) {
                            environments.push(*e);
                        }
                    }
                }
            }
        }
        tools.sort_by_key(|t| Tool::ALL.iter().position(|a| a == t));
        Grant {
            tools,
            environments,
            map: self.clone(),
        }
    }

    fn granting(&self, wanted: impl Fn(&[Tool], &[Environment]) -> bool) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(_, t, e)| wanted(t, e))
            .map(|(s, _, _)| s.as_str())
            .collect()
    }
}

/// A token's tools and environments. Put into the request by the HTTP layer; a request without
/// one (an API key, stdio) is bound by its key entry instead.
#[derive(Clone, Debug)]
pub struct Grant {
    tools: Vec<Tool>,
    environments: Vec<Environment>,
    map: Arc<ScopeMap>,
}

impl Grant {
    /// Whether the token may call any tool at all.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Whether the token may call `tool`.
    pub fn allows(&self, tool: Tool) -> bool {
        self.tools.contains(&tool)
    }

    /// Why `agent` may not call `tool` with this grant, if it may not: a message naming the
    /// scope that would allow it.
    pub fn tool_refusal(&self, agent: &str, tool: Tool) -> Option<String> {
        if self.allows(tool) {
            return None;
        }
        let scopes = self.map.granting(|t, _| t.contains(&tool));
        let granted: Vec<&str> = self.tools.iter().map(|t| t.mcp_name()).collect();
        Some(format!(
            "agent {agent} may not call {}: its access token lacks the scope {}; authorize again \
             asking for it, or use a tool the token grants ({})",
            tool.mcp_name(),
            or_none(&scopes),
            granted.join(", ")
        ))
    }

    /// Why `agent` may not target `environment` with this grant, if it may not.
    pub fn environment_refusal(&self, agent: &str, environment: Environment) -> Option<String> {
        if self.environments.contains(&environment) {
            return None;
        }
        let scopes = self.map.granting(|_, e| e.contains(&environment));
        let allowed: Vec<&str> = self.environments.iter().map(|e| e.as_str()).collect();
        Some(format!(
            "agent {agent} may not target the {environment} environment: its access token lacks \
             the scope {} and allows only {}; call again with one of those, or authorize again \
             asking for that scope",
            or_none(&scopes),
            allowed.join(", ")
        ))
    }

    /// Both checks: the tool, then the environment.
    #[cfg(test)]
    fn refusal(&self, agent: &str, tool: Tool, environment: Environment) -> Option<String> {
        self.tool_refusal(agent, tool)
            .or_else(|| self.environment_refusal(agent, environment))
    }
}

fn or_none(scopes: &[&str]) -> String {
    if scopes.is_empty() {
        "(none is configured)".to_owned()
    } else {
        scopes.join(" or ")
    }
}

/// A YAML map read in document order (serde's maps would sort or hash it away).
mod ordered {
    use super::ScopeEntry;
    use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

    pub struct OrderedMap(pub Vec<(String, ScopeEntry)>);

    impl<'de> Deserialize<'de> for OrderedMap {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = OrderedMap;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a map of scope name to {tools, environments}")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedMap, A::Error> {
                    let mut out: Vec<(String, ScopeEntry)> = Vec::new();
                    while let Some((k, v)) = map.next_entry::<String, ScopeEntry>()? {
                        if out.iter().any(|(s, _)| *s == k) {
                            return Err(serde::de::Error::custom(format!(
                                "the scope {k} is listed twice"
                            )));
                        }
                        out.push((k, v));
                    }
                    Ok(OrderedMap(out))
                }
            }
            d.deserialize_map(V)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_map_grants_a_tool_per_scope_and_environments_past_the_sandbox() {
        let map = Arc::new(ScopeMap::default());
        assert_eq!(
            map.scopes(),
            [
                "sandboxrun:run_python",
                "sandboxrun:execute_sql",
                "sandboxrun:fetch_metrics",
                "sandboxrun:staging",
                "sandboxrun:production"
            ]
        );
        assert_eq!(map.tool_scopes().len(), 3);
        let g = map.grant(["sandboxrun:run_python", "openid", "sandboxrun:staging"]);
        assert_eq!(g.refusal("a", Tool::Python, Environment::Sandbox), None);
        assert_eq!(g.refusal("a", Tool::Python, Environment::Staging), None);
        let e = g
            .refusal("a", Tool::Python, Environment::Production)
            .unwrap();
        assert!(e.contains("sandboxrun:production"), "{e}");
        let e = g.refusal("a", Tool::Sql, Environment::Sandbox).unwrap();
        assert!(
            e.contains("may not call execute_sql") && e.contains("sandboxrun:execute_sql"),
            "{e}"
        );
        // Environment scopes alone grant no tool.
        assert!(map.grant(["sandboxrun:production"]).is_empty());
        assert!(map.grant([]).is_empty());
    }

    #[test]
    fn a_scope_file_is_checked_entry_by_entry() {
        let map = ScopeMap::parse(
            "mcp:tools: {tools: [run_python, execute_sql]}\nmcp:prod: {environments: [production]}\n",
            "f",
        )
        .unwrap();
        assert_eq!(map.scopes(), ["mcp:tools", "mcp:prod"]);
        let map = Arc::new(map);
        let g = map.grant(["mcp:tools"]);
        assert_eq!(g.refusal("a", Tool::Sql, Environment::Sandbox), None);
        let e = g.refusal("a", Tool::Metrics, Environment::Sandbox).unwrap();
        assert!(e.contains("(none is configured)"), "{e}");
        for (bad, why) in [
            ("x: {tools: [run_ruby]}", "the tools are"),
            ("x: {}", "grants nothing"),
            ("x: {environments: [production]}", "no scope grants a tool"),
            ("'a b': {tools: [run_python]}", "not a valid OAuth scope"),
            ("x: {tool: [run_python]}", "not a YAML map"),
            ("x: {environments: [prod]}", "not a YAML map"),
            ("x: {tools: [run_python]}\nx: {tools: [execute_sql]}", ""),
            ("- x", "not a YAML map"),
        ] {
            let e = ScopeMap::parse(bad, "f").unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}

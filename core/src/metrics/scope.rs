//! What a `fetch_metrics` query may read, enforced on the query itself: every series selector
//! of the parsed query must name an allowed metric, and gets the pinned label matchers added
//! (`agent="analyst-01"`, `namespace="sandboxrun-runs"`, ...). The query that runs is the
//! rewritten one, rendered from the checked syntax tree and parsed again, so a selector cannot
//! escape its pins however it is written (a regex on `__name__`, `{__name__=~".+"}`, an `or`
//! of matcher groups, a subquery, an `offset`): each selector is judged where it stands.

use std::collections::{BTreeMap, BTreeSet};

use promql_parser::label::{METRIC_NAME, MatchOp, Matcher, Matchers};
use promql_parser::parser::{Expr, VectorSelector};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{MetricsError, check_syntax, stack};

/// The `metrics` section of a policy rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsRules {
    /// Metric names a query may select; `*` (the default) allows any name. With a list, every
    /// selector must name its metric exactly (`up`, or `{__name__="up"}`).
    #[serde(default = "any_name")]
    pub names: Vec<String>,
    /// Label values every selector is pinned to (`namespace: sandboxrun-runs`): series with
    /// another value, or without the label, are never read.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Embedded only (the server's own call record): whether an agent may read other agents'
    /// calls. By default a selector is pinned to `agent="<the caller>"`.
    #[serde(default)]
    pub all_agents: bool,
}

fn any_name() -> Vec<String> {
    vec!["*".to_owned()]
}

impl Default for MetricsRules {
    fn default() -> Self {
        Self {
            names: any_name(),
            labels: BTreeMap::new(),
            all_agents: false,
        }
    }
}

impl MetricsRules {
    /// Checks the section when its policy is loaded.
    pub fn validate(&self) -> Result<(), String> {
        if self.names.is_empty() {
            return Err("metrics.names is empty: list metric names, or `*` for any".to_owned());
        }
        if let Some(label) = self.labels.keys().find(|l| l.as_str() == METRIC_NAME) {
            return Err(format!(
                "metrics.labels pins {label}: list metric names in metrics.names instead"
            ));
        }
        Ok(())
    }
}

/// What one query may read: allowed names (`None`: any) and the pinned labels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    /// The metric names a selector may name; `None` for any.
    pub names: Option<BTreeSet<String>>,
    /// The label matchers added to every selector.
    pub pins: BTreeMap<String, String>,
}

impl Scope {
    /// The scope of `rules`, with the caller pinned as `agent` unless the rules allow every
    /// agent (`caller`: `None` outside the embedded call record).
    pub fn of(rules: &MetricsRules, caller: Option<&str>) -> Self {
        let names =
            (!rules.names.iter().any(|n| n == "*")).then(|| rules.names.iter().cloned().collect());
        let mut pins = rules.labels.clone();
        if let Some(agent) = caller
            && !rules.all_agents
        {
            pins.insert("agent".to_owned(), agent.to_owned());
        }
        Self { names, pins }
    }

    /// Whether the scope lets any query through unchanged.
    pub fn is_open(&self) -> bool {
        self.names.is_none() && self.pins.is_empty()
    }

    /// The query rewritten to this scope, or why it reaches outside it.
    /// The parse, the walk, the rendering and the trees' drops run on a PromQL thread
    /// ([`super::stack`]), whatever thread asks.
    pub fn apply(&self, query: &str) -> Result<String, MetricsError> {
        if self.is_open() {
            return Ok(query.to_owned());
        }
        stack::run(|| {
            let mut expr = check_syntax(query)?;
            self.walk(&mut expr)?;
            let rewritten = expr.to_string();
            // What runs is what was judged: the rendering must parse again (to the same scope).
            let mut again = check_syntax(&rewritten)?;
            self.walk(&mut again)?;
            Ok(rewritten)
        })?
    }

    /// Applies the scope to every selector of `expr` (its depth is bounded by `check_syntax`).
    fn walk(&self, expr: &mut Expr) -> Result<(), MetricsError> {
        match expr {
            Expr::VectorSelector(vs) => self.selector(vs),
            Expr::MatrixSelector(ms) => self.selector(&mut ms.vs),
            Expr::Aggregate(a) => {
                self.walk(&mut a.expr)?;
                match a.param.as_deref_mut() {
                    Some(p) => self.walk(p),
                    None => Ok(()),
                }
            }
            Expr::Unary(u) => self.walk(&mut u.expr),
            Expr::Binary(b) => {
                self.walk(&mut b.lhs)?;
                self.walk(&mut b.rhs)
            }
            Expr::Paren(p) => self.walk(&mut p.expr),
            Expr::Subquery(s) => self.walk(&mut s.expr),
            Expr::Call(c) => c.args.args.iter_mut().try_for_each(|a| self.walk(a)),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) => Ok(()),
            Expr::Extension(_) => Err(MetricsError::BadRequest(
                "the query uses an extension expression, which policy cannot scope".to_owned(),
            )),
        }
    }

    fn selector(&self, vs: &mut VectorSelector) -> Result<(), MetricsError> {
        if let Some(allowed) = &self.names {
            let named = metric_names(vs);
            if named.is_empty() {
                return Err(MetricsError::BadRequest(format!(
                    "a selector names no metric (`{vs}`): policy allows only {}; name one, for \
                     example {}",
                    list(allowed),
                    allowed.iter().next().map_or("", String::as_str)
                )));
            }
            if let Some(bad) = named.iter().find(|n| !allowed.contains(*n)) {
                return Err(MetricsError::BadRequest(format!(
                    "policy does not allow the metric {bad}: the allowed metrics are {}",
                    list(allowed)
                )));
            }
        }
        let pins = self
            .pins
            .iter()
            .map(|(label, value)| Matcher::new(MatchOp::Equal, label, value));
        let pins: Vec<Matcher> = pins.collect();
        pin(&mut vs.matchers, &pins);
        Ok(())
    }
}

/// Adds `pins` to every alternative of a selector's matchers (`{a="1" or b="2"}` has two).
fn pin(matchers: &mut Matchers, pins: &[Matcher]) {
    if matchers.or_matchers.is_empty() {
        matchers.matchers.extend(pins.iter().cloned());
    } else {
        for group in &mut matchers.or_matchers {
            group.extend(pins.iter().cloned());
        }
        // Matchers outside the groups (none, as the parser builds them) would apply to all.
        matchers.matchers.extend(pins.iter().cloned());
    }
}

/// The metric names a selector is restricted to: its name, and the `__name__="x"` equality
/// matchers of every alternative. A selector whose names are not all exact (a regex, a negative
/// match, an alternative without a name) names nothing for sure, and comes back empty.
fn metric_names(vs: &VectorSelector) -> BTreeSet<String> {
    let exact = |ms: &[Matcher]| -> Option<Vec<String>> {
        let mut names = Vec::new();
        for m in ms.iter().filter(|m| m.name == METRIC_NAME) {
            match m.op {
                MatchOp::Equal => names.push(m.value.clone()),
                _ => return None,
            }
        }
        Some(names)
    };
    let mut names = BTreeSet::new();
    if let Some(n) = &vs.name {
        names.insert(n.clone());
    }
    let groups: Vec<&[Matcher]> = if vs.matchers.or_matchers.is_empty() {
        vec![&vs.matchers.matchers]
    } else {
        vs.matchers.or_matchers.iter().map(Vec::as_slice).collect()
    };
    for group in groups {
        let Some(found) = exact(group) else {
            return BTreeSet::new();
        };
        if found.is_empty() && vs.name.is_none() {
            return BTreeSet::new();
        }
        names.extend(found);
    }
    names
}

fn list(names: &BTreeSet<String>) -> String {
    names.iter().cloned().collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(names: &[&str], pins: &[(&str, &str)]) -> Scope {
        Scope {
            names: (!names.is_empty()).then(|| names.iter().map(|n| (*n).to_owned()).collect()),
            pins: pins
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn every_selector_gets_the_pins() {
        let s = scope(&[], &[("agent", "a1")]);
        let q = s
            .apply(
                "sum(increase(sandboxrun_tool_calls_total{tool=\"run_python\"}[1h])) / count(up)",
            )
            .unwrap();
        assert_eq!(q.matches("agent=\"a1\"").count(), 2, "{q}");
        // A matcher of its own on the pinned label cannot widen it: both must hold.
        let q = s
            .apply("sandboxrun_tool_calls_total{agent=~\".+\"}")
            .unwrap();
        assert!(
            q.contains("agent=~\".+\"") && q.contains("agent=\"a1\""),
            "{q}"
        );
        // Subqueries, offsets, functions, binary operators: each selector where it stands.
        let q = s
            .apply("max_over_time(rate(x[5m])[1h:1m] offset 1h) and on() y")
            .unwrap();
        assert_eq!(q.matches("agent=\"a1\"").count(), 2, "{q}");
        // `or` groups each get the pin.
        let q = s.apply("x{a=\"1\" or b=\"2\"}").unwrap();
        assert_eq!(q.matches("agent=\"a1\"").count(), 2, "{q}");
    }

    #[test]
    fn only_allowed_metrics_are_selected() {
        let s = scope(&["up", "sandboxrun_tool_calls_total"], &[]);
        assert!(
            s.apply("sum(up) + sum(sandboxrun_tool_calls_total)")
                .is_ok()
        );
        assert!(s.apply("{__name__=\"up\"}").is_ok());
        for bad in [
            "node_cpu_seconds_total",
            "sum(up) + sum(secret_metric)",
            "{__name__=~\"up|secret_metric\"}",
            "{__name__=~\".+\"}",
            "{__name__!=\"up\"}",
            "{job=\"x\"}",
            "{__name__=\"up\" or job=\"x\"}",
            "absent(secret_metric)",
            "label_replace(secret_metric, \"a\", \"b\", \"c\", \"d\")",
            "rate(secret_metric[5m])",
            "secret_metric[5m:1m]",
        ] {
            let e = s.apply(bad).unwrap_err();
            // Refused: by the scope, or (a selector with nothing to match) by the parser.
            assert!(
                matches!(e, MetricsError::BadRequest(_) | MetricsError::Parse(_)),
                "{bad}: {e}"
            );
        }
        let e = s.apply("secret_metric").unwrap_err().to_string();
        assert!(e.contains("does not allow the metric secret_metric"), "{e}");
        assert!(e.contains("sandboxrun_tool_calls_total, up"), "{e}");
    }

    #[test]
    fn an_open_scope_changes_nothing_and_rules_pin_the_caller() {
        assert!(Scope::default().is_open());
        assert_eq!(
            Scope::default().apply("up{a=\"b\"}").unwrap(),
            "up{a=\"b\"}"
        );
        let rules = MetricsRules::default();
        assert_eq!(
            Scope::of(&rules, Some("me")).pins,
            BTreeMap::from([("agent".to_owned(), "me".to_owned())])
        );
        assert!(Scope::of(&rules, None).is_open());
        let all = MetricsRules {
            all_agents: true,
            ..MetricsRules::default()
        };
        assert!(Scope::of(&all, Some("me")).is_open());
        assert!(
            MetricsRules {
                names: vec![],
                ..MetricsRules::default()
            }
            .validate()
            .is_err()
        );
    }
}

//! PromQL over the embedded store ([`super::CallStore`]), parsed by `promql-parser`.
//!
//! The store records calls exactly, so the semantics are those of a counter observed
//! continuously rather than scraped:
//!
//! - `sandboxrun_tool_calls_total{...}` at `t` is the number of calls up to `t`; a series exists
//!   from its first call on (there is no staleness and no lookback window).
//! - `increase(x[r])` and `delta(x[r])` are the number of calls in `(t-r, t]` (no extrapolation);
//!   `rate(x[r])` is that divided by `r` in seconds; `count_over_time(x[r])` counts the calls in
//!   the window (each call is one sample) and leaves out series without any. A raw `x[r]` returns
//!   one sample per call in the window.
//!
//! Supported: selectors with `=`, `!=`, `=~`, `!~` matchers and `offset`; the functions
//! [`SUPPORTED_FUNCTIONS`]; the aggregations [`SUPPORTED_AGGREGATIONS`] with `by`/`without`;
//! arithmetic (`+ - * / % ^`) and comparisons (`== != > < >= <=`, with or without `bool`)
//! between scalars, between a vector and a scalar, and one-to-one between vectors (`on`,
//! `ignoring`). Anything else is refused with a message naming what is supported.

use std::collections::{BTreeMap, HashMap};

use promql_parser::label::{METRIC_NAME, Matcher, Matchers};
use promql_parser::parser::{
    AggregateExpr, BinaryExpr, Call, Expr, LabelModifier, MatrixSelector, Offset,
    VectorMatchCardinality, VectorSelector,
};

use super::series::{Labels, SeriesData};
use super::{
    CALLS_METRIC, MetricsError, MetricsResult, QueryTime, ResultType, Series, format_value,
};

/// Range and instant functions the embedded store evaluates.
pub const SUPPORTED_FUNCTIONS: &[&str] = &[
    "increase",
    "rate",
    "delta",
    "count_over_time",
    "abs",
    "ceil",
    "floor",
    "round",
    "scalar",
    "vector",
    "time",
];
/// Aggregations the embedded store evaluates.
pub const SUPPORTED_AGGREGATIONS: &[&str] = &["sum", "count", "min", "max", "avg"];

/// A value during evaluation.
#[derive(Clone, Debug)]
enum Value {
    Scalar(f64),
    String(String),
    /// One value per series.
    Vector(Vec<(Labels, f64)>),
    /// Samples (unix milliseconds, value) per series.
    Matrix(Vec<(Labels, Vec<(i64, f64)>)>),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Scalar(_) => "scalar",
            Value::String(_) => "string",
            Value::Vector(_) => "instant vector",
            Value::Matrix(_) => "range vector",
        }
    }
}

type Result<T> = std::result::Result<T, MetricsError>;

fn unsupported(what: impl std::fmt::Display) -> MetricsError {
    MetricsError::Unsupported(format!(
        "{what} is not supported by the embedded metrics store; it evaluates {CALLS_METRIC} \
         (labels tool, agent, verdict, phase, environment) with label matchers (= != =~ !~) and \
         offset, the functions {}, the aggregations {} with by/without, and arithmetic or \
         comparisons with scalars and between vectors (on/ignoring); any PromQL runs against a \
         Prometheus in cluster mode (the operator's --prometheus-url)",
        SUPPORTED_FUNCTIONS.join(", "),
        SUPPORTED_AGGREGATIONS.join(", ")
    ))
}

/// Evaluates expressions over the series of the store.
pub(super) struct Evaluator<'a> {
    series: &'a [SeriesData],
    /// When the evaluation gives up (`None`: never), and the budget that set it.
    deadline: Option<std::time::Instant>,
    budget: std::time::Duration,
}

impl<'a> Evaluator<'a> {
    pub(super) fn new(series: &'a [SeriesData], budget: std::time::Duration) -> Self {
        Self {
            series,
            deadline: std::time::Instant::now().checked_add(budget),
            budget,
        }
    }

    /// Evaluates `expr` at an instant, or at every step of a range.
    pub(super) fn run(&self, expr: &Expr, time: QueryTime) -> Result<MetricsResult> {
        let result = match time {
            QueryTime::Instant(t) => self.instant(expr, t.as_millisecond())?,
            QueryTime::Range { start, end, step } => {
                let step = step.as_millis().max(1) as i64;
                self.range(expr, start.as_millisecond(), end.as_millisecond(), step)?
            }
        };
        Ok(result.capped())
    }

    fn instant(&self, expr: &Expr, t: i64) -> Result<MetricsResult> {
        let sample = |v: f64| Some((seconds(t), format_value(v)));
        let (result_type, result) = match self.eval(expr, t)? {
            Value::Scalar(v) => (
                ResultType::Scalar,
                vec![Series {
                    metric: Labels::new(),
                    value: sample(v),
                    values: None,
                }],
            ),
            Value::String(s) => (
                ResultType::String,
                vec![Series {
                    metric: Labels::new(),
                    value: Some((seconds(t), s)),
                    values: None,
                }],
            ),
            Value::Vector(v) => (
                ResultType::Vector,
                v.into_iter()
                    .map(|(metric, v)| Series {
                        metric,
                        value: sample(v),
                        values: None,
                    })
                    .collect(),
            ),
            Value::Matrix(m) => (ResultType::Matrix, matrix_series(m)),
        };
        let series_total = result.len() as u64;
        Ok(MetricsResult {
            result_type,
            result,
            truncated: false,
            series_total,
            warnings: Vec::new(),
        })
    }

    fn range(&self, expr: &Expr, start: i64, end: i64, step: i64) -> Result<MetricsResult> {
        let mut by_labels: BTreeMap<Labels, Vec<(i64, f64)>> = BTreeMap::new();
        let mut t = start;
        while t <= end {
            match self.eval(expr, t)? {
                Value::Scalar(v) => by_labels.entry(Labels::new()).or_default().push((t, v)),
                Value::Vector(v) => {
                    for (labels, v) in v {
                        by_labels.entry(labels).or_default().push((t, v));
                    }
                }
                other => {
                    return Err(MetricsError::BadRequest(format!(
                        "a range query needs an expression of type scalar or instant vector, \
                         not {}: drop the [range] or wrap it in a function such as increase()",
                        other.kind()
                    )));
                }
            }
            t += step;
        }
        let result = matrix_series(by_labels.into_iter().collect());
        let series_total = result.len() as u64;
        Ok(MetricsResult {
            result_type: ResultType::Matrix,
            result,
            truncated: false,
            series_total,
            warnings: Vec::new(),
        })
    }

    fn eval(&self, expr: &Expr, t: i64) -> Result<Value> {
        if self
            .deadline
            .is_some_and(|deadline| std::time::Instant::now() >= deadline)
        {
            return Err(MetricsError::Timeout(self.budget));
        }
        match expr {
            Expr::NumberLiteral(n) => Ok(Value::Scalar(n.val)),
            Expr::StringLiteral(s) => Ok(Value::String(s.val.clone())),
            Expr::Paren(p) => self.eval(&p.expr, t),
            Expr::Unary(u) => match self.eval(&u.expr, t)? {
                Value::Scalar(v) => Ok(Value::Scalar(-v)),
                Value::Vector(v) => Ok(Value::Vector(
                    v.into_iter().map(|(l, v)| (without_name(l), -v)).collect(),
                )),
                other => Err(MetricsError::BadRequest(format!(
                    "unary minus needs a scalar or an instant vector, not a {}",
                    other.kind()
                ))),
            },
            Expr::VectorSelector(vs) => Ok(Value::Vector(self.select(vs, t)?)),
            Expr::MatrixSelector(ms) => self.raw_matrix(ms, t),
            Expr::Call(call) => self.call(call, t),
            Expr::Aggregate(agg) => self.aggregate(agg, t),
            Expr::Binary(bin) => self.binary(bin, t),
            Expr::Subquery(_) => Err(unsupported("a subquery ([range:step])")),
            Expr::Extension(_) => Err(unsupported("an extension expression")),
        }
    }

    /// The series a selector picks and the time it looks at (`t` minus the offset).
    fn selected(&self, vs: &VectorSelector, t: i64) -> Result<(Vec<&'a SeriesData>, i64)> {
        if vs.at.is_some() {
            return Err(unsupported("the @ modifier"));
        }
        if let Some(name) = &vs.name
            && name != CALLS_METRIC
        {
            return Err(MetricsError::Unsupported(format!(
                "the embedded metrics store has no metric {name}: its only metric is \
                 {CALLS_METRIC} (labels tool, agent, verdict, phase, environment), for example \
                 sum(increase({CALLS_METRIC}{{tool=\"run_python\"}}[1h])); other metrics are \
                 answered in cluster mode, by the Prometheus of the operator's --prometheus-url"
            )));
        }
        let at = match &vs.offset {
            None => t,
            Some(Offset::Pos(d)) => t - d.as_millis() as i64,
            Some(Offset::Neg(d)) => t + d.as_millis() as i64,
        };
        let picked = self
            .series
            .iter()
            .filter(|s| matches(&vs.matchers, &s.labels))
            .collect();
        Ok((picked, at))
    }

    fn select(&self, vs: &VectorSelector, t: i64) -> Result<Vec<(Labels, f64)>> {
        let (series, at) = self.selected(vs, t)?;
        Ok(series
            .into_iter()
            .filter(|s| s.exists_at(at))
            .map(|s| (s.labels.clone(), s.value_at(at) as f64))
            .collect())
    }

    /// `x[r]` on its own: one sample per call in the window, valued at the counter after it.
    fn raw_matrix(&self, ms: &MatrixSelector, t: i64) -> Result<Value> {
        let (series, at) = self.selected(&ms.vs, t)?;
        let from = at - ms.range.as_millis() as i64;
        let mut out = Vec::new();
        for s in series {
            let before = s.value_at(from);
            let samples: Vec<(i64, f64)> = s
                .times
                .iter()
                .filter(|&&x| x > from && x <= at)
                .enumerate()
                .map(|(i, &x)| (x, (before + i as u64 + 1) as f64))
                .collect();
            if !samples.is_empty() {
                out.push((s.labels.clone(), samples));
            }
        }
        Ok(Value::Matrix(out))
    }

    fn call(&self, call: &Call, t: i64) -> Result<Value> {
        let name = call.func.name;
        let args = &call.args.args;
        match name {
            "increase" | "rate" | "delta" | "count_over_time" => {
                let Some(Expr::MatrixSelector(ms)) = args.first().map(|a| a.as_ref()) else {
                    return Err(MetricsError::BadRequest(format!(
                        "{name}() needs a range selector such as {CALLS_METRIC}[1h]"
                    )));
                };
                let (series, at) = self.selected(&ms.vs, t)?;
                let range = ms.range.as_millis() as i64;
                let from = at - range;
                let mut out = Vec::new();
                for s in series {
                    let calls = s.calls_in(from, at);
                    let value = match name {
                        "count_over_time" if calls == 0 => continue,
                        "count_over_time" => calls as f64,
                        _ if !s.exists_at(at) => continue,
                        "rate" => calls as f64 / (range as f64 / 1000.0),
                        _ => calls as f64,
                    };
                    out.push((without_name(s.labels.clone()), value));
                }
                Ok(Value::Vector(out))
            }
            "abs" | "ceil" | "floor" | "round" => {
                if name == "round" && args.len() > 1 {
                    return Err(unsupported("round() with a precision argument"));
                }
                let f: fn(f64) -> f64 = match name {
                    "abs" => f64::abs,
                    "ceil" => f64::ceil,
                    "floor" => f64::floor,
                    _ => |v: f64| (v + 0.5).floor(),
                };
                match self.eval(arg(args, name)?, t)? {
                    Value::Vector(v) => Ok(Value::Vector(
                        v.into_iter()
                            .map(|(l, v)| (without_name(l), f(v)))
                            .collect(),
                    )),
                    other => Err(MetricsError::BadRequest(format!(
                        "{name}() needs an instant vector, not a {}",
                        other.kind()
                    ))),
                }
            }
            "scalar" => match self.eval(arg(args, name)?, t)? {
                Value::Vector(v) if v.len() == 1 => Ok(Value::Scalar(v[0].1)),
                Value::Vector(_) => Ok(Value::Scalar(f64::NAN)),
                other => Err(MetricsError::BadRequest(format!(
                    "scalar() needs an instant vector, not a {}",
                    other.kind()
                ))),
            },
            "vector" => match self.eval(arg(args, name)?, t)? {
                Value::Scalar(v) => Ok(Value::Vector(vec![(Labels::new(), v)])),
                other => Err(MetricsError::BadRequest(format!(
                    "vector() needs a scalar, not a {}",
                    other.kind()
                ))),
            },
            "time" => Ok(Value::Scalar(seconds(t))),
            other => Err(unsupported(format!("the function {other}()"))),
        }
    }

    fn aggregate(&self, agg: &AggregateExpr, t: i64) -> Result<Value> {
        let op = agg.op.to_string();
        if !SUPPORTED_AGGREGATIONS.contains(&op.as_str()) {
            return Err(unsupported(format!("the aggregation {op}")));
        }
        let Value::Vector(input) = self.eval(&agg.expr, t)? else {
            return Err(MetricsError::BadRequest(format!(
                "{op}() needs an instant vector: wrap a range selector in increase(), rate() or \
                 count_over_time() first"
            )));
        };
        let mut groups: BTreeMap<Labels, Vec<f64>> = BTreeMap::new();
        for (labels, v) in input {
            let key = match &agg.modifier {
                None => Labels::new(),
                Some(LabelModifier::Include(keep)) => labels
                    .into_iter()
                    .filter(|(k, _)| keep.labels.iter().any(|l| l == k))
                    .collect(),
                Some(LabelModifier::Exclude(drop)) => labels
                    .into_iter()
                    .filter(|(k, _)| k != METRIC_NAME && !drop.labels.iter().any(|l| l == k))
                    .collect(),
            };
            groups.entry(key).or_default().push(v);
        }
        let out = groups
            .into_iter()
            .map(|(labels, vs)| {
                let n = vs.len() as f64;
                let value = match op.as_str() {
                    "sum" => vs.iter().sum(),
                    "count" => n,
                    "min" => vs.iter().copied().fold(f64::INFINITY, f64::min),
                    "max" => vs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    _ => vs.iter().sum::<f64>() / n,
                };
                (labels, value)
            })
            .collect();
        Ok(Value::Vector(out))
    }

    fn binary(&self, bin: &BinaryExpr, t: i64) -> Result<Value> {
        let op = bin.op.to_string();
        let Some(kind) = BinOp::parse(&op) else {
            return Err(unsupported(format!("the operator {op}")));
        };
        let return_bool = bin.return_bool();
        let lhs = self.eval(&bin.lhs, t)?;
        let rhs = self.eval(&bin.rhs, t)?;
        match (lhs, rhs) {
            (Value::Scalar(a), Value::Scalar(b)) => Ok(Value::Scalar(kind.apply(a, b))),
            (Value::Vector(v), Value::Scalar(s)) => Ok(Value::Vector(
                v.into_iter()
                    .filter_map(|(l, a)| kind.vector_result(l, a, a, s, return_bool))
                    .collect(),
            )),
            (Value::Scalar(s), Value::Vector(v)) => Ok(Value::Vector(
                v.into_iter()
                    .filter_map(|(l, b)| kind.vector_result(l, b, s, b, return_bool))
                    .collect(),
            )),
            (Value::Vector(l), Value::Vector(r)) => self
                .vector_vector(bin, kind, return_bool, l, r)
                .map(Value::Vector),
            (a, b) => Err(MetricsError::BadRequest(format!(
                "the operator {op} needs scalars or instant vectors, not a {} and a {}",
                a.kind(),
                b.kind()
            ))),
        }
    }

    fn vector_vector(
        &self,
        bin: &BinaryExpr,
        kind: BinOp,
        return_bool: bool,
        lhs: Vec<(Labels, f64)>,
        rhs: Vec<(Labels, f64)>,
    ) -> Result<Vec<(Labels, f64)>> {
        let matching = bin.modifier.as_ref().and_then(|m| m.matching.as_ref());
        if let Some(m) = &bin.modifier
            && !matches!(m.card, VectorMatchCardinality::OneToOne)
        {
            return Err(unsupported(
                "group_left/group_right and the set operators (and, or, unless)",
            ));
        }
        let signature = |labels: &Labels| -> Labels {
            labels
                .iter()
                .filter(|(k, _)| k.as_str() != METRIC_NAME)
                .filter(|(k, _)| match matching {
                    Some(LabelModifier::Include(on)) => on.labels.iter().any(|l| l == *k),
                    Some(LabelModifier::Exclude(ign)) => !ign.labels.iter().any(|l| l == *k),
                    None => true,
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let mut right: HashMap<Labels, f64> = HashMap::new();
        for (labels, v) in &rhs {
            if right.insert(signature(labels), *v).is_some() {
                return Err(MetricsError::BadRequest(format!(
                    "many-to-many matching is not allowed: several series on the right of {} have \
                     the labels {:?}; aggregate them first (for example with sum by (...))",
                    bin.op,
                    signature(labels)
                )));
            }
        }
        let mut seen = HashMap::new();
        let mut out = Vec::new();
        for (labels, a) in lhs {
            let sig = signature(&labels);
            let Some(&b) = right.get(&sig) else { continue };
            if seen.insert(sig.clone(), ()).is_some() {
                return Err(MetricsError::BadRequest(format!(
                    "many-to-many matching is not allowed: several series on the left of {} have \
                     the labels {sig:?}; aggregate them first (for example with sum by (...))",
                    bin.op
                )));
            }
            let labels = match matching {
                Some(LabelModifier::Include(_)) => sig,
                Some(LabelModifier::Exclude(ign)) => labels
                    .into_iter()
                    .filter(|(k, _)| !ign.labels.iter().any(|l| l == k))
                    .collect(),
                None => labels,
            };
            if let Some(r) = kind.vector_result(labels, a, a, b, return_bool) {
                out.push(r);
            }
        }
        Ok(out)
    }
}

/// A binary operator the evaluator knows.
#[derive(Clone, Copy)]
enum BinOp {
    Arith(fn(f64, f64) -> f64),
    Compare(fn(f64, f64) -> bool),
}

impl BinOp {
    fn parse(op: &str) -> Option<Self> {
        Some(match op {
            "+" => Self::Arith(|a, b| a + b),
            "-" => Self::Arith(|a, b| a - b),
            "*" => Self::Arith(|a, b| a * b),
            "/" => Self::Arith(|a, b| a / b),
            "%" => Self::Arith(|a, b| a % b),
            "^" => Self::Arith(f64::powf),
            "==" => Self::Compare(|a, b| a == b),
            "!=" => Self::Compare(|a, b| a != b),
            ">" => Self::Compare(|a, b| a > b),
            "<" => Self::Compare(|a, b| a < b),
            ">=" => Self::Compare(|a, b| a >= b),
            "<=" => Self::Compare(|a, b| a <= b),
            _ => return None,
        })
    }

    /// Scalars: arithmetic gives its value, a comparison (always `bool` between scalars) 0 or 1.
    fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            Self::Arith(f) => f(a, b),
            Self::Compare(f) => f64::from(u8::from(f(a, b))),
        }
    }

    /// One element of a vector result: `own` is the vector element's value, `a` and `b` the
    /// operands in order. Arithmetic and `bool` drop the metric name; a plain comparison keeps
    /// the element (with its value) when true and drops it when false.
    fn vector_result(
        self,
        labels: Labels,
        own: f64,
        a: f64,
        b: f64,
        return_bool: bool,
    ) -> Option<(Labels, f64)> {
        match self {
            Self::Arith(f) => Some((without_name(labels), f(a, b))),
            Self::Compare(f) if return_bool => {
                Some((without_name(labels), f64::from(u8::from(f(a, b)))))
            }
            Self::Compare(f) => f(a, b).then_some((labels, own)),
        }
    }
}

fn arg<'e>(args: &'e [Box<Expr>], name: &str) -> Result<&'e Expr> {
    args.first()
        .map(|a| a.as_ref())
        .ok_or_else(|| MetricsError::BadRequest(format!("{name}() needs an argument")))
}

fn matches(matchers: &Matchers, labels: &Labels) -> bool {
    let all = |ms: &[Matcher]| {
        ms.iter()
            .all(|m| m.is_match(labels.get(&m.name).map_or("", String::as_str)))
    };
    let main = matchers.matchers.is_empty() || all(&matchers.matchers);
    if matchers.or_matchers.is_empty() {
        main
    } else {
        // `{a="x" or b="y"}`: the parser puts every alternative into or_matchers.
        matchers.or_matchers.iter().any(|group| all(group)) && main
    }
}

fn without_name(mut labels: Labels) -> Labels {
    labels.remove(METRIC_NAME);
    labels
}

fn seconds(t: i64) -> f64 {
    t as f64 / 1000.0
}

fn matrix_series(m: Vec<(Labels, Vec<(i64, f64)>)>) -> Vec<Series> {
    m.into_iter()
        .map(|(metric, samples)| Series {
            metric,
            value: None,
            values: Some(
                samples
                    .into_iter()
                    .map(|(t, v)| (seconds(t), format_value(v)))
                    .collect(),
            ),
        })
        .collect()
}

#[cfg(test)]
#[path = "eval_tests.rs"]
mod tests;

//! `fetch_metrics`: PromQL queries, answered by a Prometheus server or by sandboxrun's own record
//! of tool calls.
//!
//! - [`prometheus::PrometheusClient`] asks a Prometheus HTTP API (`/api/v1/query`,
//!   `/api/v1/query_range`) with a timeout and a cap on the response size, and turns Prometheus
//!   error responses (`bad_data`, `execution`, `timeout`, ...) into [`MetricsError`]s that say
//!   what to change.
//! - [`store::CallStore`] records every tool call (tool, agent, verdict, phase, environment) with
//!   its time, and [`eval`] evaluates PromQL over it: the counter [`CALLS_METRIC`] is exact (no
//!   scrape interval, no extrapolation), so
//!   `sum(increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))` is the number of
//!   run_python calls in the last hour.
//!
//! Both answer with the same [`MetricsResult`], shaped like Prometheus's `data` object:
//! `resultType` (`vector`, `matrix` or `scalar`) and a list of series with their `metric` labels
//! and `[timestamp, "value"]` samples (a scalar comes as one series without labels).

pub mod depth;
pub mod eval;
pub mod prometheus;
pub mod scope;
pub mod series;
pub mod stack;
pub mod store;
pub mod syntax;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use prometheus::PrometheusClient;
pub use store::{CallRecord, CallStore};

/// The counter of the embedded store: one increment per tool call (blocked, escalated and
/// malformed calls included), labelled
///
/// - `tool`: the MCP tool, `run_python`, `execute_sql` or `fetch_metrics` (the same values as the
///   frontend's exported `sandboxrun_mcp_tool_calls_total`);
/// - `agent`: the caller;
/// - `environment`: `sandbox`, `staging` or `production`;
/// - `verdict`: what policy decided, `Allow`, `Block` or `Escalate` (absent when the arguments
///   were malformed and policy never saw the call);
/// - `phase`: how the call ended, a run phase as in the operator's `sandboxrun_runs_total`
///   (`Succeeded`, `Failed`, `TimedOut`, `Rejected`, `AwaitingApproval`), or `InvalidArguments`,
///   `Cancelled`, `Unavailable`.
///
/// The name follows the operator's and the frontend's exported metrics (prefix `sandboxrun_`,
/// counters end in `_total`). The operator exports the same counter, with the same labels, for
/// the runs it finishes (its `/metrics`), so in a cluster whose Prometheus scrapes the operator
/// the same query answers for cluster calls (counted when they end, not while they await approval).
pub const CALLS_METRIC: &str = "sandboxrun_tool_calls_total";
/// Most series a result carries; the rest are left out and the result is flagged truncated.
pub const MAX_SERIES: usize = 500;
/// Most samples (over all series) a result carries; the rest are left out, flagged truncated.
pub const MAX_SAMPLES: usize = 20_000;
/// Most evaluation steps of a range query (Prometheus refuses more than 11,000 as well).
pub const MAX_STEPS: u64 = 11_000;
/// Longest PromQL expression accepted, in bytes.
pub const MAX_QUERY_BYTES: usize = 65_536;

/// When a query is evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryTime {
    /// One evaluation at this time.
    Instant(Timestamp),
    /// Evaluations from `start` to `end` (inclusive) every `step`.
    Range {
        /// First evaluation time.
        start: Timestamp,
        /// Last evaluation time (at most).
        end: Timestamp,
        /// Time between evaluations (positive).
        step: Duration,
    },
}

impl QueryTime {
    /// A range, checked: `start <= end`, a positive step, at most [`MAX_STEPS`] steps.
    pub fn range(start: Timestamp, end: Timestamp, step: Duration) -> Result<Self, MetricsError> {
        if step.is_zero() {
            return Err(MetricsError::BadRequest(
                "step must be positive, for example 60s".to_owned(),
            ));
        }
        if end < start {
            return Err(MetricsError::BadRequest(format!(
                "end ({end}) is before start ({start}): swap them"
            )));
        }
        let span = end.duration_since(start).unsigned_abs();
        let steps = (span.as_millis() / step.as_millis().max(1)) as u64 + 1;
        if steps > MAX_STEPS {
            return Err(MetricsError::BadRequest(format!(
                "the range has {steps} steps of {}s; at most {MAX_STEPS} are allowed: use a larger \
                 step or a shorter range",
                step.as_secs_f64()
            )));
        }
        Ok(Self::Range { start, end, step })
    }
}

/// Points of a range query when no step is given: the range divided into this many steps.
pub const DEFAULT_POINTS: u64 = 60;

/// The time arguments of a metrics call as an agent or a SandboxRun gives them (all text): an
/// instant `time`, or a range from `start` (or `range` before `end`) to `end` every `step`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimeArgs {
    /// Instant query time (default: now).
    pub time: Option<String>,
    /// Start of a range query.
    pub start: Option<String>,
    /// End of a range query (default: now).
    pub end: Option<String>,
    /// Step of a range query (default: the range divided into [`DEFAULT_POINTS`] steps).
    pub step: Option<String>,
    /// A range query over the last `range` (`1h`, `30m`) before `end`, instead of `start`.
    pub range: Option<String>,
}

impl TimeArgs {
    /// The query time these arguments mean, `now` filling in what is left out.
    pub fn resolve(&self, now: Timestamp) -> Result<QueryTime, MetricsError> {
        let bad = |m: String| MetricsError::BadRequest(m);
        let is_range = self.start.is_some() || self.range.is_some();
        if self.time.is_some() && (is_range || self.end.is_some() || self.step.is_some()) {
            return Err(bad(
                "give either `time` (an instant query) or a range (`range`, or `start`/`end`/`step`), \
                 not both"
                    .to_owned(),
            ));
        }
        if self.start.is_some() && self.range.is_some() {
            return Err(bad(
                "give either `range` (the last 1h, 30m, ... before `end`) or `start`, not both"
                    .to_owned(),
            ));
        }
        if !is_range {
            if self.end.is_some() || self.step.is_some() {
                return Err(bad(
                    "`end` and `step` belong to a range query: also give `start` or `range` (for \
                     example range \"1h\"), or use `time` for an instant query"
                        .to_owned(),
                ));
            }
            let at = match &self.time {
                Some(t) => parse_time(t).map_err(|e| bad(format!("argument `time`: {e}")))?,
                None => now,
            };
            return Ok(QueryTime::Instant(at));
        }
        let end = match &self.end {
            Some(t) => parse_time(t).map_err(|e| bad(format!("argument `end`: {e}")))?,
            None => now,
        };
        let start = match (&self.start, &self.range) {
            (Some(t), _) => parse_time(t).map_err(|e| bad(format!("argument `start`: {e}")))?,
            (None, Some(r)) => {
                let range = parse_duration(r).map_err(|e| bad(format!("argument `range`: {e}")))?;
                let range = jiff::SignedDuration::try_from(range)
                    .map_err(|_| bad(format!("argument `range` {r:?} is too long")))?;
                end.checked_sub(range)
                    .map_err(|_| bad(format!("argument `range` {r:?} is too long")))?
            }
            (None, None) => unreachable!("is_range"),
        };
        let step = match &self.step {
            Some(s) => parse_duration(s).map_err(|e| bad(format!("argument `step`: {e}")))?,
            None => default_step(start, end),
        };
        QueryTime::range(start, end, step)
    }
}

/// The step of a range query without one: the range in [`DEFAULT_POINTS`] steps, rounded up
/// to whole seconds (at least one).
pub fn default_step(start: Timestamp, end: Timestamp) -> Duration {
    let span = end.duration_since(start).unsigned_abs().as_secs();
    Duration::from_secs(span.div_ceil(DEFAULT_POINTS).max(1))
}

/// One query: a PromQL expression and when to evaluate it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsQuery {
    /// The PromQL expression.
    pub query: String,
    /// Instant or range.
    pub time: QueryTime,
}

/// The type of a result, as Prometheus names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ResultType {
    /// One sample per series at the evaluation time (`value`).
    Vector,
    /// Several samples per series (`values`): range queries, or a range selector.
    Matrix,
    /// One number without labels (`value` of the single series).
    Scalar,
    /// A string (`value` of the single series).
    String,
}

/// One sample: `[unix seconds, "value"]`; the value is a string as in Prometheus's API (it can be
/// `NaN` or `+Inf`).
pub type Sample = (f64, String);

/// One series of a result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Series {
    /// Its labels (`__name__` included while the metric name is kept).
    pub metric: BTreeMap<String, String>,
    /// The sample of a vector or scalar result.
    // Optional, not nullable in the schema: `["array", "null"]` types trip some clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Sample")]
    pub value: Option<Sample>,
    /// The samples of a matrix result, oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<Sample>")]
    pub values: Option<Vec<Sample>>,
}

impl Series {
    /// The samples as numbers, `(unix seconds, value)`, oldest first (`value` of a vector or
    /// scalar result, `values` of a matrix); a value that is not a number (a string result) is
    /// left out.
    pub fn numbers(&self) -> Vec<(f64, f64)> {
        self.value
            .iter()
            .chain(self.values.iter().flatten())
            .filter_map(|(t, v)| v.parse::<f64>().ok().map(|v| (*t, v)))
            .collect()
    }
}

/// The answer to a query, from Prometheus or from the embedded store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsResult {
    /// vector, matrix, scalar or string.
    pub result_type: ResultType,
    /// The series (for a scalar or string: one series without labels).
    pub result: Vec<Series>,
    /// Whether series or samples were left out at the caps.
    pub truncated: bool,
    /// Number of series before the cap.
    pub series_total: u64,
    /// Warnings the source gave with the result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl MetricsResult {
    /// Cuts the result to [`MAX_SERIES`] series and [`MAX_SAMPLES`] samples.
    pub fn capped(mut self) -> Self {
        self.series_total = self.series_total.max(self.result.len() as u64);
        if self.result.len() > MAX_SERIES {
            self.result.truncate(MAX_SERIES);
            self.truncated = true;
        }
        let mut budget = MAX_SAMPLES;
        let mut keep = 0;
        for series in &mut self.result {
            if budget == 0 {
                break;
            }
            let n = series.values.as_ref().map_or(1, Vec::len);
            if n > budget {
                if let Some(values) = series.values.as_mut() {
                    values.truncate(budget);
                }
                self.truncated = true;
                budget = 0;
            } else {
                budget -= n;
            }
            keep += 1;
        }
        if keep < self.result.len() {
            self.result.truncate(keep);
            self.truncated = true;
        }
        self
    }

    /// Cuts the result further until its JSON is at most `max_bytes` (for a Kubernetes status,
    /// which must stay far below etcd's object size limit); flagged truncated when cut.
    pub fn capped_to_bytes(mut self, max_bytes: usize) -> Self {
        let size = |r: &Self| serde_json::to_vec(r).map_or(usize::MAX, |v| v.len());
        while size(&self) > max_bytes && !self.result.is_empty() {
            let samples = self.sample_count();
            if samples > 1 {
                // Keep about half the samples (series by series, oldest samples first).
                let mut budget = samples.div_ceil(2);
                let mut keep = 0;
                for series in &mut self.result {
                    if budget == 0 {
                        break;
                    }
                    let n = series.values.as_ref().map_or(1, Vec::len) as u64;
                    if n > budget {
                        if let Some(values) = series.values.as_mut() {
                            values.truncate(budget as usize);
                        }
                        budget = 0;
                    } else {
                        budget -= n;
                    }
                    keep += 1;
                }
                self.result.truncate(keep);
            } else {
                self.result.clear();
            }
            self.truncated = true;
        }
        self
    }

    /// Number of samples over all series.
    pub fn sample_count(&self) -> u64 {
        self.result
            .iter()
            .map(|s| s.values.as_ref().map_or(1, Vec::len) as u64)
            .sum()
    }
}

/// Why a query produced no result. Every message says what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetricsError {
    /// The arguments are wrong (times, step, empty query).
    #[error("{0}")]
    BadRequest(String),
    /// The expression does not parse as PromQL.
    #[error("the query is not valid PromQL: {0}")]
    Parse(String),
    /// Valid PromQL that the embedded evaluator does not support.
    #[error("{0}")]
    Unsupported(String),
    /// Prometheus refused or failed the query (`errorType` and `error` of its response).
    #[error("Prometheus answered {error_type}: {message}{hint}")]
    Prometheus {
        /// Prometheus's `errorType` (`bad_data`, `execution`, `timeout`, `canceled`, ...).
        error_type: String,
        /// Prometheus's `error`.
        message: String,
        /// What to change, when it is clear.
        hint: String,
    },
    /// Prometheus could not be reached, or answered something that is not its API.
    #[error("{0}")]
    Unavailable(String),
    /// The query took longer than allowed.
    #[error(
        "the query did not finish within {0:?}: narrow the time range, use a larger step or select fewer series"
    )]
    Timeout(Duration),
}

impl MetricsError {
    /// Whether the caller should change the query (as opposed to retrying later).
    pub fn is_query_error(&self) -> bool {
        match self {
            Self::BadRequest(_) | Self::Parse(_) | Self::Unsupported(_) => true,
            Self::Prometheus { error_type, .. } => error_type == "bad_data",
            Self::Unavailable(_) | Self::Timeout(_) => false,
        }
    }
}

pub use depth::{MAX_EXPR_DEPTH, MAX_TOKENS};

/// Checks that `query` is one PromQL expression of acceptable size and depth, and returns its
/// tree; a syntax error comes back with where it is (see [`syntax`]).
///
/// Size, token count and depth are bounded before the text is parsed ([`depth::check`], on the
/// token stream, without recursion), so a hostile query (a run of a thousand signs, a chain of
/// thousands of operators, calls or subqueries nested thousands deep) is refused before any tree
/// exists; the parse itself runs on a PromQL thread ([`stack`]). The tree is at most
/// [`MAX_EXPR_DEPTH`] levels deep, so callers may walk and drop it on any thread.
pub fn check_syntax(query: &str) -> Result<promql_parser::parser::Expr, MetricsError> {
    if query.trim().is_empty() {
        return Err(MetricsError::BadRequest(format!(
            "the query is empty: write a PromQL expression, for example \
             sum(increase({CALLS_METRIC}{{tool=\"run_python\"}}[1h]))"
        )));
    }
    if query.len() > MAX_QUERY_BYTES {
        return Err(MetricsError::BadRequest(format!(
            "the query is {} bytes; at most {MAX_QUERY_BYTES} are accepted: write a shorter query",
            query.len()
        )));
    }
    depth::check(query).map_err(|refusal| match refusal {
        // The lexer's message, located the same way as the parser's would be.
        depth::Refusal::Lex(message) => MetricsError::Parse(syntax::describe(query, &message)),
        refusal => refusal.into_error(),
    })?;
    let expr = stack::run(|| {
        promql_parser::parser::parse(query)
            .map_err(|message| MetricsError::Parse(syntax::describe(query, &message)))
    })??;
    debug_assert!(
        depth::expr_depth(&expr) <= MAX_EXPR_DEPTH,
        "the depth bound holds for {query:?}"
    );
    Ok(expr)
}

/// Checks `query` as [`check_syntax`] does, without keeping its tree (dropped on the PromQL
/// thread that built it).
pub fn check_query(query: &str) -> Result<(), MetricsError> {
    stack::run(|| check_syntax(query).map(drop))?
}

/// A time given as RFC 3339 (`2026-11-29T10:00:00Z`) or unix seconds (`1764410400`, `1764410400.5`).
pub fn parse_time(text: &str) -> Result<Timestamp, String> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<f64>() {
        if !secs.is_finite() {
            return Err(format!("{text:?} is not a time"));
        }
        let millis = (secs * 1000.0).round();
        return Timestamp::from_millisecond(millis as i64)
            .map_err(|e| format!("{text:?} is out of range: {e}"));
    }
    t.parse::<Timestamp>().map_err(|_| {
        format!(
            "{text:?} is not a time: write RFC 3339 (2026-11-29T10:00:00Z) or unix seconds \
             (1764410400)"
        )
    })
}

/// A step or duration given as seconds (`30`, `0.5`) or a Prometheus duration (`30s`, `5m`, `1h30m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let parsed = match t.parse::<f64>() {
        // `try_`: a finite number of seconds may still be more than a Duration holds (1e300),
        // and `from_secs_f64` panics on it (found by the HTTP fuzz test).
        Ok(secs) if secs.is_finite() && secs > 0.0 => Duration::try_from_secs_f64(secs).ok(),
        Ok(_) => None,
        Err(_) => promql_parser::util::parse_duration(t)
            .ok()
            .filter(|d| !d.is_zero()),
    };
    parsed.ok_or_else(|| {
        format!(
            "{text:?} is not a positive duration: write seconds (60) or a duration (30s, 5m, 1h)"
        )
    })
}

/// Seconds since the epoch, as Prometheus writes sample times.
pub fn unix_seconds(t: Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1000.0
}

/// A sample value as Prometheus writes it (`NaN`, `+Inf`, `-Inf`, else the shortest form).
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v == f64::INFINITY {
        "+Inf".to_owned()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_parse() {
        assert_eq!(
            parse_time("1764410400").unwrap(),
            Timestamp::from_second(1_764_410_400).unwrap()
        );
        assert_eq!(
            parse_time("1764410400.5").unwrap().as_millisecond(),
            1_764_410_400_500
        );
        assert_eq!(
            parse_time("2026-11-29T10:00:00Z").unwrap(),
            "2026-11-29T10:00:00Z".parse::<Timestamp>().unwrap()
        );
        assert!(parse_time("yesterday").unwrap_err().contains("RFC 3339"));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("15").unwrap(), Duration::from_secs(15));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("-5").is_err());
        // More seconds than a Duration holds: an error, never a panic.
        for huge in ["1e300", "1e20", "99999999999999999999"] {
            assert!(parse_duration(huge).is_err(), "{huge}");
        }
        for odd in [
            "999999999999999999y",
            "9223372036854775807s",
            "1e400",
            "NaN",
            "inf",
        ] {
            let _ = parse_duration(odd);
        }
        assert!(parse_duration("soon").unwrap_err().contains("30s"));
    }

    #[test]
    fn ranges_are_checked() {
        let t = |s| Timestamp::from_second(s).unwrap();
        assert!(QueryTime::range(t(100), t(0), Duration::from_secs(1)).is_err());
        assert!(QueryTime::range(t(0), t(100), Duration::ZERO).is_err());
        let err = QueryTime::range(t(0), t(86_400), Duration::from_secs(1)).unwrap_err();
        assert!(err.to_string().contains("at most 11000"), "{err}");
        assert!(QueryTime::range(t(0), t(3600), Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn results_are_capped() {
        let series = |n: usize| Series {
            metric: BTreeMap::new(),
            value: None,
            values: Some(vec![(0.0, "1".to_owned()); n]),
        };
        let r = MetricsResult {
            result_type: ResultType::Matrix,
            result: vec![series(MAX_SAMPLES - 1), series(5), series(5)],
            truncated: false,
            series_total: 3,
            warnings: Vec::new(),
        }
        .capped();
        assert!(r.truncated);
        assert_eq!(r.result.len(), 2);
        assert_eq!(r.sample_count(), MAX_SAMPLES as u64);
        assert_eq!(r.series_total, 3);
        let many = MetricsResult {
            result_type: ResultType::Vector,
            result: (0..MAX_SERIES + 3)
                .map(|_| Series {
                    metric: BTreeMap::new(),
                    value: Some((0.0, "1".into())),
                    values: None,
                })
                .collect(),
            truncated: false,
            series_total: 0,
            warnings: Vec::new(),
        }
        .capped();
        assert!(many.truncated);
        assert_eq!(many.result.len(), MAX_SERIES);
        assert_eq!(many.series_total, (MAX_SERIES + 3) as u64);
    }

    #[test]
    fn time_arguments_resolve() {
        let now = Timestamp::from_second(1_764_410_400).unwrap();
        let t = |s| Timestamp::from_second(s).unwrap();
        let args = |f: fn(&mut TimeArgs)| {
            let mut a = TimeArgs::default();
            f(&mut a);
            a.resolve(now)
        };
        assert_eq!(args(|_| {}), Ok(QueryTime::Instant(now)));
        assert_eq!(
            args(|a| a.time = Some("1764400000".into())),
            Ok(QueryTime::Instant(t(1_764_400_000)))
        );
        assert_eq!(
            args(|a| a.range = Some("1h".into())),
            Ok(QueryTime::Range {
                start: t(1_764_410_400 - 3600),
                end: now,
                step: Duration::from_secs(60)
            })
        );
        assert_eq!(
            args(|a| {
                a.start = Some("2026-11-29T09:00:00Z".into());
                a.end = Some("2026-11-29T10:00:00Z".into());
                a.step = Some("15m".into());
            }),
            Ok(QueryTime::Range {
                start: "2026-11-29T09:00:00Z".parse().unwrap(),
                end: "2026-11-29T10:00:00Z".parse().unwrap(),
                step: Duration::from_secs(900)
            })
        );
        let err = |f: fn(&mut TimeArgs)| args(f).unwrap_err().to_string();
        assert!(
            err(|a| {
                a.time = Some("1".into());
                a.range = Some("1h".into());
            })
            .contains("not both")
        );
        assert!(
            err(|a| {
                a.start = Some("1".into());
                a.range = Some("1h".into());
            })
            .contains("not both")
        );
        assert!(err(|a| a.step = Some("1m".into())).contains("also give `start` or `range`"));
        assert!(err(|a| a.range = Some("an hour".into())).starts_with("argument `range`"));
        assert!(err(|a| a.time = Some("noon".into())).starts_with("argument `time`"));
    }

    #[test]
    fn results_fit_a_byte_budget() {
        let r = MetricsResult {
            result_type: ResultType::Matrix,
            result: (0..10)
                .map(|i| Series {
                    metric: BTreeMap::from([("i".to_owned(), i.to_string())]),
                    value: None,
                    values: Some(vec![(1_764_410_400.0, "12345".to_owned()); 100]),
                })
                .collect(),
            truncated: false,
            series_total: 10,
            warnings: Vec::new(),
        };
        let full = serde_json::to_vec(&r).unwrap().len();
        let same = r.clone().capped_to_bytes(full);
        assert!(!same.truncated);
        let cut = r.capped_to_bytes(full / 3);
        assert!(cut.truncated);
        assert!(serde_json::to_vec(&cut).unwrap().len() <= full / 3);
        assert!(cut.sample_count() > 0);
        assert_eq!(cut.series_total, 10);
    }

    #[test]
    fn samples_read_as_numbers() {
        let s = Series {
            metric: BTreeMap::new(),
            value: None,
            values: Some(vec![
                (1.0, "3".into()),
                (2.0, "0.5".into()),
                (3.0, "+Inf".into()),
                (4.0, "NaN".into()),
            ]),
        };
        let n = s.numbers();
        assert_eq!(n[..3], [(1.0, 3.0), (2.0, 0.5), (3.0, f64::INFINITY)]);
        assert!(n[3].1.is_nan());
        let v = Series {
            metric: BTreeMap::new(),
            value: Some((5.0, "7".into())),
            values: None,
        };
        assert_eq!(v.numbers(), [(5.0, 7.0)]);
    }

    #[test]
    fn values_format_like_prometheus() {
        assert_eq!(format_value(3.0), "3");
        assert_eq!(format_value(0.25), "0.25");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
    }
}

//! `fetch_metrics`: a PromQL query, judged by policy, answered by the embedded server's own record
//! of tool calls or, in a cluster, by the Prometheus the operator is configured with.
//!
//! Every tool call of an embedded server (run_python, execute_sql, fetch_metrics; allowed,
//! blocked, escalated or malformed) is recorded in a [`CallStore`] as the counter
//! `sandboxrun_tool_calls_total{tool, agent, environment, verdict, phase}` (see
//! [`crate::metrics::CALLS_METRIC`]); embedded, "how many run_python calls in the last hour?" is
//! `sum(increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))` over that record, exactly.
//! In a cluster each call becomes a SandboxRun with `spec.metrics`; the operator judges it, sends
//! the query to its Prometheus and writes [`MetricsResult`] into `status.result`. Relative times
//! (`range`, a missing `time`) are resolved when the agent asks ([`parse_args`]), so a run that
//! waits for approval still answers the question that was asked.
//!
//! [`execute`] is the one executor for both sources, with the same caps, and [`outcome`] the one
//! classification of its results.

use std::time::Duration;

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::args::{environment, unknown_argument};
use super::governed::Summary;
use super::{CallSummary, Embedded, JsonObject, ParseContext, ToolSpec};
use crate::metrics::scope::Scope;
use crate::metrics::{
    CallStore, MetricsError, MetricsQuery, MetricsResult, PrometheusClient, QueryTime, ResultType,
    Series, TimeArgs, check_query,
};
use crate::model::{Environment, Phase, Reason, Tool, Verdict};
use crate::policy::{CallContext, Decision};

/// The most bytes of result one query returns: far below etcd's object limit in the cluster,
/// where it is written into the run's status, and the same embedded.
pub const RESULT_MAX_BYTES: usize = 256 * 1024;

/// The `fetch_metrics` tool.
pub struct FetchMetrics;

/// A validated `fetch_metrics` call: the query with its times resolved, and the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsCall {
    /// The expression and when to evaluate it.
    pub query: MetricsQuery,
    /// The environment the call targets.
    pub environment: Environment,
}

/// An example a model can copy.
pub const EXAMPLE_QUERY: &str =
    r#"sum(increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))"#;

/// Arguments of `fetch_metrics` (the tool's `inputSchema`). The tool parses the raw arguments
/// itself (see [`parse_args`]) so each mistake gets its own actionable message.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::portable)]
pub struct FetchMetricsArgs {
    /// A PromQL expression, for example
    /// `sum(increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))`.
    #[schemars(length(min = 1, max = crate::metrics::MAX_QUERY_BYTES))]
    pub query: String,
    /// Instant query: evaluation time, RFC 3339 (`2026-11-29T10:00:00Z`) or unix seconds;
    /// default now. Leave out for a range query.
    #[serde(default)]
    #[schemars(with = "String")]
    pub time: Option<String>,
    /// Range query over the last `range` before `end` (`1h`, `30m`, `7d`), instead of `start`.
    #[serde(default)]
    #[schemars(with = "String")]
    pub range: Option<String>,
    /// Range query: first evaluation time (RFC 3339 or unix seconds).
    #[serde(default)]
    #[schemars(with = "String")]
    pub start: Option<String>,
    /// Range query: last evaluation time (default now).
    #[serde(default)]
    #[schemars(with = "String")]
    pub end: Option<String>,
    /// Range query: time between evaluations (`30s`, `5m`, or seconds); default the range in
    /// 60 steps.
    #[serde(default)]
    #[schemars(with = "String")]
    pub step: Option<String>,
    /// Environment the call targets: sandbox (default), staging or production.
    #[serde(default)]
    pub environment: Environment,
}

impl FetchMetricsArgs {
    /// The time arguments, unresolved.
    pub fn time_args(&self) -> TimeArgs {
        TimeArgs {
            time: self.time.clone(),
            start: self.start.clone(),
            end: self.end.clone(),
            step: self.step.clone(),
            range: self.range.clone(),
        }
    }
}

/// The result of one `fetch_metrics` call (the tool's `outputSchema`): Prometheus's `data`
/// object plus the run's verdict and phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::portable)]
pub struct MetricsOutput {
    /// vector (one sample per series), matrix (several), scalar or string.
    pub result_type: ResultType,
    /// The series: `metric` (labels), and `value` `[unix seconds, "number"]` (vector, scalar)
    /// or `values` (matrix). Empty when nothing matched or nothing ran.
    pub result: Vec<Series>,
    /// Whether series or samples were left out at the caps.
    pub truncated: bool,
    /// Number of series before the caps.
    pub series_total: u64,
    /// Warnings of the source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Where the query ran: `embedded` (this server's own call counters) or `prometheus`.
    pub source: String,
    /// When it was evaluated: the instant, or `start`/`end`/`step` of a range (RFC 3339, step
    /// in seconds).
    pub evaluated: Evaluated,
    /// The run's name: the SandboxRun's name (cluster) or a generated id (embedded).
    pub run_name: String,
    /// What policy decided: Allow, Block or Escalate.
    pub verdict: Verdict,
    /// The policy rule that decided.
    pub rule: String,
    /// Why policy decided so.
    pub reason: String,
    /// Terminal phase: Succeeded, Failed, TimedOut or Rejected (or AwaitingApproval).
    pub phase: Phase,
    /// Human-readable explanation of a failure; used in the error text only.
    #[serde(skip)]
    #[schemars(skip)]
    pub message: Option<String>,
}

/// The evaluation time(s) of a query.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Evaluated {
    /// Instant query time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub time: Option<String>,
    /// Range start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub start: Option<String>,
    /// Range end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub end: Option<String>,
    /// Range step in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "f64")]
    pub step_seconds: Option<f64>,
}

impl Evaluated {
    /// The evaluation times of `time`.
    pub fn of(time: QueryTime) -> Self {
        match time {
            QueryTime::Instant(t) => Self {
                time: Some(t.to_string()),
                ..Self::default()
            },
            QueryTime::Range { start, end, step } => Self {
                time: None,
                start: Some(start.to_string()),
                end: Some(end.to_string()),
                step_seconds: Some(step.as_secs_f64()),
            },
        }
    }
}

impl MetricsOutput {
    /// A result without series for `decision`, ending in `phase`.
    pub fn empty(
        source: &str,
        time: QueryTime,
        run_name: String,
        decision: &Decision,
        phase: Phase,
    ) -> Self {
        Self::decided(
            source,
            time,
            run_name,
            decision.verdict,
            &decision.rule,
            &decision.reason,
            phase,
        )
    }

    /// A result without series, ending in `phase` after policy decided `verdict` by `rule`.
    pub fn decided(
        source: &str,
        time: QueryTime,
        run_name: String,
        verdict: Verdict,
        rule: &str,
        reason: &str,
        phase: Phase,
    ) -> Self {
        Self {
            result_type: ResultType::Vector,
            result: Vec::new(),
            truncated: false,
            series_total: 0,
            warnings: Vec::new(),
            source: source.to_owned(),
            evaluated: Evaluated::of(time),
            run_name,
            verdict,
            rule: rule.to_owned(),
            reason: reason.to_owned(),
            phase,
            message: None,
        }
    }

    /// The result of an evaluated query.
    pub fn with_result(mut self, result: MetricsResult) -> Self {
        self.result_type = result.result_type;
        self.result = result.result;
        self.truncated = result.truncated;
        self.series_total = result.series_total;
        self.warnings = result.warnings;
        self
    }

    /// Text a model can act on for a result that is not a success.
    pub fn error_text(&self) -> Option<String> {
        Summary {
            subject: "metrics query",
            delivers: "its result",
            phase: self.phase,
            verdict: self.verdict,
            run_name: &self.run_name,
            rule: &self.rule,
            reason: &self.reason,
            message: self.message.as_deref(),
        }
        .error_text()
    }
}

/// Validates the raw arguments of `fetch_metrics` (the PromQL's syntax included), or says
/// exactly what to fix. Returns the arguments and the resolved query.
pub fn parse_args(
    args: &JsonObject,
    now: Timestamp,
) -> Result<(FetchMetricsArgs, MetricsQuery), String> {
    const NAMES: [&str; 7] = [
        "query",
        "time",
        "range",
        "start",
        "end",
        "step",
        "environment",
    ];
    if let Some(unknown) = unknown_argument(args, &NAMES) {
        return Err(format!(
            "unknown argument `{unknown}`; fetch_metrics accepts `query` (PromQL, required), \
             `time` (instant), or `range` / `start`, `end`, `step` (range query), and \
             `environment`"
        ));
    }
    let query = match args.get("query") {
        None | Some(Value::Null) => {
            return Err(format!(
                "missing required argument `query`: pass a PromQL expression, for example \
                 {{\"query\": {EXAMPLE_QUERY:?}}}"
            ));
        }
        Some(Value::String(q)) => q.clone(),
        Some(_) => {
            return Err(format!(
                "argument `query` must be a string (a PromQL expression), for example \
                 {EXAMPLE_QUERY}"
            ));
        }
    };
    // Times and steps may come as strings or as numbers (unix seconds, seconds).
    let text = |name: &str| -> Result<Option<String>, String> {
        match args.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(format!(
                "argument `{name}` must be a string (RFC 3339 time, unix seconds or a duration \
                 such as 5m)"
            )),
        }
    };
    let environment = environment(args)?;
    let parsed = FetchMetricsArgs {
        query,
        time: text("time")?,
        range: text("range")?,
        start: text("start")?,
        end: text("end")?,
        step: text("step")?,
        environment,
    };
    let time = parsed.time_args().resolve(now).map_err(|e| e.to_string())?;
    check_query(&parsed.query).map_err(|e| match e {
        MetricsError::Parse(_) => format!("{e}; a valid query is for example {EXAMPLE_QUERY}"),
        e => e.to_string(),
    })?;
    let query = MetricsQuery {
        query: parsed.query.clone(),
        time,
    };
    Ok((parsed, query))
}

/// What policy sees of a metrics call: the call as made, judged in the environment of the
/// Prometheus it reaches when that is more sensitive than the one it names (`bound`: the
/// endpoint's configured environment). `None` embedded, where a call reads this server's own
/// call record, scoped to the caller's own calls. The one builder of a metrics call's context.
pub fn call_context(bound: Option<Environment>, call: CallContext) -> CallContext {
    match bound {
        Some(bound) => call.reaching(bound),
        None => call,
    }
}

/// Runs a judged query against `source` with the decision's timeout, capped in series, samples
/// and bytes.
pub async fn execute(
    source: Source<'_>,
    query: &MetricsQuery,
    timeout: Duration,
) -> Result<MetricsResult, MetricsError> {
    check_query(&query.query)?;
    let result = match source {
        Source::Embedded(calls) => calls.evaluate(query, timeout).await,
        Source::Prometheus(client) => client.with_timeout(timeout).query(query).await,
    };
    result.map(|r| r.capped_to_bytes(RESULT_MAX_BYTES))
}

/// The query as `decision` lets it run: every selector limited to the deciding rule's metric
/// names and pinned to its labels, and, over the embedded call record (`caller` is the asking
/// agent), to the caller's own calls unless the rule allows every agent.
pub fn scoped(
    query: &MetricsQuery,
    decision: &Decision,
    caller: Option<&str>,
) -> Result<MetricsQuery, MetricsError> {
    let rules = decision.metrics.clone().unwrap_or_default();
    let scope = Scope::of(&rules, caller);
    Ok(MetricsQuery {
        query: scope.apply(&query.query)?,
        time: query.time,
    })
}

/// Where a metrics query is answered.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// The embedded server's own record of tool calls.
    Embedded(&'a CallStore),
    /// A Prometheus HTTP API (the operator's).
    Prometheus(&'a PrometheusClient),
}

/// The terminal phase, reason and message of an executed query (the same words in the
/// operator's status and embedded).
pub fn outcome(result: &Result<MetricsResult, MetricsError>) -> (Phase, Reason, String) {
    match result {
        Ok(r) => (
            Phase::Succeeded,
            Reason::QueryCompleted,
            format!(
                "the query returned {} series with {} samples{}",
                r.result.len(),
                r.sample_count(),
                if r.truncated {
                    format!(" (truncated from {} series)", r.series_total)
                } else {
                    String::new()
                }
            ),
        ),
        Err(e) => {
            let (phase, reason) = match e {
                MetricsError::Timeout(_) => (Phase::TimedOut, Reason::QueryTimedOut),
                MetricsError::Unavailable(_) => (Phase::Failed, Reason::PrometheusUnavailable),
                e if e.is_query_error() => (Phase::Failed, Reason::InvalidQuery),
                _ => (Phase::Failed, Reason::QueryFailed),
            };
            (phase, reason, e.to_string())
        }
    }
}

impl ToolSpec for FetchMetrics {
    const TOOL: Tool = Tool::Metrics;
    const INSTRUCTIONS: &'static str = INSTRUCTIONS;
    type Args = FetchMetricsArgs;
    type Call = MetricsCall;
    type Output = MetricsOutput;

    fn parse(args: &JsonObject, ctx: &ParseContext) -> Result<MetricsCall, String> {
        let (parsed, query) = parse_args(args, ctx.now)?;
        Ok(MetricsCall {
            query,
            environment: parsed.environment,
        })
    }

    fn environment(call: &MetricsCall) -> Environment {
        call.environment
    }

    fn summary(output: &MetricsOutput) -> CallSummary {
        CallSummary::of(output.phase, Some(output.verdict), &output.run_name)
    }

    fn error_text(_: &MetricsCall, output: &MetricsOutput, _: &ParseContext) -> Option<String> {
        output.error_text()
    }

    async fn run_embedded(
        embedded: &Embedded,
        agent: &str,
        run_name: String,
        call: MetricsCall,
        _output: Option<crate::runner::OutputFn>,
    ) -> Result<MetricsOutput, String> {
        let context = call_context(
            None,
            CallContext::new(agent, Tool::Metrics, call.environment),
        );
        let decision = embedded.policy.evaluate(&context);
        tracing::info!(
            run = %run_name, agent, verdict = %decision.verdict, rule = %decision.rule,
            "fetch_metrics decision"
        );
        let out = |phase| {
            MetricsOutput::empty(
                "embedded",
                call.query.time,
                run_name.clone(),
                &decision,
                phase,
            )
        };
        if decision.verdict != Verdict::Allow {
            return Ok(out(Phase::Rejected));
        }
        let timeout = Duration::from_secs(u64::from(decision.limits.timeout_seconds));
        // Embedded, an agent reads its own calls only, unless policy says otherwise.
        let result = match scoped(&call.query, &decision, Some(agent)) {
            Ok(query) => execute(Source::Embedded(&embedded.calls), &query, timeout).await,
            Err(e) => Err(e),
        };
        let (phase, _, message) = outcome(&result);
        Ok(match result {
            Ok(r) => out(phase).with_result(r),
            Err(_) => MetricsOutput {
                message: Some(message),
                ..out(phase)
            },
        })
    }
}

/// The tool's part of the server's instructions ([`ToolSpec::INSTRUCTIONS`]).
pub const INSTRUCTIONS: &str = "fetch_metrics evaluates one PromQL expression, as an instant \
query or over a range, and returns its series as Prometheus's API shapes them; its description \
says which metrics there are.";

/// What a model reads about the tool before calling it (the tool's `description`).
pub const DESCRIPTION: &str = "Evaluate a PromQL expression and return its series (labels and samples) as \
Prometheus's API shapes them: an instant query at `time` (default now), or a \
range query over the last `range` (1h, 30m) or from `start` to `end` every \
`step`. In a cluster the query runs against the configured Prometheus. Embedded, \
it answers over this server's own counter sandboxrun_tool_calls_total (one \
increment per tool call, blocked ones included; labels tool = run_python | \
execute_sql | fetch_metrics, agent, environment, verdict = Allow | Block | \
Escalate, phase = Succeeded | Failed | TimedOut | Rejected | AwaitingApproval | \
InvalidArguments | Cancelled | Unavailable): the number of run_python calls in \
the last hour is \
sum(increase(sandboxrun_tool_calls_total{tool=\"run_python\"}[1h])). A PromQL \
syntax error comes back with its position; a refused or failed query as an error \
result that says what to change. An empty result means no series matched (for a \
count of calls: none).";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::JsonObject;
    use serde_json::json;

    fn obj(v: Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_764_410_400).unwrap()
    }

    #[test]
    fn valid_arguments_parse_and_resolve() {
        let (args, q) = parse_args(&obj(json!({"query": EXAMPLE_QUERY})), now()).unwrap();
        assert_eq!(args.environment, Environment::Sandbox);
        assert_eq!(q.time, QueryTime::Instant(now()));
        let (_, q) = parse_args(
            &obj(json!({"query": "up", "range": "1h", "step": 60, "environment": "staging"})),
            now(),
        )
        .unwrap();
        assert_eq!(
            q.time,
            QueryTime::Range {
                start: Timestamp::from_second(1_764_410_400 - 3600).unwrap(),
                end: now(),
                step: Duration::from_secs(60)
            }
        );
    }

    #[test]
    fn each_mistake_gets_its_own_message() {
        let err = |v| parse_args(&obj(v), now()).unwrap_err();
        assert!(err(json!({})).starts_with("missing required argument `query`"));
        assert!(err(json!({"query": 5})).contains("must be a string"));
        assert!(err(json!({"query": "up", "window": "1h"})).contains("unknown argument `window`"));
        assert!(err(json!({"query": "up", "time": "1", "range": "1h"})).contains("not both"));
        assert!(err(json!({"query": "up", "range": "soon"})).contains("argument `range`"));
        assert!(err(json!({"query": "up", "environment": "prod"})).contains("sandbox, staging"));
        assert!(err(json!({"query": "  "})).contains("empty"));
        let e = err(json!({"query": "sum(rate(x[5m]) by ("}));
        assert!(e.starts_with("the query is not valid PromQL"), "{e}");
        assert!(e.contains("line 1, column 4"), "{e}");
    }

    #[test]
    fn schemas_describe_the_wire_format() {
        let input = schemars::schema_for!(FetchMetricsArgs);
        let v = serde_json::to_value(&input).unwrap();
        assert_eq!(v["required"], json!(["query"]));
        for f in ["time", "range", "start", "end", "step", "environment"] {
            assert!(v["properties"].get(f).is_some(), "{f}");
        }
        let output = serde_json::to_value(schemars::schema_for!(MetricsOutput)).unwrap();
        // Portable: no type arrays with null (single-type schema dialects reject them).
        let text = format!("{v}{output}");
        assert!(!text.contains("\"null\""), "{text}");
        for f in [
            "resultType",
            "result",
            "truncated",
            "seriesTotal",
            "source",
            "evaluated",
            "runName",
            "verdict",
            "rule",
            "reason",
            "phase",
        ] {
            assert!(output["properties"].get(f).is_some(), "{f} in {output}");
        }
    }
}

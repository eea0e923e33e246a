//! The `fetch_metrics` tool's domain side in the frontend: the arguments, the result the agent
//! sees, the early policy check and (embedded mode) the evaluation over the frontend's own record
//! of tool calls.
//!
//! Every tool call of this process (run_python, execute_sql, fetch_metrics; allowed, blocked,
//! escalated or malformed) is recorded in a [`CallStore`] as the counter
//! `sandboxrun_tool_calls_total{tool, agent, environment, verdict, phase}` (see
//! [`sandboxrun_core::metrics::CALLS_METRIC`]). Embedded (`--backend local`), `fetch_metrics`
//! judges the call with the policy (`--policy-file`, else the embedded default, which allows it)
//! and evaluates the PromQL over that record, exactly: "how many run_python calls in the last
//! hour?" is `sum(increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))`.
//!
//! In cluster mode (`--backend kube`) each call becomes a SandboxRun with `spec.metrics`; the
//! operator judges it, sends the query to the Prometheus it is configured with and writes
//! `status.result`, which [`from_status`] maps to the same output. Relative times (`range`, a
//! missing `time`) are resolved here, when the agent asks, so a run that waits for approval
//! still answers the question that was asked.

use std::time::Duration;

use jiff::Timestamp;
use rmcp::model::{CallToolResult, JsonObject};
use sandboxrun_api::SandboxRunStatus;
use sandboxrun_core::metrics::{
    CallStore, MetricsError, MetricsQuery, MetricsResult, QueryTime, ResultType, Series, TimeArgs,
    check_syntax,
};
use sandboxrun_core::{CallContext, Decision, Environment, Phase, PolicyStore, Tool, Verdict};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::backend::kube::KubeBackend;
use crate::backend::{BackendError, ProgressFn};

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
    #[schemars(length(min = 1, max = sandboxrun_core::metrics::MAX_QUERY_BYTES))]
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
    fn time_args(&self) -> TimeArgs {
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
    fn of(time: QueryTime) -> Self {
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
        Self {
            result_type: ResultType::Vector,
            result: Vec::new(),
            truncated: false,
            series_total: 0,
            warnings: Vec::new(),
            source: source.to_owned(),
            evaluated: Evaluated::of(time),
            run_name,
            verdict: decision.verdict,
            rule: decision.rule.clone(),
            reason: decision.reason.clone(),
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
        crate::governed::Summary {
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

    /// The MCP result: `structuredContent` always, the same JSON as text, and for anything but
    /// success first a sentence saying what happened and what to change.
    pub fn tool_result(&self) -> CallToolResult {
        let value = serde_json::to_value(self).expect("MetricsOutput serializes");
        crate::governed::tool_result(value, self.error_text())
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
    if let Some(unknown) = args.keys().find(|k| !NAMES.contains(&k.as_str())) {
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
    let environment = match args.get("environment") {
        None | Some(Value::Null) => Environment::Sandbox,
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            format!("argument `environment` is {v}; it must be one of sandbox, staging, production")
        })?,
    };
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
    check_syntax(&parsed.query).map_err(|e| match e {
        MetricsError::Parse(_) => format!("{e}; a valid query is for example {EXAMPLE_QUERY}"),
        e => e.to_string(),
    })?;
    let query = MetricsQuery {
        query: parsed.query.clone(),
        time,
    };
    Ok((parsed, query))
}

/// Where `fetch_metrics` calls are judged and executed.
pub enum MetricsService {
    /// Embedded: the frontend judges with its policy and evaluates over its own call record.
    Local {
        /// The policy (a `--policy-file`, or the embedded default).
        policy: PolicyStore,
        /// The record of this process's tool calls.
        calls: CallStore,
    },
    /// Cluster: each call becomes a SandboxRun with `spec.metrics`; the operator judges it and
    /// queries its Prometheus.
    Cluster(Box<KubeBackend>),
}

impl MetricsService {
    /// Judges and (when allowed) evaluates one query for `agent`.
    pub async fn fetch(
        &self,
        agent: &str,
        args: &FetchMetricsArgs,
        query: &MetricsQuery,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<MetricsOutput, BackendError> {
        match self {
            Self::Local { policy, calls } => Ok(fetch_local(policy, calls, agent, args, query)),
            Self::Cluster(kube) => {
                kube.fetch_metrics(agent, args.environment, query, progress, cancel)
                    .await
            }
        }
    }
}

/// The embedded path: policy, then PromQL over the call record.
fn fetch_local(
    policy: &PolicyStore,
    calls: &CallStore,
    agent: &str,
    args: &FetchMetricsArgs,
    query: &MetricsQuery,
) -> MetricsOutput {
    let run_name = format!("local-{}", uuid::Uuid::new_v4().simple());
    let decision = policy.evaluate(&CallContext::new(agent, Tool::Metrics, args.environment));
    tracing::info!(
        run = %run_name, agent, verdict = ?decision.verdict, rule = %decision.rule,
        "fetch_metrics decision"
    );
    let out =
        |phase| MetricsOutput::empty("embedded", query.time, run_name.clone(), &decision, phase);
    if decision.verdict != Verdict::Allow {
        return out(Phase::Rejected);
    }
    match calls.query(query) {
        Ok(result) => out(Phase::Succeeded).with_result(result),
        Err(e) => MetricsOutput {
            message: Some(e.to_string()),
            ..out(Phase::Failed)
        },
    }
}

/// Reads the result of a metrics SandboxRun: `None` until it is terminal or awaits approval.
pub fn from_status(
    name: &str,
    status: &SandboxRunStatus,
    time: QueryTime,
) -> Option<MetricsOutput> {
    let phase = status.phase?;
    if !phase.is_terminal() && phase != Phase::AwaitingApproval {
        return None;
    }
    let decision = Decision {
        verdict: status
            .decision
            .as_ref()
            .map_or(Verdict::Allow, |d| d.verdict),
        rule: status
            .decision
            .as_ref()
            .map(|d| d.rule.clone())
            .unwrap_or_default(),
        reason: status
            .decision
            .as_ref()
            .map(|d| d.reason.clone())
            .unwrap_or_default(),
        limits: Default::default(),
        max_rows: 0,
        rewritten_query: None,
    };
    let mut out = MetricsOutput {
        message: status.message.clone(),
        ..MetricsOutput::empty("prometheus", time, name.to_owned(), &decision, phase)
    };
    if let Some(result) = status.result.as_ref() {
        match serde_json::from_value::<MetricsResult>(result.clone()) {
            Ok(r) => out = out.with_result(r),
            Err(e) => {
                out.phase = Phase::Failed;
                out.message = Some(format!(
                    "the operator wrote a result this frontend cannot read ({e}); check that the \
                     operator and the frontend are the same version"
                ));
            }
        }
    }
    Some(out)
}

/// The SandboxRun spec fields of a query: the expression, an explicit instant, or the range.
pub fn spec_of(query: &MetricsQuery) -> sandboxrun_api::MetricsSpec {
    match query.time {
        QueryTime::Instant(t) => sandboxrun_api::MetricsSpec {
            query: query.query.clone(),
            time: Some(t.to_string()),
            range: None,
        },
        QueryTime::Range { start, end, step } => sandboxrun_api::MetricsSpec {
            query: query.query.clone(),
            time: None,
            range: Some(sandboxrun_api::MetricsRange {
                start: start.to_string(),
                end: end.to_string(),
                step: format_step(step),
            }),
        },
    }
}

fn format_step(step: Duration) -> String {
    if step.subsec_millis() == 0 {
        format!("{}s", step.as_secs())
    } else {
        format!("{}", step.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let spec = spec_of(&q);
        let range = spec.range.unwrap();
        assert_eq!(range.step, "60s");
        assert_eq!(range.end, "2025-11-29T10:00:00Z");
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

    #[test]
    fn operator_results_map_to_the_output() {
        let status: SandboxRunStatus = serde_json::from_value(json!({
            "phase": "Succeeded",
            "decision": {"verdict": "Allow", "rule": "r", "reason": "ok"},
            "result": {"resultType": "vector", "truncated": false, "seriesTotal": 1,
                "result": [{"metric": {"job": "prometheus"}, "value": [1.5, "1"]}]}
        }))
        .unwrap();
        let out = from_status("run-x", &status, QueryTime::Instant(now())).unwrap();
        assert_eq!(out.phase, Phase::Succeeded);
        assert_eq!(out.source, "prometheus");
        assert_eq!(out.result[0].metric["job"], "prometheus");
        assert_eq!(out.result[0].value, Some((1.5, "1".to_owned())));
        assert!(out.error_text().is_none());
        let running: SandboxRunStatus =
            serde_json::from_value(json!({"phase": "Running"})).unwrap();
        assert!(from_status("run-x", &running, QueryTime::Instant(now())).is_none());
        let failed: SandboxRunStatus = serde_json::from_value(json!({
            "phase": "Failed", "message": "Prometheus answered bad_data: x",
            "decision": {"verdict": "Allow", "rule": "r", "reason": "ok"}
        }))
        .unwrap();
        let out = from_status("run-x", &failed, QueryTime::Instant(now())).unwrap();
        assert!(
            out.error_text()
                .unwrap()
                .contains("Prometheus answered bad_data")
        );
    }
}

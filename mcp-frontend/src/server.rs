//! The MCP server: one `ServerHandler` with the `run_python` tool (and `execute_sql` when SQL is
//! enabled), shared by every transport (stdio, Streamable HTTP, legacy SSE). Each tool validates
//! its arguments, delegates to the backend or the SQL service, and turns the result into
//! `structuredContent` plus text a model can act on.

use std::sync::Arc;
use std::time::Instant;

use axum::http::request::Parts;
use rmcp::handler::server::common::{schema_for_input, schema_for_output};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ProgressNotificationParam, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use sandboxrun_core::limits::{MAX_CODE_BYTES, MAX_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS};
use sandboxrun_core::metrics::{CallRecord, CallStore};
use sandboxrun_core::{Environment, Phase, Tool, Verdict};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::backend::{Backend, BackendError, ProgressFn, RunOutput, RunRequest};
use crate::fetch_metrics::{FetchMetricsArgs, MetricsOutput, MetricsService};
use crate::metrics::{Metrics, Outcome};
use crate::policy::Policy;
use crate::sql::{SqlOutput, SqlService};

/// What the server tells a client (and its model) about itself at initialization.
pub const INSTRUCTIONS: &str = "sandboxrun runs untrusted Python code for you in a single-use \
sandbox with no network, a read-only filesystem (only /tmp is writable and small), and CPU, \
memory, process and time limits. Call run_python with the source in `code`; print what you need, \
since only stdout, stderr and the exit code come back. Each call starts from a clean sandbox: \
nothing persists between calls. Only the Python standard library is available.";

/// The `phase` label of calls that ended without a run phase (see `CALLS_METRIC`).
const INVALID: &str = "InvalidArguments";
const CANCELLED: &str = "Cancelled";
const UNAVAILABLE: &str = "Unavailable";

/// Identity of an authenticated HTTP caller. The auth layer puts it into the request's
/// extensions; rmcp hands the request's `http::request::Parts` to the tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agent(pub String);

/// Arguments of `run_python` (the tool's `inputSchema`). The tool parses the raw arguments
/// itself (see [`parse_args`]) so each mistake gets its own actionable message.
#[derive(Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::portable)]
pub struct RunPythonArgs {
    /// Python 3 source code to run, as a complete program (at most 262144 bytes). Print the
    /// results you need: stdout, stderr and the exit code are returned.
    #[schemars(length(min = 1, max = MAX_CODE_BYTES))]
    pub code: String,
    /// Wall-clock limit in seconds (default 30). The run is stopped and reported as TimedOut
    /// past it.
    // Optional, not nullable: `["integer", "null"]` types trip single-type schema dialects.
    #[serde(default)]
    #[schemars(with = "u32", range(min = MIN_TIMEOUT_SECONDS, max = MAX_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<u32>,
}

/// Everything the handler needs, shared by all sessions.
pub struct Shared {
    /// Where code runs.
    pub backend: Arc<dyn Backend>,
    /// Limits and maxima enforced before anything runs.
    pub policy: Policy,
    /// Tool-call counters and latency.
    pub metrics: Arc<Metrics>,
    /// The `execute_sql` tool's policy and databases; `None` when SQL is not enabled, and then
    /// the tool is not offered.
    pub sql: Option<Arc<SqlService>>,
    /// The `fetch_metrics` tool's policy and source; `None` when metrics are not enabled, and
    /// then the tool is not offered.
    pub fetch_metrics: Option<Arc<MetricsService>>,
    /// Every tool call of this process, for `fetch_metrics` in embedded mode.
    pub calls: CallStore,
}

/// The MCP server. Cheap to clone: one per session.
#[derive(Clone)]
pub struct SandboxRunServer {
    tool_router: ToolRouter<Self>,
    shared: Arc<Shared>,
    /// Caller identity when the transport carries none per request: the local user for stdio,
    /// the authenticated agent of a legacy SSE session.
    default_agent: Option<String>,
}

impl SandboxRunServer {
    /// A server for one session; `default_agent` is used when a request carries no [`Agent`].
    pub fn new(shared: Arc<Shared>, default_agent: Option<String>) -> Self {
        let mut tool_router = Self::tool_router();
        if shared.sql.is_none() {
            tool_router.remove_route("execute_sql");
        }
        if shared.fetch_metrics.is_none() {
            tool_router.remove_route("fetch_metrics");
        }
        Self {
            tool_router,
            shared,
            default_agent,
        }
    }

    /// The caller: the per-request agent set by HTTP auth, else the session's default.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> String {
        ctx.extensions
            .get::<Parts>()
            .and_then(|parts| parts.extensions.get::<Agent>())
            .or_else(|| ctx.extensions.get::<Agent>())
            .map(|a| a.0.clone())
            .or_else(|| self.default_agent.clone())
            .unwrap_or_else(|| "anonymous".to_owned())
    }

    /// Records a finished call in the call record `fetch_metrics` reads (`phase`: how it ended).
    fn record_call(
        &self,
        tool: Tool,
        agent: &str,
        environment: Environment,
        verdict: Option<Verdict>,
        phase: &str,
    ) {
        self.shared
            .calls
            .record(&CallRecord::new(tool, agent, environment, verdict, phase));
    }
}

/// The verdict behind a run's phase when the tool reports none (run_python): a rejection is a
/// block, an awaited approval an escalation, anything that ran was allowed.
fn verdict_of(phase: Phase) -> Verdict {
    match phase {
        Phase::Rejected => Verdict::Block,
        Phase::AwaitingApproval => Verdict::Escalate,
        _ => Verdict::Allow,
    }
}

fn input_schema() -> Arc<JsonObject> {
    schema_for_input::<RunPythonArgs>().expect("RunPythonArgs has an object schema")
}

fn output_schema() -> Arc<JsonObject> {
    schema_for_output::<RunOutput>()
}

fn sql_input_schema() -> Arc<JsonObject> {
    schema_for_input::<crate::sql::ExecuteSqlArgs>().expect("ExecuteSqlArgs has an object schema")
}

fn sql_output_schema() -> Arc<JsonObject> {
    schema_for_output::<SqlOutput>()
}

fn metrics_input_schema() -> Arc<JsonObject> {
    schema_for_input::<FetchMetricsArgs>().expect("FetchMetricsArgs has an object schema")
}

fn metrics_output_schema() -> Arc<JsonObject> {
    schema_for_output::<MetricsOutput>()
}

#[tool_router]
impl SandboxRunServer {
    /// Runs Python code in a fresh, isolated sandbox and returns its stdout, stderr and exit code.
    #[tool(
        name = "run_python",
        title = "Run Python in a sandbox",
        description = "Run a Python 3 program in a fresh, isolated sandbox (no network, read-only \
            filesystem except a small /tmp, limited CPU, memory, processes and time; standard \
            library only) and return its stdout, stderr and exit code. Print what you need. A \
            non-zero exit, a timeout or a rejection is reported as an error result that says \
            what to change.",
        input_schema = input_schema(),
        output_schema = output_schema(),
        annotations(
            title = "Run Python in a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn run_python(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let started = Instant::now();
        let metrics = &self.shared.metrics;
        let policy = &self.shared.policy;
        let agent = self.caller(&ctx);
        let args = match parse_args(&args, policy.max_timeout_seconds) {
            Ok(parsed) => parsed,
            Err(message) => {
                metrics.observe_call("run_python", Outcome::InvalidArguments, started.elapsed());
                self.record_call(Tool::Python, &agent, Environment::Sandbox, None, INVALID);
                return Ok(CallToolResult::error(vec![ContentBlock::text(message)]));
            }
        };
        let req = RunRequest {
            agent: agent.clone(),
            code: args.code,
            limits: policy.limits_with_timeout(args.timeout_seconds),
        };
        let timeout_seconds = req.limits.timeout_seconds;
        tracing::info!(
            backend = self.shared.backend.name(),
            agent = %req.agent,
            bytes = req.code.len(),
            timeout_seconds,
            "run_python"
        );
        let (progress, forwarder) = progress_forwarder(&ctx);
        // Notifications go out while the run goes on; the forwarder ends once the backend has
        // dropped the progress function, so they all precede the result (on Streamable HTTP
        // the response closes the request's stream).
        let (result, ()) = tokio::join!(
            self.shared
                .backend
                .run_python(req, progress, ctx.ct.clone()),
            forwarder
        );
        let (verdict, phase) = match &result {
            Ok(output) => (Some(verdict_of(output.phase)), output.phase.as_str()),
            Err(BackendError::Cancelled) => (None, CANCELLED),
            Err(BackendError::Unavailable(_)) => (None, UNAVAILABLE),
        };
        self.record_call(Tool::Python, &agent, Environment::Sandbox, verdict, phase);
        let (outcome, tool_result) = match result {
            Ok(output) => (
                outcome_of(&output),
                tool_result(&output, timeout_seconds, policy.max_timeout_seconds),
            ),
            Err(BackendError::Cancelled) => (
                Outcome::Cancelled,
                CallToolResult::error(vec![ContentBlock::text(
                    "the call was cancelled and its run stopped",
                )]),
            ),
            Err(BackendError::Unavailable(message)) => {
                tracing::warn!(%message, "backend unavailable");
                (
                    Outcome::Unavailable,
                    CallToolResult::error(vec![ContentBlock::text(format!(
                        "the sandbox service could not run the code: {message}; retrying later \
                         may help"
                    ))]),
                )
            }
        };
        metrics.observe_call("run_python", outcome, started.elapsed());
        Ok(tool_result)
    }

    /// Runs one read-only SQL query, checked by policy, and returns its columns and rows.
    #[tool(
        name = "execute_sql",
        title = "Run a read-only SQL query",
        description = "Run one read-only SQL query (a single SELECT or WITH ... SELECT) against a \
            configured database and return its columns and rows. The query is checked by policy \
            before it runs: only allowed tables and columns, no SELECT * unless allowed, no \
            writes, one statement; a LIMIT is added or lowered to the policy's cap, and the \
            executed query is returned in executedQuery. A refused query is an error result \
            that names the policy rule and says what to change.",
        input_schema = sql_input_schema(),
        output_schema = sql_output_schema(),
        annotations(
            title = "Run a read-only SQL query",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn execute_sql(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let started = Instant::now();
        let metrics = &self.shared.metrics;
        let Some(sql) = self.shared.sql.as_ref() else {
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                "execute_sql is not enabled on this server",
            )]));
        };
        let agent = self.caller(&ctx);
        let args = match crate::sql::parse_args(&args) {
            Ok(parsed) => parsed,
            Err(message) => {
                metrics.observe_call("execute_sql", Outcome::InvalidArguments, started.elapsed());
                self.record_call(Tool::Sql, &agent, Environment::Sandbox, None, INVALID);
                return Ok(CallToolResult::error(vec![ContentBlock::text(message)]));
            }
        };
        tracing::info!(agent = %agent, database = %args.database, "execute_sql");
        let (progress, forwarder) = progress_forwarder(&ctx);
        // While the run waits for an approval the notifications must reach the caller then,
        // not with the result: the forwarder runs alongside (see run_python).
        let (result, ()) = tokio::join!(
            sql.execute(&agent, &args, progress, ctx.ct.clone()),
            forwarder
        );
        let output = match result {
            Ok(output) => output,
            Err(BackendError::Cancelled) => {
                metrics.observe_call("execute_sql", Outcome::Cancelled, started.elapsed());
                self.record_call(Tool::Sql, &agent, args.environment, None, CANCELLED);
                return Ok(CallToolResult::error(vec![ContentBlock::text(
                    "the call was cancelled and its query stopped",
                )]));
            }
            Err(BackendError::Unavailable(message)) => {
                tracing::warn!(%message, "backend unavailable");
                metrics.observe_call("execute_sql", Outcome::Unavailable, started.elapsed());
                self.record_call(Tool::Sql, &agent, args.environment, None, UNAVAILABLE);
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "the query could not be run: {message}; retrying later may help"
                ))]));
            }
        };
        let outcome = match output.phase {
            Phase::Succeeded => Outcome::Succeeded,
            Phase::Rejected | Phase::AwaitingApproval => Outcome::Rejected,
            Phase::TimedOut => Outcome::TimedOut,
            _ => Outcome::Failed,
        };
        metrics.observe_call("execute_sql", outcome, started.elapsed());
        self.record_call(
            Tool::Sql,
            &agent,
            args.environment,
            Some(output.verdict),
            output.phase.as_str(),
        );
        Ok(output.tool_result())
    }

    /// Runs one PromQL query, checked by policy, and returns its series.
    #[tool(
        name = "fetch_metrics",
        title = "Query metrics with PromQL",
        description = "Evaluate a PromQL expression and return its series (labels and samples) \
            as Prometheus's API shapes them: an instant query at `time` (default now), or a \
            range query over the last `range` (1h, 30m) or from `start` to `end` every `step`. \
            In a cluster the query runs against the configured Prometheus. Embedded, it answers \
            over this server's own counter sandboxrun_tool_calls_total (one increment per tool \
            call, blocked ones included; labels tool = run_python | execute_sql | \
            fetch_metrics, agent, environment, verdict = Allow | Block | Escalate, phase = \
            Succeeded | Failed | TimedOut | Rejected | AwaitingApproval | InvalidArguments | \
            Cancelled | Unavailable): the number of run_python calls in the last hour is \
            sum(increase(sandboxrun_tool_calls_total{tool=\"run_python\"}[1h])). A PromQL \
            syntax error comes back with its position; a refused or failed query as an error \
            result that says what to change. An empty result means no series matched (for a \
            count of calls: none).",
        input_schema = metrics_input_schema(),
        output_schema = metrics_output_schema(),
        annotations(
            title = "Query metrics with PromQL",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn fetch_metrics(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        const TOOL: &str = "fetch_metrics";
        let started = Instant::now();
        let metrics = &self.shared.metrics;
        let Some(service) = self.shared.fetch_metrics.as_ref() else {
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                "fetch_metrics is not enabled on this server",
            )]));
        };
        let agent = self.caller(&ctx);
        let (args, query) = match crate::fetch_metrics::parse_args(&args, jiff::Timestamp::now()) {
            Ok(parsed) => parsed,
            Err(message) => {
                metrics.observe_call(TOOL, Outcome::InvalidArguments, started.elapsed());
                self.record_call(Tool::Metrics, &agent, Environment::Sandbox, None, INVALID);
                return Ok(CallToolResult::error(vec![ContentBlock::text(message)]));
            }
        };
        tracing::info!(agent = %agent, query = %args.query, "fetch_metrics");
        let (progress, forwarder) = progress_forwarder(&ctx);
        // Notifications reach the caller while an escalated run waits (see run_python).
        let (result, ()) = tokio::join!(
            service.fetch(&agent, &args, &query, progress, ctx.ct.clone()),
            forwarder
        );
        let output = match result {
            Ok(output) => output,
            Err(BackendError::Cancelled) => {
                metrics.observe_call(TOOL, Outcome::Cancelled, started.elapsed());
                self.record_call(Tool::Metrics, &agent, args.environment, None, CANCELLED);
                return Ok(CallToolResult::error(vec![ContentBlock::text(
                    "the call was cancelled and its query stopped",
                )]));
            }
            Err(BackendError::Unavailable(message)) => {
                tracing::warn!(%message, "backend unavailable");
                metrics.observe_call(TOOL, Outcome::Unavailable, started.elapsed());
                self.record_call(Tool::Metrics, &agent, args.environment, None, UNAVAILABLE);
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "the metrics query could not be run: {message}; retrying later may help"
                ))]));
            }
        };
        let outcome = match output.phase {
            Phase::Succeeded => Outcome::Succeeded,
            Phase::Rejected | Phase::AwaitingApproval => Outcome::Rejected,
            Phase::TimedOut => Outcome::TimedOut,
            _ => Outcome::Failed,
        };
        metrics.observe_call(TOOL, outcome, started.elapsed());
        self.record_call(
            Tool::Metrics,
            &agent,
            args.environment,
            Some(output.verdict),
            output.phase.as_str(),
        );
        Ok(output.tool_result())
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxRunServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("sandboxrun", env!("CARGO_PKG_VERSION"))
                    .with_title("sandboxrun"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    /// Like the generated router call, but an unknown tool gets a message naming the tools
    /// that exist, so a model can correct itself.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if self.tool_router.get(&request.name).is_none() {
            let known: Vec<String> = self
                .tool_router
                .list_all()
                .into_iter()
                .map(|t| t.name.to_string())
                .collect();
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool `{}`; this server offers: {}",
                    request.name,
                    known.join(", ")
                ),
                None,
            ));
        }
        let tcc = ToolCallContext::new(self, request, context);
        self.tool_router.call(tcc).await
    }
}

/// Validates the raw arguments of `run_python`: returns the code and the requested timeout, or
/// a message that says exactly what to fix.
pub fn parse_args(args: &JsonObject, max_timeout: u32) -> Result<RunPythonArgs, String> {
    const EXAMPLE: &str = r#"for example {"code": "print(6*7)"}"#;
    if let Some(unknown) = args
        .keys()
        .find(|k| k.as_str() != "code" && k.as_str() != "timeoutSeconds")
    {
        return Err(format!(
            "unknown argument `{unknown}`; run_python accepts `code` (string, required) and \
             `timeoutSeconds` (integer, optional)"
        ));
    }
    let code = match args.get("code") {
        None | Some(Value::Null) => {
            return Err(format!(
                "missing required argument `code`: pass the Python source to run as a string, \
                 {EXAMPLE}"
            ));
        }
        Some(Value::String(code)) => code,
        Some(other) => {
            return Err(format!(
                "argument `code` must be a string of Python source, not {}; {EXAMPLE}",
                json_type(other)
            ));
        }
    };
    if code.trim().is_empty() {
        return Err(format!(
            "argument `code` is empty: pass the Python source to run, {EXAMPLE}"
        ));
    }
    if code.len() > MAX_CODE_BYTES as usize {
        return Err(format!(
            "argument `code` is {} bytes; the limit is {MAX_CODE_BYTES} bytes (256 KiB): send \
             shorter code, or generate large data inside the program instead of embedding it",
            code.len()
        ));
    }
    let range = format!("an integer number of seconds from {MIN_TIMEOUT_SECONDS} to {max_timeout}");
    let timeout = match args.get("timeoutSeconds") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(t) if (u64::from(MIN_TIMEOUT_SECONDS)..=u64::from(max_timeout)).contains(&t) => {
                Some(t as u32)
            }
            _ => {
                return Err(format!(
                    "argument `timeoutSeconds` is {n}; it must be {range}"
                ));
            }
        },
        Some(other) => {
            return Err(format!(
                "argument `timeoutSeconds` must be {range}, not {}",
                json_type(other)
            ));
        }
    };
    Ok(RunPythonArgs {
        code: code.clone(),
        timeout_seconds: timeout,
    })
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn outcome_of(output: &RunOutput) -> Outcome {
    match output.phase {
        Phase::Succeeded => Outcome::Succeeded,
        Phase::TimedOut => Outcome::TimedOut,
        Phase::Rejected => Outcome::Rejected,
        _ => Outcome::Failed,
    }
}

/// The MCP result of a finished run: `structuredContent` always; the same JSON as text; for a
/// failure, first a sentence saying what happened and what to change.
pub fn tool_result(output: &RunOutput, timeout_seconds: u32, max_timeout: u32) -> CallToolResult {
    let value = serde_json::to_value(output).expect("RunOutput serializes");
    if !output.is_error() {
        return CallToolResult::structured(value);
    }
    let text = output
        .error_text(timeout_seconds, max_timeout)
        .unwrap_or_else(|| format!("the run ended {}", output.phase));
    let mut result = CallToolResult::structured_error(value);
    result.content.insert(0, ContentBlock::text(text));
    result
}

/// Turns backend phases into `notifications/progress` when the request carries a progress
/// token. Notifications go out in order from one task; the returned future ends once the
/// progress function is dropped and everything queued was sent.
fn progress_forwarder(
    ctx: &RequestContext<RoleServer>,
) -> (ProgressFn, impl Future<Output = ()> + use<>) {
    let token = ctx.meta.get_progress_token();
    let peer = ctx.peer.clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<(Phase, String)>();
    let progress: ProgressFn = if token.is_some() {
        Arc::new(move |phase, run| {
            let _ = tx.send((phase, run.to_owned()));
        })
    } else {
        Arc::new(|_, _| {})
    };
    let forward = async move {
        let Some(token) = token else { return };
        let mut step = 0.0;
        while let Some((phase, run)) = rx.recv().await {
            let Some(message) = progress_message(phase, &run) else {
                continue;
            };
            step += 1.0;
            let param = ProgressNotificationParam::new(token.clone(), step).with_message(message);
            if let Err(e) = peer.notify_progress(param).await {
                tracing::debug!(error = %e, "could not send progress notification");
            }
        }
    };
    (progress, forward)
}

/// The progress message of a phase: the phase first (clients may match on it), then what it
/// means; an approval names the run a person has to approve.
fn progress_message(phase: Phase, run: &str) -> Option<String> {
    Some(match phase {
        Phase::Pending => "Pending: preparing the sandbox".to_owned(),
        Phase::Running => "Running: the code is executing".to_owned(),
        Phase::AwaitingApproval => format!(
            "AwaitingApproval: {run} waits for a person to approve it \
             (spec.approval.approved: true approves, false denies)"
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_while_awaiting_approval_names_the_run() {
        let m = progress_message(Phase::AwaitingApproval, "run-x7k2q").unwrap();
        // Clients match on the phase first, then find the run a person must approve.
        assert!(m.starts_with("AwaitingApproval: run-x7k2q "), "{m}");
        assert!(m.contains("spec.approval.approved"), "{m}");
        assert!(
            progress_message(Phase::Pending, "run-x")
                .unwrap()
                .starts_with("Pending: ")
        );
        assert_eq!(progress_message(Phase::Succeeded, "run-x"), None);
    }
    use serde_json::json;

    fn obj(v: Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn valid_arguments_parse() {
        assert_eq!(
            parse_args(&obj(json!({"code": "print(1)"})), 600),
            Ok(RunPythonArgs {
                code: "print(1)".to_owned(),
                timeout_seconds: None
            })
        );
        assert_eq!(
            parse_args(&obj(json!({"code": "x", "timeoutSeconds": 5})), 600),
            Ok(RunPythonArgs {
                code: "x".to_owned(),
                timeout_seconds: Some(5)
            })
        );
        assert_eq!(
            parse_args(&obj(json!({"code": "x", "timeoutSeconds": null})), 600),
            Ok(RunPythonArgs {
                code: "x".to_owned(),
                timeout_seconds: None
            })
        );
    }

    #[test]
    fn each_mistake_gets_its_own_message() {
        let err = |v| parse_args(&obj(v), 60).unwrap_err();
        assert!(err(json!({})).starts_with("missing required argument `code`"));
        assert!(
            err(json!({"code": 7})).contains("must be a string of Python source, not a number")
        );
        assert!(err(json!({"code": "  "})).contains("is empty"));
        assert!(err(json!({"code": "x", "timeoutSeconds": "5"})).contains("not a string"));
        assert!(err(json!({"code": "x", "timeoutSeconds": 0})).contains("from 1 to 60"));
        assert!(err(json!({"code": "x", "timeoutSeconds": 61})).contains("from 1 to 60"));
        assert!(err(json!({"code": "x", "timeoutSeconds": 2.5})).contains("is 2.5"));
        assert!(err(json!({"code": "x", "timeout": 5})).contains("unknown argument `timeout`"));
        let big = "#".repeat(MAX_CODE_BYTES as usize + 1);
        assert!(err(json!({ "code": big })).contains("the limit is 262144 bytes"));
    }

    #[test]
    fn schemas_describe_the_wire_format() {
        let input = Value::Object((*input_schema()).clone());
        assert_eq!(input["type"], "object");
        assert_eq!(input["required"], json!(["code"]));
        assert_eq!(input["properties"]["code"]["maxLength"], MAX_CODE_BYTES);
        assert_eq!(
            input["properties"]["timeoutSeconds"]["maximum"],
            MAX_TIMEOUT_SECONDS
        );
        let output = Value::Object((*output_schema()).clone());
        assert_eq!(output["type"], "object");
        for field in [
            "stdout",
            "stderr",
            "exitCode",
            "truncated",
            "durationMs",
            "runName",
            "phase",
        ] {
            assert!(
                output["properties"].get(field).is_some(),
                "{field} in {output}"
            );
        }
        assert_eq!(
            output["required"],
            json!([
                "stdout",
                "stderr",
                "truncated",
                "durationMs",
                "runName",
                "phase"
            ])
        );
        // Portable: no type arrays, no non-standard integer formats.
        let text = output.to_string() + &input.to_string();
        assert!(
            !text.contains("\"null\"") && !text.contains("uint") && !text.contains("int32"),
            "{text}"
        );
        assert!(output["properties"].get("reason").is_some());
        assert!(output["properties"].get("message").is_none());
    }

    #[test]
    fn failures_are_tool_errors_with_structured_content() {
        let out = RunOutput {
            stdout: String::new(),
            stderr: "boom\n".into(),
            exit_code: Some(3),
            truncated: false,
            duration_ms: 12,
            run_name: "local-1".into(),
            phase: Phase::Failed,
            reason: Some("NonZeroExit".into()),
            message: None,
        };
        let r = tool_result(&out, 30, 600);
        assert_eq!(r.is_error, Some(true));
        assert_eq!(r.structured_content.as_ref().unwrap()["exitCode"], 3);
        let first = serde_json::to_value(&r.content[0]).unwrap();
        assert_eq!(first["text"], "the code exited with status 3; stderr: boom");
        let ok = RunOutput {
            phase: Phase::Succeeded,
            exit_code: Some(0),
            ..out
        };
        let r = tool_result(&ok, 30, 600);
        assert_eq!(r.is_error, Some(false));
        assert_eq!(r.content.len(), 1);
    }
}

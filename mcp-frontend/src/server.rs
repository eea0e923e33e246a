//! The MCP server: one `ServerHandler` with the tools `run_python`, `execute_sql` (with
//! `--enable-sql`) and `fetch_metrics` (with `--enable-metrics`), shared by every transport
//! (stdio, Streamable HTTP, legacy SSE). Each `#[tool]` handler is one line: the tool's meaning
//! is its module in `sandboxrun_core::tools`, and every call goes through the one pipeline in
//! `pipeline.rs`.

use std::sync::Arc;

use axum::http::request::Parts;
use rmcp::handler::server::common::{schema_for_input, schema_for_output};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CustomRequest, CustomResult, GetPromptRequestParams, GetPromptResponse, GetTaskParams,
    GetTaskResult, Implementation, JsonObject, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ResultType, ServerCapabilities, ServerConfig, UpdateTaskParams,
};
#[allow(deprecated)] // SEP-2577 deprecates logging; see logging.rs
use rmcp::model::{SetLevelRequestMethod, SetLevelRequestParams};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use sandboxrun_core::Tool;
use sandboxrun_core::metrics::CallStore;
use sandboxrun_core::tools::ToolSpec;
use sandboxrun_core::tools::metrics::{self as metrics_tool, FetchMetrics};
use sandboxrun_core::tools::python::{self, RunPython};
use sandboxrun_core::tools::python_session;
use sandboxrun_core::tools::sql::{self, ExecuteSql};

use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::scope::{CallScope, Reporter};

/// The start of what the server tells a client (and its model) at initialization; each offered
/// tool adds its own part ([`ToolSpec::INSTRUCTIONS`], in the tool's module).
pub const INSTRUCTIONS_PREAMBLE: &str = "sandboxrun runs your tool calls in isolation and \
under policy: each call is checked against the operator's rules before anything runs, and a \
refused or failed call comes back as an error result that says what to change.";

/// Identity of an authenticated HTTP caller. The auth layer puts it into the request's
/// extensions; rmcp hands the request's `http::request::Parts` to the tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agent(pub String);

pub use crate::grant::Grant;

/// Everything the handler needs, shared by all sessions.
pub struct Shared {
    /// Where calls run.
    pub backend: Backend,
    /// Limits and maxima enforced before anything runs.
    pub policy: Policy,
    /// Tool-call counters and latency.
    pub metrics: Arc<Metrics>,
    /// Whether `execute_sql` is offered.
    pub sql: bool,
    /// Whether `fetch_metrics` is offered.
    pub fetch_metrics: bool,
    /// Every tool call of this process, for `fetch_metrics` in embedded mode.
    pub calls: CallStore,
    /// Calls in flight per agent, and the cap on them.
    pub in_flight: Arc<crate::inflight::InFlight>,
    /// The environments each agent with an API key may target (from its key entries); an agent
    /// not listed is the local user of stdio, who may target any.
    pub environments: std::collections::HashMap<String, Vec<sandboxrun_core::Environment>>,
    /// Calls followed as MCP tasks (every session's, and every stateless request's).
    pub tasks: crate::tasks::Tasks,
    /// The files embedded runs returned, for their agents to read as resources.
    pub run_files: crate::run_files::RunFiles,
    /// The conformance suite's reference tools, resources and prompts, when the server was
    /// started with `--conformance-fixtures` (`conformance/`).
    #[cfg(feature = "conformance")]
    pub fixtures: Option<Arc<crate::conformance::Fixtures>>,
}

/// The MCP server. Cheap to clone: one per session.
#[derive(Clone)]
pub struct SandboxRunServer {
    tool_router: ToolRouter<Self>,
    pub(crate) shared: Arc<Shared>,
    /// Caller identity when the transport carries none per request: the local user for stdio,
    /// the authenticated agent of a legacy SSE session.
    default_agent: Option<String>,
    /// What the caller's access token allows when the transport carries no [`Grant`] per
    /// request: the token that opened a legacy SSE session.
    default_grant: Option<Grant>,
    /// The log level this session set with `logging/setLevel` (`logging.rs`).
    pub(crate) log_level: crate::logging::SessionLogLevel,
}

impl SandboxRunServer {
    /// A server for one session; `default_agent` is used when a request carries no [`Agent`].
    pub fn new(shared: Arc<Shared>, default_agent: Option<String>) -> Self {
        let mut tool_router = Self::tool_router();
        if !shared.sql {
            tool_router.remove_route(ExecuteSql::TOOL.mcp_name());
        }
        if !shared.fetch_metrics {
            tool_router.remove_route(FetchMetrics::TOOL.mcp_name());
        }
        Self {
            tool_router,
            shared,
            default_agent,
            default_grant: None,
            log_level: Default::default(),
        }
    }

    /// The same server bound to the access token's grant of the session that opens it.
    pub fn with_grant(mut self, grant: Option<Grant>) -> Self {
        self.default_grant = grant;
        self
    }

    /// What the server tells a client at initialization: the preamble and the part of every
    /// tool this server offers (`--enable-sql` and `--enable-metrics` decide on two of them).
    pub fn instructions(&self) -> String {
        let tools = [
            (RunPython::TOOL, RunPython::INSTRUCTIONS),
            (RunPython::TOOL, python_session::CLOSE_INSTRUCTIONS),
            (ExecuteSql::TOOL, ExecuteSql::INSTRUCTIONS),
            (
                ExecuteSql::TOOL,
                sandboxrun_core::tools::sql_schema::INSTRUCTIONS,
            ),
            (FetchMetrics::TOOL, FetchMetrics::INSTRUCTIONS),
        ];
        let mut text = INSTRUCTIONS_PREAMBLE.to_owned();
        for (tool, part) in tools {
            if self.tool_router.get(tool.mcp_name()).is_some() {
                text.push(' ');
                text.push_str(part);
            }
        }
        text
    }

    /// Starts the call of the tool named `name` (one this server offers) in `scope`, in the
    /// background: a call followed as a task outlives its request. The same name-to-tool
    /// mapping as the `#[tool]` handlers below; a name no tool has gets an error result (the
    /// caller has checked it against the router, so only a new tool missing here can get one).
    fn spawn_call(
        &self,
        name: &str,
        args: JsonObject,
        scope: CallScope,
    ) -> tokio::task::JoinHandle<(crate::metrics::Outcome, CallToolResult)> {
        let server = self.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            if name == RunPython::TOOL.mcp_name() {
                server.call_in::<RunPython>(args, scope).await
            } else if name == python_session::CLOSE_TOOL {
                let result = crate::sessions::close_session(
                    &server.shared.backend,
                    &scope.agent,
                    scope.grant.as_ref(),
                    &args,
                )
                .await;
                let outcome = if result.is_error == Some(true) {
                    crate::metrics::Outcome::Rejected
                } else {
                    crate::metrics::Outcome::Succeeded
                };
                (outcome, result)
            } else if name == ExecuteSql::TOOL.mcp_name() {
                server.call_in::<ExecuteSql>(args, scope).await
            } else if name == FetchMetrics::TOOL.mcp_name() {
                server.call_in::<FetchMetrics>(args, scope).await
            } else {
                tracing::error!(tool = %name, "no task route for this tool");
                (
                    crate::metrics::Outcome::Unavailable,
                    CallToolResult::error(vec![rmcp::model::ContentBlock::text(format!(
                        "{name} cannot run as a task on this server; call it from a client \
                         without the tasks extension"
                    ))]),
                )
            }
        })
    }

    /// The caller: the per-request agent set by HTTP auth, else the session's default.
    pub(crate) fn caller(&self, ctx: &RequestContext<RoleServer>) -> String {
        ctx.extensions
            .get::<Parts>()
            .and_then(|parts| parts.extensions.get::<Agent>())
            .or_else(|| ctx.extensions.get::<Agent>())
            .map(|a| a.0.clone())
            .or_else(|| self.default_agent.clone())
            .unwrap_or_else(|| "anonymous".to_owned())
    }

    /// The caller's access token grant: per request from HTTP auth, else the session's. `None`
    /// for a caller with an API key (bound by its key entry) or the local user of stdio.
    pub(crate) fn grant(&self, ctx: &RequestContext<RoleServer>) -> Option<Grant> {
        ctx.extensions
            .get::<Parts>()
            .and_then(|parts| parts.extensions.get::<Grant>())
            .or_else(|| ctx.extensions.get::<Grant>())
            .or(self.default_grant.as_ref())
            .cloned()
    }
}

/// What this server declares to every client. Prompts and resources: the lists are empty (this
/// server offers tools), but a client that asks gets an empty list rather than an error.
/// Logging: a run's output as log messages, for clients that ask for them (`logging.rs`).
#[allow(deprecated)] // SEP-2577 deprecates logging; see logging.rs
fn capabilities() -> ServerCapabilities {
    ServerCapabilities::builder()
        .enable_prompts()
        .enable_resources()
        .enable_tools()
        .enable_logging()
        .enable_tasks()
        .build()
}

/// Whether a list result carries caching hints: only 2026-07-28 clients know them.
fn cache_hints(context: &RequestContext<RoleServer>) -> bool {
    crate::revision::stateless(context)
}

/// The caching hints of a list that is the same for every caller: it changes only when the
/// server is restarted with other flags, and a fresh read is cheap, so clients keep no copy
/// (`ttlMs: 0`) but any cache may hold one (`public`).
macro_rules! shared_list_hints {
    ($list:expr, $context:expr) => {
        if cache_hints($context) {
            $list.with_ttl_ms(0).with_cache_scope(CacheScope::Public)
        } else {
            $list
        }
    };
}

fn input_schema<T: ToolSpec>() -> Arc<JsonObject> {
    schema_for_input::<T::Args>().expect("tool arguments have an object schema")
}

fn output_schema<T: ToolSpec>() -> Arc<JsonObject> {
    schema_for_output::<T::Output>()
}

#[tool_router]
impl SandboxRunServer {
    /// Runs Python code in a fresh, isolated sandbox and returns its stdout, stderr and exit code.
    #[tool(
        name = "run_python",
        title = "Run Python in a sandbox",
        description = python::DESCRIPTION,
        input_schema = input_schema::<RunPython>(),
        output_schema = output_schema::<RunPython>(),
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
        Ok(self.call::<RunPython>(args, ctx).await)
    }

    /// Ends a session that run_python started, destroying its sandbox.
    #[tool(
        name = "close_session",
        title = "Close a Python session",
        description = python_session::CLOSE_DESCRIPTION,
        input_schema = schema_for_input::<python_session::CloseSessionArgs>()
            .expect("close_session's arguments have an object schema"),
        output_schema = schema_for_output::<python_session::CloseSessionOutput>(),
        annotations(
            title = "Close a Python session",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn close_session(
        &self,
        Parameters(args): Parameters<JsonObject>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let agent = self.caller(&ctx);
        Ok(crate::sessions::close_session(
            &self.shared.backend,
            &agent,
            self.grant(&ctx).as_ref(),
            &args,
        )
        .await)
    }

    /// Runs one read-only SQL query, checked by policy, and returns its columns and rows.
    #[tool(
        name = "execute_sql",
        title = "Run a read-only SQL query",
        description = sql::DESCRIPTION,
        input_schema = input_schema::<ExecuteSql>(),
        output_schema = output_schema::<ExecuteSql>(),
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
        Ok(self.call::<ExecuteSql>(args, ctx).await)
    }

    /// Runs one PromQL query, checked by policy, and returns its series.
    #[tool(
        name = "fetch_metrics",
        title = "Query metrics with PromQL",
        description = metrics_tool::DESCRIPTION,
        input_schema = input_schema::<FetchMetrics>(),
        output_schema = output_schema::<FetchMetrics>(),
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
        Ok(self.call::<FetchMetrics>(args, ctx).await)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxRunServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(capabilities())
            .with_server_info(
                Implementation::new("sandboxrun", env!("CARGO_PKG_VERSION"))
                    .with_title("sandboxrun"),
            )
            .with_instructions(self.instructions())
    }

    /// The tools this server offers, less those the caller's access token does not grant (a
    /// call to one would be refused anyway). The list then depends on the caller, so a
    /// 2026-07-28 client is told to keep it private.
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let grant = self.grant(&context);
        let tools = self
            .tool_router
            .list_all()
            .into_iter()
            .filter(|t| {
                let Some(grant) = &grant else { return true };
                // close_session goes with run_python, whose sessions it ends.
                let name = if t.name == python_session::CLOSE_TOOL {
                    RunPython::TOOL.mcp_name()
                } else {
                    &t.name
                };
                Tool::ALL
                    .into_iter()
                    .find(|tool| tool.mcp_name() == name)
                    .is_none_or(|tool| grant.allows(tool))
            })
            .collect();
        let hints = cache_hints(&context);
        Ok(ListToolsResult {
            result_type: Some(ResultType::COMPLETE),
            tools,
            meta: None,
            next_cursor: None,
            ttl_ms: hints.then_some(0),
            cache_scope: hints.then_some(if grant.is_some() {
                CacheScope::Private
            } else {
                CacheScope::Public
            }),
        })
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
        // A client that follows tasks gets one for a call that takes a while (tasks.rs), in the
        // revision that defines server-directed tasks (2026-07-28): under the initialize
        // handshake the extension is not negotiated, and clients that declare it there anyway
        // (the MCP Inspector) take only a call's result on its request.
        if crate::revision::stateless(&context)
            && context
                .client_capabilities()
                .is_some_and(|caps| caps.supports_tasks())
        {
            let agent = self.caller(&context);
            let args = request.arguments.unwrap_or_default();
            let (status_tx, status) = tokio::sync::watch::channel(String::new());
            let cancel = CancellationToken::new();
            let scope = CallScope {
                agent: agent.clone(),
                grant: self.grant(&context),
                reporter: Reporter::Task(status_tx),
                cancel: cancel.clone(),
                approval_wait: Some(self.shared.tasks.ttl()),
            };
            let call = self.spawn_call(&request.name, args, scope);
            let running = crate::tasks::Running {
                call,
                cancel,
                status,
            };
            return Ok(self
                .shared
                .tasks
                .answer(&agent, running, context.ct.clone())
                .await);
        }
        let tcc = ToolCallContext::new(self, request, context);
        self.tool_router.call(tcc).await
    }

    /// `logging/setLevel` of a 2025-11-25 session: the output of its later calls comes as log
    /// messages at this level and above. The 2026-07-28 revision removed the method (a request
    /// names its level in `_meta`), so a stateless request is told it does not exist.
    #[allow(deprecated)] // SEP-2577 deprecates logging; see logging.rs
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if crate::revision::stateless(&context) {
            return Err(ErrorData::method_not_found::<SetLevelRequestMethod>());
        }
        self.log_level.set(request.level);
        Ok(())
    }

    /// A request rmcp could not read as a method it knows. For `logging/setLevel` in a session
    /// that is a level that is not one of the eight, and the client is told which exist; anything
    /// else is a method this server does not have.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        if request.method == "logging/setLevel" && !crate::revision::stateless(&context) {
            let level = request
                .params
                .as_ref()
                .and_then(|p| p.get("level"))
                .map_or_else(|| "none".to_owned(), |l| l.to_string());
            return Err(ErrorData::invalid_params(
                format!(
                    "logging/setLevel needs params.level, one of debug, info, notice, warning, \
                     error, critical, alert, emergency; got {level}"
                ),
                None,
            ));
        }
        Err(ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            request.method,
            None,
        ))
    }

    /// No prompts: this server offers tools. An empty list, not "method not found", so that
    /// clients that list everything they are offered work.
    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(shared_list_hints!(ListPromptsResult::default(), &context))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        Err(ErrorData::invalid_params(
            format!(
                "unknown prompt `{}`: this server offers no prompts (prompts/list is empty); \
                 it offers tools",
                request.name
            ),
            None,
        ))
    }

    /// The schemas the caller may read and its kept run files (`resources.rs`).
    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(self.list_resources_for(&context).await)
    }

    /// The schema and run file templates (`resources.rs`).
    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(shared_list_hints!(self.resource_templates(), &context))
    }

    /// A schema or a run file (`resources.rs`); any other URI is not found, naming it (rmcp
    /// turns the code into -32602 for 2026-07-28 clients, as SEP-2164 asks).
    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.read_resource_for(&request.uri, &context).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let agent = self.caller(&context);
        self.shared
            .tasks
            .get(&agent, &request.task_id)
            .map(GetTaskResult::new)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.shared
            .tasks
            .cancel(&self.caller(&context), &request.task_id)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.shared.tasks.update(
            &self.caller(&context),
            &request.task_id,
            request.input_responses,
        )
    }
}

/// The error of a resource this server does not have, naming its URI (SEP-2164: in `data`).
pub(crate) fn resource_not_found(uri: &str) -> ErrorData {
    ErrorData::resource_not_found(
        format!("resource not found: {uri}; resources/list names the resources this server has"),
        Some(serde_json::json!({ "uri": uri })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A server offering `run_python` and, as asked, the two optional tools (no sandbox, no
    /// database: only what it says about itself is looked at).
    fn server(sql: bool, fetch_metrics: bool) -> SandboxRunServer {
        use sandboxrun_core::tools::Embedded;
        let calls = CallStore::new();
        let embedded = Embedded {
            policy: sandboxrun_core::policy::embedded::load(None).expect("the embedded policy"),
            sandbox: None,
            databases: None,
            calls: calls.clone(),
            sessions: Default::default(),
        };
        let shared = Shared {
            backend: Backend::Local(crate::backend::local::LocalBackend::new(Arc::new(embedded))),
            policy: Policy::new(
                sandboxrun_core::limits::MAX_TIMEOUT_SECONDS,
                sandboxrun_core::Limits::default(),
            ),
            metrics: Arc::new(Metrics::new()),
            sql,
            fetch_metrics,
            calls,
            in_flight: crate::inflight::InFlight::new(8),
            environments: Default::default(),
            tasks: crate::tasks::Tasks::new(std::time::Duration::from_secs(3600)),
            run_files: Default::default(),
            #[cfg(feature = "conformance")]
            fixtures: None,
        };
        SandboxRunServer::new(Arc::new(shared), None)
    }

    #[test]
    fn the_instructions_describe_every_offered_tool_and_no_other() {
        for (sql, fetch_metrics) in [(false, false), (true, false), (false, true), (true, true)] {
            let server = server(sql, fetch_metrics);
            let text = server
                .get_info()
                .instructions
                .expect("the server has instructions");
            assert!(text.starts_with(INSTRUCTIONS_PREAMBLE), "{text}");
            let offered: Vec<String> = server
                .tool_router
                .list_all()
                .into_iter()
                .map(|t| t.name.into_owned())
                .collect();
            for (tool, part) in [
                (RunPython::TOOL, RunPython::INSTRUCTIONS),
                (ExecuteSql::TOOL, ExecuteSql::INSTRUCTIONS),
                (FetchMetrics::TOOL, FetchMetrics::INSTRUCTIONS),
            ] {
                let name = tool.mcp_name();
                // Each tool's part opens with the tool's own name, which no other part names.
                assert!(part.starts_with(name), "{part}");
                assert_eq!(
                    text.contains(name),
                    offered.iter().any(|o| o == name),
                    "{name} offered: {offered:?}; instructions: {text}"
                );
                assert_eq!(text.contains(part), text.contains(name), "{text}");
            }
        }
    }

    #[test]
    fn schemas_describe_the_wire_format() {
        use sandboxrun_core::limits::{MAX_CODE_BYTES, MAX_TIMEOUT_SECONDS};
        let input = Value::Object((*input_schema::<RunPython>()).clone());
        assert_eq!(input["type"], "object");
        assert_eq!(input["required"], json!(["code"]));
        assert_eq!(input["properties"]["code"]["maxLength"], MAX_CODE_BYTES);
        assert_eq!(
            input["properties"]["timeoutSeconds"]["maximum"],
            MAX_TIMEOUT_SECONDS
        );
        let output = Value::Object((*output_schema::<RunPython>()).clone());
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
        for schema in [
            input_schema::<ExecuteSql>(),
            output_schema::<ExecuteSql>(),
            input_schema::<FetchMetrics>(),
            output_schema::<FetchMetrics>(),
        ] {
            assert_eq!(schema["type"], "object");
        }
    }

    /// Hostile PromQL through the whole pipeline of the embedded server, on a multi-threaded
    /// runtime as in production (its workers have 2 MiB stacks): every way of nesting is
    /// refused while the arguments are parsed, with what to change, and the same server then
    /// evaluates a valid query. Before the depth bound, a run of signs built a tree tens of
    /// thousands of levels deep whose drop overflowed the worker's stack and aborted the process.
    /// (`tests/promql_depth.rs` does the same through the binary over stdio.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deep_promql_is_refused_and_the_server_keeps_answering() {
        use crate::scope::{CallScope, Reporter};
        let server = server(false, true);
        let call = |query: String| {
            let server = server.clone();
            async move {
                let scope = CallScope {
                    agent: "analyst".to_owned(),
                    grant: None,
                    reporter: Reporter::Task(tokio::sync::watch::channel(String::new()).0),
                    cancel: tokio_util::sync::CancellationToken::new(),
                    approval_wait: None,
                };
                let args = json!({ "query": query });
                let args = args.as_object().expect("an object").clone();
                let (_, result) = server.call_in::<FetchMetrics>(args, scope).await;
                let text = result
                    .content
                    .first()
                    .and_then(|c| c.as_text())
                    .map(|t| t.text.clone())
                    .unwrap_or_default();
                (
                    result.is_error == Some(true),
                    text,
                    result.structured_content,
                )
            }
        };
        let m = sandboxrun_core::metrics::CALLS_METRIC;
        let nest =
            |open: &str, close: &str, n: usize| format!("{}{m}{}", open.repeat(n), close.repeat(n));
        for q in [
            format!("{}{m}", "- ".repeat(100_000)),
            format!("{}{m}", "-".repeat(60_000)),
            format!("{}{m}", "-#\n+\n".repeat(12_000)),
            format!("1{}", "+1".repeat(30_000)),
            format!("1{}", " + -1 * -1".repeat(6_000)),
            nest("-(", ")", 20_000),
            nest("abs(", ")", 12_000),
            nest("sum by (tool) (", ")", 3_000),
            format!("{m}{}", "[5m:1m]".repeat(9_000)),
        ] {
            let started = std::time::Instant::now();
            let (failed, text, _) = call(q.clone()).await;
            println!("{} bytes refused in {:?}", q.len(), started.elapsed());
            assert!(failed, "{text}");
            assert!(
                text.contains("passes 64 levels, the most accepted")
                    || text.contains("at most 65536 are accepted"),
                "{text}"
            );
        }
        let (failed, text, out) = call(format!("sum({m}{{tool=\"fetch_metrics\"}})")).await;
        assert!(!failed, "{text}");
        let out = out.expect("a structured result");
        assert_eq!(out["result"][0]["value"][1], "9", "{out}");
    }
}

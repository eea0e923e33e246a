//! The reference fixtures of the official MCP conformance suite
//! (`@modelcontextprotocol/conformance`, pinned in e2e/conformance/run.sh): the tools, resources
//! and prompts its server scenarios call by name (`test_simple_text`, `test://static-text`, the
//! tasks extension's `slow_compute`, ...), answering what the scenarios check. They exist only in
//! builds with the cargo feature `conformance` (no image enables it), and only with
//! `serve --conformance-fixtures`; they are then served on `/mcp` (Streamable HTTP, the transport
//! the suite tests) next to the product's tools: [`WithFixtures`] answers what is theirs and hands
//! everything else to the product's handler, behind the same credentials, Origin/Host checks and
//! rate limits, with the same task store, so the suite measures the product. What the suite checks
//! of the product itself (`logging/setLevel`, the empty lists, DNS rebinding, the stateless
//! revision's errors) is product code, not here.
//!
//! The fixtures' names, texts and shapes are the suite's; the modules group them by what they
//! exercise: [`content`] (tool results, logs, progress, requests to the client), [`input_required`]
//! (multi-round-trip requests, SEP-2322), [`task_fixtures`] (the tasks extension, SEP-2663),
//! [`catalog`] (resources, templates, prompts, completion) and [`subscriptions`] (list-changed
//! notifications on `subscriptions/listen`).

// The fixtures exercise logging, sampling and roots, which SEP-2577 deprecates (rmcp marks them
// deprecated) but both revisions the suite tests still define.
#![allow(deprecated)]

mod catalog;
mod content;
mod handler;
mod input_required;
mod subscriptions;
mod task_fixtures;

pub use handler::WithFixtures;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, Implementation, JsonObject, Prompt,
    ReadResourceResponse, RequestStateCodec, Resource, ResourceTemplate, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer};
use serde_json::Value;

use crate::logging::SessionLogLevel;
use crate::tasks::Tasks;

/// A 1×1 red PNG, base64: the suite's image in tool results, prompts and the binary resource.
const IMAGE_PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg==";

/// The fixtures and their state: the key that seals `requestState`, and the open subscriptions.
/// One per process, shared by every session and stateless request.
pub struct Fixtures {
    /// Seals the state a multi-round request hands the client (SEP-2322): the client must echo
    /// it untouched, and a changed one is refused. A key of this process only, random.
    request_state: RequestStateCodec,
    listeners: subscriptions::Listeners,
}

impl Default for Fixtures {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixtures {
    /// The fixtures, with a fresh sealing key.
    pub fn new() -> Self {
        let key: Vec<u8> = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()]
            .iter()
            .flat_map(|id| *id.as_bytes())
            .collect();
        Self {
            request_state: RequestStateCodec::try_new(key)
                .expect("two random UUIDs are a key of the minimum length"),
            listeners: subscriptions::Listeners::default(),
        }
    }

    /// What the server declares with the fixtures: everything the suite's reference server does
    /// (list-changed notifications, resource subscriptions, completion, logging, tasks).
    pub fn server_config(&self, instructions: String) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_completions()
            .enable_prompts()
            .enable_prompts_list_changed()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_resources_list_changed()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_logging()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(
                Implementation::new("sandboxrun", env!("CARGO_PKG_VERSION"))
                    .with_title("sandboxrun (conformance fixtures)"),
            )
            .with_instructions(instructions)
    }

    /// Every fixture tool, in a fixed order.
    pub fn tools(&self) -> Vec<Tool> {
        content::TOOLS
            .iter()
            .chain(subscriptions::TOOLS)
            .chain(input_required::TOOLS)
            .chain(task_fixtures::TOOLS)
            .map(|spec| spec.tool())
            .collect()
    }

    /// The fixture tool named `name`.
    pub fn tool(&self, name: &str) -> Option<Tool> {
        self.tools().into_iter().find(|t| t.name == name)
    }

    /// Whether `name` is a fixture tool.
    pub fn has_tool(&self, name: &str) -> bool {
        [
            content::TOOLS,
            subscriptions::TOOLS,
            input_required::TOOLS,
            task_fixtures::TOOLS,
        ]
        .iter()
        .any(|tools| tools.iter().any(|spec| spec.name == name))
    }

    /// Calls the fixture tool `request.name` (one [`Self::has_tool`] knows).
    pub async fn call_tool(
        &self,
        caller: Caller<'_>,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.as_ref();
        if input_required::TOOLS.iter().any(|t| t.name == name) {
            return input_required::call(&self.request_state, request, &context);
        }
        if task_fixtures::TOOLS.iter().any(|t| t.name == name) {
            return task_fixtures::call(&caller, request, &context).await;
        }
        if subscriptions::TOOLS.iter().any(|t| t.name == name) {
            return self.listeners.call(name).await;
        }
        content::call(&caller, request, context).await
    }

    /// The fixture prompts.
    pub fn prompts(&self) -> Vec<Prompt> {
        catalog::prompts()
    }

    /// `prompts/get` of a fixture prompt (the product has none).
    pub fn get_prompt(
        &self,
        request: GetPromptRequestParams,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.name == input_required::PROMPT {
            return Ok(input_required::prompt(&request));
        }
        catalog::get_prompt(request)
    }

    /// The fixture resources.
    pub fn resources(&self) -> Vec<Resource> {
        catalog::resources()
    }

    /// The fixture resource templates.
    pub fn resource_templates(&self) -> Vec<ResourceTemplate> {
        catalog::resource_templates()
    }

    /// `resources/read` of `uri` if it is a fixture resource (`None`: the product answers).
    pub fn read_resource(&self, uri: &str) -> Option<ReadResourceResponse> {
        catalog::read_resource(uri)
    }

    /// `completion/complete` over the fixture prompts and templates.
    pub fn complete(&self, request: &CompleteRequestParams) -> Result<CompleteResult, ErrorData> {
        catalog::complete(request)
    }

    /// Holds one `subscriptions/listen` open until the client ends it; the trigger tools notify it
    /// meanwhile.
    pub async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        self.listeners.listen(context).await
    }
}

/// What a fixture call needs of the server that received it.
pub struct Caller<'a> {
    /// The calling agent: the tasks a fixture starts are its own.
    pub agent: String,
    /// The log level the caller's session set, if any (`logging.rs`).
    pub log_level: &'a SessionLogLevel,
    /// The product's task store.
    pub tasks: &'a Tasks,
}

/// A fixture tool's name, description and input schema.
struct ToolSpec {
    name: &'static str,
    description: &'static str,
    /// The input schema as JSON text (`None`: an object without properties).
    schema: Option<&'static str>,
}

impl ToolSpec {
    /// A tool without arguments.
    const fn plain(name: &'static str, description: &'static str) -> Self {
        Self {
            name,
            description,
            schema: None,
        }
    }

    fn tool(&self) -> Tool {
        let schema = self
            .schema
            .map(|text| {
                serde_json::from_str::<JsonObject>(text).expect("a fixture schema is a JSON object")
            })
            .unwrap_or_else(|| object(serde_json::json!({ "type": "object", "properties": {} })));
        Tool::new(self.name, self.description, schema)
    }
}

/// `value` as a JSON object (a fixture's literal: always one).
fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("a fixture literal is an object, not {other}"),
    }
}

/// A string argument of a call.
fn string_arg<'a>(args: &'a JsonObject, name: &str) -> Option<&'a str> {
    args.get(name).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixture_tool_has_a_unique_name_and_an_object_schema() {
        let fixtures = Fixtures::new();
        let tools = fixtures.tools();
        let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "duplicate fixture tool names");
        for tool in &tools {
            assert_eq!(tool.input_schema["type"], "object", "{}", tool.name);
            assert!(fixtures.has_tool(&tool.name), "{}", tool.name);
        }
        assert!(!fixtures.has_tool("run_python"));
    }

    #[test]
    fn the_fixtures_name_none_of_the_products_tools() {
        let fixtures = Fixtures::new();
        for tool in sandboxrun_core::Tool::ALL {
            assert!(!fixtures.has_tool(tool.mcp_name()), "{}", tool.mcp_name());
        }
    }
}

//! Fixtures of the tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663). They run as tasks
//! of the product's own store (`tasks.rs`): owned by the calling agent, polled with `tasks/get`,
//! cancelled with `tasks/cancel`, fed with `tasks/update`, exactly like a long `run_python`.
//! Unlike the product's calls, which become tasks only once they outlast a short inline window,
//! a task-supporting fixture is a task from the start: the scenarios check the task envelope.

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ContentBlock,
    InputRequests, InputRequiredResult, JsonObject,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::TaskExit;
use rmcp::{ErrorData, RoleServer};
use serde_json::Value;

use super::{Caller, ToolSpec, input_required, string_arg};

pub(super) const TOOLS: &[ToolSpec] = &[
    ToolSpec {
        name: "greet",
        description: "Answers at once, never as a task (SEP-2663)",
        schema: Some(
            r#"{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}"#,
        ),
    },
    ToolSpec {
        name: "slow_compute",
        description: "Sleeps `seconds`, then answers; a task for a client that follows tasks (SEP-2663)",
        schema: Some(
            r#"{"type":"object","properties":{"seconds":{"type":"number"},"label":{"type":"string"}}}"#,
        ),
    },
    ToolSpec::plain(
        "failing_job",
        "A task that ends with a tool error; needs a client that follows tasks (SEP-2663)",
    ),
    ToolSpec::plain(
        "protocol_error_job",
        "Fails with a protocol-level error; a task for a client that follows tasks (SEP-2663)",
    ),
    ToolSpec {
        name: "confirm_delete",
        description: "A task that waits for one elicitation answer (SEP-2663)",
        schema: Some(r#"{"type":"object","properties":{"filename":{"type":"string"}}}"#),
    },
    ToolSpec::plain(
        "multi_input",
        "A task that waits for two elicitation answers at once (SEP-2663)",
    ),
    ToolSpec::plain(
        "test_tool_with_task",
        "Asks for a name (SEP-2322), then goes on as a task (SEP-2663)",
    ),
];

/// Fixtures that exist only as tasks: a client that does not follow tasks is told what it lacks.
const TASK_ONLY: &[&str] = &[
    "failing_job",
    "confirm_delete",
    "multi_input",
    "test_tool_with_task",
];

/// The longest `slow_compute` sleeps: a fixture call must not hold a request or a task forever.
const MAX_SLEEP: Duration = Duration::from_secs(300);

/// Calls the task fixture `request.name`.
pub(super) async fn call(
    caller: &Caller<'_>,
    request: CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, ErrorData> {
    let follows_tasks = context
        .client_capabilities()
        .is_some_and(|caps| caps.supports_tasks());
    let name = request.name.as_ref();
    if TASK_ONLY.contains(&name) && !follows_tasks {
        return Err(ErrorData::missing_required_client_capability(
            ClientCapabilities::builder().enable_tasks().build(),
        ));
    }
    let args = request.arguments.clone().unwrap_or_default();
    let agent = &caller.agent;
    let tasks = caller.tasks;
    match name {
        "greet" => {
            let who = string_arg(&args, "name").unwrap_or("friend");
            Ok(text(format!("Hello, {who}!")).into())
        }
        "slow_compute" => {
            let sleep = seconds(&args)?;
            let label = string_arg(&args, "label").unwrap_or("compute").to_owned();
            let done = move || {
                text(format!(
                    "slow_compute({label}) done after {}s",
                    sleep.as_secs_f64()
                ))
            };
            if !follows_tasks {
                tokio::time::sleep(sleep).await;
                return Ok(done().into());
            }
            let task = tasks.spawn(agent, move |task| {
                Box::pin(async move {
                    // Cancellation is cooperative: the sleep gives way to it.
                    tokio::select! {
                        () = task.cancelled() => Err(TaskExit::Cancelled),
                        () = tokio::time::sleep(sleep) => Ok(done()),
                    }
                })
            })?;
            Ok(task.into())
        }
        "failing_job" => {
            // A tool that ran and reported an error: the task completes, with isError.
            let task = tasks.spawn(agent, |_| {
                Box::pin(async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok(CallToolResult::error(vec![ContentBlock::text(
                        "failing_job: intentional tool execution error",
                    )]))
                })
            })?;
            Ok(task.into())
        }
        "protocol_error_job" => {
            let failure = || {
                ErrorData::internal_error(
                    "protocol_error_job: intentional protocol-level failure",
                    None,
                )
            };
            if !follows_tasks {
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Err(failure());
            }
            // A protocol-level failure: the task fails, with the error inlined.
            let task = tasks.spawn(agent, move |_| {
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Err::<CallToolResult, _>(TaskExit::Error(failure()))
                })
            })?;
            Ok(task.into())
        }
        "confirm_delete" => {
            let filename = string_arg(&args, "filename")
                .unwrap_or("file.txt")
                .to_owned();
            let task = tasks.spawn(agent, move |task| {
                Box::pin(async move {
                    let answer = task
                        .request_input(
                            "confirm",
                            input_required::elicitation(
                                &format!("Delete {filename}?"),
                                "confirm",
                                "boolean",
                            ),
                        )
                        .await?;
                    let confirmed = answer
                        .get("content")
                        .and_then(|c| c.get("confirm"))
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    Ok(text(format!(
                        "confirm_delete({filename}): confirmed = {confirmed}"
                    )))
                })
            })?;
            Ok(task.into())
        }
        "multi_input" => {
            let task = tasks.spawn(agent, |task| {
                Box::pin(async move {
                    // Both asked at once, so that a client may answer one and then the other.
                    let a = task.request_input(
                        "input-a",
                        input_required::elicitation("Provide value A", "value", "string"),
                    );
                    let b = task.request_input(
                        "input-b",
                        input_required::elicitation("Provide value B", "value", "string"),
                    );
                    let (a, b) = tokio::join!(a, b);
                    let value = |answer: &Value| {
                        answer
                            .get("content")
                            .and_then(|c| c.get("value"))
                            .and_then(Value::as_str)
                            .unwrap_or("(none)")
                            .to_owned()
                    };
                    Ok(text(format!(
                        "multi_input: a = {}, b = {}",
                        value(&a?),
                        value(&b?)
                    )))
                })
            })?;
            Ok(task.into())
        }
        "test_tool_with_task" => {
            let name = request
                .input_responses
                .as_ref()
                .and_then(|r| r.get("user_name"))
                .and_then(Value::as_object)
                .map(|answer| {
                    answer
                        .get("content")
                        .and_then(|c| c.get("name"))
                        .and_then(Value::as_str)
                        .unwrap_or("friend")
                        .to_owned()
                });
            let Some(name) = name else {
                // Round one: the input the task needs before it can start.
                let requests = InputRequests::from([(
                    "user_name".to_owned(),
                    input_required::elicitation("What is your name?", "name", "string"),
                )]);
                return Ok(InputRequiredResult::from_input_requests(requests).into());
            };
            let task = tasks.spawn(agent, move |_| {
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok(text(format!("Hello, {name}! (async)")))
                })
            })?;
            Ok(task.into())
        }
        other => Err(ErrorData::invalid_params(
            format!("unknown fixture tool `{other}`"),
            None,
        )),
    }
}

fn text(text: String) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

/// `slow_compute`'s `seconds` (default 1), at most [`MAX_SLEEP`].
fn seconds(args: &JsonObject) -> Result<Duration, ErrorData> {
    let seconds = args.get("seconds").and_then(Value::as_f64).unwrap_or(1.0);
    if !(0.0..=MAX_SLEEP.as_secs_f64()).contains(&seconds) {
        return Err(ErrorData::invalid_params(
            format!(
                "`seconds` is {seconds}: slow_compute sleeps between 0 and {} seconds",
                MAX_SLEEP.as_secs()
            ),
            None,
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

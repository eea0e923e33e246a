//! MCP tasks: the `io.modelcontextprotocol/tasks` extension (SEP-2663), in the 2026-07-28
//! revision (stateless requests), which defines server-directed tasks: there a client that
//! declares the extension on a request can follow a long call without holding it open. (Under
//! the initialize handshake the extension is not negotiated: a client that declares it there
//! anyway, as the MCP Inspector does, gets the result on its request.) A call still running
//! after [`INLINE_WINDOW`] goes on in the background and the client gets a task instead of the
//! result. It polls `tasks/get` (the status message says what the call is doing: the run's
//! phase, an approval wait naming the run a person must approve, the last line the code
//! printed) until the task is `completed` with the very result the call would have returned,
//! and `tasks/cancel` stops the run as a cancelled request would. A call that ends within the
//! window is answered at once, as for any client: fast calls stay one round trip.
//!
//! The store is rmcp's `TaskManager` (lifecycle, TTL, wire shapes) plus who owns each task: a
//! task is visible only to the agent that created it, and any other caller is told it does not
//! exist, with the same error as an unknown id, so ids cannot be probed. Like Streamable HTTP
//! sessions, tasks live in the frontend process that made them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rmcp::ErrorData;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult, DetailedTask, InputResponses,
};
use rmcp::task_manager::{TaskContext, TaskExit, TaskFuture, TaskManager, TaskOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics::Outcome;

/// How long a call runs before it becomes a task. Warm and embedded runs end well within it,
/// and a cold sandbox mostly does; a long program or an approval wait does not.
pub const INLINE_WINDOW: Duration = Duration::from_secs(2);

/// The polling interval suggested to clients. A task is a call of more than [`INLINE_WINDOW`],
/// so a second more to see its end is little; faster polling of an agent's 8 calls in flight
/// (`--max-calls-per-agent`) would use most of its default 600 requests a minute.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Most tasks one agent may have in the store (running, or finished and kept for their
/// result). A call beyond it is answered like a call of a client without tasks: it holds its
/// request until the result, which every client can take.
pub const MAX_TASKS_PER_AGENT: usize = 100;

/// A call on its way: its pipeline, spawned, and what the task follows of it.
pub struct Running {
    /// The call's pipeline: how it ended, and its result.
    pub call: JoinHandle<(Outcome, CallToolResult)>,
    /// Fires to stop the call (and its run).
    pub cancel: CancellationToken,
    /// The latest status: a phase, an approval wait, the last line printed.
    pub status: watch::Receiver<String>,
}

/// The tasks of this process, and whose each is.
pub struct Tasks {
    manager: TaskManager,
    /// Task id → owner. An entry outlives its task by at most one sweep: tasks are dropped by
    /// the manager within two TTLs of their creation (see `TaskManager`), owners then too.
    owners: Mutex<HashMap<String, Owner>>,
    ttl: Duration,
    /// How long a call runs before it becomes a task ([`INLINE_WINDOW`]).
    inline: Duration,
}

struct Owner {
    agent: String,
    created: Instant,
}

impl Tasks {
    /// A store whose tasks live `ttl` (a running task is stopped and reported failed then; a
    /// finished one is kept that long again for its result).
    pub fn new(ttl: Duration) -> Self {
        Self {
            manager: TaskManager::new(),
            owners: Mutex::new(HashMap::new()),
            ttl,
            inline: INLINE_WINDOW,
        }
    }

    /// The same store with another inline window (tests).
    #[cfg(test)]
    pub fn with_inline_window(mut self, inline: Duration) -> Self {
        self.inline = inline;
        self
    }

    /// How long a task lives: a call made as a task follows an approval this long at most.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Answers the call `running` for `agent`: its result if it ends within [`INLINE_WINDOW`]
    /// (or if the agent has the most tasks it may have), else a task that follows it.
    /// `request` fires when the client gives up the request itself; before the call is a task
    /// that stops it, as for any call.
    pub async fn answer(
        &self,
        agent: &str,
        running: Running,
        request: CancellationToken,
    ) -> CallToolResponse {
        let Running {
            mut call,
            cancel,
            status,
        } = running;
        let stop_on_request = |cancel: &CancellationToken| {
            let (cancel, request) = (cancel.clone(), request.clone());
            async move {
                request.cancelled().await;
                cancel.cancel();
                std::future::pending::<()>().await
            }
        };
        tokio::select! {
            r = &mut call => return CallToolResponse::Complete(ended(r).1),
            () = stop_on_request(&cancel) => unreachable!("never completes"),
            () = tokio::time::sleep(self.inline) => {}
        }
        if self.count(agent) >= MAX_TASKS_PER_AGENT {
            tracing::info!(%agent, max = MAX_TASKS_PER_AGENT, "agent has the most tasks it may have; the call holds its request");
            return tokio::select! {
                r = &mut call => CallToolResponse::Complete(ended(r).1),
                () = stop_on_request(&cancel) => unreachable!("never completes"),
            };
        }
        let options = self.options().with_status_message(status.borrow().clone());
        let task = self.spawn_owned(agent, options, move |task| {
            Box::pin(async move {
                // The manager drops this future when the task outlives its TTL: the call is
                // stopped then too (a run awaiting approval stays for the person to decide).
                let _stop_on_drop = cancel.clone().drop_guard();
                let mut status = status;
                let mut status_open = true;
                loop {
                    tokio::select! {
                        r = &mut call => {
                            let (outcome, result) = ended(r);
                            return if outcome == Outcome::Cancelled && task.is_cancel_requested() {
                                Err(TaskExit::Cancelled)
                            } else {
                                Ok(result)
                            };
                        }
                        () = task.cancelled(), if !cancel.is_cancelled() => cancel.cancel(),
                        changed = status.changed(), if status_open => match changed {
                            Ok(()) => task.set_status_message(status.borrow_and_update().clone()),
                            Err(_) => status_open = false,
                        },
                    }
                }
            })
        });
        tracing::info!(%agent, task = %task.task_id, "the call goes on as a task");
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    /// Starts `work` as a task of `agent` at once, without an inline window: for an operation
    /// that is a task by nature (it waits for input the client sends with `tasks/update`, say).
    /// Refused when the agent has the most tasks it may have.
    #[cfg_attr(not(feature = "conformance"), allow(dead_code))]
    pub fn spawn(
        &self,
        agent: &str,
        work: impl FnOnce(TaskContext) -> TaskFuture,
    ) -> Result<CreateTaskResult, ErrorData> {
        if self.count(agent) >= MAX_TASKS_PER_AGENT {
            return Err(ErrorData::invalid_request(
                format!(
                    "{agent} has {MAX_TASKS_PER_AGENT} tasks, the most one agent may have; \
                     wait for some to end (tasks are kept {} after that) or cancel some",
                    humantime(self.ttl)
                ),
                None,
            ));
        }
        let task = self.spawn_owned(agent, self.options(), work);
        tracing::info!(%agent, task = %task.task_id, "task started");
        Ok(CreateTaskResult::new(task))
    }

    /// The options of every task: this store's TTL and the suggested polling interval.
    fn options(&self) -> TaskOptions {
        TaskOptions::new()
            .with_ttl_ms(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX))
            .with_poll_interval_ms(POLL_INTERVAL.as_millis() as u64)
    }

    /// Spawns `work` in the manager and records `agent` as its owner.
    fn spawn_owned(
        &self,
        agent: &str,
        options: TaskOptions,
        work: impl FnOnce(TaskContext) -> TaskFuture,
    ) -> rmcp::model::Task {
        let task = self.manager.spawn(options, work);
        self.owners
            .lock()
            .expect("task owners lock poisoned")
            .insert(
                task.task_id.clone(),
                Owner {
                    agent: agent.to_owned(),
                    created: Instant::now(),
                },
            );
        task
    }

    /// `tasks/get` for `agent`.
    pub fn get(&self, agent: &str, id: &str) -> Result<DetailedTask, ErrorData> {
        self.check_owner(agent, id)?;
        self.manager.get_task(id)
    }

    /// `tasks/cancel` for `agent`: the call is stopped (cooperatively: a call that ends first
    /// completes).
    pub fn cancel(&self, agent: &str, id: &str) -> Result<(), ErrorData> {
        self.check_owner(agent, id)?;
        tracing::info!(%agent, task = %id, "task cancelled by its client");
        self.manager.cancel_task(id)
    }

    /// `tasks/update` for `agent`: the responses go to the input requests of the task that are
    /// still outstanding (responses to anything else are ignored, as SEP-2663 says). The product's
    /// tools ask for no input, so for their tasks this only acknowledges.
    pub fn update(
        &self,
        agent: &str,
        id: &str,
        responses: InputResponses,
    ) -> Result<(), ErrorData> {
        self.check_owner(agent, id)?;
        self.manager.update_task(id, responses)
    }

    /// Tasks `agent` has in the store.
    fn count(&self, agent: &str) -> usize {
        let mut owners = self.owners.lock().expect("task owners lock poisoned");
        self.sweep(&mut owners);
        owners.values().filter(|o| o.agent == agent).count()
    }

    /// An unknown task and another agent's task get the same answer.
    fn check_owner(&self, agent: &str, id: &str) -> Result<(), ErrorData> {
        let mut owners = self.owners.lock().expect("task owners lock poisoned");
        self.sweep(&mut owners);
        match owners.get(id) {
            Some(owner) if owner.agent == agent => Ok(()),
            _ => Err(ErrorData::invalid_params(
                format!(
                    "unknown task: {id}; tasks are kept for {} after they end, and only their \
                     creator sees them",
                    humantime(self.ttl)
                ),
                None,
            )),
        }
    }

    /// Forgets owners of tasks the manager has dropped (two TTLs after creation at most).
    fn sweep(&self, owners: &mut HashMap<String, Owner>) {
        let keep = self.ttl * 2 + POLL_INTERVAL;
        owners.retain(|_, o| o.created.elapsed() < keep);
    }
}

/// The end of a spawned call; a call that panicked is an error result (the panic is logged by
/// the runtime).
fn ended(
    r: Result<(Outcome, CallToolResult), tokio::task::JoinError>,
) -> (Outcome, CallToolResult) {
    r.unwrap_or_else(|e| {
        tracing::error!(error = %e, "a tool call failed unexpectedly");
        (
            Outcome::Unavailable,
            CallToolResult::error(vec![ContentBlock::text(
                "the call failed inside the server; retrying may help, and the server's log says more",
            )]),
        )
    })
}

/// `90s`, `30m`, `1h`: how a TTL is written in messages.
fn humantime(d: Duration) -> String {
    let s = d.as_secs();
    if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
#[path = "tasks_tests.rs"]
mod tests;

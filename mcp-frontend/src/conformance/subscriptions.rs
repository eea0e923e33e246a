//! List-changed notifications on `subscriptions/listen` (2026-07-28): the open subscriptions of
//! every client, and the two fixture tools that stand for a change of the tool or prompt list.
//! rmcp acknowledges a subscription, filters each notification by what the client asked for and
//! tags it with the subscription's id; the fixtures only keep the sinks and notify them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::ErrorData;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock};
use rmcp::service::{SubscriptionContext, SubscriptionSink};

use super::ToolSpec;

pub(super) const TOOLS: &[ToolSpec] = &[
    ToolSpec::plain(
        "test_trigger_tool_change",
        "Sends notifications/tools/list_changed to the subscriptions that asked for it",
    ),
    ToolSpec::plain(
        "test_trigger_prompt_change",
        "Sends notifications/prompts/list_changed to the subscriptions that asked for it",
    ),
];

/// The open subscriptions, by a number of their own.
#[derive(Default)]
pub(super) struct Listeners {
    next: AtomicU64,
    sinks: Mutex<HashMap<u64, SubscriptionSink>>,
}

impl Listeners {
    /// Keeps the subscription's sink until the client ends the subscription.
    pub(super) async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.sinks
            .lock()
            .expect("subscriptions lock poisoned")
            .insert(key, context.sink().clone());
        context.cancelled().await;
        self.sinks
            .lock()
            .expect("subscriptions lock poisoned")
            .remove(&key);
        Ok(())
    }

    /// Calls the trigger tool `name`: every open subscription is told, and the sink drops what
    /// a subscription did not ask for.
    pub(super) async fn call(&self, name: &str) -> Result<CallToolResponse, ErrorData> {
        let sinks: Vec<SubscriptionSink> = self
            .sinks
            .lock()
            .expect("subscriptions lock poisoned")
            .values()
            .cloned()
            .collect();
        let tools = name == "test_trigger_tool_change";
        for sink in sinks {
            let sent = if tools {
                sink.notify_tool_list_changed().await
            } else {
                sink.notify_prompt_list_changed().await
            };
            if let Err(e) = sent {
                tracing::debug!(error = %e, "a subscription did not take the notification");
            }
        }
        let what = if tools { "Tool" } else { "Prompt" };
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "{what} list change triggered"
        ))])
        .into())
    }
}

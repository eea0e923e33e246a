//! `close_session`: the tool that ends a `run_python` session (see
//! `sandboxrun_core::tools::python_session`). It runs no code and creates no run: it asks the
//! backend to end one of the caller's sessions.

use rmcp::model::{CallToolResult, ContentBlock, JsonObject};

use crate::backend::Backend;

/// `close_session`: ends one of the caller's sessions. Allowed to whoever may call run_python
/// (a grant without it is refused as run_python would be); each call is logged.
pub async fn close_session(
    backend: &Backend,
    agent: &str,
    grant: Option<&crate::grant::Grant>,
    args: &JsonObject,
) -> CallToolResult {
    use sandboxrun_core::tools::python_session::{CloseSessionOutput, parse_close_args};
    let refused = |text: String| CallToolResult::error(vec![ContentBlock::text(text)]);
    if let Some(why) = grant.and_then(|g| g.tool_refusal(agent, sandboxrun_core::Tool::Python)) {
        return refused(why);
    }
    let id = match parse_close_args(args) {
        Ok(id) => id,
        Err(why) => return refused(why),
    };
    match backend.close_session(agent, &id).await {
        Ok(()) => {
            tracing::info!(tool = "close_session", agent, session = %id, "session closed");
            let output = CloseSessionOutput {
                session: id,
                closed: true,
            };
            CallToolResult::structured(serde_json::to_value(output).unwrap_or_default())
        }
        Err(why) => {
            tracing::info!(tool = "close_session", agent, session = %id, refused = %why, "session not closed");
            refused(why)
        }
    }
}

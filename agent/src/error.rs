//! Errors that end a run. Each one is printed as a single line on stderr, so every message says
//! what failed and what to do about it; none of them carries a backtrace.

/// Why a run could not continue.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The command line or environment is incomplete or contradictory.
    #[error("{0}")]
    Config(String),
    /// The chat-completions endpoint could not be reached, refused the request or answered
    /// something that is not a chat completion.
    #[error("{0}")]
    Model(String),
    /// The MCP server could not be started, reached or used.
    #[error("{0}")]
    Mcp(String),
    /// The thread store could not be opened, read or written.
    #[error("{0}")]
    Store(String),
}

/// The innermost causes of an error, joined: reqwest and rmcp wrap the useful part (connection
/// refused, DNS failure) several levels down.
pub fn causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![err.to_string()];
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        // Wrappers often repeat their source's text; keep each piece once.
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_include_the_root() {
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        assert_eq!(causes(&e), "outer: connection refused");
    }
}

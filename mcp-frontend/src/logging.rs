//! MCP log messages (`notifications/message`): sent only to a client that asked for them. A
//! 2025-11-25 session asks once with `logging/setLevel`; a 2026-07-28 request has no session and
//! asks per request with `_meta["io.modelcontextprotocol/logLevel"]` (`logging/setLevel` is gone
//! from that revision). A request that asked for nothing gets no log message: what a run prints
//! then travels as progress notifications, as it always has (`pipeline.rs`).

// SEP-2577 deprecates logging in favour of other channels, but both revisions this server
// speaks still define it, and rmcp marks the whole API deprecated.
#![allow(deprecated)]

use std::sync::{Arc, Mutex};

use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};

use crate::revision::stateless;

/// The level a session set with `logging/setLevel`; `None` until it sets one. One per session
/// (the handler is made per session), shared by the clones of its handler.
#[derive(Clone, Default)]
pub struct SessionLogLevel(Arc<Mutex<Option<LoggingLevel>>>);

impl SessionLogLevel {
    /// Records the session's level.
    pub fn set(&self, level: LoggingLevel) {
        *self.0.lock().expect("log level lock poisoned") = Some(level);
    }

    /// The session's level, if it set one.
    pub fn get(&self) -> Option<LoggingLevel> {
        *self.0.lock().expect("log level lock poisoned")
    }
}

/// The least severe level the client of `ctx` wants log messages of, if it wants any: the
/// request's own `_meta` level, else (sessions only: a stateless request has no session to
/// remember one) the level its session set.
pub fn requested(
    ctx: &RequestContext<RoleServer>,
    session: &SessionLogLevel,
) -> Option<LoggingLevel> {
    ctx.meta
        .log_level()
        .or_else(|| (!stateless(ctx)).then(|| session.get()).flatten())
}

/// Sends `message` to the client of `peer`; a client gone meanwhile is not an error of the call.
pub async fn send(peer: &Peer<RoleServer>, message: LoggingMessageNotificationParam) {
    if let Err(e) = peer.notify_logging_message(message).await {
        tracing::debug!(error = %e, "could not send a log message");
    }
}

/// Whether a message at `level` goes to a client that asked for `threshold` and above.
pub fn passes(level: LoggingLevel, threshold: LoggingLevel) -> bool {
    severity(level) >= severity(threshold)
}

/// RFC 5424 order, least severe first (rmcp's `LoggingLevel` has no ordering of its own).
fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [LoggingLevel; 8] = [
        LoggingLevel::Debug,
        LoggingLevel::Info,
        LoggingLevel::Notice,
        LoggingLevel::Warning,
        LoggingLevel::Error,
        LoggingLevel::Critical,
        LoggingLevel::Alert,
        LoggingLevel::Emergency,
    ];

    #[test]
    fn a_threshold_lets_through_its_level_and_the_more_severe_ones() {
        for (i, threshold) in ALL.iter().enumerate() {
            for (j, level) in ALL.iter().enumerate() {
                assert_eq!(
                    passes(*level, *threshold),
                    j >= i,
                    "{level:?} at {threshold:?}"
                );
            }
        }
    }

    #[test]
    fn a_session_remembers_the_last_level_it_set() {
        let session = SessionLogLevel::default();
        assert_eq!(session.get(), None);
        session.set(LoggingLevel::Warning);
        let clone = session.clone();
        clone.set(LoggingLevel::Debug);
        assert_eq!(session.get(), Some(LoggingLevel::Debug));
    }
}

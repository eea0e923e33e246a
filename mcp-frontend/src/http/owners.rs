//! Streamable HTTP sessions belong to the agent that opened them. rmcp knows sessions but not
//! agents, so without this any valid key could use (and read the notifications of) another
//! agent's session by presenting its `Mcp-Session-Id`. A foreign session id is answered like an
//! unknown one (404), so ids cannot be probed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Session ids are forgotten after this long; rmcp's own sessions end well before.
const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Bound on remembered sessions; the oldest are dropped beyond it.
const MAX_SESSIONS: usize = 100_000;

/// Which agent opened which session.
#[derive(Default)]
pub struct SessionOwners(Mutex<HashMap<String, (String, Instant)>>);

impl SessionOwners {
    /// Records the owner of a new session.
    pub fn record(&self, session: &str, agent: &str) {
        let mut map = self.0.lock().expect("session owners lock");
        let now = Instant::now();
        if map.len() >= MAX_SESSIONS {
            map.retain(|_, (_, at)| now.duration_since(*at) < RETENTION);
            if map.len() >= MAX_SESSIONS
                && let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(session.to_owned(), (agent.to_owned(), now));
    }

    /// Whether `agent` may use `session`: it opened it, or the session is unknown here (rmcp
    /// then answers for an unknown session itself).
    pub fn allows(&self, session: &str, agent: &str) -> bool {
        let map = self.0.lock().expect("session owners lock");
        map.get(session).is_none_or(|(owner, _)| owner == agent)
    }

    /// Whether `agent` opened `session` here (and it was not deleted since): a DELETE must name
    /// such a session, since rmcp answers a DELETE of any id, known or not, with success.
    pub fn owns(&self, session: &str, agent: &str) -> bool {
        let map = self.0.lock().expect("session owners lock");
        map.get(session).is_some_and(|(owner, _)| owner == agent)
    }

    /// Forgets a session (after its DELETE).
    pub fn forget(&self, session: &str) {
        self.0.lock().expect("session owners lock").remove(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owner_may_use_a_session() {
        let owners = SessionOwners::default();
        assert!(
            owners.allows("s1", "a"),
            "unknown sessions are left to rmcp"
        );
        owners.record("s1", "a");
        assert!(owners.allows("s1", "a"));
        assert!(!owners.allows("s1", "b"));
        assert!(owners.owns("s1", "a"));
        assert!(!owners.owns("s1", "b"));
        assert!(
            !owners.owns("s2", "a"),
            "unknown sessions are owned by no one"
        );
        owners.forget("s1");
        assert!(!owners.owns("s1", "a"));
        assert!(owners.allows("s1", "b"));
    }
}

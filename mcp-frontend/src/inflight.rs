//! Per-agent cap on calls in flight. The rate limit (`http/ratelimit.rs`) bounds how often an
//! agent may call; this bounds how much it may hold at once, on every transport: without it one
//! key could keep enough long runs (or approval waits) open to take the namespace's whole Pod
//! quota, and other agents' runs would fail.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Calls in flight, per agent.
#[derive(Debug)]
pub struct InFlight {
    max: usize,
    counts: Mutex<HashMap<String, usize>>,
}

/// One call's place in its agent's count; dropping it (the call ended, was cancelled, or its
/// future was dropped) frees the place.
#[derive(Debug)]
pub struct Slot {
    owner: Arc<InFlight>,
    agent: String,
}

impl InFlight {
    /// A cap of `max` calls at a time per agent (at least one).
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            counts: Mutex::default(),
        })
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Takes a place for one of `agent`'s calls, or says that it has the most it may.
    pub fn acquire(self: &Arc<Self>, agent: &str) -> Option<Slot> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(agent.to_owned()).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Slot {
            owner: self.clone(),
            agent: agent.to_owned(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.owner.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                // Bounded memory: only agents with calls in flight have an entry.
                counts.remove(&self.agent);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_agent_has_its_own_cap_and_places_come_back() {
        let f = InFlight::new(2);
        let a1 = f.acquire("a").unwrap();
        let _a2 = f.acquire("a").unwrap();
        assert!(f.acquire("a").is_none(), "a third call of a");
        let _b = f.acquire("b").expect("b is not held back by a");
        drop(a1);
        assert_eq!(f.counts.lock().unwrap()["a"], 1);
        let _a3 = f.acquire("a").expect("a place came back");
        assert_eq!(InFlight::new(0).max(), 1);
    }

    #[test]
    fn idle_agents_leave_no_entry() {
        let f = InFlight::new(1);
        drop(f.acquire("x").unwrap());
        assert!(f.counts.lock().unwrap().is_empty());
    }
}

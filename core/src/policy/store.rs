//! The live policy of a process, swapped atomically on reload.

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::{CallContext, Decision, Policy, PolicyError};

/// Holds the current policy; readers never block, and a reload that fails keeps the last good
/// policy in force.
#[derive(Debug)]
pub struct PolicyStore {
    current: ArcSwap<Policy>,
}

impl PolicyStore {
    /// A store serving `policy`.
    pub fn new(policy: Policy) -> Self {
        Self {
            current: ArcSwap::from_pointee(policy),
        }
    }

    /// A store serving the policy in `path`; fails (with line and problem) when it is malformed,
    /// so a process refuses to start on a bad policy.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        Policy::load(path).map(Self::new)
    }

    /// The policy in force.
    pub fn current(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// Judges a call with the policy in force.
    pub fn evaluate(&self, call: &CallContext) -> Decision {
        self.current.load().evaluate(call)
    }

    /// Puts `policy` in force.
    pub fn replace(&self, policy: Policy) {
        self.current.store(Arc::new(policy));
    }

    /// Reads `path` and puts it in force. When it cannot be read or is invalid, the previous
    /// policy stays in force and the error says why.
    pub fn reload_from(&self, path: impl AsRef<Path>) -> Result<Arc<Policy>, PolicyError> {
        let policy = Arc::new(Policy::load(path)?);
        self.current.store(Arc::clone(&policy));
        Ok(policy)
    }
}

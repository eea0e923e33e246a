//! How the components take the initial state of what they watch: a streaming list (the API
//! server's WatchList: the objects as watch events from its cache, each decoded on its own) where
//! the server serves one, else a paged list, which every server serves.
//!
//! WatchList is on by default in Kubernetes 1.32 and from 1.34 on, off in 1.33 and before 1.32,
//! and any cluster may turn it off. A server without it refuses a watch that asks for initial
//! events (422, "sendInitialEvents is forbidden ..."), and kube-runtime's watcher does not fall
//! back: it would retry that watch forever and never list a run. So each component asks once,
//! when it starts, with a watch that matches nothing, and keeps the answer.

use std::fmt::Debug;

use kube::api::{Api, WatchParams};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

/// A label no object carries: the probe's watch then streams nothing but its own end.
const MATCHES_NOTHING: &str = "sandboxrun.dev/list-strategy-probe";

/// How the initial state is listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListStrategy {
    /// A watch with `sendInitialEvents` (WatchList).
    Streaming,
    /// Pages of a LIST, then a watch from their resource version.
    Paged,
}

impl ListStrategy {
    /// Asks the API server behind `api` whether it serves streaming lists. Anything but a watch
    /// it accepted (a refusal, or no answer at all) means a paged list: always served, only
    /// costlier for the component's memory. The second value says why, for the log.
    pub async fn probe<K>(api: &Api<K>) -> (Self, String)
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug,
    {
        let params = WatchParams::streaming_lists()
            .labels(MATCHES_NOTHING)
            .timeout(1);
        match api.watch(&params, "0").await {
            Ok(stream) => {
                drop(stream);
                (
                    Self::Streaming,
                    "the API server serves streaming lists".to_owned(),
                )
            }
            Err(e) => (
                Self::Paged,
                format!("the API server refused a streaming list ({e}): listing in pages"),
            ),
        }
    }

    /// `config` with this strategy.
    pub fn apply(self, config: watcher::Config) -> watcher::Config {
        match self {
            Self::Streaming => config.streaming_lists(),
            Self::Paged => config,
        }
    }

    /// Logs the probe's answer: a paged list is a warning (the server costs the component more
    /// memory than it needs to), a streaming list is how it should be.
    pub fn log(self, why: &str) {
        match self {
            Self::Streaming => tracing::info!(list = self.as_str(), "{why}"),
            Self::Paged => tracing::warn!(list = self.as_str(), "{why}"),
        }
    }

    /// The strategy's name, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Streaming => "streaming",
            Self::Paged => "paged",
        }
    }
}

//! The sandbox Pods as the run controller's own watch has them, for its reconciles to read a
//! run's Pod without asking the API server (a quorum read each; measured, 2.5 fewer Pod reads
//! a call alone and 4.8 a sandbox under load: e2e/BENCHMARKS.md, "A reconcile reads its run's
//! Pod from the watch").
//!
//! Only the controller's watch fills it, and in the same stream that wakes the runs: a change
//! of a Pod is in the store before its run's reconcile starts, so what a reconcile reads here
//! is never older than what woke it. (The quota room's watch of the same Pods runs apart, on
//! its own clock: a reconcile woken by one watch must not read the other's store.) Each term
//! of leadership starts a new store, empty until the watch's first list is in: no Pod is left
//! over from a term whose watch has stopped.
//!
//! What it has is taken as present, never what it lacks: a reconcile that finds no Pod here
//! asks the API server (`python/mod.rs`). One exception, [`WatchedPods::listed`]: a run decided
//! again looks here for a sandbox claimed for it before its decision was recorded, once the
//! watch's first list is in. Such a claim was made by this process (which remembers it apart,
//! `pool::ClaimedPods`) or by one before it, whose claims this term's first list came after.

use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};

/// The store of the controller's Pod watch while the controller runs; none otherwise.
#[derive(Clone, Default)]
pub struct WatchedPods(Arc<RwLock<Option<Store<Pod>>>>);

impl WatchedPods {
    /// Serves `store` until the returned guard is dropped (when the controller stops).
    pub fn serve(&self, store: Store<Pod>) -> Serving {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(store);
        Serving(self.clone())
    }

    /// The Pods the watch has that `keep` returns true for, if its first list is in: `None`
    /// before that, and while no controller's watch is served (then only the API server can
    /// say what is absent).
    pub fn listed(&self, keep: impl Fn(&Pod) -> bool) -> Option<Vec<Arc<Pod>>> {
        let store = self.0.read().unwrap_or_else(|e| e.into_inner()).clone()?;
        futures::FutureExt::now_or_never(store.wait_until_ready())?.ok()?;
        Some(store.state_filter(keep))
    }

    /// The Pod `name` in `namespace`, if the watch has it.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        let store = self.0.read().unwrap_or_else(|e| e.into_inner());
        store.as_ref()?.get(&ObjectRef::new(name).within(namespace))
    }
}

/// Serving a store; dropping it leaves [`WatchedPods`] with none.
pub struct Serving(WatchedPods);

impl Drop for Serving {
    fn drop(&mut self) {
        *self.0.0.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    fn pod(name: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "runs"}
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_is_served_while_its_store_is_and_not_after() {
        let watched = WatchedPods::default();
        assert!(watched.get("runs", "a").is_none());
        let (store, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&Event::Apply(pod("a")));
        let serving = watched.serve(store);
        assert!(watched.get("runs", "a").is_some());
        assert!(watched.get("runs", "b").is_none());
        assert!(watched.get("other", "a").is_none());
        drop(serving);
        assert!(watched.get("runs", "a").is_none());
    }

    #[test]
    fn a_list_is_served_only_once_the_first_list_is_in() {
        let watched = WatchedPods::default();
        assert!(watched.listed(|_| true).is_none());
        let (store, mut writer) = kube::runtime::reflector::store();
        let _serving = watched.serve(store);
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(pod("a")));
        // Absence is not known before the list is in.
        assert!(watched.listed(|_| true).is_none());
        writer.apply_watcher_event(&Event::InitDone);
        let all = watched.listed(|_| true).expect("listed");
        assert_eq!(all.len(), 1);
        assert!(
            watched
                .listed(|p| p.metadata.name.as_deref() == Some("b"))
                .expect("listed")
                .is_empty()
        );
    }
}

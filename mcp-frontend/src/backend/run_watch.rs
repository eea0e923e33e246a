//! One watch of this frontend's SandboxRuns, shared by every call in flight. Each call used to
//! open a watch of its own run (a LIST and a WATCH per call, a stream per call in flight), so
//! 100 agents calling at once held 100 watches on the API server. Now one task watches the runs
//! carrying the frontend's label and hands each event to the call that follows that run; the
//! rest are decoded one at a time and dropped, so nothing is cached: a relist of ten thousand
//! stored runs (a streaming list, served from the API server's watch cache) costs time, not
//! memory.
//!
//! A call subscribes *before* it creates its run (its name is chosen here, see
//! `kube::with_metadata`), so no event of its run can pass unseen. After a relist, a subscribed
//! run that was created before the relist began and that the list did not show is looked up with
//! one GET: it may have been deleted while the watch was down. A run whose create had not
//! returned when the relist began is not: the list may have been served before it existed (the
//! fault suite caught a call told its run was deleted while its create was still in flight), and
//! the watch that follows the list brings it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Api;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, watcher};
use sandboxrun_api::SandboxRun;
use sandboxrun_api::list_strategy::ListStrategy;
use tokio::sync::watch;

/// What a call learns about its run: the latest version seen, or that it is gone.
#[derive(Clone, Debug)]
pub enum Seen {
    /// The run as the watch last delivered it.
    Run(Arc<SandboxRun>),
    /// The run was deleted.
    Deleted,
}

/// The calls following runs, by run name, and what each relist showed.
#[derive(Default)]
pub struct Subscribers {
    senders: Mutex<HashMap<String, Entry>>,
    /// Names of subscribed runs the current relist delivered (between `Init` and `InitDone`).
    listed: Mutex<HashSet<String>>,
    /// Relists begun so far.
    relists: AtomicU64,
}

/// One call following its run.
struct Entry {
    tx: watch::Sender<Option<Seen>>,
    /// The count of relists begun when the call's create returned (`None`: not yet).
    created_after: Option<u64>,
}

impl Subscribers {
    /// Starts following `name`: the receiver sees every later version of the run (the latest
    /// one at least). Following ends when the receiver is dropped ([`Subscription`]).
    pub fn subscribe(self: &Arc<Self>, name: &str) -> Subscription {
        let (tx, rx) = watch::channel(None);
        self.senders.lock().expect("not poisoned").insert(
            name.to_owned(),
            Entry {
                tx,
                created_after: None,
            },
        );
        Subscription {
            name: name.to_owned(),
            rx,
            owner: self.clone(),
        }
    }

    /// Hands one watch event to the call that follows its run. At the end of a relist, returns
    /// the subscribed runs the list did not show (to be looked up: [`Self::resolve`]).
    pub fn dispatch(&self, event: watcher::Event<SandboxRun>) -> Vec<String> {
        match event {
            watcher::Event::Init => {
                self.listed.lock().expect("not poisoned").clear();
                self.relists.fetch_add(1, Ordering::SeqCst);
                Vec::new()
            }
            watcher::Event::InitApply(run) => {
                let name = run.name_any();
                if self.send(&name, Seen::Run(Arc::new(run))) {
                    self.listed.lock().expect("not poisoned").insert(name);
                }
                Vec::new()
            }
            watcher::Event::Apply(run) => {
                self.send(&run.name_any(), Seen::Run(Arc::new(run)));
                Vec::new()
            }
            watcher::Event::Delete(run) => {
                self.send(&run.name_any(), Seen::Deleted);
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed = std::mem::take(&mut *self.listed.lock().expect("not poisoned"));
                // Created before this relist began: the list must have shown it.
                let this = self.relists.load(Ordering::SeqCst);
                self.senders
                    .lock()
                    .expect("not poisoned")
                    .iter()
                    .filter(|(name, e)| {
                        e.created_after.is_some_and(|n| n < this) && !listed.contains(*name)
                    })
                    .map(|(name, _)| name.clone())
                    .collect()
            }
        }
    }

    /// What a GET of a run the relist did not show found: the run (`Some`) or nothing.
    pub fn resolve(&self, name: &str, found: Option<SandboxRun>) {
        self.send(
            name,
            found.map_or(Seen::Deleted, |run| Seen::Run(Arc::new(run))),
        );
    }

    /// Sends to the call following `name`, if any; whether one does.
    fn send(&self, name: &str, seen: Seen) -> bool {
        match self.senders.lock().expect("not poisoned").get(name) {
            Some(entry) => {
                entry.tx.send_replace(Some(seen));
                true
            }
            None => false,
        }
    }

    /// The call's create returned: from the next relist on, a list without the run means it
    /// is gone.
    fn created(&self, name: &str) {
        let relists = self.relists.load(Ordering::SeqCst);
        if let Some(entry) = self.senders.lock().expect("not poisoned").get_mut(name) {
            entry.created_after = Some(relists);
        }
    }

    fn unsubscribe(&self, name: &str) {
        self.senders.lock().expect("not poisoned").remove(name);
    }

    /// Calls following a run now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.senders.lock().expect("not poisoned").len()
    }
}

/// A call's view of its run; dropping it stops following.
pub struct Subscription {
    name: String,
    rx: watch::Receiver<Option<Seen>>,
    owner: Arc<Subscribers>,
}

impl Subscription {
    /// Tells the shared watch that the run now exists (its create returned).
    pub fn created(&self) {
        self.owner.created(&self.name);
    }

    /// The next version of the run (or its deletion) after the last one returned.
    pub async fn next(&mut self) -> Option<Seen> {
        loop {
            self.rx.changed().await.ok()?;
            if let Some(seen) = self.rx.borrow_and_update().clone() {
                return Some(seen);
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.owner.unsubscribe(&self.name);
    }
}

/// Watches the runs labelled `selector` in `api`'s namespace for as long as the process runs,
/// handing every event to `subs`. Errors are retried with backoff; a call whose run is not seen
/// meanwhile ends at its own deadline.
pub async fn run(api: Api<SandboxRun>, selector: String, subs: Arc<Subscribers>) {
    // Streaming where the API server serves it (sandboxrun_api::list_strategy says why).
    let (strategy, why) = ListStrategy::probe(&api).await;
    strategy.log(&why);
    let config = strategy.apply(watcher::Config::default().labels(&selector));
    let mut events = watcher(api.clone(), config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                for name in subs.dispatch(event) {
                    let (api, subs) = (api.clone(), subs.clone());
                    tokio::spawn(async move {
                        match api.get_opt(&name).await {
                            Ok(found) => subs.resolve(&name, found),
                            // The next event or the call's deadline settles it.
                            Err(e) => {
                                tracing::warn!(run = %name, error = %e, "could not look up a SandboxRun the relist did not show")
                            }
                        }
                    });
                }
            }
            Err(e) => tracing::warn!(error = %e, "watch of SandboxRuns failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, phase: &str) -> SandboxRun {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sandboxrun.dev/v1alpha1", "kind": "SandboxRun",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"agent": "a", "python": {"code": "print(1)"}},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn phase(seen: &Seen) -> String {
        match seen {
            Seen::Run(r) => format!("{:?}", r.status.as_ref().unwrap().phase.unwrap()),
            Seen::Deleted => "deleted".into(),
        }
    }

    #[tokio::test]
    async fn each_call_gets_its_own_runs_events_and_nothing_else() {
        let subs = Arc::new(Subscribers::default());
        let mut a = subs.subscribe("run-a");
        let mut b = subs.subscribe("run-b");
        subs.dispatch(watcher::Event::Apply(run("run-a", "Running")));
        subs.dispatch(watcher::Event::Apply(run("run-other", "Succeeded")));
        subs.dispatch(watcher::Event::Apply(run("run-b", "Succeeded")));
        assert_eq!(phase(&a.next().await.unwrap()), "Running");
        assert_eq!(phase(&b.next().await.unwrap()), "Succeeded");
        subs.dispatch(watcher::Event::Delete(run("run-a", "Running")));
        assert_eq!(phase(&a.next().await.unwrap()), "deleted");
        drop(b);
        assert_eq!(subs.len(), 1, "a dropped subscription stops following");
    }

    #[tokio::test]
    async fn a_call_that_falls_behind_gets_the_latest_version() {
        let subs = Arc::new(Subscribers::default());
        let mut a = subs.subscribe("run-a");
        subs.dispatch(watcher::Event::Apply(run("run-a", "Pending")));
        subs.dispatch(watcher::Event::Apply(run("run-a", "Running")));
        subs.dispatch(watcher::Event::Apply(run("run-a", "Succeeded")));
        assert_eq!(phase(&a.next().await.unwrap()), "Succeeded");
    }

    #[tokio::test]
    async fn after_a_relist_the_runs_it_did_not_show_are_looked_up() {
        let subs = Arc::new(Subscribers::default());
        let mut shown = subs.subscribe("run-shown");
        let mut missing = subs.subscribe("run-missing");
        shown.created();
        missing.created();
        // A create still in flight when the relist begins: not looked up (the list may have
        // been served before it committed), before or after it returns.
        let in_flight = subs.subscribe("run-in-flight");
        assert!(subs.dispatch(watcher::Event::Init).is_empty());
        in_flight.created();
        subs.dispatch(watcher::Event::InitApply(run("run-shown", "Running")));
        subs.dispatch(watcher::Event::InitApply(run("run-unrelated", "Running")));
        assert_eq!(subs.dispatch(watcher::Event::InitDone), vec!["run-missing"]);
        assert_eq!(phase(&shown.next().await.unwrap()), "Running");
        // Deleted while the watch was down: the GET found nothing.
        subs.resolve("run-missing", None);
        assert_eq!(phase(&missing.next().await.unwrap()), "deleted");
        // The next relist starts afresh.
        subs.dispatch(watcher::Event::Init);
        assert_eq!(
            {
                let mut v = subs.dispatch(watcher::Event::InitDone);
                v.sort();
                v
            },
            vec!["run-in-flight", "run-missing", "run-shown"]
        );
    }
}

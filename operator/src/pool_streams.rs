//! Attach streams opened ahead to the idle sandboxes of warm pools, so that a claimed sandbox
//! gets its program without opening one on the call's path (the upgrade through the API server,
//! the kubelet and the container runtime: tens of milliseconds, measured in e2e/BENCHMARKS.md).
//!
//! What holding a stream changes, and why it is safe:
//! - The sandbox's container has `stdinOnce`: its stdin closes when the first attach session
//!   ends. A held stream is that first session, so it is given to exactly one claim, and a
//!   stream dropped without a program (the operator stops, loses its lease, or the stream
//!   breaks) leaves a runner that reads end-of-input, refuses to run anything and exits. Its Pod
//!   is deleted at once by the operator that held the stream: until the kubelet reports the exit
//!   (a second or so) it would still look ready, and a claim (this operator's or the next
//!   leader's) would take a sandbox that can no longer read a program. A sandbox is never handed
//!   a second stream.
//! - A claim waits for a stream still being opened rather than attaching beside it: two
//!   sessions on one stdin, one closing it under the other, could cut the program (the runner
//!   would refuse a cut one, but the call would be lost).
//! - Nothing else changes: the claim is still a conditional Pod patch, recorded in the run's
//!   status before the program is written, and the runner confirms the whole program.
//!
//! Generic over the stream so that its bookkeeping is unit-tested without a cluster.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, AttachedProcess, DeleteParams};

use crate::python::pod::CONTAINER;

/// At most this many streams are held at once: each is a connection to the API server (and
/// from it to the node), and pools beyond this size claim the rest by attaching at the claim.
pub const MOST_HELD: usize = 64;

/// How long opening a held stream may take (it takes milliseconds); a claim waits at most this
/// for one being opened.
const OPEN_WITHIN: Duration = Duration::from_secs(10);

/// The streams held to idle sandboxes, by `namespace/pod`.
pub struct Streams<S> {
    inner: Arc<Mutex<Inner<S>>>,
    /// Off (`--hold-streams=false`): nothing is held, every claim attaches.
    enabled: bool,
}

/// The streams the operator holds to its pools' idle sandboxes.
pub type HeldStreams = Streams<AttachedProcess>;

impl<S> Clone for Streams<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            enabled: self.enabled,
        }
    }
}

impl<S> Default for Streams<S> {
    fn default() -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                next_id: 0,
                entries: HashMap::new(),
                taken: HashMap::new(),
            })),
            enabled: true,
        }
    }
}

impl<S> Streams<S> {
    /// Streams that are held, or (`enabled` false) never.
    pub fn enabled(enabled: bool) -> Self {
        Self {
            enabled,
            ..Self::default()
        }
    }
}

struct Inner<S> {
    next_id: u64,
    entries: HashMap<String, Entry<S>>,
    /// Sandboxes whose stream a claim took, and when: never held again (a pool that listed
    /// one just before its claim would otherwise open a second session to it).
    taken: HashMap<String, Instant>,
}

/// How long a taken sandbox is remembered: far longer than a pool's listing can lag a claim.
const TAKEN_FOR: Duration = Duration::from_secs(600);

/// One sandbox's stream: `None` in the slot while it is being opened (its opener holds the
/// slot's lock until it knows) or when opening failed.
struct Entry<S> {
    id: u64,
    slot: Arc<tokio::sync::Mutex<Option<S>>>,
}

/// The key of a sandbox's stream.
pub fn key(namespace: &str, pod: &str) -> String {
    format!("{namespace}/{pod}")
}

impl<S: Send + 'static> Streams<S> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<S>> {
        self.inner.lock().expect("not poisoned")
    }

    /// Opens a stream to the sandbox `key` in the background with `open`, unless one is held or
    /// being opened, or [`MOST_HELD`] are. `open` yields the stream and a future that ends when
    /// the stream does (then it is forgotten), or `None` when it could not be opened. `broken`
    /// is called when a stream ends while still held (no claim took it).
    pub fn hold<O, E>(&self, key: String, open: O, broken: impl FnOnce() + Send + 'static)
    where
        O: Future<Output = Option<(S, E)>> + Send + 'static,
        E: Future<Output = ()> + Send + 'static,
    {
        if !self.enabled {
            return;
        }
        let (id, mut guard) = {
            let mut inner = self.lock();
            inner.taken.retain(|_, at| at.elapsed() < TAKEN_FOR);
            if inner.entries.contains_key(&key)
                || inner.taken.contains_key(&key)
                || inner.entries.len() >= MOST_HELD
            {
                return;
            }
            let id = inner.next_id;
            inner.next_id += 1;
            let slot = Arc::new(tokio::sync::Mutex::new(None));
            let guard = slot.clone().try_lock_owned().expect("a new lock is free");
            inner.entries.insert(key.clone(), Entry { id, slot });
            (id, guard)
        };
        let streams = self.clone();
        tokio::spawn(async move {
            let Some((stream, ended)) = open.await else {
                drop(guard);
                streams.forget(&key, id);
                return;
            };
            *guard = Some(stream);
            drop(guard);
            ended.await;
            if streams.forget(&key, id) {
                broken();
            }
        });
    }

    /// Takes the stream held to the sandbox `key`, waiting for one being opened; `None`: there
    /// is none (the claim attaches itself).
    pub async fn take(&self, key: &str) -> Option<S> {
        let entry = {
            let mut inner = self.lock();
            inner.taken.insert(key.to_owned(), Instant::now());
            inner.entries.remove(key)?
        };
        entry.slot.lock().await.take()
    }

    /// Whether a stream to `key` is held or being opened.
    #[cfg(test)]
    fn holds(&self, key: &str) -> bool {
        self.lock().entries.contains_key(key)
    }

    /// How many streams are held or being opened.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Drops every stream (the operator no longer runs the pools: it lost its lease, or stops);
    /// returns the sandboxes they were held to.
    pub fn clear(&self) -> Vec<String> {
        self.lock().entries.drain().map(|(key, _)| key).collect()
    }

    /// Forgets stream `id` of `key` once it ended (not a newer one under the same key, nor one a
    /// claim took): whether it was still held.
    fn forget(&self, key: &str, id: u64) -> bool {
        let mut inner = self.lock();
        let held = inner.entries.get(key).is_some_and(|e| e.id == id);
        if held {
            inner.entries.remove(key);
        }
        held
    }
}

impl HeldStreams {
    /// Opens a stream to the idle sandbox `pod` (ready: its runner waits for its program); a
    /// stream that breaks while held takes its sandbox with it (module doc).
    pub fn hold_sandbox(&self, pods: &Api<Pod>, namespace: &str, pod: &str) {
        let (pods, name) = (pods.clone(), pod.to_owned());
        let broken = {
            let (pods, name) = (pods.clone(), name.clone());
            move || {
                tokio::spawn(async move {
                    tracing::info!(pod = %name, "the stream held to an idle sandbox broke; deleting the sandbox");
                    delete_sandbox(&pods, &name).await;
                });
            }
        };
        self.hold(key(namespace, pod), async move {
            let params = AttachParams::default()
                .container(CONTAINER)
                .stdin(true)
                .stdout(true)
                .stderr(false);
            match tokio::time::timeout(OPEN_WITHIN, pods.attach(&name, &params)).await {
                Ok(Ok(mut process)) => {
                    let status = process.take_status()?;
                    Some((process, async move {
                        status.await;
                    }))
                }
                Ok(Err(e)) => {
                    tracing::debug!(pod = %name, error = %e, "could not hold a stream to an idle sandbox");
                    None
                }
                Err(_) => None,
            }
        }, broken);
    }

    /// Drops every stream and deletes the sandboxes they were held to (their stdin closes with
    /// the stream): the operator stops, or no longer leads.
    pub async fn let_go(&self, client: &kube::Client) {
        let sandboxes = self.clear();
        let deletes = sandboxes.iter().filter_map(|key| {
            let (namespace, pod) = key.split_once('/')?;
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            Some(async move { delete_sandbox(&pods, pod).await })
        });
        // Bounded: a replica that lost the API server (why it lost its lease, perhaps) must still
        // stop; its sandboxes' runners exit anyway, and their pools replace them.
        let _ = tokio::time::timeout(LET_GO_WITHIN, futures::future::join_all(deletes)).await;
    }
}

/// How long letting go of the held streams may take (deleting their sandboxes).
const LET_GO_WITHIN: Duration = Duration::from_secs(5);

/// Deletes an idle sandbox whose stream is gone (one already gone is fine).
async fn delete_sandbox(pods: &Api<Pod>, name: &str) {
    match pods.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => {
            tracing::warn!(pod = %name, error = %e, "could not delete an idle sandbox whose stream is gone")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::oneshot;

    /// A stream to hold in tests, and the sender that ends it.
    fn stream(
        name: &str,
    ) -> (
        String,
        oneshot::Sender<()>,
        impl Future<Output = ()> + use<>,
    ) {
        let (end, ended) = oneshot::channel::<()>();
        (name.to_owned(), end, async move {
            let _ = ended.await;
        })
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// Holds `s` under `key`, counting in `broken` each time it broke while held.
    fn hold(
        streams: &Streams<String>,
        key: &str,
        s: (String, impl Future<Output = ()> + Send + 'static),
        broken: &Arc<AtomicUsize>,
    ) {
        let broken = broken.clone();
        streams.hold(key.to_owned(), async move { Some(s) }, move || {
            broken.fetch_add(1, Ordering::SeqCst);
        });
    }

    #[tokio::test]
    async fn a_held_stream_is_given_to_one_claim_only() {
        let (streams, broken) = (Streams::default(), Arc::default());
        let (s, end, ended) = stream("a");
        hold(&streams, "ns/a", (s, ended), &broken);
        settle().await;
        assert!(streams.holds("ns/a"));
        assert_eq!(streams.take("ns/a").await.as_deref(), Some("a"));
        assert_eq!(streams.take("ns/a").await, None);
        assert!(!streams.holds("ns/a"));
        // A pool that listed the sandbox before its claim does not open a second session.
        let (s, _end, ended) = stream("again");
        hold(&streams, "ns/a", (s, ended), &broken);
        settle().await;
        assert!(!streams.holds("ns/a"));
        // The claim's session ends: its sandbox is the run's, not a broken idle one.
        end.send(()).unwrap();
        settle().await;
        assert_eq!(broken.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_claim_waits_for_the_stream_being_opened() {
        let streams = Streams::default();
        let (opened, open) = oneshot::channel::<()>();
        let (s, _end, ended) = stream("a");
        streams.hold(
            key("ns", "a"),
            async move {
                open.await.ok()?;
                Some((s, ended))
            },
            || {},
        );
        let taker = {
            let streams = streams.clone();
            tokio::spawn(async move { streams.take("ns/a").await })
        };
        settle().await;
        assert!(!taker.is_finished(), "the claim waits for the opener");
        opened.send(()).unwrap();
        assert_eq!(taker.await.unwrap().as_deref(), Some("a"));
    }

    #[tokio::test]
    async fn a_stream_that_could_not_be_opened_or_broke_is_forgotten() {
        let (streams, broken): (Streams<String>, Arc<AtomicUsize>) =
            (Streams::default(), Arc::default());
        streams.hold(
            key("ns", "a"),
            async { None::<(String, std::future::Ready<()>)> },
            || {},
        );
        settle().await;
        assert!(!streams.holds("ns/a"));
        assert_eq!(streams.take("ns/a").await, None);

        let (s, end, ended) = stream("b");
        hold(&streams, "ns/b", (s, ended), &broken);
        settle().await;
        assert!(streams.holds("ns/b"));
        end.send(()).unwrap();
        settle().await;
        assert!(!streams.holds("ns/b"), "a broken stream is no stream");
        assert_eq!(broken.load(Ordering::SeqCst), 1, "its sandbox goes with it");
        // Held again under the same key while the first one still runs, the old stream's end
        // does not forget the new one (nor count as its break).
        let (s, end_c, ended) = stream("c");
        hold(&streams, "ns/c", (s, ended), &broken);
        settle().await;
        streams.lock().entries.remove("ns/c");
        let (s, _end_c2, ended) = stream("c2");
        hold(&streams, "ns/c", (s, ended), &broken);
        settle().await;
        end_c.send(()).unwrap();
        settle().await;
        assert_eq!(broken.load(Ordering::SeqCst), 1);
        assert_eq!(streams.take("ns/c").await.as_deref(), Some("c2"));
    }

    #[tokio::test]
    async fn one_stream_per_sandbox_at_most_the_bound_and_all_let_go_at_once() {
        let (streams, broken) = (Streams::default(), Arc::default());
        let mut ends = Vec::new();
        for i in 0..MOST_HELD + 5 {
            let (s, end, ended) = stream(&i.to_string());
            ends.push(end);
            hold(&streams, &key("ns", &i.to_string()), (s, ended), &broken);
        }
        // A second hold of a held sandbox opens nothing.
        let (s, _end, ended) = stream("again");
        hold(&streams, "ns/0", (s, ended), &broken);
        settle().await;
        assert_eq!(streams.len(), MOST_HELD);
        assert_eq!(streams.take("ns/0").await.as_deref(), Some("0"));
        // Letting go names every sandbox still held (to be deleted), none twice.
        let mut let_go = streams.clear();
        let_go.sort();
        let_go.dedup();
        assert_eq!(let_go.len(), MOST_HELD - 1);
        assert!(!let_go.contains(&"ns/0".to_owned()));
        assert_eq!(streams.len(), 0);

        let off = Streams::enabled(false);
        let (s, _end, ended) = stream("a");
        hold(&off, "ns/a", (s, ended), &broken);
        settle().await;
        assert_eq!(off.take("ns/a").await, None);
    }
}

//! Attach streams opened ahead to the idle sandboxes of warm pools, so that a claimed sandbox
//! gets its program without opening one on the call's path (the upgrade through the API server,
//! the kubelet and the container runtime: tens of milliseconds, measured in e2e/BENCHMARKS.md).
//!
//! What holding a stream changes, and why it is safe:
//! - The sandbox's container has `stdinOnce`: its stdin closes when the first attach session
//!   ends. A held stream is that first session, so it is given to exactly one claim, and a
//!   stream dropped without a program (the operator stops, loses its lease, or the stream
//!   breaks) leaves a runner that reads end-of-input, refuses to run anything and exits: its
//!   Pod ends and the pool replaces it. A sandbox is never handed a second stream.
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
use kube::api::{Api, AttachParams, AttachedProcess};

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
    /// the stream does (then it is forgotten), or `None` when it could not be opened.
    pub fn hold<O, E>(&self, key: String, open: O)
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
            streams.forget(&key, id);
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

    /// Drops every stream (the operator no longer runs the pools: it lost its lease, or stops).
    pub fn clear(&self) {
        self.lock().entries.clear();
    }

    /// Forgets stream `id` of `key` once it ended (not a newer one under the same key).
    fn forget(&self, key: &str, id: u64) {
        let mut inner = self.lock();
        if inner.entries.get(key).is_some_and(|e| e.id == id) {
            inner.entries.remove(key);
        }
    }
}

impl HeldStreams {
    /// Opens a stream to the idle sandbox `pod` (ready: its runner waits for its program).
    pub fn hold_sandbox(&self, pods: &Api<Pod>, namespace: &str, pod: &str) {
        let (pods, name) = (pods.clone(), pod.to_owned());
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
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[tokio::test]
    async fn a_held_stream_is_given_to_one_claim_only() {
        let streams = Streams::default();
        let (s, _end, ended) = stream("a");
        streams.hold(key("ns", "a"), async move { Some((s, ended)) });
        settle().await;
        assert!(streams.holds("ns/a"));
        assert_eq!(streams.take("ns/a").await.as_deref(), Some("a"));
        assert_eq!(streams.take("ns/a").await, None);
        assert!(!streams.holds("ns/a"));
        // A pool that listed the sandbox before its claim does not open a second session.
        let (s, _end, ended) = stream("again");
        streams.hold(key("ns", "a"), async move { Some((s, ended)) });
        settle().await;
        assert!(!streams.holds("ns/a"));
    }

    #[tokio::test]
    async fn a_claim_waits_for_the_stream_being_opened() {
        let streams = Streams::default();
        let (opened, open) = oneshot::channel::<()>();
        let (s, _end, ended) = stream("a");
        streams.hold(key("ns", "a"), async move {
            open.await.ok()?;
            Some((s, ended))
        });
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
    async fn a_stream_that_could_not_be_opened_or_ended_is_forgotten() {
        let streams: Streams<String> = Streams::default();
        streams.hold(key("ns", "a"), async {
            None::<(String, std::future::Ready<()>)>
        });
        settle().await;
        assert!(!streams.holds("ns/a"));
        assert_eq!(streams.take("ns/a").await, None);

        let (s, end, ended) = stream("b");
        streams.hold(key("ns", "b"), async move { Some((s, ended)) });
        settle().await;
        assert!(streams.holds("ns/b"));
        end.send(()).unwrap();
        settle().await;
        assert!(!streams.holds("ns/b"), "a broken stream is no stream");
        // Held again under the same key while the first one still runs, the old stream's end
        // does not forget the new one.
        let (s, end_c, ended) = stream("c");
        streams.hold(key("ns", "c"), async move { Some((s, ended)) });
        settle().await;
        streams.lock().entries.remove("ns/c");
        let (s, _end_c2, ended) = stream("c2");
        streams.hold(key("ns", "c"), async move { Some((s, ended)) });
        settle().await;
        end_c.send(()).unwrap();
        settle().await;
        assert_eq!(streams.take("ns/c").await.as_deref(), Some("c2"));
    }

    #[tokio::test]
    async fn one_stream_per_sandbox_and_at_most_the_bound() {
        let streams = Streams::default();
        let mut ends = Vec::new();
        for i in 0..MOST_HELD + 5 {
            let (s, end, ended) = stream(&i.to_string());
            ends.push(end);
            streams.hold(key("ns", &i.to_string()), async move { Some((s, ended)) });
        }
        // A second hold of a held sandbox opens nothing.
        let (s, _end, ended) = stream("again");
        streams.hold(key("ns", "0"), async move { Some((s, ended)) });
        settle().await;
        assert_eq!(streams.len(), MOST_HELD);
        assert_eq!(streams.take("ns/0").await.as_deref(), Some("0"));
        streams.clear();
        assert_eq!(streams.len(), 0);

        let off = Streams::enabled(false);
        let (s, _end, ended) = stream("a");
        off.hold(key("ns", "a"), async move { Some((s, ended)) });
        settle().await;
        assert_eq!(off.take("ns/a").await, None);
    }
}

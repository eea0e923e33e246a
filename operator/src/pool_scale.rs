//! Pools that follow demand: a pool with `maxReplicas` is sized by the operator from how many
//! runs wanted one of its sandboxes lately (claims, and misses: a run that fit the pool and found
//! it empty).
//!
//! A pool must hold enough idle sandboxes to serve every run that arrives while a replacement
//! starts; a burst of ten needs ten ready. So the size is the most runs that wanted a sandbox
//! within any one start time of the pool's sandboxes (measured from its ready Pods) over the last
//! `scaleDownDelaySeconds`, between `minReplicas` and `maxReplicas`: it grows as soon as a burst
//! shows (a miss wakes the pool at once) and shrinks once the burst is older than the delay.
//!
//! The size is written to `spec.replicas` through the scale subresource, as a HorizontalPodAutoscaler
//! would: `kubectl get sandboxpools` shows it, and a pool without `maxReplicas` is left to its
//! replicas (set by hand, or by an HPA or KEDA on the same subresource; the two are not combined).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use sandboxrun_api::SandboxPool;
use tokio::sync::mpsc;

use crate::python::pod::CONTAINER;

/// The start time assumed for a pool none of whose Pods has started yet.
const DEFAULT_START: SignedDuration = SignedDuration::from_secs(3);
/// Bounds on a measured start time: a Pod that waited minutes for a node says nothing about
/// bursts.
const START_BOUNDS: (SignedDuration, SignedDuration) =
    (SignedDuration::from_secs(1), SignedDuration::from_secs(30));
/// Most demand events kept per pool (a burst beyond this many is already at any sane maximum).
const MAX_EVENTS: usize = 1024;

/// When runs wanted a sandbox of one pool, and which runs, the oldest first.
type Wanted = VecDeque<(Timestamp, String)>;

/// When runs wanted a sandbox of each pool, shared by the run controller (which records) and the
/// pool controller (which sizes).
#[derive(Clone)]
pub struct Demand {
    events: Arc<Mutex<HashMap<ObjectRef<SandboxPool>, Wanted>>>,
    wake: mpsc::UnboundedSender<ObjectRef<SandboxPool>>,
    wakeups: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<ObjectRef<SandboxPool>>>>,
}

impl Default for Demand {
    fn default() -> Self {
        let (wake, wakeups) = mpsc::unbounded_channel();
        Self {
            events: Arc::default(),
            wake,
            wakeups: Arc::new(tokio::sync::Mutex::new(wakeups)),
        }
    }
}

impl Demand {
    /// Run `run` claimed a sandbox of the pool.
    pub fn claimed(&self, namespace: &str, pool: &str, run: &str, now: Timestamp) {
        self.record(namespace, pool, run, now);
    }

    /// Run `run` fit the pool and found no sandbox: recorded (once per run: a run waiting in
    /// the queue asks again and again), and the pool is looked at now.
    pub fn missed(&self, namespace: &str, pool: &str, run: &str, now: Timestamp) {
        if self.record(namespace, pool, run, now) {
            // The pool controller may be gone (shutting down): nothing to wake then.
            let _ = self.wake.send(ObjectRef::new(pool).within(namespace));
        }
    }

    /// Whether this was the run's first record for the pool.
    fn record(&self, namespace: &str, pool: &str, run: &str, now: Timestamp) -> bool {
        let mut events = self.events.lock().expect("not poisoned");
        let times = events
            .entry(ObjectRef::new(pool).within(namespace))
            .or_default();
        if times.iter().any(|(_, r)| r == run) {
            return false;
        }
        times.push_back((now, run.to_owned()));
        while times.len() > MAX_EVENTS {
            times.pop_front();
        }
        true
    }

    /// The most runs that wanted a sandbox of the pool within any `start` over the last
    /// `window`; older events are forgotten.
    pub fn peak(
        &self,
        pool: &ObjectRef<SandboxPool>,
        start: SignedDuration,
        window: SignedDuration,
        now: Timestamp,
    ) -> usize {
        let mut events = self.events.lock().expect("not poisoned");
        let Some(times) = events.get_mut(pool) else {
            return 0;
        };
        let since = now.checked_sub(window).unwrap_or(now);
        while times.front().is_some_and(|(t, _)| *t < since) {
            times.pop_front();
        }
        let at: Vec<Timestamp> = times.iter().map(|(t, _)| *t).collect();
        peak_within(&at, start)
    }

    /// The pools to look at because runs missed them, for the pool controller.
    pub fn wakeups(&self) -> impl futures::Stream<Item = ObjectRef<SandboxPool>> + Send + use<> {
        futures::stream::unfold(self.wakeups.clone(), |wakeups| async move {
            let next = wakeups.lock().await.recv().await;
            next.map(|pool| (pool, wakeups))
        })
    }
}

/// The most of `times` (in order) within any interval of length `start`.
fn peak_within(times: &[Timestamp], start: SignedDuration) -> usize {
    let mut best = 0;
    let mut first = 0;
    for (last, t) in times.iter().enumerate() {
        while t.duration_since(times[first]) > start {
            first += 1;
        }
        best = best.max(last - first + 1);
    }
    best
}

/// How long the pool's sandboxes took to start: the slowest of its ready Pods, from creation to
/// its container running, within bounds; a default before any has started.
pub fn start_time(ready: &[&Pod]) -> SignedDuration {
    let slowest = ready
        .iter()
        .filter_map(|p| {
            let created = p.metadata.creation_timestamp.as_ref()?.0;
            let running = p
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .find(|c| c.name == CONTAINER)?
                .state
                .as_ref()?
                .running
                .as_ref()?
                .started_at
                .as_ref()?
                .0;
            Some(running.duration_since(created))
        })
        .max();
    slowest.map_or(DEFAULT_START, |s| s.clamp(START_BOUNDS.0, START_BOUNDS.1))
}

/// A pool's bounds, when it follows demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Fewest idle sandboxes.
    pub min: i32,
    /// Most idle sandboxes.
    pub max: i32,
    /// How long a burst keeps the pool large.
    pub scale_down_delay: SignedDuration,
}

impl Bounds {
    /// The bounds of `pool`, when it has `maxReplicas`.
    pub fn of(pool: &SandboxPool) -> Option<Self> {
        let max = pool.spec.max_replicas?;
        let min = pool.spec.min_replicas.unwrap_or(0).clamp(0, max);
        Some(Self {
            min,
            max,
            scale_down_delay: SignedDuration::from_secs(i64::from(
                pool.spec.scale_down_delay_seconds,
            )),
        })
    }
}

/// The size of a pool whose runs wanted `peak` sandboxes within one start time.
pub fn desired(bounds: Bounds, peak: usize) -> i32 {
    i32::try_from(peak)
        .unwrap_or(i32::MAX)
        .clamp(bounds.min, bounds.max)
}

/// Why the pool has its size, for its status.
pub fn reason(bounds: Bounds, peak: usize, start: SignedDuration, size: i32) -> String {
    let delay = bounds.scale_down_delay.as_secs();
    let wanted = format!(
        "{peak} runs wanted a sandbox within {} s (the pool's start time) in the last {delay} s",
        start.as_secs()
    );
    let bound = if size == bounds.max && i32::try_from(peak).unwrap_or(i32::MAX) > size {
        format!(": {size}, its maxReplicas")
    } else if size == bounds.min && i32::try_from(peak).unwrap_or(0) < size {
        format!(": {size}, its minReplicas")
    } else {
        format!(": {size}")
    };
    format!("{wanted}{bound}")
}

/// When a pool that follows demand is looked at again: every few seconds while it is above its
/// minimum (its burst ages out of the window at a time nothing else would wake it), else at the
/// resync.
pub fn shrink_check(bounds: Bounds, size: i32, resync: Duration) -> Duration {
    if size > bounds.min {
        resync.min(Duration::from_secs(5))
    } else {
        resync
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
    }

    fn bounds(min: i32, max: i32) -> Bounds {
        Bounds {
            min,
            max,
            scale_down_delay: SignedDuration::from_secs(60),
        }
    }

    #[test]
    fn the_peak_is_the_most_runs_within_one_start_time() {
        let s = SignedDuration::from_secs(3);
        assert_eq!(peak_within(&[], s), 0);
        // One a second for ten seconds: four within any 3 s (both ends count).
        let steady: Vec<_> = (0..10).map(|i| at(i * 1000)).collect();
        assert_eq!(peak_within(&steady, s), 4);
        // A burst of ten inside a steady trickle.
        let mut burst: Vec<_> = (0..10).map(|i| at(20_000 + i * 50)).collect();
        burst.insert(0, at(0));
        burst.push(at(40_000));
        assert_eq!(peak_within(&burst, s), 10);
    }

    #[test]
    fn a_pool_grows_with_a_burst_and_shrinks_once_it_is_older_than_the_delay() {
        let demand = Demand::default();
        let (start, window) = (SignedDuration::from_secs(3), SignedDuration::from_secs(60));
        let key = ObjectRef::new("p").within("runs");
        assert_eq!(demand.peak(&key, start, window, at(0)), 0);
        for i in 0..6 {
            demand.missed("runs", "p", &format!("r{i}"), at(i * 100));
        }
        // A run that asks again is the same demand.
        demand.missed("runs", "p", "r5", at(700));
        let peak = demand.peak(&key, start, window, at(1000));
        assert_eq!(desired(bounds(1, 4), peak), 4, "held to its maximum");
        assert_eq!(desired(bounds(1, 10), peak), 6);
        // A minute later the burst no longer counts.
        let later = demand.peak(&key, start, window, at(61_000));
        assert_eq!(desired(bounds(1, 10), later), 1, "back to its minimum");
        // Other pools are untouched.
        assert_eq!(
            demand.peak(&ObjectRef::new("q").within("runs"), start, window, at(1000)),
            0
        );
    }

    #[test]
    fn a_miss_wakes_the_pool_and_a_claim_does_not() {
        let demand = Demand::default();
        let wakeups = demand.wakeups();
        futures::pin_mut!(wakeups);
        let mut next =
            || futures::FutureExt::now_or_never(futures::StreamExt::next(&mut wakeups)).flatten();
        demand.claimed("runs", "p", "r1", at(0));
        assert!(next().is_none());
        demand.missed("runs", "p", "r2", at(0));
        assert_eq!(next(), Some(ObjectRef::new("p").within("runs")));
        demand.missed("runs", "p", "r2", at(500));
        assert!(next().is_none(), "once per run");
    }

    #[test]
    fn the_reason_names_the_bound_that_held() {
        let s = SignedDuration::from_secs(3);
        let b = bounds(1, 4);
        let r = reason(b, 9, s, desired(b, 9));
        assert!(r.starts_with("9 runs wanted a sandbox within 3 s"), "{r}");
        assert!(r.ends_with(": 4, its maxReplicas"), "{r}");
        assert!(reason(b, 0, s, desired(b, 0)).ends_with(": 1, its minReplicas"));
        assert!(reason(b, 2, s, desired(b, 2)).ends_with(": 2"));
    }
}

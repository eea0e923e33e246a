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
//!
//! Demand also times a pool's refill: the replacement of a sandbox just claimed starts once the
//! claim's hand-over is likely done ([`Demand::refill_hold`]). A gVisor sandbox's start is about a
//! second of one core; started at the claim, it competed with the call it replaces the sandbox
//! of (the program's hand-over through the API server, the kubelet and containerd), and in a
//! burst ten of them competed with ten calls.

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
/// How long after a pool's latest claim its refill waits: about the time a claim's hand-over takes
/// (the program sent and confirmed: 50-150 ms on a quiet 2-core node, more in a burst).
const HANDOVER: SignedDuration = SignedDuration::from_millis(300);
/// The longest a refill waits for hand-overs, from the first claim it would replace: a pool
/// claimed from without pause still refills.
const MAX_REFILL_HOLD: SignedDuration = SignedDuration::from_secs(1);

/// When runs wanted a sandbox of one pool, and which runs, the oldest first.
type Wanted = VecDeque<(Timestamp, String)>;
/// Per pool, the first and the latest claim since its last refill.
type Unrefilled = HashMap<ObjectRef<SandboxPool>, (Timestamp, Timestamp)>;

/// When runs wanted a sandbox of each pool, shared by the run controller (which records) and the
/// pool controller (which sizes).
#[derive(Clone)]
pub struct Demand {
    events: Arc<Mutex<HashMap<ObjectRef<SandboxPool>, Wanted>>>,
    unrefilled: Arc<Mutex<Unrefilled>>,
    wake: mpsc::UnboundedSender<ObjectRef<SandboxPool>>,
    wakeups: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<ObjectRef<SandboxPool>>>>,
}

impl Default for Demand {
    fn default() -> Self {
        let (wake, wakeups) = mpsc::unbounded_channel();
        Self {
            events: Arc::default(),
            unrefilled: Arc::default(),
            wake,
            wakeups: Arc::new(tokio::sync::Mutex::new(wakeups)),
        }
    }
}

impl Demand {
    /// Run `run` claimed a sandbox of the pool (`now`: when its claim was accepted).
    pub fn claimed(&self, namespace: &str, pool: &str, run: &str, now: Timestamp) {
        self.record(namespace, pool, run, now);
        let mut unrefilled = self.unrefilled.lock().expect("not poisoned");
        unrefilled
            .entry(ObjectRef::new(pool).within(namespace))
            .and_modify(|(_, latest)| *latest = (*latest).max(now))
            .or_insert((now, now));
    }

    /// Wakes the pool a run just claimed a sandbox of once the claim's hand-over is done
    /// ([`HANDOVER`] from now): its refill, held until then ([`Demand::refill_hold`]), starts, and
    /// its status counts the claim. The claimed Pod's own changes no longer reach the pool's
    /// controller (it watches idle Pods only): a wake at the claim would put the pool's list and
    /// status write beside the hand-over.
    pub fn wake_after_handover(&self, namespace: &str, pool: &str) {
        let (wake, pool) = (self.wake.clone(), ObjectRef::new(pool).within(namespace));
        tokio::spawn(async move {
            tokio::time::sleep(HANDOVER.unsigned_abs()).await;
            // The pool controller may be gone (shutting down): nothing to wake then.
            let _ = wake.send(pool);
        });
    }

    /// How much longer the pool's refill should wait for the hand-over of its latest claims, if
    /// at all.
    pub fn refill_hold(&self, pool: &ObjectRef<SandboxPool>, now: Timestamp) -> Option<Duration> {
        let unrefilled = self.unrefilled.lock().expect("not poisoned");
        let (first, latest) = unrefilled.get(pool)?;
        refill_hold(*first, *latest, now)
    }

    /// The pool started its replacements: later claims start a new hold.
    pub fn refilled(&self, pool: &ObjectRef<SandboxPool>) {
        self.unrefilled.lock().expect("not poisoned").remove(pool);
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

/// How much longer a refill waits, given the first and the latest claim it would replace: until
/// [`HANDOVER`] after the latest, and no later than [`MAX_REFILL_HOLD`] after the first.
fn refill_hold(first: Timestamp, latest: Timestamp, now: Timestamp) -> Option<Duration> {
    let until = (latest + HANDOVER).min(first + MAX_REFILL_HOLD);
    let left = until.duration_since(now);
    left.is_positive().then(|| left.unsigned_abs())
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
    fn a_refill_waits_for_the_latest_claims_hand_over_but_not_past_the_bound() {
        let demand = Demand::default();
        let key = ObjectRef::new("p").within("runs");
        let ms = Duration::from_millis;
        // No claim, no hold: a pool short for any other reason refills at once.
        assert_eq!(demand.refill_hold(&key, at(0)), None);
        demand.claimed("runs", "p", "r1", at(0));
        assert_eq!(demand.refill_hold(&key, at(100)), Some(ms(200)));
        // Each claim moves the hold...
        demand.claimed("runs", "p", "r2", at(250));
        assert_eq!(demand.refill_hold(&key, at(300)), Some(ms(250)));
        assert_eq!(demand.refill_hold(&key, at(550)), None);
        // ... but not past a second from the first claim it would replace.
        for i in 0..10 {
            demand.claimed("runs", "p", &format!("s{i}"), at(600 + i * 100));
        }
        assert_eq!(demand.refill_hold(&key, at(1500)), None);
        // Another pool's claims hold only that pool; a refill ends the hold.
        demand.claimed("runs", "q", "r3", at(2000));
        assert_eq!(demand.refill_hold(&key, at(2000)), None);
        demand.refilled(&key);
        demand.claimed("runs", "p", "r4", at(2000));
        assert_eq!(demand.refill_hold(&key, at(2000)), Some(ms(300)));
        demand.refilled(&key);
        assert_eq!(demand.refill_hold(&key, at(2000)), None);
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

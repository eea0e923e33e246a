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
//! Demand also times a pool's refill: the replacements of sandboxes just claimed start once the
//! claims' hand-overs are done, or two seconds after the first claim ([`Demand::refill_hold`]).
//! A gVisor sandbox's start is about a second of one core; started at the claim, it competed
//! with the call it replaces the sandbox of (the program's hand-over through the API server, the
//! kubelet and containerd), and in a burst ten of them competed with ten calls (started a second
//! after the first claim, as until 2026-12-07, they still met a burst's last calls).

use std::collections::{HashMap, HashSet, VecDeque};
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
/// The longest a refill waits for hand-overs, from the first claim it would replace: a pool
/// claimed from without pause still refills, and a hand-over that never reports its end (its
/// reconcile failed on the way) holds no refill past it. A burst of ten calls ends 1-2 s after
/// its first claim on a 2-core node.
const MAX_REFILL_HOLD: SignedDuration = SignedDuration::from_secs(2);

/// When runs wanted a sandbox of one pool, and which runs, the oldest first.
type Wanted = VecDeque<(Timestamp, String)>;
/// Per pool, the first claim since its last refill, and the runs whose hand-over of a sandbox
/// claimed since is not done yet.
type Unrefilled = HashMap<ObjectRef<SandboxPool>, (Timestamp, HashSet<String>)>;

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
    /// Run `run` claimed a sandbox of the pool (`now`: when its claim was accepted); its
    /// hand-over begins, and holds the pool's refill until it is done ([`Demand::handed_over`]).
    pub fn claimed(&self, namespace: &str, pool: &str, run: &str, now: Timestamp) {
        self.record(namespace, pool, run, now);
        let mut unrefilled = self.unrefilled.lock().expect("not poisoned");
        unrefilled
            .entry(ObjectRef::new(pool).within(namespace))
            .or_insert_with(|| (now, HashSet::new()))
            .1
            .insert(run.to_owned());
        // Whatever becomes of the hand-over, the pool is looked at by the end of its hold.
        let (wake, pool) = (self.wake.clone(), ObjectRef::new(pool).within(namespace));
        tokio::spawn(async move {
            tokio::time::sleep(MAX_REFILL_HOLD.unsigned_abs()).await;
            // The pool controller may be gone (shutting down): nothing to wake then.
            let _ = wake.send(pool);
        });
    }

    /// Run `run`'s hand-over of the sandbox it claimed from the pool is done (its result read
    /// and recorded, or given up): once no other claim of the pool is being handed over, the
    /// pool is woken, its refill starts and its status counts the claims. The claimed Pod's own
    /// changes no longer reach the pool's controller (it watches idle Pods only): a wake at the
    /// claim would put the pool's list and status write beside the hand-over, and its refill's
    /// gVisor starts (a second of a core each) beside the calls of a burst still running.
    pub fn handed_over(&self, namespace: &str, pool: &str, run: &str) {
        let key = ObjectRef::new(pool).within(namespace);
        let mut unrefilled = self.unrefilled.lock().expect("not poisoned");
        let Some((_, handing_over)) = unrefilled.get_mut(&key) else {
            return;
        };
        if handing_over.remove(run) && handing_over.is_empty() {
            // The pool controller may be gone (shutting down): nothing to wake then.
            let _ = self.wake.send(key);
        }
    }

    /// How much longer the pool's refill should wait for the hand-overs of its claims, if at
    /// all.
    pub fn refill_hold(&self, pool: &ObjectRef<SandboxPool>, now: Timestamp) -> Option<Duration> {
        let unrefilled = self.unrefilled.lock().expect("not poisoned");
        let (first, handing_over) = unrefilled.get(pool)?;
        refill_hold(*first, handing_over.len(), now)
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

/// How much longer a refill waits, given the first claim it would replace and how many of its
/// claims are being handed over: until none is, and no later than [`MAX_REFILL_HOLD`] after the
/// first.
fn refill_hold(first: Timestamp, handing_over: usize, now: Timestamp) -> Option<Duration> {
    if handing_over == 0 {
        return None;
    }
    let left = (first + MAX_REFILL_HOLD).duration_since(now);
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

    #[tokio::test]
    async fn a_refill_waits_for_its_claims_hand_overs_but_not_past_the_bound() {
        let demand = Demand::default();
        let key = ObjectRef::new("p").within("runs");
        let ms = Duration::from_millis;
        // No claim, no hold: a pool short for any other reason refills at once.
        assert_eq!(demand.refill_hold(&key, at(0)), None);
        demand.claimed("runs", "p", "r1", at(0));
        demand.claimed("runs", "p", "r2", at(250));
        // Held while a hand-over is under way, from the first claim...
        assert_eq!(demand.refill_hold(&key, at(300)), Some(ms(1700)));
        demand.handed_over("runs", "p", "r1");
        assert_eq!(demand.refill_hold(&key, at(400)), Some(ms(1600)));
        // ... until the last is done, which wakes the pool.
        let mut wakeups = Box::pin(demand.wakeups());
        demand.handed_over("runs", "p", "r2");
        assert_eq!(demand.refill_hold(&key, at(500)), None);
        assert_eq!(
            futures::StreamExt::next(&mut wakeups).await,
            Some(key.clone())
        );
        // Not past two seconds from the first claim it would replace: a hand-over that never
        // reports its end holds it no longer.
        demand.claimed("runs", "p", "r3", at(600));
        assert_eq!(demand.refill_hold(&key, at(2100)), None);
        // Another pool's claims hold only that pool; a refill ends the hold, and a hand-over
        // done after it wakes nobody.
        demand.refilled(&key);
        demand.claimed("runs", "q", "r4", at(3000));
        assert_eq!(demand.refill_hold(&key, at(3000)), None);
        demand.claimed("runs", "p", "r5", at(3000));
        assert_eq!(demand.refill_hold(&key, at(3000)), Some(ms(2000)));
        demand.refilled(&key);
        demand.handed_over("runs", "p", "r5");
        assert_eq!(demand.refill_hold(&key, at(3000)), None);
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

    #[tokio::test]
    async fn a_miss_wakes_the_pool_and_a_claim_does_not() {
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

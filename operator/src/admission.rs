//! Fair admission of runs to sandboxes when the namespace has no room for another one.
//!
//! A python run needs a sandbox Pod, and the namespace's ResourceQuota bounds how many exist at
//! once, its nodes how many can run. When a create is refused for quota, or while a sandbox Pod
//! waits for a node with room, a run joins its namespace's queue instead of asking on its own:
//! without a queue, whichever retry happened to come first after a sandbox was freed won, an
//! agent with many calls crowded out one with few, and a run nobody let in waited silently
//! until its deadline and then failed (the load suite: 395 of 918 calls).
//!
//! The queue is fair across agents: agents take turns however many calls each has waiting
//! (start-time fair queueing: each waiting run holds a turn of its agent's, one after the later
//! of its agent's last turn and the turn last served; the queue goes by turn, then arrival).
//! Only the run at the head asks for a sandbox; when it gets one (or a run ends and frees one)
//! the next head is woken. While the queue is not empty, every new run joins it, so nobody
//! overtakes a waiting run. While it is empty, a run asks at once unless the room known for it
//! is taken ([`Room`]: the namespace's quota as a watch last saw it, and the pools' ready
//! sandboxes, less the runs let ask and the pools' Pods created since): then it joins the
//! queue, so that a burst asks for no more sandboxes than there is room for, and the rest are
//! judged on arrival, not after a create the quota refuses.
//!
//! How long a sandbox is held is learned from cold runs only: the queue's runs start theirs
//! after the room frees, and a warm one's was started before its claim.
//!
//! A run is judged once, on arrival: one whose expected wait (the runs ahead of it, with those
//! whose Pod waits for a node, over the rate at which the queue admits runs) is longer than the
//! allowance is refused at once, with the expected wait as a retry hint; runs refused in one
//! moment are told moments one pace apart, as if they had kept their order in the queue, so
//! that they do not all come back in one burst. A queue that fills again
//! goes by the pace it last admitted runs at until it can tell its own. Before the queue can tell
//! any pace (a new leader, or the first seconds of its first burst: no sandbox held long enough to
//! tell), the wait is bounded instead by the longest it can be: every sandbox ahead held as long as
//! runs were held lately, or, before any ended, as long as the arriving run may hold one; a run
//! refused on that bound is told to retry once the pace is known ([`UNKNOWN_PACE_RETRY`]). One
//! accepted waits for its sandbox, also when the pace turns out slower than estimated, and is
//! refused only as a last resort, at twice the allowance (a queue that stopped moving): no run
//! fails or times out only because others were ahead of it, and a caller refused hears it at once.
//!
//! The queue lives in the leader's memory; what a run's status records (`queuedAt`) puts it back
//! in its place after a restart, when its reconcile registers it again. Every waiting run is
//! reconciled at least every [`REFRESH`]. An entry not refreshed for [`LAPSED_AFTER`] has lapsed:
//! its run's reconcile is late (an operator too busy to reach it in a burst) or its run is gone
//! (deleted, or another replica leads now). A lapsed run keeps its place, since a late reconcile
//! must not cost a run its turn (the load suite, 2026-12-05: runs whose refreshes came late were
//! dropped, came back behind the burst that arrived after them and were refused at the last
//! resort), but the first run after it that is not lapsed asks in its stead, so a gone run never
//! blocks the queue. Its entry is dropped when its run could no longer be let in anyway: at its
//! last resort.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube::runtime::reflector::ObjectRef;
use sandboxrun_api::SandboxRun;
use tokio::sync::mpsc;

/// How long a run may wait for a sandbox unless configured (`--max-queue-wait-seconds`).
pub const DEFAULT_ALLOWANCE: Duration = Duration::from_secs(60);
/// How often a waiting run is reconciled even when nothing wakes it: it refreshes its entry,
/// and its status gets its new position.
pub const REFRESH: Duration = Duration::from_secs(2);
/// How soon the head asks again after the quota refused it (a freed sandbox also wakes it).
pub const HEAD_RETRY: Duration = Duration::from_millis(500);
/// An entry not refreshed for this long has lapsed: its run's reconcile is late, or the run is
/// gone. It keeps its place but does not ask for a sandbox. Well above the time between two
/// reconciles of a waiting run under load: [`REFRESH`] and the reconcile's own reads (a few
/// seconds each on two saturated cores, the load suite); at 10 s, runs whose reads were slow
/// lapsed while they waited, and runs after them went first.
const LAPSED_AFTER: SignedDuration = SignedDuration::from_secs(30);
/// How many admissions out of the queue the rate is estimated from.
const RATE_SAMPLES: usize = 256;
/// Admissions older than this say nothing about the rate now.
const RATE_WINDOW: SignedDuration = SignedDuration::from_secs(60);
/// How long the queue must have been waiting before its rate is trusted.
const RATE_MIN_SPAN: SignedDuration = SignedDuration::from_secs(5);
/// The weight of the latest run's hold time in the average.
const HOLD_WEIGHT: f64 = 0.2;
/// Longer than any run holds a sandbox: the longest timeout, its Pod's start-up grace, slack.
const HELD_AT_MOST: SignedDuration = SignedDuration::from_secs(3600);
/// How many allowances an accepted run may wait before it is refused after all: the last
/// resort against a queue that stopped moving (no node takes a Pod, say). A run is judged on
/// arrival, so a pace slower than estimated stretches its wait instead of refusing it late.
const LAST_RESORT_FACTOR: u32 = 2;
/// How long the most sandboxes seen running at once while runs waited for room stands for the
/// nodes' (or the quota's) room, unless more are seen; and how long the pace a queue last
/// admitted runs at stands for its pace when it fills again.
const PEAK_FOR: SignedDuration = SignedDuration::from_secs(600);
/// The shortest retry hint, in seconds.
const MIN_RETRY_SECONDS: u32 = 1;
/// The retry hint of a run refused before the queue could tell its pace: by then a sandbox has
/// been held long enough to tell ([`RATE_MIN_SPAN`]), and the run is judged on the pace.
pub const UNKNOWN_PACE_RETRY: Duration = Duration::from_secs(5);
/// How far apart the moments refused runs are told to come back at while the queue cannot tell
/// its pace ([`Queue::book_retry`]).
const UNKNOWN_PACE_SPACING: Duration = Duration::from_secs(1);

/// Where a cold sandbox's Pod stands with the scheduler, as its run's reconcile saw it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Placement {
    /// Not on a node yet, and not refused by the scheduler (it has just been created).
    Waiting,
    /// No node has room for it.
    Unschedulable,
    /// A node took it.
    Placed,
}

/// How many more sandboxes the namespace's quota had room for, as last seen: a hint
/// (`quota_room.rs`), never the authority (the create is).
#[derive(Clone, Debug, PartialEq)]
pub struct Room {
    /// Sandboxes of the asking run's size it had room for.
    pub sandboxes: u32,
    /// When the quota was seen: a refusal of the quota's after this is fresher news.
    pub seen: Timestamp,
    /// The Pods counted in it, by name: a Pod the operator created that is not among them
    /// takes room beside it.
    pub counted: Arc<HashSet<String>>,
    /// How many of `sandboxes` are warm ones ready in the pools the run may claim from. A claim
    /// takes two: the warm sandbox, and the quota's room for its pool's replacement.
    pub warm: u32,
}

/// How a run got its sandbox ([`Admission::admitted`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sandbox<'a> {
    /// A pool's, already running.
    Claimed,
    /// A Pod of its own, created under this name (it waits for a node until
    /// [`Admission::scheduling`] says otherwise).
    Created(&'a str),
}

/// What counts against the room of a quota: a run let ask for a sandbox while the room was
/// known, a warm claim whose replacement is not started yet, or a pool's Pod.
#[derive(Clone, Debug)]
struct Asked {
    since: Timestamp,
    /// Its Pod, once created, and when: it counts until the room counts it.
    pod: Option<(String, Timestamp)>,
}

impl Asked {
    fn new(since: Timestamp) -> Self {
        Self { since, pod: None }
    }
}

/// What a run that needs a sandbox may do now.
#[derive(Clone, Debug, PartialEq)]
pub enum Ask {
    /// Nobody waits: ask for a sandbox.
    Go,
    /// The run heads the queue: ask for a sandbox (a refusal keeps it at the head).
    Head,
    /// Others are ahead: wait.
    Wait(Place),
    /// The run cannot start within its allowance: refuse it, with a hint.
    Refuse(Refusal),
}

/// A waiting run's place in the queue.
#[derive(Clone, Debug, PartialEq)]
pub struct Place {
    /// 1 for the head.
    pub position: u32,
    /// When it joined the queue.
    pub since: Timestamp,
    /// How long until it is admitted, at the rate the queue has been admitting runs, if known.
    pub expected: Option<Duration>,
}

/// Why a run is refused for capacity, and when to try again.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// Its position when refused.
    pub position: u32,
    /// The wait the queue's rate predicts for it, if known.
    pub expected: Option<Duration>,
    /// Seconds after which a new call could expect to be admitted in time.
    pub retry_after_seconds: u32,
    /// Accepted, it waited until the last resort: the queue stopped moving.
    pub last_resort: bool,
    /// Refused on the longest wait possible, the queue's pace not known yet: how long each
    /// sandbox ahead might be held.
    pub unknown_pace: Option<Duration>,
}

impl Refusal {
    /// The run's status message: what happened, and what the caller should do.
    pub fn message(&self, allowance: Duration) -> String {
        let expected = match (self.expected, self.unknown_pace) {
            (Some(d), _) => format!("an expected wait of about {} s", d.as_secs().max(1)),
            (None, Some(held)) => format!(
                "the queue's pace is not known yet (no sandbox held long enough to tell), so \
                 each sandbox ahead may be held up to {} s",
                held.as_secs()
            ),
            (None, None) => "no sandbox freed lately".to_owned(),
        };
        let why = if self.last_resort {
            format!(
                "the run waited {} s (twice the {} s a run may wait) and the queue for \
                 sandboxes did not reach it",
                (allowance * LAST_RESORT_FACTOR).as_secs(),
                allowance.as_secs()
            )
        } else {
            format!(
                "no sandbox could start this run within the {} s a run may wait for one",
                allowance.as_secs()
            )
        };
        format!(
            "{why}: {} runs wait for a sandbox ahead of it and {expected}; nothing was \
             executed: retry in {} s (status.retryAfterSeconds), or with fewer calls at once",
            self.position.saturating_sub(1),
            self.retry_after_seconds
        )
    }
}

/// One waiting run.
#[derive(Clone, Debug)]
struct Entry {
    run: ObjectRef<SandboxRun>,
    agent: String,
    since: Timestamp,
    /// Its last reconcile.
    seen: Timestamp,
}

/// One namespace's queue.
#[derive(Debug, Default)]
struct Queue {
    /// By run uid.
    entries: HashMap<String, Entry>,
    /// Each waiting agent's turns, ascending: one per waiting run, its earliest run taking the
    /// first. A new run's turn is one after the later of the agent's last turn and the turn last
    /// admitted: an agent with many runs waiting holds turns far ahead, one arriving with none
    /// takes the next round's (start-time fair queueing, every agent weighted alike).
    turns: HashMap<String, VecDeque<u64>>,
    /// The turn of the run admitted last (the queue's virtual time).
    served: u64,
    /// When runs left the queue for a sandbox, the latest last.
    admitted: VecDeque<Timestamp>,
    /// Since when the queue has had runs waiting.
    waiting_since: Option<Timestamp>,
    /// The pace (runs a second) the queue admitted runs at when it last could tell, and when:
    /// the pace of a queue that fills again, until it can tell its own. A burst after a quiet
    /// moment is otherwise judged on the sandboxes' hold alone, blind to what a node takes to
    /// free and start one (the load suite, 2026-12-05: a burst accepted 72 runs on a pace twice
    /// the one it got).
    last_pace: Option<(f64, Timestamp)>,
    /// The runs holding a sandbox (admitted, not ended), by uid: when they got it, or when a
    /// node took its Pod if it waited for one.
    holding: HashMap<String, Timestamp>,
    /// How long a run holds its sandbox, on average lately (seconds; an exponential average of
    /// the cold runs that ended, from when a node took their Pod).
    hold: Option<f64>,
    /// The runs holding a warm sandbox, by uid: their hold is not a cold one's. A warm sandbox
    /// started before it was claimed; the runs of the queue start theirs after the room frees
    /// (the pool is empty under load). One warm `print(1)` ended a second after its claim was
    /// a burst's only hold seen, and the burst was accepted 76 places deep on it (the load
    /// suite, 2026-12-05: three of them met their last resort).
    warm: HashSet<String>,
    /// Runs admitted whose sandbox Pod no node has taken yet: they go before the queue, and free
    /// nothing until a node takes them (with room for 3 and a quota of 20, 17 of them; the load
    /// suite's late refusals came from counting them as running).
    unplaced: HashSet<String>,
    /// Those of them no node has room for: while there is one, the cluster is full whatever the
    /// quota says, and nobody else asks for a sandbox.
    unschedulable: HashSet<String>,
    /// The most sandboxes seen running at once while runs waited for room, and when: the room
    /// the nodes or the quota have. It stands in for the sandboxes running now while Pods just
    /// created are not placed yet (the first seconds of a burst), for [`PEAK_FOR`].
    peak: Option<(usize, Timestamp)>,
    /// Runs let ask for a sandbox while the room was known (asked with a [`Room`]), by uid, and
    /// the pools' Pods being created or created lately ([`Admission::pool_pod_creating`]):
    /// since when, and their Pod once created (a run that claims a warm sandbox leaves). Until
    /// a room counts that Pod, the room is that much smaller ([`Queue::room_left`]).
    asked: HashMap<String, Asked>,
    /// When the quota last refused a Pod: fresher news than a usage seen before it, which
    /// then says no room ([`Queue::room_left`]).
    refused_at: Option<Timestamp>,
    /// The latest moment a refused run was told to come back at ([`Queue::book_retry`]).
    retries_until: Option<Timestamp>,
}

impl Queue {
    /// When a run refused now, told to come back `earliest` from now, should come back: no
    /// sooner than `spacing` after the run refused before it was told to, as if the refused
    /// runs had kept their order in the queue. A burst refused in one moment and told the same
    /// moment to come back comes back as a burst, and most of it is refused again (the load
    /// suite, 2026-12-05: 21 retries in one second, each answered in over 2 s). Never later
    /// than `latest` from now.
    fn book_retry(
        &mut self,
        earliest: Duration,
        spacing: Duration,
        latest: Duration,
        now: Timestamp,
    ) -> Duration {
        let at = |d: Duration| now.checked_add(d).unwrap_or(now);
        let mut when = at(earliest.min(latest));
        if let Some(after) = self
            .retries_until
            .and_then(|booked| booked.checked_add(spacing).ok())
        {
            when = when.max(after).min(at(latest));
        }
        self.retries_until = Some(when);
        when.duration_since(now).unsigned_abs()
    }

    fn insert(&mut self, uid: &str, entry: Entry) {
        let turns = self.turns.entry(entry.agent.clone()).or_default();
        let turn = turns.back().copied().unwrap_or(0).max(self.served) + 1;
        turns.push_back(turn);
        self.entries.insert(uid.to_owned(), entry);
    }

    /// Removes `uid`'s entry. A run admitted takes its agent's first turn (it was the agent's
    /// earliest, or it would not have been admitted) and moves the queue's time on; one that
    /// leaves otherwise (refused, cancelled, gone) gives up its agent's last turn, so the runs
    /// behind it keep theirs.
    fn remove(&mut self, uid: &str, admitted: bool) -> bool {
        let Some(entry) = self.entries.remove(uid) else {
            return false;
        };
        if let Some(turns) = self.turns.get_mut(&entry.agent) {
            let turn = if admitted {
                turns.pop_front()
            } else {
                turns.pop_back()
            };
            if admitted && let Some(turn) = turn {
                self.served = self.served.max(turn);
            }
            if turns.is_empty() {
                self.turns.remove(&entry.agent);
            }
        }
        if self.entries.is_empty() {
            self.turns.clear();
            self.served = 0;
            self.waiting_since = None;
        }
        true
    }

    /// Drops the entries whose run is gone: lapsed, and past their last resort (`waits_at_most`
    /// after they joined), when a run that came back would be refused anyway.
    fn drop_gone(&mut self, waits_at_most: SignedDuration, now: Timestamp) {
        let gone: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| lapsed(e, now) && now.duration_since(e.since) >= waits_at_most)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in gone {
            self.remove(&uid, false);
        }
    }

    /// The run uids in the order they are admitted: by turn (each agent's runs take its turns
    /// in the order they arrived), then arrival.
    fn order(&self) -> Vec<&str> {
        let mut by_agent: HashMap<&str, Vec<(&str, &Entry)>> = HashMap::new();
        for (uid, e) in &self.entries {
            by_agent
                .entry(e.agent.as_str())
                .or_default()
                .push((uid.as_str(), e));
        }
        let mut ranked: Vec<(u64, Timestamp, &str, &str)> = Vec::new();
        for (agent, runs) in &mut by_agent {
            runs.sort_by(|a, b| (a.1.since, &a.1.run.name).cmp(&(b.1.since, &b.1.run.name)));
            let turns = self.turns.get(*agent);
            for (i, (uid, e)) in runs.iter().enumerate() {
                let turn = turns.and_then(|t| t.get(i)).copied().unwrap_or(u64::MAX);
                ranked.push((turn, e.since, e.run.name.as_str(), uid));
            }
        }
        ranked.sort();
        ranked.into_iter().map(|(_, _, _, uid)| uid).collect()
    }

    fn position(&self, uid: &str) -> Option<u32> {
        let at = self.order().iter().position(|u| *u == uid)?;
        Some(u32::try_from(at + 1).unwrap_or(u32::MAX))
    }

    /// The run that asks for a sandbox for the queue: the first in order whose reconcile is not
    /// late. Runs ahead of it that lapsed keep their places, and ask when they are back.
    fn head(&self, now: Timestamp) -> Option<&str> {
        self.order()
            .into_iter()
            .find(|uid| self.entries.get(*uid).is_some_and(|e| !lapsed(e, now)))
    }

    /// Wakes the head, if a run waits.
    fn wake_head(&self, wake: &mpsc::UnboundedSender<ObjectRef<SandboxRun>>, now: Timestamp) {
        if let Some(head) = self.head(now).and_then(|uid| self.entries.get(uid)) {
            // The controller may be gone (shutting down): nothing to wake then.
            let _ = wake.send(head.run.clone());
        }
    }

    /// Runs admitted a second, as the queue can tell: the slower of what it has admitted over
    /// the last minute it has been waiting (once it has waited long enough to tell) and what
    /// the sandboxes running free at the average hold time (once a run has ended). The slower:
    /// the second is a model, blind to the time a freed node waits for the scheduler to retry
    /// a Pod it refused, and a run accepted on a pace too fast waits past its allowance (the
    /// load suite, 2026-12-04: accepted calls waited p50 81 s). `None`: nothing to tell by yet.
    fn rate(&self, now: Timestamp) -> Option<f64> {
        // How long a sandbox is held: the average of those given back lately, or longer when
        // the ones held now have been held longer than that on average (long runs hold the
        // room now). Known once a run ended, or once the ones held now are older than the
        // queue needs to tell its own rate.
        // Only the sandboxes a node runs: the Pods waiting for a node free nothing.
        let ages: Vec<f64> = self
            .holding
            .iter()
            .filter(|(uid, _)| !self.unplaced.contains(*uid))
            .map(|(_, since)| now.duration_since(*since).as_secs_f64().max(0.0))
            .collect();
        let mean_age = (!ages.is_empty()).then(|| ages.iter().sum::<f64>() / ages.len() as f64);
        let hold = match (self.hold, mean_age) {
            (Some(h), Some(age)) => Some(h.max(age)),
            (Some(h), None) => Some(h),
            (None, Some(age)) if age >= RATE_MIN_SPAN.as_secs_f64() => Some(age),
            (None, _) => None,
        };
        // As many as run now; while Pods wait for a node, as many of them as the room seen
        // lately says will run (in a burst's first seconds nothing is placed yet). Only then:
        // the room may have shrunk since (a quota lowered to 1 after 5 ran at once, in CI).
        let running = ages.len();
        let slots = match self.peak(now) {
            Some(peak) if peak > running => peak.min(running + self.unplaced.len()),
            _ => running,
        };
        let freeing = hold
            .filter(|h| *h > 0.0 && slots > 0)
            .map(|h| slots as f64 / h);
        let admitted = self.admitted_rate(now).or_else(|| self.last_pace(now));
        match (admitted, freeing) {
            (Some(a), Some(f)) => Some(a.min(f)),
            (a, f) => a.or(f),
        }
    }

    /// The pace the queue last admitted runs at, if it told one within [`PEAK_FOR`].
    fn last_pace(&self, now: Timestamp) -> Option<f64> {
        self.last_pace
            .filter(|(_, at)| now.duration_since(*at) < PEAK_FOR)
            .map(|(pace, _)| pace)
    }

    /// Runs admitted out of the queue a second, over the last minute it has been waiting;
    /// `None` until it has waited long enough to tell. A queue that admitted nobody for a
    /// whole window has a rate of zero; one that admitted nobody for less cannot tell yet (a
    /// few seconds without a sandbox freed is what long runs look like).
    fn admitted_rate(&self, now: Timestamp) -> Option<f64> {
        let since = self.waiting_since?;
        let window_start = now.checked_sub(RATE_WINDOW).unwrap_or(now).max(since);
        let span = now.duration_since(window_start);
        if span < RATE_MIN_SPAN {
            return None;
        }
        let recent: Vec<&Timestamp> = self
            .admitted
            .iter()
            .filter(|t| **t >= window_start)
            .collect();
        if recent.is_empty() && span < RATE_WINDOW {
            return None;
        }
        // More admissions in the window than are kept: the rate over those kept.
        let span = match recent.first() {
            Some(oldest) if recent.len() == RATE_SAMPLES => now.duration_since(**oldest),
            _ => span,
        };
        Some(recent.len() as f64 / span.as_secs_f64().max(f64::EPSILON))
    }

    /// The room seen lately, if it was seen within [`PEAK_FOR`].
    fn peak(&self, now: Timestamp) -> Option<usize> {
        self.peak
            .filter(|(_, at)| now.duration_since(*at) < PEAK_FOR)
            .map(|(n, _)| n)
    }

    /// Runs wait for room (the queue is not empty, or a Pod has no node): the sandboxes running
    /// now are the room there is, and the peak is at least that.
    fn saw_room_full(&mut self, now: Timestamp) {
        let running = self.holding.len() - self.unplaced.len().min(self.holding.len());
        if running > 0 && self.peak(now).is_none_or(|n| running >= n) {
            self.peak = Some((running, now));
        }
    }

    /// Forgets the pools' Pods and the warm claims, made or that may be made, counted against
    /// the room ([`REFILL_PREFIX`], [`MAY_CLAIM_PREFIX`], [`Admission::pool_pod_creating`])
    /// after [`LAPSED_AFTER`]: a run's entry leaves with its run, theirs would stay for good in
    /// a namespace where no room is ever seen (no ResourceQuota there), or whose Pods' watch
    /// never saw the Pod (deleted first).
    fn forget_old_pool_pods(&mut self, now: Timestamp) {
        self.asked.retain(|key, asked| {
            let at = asked.pod.as_ref().map_or(asked.since, |(_, at)| *at);
            ![REFILL_PREFIX, MAY_CLAIM_PREFIX, POOL_POD_PREFIX]
                .iter()
                .any(|prefix| key.starts_with(prefix))
                || now.duration_since(at) < LAPSED_AFTER
        });
    }

    /// Run `uid` may ask for a sandbox with `room`: it counts against the room, and so does the
    /// replacement of a warm sandbox it may claim (as many of those as there are warm
    /// sandboxes, [`Queue::room_left`]), until it creates a Pod of its own or leaves without a
    /// sandbox. Counted only once its claim was done, the replacement was not counted
    /// while the claim was on its way, and a burst asked for one sandbox more per claim than
    /// there was room for (the load suite's opening burst, 2026-12-06: two or three runs of a
    /// hundred, each refused by the quota 2 s after its decision).
    fn let_ask(&mut self, uid: &str, room: &Room, now: Timestamp) {
        self.asked
            .entry(uid.to_owned())
            .or_insert_with(|| Asked::new(now));
        if room.warm > 0 {
            self.asked
                .entry(may_claim_key(uid))
                .or_insert_with(|| Asked::new(now));
        }
    }

    /// Whether `room`, the quota as last seen, has room for one more sandbox beside the runs let
    /// ask that it does not count: those still asking, and those whose Pod it does not name
    /// ([`Room::counted`]; the time it was seen says nothing of what it counts, a watch under
    /// load delivering states a second old). A run that asked and was heard of no more (its
    /// reconcile failed) stops counting after [`LAPSED_AFTER`], and so does a Pod created that
    /// long ago that no room counts: the watch would have seen it by then, so it is gone (a
    /// pool scaled down before any run asked while its new Pods were counted, say; those
    /// counted against every room after, and every run of an empty namespace queued behind
    /// three Pods that were not there). None after a refusal of the quota's later than it was
    /// seen.
    fn room_left(&mut self, room: &Room, now: Timestamp) -> bool {
        if self.refused_at.is_some_and(|at| at >= room.seen) {
            return false;
        }
        self.asked.retain(|_, asked| match &asked.pod {
            Some((pod, created)) => {
                !room.counted.contains(pod) && now.duration_since(*created) < LAPSED_AFTER
            }
            None => now.duration_since(asked.since) < LAPSED_AFTER,
        });
        // No more claims than warm sandboxes: the other runs that may claim one go cold.
        let may_claim = self
            .asked
            .keys()
            .filter(|key| key.starts_with(MAY_CLAIM_PREFIX))
            .count();
        let taken = self.asked.len() - may_claim + may_claim.min(room.warm as usize);
        usize::try_from(room.sandboxes).unwrap_or(usize::MAX) > taken
    }

    /// How long each sandbox ahead may be held, for a queue that cannot tell its pace: the
    /// average hold seen lately if a run has ended (nothing may run now: the Pods ahead are not
    /// placed yet), else `longest`, the arriving run's own limit.
    fn turn_at_most(&self, longest: Duration) -> Duration {
        self.hold
            .and_then(|h| Duration::try_from_secs_f64(h).ok())
            .unwrap_or(longest)
    }

    /// The longest the run at `position` can wait when every sandbox ahead of it is held for
    /// `longest`: the runs waiting for a node and the queue ahead taking turns on the sandboxes
    /// running now (at least one). For a queue that cannot tell its pace yet.
    fn longest_wait(&self, position: u32, longest: Duration) -> Duration {
        let running = self.holding.len() - self.unplaced.len().min(self.holding.len());
        let ahead = u32::try_from(self.unplaced.len())
            .unwrap_or(u32::MAX)
            .saturating_add(position);
        let rounds = ahead.div_ceil(u32::try_from(running.max(1)).unwrap_or(u32::MAX));
        longest.saturating_mul(rounds)
    }

    /// How long until the run at `position` is admitted. The runs waiting for a node go first.
    fn expected(&self, position: u32, now: Timestamp) -> Option<Duration> {
        let rate = self.rate(now)?;
        if rate <= 0.0 {
            return Some(Duration::MAX);
        }
        let ahead = f64::from(position) + self.unplaced.len() as f64;
        Some(Duration::try_from_secs_f64(ahead / rate).unwrap_or(Duration::MAX))
    }
}

/// The queues of every namespace, and the wake-ups of their heads.
pub struct Admission {
    queues: Mutex<HashMap<String, Queue>>,
    /// How long a run may wait for a sandbox, counted from when it joined the queue.
    allowance: Duration,
    wake: mpsc::UnboundedSender<ObjectRef<SandboxRun>>,
    /// Read by one controller at a time (a replica that leads again starts a new one).
    wakeups: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<ObjectRef<SandboxRun>>>>,
    /// Numbers the pools' Pods counted against the room ([`Self::pool_pod_creating`]).
    pool_pods: AtomicU64,
}

/// The key among the runs let ask of a warm claim whose pool has not started its replacement.
const REFILL_PREFIX: &str = "refill/";
/// The key among the runs let ask of the replacement of run `uid`'s warm claim.
fn refill_key(uid: &str) -> String {
    format!("{REFILL_PREFIX}{uid}")
}
/// The key among the runs let ask of the replacement of a warm claim run `uid` may make
/// ([`Queue::let_ask`]): [`refill_key`] once it claimed.
const MAY_CLAIM_PREFIX: &str = "may-claim/";
fn may_claim_key(uid: &str) -> String {
    format!("{MAY_CLAIM_PREFIX}{uid}")
}

/// The key among the runs let ask of a pool's Pod ([`Admission::pool_pod_creating`]).
const POOL_POD_PREFIX: &str = "pool-pod/";

/// A pool's Pod counted against its namespace's room while it is created: its key among the
/// runs let ask (never a run's uid).
#[derive(Debug)]
#[must_use = "report the create's end with Admission::pool_pod_created"]
pub struct CountedPod(String);

impl Admission {
    /// Queues whose runs may wait `allowance` for a sandbox.
    pub fn new(allowance: Duration) -> Self {
        let (wake, wakeups) = mpsc::unbounded_channel();
        Self {
            queues: Mutex::default(),
            allowance,
            wake,
            wakeups: Arc::new(tokio::sync::Mutex::new(wakeups)),
            pool_pods: AtomicU64::new(0),
        }
    }

    /// A warm pool is about to create a sandbox Pod in `namespace`. It takes room in the
    /// namespace's quota as a run's own Pod does, so it counts against the room last seen as a
    /// run let ask does, until the quota is seen after its create. Uncounted, a burst that
    /// claimed warm sandboxes had their replacements take the room that runs were let ask for:
    /// the quota refused those runs' Pods, and they were refused 2.2 s after their call instead
    /// of 1 (the load suite's opening burst, 2026-12-06: 5 of 100, and 3 more in the next).
    pub fn pool_pod_creating(&self, namespace: &str, now: Timestamp) -> CountedPod {
        let n = self.pool_pods.fetch_add(1, Ordering::Relaxed);
        let key = format!("{POOL_POD_PREFIX}{n}");
        let mut queues = self.queues.lock().expect("not poisoned");
        let queue = queues.entry(namespace.to_owned()).or_default();
        queue.forget_old_pool_pods(now);
        // The replacement of the earliest claim still waiting for one: that claim stops
        // counting, the Pod counts instead.
        let replaced = queue
            .asked
            .iter()
            .filter(|(key, _)| key.starts_with(REFILL_PREFIX))
            .min_by_key(|(_, asked)| asked.since)
            .map(|(key, _)| key.clone());
        if let Some(replaced) = replaced {
            queue.asked.remove(&replaced);
        }
        queue.asked.insert(key.clone(), Asked::new(now));
        CountedPod(key)
    }

    /// The create of a pool's Pod counted by [`Self::pool_pod_creating`] ended: a Pod created
    /// (`created`, its name) counts until a room counts it; one refused takes no room.
    pub fn pool_pod_created(
        &self,
        namespace: &str,
        CountedPod(key): CountedPod,
        created: Option<&str>,
        now: Timestamp,
    ) {
        let mut queues = self.queues.lock().expect("not poisoned");
        let queue = queues.entry(namespace.to_owned()).or_default();
        match created {
            Some(pod) => {
                queue.asked.insert(
                    key,
                    Asked {
                        since: now,
                        pod: Some((pod.to_owned(), now)),
                    },
                );
            }
            None => {
                queue.asked.remove(&key);
            }
        }
    }

    /// How long a run may wait for a sandbox.
    pub fn allowance(&self) -> Duration {
        self.allowance
    }

    /// The runs to reconcile because they head a queue now, for the controller.
    pub fn wakeups(&self) -> impl futures::Stream<Item = ObjectRef<SandboxRun>> + Send + use<> {
        futures::stream::unfold(self.wakeups.clone(), |wakeups| async move {
            let next = wakeups.lock().await.recv().await;
            next.map(|run| (run, wakeups))
        })
    }

    /// Run `uid` (of `agent`) needs a sandbox: may it ask for one now? `queued_since` is when
    /// its status says it joined the queue, if it did; it may wait the allowance from then.
    /// `longest`: the most it can hold a sandbox (its timeout and its Pod's start-up grace).
    /// `quota`: the room for it when last seen, if known: the namespace's quota's for its Pod,
    /// and the ready sandboxes of the pools it may claim from.
    ///
    /// A run arriving while nobody waits asks at once, unless the quota is known to be full:
    /// then it joins the queue and is judged on arrival, as every run of a burst beyond the
    /// room is, rather than after a create the quota refuses.
    #[expect(
        clippy::too_many_arguments,
        reason = "what the queue weighs of one run, each from a different place"
    )]
    pub fn ask(
        &self,
        run: &ObjectRef<SandboxRun>,
        uid: &str,
        agent: &str,
        queued_since: Option<Timestamp>,
        longest: Duration,
        quota: Option<Room>,
        now: Timestamp,
    ) -> Ask {
        let mut queues = self.queues.lock().expect("not poisoned");
        let queue = queues.entry(namespace_of(run)).or_default();
        queue.drop_gone(self.waits_at_most(), now);
        let room = queue.unschedulable.is_empty();
        let room_left = quota.as_ref().map(|q| queue.room_left(q, now));
        // What the room was weighed on, for a burst that asked for more than the quota had.
        tracing::debug!(run = %run.name, room = ?quota.as_ref().map(|q| (q.sandboxes, q.warm, q.counted.len())),
            asked = ?queue.asked.keys().collect::<Vec<_>>(), ?room_left, waiting = queue.entries.len(), "weighing the room");
        if room && queue.entries.is_empty() && queued_since.is_none() && room_left != Some(false) {
            if let Some(quota) = &quota {
                queue.let_ask(uid, quota, now);
            }
            return Ask::Go;
        }
        let arriving = queued_since.is_none() && !queue.entries.contains_key(uid);
        self.enter(queue, run, uid, agent, queued_since.unwrap_or(now), now);
        let ask = self.judge(queue, uid, arriving, longest, room, now);
        if ask == Ask::Head
            && let Some(quota) = &quota
        {
            queue.let_ask(uid, quota, now);
        }
        ask
    }

    /// Run `uid` asked for a sandbox and the quota had no room: it joins the queue (at the head
    /// when nobody else waits), judged as any run that joins it is ([`Self::ask`]): a burst's
    /// runs may all have been let ask before the first of them met the quota. Never
    /// [`Ask::Head`]: the head asks again after [`HEAD_RETRY`], or when woken.
    pub fn no_room(
        &self,
        run: &ObjectRef<SandboxRun>,
        uid: &str,
        agent: &str,
        queued_since: Option<Timestamp>,
        longest: Duration,
        now: Timestamp,
    ) -> Ask {
        let mut queues = self.queues.lock().expect("not poisoned");
        let queue = queues.entry(namespace_of(run)).or_default();
        // Refused: it takes no room, and there is none until the quota is seen again.
        queue.asked.remove(uid);
        queue.asked.remove(&may_claim_key(uid));
        queue.refused_at = Some(now);
        queue.drop_gone(self.waits_at_most(), now);
        let arriving = queued_since.is_none() && !queue.entries.contains_key(uid);
        let since = queue
            .entries
            .get(uid)
            .map(|e| e.since)
            .or(queued_since)
            .unwrap_or(now);
        self.enter(queue, run, uid, agent, since, now);
        self.judge(queue, uid, arriving, longest, false, now)
    }

    /// What run `uid`, in `queue` now, does: asks (`may_ask`: the cluster has room, and it
    /// heads the queue), waits, or is refused (on arrival, or at the last resort).
    fn judge(
        &self,
        queue: &mut Queue,
        uid: &str,
        arriving: bool,
        longest: Duration,
        may_ask: bool,
        now: Timestamp,
    ) -> Ask {
        queue.saw_room_full(now);
        let since = queue.entries[uid].since;
        let position = queue.position(uid).unwrap_or(1);
        let expected = queue.expected(position, now);
        // Decided on arrival: a run the queue's pace says cannot start within the allowance is
        // refused now; without a pace, one that might not, were every sandbox ahead held as long
        // as runs were held lately (or, before any ended, as this run may hold one). One accepted waits for its sandbox, even past the allowance
        // when the pace was slower than it said, up to the last resort.
        let turn = queue.turn_at_most(longest);
        let unknown_pace = (arriving && expected.is_none()).then_some(turn);
        let hopeless = arriving
            && match expected {
                Some(e) => e > self.allowance,
                None => queue.longest_wait(position, turn) > self.allowance,
            };
        if arriving {
            // What a run was judged on: a burst's judgments are read back from these.
            tracing::debug!(%uid, position, ?expected, ?turn, hold = ?queue.hold,
                holding = queue.holding.len(), unplaced = queue.unplaced.len(), hopeless,
                "judged on arrival");
        }
        let last_resort = since.checked_add(self.waits_at_most()).unwrap_or(since);
        let out_of_time = now >= last_resort;
        // The head asks; so does the run after a head whose reconcile is late (lapsed).
        if may_ask && queue.head(now) == Some(uid) && !out_of_time {
            return Ask::Head;
        }
        if hopeless || out_of_time {
            queue.remove(uid, false);
            // When the queue should have shrunk to half an allowance, but never further off than
            // the last resort: a pace estimated near zero says little about minutes ahead, and a
            // caller told to come back in an hour (a load run saw 727 s) does not.
            let retry = match (expected, unknown_pace) {
                (None, Some(_)) if hopeless => UNKNOWN_PACE_RETRY,
                _ => expected
                    .filter(|e| *e != Duration::MAX)
                    .map_or(self.allowance, |e| e.saturating_sub(self.allowance / 2)),
            };
            // One pace apart from the run refused before it: the time the queue takes to admit
            // one more run (a second while it cannot tell).
            let spacing = queue
                .rate(now)
                .filter(|r| *r > 0.0)
                .and_then(|r| Duration::try_from_secs_f64(1.0 / r).ok())
                .unwrap_or(UNKNOWN_PACE_SPACING);
            let retry = queue.book_retry(retry, spacing, self.allowance * LAST_RESORT_FACTOR, now);
            return Ask::Refuse(Refusal {
                position,
                expected: expected.filter(|e| *e != Duration::MAX),
                // Rounded up: told a second early, a caller comes back before its moment.
                retry_after_seconds: u32::try_from(
                    retry.as_secs() + u64::from(retry.subsec_nanos() > 0),
                )
                .unwrap_or(u32::MAX)
                .max(MIN_RETRY_SECONDS),
                last_resort: !hopeless,
                unknown_pace: unknown_pace.filter(|_| hopeless),
            });
        }
        Ask::Wait(Place {
            position,
            since,
            expected,
        })
    }

    /// Whether run `uid` got a sandbox and has not ended, as far as this process saw: a status
    /// that says it still waits without one lags the operator's own record.
    pub fn holds(&self, run: &ObjectRef<SandboxRun>, uid: &str) -> bool {
        let queues = self.queues.lock().expect("not poisoned");
        queues
            .get(&namespace_of(run))
            .is_some_and(|q| q.holding.contains_key(uid))
    }

    /// Run `uid` got its sandbox: it leaves the queue (if it waited there), and the next run
    /// is woken to ask for one. A cold one's Pod waits for a node until [`Self::scheduling`]
    /// says otherwise.
    pub fn admitted(
        &self,
        run: &ObjectRef<SandboxRun>,
        uid: &str,
        sandbox: Sandbox<'_>,
        now: Timestamp,
    ) {
        {
            let mut queues = self.queues.lock().expect("not poisoned");
            let queue = queues.entry(namespace_of(run)).or_default();
            match sandbox {
                Sandbox::Claimed => {
                    // Its Pod was counted long ago, but its pool starts a replacement, which
                    // takes room in the quota: the claim counts in its stead until the pool
                    // creates it ([`Self::pool_pod_creating`]).
                    queue.asked.remove(uid);
                    queue.asked.remove(&may_claim_key(uid));
                    queue.forget_old_pool_pods(now);
                    queue.asked.insert(refill_key(uid), Asked::new(now));
                    queue.warm.insert(uid.to_owned());
                }
                Sandbox::Created(pod) => {
                    queue.unplaced.insert(uid.to_owned());
                    // Not a claim: no replacement to come.
                    queue.asked.remove(&may_claim_key(uid));
                    // Counted against the room until a room counts its Pod, however the run
                    // came to ask (on its own, or as the queue's head).
                    queue
                        .asked
                        .entry(uid.to_owned())
                        .or_insert_with(|| Asked::new(now))
                        .pod = Some((pod.to_owned(), now));
                }
            }
        }
        self.leave(run, uid, true, now);
    }

    /// Run `uid` ended (a sandbox it held is freed, or it never got one): it leaves the queue,
    /// and the head is woken to ask again.
    pub fn ended(&self, run: &ObjectRef<SandboxRun>, uid: &str, now: Timestamp) {
        self.leave(run, uid, false, now);
    }

    /// Where the sandbox Pod of run `uid` stands with the scheduler (its reconcile looks at the
    /// Pod every time). Once no Pod is unschedulable, the head is woken.
    pub fn scheduling(
        &self,
        run: &ObjectRef<SandboxRun>,
        uid: &str,
        placement: Placement,
        now: Timestamp,
    ) {
        let mut queues = self.queues.lock().expect("not poisoned");
        let queue = queues.entry(namespace_of(run)).or_default();
        match placement {
            Placement::Waiting => {}
            Placement::Unschedulable => {
                queue.unschedulable.insert(uid.to_owned());
                queue.saw_room_full(now);
            }
            Placement::Placed => {
                if queue.unplaced.remove(uid) {
                    // It holds a node from now: its hold is counted from here.
                    if let Some(since) = queue.holding.get_mut(uid) {
                        *since = now;
                    }
                }
                if queue.unschedulable.remove(uid) && queue.unschedulable.is_empty() {
                    queue.drop_gone(self.waits_at_most(), now);
                    queue.wake_head(&self.wake, now);
                }
            }
        }
    }

    fn enter(
        &self,
        queue: &mut Queue,
        run: &ObjectRef<SandboxRun>,
        uid: &str,
        agent: &str,
        since: Timestamp,
        now: Timestamp,
    ) {
        if queue.entries.is_empty() {
            queue.waiting_since = Some(now);
        }
        match queue.entries.get_mut(uid) {
            Some(entry) => entry.seen = now,
            None => queue.insert(
                uid,
                Entry {
                    run: run.clone(),
                    agent: agent.to_owned(),
                    since,
                    seen: now,
                },
            ),
        }
    }

    fn leave(&self, run: &ObjectRef<SandboxRun>, uid: &str, admitted: bool, now: Timestamp) {
        let mut queues = self.queues.lock().expect("not poisoned");
        let queue = queues.entry(namespace_of(run)).or_default();
        if admitted && queue.entries.contains_key(uid) {
            queue.admitted.push_back(now);
            while queue.admitted.len() > RATE_SAMPLES {
                queue.admitted.pop_front();
            }
            // Only while others still wait after it: the last runs out of a queue are let in
            // as fast as they come, not as fast as sandboxes free, and say nothing of the pace.
            if queue.entries.len() > 1
                && let Some(pace) = queue.admitted_rate(now)
            {
                queue.last_pace = Some((pace, now));
            }
        }
        queue.remove(uid, admitted);
        if !admitted {
            queue.unschedulable.remove(uid);
            queue.unplaced.remove(uid);
            queue.asked.remove(uid);
            // Leaving without a sandbox, it claimed none (a claim's replacement stays
            // counted until it is created, under [`refill_key`]).
            queue.asked.remove(&may_claim_key(uid));
        }
        if admitted {
            queue.holding.insert(uid.to_owned(), now);
        } else if let Some(since) = queue.holding.remove(uid)
            && !queue.warm.remove(uid)
        {
            let held = now.duration_since(since).as_secs_f64().max(0.0);
            queue.hold = Some(
                queue
                    .hold
                    .map_or(held, |h| h * (1.0 - HOLD_WEIGHT) + held * HOLD_WEIGHT),
            );
        }
        // A run that ended where this process did not see it (deleted, or ended by another
        // replica) holds nothing past the longest a run can hold a sandbox.
        queue
            .holding
            .retain(|_, since| now.duration_since(*since) < HELD_AT_MOST);
        let Queue {
            holding,
            unplaced,
            warm,
            ..
        } = &mut *queue;
        unplaced.retain(|uid| holding.contains_key(uid));
        warm.retain(|uid| holding.contains_key(uid));
        queue.drop_gone(self.waits_at_most(), now);
        queue.wake_head(&self.wake, now);
    }

    /// How many runs of `namespace` hold a sandbox no node has taken yet, as far as the queue
    /// knows (for tests of what tells it).
    #[cfg(test)]
    pub(crate) fn unplaced(&self, namespace: &str) -> usize {
        let queues = self.queues.lock().expect("not poisoned");
        queues.get(namespace).map_or(0, |q| q.unplaced.len())
    }

    /// The longest an accepted run waits: its last resort comes this long after it joined.
    fn waits_at_most(&self) -> SignedDuration {
        SignedDuration::try_from(self.allowance * LAST_RESORT_FACTOR).unwrap_or(SignedDuration::MAX)
    }
}

/// Whether `entry`'s run has not been reconciled for [`LAPSED_AFTER`].
fn lapsed(entry: &Entry, now: Timestamp) -> bool {
    now.duration_since(entry.seen) >= LAPSED_AFTER
}

/// The queue a run belongs to: its namespace's.
fn namespace_of(run: &ObjectRef<SandboxRun>) -> String {
    run.namespace.clone().unwrap_or_default()
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;

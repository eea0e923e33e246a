//! How many more sandbox Pods the ResourceQuotas of a namespace have room for, as a watch has
//! them: while nobody waits, only that many runs of a burst ask for a Pod of their own, and the
//! rest join the queue at once, judged there on arrival (`admission.rs`). Without it, every run
//! of a burst that found the queue empty asked, and most were refused by the quota at their
//! create: the cold path's status write, the refused create and only then their place or their
//! refusal, 1.4 to 3.1 s after they were decided on two saturated cores (the load suite,
//! 2026-12-05: 45 of its 60 refusals that took over 2 s).
//!
//! A hint, never the authority: the API server's quota check at the create is. The usage is
//! the larger of the quota's own (`status.used`) and that of the operator's Pods a second watch
//! has ([`Room::counted`]): a Pod the operator created that neither shows yet is counted by the
//! queue, which knows its name, until the Pods' watch has it. The time a quota was seen says
//! nothing of what it counts: under load the watch delivers a state up to a second old, and
//! a Pod created before a quota was seen but after the state it delivers went uncounted (the
//! load suite's opening burst, 2026-12-06: two runs of a hundred let ask for a sandbox the
//! quota did not have, refused 2.8 s after their call). A Pod that ended lately may still be
//! counted: the next run then joins the queue, whose head asks for a Pod at once and, given
//! one, wakes the next. A quota the watch cannot weigh (scoped, or not synced by the quota
//! controller yet) says nothing.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Pod, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use sandboxrun_core::quantity::{cpu_millis, memory_bytes};
use tracing::warn;

use crate::admission::Room;

/// Reads a quantity of one resource as a number.
type Parse = fn(&str) -> Option<u64>;

/// What one Pod counts against a quota, per resource a quota may bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    requests_cpu: u64,
    limits_cpu: u64,
    requests_memory: u64,
    limits_memory: u64,
    requests_storage: u64,
    limits_storage: u64,
}

impl Needs {
    /// What `pod` counts: its containers' requests and limits (the larger of their sum and any
    /// init container's, as the quota counts them), and its overhead if it has one.
    pub fn of(pod: &Pod) -> Self {
        let Some(spec) = pod.spec.as_ref() else {
            return Self::default();
        };
        let each = |c: &Container| {
            let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
            let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
            Self {
                requests_cpu: amount(requests, "cpu", cpu_millis),
                limits_cpu: amount(limits, "cpu", cpu_millis),
                requests_memory: amount(requests, "memory", memory_bytes),
                limits_memory: amount(limits, "memory", memory_bytes),
                requests_storage: amount(requests, "ephemeral-storage", memory_bytes),
                limits_storage: amount(limits, "ephemeral-storage", memory_bytes),
            }
        };
        let mut needs = spec
            .containers
            .iter()
            .map(each)
            .fold(Self::default(), |a, b| a.zip(b, u64::saturating_add));
        for init in spec.init_containers.iter().flatten() {
            needs = needs.zip(each(init), u64::max);
        }
        if let Some(overhead) = spec.overhead.as_ref() {
            let cpu = amount(Some(overhead), "cpu", cpu_millis);
            let memory = amount(Some(overhead), "memory", memory_bytes);
            needs.requests_cpu += cpu;
            needs.limits_cpu += cpu;
            needs.requests_memory += memory;
            needs.limits_memory += memory;
        }
        needs
    }

    fn zip(self, other: Self, f: fn(u64, u64) -> u64) -> Self {
        Self {
            requests_cpu: f(self.requests_cpu, other.requests_cpu),
            limits_cpu: f(self.limits_cpu, other.limits_cpu),
            requests_memory: f(self.requests_memory, other.requests_memory),
            limits_memory: f(self.limits_memory, other.limits_memory),
            requests_storage: f(self.requests_storage, other.requests_storage),
            limits_storage: f(self.limits_storage, other.limits_storage),
        }
    }

    /// How much of quota resource `name` one Pod takes, parsed with what parses its amounts;
    /// `None`: a resource these needs do not weigh (object counts other than Pods, extended
    /// resources, storage of claims), which the create alone checks.
    fn of_resource(&self, name: &str) -> Option<(u64, Parse)> {
        let count: Parse = memory_bytes;
        Some(match name {
            "pods" | "count/pods" => (1, count),
            "cpu" | "requests.cpu" => (self.requests_cpu, cpu_millis),
            "limits.cpu" => (self.limits_cpu, cpu_millis),
            "memory" | "requests.memory" => (self.requests_memory, memory_bytes),
            "limits.memory" => (self.limits_memory, memory_bytes),
            "ephemeral-storage" | "requests.ephemeral-storage" => {
                (self.requests_storage, memory_bytes)
            }
            "limits.ephemeral-storage" => (self.limits_storage, memory_bytes),
            _ => return None,
        })
    }
}

/// What the Pods a quota counts take of it together.
#[derive(Debug, Default)]
struct Usage {
    pods: u64,
    needs: Needs,
}

impl Usage {
    fn add(&mut self, pod: &Pod) {
        self.pods += 1;
        self.needs = self.needs.zip(Needs::of(pod), u64::saturating_add);
    }

    /// How much of quota resource `name` they take, in the unit [`Needs::of_resource`] parses.
    fn of_resource(&self, name: &str) -> Option<u64> {
        match name {
            "pods" | "count/pods" => Some(self.pods),
            _ => self.needs.of_resource(name).map(|(amount, _)| amount),
        }
    }
}

/// Whether a ResourceQuota counts `pod` at `now`, by Kubernetes' own rule (`QuotaV1Pod`): a
/// Pod that has not ended, unless it was deleted and its grace period has passed since the
/// time its deletion is due. A terminating gVisor sandbox may stay seconds past that: counted
/// until it was gone, such Pods held room the quota had already given back (the full load on
/// 7e76ba4 and fe57dee: Python in the mix 85 and 87 % of alone, 91 % before).
fn quota_counts(pod: &Pod, now: Timestamp) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return false;
    }
    let meta = &pod.metadata;
    match (&meta.deletion_timestamp, meta.deletion_grace_period_seconds) {
        (Some(due), Some(grace)) => due
            .0
            .checked_add(jiff::SignedDuration::from_secs(grace.max(0)))
            .is_ok_and(|end| now <= end),
        _ => true,
    }
}

/// Resource `name` of `amounts`, parsed with `parse`; 0 when absent or not understood.
fn amount(amounts: Option<&BTreeMap<String, Quantity>>, name: &str, parse: Parse) -> u64 {
    amounts
        .and_then(|m| m.get(name))
        .and_then(|q| parse(&q.0))
        .unwrap_or(0)
}

/// How many Pods of `needs` fit in what `quota` has left, its usage at least `pods`' (its own
/// may lag them); `None` when it cannot tell: a quota with scopes (it may not count these
/// Pods), or one the quota controller has not synced yet (no usage for a limit).
fn fits(quota: &ResourceQuota, needs: &Needs, pods: &Usage) -> Option<u64> {
    let spec = quota.spec.as_ref();
    if spec.is_some_and(|s| {
        s.scopes.as_ref().is_some_and(|s| !s.is_empty()) || s.scope_selector.is_some()
    }) {
        return None;
    }
    let status = quota.status.as_ref()?;
    let (hard, used) = (status.hard.as_ref()?, status.used.as_ref());
    let mut fit = u64::MAX;
    for (name, limit) in hard {
        let Some((need, parse)) = needs.of_resource(name) else {
            continue;
        };
        if need == 0 {
            continue;
        }
        let used = used?.get(name)?;
        let (limit, used) = (parse(&limit.0)?, parse(&used.0)?);
        let used = used.max(pods.of_resource(name).unwrap_or(0));
        fit = fit.min(limit.saturating_sub(used) / need);
    }
    Some(fit)
}

/// The namespaces' ResourceQuotas as a watch has them, and when it last told of a change; and
/// the operator's Pods, as another watch has them ([`watch_pods`]).
#[derive(Clone)]
pub struct QuotaRoom {
    quotas: Store<ResourceQuota>,
    pods: Store<Pod>,
    seen: Arc<Mutex<Option<Timestamp>>>,
}

impl Default for QuotaRoom {
    /// No watch: no room is ever known, and every run of an empty queue asks.
    fn default() -> Self {
        Self::new(reflector::store().0, reflector::store().0)
    }
}

impl QuotaRoom {
    /// The room in `quotas`, a store kept by [`QuotaRoom::watch`], beside the operator's `pods`,
    /// a store kept by [`watch_pods`] (or both by a test).
    pub fn new(quotas: Store<ResourceQuota>, pods: Store<Pod>) -> Self {
        Self {
            quotas,
            pods,
            seen: Arc::default(),
        }
    }

    /// The same, as last seen at `at` (for tests, which fill the store themselves).
    #[cfg(test)]
    pub fn seen_at(self, at: Timestamp) -> Self {
        *self.seen.lock().expect("not poisoned") = Some(at);
        self
    }

    /// How many Pods of `needs` the quotas of `namespace` have room for as last seen: the
    /// fewest any of them has room for, each counting at least the operator's Pods seen there
    /// (named in [`Room::counted`], read from one view of the store). `None`: nothing known (no
    /// watch yet, no quota there, or none the watch can weigh).
    pub fn room(&self, namespace: &str, needs: &Needs) -> Option<Room> {
        let seen = (*self.seen.lock().expect("not poisoned"))?;
        let mut usage = Usage::default();
        let mut counted = HashSet::new();
        let now = Timestamp::now();
        for pod in self.pods.state() {
            if pod.metadata.namespace.as_deref() == Some(namespace) && quota_counts(&pod, now) {
                usage.add(&pod);
                counted.insert(pod.name_any());
            }
        }
        let fit = self
            .quotas
            .state()
            .iter()
            .filter(|q| q.metadata.namespace.as_deref() == Some(namespace))
            .filter_map(|q| fits(q, needs, &usage))
            .min()?;
        Some(Room {
            sandboxes: u32::try_from(fit).unwrap_or(u32::MAX),
            seen,
            counted: Arc::new(counted),
            warm: 0,
        })
    }

    /// Keeps the store of `quotas` (one namespace's, or every one's) up to date until the
    /// operator stops, noting when each change was seen. An operator that may not watch them
    /// (an installation whose role lacks it) keeps retrying with backoff and knows no room.
    pub async fn watch(self, quotas: Api<ResourceQuota>, writer: Writer<ResourceQuota>) {
        let seen = self.seen.clone();
        watcher(quotas, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .for_each(|event| {
                match event {
                    Ok(_) => *seen.lock().expect("not poisoned") = Some(Timestamp::now()),
                    // Retried with backoff; until it works, runs ask as if no quota were known.
                    Err(e) => warn!(error = %e, "cannot watch the sandbox namespace's ResourceQuotas (list and watch resourcequotas): a burst's runs beyond the quota's room are judged only after the quota refuses their Pods"),
                }
                async {}
            })
            .await;
    }
}

/// Keeps `writer`'s store of the operator's Pods (`pods`, selected by the operator's label) up
/// to date until the operator stops, without their managed fields (a Pod is weighed by its
/// spec and phase only). An operator that may not watch them knows none, and the quota's own
/// usage stands alone.
pub async fn watch_pods(pods: Api<Pod>, selector: String, writer: Writer<Pod>) {
    watcher(pods, watcher::Config::default().labels(&selector))
        .default_backoff()
        .modify(|pod| pod.managed_fields_mut().clear())
        .reflect(writer)
        .for_each(|event| {
            if let Err(e) = event {
                warn!(error = %e, "cannot watch the sandbox namespace's Pods (list and watch pods): a burst's runs are let ask by the quota's usage alone, which may lag its Pods");
            }
            async {}
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quota(hard: serde_json::Value, used: serde_json::Value) -> ResourceQuota {
        serde_json::from_value(json!({
            "metadata": {"name": "q", "namespace": "runs"},
            "spec": {"hard": hard},
            "status": {"hard": hard, "used": used},
        }))
        .unwrap()
    }

    fn sandbox(cpu: &str, memory: &str) -> Needs {
        let pod: Pod = serde_json::from_value(json!({
            "spec": {"containers": [{"name": "sandbox", "resources": {
                "requests": {"cpu": cpu, "memory": memory, "ephemeral-storage": "64Mi"},
                "limits": {"cpu": cpu, "memory": memory, "ephemeral-storage": "64Mi"},
            }}]}
        }))
        .unwrap();
        Needs::of(&pod)
    }

    /// The chart's quota, with what a burst leaves of it.
    fn chart_quota(used_cpu: &str, used_memory: &str, used_pods: &str) -> ResourceQuota {
        quota(
            json!({"pods": "20", "requests.cpu": "8", "limits.cpu": "8",
                   "requests.memory": "16Gi", "limits.memory": "16Gi",
                   "count/sandboxruns.sandboxrun.dev": "1k"}),
            json!({"pods": used_pods, "requests.cpu": used_cpu, "limits.cpu": used_cpu,
                   "requests.memory": used_memory, "limits.memory": used_memory,
                   "count/sandboxruns.sandboxrun.dev": "731"}),
        )
    }

    fn pod(name: &str, cpu: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "runs"},
            "spec": {"containers": [{"name": "sandbox", "resources": {
                "limits": {"cpu": cpu, "memory": "256Mi"},
            }}]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    /// Room as `fits` weighs it with no Pods of the operator's seen.
    fn fits_alone(quota: &ResourceQuota, needs: &Needs) -> Option<u64> {
        fits(quota, needs, &Usage::default())
    }

    #[test]
    fn the_room_is_the_scarcest_resource_left_over_one_pods_needs() {
        let needs = sandbox("500m", "256Mi");
        // Nothing used: 16 by cpu, 20 by the Pod count, 64 by memory.
        assert_eq!(fits_alone(&chart_quota("0", "0", "0"), &needs), Some(16));
        // Two pool sandboxes and eleven runs: 1.5 cores left.
        assert_eq!(
            fits_alone(&chart_quota("6500m", "3328Mi", "13"), &needs),
            Some(3)
        );
        // Full, and over (a quota lowered below what runs).
        assert_eq!(fits_alone(&chart_quota("8", "4Gi", "16"), &needs), Some(0));
        assert_eq!(fits_alone(&chart_quota("9", "4Gi", "18"), &needs), Some(0));
        // Memory the scarcer: 1Gi sandboxes, 15.5Gi used.
        let big = sandbox("500m", "1Gi");
        assert_eq!(fits_alone(&chart_quota("1", "15872Mi", "2"), &big), Some(0));
        assert_eq!(fits_alone(&chart_quota("1", "14Gi", "2"), &big), Some(2));
    }

    #[test]
    fn a_quota_that_cannot_be_weighed_says_nothing() {
        let needs = sandbox("500m", "256Mi");
        // Not synced yet: a limit without a usage.
        let unsynced = quota(
            json!({"pods": "20", "limits.cpu": "8"}),
            json!({"pods": "0"}),
        );
        assert_eq!(fits_alone(&unsynced, &needs), None);
        let mut no_status = chart_quota("0", "0", "0");
        no_status.status = None;
        assert_eq!(fits_alone(&no_status, &needs), None);
        // Scoped: it may not count these Pods at all.
        let mut scoped = chart_quota("8", "0", "0");
        scoped.spec.as_mut().unwrap().scopes = Some(vec!["BestEffort".into()]);
        assert_eq!(fits_alone(&scoped, &needs), None);
        // Only resources it does not weigh: no bound from it.
        let counts = quota(
            json!({"count/sandboxruns.sandboxrun.dev": "1k", "services": "2"}),
            json!({"count/sandboxruns.sandboxrun.dev": "1k", "services": "2"}),
        );
        assert_eq!(fits_alone(&counts, &needs), Some(u64::MAX));
    }

    #[test]
    fn a_pod_needs_its_containers_and_its_overhead() {
        let pod: Pod = serde_json::from_value(json!({
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"limits": {"cpu": "500m", "memory": "256Mi"},
                                                "requests": {"cpu": "50m"}}},
                    {"name": "b", "resources": {"limits": {"cpu": "250m"}}},
                ],
                "initContainers": [{"name": "i", "resources": {"limits": {"cpu": "1"}}}],
                "overhead": {"cpu": "100m", "memory": "20Mi"},
            }
        }))
        .unwrap();
        let needs = Needs::of(&pod);
        assert_eq!(
            needs.limits_cpu, 1100,
            "the init container's, and the overhead"
        );
        assert_eq!(needs.requests_cpu, 150);
        assert_eq!(needs.limits_memory, (256 + 20) << 20);
        assert_eq!(needs.requests_memory, 20 << 20);
    }

    #[test]
    fn the_room_of_a_namespace_is_its_scarcest_quota_once_seen() {
        let (store, mut writer) = reflector::store();
        let needs = sandbox("500m", "256Mi");
        let room = QuotaRoom::new(store, reflector::store().0);
        writer.apply_watcher_event(&watcher::Event::Apply(chart_quota("6500m", "0", "3")));
        assert_eq!(room.room("runs", &needs), None, "never seen: not known");
        let at = Timestamp::from_second(1_000).unwrap();
        let room = room.seen_at(at);
        assert_eq!(
            room.room("runs", &needs),
            Some(Room {
                sandboxes: 3,
                seen: at,
                counted: Arc::default(),
                warm: 0,
            })
        );
        let mut pods = quota(json!({"pods": "5"}), json!({"pods": "4"}));
        pods.metadata.name = Some("pods".into());
        writer.apply_watcher_event(&watcher::Event::Apply(pods));
        assert_eq!(room.room("runs", &needs).map(|r| r.sandboxes), Some(1));
        assert_eq!(room.room("elsewhere", &needs), None);
    }

    #[test]
    fn the_operators_pods_count_where_the_quotas_usage_lags_them() {
        let (quotas, mut quota_writer) = reflector::store();
        let (pods, mut pod_writer) = reflector::store();
        let needs = sandbox("500m", "256Mi");
        let room = QuotaRoom::new(quotas, pods).seen_at(Timestamp::from_second(1_000).unwrap());
        // The quota as a lagging watch delivered it: 6.5 cores of 8 used, room for 3.
        quota_writer
            .apply_watcher_event(&watcher::Event::Apply(chart_quota("6500m", "3328Mi", "13")));
        let apply = |w: &mut Writer<Pod>, p: Pod| w.apply_watcher_event(&watcher::Event::Apply(p));
        // Fourteen Pods of the operator's at 500m, one of them ended: 6.5 cores, no more room
        // than the quota says, and the names of those counted.
        for i in 0..13 {
            apply(&mut pod_writer, pod(&format!("p{i}"), "500m", "Running"));
        }
        apply(&mut pod_writer, pod("done", "500m", "Succeeded"));
        let seen = room.room("runs", &needs).unwrap();
        assert_eq!(seen.sandboxes, 3);
        assert_eq!(seen.counted.len(), 13);
        assert!(seen.counted.contains("p0") && !seen.counted.contains("done"));
        // Two more Pods the quota's usage does not count yet: they do.
        apply(&mut pod_writer, pod("p13", "500m", "Pending"));
        apply(&mut pod_writer, pod("p14", "500m", "Pending"));
        let seen = room.room("runs", &needs).unwrap();
        assert_eq!(seen.sandboxes, 1);
        assert!(seen.counted.contains("p14"));
        // A quota whose usage is ahead of the Pods seen (they have not shown yet): its own.
        quota_writer.apply_watcher_event(&watcher::Event::Apply(chart_quota("8", "4Gi", "16")));
        assert_eq!(room.room("runs", &needs).unwrap().sandboxes, 0);
        // Pods elsewhere count nowhere else.
        assert_eq!(room.room("elsewhere", &needs), None);
    }

    #[test]
    fn a_pod_counts_as_the_quota_counts_it() {
        let now = Timestamp::from_second(1_000).unwrap();
        let deleted = |due: i64, grace: i64| {
            let mut p = pod("p", "500m", "Running");
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    Timestamp::from_second(due).unwrap(),
                ));
            p.metadata.deletion_grace_period_seconds = Some(grace);
            p
        };
        assert!(quota_counts(&pod("p", "500m", "Pending"), now));
        assert!(quota_counts(&pod("p", "500m", "Running"), now));
        assert!(!quota_counts(&pod("p", "500m", "Succeeded"), now));
        assert!(!quota_counts(&pod("p", "500m", "Failed"), now));
        // Deleted with a grace of 1 s, due at 999: counted until 1000, not after.
        assert!(quota_counts(&deleted(999, 1), now));
        assert!(!quota_counts(&deleted(998, 1), now));
        assert!(quota_counts(&deleted(1_001, 1), now));
    }
}

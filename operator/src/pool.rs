//! The warm pools: each `SandboxPool` is kept at `spec.replicas` idle, started sandbox Pods of
//! its profile, whose runner waits for one program on stdin. A python run whose limits fit a
//! pool claims one of them (`python/warm.rs`): the claim moves the Pod out of the pool (its
//! labels and owner become the run's), so the pool never sees it again and starts a new one. An
//! idle Pod is replaced when it is older than `maxIdleSeconds`, when the profile changes, and
//! when it stopped for any reason; a claimed Pod is never given back.
//!
//! [`sort`] and [`plan`] are pure (what the pool holds, what to create and delete); [`reconcile`]
//! does the API calls between them and records the status with server-side apply.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use sandboxrun_api::{CONDITION_READY, SandboxPool, SandboxPoolStatus};
use sandboxrun_core::limits::MAX_TIMEOUT_SECONDS;
use serde_json::json;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::outcome::set_condition;
use crate::pool_scale;
use crate::python::pod::{
    self, ACTIVE_DEADLINE_GRACE_SECONDS, LABEL_MANAGED_BY, LABEL_TOOL, MANAGER, SandboxConfig,
};

/// Label of an idle sandbox: the pool it belongs to (removed when a run claims it).
pub const LABEL_POOL: &str = "sandboxrun.dev/pool";
/// Annotation of a claimed sandbox: the name of the pool it came from (kept for the run's whole
/// life; an annotation, not a label, because a pool's name may be longer than a label value).
pub const FROM_POOL_ANNOTATION: &str = "sandboxrun.dev/from-pool";
/// Label of a pool's sandbox: the hash of the profile it was started with.
pub const LABEL_PROFILE: &str = "sandboxrun.dev/profile";
/// Field manager of the pool status.
const FIELD_MANAGER: &str = "sandboxrun-operator";
/// How often a pool is looked at without any change (to replace sandboxes past their age).
const RESYNC: Duration = Duration::from_secs(30);
/// Most sandboxes one reconcile starts: a large scale-up fills over a few reconciles instead of
/// sending a burst of creates that the quota may refuse anyway.
const MAX_CREATES_PER_RECONCILE: usize = 10;

/// What the pool controller works with (a part of the run controller's context: the same client,
/// sandbox settings, metrics and claim counts).
pub struct PoolContext {
    /// Kubernetes client.
    pub client: kube::Client,
    /// The operator's sandbox settings (a pool's own override them).
    pub sandbox: SandboxConfig,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Claims the run controller made and the pools' status does not count yet.
    pub claims: Claims,
    /// When runs wanted a sandbox of each pool (`pool_scale.rs`): the size of those that follow
    /// demand.
    pub demand: crate::pool_scale::Demand,
    /// Streams opened to the ready sandboxes, for their claims (`pool_streams.rs`).
    pub held: crate::pool_streams::HeldStreams,
    /// The runs' queues: a pool's Pod takes room in the namespace's quota as a run's does.
    pub admission: Arc<crate::admission::Admission>,
    /// The runner's ConfigMap of each namespace, made before its first sandbox Pod
    /// (`runner_files.rs`).
    pub runner_files: Arc<crate::runner_files::RunnerFiles>,
    /// The Pods the run controller claimed lately, and those it is claiming: their leaving the
    /// pool's watch is no change for the pool to look at until their hand-over is done ([`run`]).
    pub claimed: ClaimedPods,
    /// See `claimed`.
    pub claiming: ClaimsInDoubt,
}

/// A claim whose answer never came: the request timed out, its connection broke, or the
/// reconcile that sent it was cut short by its budget. The API server may still apply it (it
/// applies a request its client gave up on), so until it is settled on the Pod itself the run
/// takes no other sandbox and no cold Pod (`python/warm.rs`, `Reconcile::settle_claim_in_doubt`).
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimInDoubt {
    /// The Pod the claim was for.
    pub pod: String,
    /// Its pool.
    pub pool: String,
    /// The Pod's resourceVersion the claim was conditional on.
    pub resource_version: Option<String>,
}

/// This operator's claims in doubt, by run uid. In memory: a claim sent by an operator that has
/// since died is found by `Reconcile::earlier_claim` (`python/warm.rs`) once it commits; the window in which a dead
/// operator's request is still applied is the API server's own handling time. Shared with the
/// pool controller (see [`run`]).
#[derive(Clone, Debug, Default)]
pub struct ClaimsInDoubt(Arc<std::sync::Mutex<std::collections::HashMap<String, ClaimInDoubt>>>);

impl ClaimsInDoubt {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, ClaimInDoubt>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a run of this operator is claiming `pod` now (its claim's answer not in yet, or
    /// in doubt).
    pub fn claiming(&self, pod: &str) -> bool {
        self.lock().values().any(|doubt| doubt.pod == pod)
    }

    /// The run's claim in doubt, if it has one.
    pub fn get(&self, run_uid: &str) -> Option<ClaimInDoubt> {
        self.lock().get(run_uid).cloned()
    }

    /// Marks the run's claim of `doubt.pod` as in doubt until its answer comes, unless another
    /// run of this operator is claiming that Pod now (its answer not in yet, or in doubt):
    /// `false` then, and the run tries another. Runs that arrive together (a burst) then each
    /// claim a sandbox of their own instead of racing for one and losing a round trip per loss;
    /// the claim's resourceVersion precondition stays what makes it single.
    pub fn try_insert(&self, run_uid: &str, doubt: ClaimInDoubt) -> bool {
        let mut claims = self.lock();
        if claims
            .iter()
            .any(|(uid, other)| uid != run_uid && other.pod == doubt.pod)
        {
            return false;
        }
        claims.insert(run_uid.to_owned(), doubt);
        true
    }

    /// Forgets the run's claim in doubt (settled, or the run took up its sandbox otherwise).
    pub fn remove(&self, run_uid: &str) {
        self.lock().remove(run_uid);
    }
}

/// Pods this operator claimed lately, by name, with when and for which run. The idle Pods a
/// claim picks from come from a watch, which under load shows a Pod as idle for a while after
/// another run of this operator claimed it: a claim of it then only loses (its resourceVersion
/// moved on), a round trip each. In a burst of ten one run lost five in a row (1.2 s) before
/// this; a Pod named here is no longer a candidate. A sandbox is single-use, so a claimed Pod
/// never becomes idle again; its name is kept for [`ClaimedPods::KEPT`], long past any watch's
/// lag. Shared with the pool controller, whose watch of idle Pods sees each claim as the Pod's
/// deletion. The run is kept for a claim made before its run's decision was recorded (the two
/// go out in one write): a run decided again after that write failed takes up its sandbox
/// (`python/warm.rs`, `Reconcile::unrecorded_claim`).
#[derive(Clone, Debug, Default)]
pub struct ClaimedPods(Arc<Mutex<HashMap<String, (std::time::Instant, String)>>>);

impl ClaimedPods {
    /// How long a claimed Pod's name is kept.
    const KEPT: Duration = Duration::from_secs(60);

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (std::time::Instant, String)>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `pod` was claimed just now for the run `run_uid` (names older than
    /// [`ClaimedPods::KEPT`] are forgotten).
    pub fn add(&self, pod: &str, run_uid: &str) {
        let now = std::time::Instant::now();
        let mut claimed = self.lock();
        claimed.retain(|_, (at, _)| now.duration_since(*at) < Self::KEPT);
        claimed.insert(pod.to_owned(), (now, run_uid.to_owned()));
    }

    /// Whether this operator claimed `pod` lately.
    pub fn contains(&self, pod: &str) -> bool {
        self.lock()
            .get(pod)
            .is_some_and(|(at, _)| at.elapsed() < Self::KEPT)
    }

    /// The Pods this operator claimed lately for the run `run_uid`.
    pub fn of_run(&self, run_uid: &str) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, (at, run))| run == run_uid && at.elapsed() < Self::KEPT)
            .map(|(pod, _)| pod.clone())
            .collect()
    }
}

/// Claims counted since a pool's status was last written, by pool (`namespace/name`); the
/// pool's reconcile adds them to `status.claimedTotal`.
#[derive(Clone, Debug, Default)]
pub struct Claims(Arc<Mutex<HashMap<String, i64>>>);

impl Claims {
    /// Counts one claim from `pool`.
    pub fn add(&self, pool: &str) {
        *self
            .0
            .lock()
            .expect("not poisoned")
            .entry(pool.to_owned())
            .or_default() += 1;
    }

    fn take(&self, pool: &str) -> i64 {
        self.0
            .lock()
            .expect("not poisoned")
            .remove(pool)
            .unwrap_or_default()
    }

    fn give_back(&self, pool: &str, n: i64) {
        if n > 0 {
            *self
                .0
                .lock()
                .expect("not poisoned")
                .entry(pool.to_owned())
                .or_default() += n;
        }
    }
}

/// The sandbox settings of `pool`: its own where it sets them, else the operator's (the image of
/// the pool's profile; empty when the operator has none, which no Pod can start with).
pub fn sandbox_config(pool: &SandboxPool, operator: &SandboxConfig) -> SandboxConfig {
    SandboxConfig {
        runtime_class: pool
            .spec
            .runtime_class_name
            .clone()
            .unwrap_or_else(|| operator.runtime_class.clone()),
        image: pool.spec.image.clone().unwrap_or_else(|| {
            operator
                .image_for(pool.spec.profile)
                .unwrap_or_default()
                .to_owned()
        }),
        data_image: operator.data_image.clone(),
        tmp_size: pool
            .spec
            .tmp_size
            .clone()
            .unwrap_or_else(|| operator.tmp_size.clone()),
        // Proven at the sandbox's own start (not part of its profile: a sandbox that proved its
        // barrier needs no new proof when the operator moves).
        canary: operator.canary.clone(),
    }
}

/// The hash of what a pool's sandboxes are started with: a sandbox with another hash is of an
/// older profile and is replaced.
pub fn profile_hash(pool: &SandboxPool, operator: &SandboxConfig) -> String {
    let config = sandbox_config(pool, operator);
    let limits = pool.spec.sandbox_limits();
    pod::short_hash(&format!(
        "{}|{}|{}|{}|{}|{}|{}|{}|{}",
        config.runtime_class,
        config.image,
        // What the runner imports while it idles (a change replaces the idle sandboxes).
        pool.spec.profile.preloaded_modules().join(","),
        config.tmp_size,
        limits.cpu,
        limits.memory,
        limits.pids,
        pool.spec.max_idle_seconds,
        pool.spec.cpu_request
    ))
}

/// Whether a run may take a sandbox of `pool` at all: the pool starts sandboxes exactly as the
/// operator would start the run's own of the pool's profile (runtime class, image, /tmp), so a
/// warm run is isolated as a cold one would be.
pub fn same_isolation(pool: &SandboxPool, operator: &SandboxConfig) -> bool {
    let config = sandbox_config(pool, operator);
    config.runtime_class == operator.runtime_class
        && operator.image_for(pool.spec.profile) == Some(config.image.as_str())
        && config.tmp_size == operator.tmp_size
}

/// An idle sandbox Pod of `pool`, not yet created (the API server names it).
pub fn build(pool: &SandboxPool, operator: &SandboxConfig) -> Option<Pod> {
    let name = pool.metadata.name.clone()?;
    let owner = OwnerReference {
        api_version: SandboxPool::api_version(&()).into_owned(),
        kind: SandboxPool::kind(&()).into_owned(),
        name: name.clone(),
        uid: pool.metadata.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: None,
    };
    let limits = pool.spec.sandbox_limits();
    let prefix: String = name.chars().take(40).collect();
    let metadata = ObjectMeta {
        generate_name: Some(format!("{}-", prefix.trim_end_matches(['-', '.']))),
        namespace: pool.namespace(),
        labels: Some(
            [
                (LABEL_MANAGED_BY, MANAGER.to_owned()),
                (LABEL_POOL, pod::label_value(&name)),
                (LABEL_PROFILE, profile_hash(pool, operator)),
                (
                    LABEL_TOOL,
                    sandboxrun_core::Tool::Python.as_str().to_owned(),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        ),
        annotations: Some(pod::limits_annotation(&limits)),
        owner_references: Some(vec![owner]),
        ..Default::default()
    };
    // Idle at most maxIdleSeconds, then one run of the longest timeout: a hard bound even if
    // the operator is gone. A claim shortens it to the run's own deadline.
    let deadline = i64::from(pool.spec.max_idle_seconds)
        + i64::from(MAX_TIMEOUT_SECONDS + ACTIVE_DEADLINE_GRACE_SECONDS);
    let mut idle = pod::sandbox_pod(
        metadata,
        &sandbox_config(pool, operator),
        pool.spec.profile,
        &limits,
        deadline,
        &pool.spec.cpu_request,
    );
    if !pool.spec.profile.preloaded_modules().is_empty() {
        let containers = idle.spec.as_mut().map(|s| s.containers.iter_mut());
        for container in containers.into_iter().flatten() {
            container.startup_probe = Some(pod::idle_probe(deadline));
        }
    }
    Some(idle)
}

/// What a pool holds, from a fresh list of its Pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sorted {
    /// Started: the runner waits for a program. Oldest first (claimed first).
    pub ready: Vec<String>,
    /// Not started yet.
    pub starting: Vec<String>,
    /// To delete, with why: another profile, too old, or stopped.
    pub doomed: Vec<(String, String)>,
}

/// Whether `pod`'s sandbox is ready: running, with nothing left to do before its program (with
/// a preload, its startup probe saw the imports done: [`pod::idle_probe`]).
pub fn is_ready(pod: &Pod) -> bool {
    is_running(pod) && pod::sandbox_container(pod).is_some_and(|c| c.started == Some(true))
}

/// Whether `pod`'s sandbox can take a program: its runner runs and reads stdin (a preloading one
/// may still be importing: the program is read beside the imports).
pub fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && pod::sandbox_container(pod).is_some_and(|c| {
            c.state.as_ref().is_some_and(|s| s.running.is_some()) && c.restart_count == 0
        })
}

/// Sorts a pool's Pods: ready, starting, or to be deleted. Pods being deleted count as gone.
pub fn sort(pods: &[Pod], profile: &str, max_idle_seconds: u32, now: Timestamp) -> Sorted {
    let mut sorted = Sorted::default();
    let mut ready: Vec<(Timestamp, String)> = Vec::new();
    for p in pods {
        let Some(name) = p.metadata.name.clone() else {
            continue;
        };
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let created = p.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        let terminated = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()));
        let too_old = created
            .checked_add(SignedDuration::from_secs(i64::from(max_idle_seconds)))
            .is_ok_and(|end| now >= end);
        let why = if p.labels().get(LABEL_PROFILE).map(String::as_str) != Some(profile) {
            Some("its profile changed")
        } else if matches!(phase, Some("Failed" | "Succeeded")) || terminated {
            Some("it stopped while idle")
        } else if too_old {
            Some("it was idle for maxIdleSeconds")
        } else {
            None
        };
        match why {
            Some(why) => sorted.doomed.push((name, why.to_owned())),
            None if is_ready(p) => ready.push((created, name)),
            None => sorted.starting.push(name),
        }
    }
    ready.sort();
    sorted.ready = ready.into_iter().map(|(_, n)| n).collect();
    sorted
}

/// What to change so the pool holds `replicas` idle sandboxes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// How many sandboxes to start.
    pub create: usize,
    /// Which to delete (doomed ones, then the surplus: starting ones first, then the newest
    /// ready ones).
    pub delete: Vec<String>,
}

/// The changes that bring `sorted` to `replicas`.
pub fn plan(sorted: &Sorted, replicas: i32) -> Plan {
    let want = usize::try_from(replicas.max(0)).unwrap_or(0);
    let mut delete: Vec<String> = sorted.doomed.iter().map(|(n, _)| n.clone()).collect();
    let have = sorted.ready.len() + sorted.starting.len();
    let mut surplus = have.saturating_sub(want);
    for name in sorted
        .starting
        .iter()
        .rev()
        .chain(sorted.ready.iter().rev())
    {
        if surplus == 0 {
            break;
        }
        delete.push(name.clone());
        surplus -= 1;
    }
    Plan {
        create: want.saturating_sub(have).min(MAX_CREATES_PER_RECONCILE),
        delete,
    }
}

/// Why a pool's reconciliation failed (retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The pool has no namespace, name or uid.
    #[error("the pool has no namespace, name or uid")]
    Unidentified,
}

/// The key of a pool in [`Claims`] and metrics.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// One reconciliation of a pool: list its Pods, delete what must go, start what is missing,
/// record the status.
pub async fn reconcile(pool: Arc<SandboxPool>, ctx: Arc<PoolContext>) -> Result<Action, Error> {
    let (Some(ns), Some(name)) = (pool.namespace(), pool.metadata.name.clone()) else {
        return Err(Error::Unidentified);
    };
    if pool.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the idle Pods through their ownerReference.
        return Ok(Action::await_change());
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let selector = format!("{LABEL_POOL}={}", pod::label_value(&name));
    // From the API server, not a cache: a Pod created a moment ago must count, or every
    // reconcile would start another.
    let listed = pods.list(&ListParams::default().labels(&selector)).await?;
    let profile = profile_hash(&pool, &ctx.sandbox);
    let now = Timestamp::now();
    let sorted = sort(&listed.items, &profile, pool.spec.max_idle_seconds, now);
    let pool_key = key(&ns, &name);
    let pool_ref = ObjectRef::from_obj(pool.as_ref());
    // The version the status write is conditional on: the one read, or the one our own scale
    // write made (its claim count is still the one read).
    let mut read_at = pool.metadata.resource_version.clone();
    let (replicas, scale_reason) = match pool_scale::Bounds::of(&pool) {
        Some(bounds) => {
            let ready: Vec<&Pod> = listed
                .items
                .iter()
                .filter(|p| {
                    p.metadata
                        .name
                        .as_ref()
                        .is_some_and(|n| sorted.ready.contains(n))
                })
                .collect();
            let start = pool_scale::start_time(&ready);
            let peak = ctx
                .demand
                .peak(&pool_ref, start, bounds.scale_down_delay, now);
            let size = pool_scale::desired(bounds, peak);
            if size != pool.spec.replicas {
                info!(pool = %name, from = pool.spec.replicas, to = size, peak, "sizing the pool to its demand");
                // Through the scale subresource, as an autoscaler would.
                let api: Api<SandboxPool> = Api::namespaced(ctx.client.clone(), &ns);
                let scale = json!({ "spec": { "replicas": size } });
                let scaled = api
                    .patch_scale(&name, &PatchParams::default(), &Patch::Merge(&scale))
                    .await?;
                read_at = scaled.metadata.resource_version;
            }
            (size, Some(pool_scale::reason(bounds, peak, start, size)))
        }
        None => (pool.spec.replicas, None),
    };
    let plan = plan(&sorted, replicas);
    for (doomed, why) in &sorted.doomed {
        info!(pool = %name, pod = %doomed, why = %why, "replacing an idle sandbox");
    }
    for victim in &plan.delete {
        match pods.delete(victim, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut refill_error = None;
    let mut created = 0;
    // A replacement waits for the hand-over of the claims it replaces (pool_scale's module doc).
    let hold = (plan.create > 0)
        .then(|| ctx.demand.refill_hold(&pool_ref, Timestamp::now()))
        .flatten();
    if plan.create > 0 && hold.is_none() {
        ctx.demand.refilled(&pool_ref);
        let Some(desired) = build(&pool, &ctx.sandbox) else {
            return Err(Error::Unidentified);
        };
        // Refused (RBAC without ConfigMaps, an admission policy): no sandbox is started, and
        // the status says why, as for a refused Pod; tried again at the next resync.
        let to_create = match ctx.runner_files.ensure(&ns).await {
            Ok(()) => plan.create,
            Err(kube::Error::Api(e)) => {
                warn!(pool = %name, error = %e.message, "cannot make the sandboxes' runner ConfigMap");
                refill_error = Some(crate::runner_files::refused(&e.message));
                0
            }
            Err(e) => return Err(e.into()),
        };
        for _ in 0..to_create {
            let counted = ctx.admission.pool_pod_creating(&ns, Timestamp::now());
            let result = pods.create(&PostParams::default(), &desired).await;
            let pod = result.as_ref().ok().map(ResourceExt::name_any);
            ctx.admission
                .pool_pod_created(&ns, counted, pod.as_deref(), Timestamp::now());
            match result {
                Ok(_) => created += 1,
                // Refused (quota, admission, an unknown RuntimeClass): say why in the status
                // and try again at the next resync, not in a tight loop.
                Err(kube::Error::Api(e)) => {
                    warn!(pool = %name, error = %e.message, "cannot start a warm sandbox");
                    refill_error = Some(e.message);
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    let deleted_live = plan
        .delete
        .iter()
        .filter(|n| sorted.ready.contains(n) || sorted.starting.contains(n))
        .count();
    let ready = sorted
        .ready
        .iter()
        .filter(|n| !plan.delete.contains(n))
        .count();
    // Each ready sandbox that stays gets its program's stream opened now, off the claim's path.
    for idle in sorted.ready.iter().filter(|n| !plan.delete.contains(n)) {
        ctx.held.hold_sandbox(&pods, &ns, idle);
    }
    let idle = sorted.ready.len() + sorted.starting.len() - deleted_live + created;
    let starting = idle - ready;
    ctx.metrics.set_pool_ready(&pool_key, ready);

    let prev = pool.status.clone().unwrap_or_default();
    let claimed = ctx.claims.take(&pool_key);
    let mut status = SandboxPoolStatus {
        replicas: i32::try_from(idle).unwrap_or(i32::MAX),
        ready_replicas: i32::try_from(ready).unwrap_or(i32::MAX),
        starting_replicas: i32::try_from(starting).unwrap_or(i32::MAX),
        claimed_total: prev.claimed_total + claimed,
        selector: Some(selector),
        scale_reason,
        last_refill_error: refill_error.clone().or_else(|| {
            // Kept until a sandbox could be added again.
            (created == 0 && plan.create > 0)
                .then(|| prev.last_refill_error.clone())
                .flatten()
        }),
        observed_generation: pool.metadata.generation,
        conditions: prev.conditions.clone(),
    };
    let want = replicas.max(0);
    let (is_ready, reason, message) = if want == 0 {
        (
            true,
            "Off",
            "replicas is 0: no warm sandboxes are kept".to_owned(),
        )
    } else if status.ready_replicas >= want {
        (true, "Filled", format!("{want} ready sandboxes"))
    } else if let Some(e) = &status.last_refill_error {
        (
            false,
            "RefillFailed",
            format!("cannot start warm sandboxes: {e}"),
        )
    } else {
        (
            false,
            "Filling",
            format!("{} of {want} sandboxes ready", status.ready_replicas),
        )
    };
    set_condition(
        &mut status.conditions,
        CONDITION_READY,
        is_ready,
        reason,
        &message,
        pool.metadata.generation,
        now,
    );
    if status != prev {
        let api: Api<SandboxPool> = Api::namespaced(ctx.client.clone(), &ns);
        // Conditional on the version read: `claimedTotal` is a count added to what the cache
        // showed, and a cache that lags our own last write would otherwise write an older count
        // back (the warm-pool e2e test saw 0 after two claims).
        let patch = json!({
            "apiVersion": SandboxPool::api_version(&()),
            "kind": SandboxPool::kind(&()),
            "metadata": {"resourceVersion": read_at},
            "status": status,
        });
        match api
            .patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                // Changed since the cache's version: count again on the current one.
                ctx.claims.give_back(&pool_key, claimed);
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
            Err(e) => {
                ctx.claims.give_back(&pool_key, claimed);
                return Err(e.into());
            }
        }
    }
    // Starting sandboxes report through their Pods' watch; age is only seen by looking, and so
    // is a burst growing old enough for a pool that follows demand to shrink.
    let resync = match pool_scale::Bounds::of(&pool) {
        Some(bounds) => pool_scale::shrink_check(bounds, replicas, RESYNC),
        None => RESYNC,
    };
    Ok(Action::requeue(if let Some(hold) = hold {
        hold.min(resync)
    } else if refill_error.is_some() {
        Duration::from_secs(10).min(resync)
    } else {
        resync
    }))
}

fn error_policy(pool: Arc<SandboxPool>, error: &Error, _ctx: Arc<PoolContext>) -> Action {
    warn!(pool = %pool.name_any(), error = %error, "pool reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Keeps `writer` (the store behind `Context::pools`) in step with the pools in `pools`, for as
/// long as the process runs: only the leader reconciles runs, but its store of pools must be
/// current the moment it becomes the leader. A pool deleted (or gone when the watch was
/// relisted) loses its `sandboxrun_pool_ready_sandboxes` series.
pub async fn mirror(
    pools: Api<SandboxPool>,
    writer: kube::runtime::reflector::store::Writer<SandboxPool>,
    metrics: Arc<Metrics>,
) {
    use kube::runtime::WatchStreamExt;
    let store = writer.as_reader();
    watcher(pools, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer)
        .for_each(|event| {
            if matches!(
                event,
                Ok(watcher::Event::Delete(_) | watcher::Event::InitDone)
            ) {
                let existing: std::collections::BTreeSet<String> = store
                    .state()
                    .iter()
                    .map(|p| key(&p.namespace().unwrap_or_default(), &p.name_any()))
                    .collect();
                metrics.retain_pools(|pool| existing.contains(pool));
            }
            async {}
        })
        .await;
}

/// Keeps `writer` (the store behind `Context::idle_pods`) filled with the pools' idle Pods (those
/// that carry a pool's label), for as long as the process runs: a run claims from it without a
/// list of its own (each idle Pod is tens of kilobytes, the runner's source in its argv, and a
/// burst of claims listed a pool of ten Pods once per run). A claim is conditional on the Pod's
/// resourceVersion, so a store a moment behind costs a conflict, never a second claim.
pub async fn mirror_idle_pods(
    pods: Api<Pod>,
    writer: kube::runtime::reflector::store::Writer<Pod>,
) {
    use kube::runtime::WatchStreamExt;
    watcher(pods, watcher::Config::default().labels(&idle_selector()))
        .default_backoff()
        .reflect(writer)
        .for_each(|_| async {})
        .await;
}

/// The selector of the pools' idle Pods: the operator's, with a pool's label.
fn idle_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGER},{LABEL_POOL}")
}

/// Runs the pool controller until `shutdown`: pools, and their idle Pods (by their owner). A
/// claimed Pod is no longer the pool's: the run that claimed it wakes the pool once the program's
/// hand-over is done (`pool_scale::Demand::handed_over`), so that the pool's list and
/// status write (and its refill, `Demand::refill_hold`) do not compete with the hand-over.
pub async fn run(
    ctx: Arc<PoolContext>,
    pools: Api<SandboxPool>,
    pods: Api<Pod>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    // Only its idle Pods: the runs' own Pods never concerned it. A claimed one leaves the
    // selector, which this watch gets as a deletion carrying the Pod as it was before the claim
    // (the API server sends the last state that matched), still owned by the pool: mapped to
    // the pool, it put the pool's list and status write beside every warm call's hand-over
    // (measured: the terminal status write 34 ms instead of about 8, e2e/BENCHMARKS.md). The
    // run wakes the pool after the hand-over instead.
    let pod_watch = watcher::Config::default().labels(&idle_selector());
    // A claim's answer and its watch event arrive in either order: a Pod is marked as being
    // claimed before the claim is sent, and as claimed before that mark goes.
    let (claimed, claiming) = (ctx.claimed.clone(), ctx.claiming.clone());
    Controller::new(pools, watcher::Config::default().any_semantic())
        .watches(pods, pod_watch, move |pod: Pod| {
            pool_woken_by(&pod, &claimed, &claiming)
        })
        // A run that found a pool empty (the pool grows now, not at its next resync), or that
        // claimed a sandbox of it (once the hand-over is done).
        .reconcile_on(ctx.demand.wakeups())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "pool reconcile error");
            }
        })
        .await;
}

/// The pool a change of its idle Pod `pod` wakes: its owner, unless the Pod is one this operator
/// claimed or is claiming (then the run wakes it once the hand-over is done).
fn pool_woken_by(
    pod: &Pod,
    claimed: &ClaimedPods,
    claiming: &ClaimsInDoubt,
) -> Option<ObjectRef<SandboxPool>> {
    let ns = pod.namespace()?;
    let name = pod.name_any();
    if claimed.contains(&name) || claiming.claiming(&name) {
        return None;
    }
    let pool = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == SandboxPool::kind(&()))
        .map(|o| o.name.clone())?;
    Some(ObjectRef::<SandboxPool>::new(&pool).within(&ns))
}

/// When a claimed sandbox was claimed, from its annotation.
pub fn claimed_at(pod: &Pod) -> Option<Timestamp> {
    pod.annotations()
        .get(CLAIMED_AT_ANNOTATION)
        .and_then(|t| t.parse().ok())
}

/// Annotation of a claimed sandbox: when its run claimed it (its run's deadline counts from
/// here, not from when the Pod started).
pub const CLAIMED_AT_ANNOTATION: &str = "sandboxrun.dev/claimed-at";

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;

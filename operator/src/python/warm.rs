//! The warm path of a python run: claim one idle sandbox of a pool that fits the run, hand it
//! the program, read the result from the same attach stream, end the run.
//!
//! Single use, whatever happens:
//! - A claim is one Pod patch with the Pod's resourceVersion as precondition: of two runs that
//!   race for a Pod, one patch commits and the other gets 409 Conflict and tries the next Pod
//!   (or goes cold). The patch moves the Pod out of its pool (the pool label goes, the owner
//!   becomes the run), so the pool never counts or hands it out again.
//! - The claimed Pod is recorded in the run's status before its program is sent; from then on
//!   the run's ordinary Pod state machine applies, and the Pod is deleted when the run ends.
//! - Its runner takes exactly one program (stdinOnce); the Pod is never returned to a pool.
//!
//! [`claim_patch`] and [`candidates`] are pure and unit-tested; the I/O is in the `Reconcile`
//! methods below.

use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use sandboxrun_api::{SandboxPath, SandboxPool, SandboxRun, SandboxRunStatus};
use sandboxrun_core::{FileCaps, Limits, Phase, Profile, Reason, Tool, parse_envelope};
use serde_json::{Value, json};
use tracing::info;

use super::feed;
use super::phase::{self, Exited, Progress};
use super::pod::{self, ACTIVE_DEADLINE_GRACE_SECONDS, SandboxConfig};
use crate::controller::{Error, Reconcile, until};
use crate::pool::{
    self, CLAIMED_AT_ANNOTATION, ClaimInDoubt, FROM_POOL_ANNOTATION, LABEL_POOL, LABEL_PROFILE,
    is_ready, is_running,
};
use crate::pool_streams;

/// Pods of one pool tried (one patch each) before the run goes cold: a conflict means another
/// claim took that Pod a moment ago. A Pod another run of this operator is claiming right then is
/// passed over without a try.
const CLAIM_ATTEMPTS: usize = 5;

/// How long the result is read over the stream before the run is recorded Running and left to
/// the kubelet's view: short programs end well within it, and a long one should show Running
/// (and not hold its reconcile) while it runs.
const INLINE_READ: Duration = Duration::from_secs(3);

/// A sandbox a run claimed.
#[derive(Clone, Debug, PartialEq)]
pub struct Claimed {
    /// The Pod.
    pub pod: String,
    /// The pool it came from.
    pub pool: String,
}

/// A claim found on the API server that the run's status does not name (see
/// `Reconcile::earlier_claim`).
pub struct EarlierClaim {
    /// The sandbox.
    pub claimed: Claimed,
    /// Its Pod as listed (its annotations hold the limits of the claim).
    pub object: Pod,
}

/// The pools whose sandboxes a run of `profile` may take with `limits`, in a stable order: in the
/// run's namespace, on, of the operator's own isolation, of the run's profile (its image), and
/// of the run's cpu, memory and pids.
pub fn candidates<'a>(
    pools: impl IntoIterator<Item = &'a SandboxPool>,
    run_namespace: &str,
    profile: Profile,
    limits: &Limits,
    operator: &SandboxConfig,
) -> Vec<String> {
    let mut names: Vec<String> = pools
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(run_namespace))
        // A pool that follows demand is a candidate at 0 too: a run that misses it grows it.
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && (p.spec.replicas > 0 || p.spec.max_replicas.is_some_and(|m| m > 0))
        })
        .filter(|p| pool::same_isolation(p, operator) && p.spec.fits(profile, limits))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    names
}

/// How many sandboxes `pool` may have to claim, as its last reconcile reported it: the ready
/// ones and, in a preloading pool, the starting ones (they may be importing: one of them is
/// still sooner than a sandbox of the run's own, which would have to start and import). `None`:
/// not reported on yet.
fn sandboxes(pool: &SandboxPool) -> Option<u32> {
    let status = pool.status.as_ref()?;
    let preloads = !pool.spec.profile.preloaded_modules().is_empty();
    let starting = if preloads {
        status.starting_replicas
    } else {
        0
    };
    Some(u32::try_from(status.ready_replicas.saturating_add(starting)).unwrap_or(0))
}

/// The patch that hands the idle sandbox `pod` of pool `pool` to `run`: conditional on the
/// resourceVersion the claimer saw, it takes the Pod out of the pool (labels, owner), records
/// the run's limits, its caps on returned files and the claim time, and shortens the Pod's
/// deadline to the run's own (the kubelet counts `activeDeadlineSeconds` from the Pod's start,
/// which may be long ago).
pub fn claim_patch(
    pod: &Pod,
    pool: &str,
    run: &SandboxRun,
    limits: &Limits,
    files: FileCaps,
    now: Timestamp,
) -> Option<Value> {
    let resource_version = pod.metadata.resource_version.clone()?;
    let owner = pod::owner_reference(run)?;
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map_or(now, |t| t.0);
    let idle = now.duration_since(started).as_secs().max(0);
    let deadline = idle + i64::from(limits.timeout_seconds + ACTIVE_DEADLINE_GRACE_SECONDS);
    let mut labels: serde_json::Map<String, Value> = pod::labels(run, Tool::Python)
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    labels.insert(LABEL_POOL.to_owned(), Value::Null);
    labels.insert(LABEL_PROFILE.to_owned(), Value::Null);
    let mut annotations: serde_json::Map<String, Value> = pod::limits_annotation(limits)
        .into_iter()
        .chain(pod::file_caps_annotation(files))
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    annotations.insert(CLAIMED_AT_ANNOTATION.to_owned(), json!(now.to_string()));
    annotations.insert(FROM_POOL_ANNOTATION.to_owned(), json!(pool));
    let mut patch = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner],
        },
    });
    // It may only be lowered; a Pod without one (not ours) is not claimed.
    let current = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds)?;
    if deadline < current {
        patch["spec"] = json!({ "activeDeadlineSeconds": deadline });
    }
    Some(patch)
}

/// The hand-over of a claimed sandbox, under way until dropped: then the pool is told
/// (`pool_scale::Demand::handed_over`), and refills once no other hand-over holds it.
struct HandingOver<'a> {
    demand: &'a crate::pool_scale::Demand,
    namespace: &'a str,
    pool: &'a str,
    run: String,
}

impl Drop for HandingOver<'_> {
    fn drop(&mut self) {
        self.demand
            .handed_over(self.namespace, self.pool, &self.run);
    }
}

impl Reconcile<'_> {
    /// The pools whose sandboxes the run may claim now (of its `profile`, for its `limits`), as
    /// the operator's watch has them: those not empty as of their last reconcile (a claim wakes
    /// a pool at once). An empty one is missed now, which grows a pool that follows demand;
    /// under load, runs that wait for room in the quota would otherwise list it every few
    /// seconds each. From the cache alone: a run with no pool to claim from goes cold with its
    /// decision and its path in one status write.
    pub(super) fn warm_pools(&self, profile: Profile, limits: &Limits) -> Vec<String> {
        let ctx = self.ctx;
        let uid = self.uid();
        let pools = ctx.pools.state();
        let names = candidates(
            pools.iter().map(|p| p.as_ref()),
            &self.ns,
            profile,
            limits,
            &ctx.sandbox,
        );
        names
            .into_iter()
            .filter(|name| {
                let Some(pool_obj) = pools
                    .iter()
                    .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
                else {
                    return false;
                };
                // A pool not reported on yet may have one.
                let empty = sandboxes(pool_obj) == Some(0);
                if empty {
                    ctx.metrics
                        .warm_claim_result(&pool::key(&self.ns, name), false);
                    ctx.pool_demand.missed(&self.ns, name, &uid, self.now);
                }
                !empty
            })
            .collect()
    }

    /// How many sandboxes the pools the run fits have to claim now, recording nothing: room for
    /// a run beside the quota's, as it needs no Pod of its own if it claims one. Counted as a
    /// claim would find them ([`Self::claimable`]): the idle Pods the watch has, less those this
    /// operator claimed since. A pool's status lags its claims by its next reconcile, and a
    /// count taken from it let the runs of a burst ask for the sandboxes just claimed a second
    /// time: the quota refused their Pods, and they were refused 2.2 s after their call instead
    /// of 1 (the load suite's opening burst, 2026-12-06: 4 of 100).
    pub(super) fn warm_sandboxes(&self, profile: Profile, limits: &Limits) -> u32 {
        let pools = self.ctx.pools.state();
        let names = candidates(
            pools.iter().map(|p| p.as_ref()),
            &self.ns,
            profile,
            limits,
            &self.ctx.sandbox,
        );
        let idle = self.ctx.idle_pods.state();
        let count: usize = pools
            .iter()
            .filter(|p| p.metadata.name.as_ref().is_some_and(|n| names.contains(n)))
            .map(|p| {
                self.watched_idle(&idle, p)
                    .into_iter()
                    .filter(|pod| self.claimable(pod) && is_running(pod))
                    .count()
            })
            .sum();
        u32::try_from(count).unwrap_or(u32::MAX)
    }

    /// The idle Pods of `pool` as the operator's watch has them: in the run's namespace, of the
    /// pool's current profile.
    fn watched_idle<'a>(&self, idle: &'a [Arc<Pod>], pool: &SandboxPool) -> Vec<&'a Pod> {
        let (Some(name), profile) = (
            pool.metadata.name.as_deref(),
            pool::profile_hash(pool, &self.ctx.sandbox),
        ) else {
            return Vec::new();
        };
        let label = pod::label_value(name);
        idle.iter()
            .map(AsRef::as_ref)
            .filter(|p| {
                p.metadata.namespace.as_deref() == Some(self.ns.as_str())
                    && p.labels().get(LABEL_POOL) == Some(&label)
                    && p.labels().get(LABEL_PROFILE) == Some(&profile)
            })
            .collect()
    }

    /// Whether `pod`, as read, may still be claimed: not being deleted, and not claimed by this
    /// operator already (the watch may lag behind).
    fn claimable(&self, pod: &Pod) -> bool {
        pod.metadata.deletion_timestamp.is_none()
            && !self.ctx.claimed_pods.contains(&pod.name_any())
    }

    /// Claims a ready sandbox of one of `pools` ([`Self::warm_pools`]) for the run, with
    /// `limits`, returning files within `files`. A claim of this run's whose answer was lost is
    /// settled first, whatever `pools` says.
    pub(super) async fn claim_warm(
        &self,
        pools: &[String],
        limits: &Limits,
        files: FileCaps,
    ) -> Result<Option<Claimed>, Error> {
        let ctx = self.ctx;
        let uid = self.uid();
        if let Some(doubt) = ctx.claims_in_doubt.get(&uid)
            && let Some(claimed) = self.settle_claim_in_doubt(&doubt, limits, files).await?
        {
            return Ok(Some(claimed));
        }
        let state = ctx.pools.state();
        let started = std::time::Instant::now();
        for name in pools {
            let Some(pool_obj) = state
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            else {
                continue;
            };
            let selector = format!(
                "{LABEL_POOL}={},{LABEL_PROFILE}={}",
                pod::label_value(name),
                pool::profile_hash(pool_obj, &ctx.sandbox)
            );
            // The pool's Pods as the operator's watch has them, then (none there, or each one
            // it showed changed since) fresh from the API server: either way the resourceVersion
            // read is the claim's precondition, so a Pod claimed or changed since is a conflict,
            // never a second claim.
            // Read in place: each idle Pod is tens of kilobytes, not copied per claim.
            let idle = ctx.idle_pods.state();
            let watched = self.watched_idle(&idle, pool_obj);
            if let Some(claimed) = self
                .claim_one_of(name, &watched, limits, files, started)
                .await?
            {
                return Ok(Some(claimed));
            }
            let listed = self
                .pods
                .list(&ListParams::default().labels(&selector))
                .await?
                .items;
            let listed: Vec<&Pod> = listed.iter().collect();
            if let Some(claimed) = self
                .claim_one_of(name, &listed, limits, files, started)
                .await?
            {
                return Ok(Some(claimed));
            }
            ctx.metrics
                .warm_claim_result(&pool::key(&self.ns, name), false);
            ctx.pool_demand.missed(&self.ns, name, &uid, self.now);
        }
        Ok(None)
    }

    /// Claims one of `pods` (pool `name`'s, as read) for this run: the ready ones first, in an
    /// order of the run's own, then those still importing; `None` when each was taken or changed
    /// since it was read (or there was none).
    async fn claim_one_of(
        &self,
        name: &str,
        pods: &[&Pod],
        limits: &Limits,
        files: FileCaps,
        started: std::time::Instant,
    ) -> Result<Option<Claimed>, Error> {
        let (ctx, uid) = (self.ctx, self.uid());
        let live = || pods.iter().copied().filter(|p| self.claimable(p));
        let mut ready: Vec<&Pod> = live().filter(|p| is_ready(p)).collect();
        // In an order of this run's own: runs arriving together then try different Pods
        // first instead of all racing for the same one.
        ready.sort_by_key(|p| pod::short_hash(&format!("{uid}/{}", p.name_any())));
        // Then those still importing, the oldest (the furthest along) first: their runner
        // reads the program beside its imports, as a run's own sandbox does.
        let mut importing: Vec<&Pod> = live().filter(|p| is_running(p) && !is_ready(p)).collect();
        importing.sort_by_key(|p| p.metadata.creation_timestamp.clone());
        let mut attempts = 0;
        for candidate in ready.into_iter().chain(importing) {
            if attempts == CLAIM_ATTEMPTS {
                break;
            }
            let Some(pod_name) = candidate.metadata.name.clone() else {
                continue;
            };
            let Some(patch) = claim_patch(candidate, name, self.run, limits, files, self.now)
            else {
                continue;
            };
            // In doubt until its answer says otherwise (also if this reconcile is cut short
            // while it waits).
            let doubt = ClaimInDoubt {
                pod: pod_name.clone(),
                pool: name.to_owned(),
                resource_version: candidate.metadata.resource_version.clone(),
            };
            if !ctx.claims_in_doubt.try_insert(&uid, doubt) {
                // Another run is claiming it this moment.
                continue;
            }
            attempts += 1;
            let answer = self
                .pods
                .patch(&pod_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            // Marked claimed before its doubt goes: the pool's watch never sees it unmarked
            // (`pool::run`).
            if answer.is_ok() {
                ctx.claimed_pods.add(&pod_name, &uid);
            }
            if matches!(&answer, Ok(_) | Err(kube::Error::Api(_)))
                && !matches!(&answer, Err(kube::Error::Api(e)) if e.code >= 500)
            {
                ctx.claims_in_doubt.remove(&uid);
            }
            match answer {
                Ok(_) => {
                    let key = pool::key(&self.ns, name);
                    ctx.pool_claims.add(&key);
                    // When the claim was accepted, not when this reconcile began: the
                    // pool's refill waits for its hand-over from then.
                    ctx.pool_demand
                        .claimed(&self.ns, name, &uid, Timestamp::now());
                    ctx.metrics
                        .warm_claim
                        .observe(started.elapsed().as_secs_f64());
                    ctx.metrics.warm_claim_result(&key, true);
                    info!(run = %self.name, pod = %pod_name, pool = %name, claim_ms = started.elapsed().as_millis(), importing = !is_ready(candidate), "claimed a warm sandbox");
                    return Ok(Some(Claimed {
                        pod: pod_name,
                        pool: name.to_owned(),
                    }));
                }
                // Another run took it (or it changed) since the list: try the next one.
                Err(kube::Error::Api(e)) if matches!(e.code, 409 | 404 | 422) => {
                    info!(run = %self.name, pod = %pod_name, reason = %e.message, "lost a warm sandbox to another claim");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// Settles this run's claim in doubt on its Pod, fresh from the API server, before the run
    /// takes anything else: the Pod is already the run's (the lost request committed): take it;
    /// it is unchanged since the claim was sent: claim it again, which moves its resourceVersion
    /// on, so the lost request's precondition can no longer hold; it changed or is gone: the
    /// lost request cannot commit either, and the run claims as usual. `None`: settled, nothing
    /// claimed.
    async fn settle_claim_in_doubt(
        &self,
        doubt: &ClaimInDoubt,
        limits: &Limits,
        files: FileCaps,
    ) -> Result<Option<Claimed>, Error> {
        let uid = self.uid();
        let claimed = Claimed {
            pod: doubt.pod.clone(),
            pool: doubt.pool.clone(),
        };
        // Twice at most: a conflict on the second claim means the Pod changed after the read,
        // which the second read explains (the lost request committed, or another run claimed it).
        for _ in 0..2 {
            let Some(current) = self.pods.get_opt(&doubt.pod).await? else {
                self.ctx.claims_in_doubt.remove(&uid);
                return Ok(None);
            };
            if pod::belongs_to(&current, self.run) {
                info!(run = %self.name, pod = %doubt.pod, "a claim whose answer was lost had committed: taking up its sandbox");
                self.ctx.claimed_pods.add(&doubt.pod, &uid);
                self.ctx.claims_in_doubt.remove(&uid);
                self.ctx.pool_claims.add(&pool::key(&self.ns, &doubt.pool));
                return Ok(Some(claimed));
            }
            if current.metadata.deletion_timestamp.is_some()
                || current.metadata.resource_version != doubt.resource_version
            {
                self.ctx.claims_in_doubt.remove(&uid);
                return Ok(None);
            }
            let Some(patch) = claim_patch(&current, &doubt.pool, self.run, limits, files, self.now)
            else {
                self.ctx.claims_in_doubt.remove(&uid);
                return Ok(None);
            };
            match self
                .pods
                .patch(&doubt.pod, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    info!(run = %self.name, pod = %doubt.pod, "claimed again a warm sandbox whose first claim's answer was lost");
                    self.ctx.claimed_pods.add(&doubt.pod, &uid);
                    self.ctx.claims_in_doubt.remove(&uid);
                    self.ctx.pool_claims.add(&pool::key(&self.ns, &doubt.pool));
                    return Ok(Some(claimed));
                }
                Err(kube::Error::Api(e)) if matches!(e.code, 409 | 404 | 422) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        // Changed twice between a read and a claim: not by this run's lost request (which can
        // change it once), so that one can no longer commit.
        self.ctx.claims_in_doubt.remove(&uid);
        Ok(None)
    }

    /// A warm sandbox this run claimed that its status does not name: the claim's patch
    /// committed, and the operator stopped before recording it. Looked up (fresh from the API
    /// server, by the run's label and owner) only when the run was not decided in this
    /// reconciliation; the reconcile that decides looks with [`Self::unrecorded_claim`].
    pub(super) async fn earlier_claim(&self) -> Result<Option<EarlierClaim>, Error> {
        let selector = format!("{}={}", pod::LABEL_RUN, pod::label_value(&self.name));
        let listed = self
            .pods
            .list(&ListParams::default().labels(&selector))
            .await?;
        for p in listed.items {
            if let Some(found) = self.taken_up(p).await? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// A warm sandbox claimed for this run before its decision was recorded: a claim goes out
    /// before the decision, which is recorded with the claim in one write, and that write
    /// failed or the operator stopped before it. Looked up in the reconcile that decides the
    /// run (again): the claims this operator made for it (read fresh, whatever the watch shows
    /// yet), then the controller's Pod watch once its first list is in (an operator before a
    /// restart claimed it: that list came after its claim), else the API server.
    pub(super) async fn unrecorded_claim(&self) -> Result<Option<EarlierClaim>, Error> {
        for name in self.ctx.claimed_pods.of_run(&self.uid()) {
            if let Some(p) = self.pods.get_opt(&name).await?
                && let Some(found) = self.taken_up(p).await?
            {
                return Ok(Some(found));
            }
        }
        let label = pod::label_value(&self.name);
        let watched = self.ctx.watched_pods.listed(|p| {
            p.metadata.namespace.as_deref() == Some(self.ns.as_str())
                && p.labels().get(pod::LABEL_RUN) == Some(&label)
        });
        let Some(watched) = watched else {
            return self.earlier_claim().await;
        };
        for p in watched {
            if let Some(found) = self.taken_up(Pod::clone(&p)).await? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// `p`, a Pod labelled with this run, if it is a warm sandbox the run claimed that can
    /// still take the program; one that cannot (it got nothing) is given up.
    async fn taken_up(&self, p: Pod) -> Result<Option<EarlierClaim>, Error> {
        let Some(pool) = p.annotations().get(FROM_POOL_ANNOTATION).cloned() else {
            return Ok(None);
        };
        if p.metadata.deletion_timestamp.is_some() || !pod::belongs_to(&p, self.run) {
            return Ok(None);
        }
        if !is_running(&p) {
            self.delete_pod(&p.name_any()).await?;
            return Ok(None);
        }
        Ok(Some(EarlierClaim {
            claimed: Claimed {
                pod: p.name_any(),
                pool,
            },
            object: p,
        }))
    }

    /// Runs the program in the claimed sandbox: record the claim, send the code, read the
    /// result from the stream and end the run. If the result does not come over the stream
    /// (the stream broke, or the code runs long), the run goes on as any other: Running, until
    /// the kubelet reports the container's end and its log is read.
    pub(super) async fn run_warm(
        &self,
        prev: &SandboxRunStatus,
        claimed: &Claimed,
        limits: &Limits,
        files: FileCaps,
    ) -> Result<Action, Error> {
        let ctx = self.ctx;
        // However this ends, the pool's refill waits for it no longer.
        let _handing_over = HandingOver {
            demand: &ctx.pool_demand,
            namespace: &self.ns,
            pool: &claimed.pool,
            run: self.uid(),
        };
        let deadline = self
            .now
            .checked_add(SignedDuration::from_secs(
                i64::from(limits.timeout_seconds + ACTIVE_DEADLINE_GRACE_SECONDS)
                    + phase::OPERATOR_DEADLINE_SLACK_SECONDS,
            ))
            .unwrap_or(self.now);
        let progress = Progress {
            phase: Phase::Pending,
            reason: Reason::WarmSandboxClaimed.as_str().to_owned(),
            message: format!(
                "claimed warm sandbox {} from pool {}",
                claimed.pod, claimed.pool
            ),
            started_at: None,
            deadline,
        };
        let mut recorded =
            phase::progress_status(prev, &progress, &claimed.pod, self.generation, self.now);
        recorded.path = Some(SandboxPath::Warm);
        recorded.pool = Some(claimed.pool.clone());
        // Recorded before the code is sent, with the run's decision if it was taken in this
        // reconcile: a recorded Pod that goes missing ends the run PodDeleted, so the code can
        // never run in a second sandbox.
        // If the record fails, nothing was sent to the sandbox and it stays the run's: the retry
        // takes it up (`earlier_claim` or `unrecorded_claim`) instead of a second one. (Deleting
        // it here and going on to another, as before, gave one run two sandboxes: found by the
        // fault suite's full form.) Except when the run changed since it was decided on its
        // cached copy (a cancel, another writer): the decision the claim was made on may not
        // stand, and the sandbox goes.
        let written = match self.apply_recorded(&recorded).await {
            Ok(written) => written,
            Err(Error::Changed) => {
                info!(run = %self.name, pod = %claimed.pod, "the run changed before its claim was recorded; giving up the unused sandbox");
                self.delete_pod(&claimed.pod).await?;
                return Err(Error::Changed);
            }
            Err(e) => return Err(e),
        };
        ctx.metrics.entered(Phase::Pending);
        ctx.events
            .claimed(self.run, &claimed.pod, &claimed.pool)
            .await;

        let program = self.program(files);
        // The stream the pool opened while the sandbox idled, if it did: taken only once the
        // claim is recorded, so that a retry after a failed record still finds it.
        let held = ctx
            .held
            .take(&pool_streams::key(&self.ns, &claimed.pod))
            .await;
        ctx.metrics.warm_handover(held.is_some());
        let sent_at = Timestamp::now();
        let within = INLINE_READ.min(Duration::from_secs(u64::from(
            limits.timeout_seconds + ACTIVE_DEADLINE_GRACE_SECONDS,
        )));
        let fed = std::time::Instant::now();
        let read =
            feed::feed_and_read(&self.pods, &claimed.pod, &program, limits, within, held).await;
        tracing::debug!(run = %self.name, pod = %claimed.pod,
            feed_and_read_ms = fed.elapsed().as_millis(), "warm sandbox answered");
        let log = match read {
            Ok(log) => {
                ctx.feeds.mark_fed(&self.uid());
                ctx.metrics
                    .program_feed
                    .observe(fed.elapsed().as_secs_f64());
                log
            }
            // Not handed over: the next reconcile sees the recorded, running Pod and tries
            // again (the ordinary path), within the Pod's deadline.
            Err(source) => {
                return Err(Error::Feed {
                    pod: claimed.pod.clone(),
                    source,
                });
            }
        };
        self.started(&claimed.pod, sent_at).await;
        let envelope = log.as_deref().map(parse_envelope);
        let Some((log, Ok(result))) = log.as_deref().zip(envelope) else {
            // No result over the stream: the kubelet's view decides, as on the cold path.
            let running = Progress {
                phase: Phase::Running,
                reason: Reason::ContainerStarted.as_str().to_owned(),
                message: "the code is running".to_owned(),
                started_at: Some(sent_at),
                deadline,
            };
            let mut status = phase::progress_status(
                &recorded,
                &running,
                &claimed.pod,
                self.generation,
                self.now,
            );
            status.path = recorded.path;
            status.pool = recorded.pool.clone();
            self.apply(&status).await?;
            return Ok(Action::requeue(
                Duration::from_secs(1).min(until(deadline, self.now)),
            ));
        };
        // The runner printed its envelope and exited: what the kubelet would report later adds
        // nothing the envelope does not say, except an OOM kill of the whole sandbox, which
        // leaves no envelope (and then the branch above waits for the kubelet).
        let exited = Exited {
            exit_code: result.exit_code,
            reason: None,
            started_at: Some(sent_at),
            finished_at: Timestamp::now(),
        };
        let outcome = phase::collected(&exited, log, limits, files);
        // Conditional on the claim's record, this reconcile's own last write: if anything
        // wrote the run since (a cancel), the end is looked at again.
        let status = self.terminal(&recorded, Some(Tool::Python), &outcome, Some(&claimed.pod));
        self.finish_over(status, &outcome, Some(&claimed.pod), written)
            .await
    }
}

#[cfg(test)]
#[path = "warm_tests.rs"]
mod tests;

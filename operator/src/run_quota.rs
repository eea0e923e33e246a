//! A count quota on SandboxRuns that holds from the first install.
//!
//! `count/sandboxruns.sandboxrun.dev` in a ResourceQuota bounds how many runs (finished ones
//! waiting for their TTL included) a flood of calls can store in etcd. Kubernetes' quota
//! controller learns about a new CRD only at its next discovery (every 30 s); a quota it synced
//! before that gets the hard limit in its status but no usage, and the API server then refuses
//! every create of the resource ("status unknown for quota") until the controller's full resync,
//! up to 5 minutes later. Installed by the chart next to the CRD, such a quota would refuse every
//! run of a fresh install.
//!
//! So the operator adds the limit itself, and only once the quota controller counts
//! SandboxRuns: it creates a probe quota in its own namespace (where no runs are made), recreates
//! it until the controller reports a usage for it (the controller's evaluators are global, so
//! the probe's usage proves the runs namespace will be counted too), then applies the limit to
//! the runs namespace's quota with server-side apply (its own field manager, so the chart's other
//! limits stay the chart's). The controller counts a quota whose spec changed at once. The limit
//! is checked again every few minutes, so a quota edited or recreated by hand gets it back.

use std::time::Duration;

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

/// The quota resource that counts SandboxRuns.
pub const COUNT: &str = "count/sandboxruns.sandboxrun.dev";
/// Name of the probe quota in the operator's own namespace.
pub const PROBE: &str = "sandboxrun-run-count-probe";
/// Field manager of the operator's server-side apply of the limit.
const MANAGER: &str = "sandboxrun-operator-run-quota";
/// How long a probe may show a limit without a usage before it is recreated: the controller
/// synced it before it knew the CRD and would not look at it again for minutes.
const STUCK_AFTER: Duration = Duration::from_secs(10);
/// Between looks at a quota's status while waiting for the controller.
const POLL: Duration = Duration::from_secs(2);
/// Between checks that the limit is still in place.
const RECHECK: Duration = Duration::from_secs(300);
/// After a failed attempt (API error), before the next.
const RETRY: Duration = Duration::from_secs(10);

/// Where the limit goes, and how high it is.
#[derive(Clone, Debug)]
pub struct RunQuota {
    /// The namespace of the runs.
    pub namespace: String,
    /// The ResourceQuota there that gets the limit (the chart's; created if missing).
    pub quota: String,
    /// Most SandboxRuns stored in the namespace at once.
    pub max_runs: u32,
    /// The operator's own namespace, for the probe.
    pub probe_namespace: String,
}

/// What a quota's status says about counting SandboxRuns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counting {
    /// The controller reports a usage: creates are checked against the limit.
    Counted,
    /// The controller synced the limit without a usage: creates are refused until it resyncs.
    Stuck,
    /// The controller has not synced the limit yet: creates are not checked.
    NotYetSynced,
}

/// What `quota`'s status says about [`COUNT`].
pub fn counting(quota: &ResourceQuota) -> Counting {
    let status = quota.status.as_ref();
    let has = |m: Option<&std::collections::BTreeMap<String, _>>| {
        m.is_some_and(|m| m.contains_key(COUNT))
    };
    if has(status.and_then(|s| s.used.as_ref())) {
        Counting::Counted
    } else if has(status.and_then(|s| s.hard.as_ref())) {
        Counting::Stuck
    } else {
        Counting::NotYetSynced
    }
}

/// Whether `quota` holds the limit `max_runs` in its spec.
pub fn holds_limit(quota: &ResourceQuota, max_runs: u32) -> bool {
    quota
        .spec
        .as_ref()
        .and_then(|s| s.hard.as_ref())
        .and_then(|h| h.get(COUNT))
        // The API server writes quantities in canonical form ("1000" reads back "1k").
        .is_some_and(|q| sandboxrun_core::quantity::memory_bytes(&q.0) == Some(u64::from(max_runs)))
}

/// Keeps the limit in place until the task is dropped (the operator stops or loses the lease).
pub async fn keep(client: Client, settings: RunQuota) {
    let runs: Api<ResourceQuota> = Api::namespaced(client.clone(), &settings.namespace);
    let own: Api<ResourceQuota> = Api::namespaced(client, &settings.probe_namespace);
    loop {
        let wait = match ensure(&runs, &own, &settings).await {
            Ok(()) => RECHECK,
            Err(e) => {
                warn!(error = %e, namespace = %settings.namespace, quota = %settings.quota,
                      "cannot put the SandboxRun count limit in place yet; retrying");
                RETRY
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// One check: if the runs quota lacks the limit, probe the controller, then apply it.
async fn ensure(
    runs: &Api<ResourceQuota>,
    own: &Api<ResourceQuota>,
    settings: &RunQuota,
) -> kube::Result<()> {
    if let Some(q) = runs.get_opt(&settings.quota).await?
        && holds_limit(&q, settings.max_runs)
        && counting(&q) == Counting::Counted
    {
        return Ok(());
    }
    probe(own).await?;
    let limit = json!({
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": { "name": settings.quota },
        "spec": { "hard": { COUNT: settings.max_runs.to_string() } },
    });
    runs.patch(
        &settings.quota,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&limit),
    )
    .await?;
    // The controller knows the CRD now, so the changed spec is counted at its next look.
    loop {
        let q = runs.get(&settings.quota).await?;
        if counting(&q) == Counting::Counted {
            info!(namespace = %settings.namespace, quota = %settings.quota, limit = settings.max_runs,
                  "SandboxRun count limit in place");
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the quota controller counts SandboxRuns, shown by a probe quota in the operator's
/// own namespace, recreated while the controller ignores it; removes the probe after.
async fn probe(api: &Api<ResourceQuota>) -> kube::Result<()> {
    let probe: ResourceQuota = serde_json::from_value(json!({
        "metadata": { "name": PROBE },
        "spec": { "hard": { COUNT: "0" } },
    }))
    .map_err(kube::Error::SerdeError)?;
    loop {
        let Some(current) = api.get_opt(PROBE).await? else {
            match api.create(&PostParams::default(), &probe).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
            tokio::time::sleep(POLL).await;
            continue;
        };
        match counting(&current) {
            Counting::Counted => {
                let _ = api.delete(PROBE, &DeleteParams::default()).await;
                return Ok(());
            }
            Counting::Stuck | Counting::NotYetSynced if age(&current) > STUCK_AFTER => {
                // Synced before the controller knew the CRD (or never): a new object is looked at
                // again at once.
                let _ = api.delete(PROBE, &DeleteParams::default()).await;
            }
            _ => {}
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How long ago `quota` was created.
fn age(quota: &ResourceQuota) -> Duration {
    quota
        .creation_timestamp()
        .map(|t| jiff::Timestamp::now().duration_since(t.0))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(value: serde_json::Value) -> ResourceQuota {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn counting_reads_the_status() {
        let synced = quota(json!({"status": {"hard": {COUNT: "5"}, "used": {COUNT: "2"}}}));
        assert_eq!(counting(&synced), Counting::Counted);
        let stuck =
            quota(json!({"status": {"hard": {COUNT: "5", "pods": "1"}, "used": {"pods": "0"}}}));
        assert_eq!(counting(&stuck), Counting::Stuck);
        assert_eq!(counting(&quota(json!({}))), Counting::NotYetSynced);
        let other = quota(json!({"status": {"hard": {"pods": "1"}, "used": {"pods": "0"}}}));
        assert_eq!(counting(&other), Counting::NotYetSynced);
    }

    #[test]
    fn holds_limit_compares_the_spec() {
        let q = quota(json!({"spec": {"hard": {COUNT: "1000", "pods": "20"}}}));
        assert!(holds_limit(&q, 1000));
        assert!(!holds_limit(&q, 999));
        let canonical = quota(json!({"spec": {"hard": {COUNT: "1k"}}}));
        assert!(holds_limit(&canonical, 1000));
        assert!(!holds_limit(
            &quota(json!({"spec": {"hard": {"pods": "20"}}})),
            1000
        ));
    }
}

//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager: server-side-apply
//! updates of the Lease, so two replicas cannot both hold it). The controller runs only while
//! this replica holds the Lease, and stops as soon as it loses it.

use std::future::Future;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tracing::{info, warn};

/// Seconds a Lease stays valid without renewal.
const LEASE_DURATION_SECONDS: u64 = 15;
/// Seconds before expiry at which the holder renews (also the tolerated clock skew).
const LEASE_GRACE_SECONDS: u64 = 5;

/// Where the Lease lives and who this replica is.
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica's identity (the Pod name); the Lease holds it with a per-process suffix.
    pub identity: String,
}

/// The Lease holder identity of this process: the replica's identity and a fresh UUID, as
/// client-go does (`<hostname>_<uuid>`). The suffix matters: kube-lease-manager treats a Lease
/// whose holder equals its own identity as already held, so with the bare Pod name a container
/// restarted after a crash would take back its dead predecessor's Lease at once, without waiting
/// for it to expire, and win against every standby replica. The Pod part stays readable in
/// `kubectl get lease`.
pub fn holder_identity(identity: &str) -> String {
    format!("{identity}_{}", uuid::Uuid::new_v4().simple())
}

/// Runs `work` whenever this replica leads, until `shutdown` turns true. `work` receives a
/// future that completes when leadership is lost or shutdown begins, and must return soon after.
pub async fn run_while_leader<W, F>(
    client: Client,
    lease: LeaseConfig,
    mut shutdown: watch::Receiver<bool>,
    mut work: W,
) -> anyhow::Result<()>
where
    W: FnMut(std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>>) -> F,
    F: Future<Output = ()>,
{
    let holder = holder_identity(&lease.identity);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease.namespace);
    let (mut leading, mut task) = start_manager(&client, &lease, &holder).await?;

    loop {
        // Wait to lead, to stop, or for the Lease to be let go. A standby of kube-lease-manager
        // 0.13 sleeps until the expiry it last read (it does not watch the Lease), so a rolling
        // update left the runs without a leader for up to LEASE_DURATION_SECONDS (14 s
        // measured, 2026-12-07); a new manager takes a free Lease at once. The one waiting
        // holds nothing, so it is just stopped.
        let mut rx = leading.clone();
        tokio::select! {
            r = rx.wait_for(|l| *l) => if r.is_err() { warn!("lease manager stopped"); break; },
            _ = shutdown.wait_for(|s| *s) => break,
            () = released(leases.clone(), &lease.name, &holder) => {
                info!(lease = %lease.name, "the Lease was let go; taking it");
                task.abort();
                (leading, task) = start_manager(&client, &lease, &holder).await?;
                continue;
            }
        }
        info!(%holder, "became leader, starting controller");

        // Lead until the lease is lost or shutdown starts.
        let mut lost = leading.clone();
        let mut stop = shutdown.clone();
        let stop_leading = Box::pin(async move {
            tokio::select! {
                _ = lost.wait_for(|l| !*l) => warn!("lost leadership, stopping controller"),
                _ = stop.wait_for(|s| *s) => {},
            }
        });
        work(stop_leading).await;
        if *shutdown.borrow() {
            break;
        }
    }

    // Dropping the last receiver makes the manager release the Lease (when it holds it), which
    // a standby's `released` sees.
    drop(leading);
    match task.await {
        Ok(Ok(_)) => info!("lease released"),
        Ok(Err(e)) => warn!(error = %e, "lease release failed"),
        Err(e) => warn!(error = %e, "lease task failed"),
    }
    Ok(())
}

/// A started lease manager: whether it leads, and its task (which releases the Lease, if held,
/// once every receiver is dropped).
type Manager = (
    watch::Receiver<bool>,
    tokio::task::JoinHandle<kube_lease_manager::Result<LeaseManager>>,
);

/// A lease manager for `holder`, started.
async fn start_manager(
    client: &Client,
    lease: &LeaseConfig,
    holder: &str,
) -> anyhow::Result<Manager> {
    let manager = LeaseManagerBuilder::new(client.clone(), &lease.name)
        .with_namespace(&lease.namespace)
        .with_identity(holder)
        .with_duration(LEASE_DURATION_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        .with_field_manager("sandboxrun-operator-lease")
        .build()
        .await?;
    let started = manager.watch().await;
    info!(lease = %lease.name, namespace = %lease.namespace, %holder, "waiting for leadership");
    Ok(started)
}

/// Completes when the Lease `name` is let go by another holder (released by a leader that
/// stopped, or by a standby as it expired): [`LetGo`] on each version the watch shows. A watch
/// that fails is retried (with the watcher's backoff), and a standby that never sees a release
/// still takes the Lease at its expiry.
async fn released(leases: Api<Lease>, name: &str, holder: &str) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(leases, config).default_backoff().applied_objects());
    let mut let_go = LetGo::default();
    while let Some(event) = events.next().await {
        let Ok(lease) = event else { continue };
        let now = lease.spec.and_then(|s| s.holder_identity);
        if let_go.seen(now.as_deref(), holder) {
            return;
        }
    }
    // The stream ended (it does not): wait for the expiry like the manager does.
    std::future::pending::<()>().await
}

/// Whether a Lease's holder, version after version, let it go: seen held by another identity
/// than ours, then cleared. A Lease first seen free is the manager's to take, not a release;
/// one we held and cleared is ours.
#[derive(Default)]
struct LetGo {
    held_by_another: bool,
}

impl LetGo {
    /// The Lease's holder now (`None` or empty: nobody); `ours`: this process's identity.
    fn seen(&mut self, now: Option<&str>, ours: &str) -> bool {
        match now.filter(|h| !h.is_empty()) {
            Some(h) => {
                self.held_by_another = h != ours;
                false
            }
            None => self.held_by_another,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LetGo, holder_identity};

    #[test]
    fn a_lease_is_let_go_when_another_holder_clears_it() {
        let seen = |versions: &[Option<&str>]| {
            let mut let_go = LetGo::default();
            versions
                .iter()
                .map(|v| let_go.seen(*v, "us"))
                .collect::<Vec<_>>()
        };
        assert_eq!(seen(&[Some("them"), None]), [false, true]);
        assert_eq!(seen(&[Some("them"), Some(""), None]), [false, true, true]);
        // First seen free: the manager takes it, nobody let it go.
        assert_eq!(seen(&[None, Some("")]), [false, false]);
        // Ours, then cleared: our own release.
        assert_eq!(
            seen(&[Some("them"), Some("us"), None]),
            [false, false, false]
        );
    }

    #[test]
    fn every_process_holds_the_lease_under_its_own_identity() {
        let a = holder_identity("sandboxrun-operator-7d9f-abcde");
        let b = holder_identity("sandboxrun-operator-7d9f-abcde");
        assert_ne!(
            a, b,
            "a restarted container must not inherit its predecessor's Lease"
        );
        assert!(a.starts_with("sandboxrun-operator-7d9f-abcde_"), "{a}");
        // A Lease holderIdentity is free text, but keep it a plain token.
        assert!(
            a.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "{a}"
        );
    }
}

//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager: server-side-apply
//! updates of the Lease, so two replicas cannot both hold it). The controller runs only while
//! this replica holds the Lease, and stops as soon as it loses it.

use std::future::Future;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
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
    /// This replica's identity (holderIdentity).
    pub identity: String,
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
    let manager = LeaseManagerBuilder::new(client, &lease.name)
        .with_namespace(&lease.namespace)
        .with_identity(&lease.identity)
        .with_duration(LEASE_DURATION_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        .with_field_manager("sandboxrun-operator-lease")
        .build()
        .await?;
    let (leading, task) = manager.watch().await;
    info!(lease = %lease.name, namespace = %lease.namespace, identity = %lease.identity, "waiting for leadership");

    loop {
        // Wait to lead (or to stop).
        let mut rx = leading.clone();
        tokio::select! {
            r = rx.wait_for(|l| *l) => if r.is_err() { warn!("lease manager stopped"); break; },
            _ = shutdown.wait_for(|s| *s) => break,
        }
        info!(identity = %lease.identity, "became leader, starting controller");

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

    // Dropping the last receiver makes the manager release the Lease, so a standby replica
    // takes over at once instead of waiting for expiry.
    drop(leading);
    match task.await {
        Ok(Ok(_)) => info!("lease released"),
        Ok(Err(e)) => warn!(error = %e, "lease release failed"),
        Err(e) => warn!(error = %e, "lease task failed"),
    }
    Ok(())
}

//! Warm pools for tests: a `SandboxPool` of its own per test, with a profile no other test uses
//! (its own `pids`), so tests running side by side never claim each other's sandboxes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use sandboxrun_api::{SandboxPool, SandboxRun};
use serde_json::json;

use crate::runs::{RUNS_NAMESPACE, python_run};
use crate::unique_name;

/// How long a pool may take to fill.
pub const FILL_TIMEOUT: Duration = Duration::from_secs(120);

/// The SandboxPool API of the runs namespace.
pub fn pools(client: &Client) -> Api<SandboxPool> {
    Api::namespaced(client.clone(), RUNS_NAMESPACE)
}

fn pods(client: &Client) -> Api<Pod> {
    Api::namespaced(client.clone(), RUNS_NAMESPACE)
}

/// A pool of `replicas` sandboxes whose profile only runs asking for `pids` processes fit.
/// Deleted when dropped, also when the test fails.
pub struct TestPool {
    client: Client,
    /// The pool's name.
    pub name: String,
    pids: u32,
    deleted: bool,
}

impl TestPool {
    /// Creates the pool.
    pub async fn create(client: &Client, prefix: &str, pids: u32, replicas: i32) -> Result<Self> {
        Self::create_spec(client, prefix, json!({"replicas": replicas, "pids": pids})).await
    }

    /// Creates a pool that follows demand: `min` to `max` sandboxes, a burst keeping it large
    /// for `delay_seconds`; it starts at `min`.
    pub async fn create_autoscaled(
        client: &Client,
        prefix: &str,
        pids: u32,
        (min, max): (i32, i32),
        delay_seconds: u32,
    ) -> Result<Self> {
        let spec = json!({"replicas": min, "minReplicas": min, "maxReplicas": max,
                          "scaleDownDelaySeconds": delay_seconds, "pids": pids});
        Self::create_spec(client, prefix, spec).await
    }

    /// The pool as the API server has it now.
    pub async fn get(&self) -> Result<SandboxPool> {
        Ok(pools(&self.client).get(&self.name).await?)
    }

    /// Creates a pool of sandboxes under `runtime_class` instead of the operator's own. No run
    /// ever claims one (a run matches only pools of the operator's runtime class), so its idle
    /// sandboxes are Pods the operator made that only a test reaches into.
    pub async fn create_in_runtime(
        client: &Client,
        prefix: &str,
        pids: u32,
        replicas: i32,
        runtime_class: &str,
    ) -> Result<Self> {
        let spec = json!({"replicas": replicas, "pids": pids, "runtimeClassName": runtime_class});
        Self::create_spec(client, prefix, spec).await
    }

    async fn create_spec(client: &Client, prefix: &str, spec: serde_json::Value) -> Result<Self> {
        let name = unique_name(prefix);
        let pids = spec["pids"].as_u64().and_then(|p| u32::try_from(p).ok());
        let pids = pids.ok_or_else(|| anyhow::anyhow!("a test pool needs its own pids"))?;
        let pool: SandboxPool = serde_json::from_value(json!({
            "apiVersion": "sandboxrun.dev/v1alpha1",
            "kind": "SandboxPool",
            "metadata": {"name": name},
            "spec": spec,
        }))?;
        pools(client).create(&PostParams::default(), &pool).await?;
        Ok(Self {
            client: client.clone(),
            name,
            pids,
            deleted: false,
        })
    }

    /// The pool's idle Pods (not being deleted).
    pub async fn idle(&self) -> Result<Vec<Pod>> {
        let lp = ListParams::default().labels(&format!("sandboxrun.dev/pool={}", self.name));
        Ok(pods(&self.client)
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }

    /// Waits until the pool holds exactly `n` idle Pods, all running; returns their names.
    pub async fn wait_ready(&self, n: usize) -> Result<BTreeSet<String>> {
        let deadline = Instant::now() + FILL_TIMEOUT;
        loop {
            let idle = self.idle().await?;
            let running = idle
                .iter()
                .filter(|p| {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        && p.status
                            .as_ref()
                            .and_then(|s| s.container_statuses.as_ref())
                            .is_some_and(|cs| {
                                cs.iter()
                                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                            })
                })
                .count();
            if idle.len() == n && running == n {
                let status = pools(&self.client).get(&self.name).await?.status;
                if status.is_some_and(|s| usize::try_from(s.ready_replicas).ok() == Some(n)) {
                    return Ok(idle.iter().map(ResourceExt::name_any).collect());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "pool {} has {} idle Pods ({running} running), not {n}, after {FILL_TIMEOUT:?}",
                    self.name,
                    idle.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A run that fits this pool alone.
    pub fn run(&self, code: &str) -> SandboxRun {
        python_run("e2e-warm", code, json!({"limits": {"pids": self.pids}}))
    }

    /// `kubectl scale sandboxpool`.
    pub async fn scale(&self, replicas: i32) -> Result<()> {
        let out = kubectl()
            .args([
                "-n",
                RUNS_NAMESPACE,
                "scale",
                "sandboxpool",
                &self.name,
                &format!("--replicas={replicas}"),
            ])
            .output()?;
        ensure!(
            out.status.success(),
            "kubectl scale: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// Deletes the pool (its idle Pods go with it).
    pub async fn delete(mut self) -> Result<()> {
        pools(&self.client)
            .delete(&self.name, &DeleteParams::foreground())
            .await?;
        self.deleted = true;
        Ok(())
    }
}

impl Drop for TestPool {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let name = self.name.clone();
        crate::cleanup(
            &format!("test pool {}", self.name),
            move |client| async move {
                pools(&client)
                    .delete(&name, &DeleteParams::background())
                    .await?;
                Ok(())
            },
        );
    }
}

/// kubectl next to the KUBECONFIG, else from PATH.
pub fn kubectl() -> std::process::Command {
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_default();
    let bin = std::path::Path::new(&kubeconfig)
        .with_file_name("bin")
        .join("kubectl");
    std::process::Command::new(if bin.exists() {
        bin.into_os_string()
    } else {
        "kubectl".into()
    })
}

//! Shared helpers for the end-to-end suite. Every test takes its cluster from `KUBECONFIG`, so the
//! same suite runs against the local harness (`e2e/cluster/up.sh`), kind, or any other cluster.

pub mod governance;
pub mod identity;
pub mod pools;
pub mod runs;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Client, Config};

/// The sandbox image the harness imports into containerd (see `images/build.sh`).
pub const SANDBOX_IMAGE: &str = "localhost/sandboxrun/sandbox-python:dev";

/// A client for the cluster named by `KUBECONFIG`; fails loudly when there is none, because a
/// skipped end-to-end test would look like a passing one.
pub async fn client() -> Result<Client> {
    if std::env::var_os("KUBECONFIG").is_none() {
        bail!(
            "KUBECONFIG is not set: start a cluster with e2e/cluster/up.sh and export the line it prints"
        );
    }
    let config = Config::infer().await.context("reading KUBECONFIG")?;
    Client::try_from(config).context("building a client")
}

/// A unique, DNS-safe name with the given prefix.
pub fn unique_name(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{prefix}-{:x}",
        (nanos ^ (u128::from(std::process::id()) << 40)) & 0xff_ffff_ffff
    )
}

/// A namespace that exists for one test and is deleted when the guard is dropped, Pods and all.
pub struct TestNamespace {
    /// The namespace's name.
    pub name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates `<prefix>-<random>` with the given labels.
    pub async fn create(client: &Client, prefix: &str, labels: &[(&str, &str)]) -> Result<Self> {
        let name = unique_name(prefix);
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).into()))
            .collect();
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": labels }
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        // Pods can be created only once the namespace's default ServiceAccount exists.
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &name);
        let deadline = Instant::now() + Duration::from_secs(30);
        while sa.get_opt("default").await?.is_none() {
            if Instant::now() > deadline {
                bail!("namespace {name}: default ServiceAccount never appeared");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Self {
            name,
            client: client.clone(),
        })
    }

    /// The Pod API of this namespace.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        cleanup(
            &format!("test namespace {}", self.name),
            move |client| async move {
                Api::<Namespace>::all(client)
                    .delete(&name, &DeleteParams::background())
                    .await?;
                Ok(())
            },
        );
    }
}

/// Runs `work` for a guard's drop: the test's runtime is about to shut down (or is blocked in
/// this drop), so it runs on a runtime and client of its own, on a thread waited for; a failure
/// is a warning naming `what`.
pub(crate) fn cleanup<F, Fut>(what: &str, work: F)
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>>,
{
    let handle = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async { work(client().await?).await })
    });
    if let Ok(Err(err)) = handle.join() {
        eprintln!("warning: could not delete {what}: {err:#}");
    }
}

/// Builds a Pod from JSON, so tests read like the manifests they stand for.
pub fn pod(value: serde_json::Value) -> Pod {
    serde_json::from_value(value).expect("test pod manifest is valid")
}

/// A restricted-profile Pod running `command` in the sandbox image with the given runtime class.
pub fn sandbox_pod(name: &str, runtime_class: &str, command: &[&str]) -> Pod {
    pod(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "runtimeClassName": runtime_class,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                "seccompProfile": { "type": "RuntimeDefault" }
            },
            "containers": [{
                "name": "main",
                "image": SANDBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": command,
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": { "drop": ["ALL"] }
                },
                "resources": {
                    "requests": { "cpu": "250m", "memory": "128Mi" },
                    "limits": { "cpu": "250m", "memory": "128Mi" }
                }
            }]
        }
    }))
}

/// True once the Pod reached `Succeeded` or `Failed`.
pub fn pod_finished() -> impl Condition<Pod> {
    |pod: Option<&Pod>| {
        pod.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
    }
}

/// Waits until the Pod finished and returns it, or fails after `timeout`.
pub async fn wait_finished(pods: &Api<Pod>, name: &str, timeout: Duration) -> Result<Pod> {
    let pod = tokio::time::timeout(timeout, await_condition(pods.clone(), name, pod_finished()))
        .await
        .with_context(|| format!("pod {name} did not finish within {timeout:?}"))??;
    pod.with_context(|| format!("pod {name} disappeared"))
}

/// Waits until `name` no longer exists.
pub async fn wait_deleted(pods: &Api<Pod>, name: &str, timeout: Duration) -> Result<()> {
    let gone = |pod: Option<&Pod>| pod.is_none();
    tokio::time::timeout(timeout, await_condition(pods.clone(), name, gone))
        .await
        .with_context(|| format!("pod {name} still exists after {timeout:?}"))??;
    Ok(())
}

/// The Pod's phase, or "" when it has none yet.
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// The container log of a finished Pod, read through the API server.
pub async fn logs(pods: &Api<Pod>, name: &str) -> Result<String> {
    Ok(pods.logs(name, &LogParams::default()).await?)
}

/// The status of the (first) node.
async fn node_status(client: &Client) -> Result<k8s_openapi::api::core::v1::NodeStatus> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await?;
    nodes
        .items
        .into_iter()
        .find_map(|n| n.status)
        .context("no node reports a status")
}

/// The InternalIP of the (first) node: on the local harness, the cluster bridge's host address.
pub async fn node_internal_ip(client: &Client) -> Result<String> {
    node_status(client)
        .await?
        .addresses
        .into_iter()
        .flatten()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .context("the node has no InternalIP")
}

/// The kernel version the (first) node reports.
pub async fn node_kernel_version(client: &Client) -> Result<String> {
    node_status(client)
        .await?
        .node_info
        .map(|i| i.kernel_version)
        .context("the node reports no kernel version")
}

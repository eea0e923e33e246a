//! The runner's files, where sandbox Pods read them: one ConfigMap in each namespace the
//! operator makes sandboxes in, named by its content
//! ([`sandboxrun_core::runner::pod_runner_config_map`]) and immutable, mounted read-only by every
//! sandbox Pod ([`volume`], [`mount`]). A Pod's command line carries only a loader that runs the
//! file if its SHA-256 is the one the operator put beside it (core's `pod_runner_argv`): the
//! Pod's spec, which only the operator writes, stays what decides what runs, and the runner's
//! 53 KB of source no longer ride on every write and watch event of every sandbox Pod (27 KB of
//! JSON each with the source packed in the command line, about 4 KB without).
//!
//! The ConfigMap is made before the first sandbox Pod of a namespace ([`RunnerFiles::ensure`]);
//! one of that name with other content (the name is public: anyone who may write ConfigMaps
//! there could make one first, or delete ours and make one) is replaced. Its loader would refuse
//! such a file, so that is about availability, not trust. The leader keeps it in place
//! ([`keep`]): a deleted or replaced one is made again when its watch sees it go (the kubelet
//! retries the volume of a Pod waiting for it), and the ConfigMaps of other versions are deleted
//! once no sandbox Pod mounts them.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, ConfigMapVolumeSource, Pod, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use sandboxrun_core::runner::{POD_RUNNER_DIR, pod_runner_config_map, pod_runner_files};
use tracing::{info, warn};

use crate::labels::{LABEL_MANAGED_BY, MANAGER};

/// The label that tells the runner's ConfigMaps from any other ConfigMap of the namespace.
const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Its value.
const COMPONENT: &str = "sandbox-runner";
/// The name of the volume in a sandbox Pod.
const VOLUME: &str = "runner";
/// Between two sweeps of other versions' ConfigMaps; also the youngest age one may be deleted
/// at (an operator of that version may be about to make its first Pod with it).
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// The runner's ConfigMap as this operator makes it.
pub fn config_map() -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(pod_runner_config_map().to_owned()),
            labels: Some(labels()),
            ..Default::default()
        },
        data: Some(
            pod_runner_files()
                .iter()
                .map(|(name, source)| ((*name).to_owned(), (*source).to_owned()))
                .collect(),
        ),
        // Nobody can change it in place, and the kubelet need not watch it.
        immutable: Some(true),
        ..Default::default()
    }
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), MANAGER.to_owned()),
        (LABEL_COMPONENT.to_owned(), COMPONENT.to_owned()),
    ])
}

/// The label selector of the runner's ConfigMaps, of every version.
fn selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGER},{LABEL_COMPONENT}={COMPONENT}")
}

/// The sandbox Pod's volume of the runner's ConfigMap (the kubelet mounts ConfigMaps read-only).
pub fn volume() -> Volume {
    Volume {
        name: VOLUME.to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: pod_runner_config_map().to_owned(),
            default_mode: Some(0o444),
            optional: Some(false),
            items: None,
        }),
        ..Default::default()
    }
}

/// Where the sandbox container mounts [`volume`].
pub fn mount() -> VolumeMount {
    VolumeMount {
        name: VOLUME.to_owned(),
        mount_path: POD_RUNNER_DIR.to_owned(),
        read_only: Some(true),
        ..Default::default()
    }
}

/// What a run, a session or a pool says when the API server refused the runner's ConfigMap
/// (`message`, its answer): no sandbox of this operator can start in that namespace.
pub fn refused(message: &str) -> String {
    format!("the API server refused the sandboxes' runner ConfigMap: {message}")
}

/// Whether `found` is the runner's ConfigMap as this operator makes it.
fn is_ours(found: &ConfigMap) -> bool {
    let desired = config_map();
    found.data == desired.data && found.binary_data.is_none() && found.immutable == Some(true)
}

/// Whether `pod` mounts the ConfigMap `name`.
fn mounts(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.volumes.as_ref())
        .is_some_and(|volumes| {
            volumes
                .iter()
                .any(|v| v.config_map.as_ref().is_some_and(|c| c.name == name))
        })
}

/// The namespaces whose runner ConfigMap this operator made or found in place.
pub struct RunnerFiles {
    client: Client,
    in_place: Mutex<HashSet<String>>,
    /// Held while one is made: the first sandboxes of a burst wait for it, rather than each
    /// sending its own 140 KB create.
    making: tokio::sync::Mutex<()>,
}

impl RunnerFiles {
    pub fn new(client: Client) -> Arc<Self> {
        Arc::new(Self {
            client,
            in_place: Mutex::new(HashSet::new()),
            making: tokio::sync::Mutex::new(()),
        })
    }

    /// Makes sure the runner's ConfigMap is in namespace `ns`, before a sandbox Pod is made
    /// there: once per namespace and operator (the watch of [`keep`] says when it went), then
    /// without a request.
    pub async fn ensure(&self, ns: &str) -> Result<(), kube::Error> {
        if self.is_in_place(ns) {
            return Ok(());
        }
        let _making = self.making.lock().await;
        if self.is_in_place(ns) {
            return Ok(());
        }
        put(&Api::namespaced(self.client.clone(), ns)).await?;
        self.in_place
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(ns.to_owned());
        Ok(())
    }

    fn is_in_place(&self, ns: &str) -> bool {
        self.in_place
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(ns)
    }

    /// Forgets that namespace `ns` has it: it was deleted or replaced. Whether it was there.
    fn forget(&self, ns: &str) -> bool {
        self.in_place
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(ns)
    }
}

/// Makes the runner's ConfigMap in `api`'s namespace, or replaces one of its name that is not
/// the operator's.
async fn put(api: &Api<ConfigMap>) -> Result<(), kube::Error> {
    let desired = config_map();
    let name = pod_runner_config_map();
    match api.create(&PostParams::default(), &desired).await {
        Ok(_) => {
            info!(configmap = %name, "made the sandboxes' runner ConfigMap");
            return Ok(());
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    let found = api.get(name).await?;
    if is_ours(&found) {
        return Ok(());
    }
    warn!(configmap = %name, "a ConfigMap under the runner's name holds something else; replacing it (sandbox Pods would refuse to run it)");
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: found.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {}
        // Gone already, or replaced again meanwhile: the create below settles it, or fails and
        // the next Pod's ensure tries again.
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => {}
        Err(e) => return Err(e),
    }
    api.create(&PostParams::default(), &desired).await?;
    info!(configmap = %name, "made the sandboxes' runner ConfigMap again");
    Ok(())
}

/// Keeps the runner's ConfigMap in every namespace [`RunnerFiles::ensure`] put it in (made again
/// when it is deleted or replaced), and deletes other versions' ConfigMaps that no Pod in
/// `pods` (the operator's sandbox Pods) mounts, every [`SWEEP_EVERY`]. `api`: the ConfigMaps of
/// the namespaces the operator watches. Runs while this replica leads.
pub async fn keep(files: Arc<RunnerFiles>, api: Api<ConfigMap>, pods: Store<Pod>) {
    let name = pod_runner_config_map();
    let watch = async {
        let events =
            watcher(api.clone(), watcher::Config::default().labels(&selector())).default_backoff();
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let (cm, deleted) = match event {
                Ok(watcher::Event::Delete(cm)) => (cm, true),
                Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => (cm, false),
                Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
                Err(e) => {
                    warn!(error = %e, "cannot watch the runner's ConfigMaps (list and watch configmaps): one deleted is made again only after a restart");
                    continue;
                }
            };
            let Some(ns) = cm.namespace() else { continue };
            // A delete event also comes for one whose labels were taken off.
            if cm.name_any() == name && (deleted || !is_ours(&cm)) && files.forget(&ns) {
                warn!(namespace = %ns, configmap = %name, "the sandboxes' runner ConfigMap went; making it again");
                if let Err(e) = files.ensure(&ns).await {
                    warn!(namespace = %ns, error = %e, "cannot make the runner ConfigMap again; the next sandbox Pod of the namespace tries");
                }
            }
        }
    };
    let sweep = async {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        loop {
            every.tick().await;
            sweep_other_versions(&api, &pods).await;
        }
    };
    tokio::join!(watch, sweep);
}

/// Deletes the runner ConfigMaps of other operator versions that no sandbox Pod mounts and that
/// are older than [`SWEEP_EVERY`].
async fn sweep_other_versions(api: &Api<ConfigMap>, pods: &Store<Pod>) {
    // The Pods as the watch has them: the sweep waits for its first list.
    if pods.wait_until_ready().await.is_err() {
        return;
    }
    let list = match api
        .list_metadata(&ListParams::default().labels(&selector()))
        .await
    {
        Ok(list) => list,
        Err(e) => {
            warn!(error = %e, "cannot list the runner's ConfigMaps; other versions' are swept later");
            return;
        }
    };
    let now = jiff::Timestamp::now();
    for cm in list.items {
        let name = cm.name_any();
        let young = cm.metadata.creation_timestamp.as_ref().is_none_or(|t| {
            now.duration_since(t.0)
                < jiff::SignedDuration::try_from(SWEEP_EVERY).unwrap_or_default()
        });
        if name == pod_runner_config_map() || young || pods.state().iter().any(|p| mounts(p, &name))
        {
            continue;
        }
        let Some(ns) = cm.namespace() else { continue };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: cm.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match Api::<ConfigMap>::namespaced(api.clone().into_client(), &ns)
            .delete(&name, &params)
            .await
        {
            Ok(_) => {
                info!(namespace = %ns, configmap = %name, "deleted another version's runner ConfigMap, which no sandbox mounts")
            }
            Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => {}
            Err(e) => {
                warn!(namespace = %ns, configmap = %name, error = %e, "cannot delete another version's runner ConfigMap")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_config_map_holds_both_runners_and_cannot_change() {
        let cm = config_map();
        assert_eq!(cm.name_any(), pod_runner_config_map());
        assert_eq!(cm.immutable, Some(true));
        let data = cm.data.as_ref().unwrap();
        assert_eq!(data.len(), 2);
        for (name, source) in pod_runner_files() {
            assert_eq!(data[name], source);
        }
        assert!(is_ours(&cm));
        let mut edited = cm.clone();
        edited
            .data
            .as_mut()
            .unwrap()
            .insert("runner.py".to_owned(), "print('evil')".to_owned());
        assert!(!is_ours(&edited));
        let mut mutable = cm.clone();
        mutable.immutable = None;
        assert!(!is_ours(&mutable), "one that can be edited in place");
        let mut extra = cm;
        extra.binary_data = Some(BTreeMap::new());
        assert!(!is_ours(&extra));
    }

    #[tokio::test]
    async fn it_is_made_once_per_namespace_and_one_not_ours_is_replaced() {
        use crate::fixtures::{FakeApi, NS};
        let api = FakeApi::start(json!({})).await;
        let files = RunnerFiles::new(api.client.clone());
        // A burst's first sandboxes at once, then one more.
        for made in futures::future::join_all((0..8).map(|_| files.ensure(NS))).await {
            made.unwrap();
        }
        files.ensure(NS).await.unwrap();
        let path = format!("/api/v1/namespaces/{NS}/configmaps");
        assert_eq!(
            api.with(|s| s.requests.clone()),
            [format!("POST {path}")],
            "made once; the other sandboxes ask nothing"
        );
        let made = api.with(|s| s.config_maps[pod_runner_config_map()].clone());
        assert!(is_ours(&serde_json::from_value(made).unwrap()));

        // Someone made one under its name first, with other content: it is replaced.
        let api = FakeApi::start(json!({})).await;
        let mut theirs = serde_json::to_value(config_map()).unwrap();
        theirs["data"]["runner.py"] = json!("print('not the runner')");
        api.with(|s| {
            s.config_maps
                .insert(pod_runner_config_map().to_owned(), theirs)
        });
        let files = RunnerFiles::new(api.client.clone());
        files.ensure(NS).await.unwrap();
        let named = format!("{path}/{}", pod_runner_config_map());
        assert_eq!(
            api.with(|s| s.requests.clone()),
            [
                format!("POST {path}"),
                format!("GET {named}"),
                format!("DELETE {named}"),
                format!("POST {path}"),
            ]
        );
        let made = api.with(|s| s.config_maps[pod_runner_config_map()].clone());
        assert!(is_ours(&serde_json::from_value(made).unwrap()));

        // Found in place as the operator makes it (made by another replica): kept.
        let api = FakeApi::start(json!({})).await;
        api.with(|s| {
            s.config_maps.insert(
                pod_runner_config_map().to_owned(),
                serde_json::to_value(config_map()).unwrap(),
            )
        });
        RunnerFiles::new(api.client.clone())
            .ensure(NS)
            .await
            .unwrap();
        assert_eq!(
            api.with(|s| s.requests.clone()),
            [format!("POST {path}"), format!("GET {named}")]
        );
        // Forgotten (the watch saw it go): asked again.
        assert!(files.forget(NS));
        assert!(!files.is_in_place(NS));
    }

    #[test]
    fn a_pod_mounts_it_read_only_where_the_loader_looks() {
        let (v, m) = (volume(), mount());
        assert_eq!(v.name, m.name);
        assert_eq!(v.config_map.as_ref().unwrap().name, pod_runner_config_map());
        assert_eq!(m.mount_path, POD_RUNNER_DIR);
        assert_eq!(m.read_only, Some(true));
        let pod: Pod = serde_json::from_value(json!({
            "spec": {"containers": [], "volumes": [{"name": "runner", "configMap": {"name": "sandboxrun-runner-0"}}]}
        }))
        .unwrap();
        assert!(mounts(&pod, "sandboxrun-runner-0"));
        assert!(!mounts(&pod, pod_runner_config_map()));
    }
}

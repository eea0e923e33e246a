//! The sandbox Pod: a pure function from a SandboxRun and the operator's configuration. Every
//! isolation invariant of DESIGN.md is set here and asserted field by field in the tests.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerStatus, EmptyDirVolumeSource, EnvVar, ExecAction, Pod,
    PodDNSConfig, PodSecurityContext, PodSpec, Probe, ResourceRequirements, SeccompProfile,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use sandboxrun_api::SandboxRun;
use sandboxrun_core::{CANARY_ENV, FileCaps, IDLE_MARK, Limits, Profile, Tool, pod_runner_argv};

/// Name of the single container of a sandbox Pod.
pub const CONTAINER: &str = "sandbox";
/// Seconds added to the run's timeout for `activeDeadlineSeconds`. The runner enforces the
/// timeout itself from the moment the code starts; the Pod deadline counts from when the kubelet
/// accepts the Pod, so it must leave room for sandbox and interpreter start-up (gVisor: ~1-2 s)
/// and only fires when the runner itself is stuck.
pub const ACTIVE_DEADLINE_GRACE_SECONDS: u32 = 10;

/// The longest a run with `limits` may hold its sandbox: its timeout and its Pod's start-up
/// grace, the Pod's `activeDeadlineSeconds`.
pub fn longest_hold(limits: &Limits) -> std::time::Duration {
    std::time::Duration::from_secs(u64::from(
        limits.timeout_seconds + ACTIVE_DEADLINE_GRACE_SECONDS,
    ))
}
/// The uid and gid sandbox code runs as (the conventional "nonroot" id of distroless images).
pub const SANDBOX_UID: i64 = 65532;
/// Ephemeral storage of a sandbox: only logs are written outside the memory-backed /tmp.
pub const EPHEMERAL_STORAGE: &str = "64Mi";

pub use crate::labels::{LABEL_MANAGED_BY, MANAGER};
/// Label: the SandboxRun a Pod belongs to.
pub const LABEL_RUN: &str = "sandboxrun.dev/run";
/// Label: the agent that asked for the run.
pub const LABEL_AGENT: &str = "sandboxrun.dev/agent";
/// Label: the tool the run uses.
pub const LABEL_TOOL: &str = "sandboxrun.dev/tool";

/// What the operator's configuration contributes to every sandbox Pod.
#[derive(Clone, Debug)]
pub struct SandboxConfig {
    /// RuntimeClass (gVisor by default).
    pub runtime_class: String,
    /// Sandbox image of the `minimal` profile, providing python3; the image of a Pod
    /// ([`sandbox_pod`]).
    pub image: String,
    /// Sandbox image of the `data` profile (empty: none).
    pub data_image: String,
    /// Size limit of the memory-backed /tmp.
    pub tmp_size: String,
    /// Where the sandbox's runner finds the operator's canary (`<ip>:<port>`, canary.rs): it
    /// reads its program only once it cannot reach it. `None`: a sandbox with a network
    /// interface runs nothing.
    pub canary: Option<String>,
}

impl SandboxConfig {
    /// The image of sandboxes of `profile`; `None` when this operator has none.
    pub fn image_for(&self, profile: Profile) -> Option<&str> {
        let image = match profile {
            Profile::Minimal => &self.image,
            Profile::Data => &self.data_image,
        };
        Some(image.as_str()).filter(|i| !i.is_empty())
    }

    /// The settings of a sandbox of `profile`: its image in [`SandboxConfig::image`].
    pub fn for_profile(&self, profile: Profile) -> Option<SandboxConfig> {
        Some(SandboxConfig {
            image: self.image_for(profile)?.to_owned(),
            ..self.clone()
        })
    }
}

/// The sandbox profile of `run` (`minimal` unless its python section says otherwise).
pub fn profile_of(run: &SandboxRun) -> Profile {
    run.spec
        .python
        .as_ref()
        .map(sandboxrun_api::PythonSpec::sandbox_profile)
        .unwrap_or_default()
}

/// 32-bit FNV-1a, as 8 hex digits: a stable suffix that keeps shortened names unique.
pub fn short_hash(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

/// Name of the sandbox Pod of a run: `<run>-sandbox`, or when that exceeds 63 characters (the
/// limit for a Pod's hostname), a prefix of the run name, a hash of the full name and `-sandbox`.
/// Deterministic, so a restarted operator finds the Pod it created.
pub fn pod_name(run_name: &str) -> String {
    let plain = format!("{run_name}-sandbox");
    if plain.len() <= 63 {
        return plain;
    }
    // 63 = prefix (45) + "-" + hash (8) + "-sandbox" (8) + 1 spare; run names are DNS subdomains
    // (ASCII), so byte slicing is safe. Dots and dashes are trimmed so the name stays valid.
    let prefix = run_name[..45].trim_end_matches(['-', '.']);
    format!("{prefix}-{}-sandbox", short_hash(run_name))
}

/// A valid label value for arbitrary text: invalid characters become `_`, at most 63 characters
/// (longer values keep a prefix and a hash), alphanumeric at both ends.
pub fn label_value(raw: &str) -> String {
    let cleaned: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let shortened = if cleaned.len() > 63 {
        format!("{}-{}", &cleaned[..54], short_hash(raw))
    } else {
        cleaned
    };
    let trimmed = shortened.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() {
        "unknown".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// The labels of a run's sandbox Pod.
pub fn labels(run: &SandboxRun, tool: Tool) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), MANAGER.to_owned()),
        (LABEL_RUN.to_owned(), label_value(&run.name_any())),
        (LABEL_AGENT.to_owned(), label_value(&run.spec.agent)),
        (LABEL_TOOL.to_owned(), tool.as_str().to_owned()),
    ])
}

/// The owner reference that ties the Pod to its run: garbage collection deletes the Pod with
/// the run, and the run cannot disappear from a foreground deletion before the Pod is gone.
pub fn owner_reference(run: &SandboxRun) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: SandboxRun::api_version(&()).into_owned(),
        kind: SandboxRun::kind(&()).into_owned(),
        name: run.metadata.name.clone()?,
        uid: run.metadata.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// Whether `pod` is this run's own: its controller is the run, by uid. A Pod with the run's
/// name but another owner was made for an earlier run of the same name (deleted and created
/// again): its output is not this run's.
pub fn belongs_to(pod: &k8s_openapi::api::core::v1::Pod, run: &SandboxRun) -> bool {
    let Some(uid) = run.metadata.uid.as_deref() else {
        return false;
    };
    controlling_run(pod).is_some_and(|owner| owner.uid == uid)
}

/// The owner reference of the SandboxRun that controls `pod`, if a run does (a pool's Pod has
/// none: its controller is the pool). An object has at most one controller.
pub fn controlling_run(pod: &k8s_openapi::api::core::v1::Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == SandboxRun::kind(&()))
}

/// Why a Pod cannot be built for a run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BuildError {
    /// The run has no python section.
    #[error("the run has no python code")]
    NotPython,
    /// The run lacks a name, namespace or uid (it was not read from the API server).
    #[error("the run has no name, namespace or uid")]
    Unidentified,
    /// The operator has no image for the run's profile.
    #[error("the operator has no image for the {0} profile")]
    ProfileUnavailable(Profile),
}

/// Annotation of the sandbox Pod with the limits it was built with (JSON): policy can lower the
/// requested limits, and later reconciliations read the effective ones back from here.
pub const LIMITS_ANNOTATION: &str = "sandboxrun.dev/limits";

/// Annotation of the sandbox Pod with the caps on the files it returns (JSON [`FileCaps`]), from
/// the policy decision: the program frame carries them to the runner, and the result is checked
/// against them again, also by an operator that restarted in between.
pub const FILE_CAPS_ANNOTATION: &str = "sandboxrun.dev/file-caps";

/// The sandbox Pod of a Python run, with the limits the run asks for.
#[cfg(test)]
pub fn build(run: &SandboxRun, config: &SandboxConfig) -> Result<Pod, BuildError> {
    build_with_limits(
        run,
        config,
        &run.spec.limits.effective(),
        FileCaps::default(),
    )
}

/// Whether the sandbox of `pod` waits for its program on stdin (every Pod this operator builds;
/// not those of an operator from before, whose code was in the command line).
pub fn takes_program_on_stdin(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER))
        .is_some_and(|c| c.stdin == Some(true) && c.stdin_once == Some(true))
}

/// The limits a sandbox Pod was built with, from its annotation.
pub fn limits_of(pod: &Pod) -> Option<Limits> {
    let raw = pod.metadata.annotations.as_ref()?.get(LIMITS_ANNOTATION)?;
    serde_json::from_str::<Limits>(raw)
        .ok()
        .map(|l| l.clamped())
}

/// The caps on returned files a sandbox Pod was told, from its annotation.
pub fn file_caps_of(pod: &Pod) -> Option<FileCaps> {
    let raw = pod
        .metadata
        .annotations
        .as_ref()?
        .get(FILE_CAPS_ANNOTATION)?;
    serde_json::from_str::<FileCaps>(raw)
        .ok()
        .map(FileCaps::clamped)
}

/// The [`FILE_CAPS_ANNOTATION`] of a Pod whose run may return files within `caps`.
pub fn file_caps_annotation(caps: FileCaps) -> BTreeMap<String, String> {
    serde_json::to_string(&caps.clamped())
        .ok()
        .map(|json| BTreeMap::from([(FILE_CAPS_ANNOTATION.to_owned(), json)]))
        .unwrap_or_default()
}

/// The sandbox Pod of a Python run, with `limits` (the run's, as lowered by policy) and the caps
/// on the files it returns (the policy rule's), in the image of the run's profile.
pub fn build_with_limits(
    run: &SandboxRun,
    config: &SandboxConfig,
    limits: &Limits,
    files: FileCaps,
) -> Result<Pod, BuildError> {
    // The code is not in the Pod: the operator sends it to the runner's stdin (feed.rs), with
    // the input files.
    run.spec.python.as_ref().ok_or(BuildError::NotPython)?;
    let profile = profile_of(run);
    let config = config
        .for_profile(profile)
        .ok_or(BuildError::ProfileUnavailable(profile))?;
    let owner = owner_reference(run).ok_or(BuildError::Unidentified)?;
    let namespace = run.namespace().ok_or(BuildError::Unidentified)?;
    let limits: Limits = limits.clamped();
    let mut annotations = limits_annotation(&limits);
    annotations.extend(file_caps_annotation(files));
    let metadata = ObjectMeta {
        name: Some(pod_name(&run.name_any())),
        namespace: Some(namespace),
        labels: Some(labels(run, Tool::Python)),
        annotations: Some(annotations),
        owner_references: Some(vec![owner]),
        ..Default::default()
    };
    let deadline = i64::try_from(longest_hold(&limits).as_secs()).unwrap_or(i64::MAX);
    Ok(sandbox_pod(
        metadata,
        &config,
        profile,
        &limits,
        deadline,
        &limits.cpu,
    ))
}

/// The [`LIMITS_ANNOTATION`] of a Pod built with `limits`.
pub fn limits_annotation(limits: &Limits) -> BTreeMap<String, String> {
    serde_json::to_string(limits)
        .ok()
        .map(|json| BTreeMap::from([(LIMITS_ANNOTATION.to_owned(), json)]))
        .unwrap_or_default()
}

/// The startup probe of a pool's sandbox whose runner preloads: the container counts as started
/// (and the Pod as ready) once the runner has marked itself idle, its imports done
/// ([`IDLE_MARK`]); before, a claimed sandbox would make its run wait for the imports (seconds
/// under gVisor). A run's own Pod has none: its program comes during the imports. `test` is
/// coreutils' (both images are Debian); one exec a second until the mark is there, none after.
/// It never fails the container: it gives up only after `deadline_seconds`, the Pod's own hard
/// bound (a sandbox that never finishes its imports is replaced by its pool after maxIdleSeconds;
/// one a run took meanwhile runs its program, which its runner read beside the imports).
pub fn idle_probe(deadline_seconds: i64) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![
                "/usr/bin/test".to_owned(),
                "-e".to_owned(),
                IDLE_MARK.to_owned(),
            ]),
        }),
        period_seconds: Some(1),
        timeout_seconds: Some(5),
        failure_threshold: Some(i32::try_from(deadline_seconds + 60).unwrap_or(i32::MAX)),
        ..Default::default()
    }
}

/// The status of `pod`'s sandbox container ([`CONTAINER`]), once the kubelet reports it.
pub fn sandbox_container(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == CONTAINER)
}

/// A sandbox Pod with `metadata`: every isolation setting, the runner waiting for its program on
/// stdin, and `active_deadline_seconds` as its hard bound. Cold Pods (a run's) and warm ones (a
/// pool's) are built here alike, so a warm sandbox is isolated exactly as a cold one.
pub fn sandbox_pod(
    metadata: ObjectMeta,
    config: &SandboxConfig,
    profile: Profile,
    limits: &Limits,
    active_deadline_seconds: i64,
    cpu_request: &str,
) -> Pod {
    let resources = BTreeMap::from([
        ("cpu".to_owned(), Quantity(limits.cpu.clone())),
        ("memory".to_owned(), Quantity(limits.memory.clone())),
        (
            "ephemeral-storage".to_owned(),
            Quantity(EPHEMERAL_STORAGE.to_owned()),
        ),
    ]);

    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(config.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        // No shell parses anything, and the code is not here: the runner waits for it on stdin,
        // which the operator writes once over the Pod's attach stream (stdinOnce closes it when
        // that session ends, so nobody can send a second program).
        command: Some(pod_runner_argv(limits, profile)),
        stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        // The one variable: where the network barrier is proven before the program is read.
        // The runner passes nothing of its environment to the code.
        env: config.canary.as_ref().map(|canary| {
            vec![EnvVar {
                name: CANARY_ENV.to_owned(),
                value: Some(canary.clone()),
                value_from: None,
            }]
        }),
        working_dir: Some("/tmp".to_owned()),
        resources: Some(ResourceRequirements {
            // requests = limits (a run's own Pod is Guaranteed QoS and never overcommits the
            // node), but for the CPU a warm sandbox reserves while it idles (pool.rs).
            requests: Some({
                let mut requests = resources.clone();
                requests.insert("cpu".to_owned(), Quantity(cpu_request.to_owned()));
                requests
            }),
            limits: Some(resources),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(SANDBOX_UID),
            run_as_group: Some(SANDBOX_UID),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "tmp".to_owned(),
                mount_path: "/tmp".to_owned(),
                ..Default::default()
            },
            crate::runner_files::mount(),
        ]),
        ..Default::default()
    };

    Pod {
        metadata,
        spec: Some(PodSpec {
            runtime_class_name: Some(config.runtime_class.clone()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            restart_policy: Some("Never".to_owned()),
            active_deadline_seconds: Some(active_deadline_seconds),
            // Nothing to shut down cleanly: the result is read before the Pod is deleted.
            termination_grace_period_seconds: Some(1),
            host_network: Some(false),
            host_pid: Some(false),
            host_ipc: Some(false),
            share_process_namespace: Some(false),
            // No cluster DNS: the sandbox has no network, and the search list would reveal the
            // namespace and cluster domain.
            dns_policy: Some("None".to_owned()),
            dns_config: Some(PodDNSConfig {
                nameservers: Some(vec!["127.0.0.1".to_owned()]),
                ..Default::default()
            }),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(SANDBOX_UID),
                run_as_group: Some(SANDBOX_UID),
                fs_group: Some(SANDBOX_UID),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_owned(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            containers: vec![container],
            volumes: Some(vec![
                Volume {
                    name: "tmp".to_owned(),
                    // Memory-backed: the root is read-only and nothing may reach the node's
                    // disk. tmpfs pages count against the container's memory limit.
                    empty_dir: Some(EmptyDirVolumeSource {
                        medium: Some("Memory".to_owned()),
                        size_limit: Some(Quantity(config.tmp_size.clone())),
                    }),
                    ..Default::default()
                },
                // The runner the command line loads (its hash is in the command line).
                crate::runner_files::volume(),
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxrun_api::{LimitsSpec, PythonSpec, SandboxRunSpec, SqlSpec};
    use sandboxrun_core::pod_runner_argv;

    fn config() -> SandboxConfig {
        SandboxConfig {
            runtime_class: "gvisor".into(),
            image: "localhost/sandboxrun/sandbox-python:dev".into(),
            data_image: "localhost/sandboxrun/sandbox-python-data:dev".into(),
            tmp_size: "16Mi".into(),
            canary: Some("10.244.0.7:8081".into()),
        }
    }

    fn run() -> SandboxRun {
        let mut run = SandboxRun::new(
            "hello",
            SandboxRunSpec {
                agent: "analyst@example.com".into(),
                environment: Default::default(),
                python: Some(PythonSpec {
                    code: "print('hi'); import os".into(),
                    ..Default::default()
                }),
                sql: None,
                metrics: None,
                limits: LimitsSpec {
                    timeout_seconds: 5,
                    cpu: "250m".into(),
                    memory: "128Mi".into(),
                    pids: 32,
                    output_bytes: 1000,
                },
                ttl_seconds_after_finished: 30,
                approval: None,
                cancelled: false,
            },
        );
        run.metadata.namespace = Some("sandboxrun-runs".into());
        run.metadata.uid = Some("0b5f6c1e-uid".into());
        run
    }

    #[test]
    fn metadata_names_labels_and_owner() {
        let pod = build(&run(), &config()).unwrap();
        let m = &pod.metadata;
        assert_eq!(m.name.as_deref(), Some("hello-sandbox"));
        assert_eq!(m.namespace.as_deref(), Some("sandboxrun-runs"));
        let labels = m.labels.as_ref().unwrap();
        assert_eq!(
            labels["app.kubernetes.io/managed-by"],
            "sandboxrun-operator"
        );
        assert_eq!(labels["sandboxrun.dev/run"], "hello");
        assert_eq!(labels["sandboxrun.dev/agent"], "analyst_example.com");
        assert_eq!(labels["sandboxrun.dev/tool"], "python");
        let owners = m.owner_references.as_ref().unwrap();
        assert_eq!(owners.len(), 1);
        let o = &owners[0];
        assert_eq!(o.api_version, "sandboxrun.dev/v1alpha1");
        assert_eq!(o.kind, "SandboxRun");
        assert_eq!(o.name, "hello");
        assert_eq!(o.uid, "0b5f6c1e-uid");
        assert_eq!(o.controller, Some(true));
        assert_eq!(o.block_owner_deletion, Some(true));
    }

    #[test]
    fn pod_spec_isolation() {
        let pod = build(&run(), &config()).unwrap();
        let s = pod.spec.unwrap();
        assert_eq!(s.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(s.automount_service_account_token, Some(false));
        assert_eq!(s.enable_service_links, Some(false));
        assert_eq!(s.restart_policy.as_deref(), Some("Never"));
        assert_eq!(s.active_deadline_seconds, Some(5 + 10));
        assert_eq!(s.host_network, Some(false));
        assert_eq!(s.host_pid, Some(false));
        assert_eq!(s.host_ipc, Some(false));
        assert_eq!(s.share_process_namespace, Some(false));
        assert_eq!(s.dns_policy.as_deref(), Some("None"));
        assert_eq!(s.service_account_name, None);
        assert_eq!(s.node_name, None);
        let psc = s.security_context.unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.run_as_user, Some(65532));
        assert_eq!(psc.run_as_group, Some(65532));
        assert_eq!(psc.fs_group, Some(65532));
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let volumes = s.volumes.unwrap();
        assert_eq!(volumes.len(), 2);
        // The runner's files, besides /tmp: nothing else from outside the image.
        assert_eq!(volumes[1], crate::runner_files::volume());
        let tmp = volumes[0].empty_dir.as_ref().unwrap();
        assert_eq!(volumes[0].name, "tmp");
        assert_eq!(tmp.medium.as_deref(), Some("Memory"));
        assert_eq!(tmp.size_limit, Some(Quantity("16Mi".into())));
        assert!(volumes[0].host_path.is_none());
        assert_eq!(s.containers.len(), 1);
        assert!(s.init_containers.is_none());
    }

    #[test]
    fn container_isolation_resources_and_command() {
        let pod = build(&run(), &config()).unwrap();
        let spec = serde_json::to_string(&pod).unwrap();
        let c = &pod.spec.unwrap().containers[0];
        assert_eq!(c.name, "sandbox");
        assert_eq!(
            c.image.as_deref(),
            Some("localhost/sandboxrun/sandbox-python:dev")
        );
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.privileged, Some(false));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.run_as_user, Some(65532));
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_owned()][..]));
        assert_eq!(caps.add, None);
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");

        let r = c.resources.as_ref().unwrap();
        assert_eq!(r.requests, r.limits);
        let limits = r.limits.as_ref().unwrap();
        assert_eq!(limits["cpu"], Quantity("250m".into()));
        assert_eq!(limits["memory"], Quantity("128Mi".into()));
        assert_eq!(limits["ephemeral-storage"], Quantity("64Mi".into()));

        let mounts = c.volume_mounts.as_ref().unwrap();
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].mount_path, "/tmp");
        assert_eq!(mounts[0].name, "tmp");
        assert_eq!(mounts[1], crate::runner_files::mount());

        // No shell: python3 runs the runner directly; the code is nowhere in the Pod (it comes
        // on stdin, once).
        let cmd = c.command.as_ref().unwrap();
        assert_eq!(cmd[..4], ["python3", "-I", "-S", "-c"]);
        assert_eq!(
            cmd[4],
            pod_runner_argv(&Limits::default(), Profile::Minimal)[4]
        );
        assert_eq!(cmd[5..], ["1000", "32", "5"]);
        assert_eq!(
            (c.stdin, c.stdin_once, c.tty),
            (Some(true), Some(true), Some(false))
        );
        assert!(!spec.contains("print('hi'); import os"), "{spec}");
        assert!(c.args.is_none());
        // The canary's address, and nothing else, from nowhere else.
        let env = c.env.as_ref().unwrap();
        assert_eq!(env.len(), 1);
        assert_eq!(env[0].name, "SANDBOXRUN_CANARY");
        assert_eq!(env[0].value.as_deref(), Some("10.244.0.7:8081"));
        assert!(env[0].value_from.is_none());
        assert!(c.env_from.is_none());
        assert!(c.ports.is_none());
    }

    fn image_of(pod: &Pod) -> Option<String> {
        pod.spec.as_ref()?.containers[0].image.clone()
    }

    #[test]
    fn the_image_is_the_profiles() {
        let minimal = build(&run(), &config()).unwrap();
        assert_eq!(
            image_of(&minimal).as_deref(),
            Some("localhost/sandboxrun/sandbox-python:dev")
        );
        let mut data = run();
        data.spec.python.as_mut().unwrap().profile = Some(Profile::Data);
        let pod = build(&data, &config()).unwrap();
        assert_eq!(
            image_of(&pod).as_deref(),
            Some("localhost/sandboxrun/sandbox-python-data:dev")
        );
        // Isolated alike: only the image differs, and the runner's last argument, the
        // libraries it imports while it waits.
        let mut same = pod.clone();
        let container = &mut same.spec.as_mut().unwrap().containers[0];
        container.image = image_of(&minimal);
        let preload = container.command.as_mut().unwrap().pop();
        assert_eq!(
            preload.as_deref(),
            Some("numpy,pandas,matplotlib,matplotlib.pyplot,scipy")
        );
        assert_eq!(same, minimal);
        // Without an image for the profile, no Pod.
        let none = SandboxConfig {
            data_image: String::new(),
            ..config()
        };
        assert_eq!(
            build(&data, &none),
            Err(BuildError::ProfileUnavailable(Profile::Data))
        );
        assert!(build(&run(), &none).is_ok());
    }

    #[test]
    fn without_a_canary_the_pod_names_none() {
        // The runner of a sandbox with a network interface then runs nothing (runner.py).
        let config = SandboxConfig {
            canary: None,
            ..config()
        };
        let pod = build(&run(), &config).unwrap();
        assert!(pod.spec.unwrap().containers[0].env.is_none());
    }

    #[test]
    fn the_file_caps_are_recorded_on_the_pod() {
        let caps = FileCaps {
            max_files: 3,
            max_bytes: 1000,
        };
        let pod =
            build_with_limits(&run(), &config(), &run().spec.limits.effective(), caps).unwrap();
        assert_eq!(file_caps_of(&pod), Some(caps));
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap()[FILE_CAPS_ANNOTATION],
            r#"{"maxFiles":3,"maxBytes":1000}"#
        );
        assert_eq!(limits_of(&pod), Some(run().spec.limits.effective()));
        // Never above the global caps, whatever the annotation says.
        let mut forged = pod.clone();
        forged.metadata.annotations.as_mut().unwrap().insert(
            FILE_CAPS_ANNOTATION.to_owned(),
            r#"{"maxFiles":1000,"maxBytes":99999999}"#.to_owned(),
        );
        assert_eq!(file_caps_of(&forged), Some(FileCaps::default()));
        forged.metadata.annotations = None;
        assert_eq!(file_caps_of(&forged), None);
    }

    #[test]
    fn tool_other_than_python_builds_no_pod() {
        let mut r = run();
        r.spec.python = None;
        r.spec.sql = Some(SqlSpec {
            database: "db".into(),
            query: "select 1".into(),
            schema: false,
        });
        assert_eq!(build(&r, &config()), Err(BuildError::NotPython));
        let mut r = run();
        r.metadata.uid = None;
        assert_eq!(build(&r, &config()), Err(BuildError::Unidentified));
    }

    #[test]
    fn long_run_names_give_valid_distinct_pod_names() {
        assert_eq!(pod_name("a"), "a-sandbox");
        let exact = "x".repeat(55);
        assert_eq!(pod_name(&exact).len(), 63);
        let a = pod_name(&format!("{}-a", "y".repeat(100)));
        let b = pod_name(&format!("{}-b", "y".repeat(100)));
        assert_ne!(a, b);
        for n in [&a, &b] {
            assert!(n.len() <= 63, "{n}");
            assert!(n.ends_with("-sandbox"));
        }
        assert_eq!(a, pod_name(&format!("{}-a", "y".repeat(100))));
        let dotted = pod_name(&format!("{}.{}", "z".repeat(44), "w".repeat(40)));
        assert!(!dotted.contains(".-"), "{dotted}");
    }

    #[test]
    fn label_values_are_always_valid() {
        assert_eq!(label_value("analyst-01"), "analyst-01");
        assert_eq!(label_value("a b/c"), "a_b_c");
        assert_eq!(label_value("--x--"), "x");
        assert_eq!(label_value("@@@"), "unknown");
        assert_eq!(label_value(""), "unknown");
        let long = label_value(&"é".repeat(100));
        assert!(long.len() <= 63);
        let v = label_value(&"a".repeat(200));
        assert!(v.len() <= 63);
        assert!(
            v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        );
    }
}

//! The chart's sandbox Pod policy (templates/sandbox-pod-policy.yaml, a ValidatingAdmissionPolicy)
//! on the installation from e2e/install.sh: in the sandbox namespace only the operator's service
//! account creates Pods, only with the sandbox invariants, and nobody adds ephemeral containers.
//!
//! The namespace also enforces the restricted Pod Security profile, which runs first and refuses
//! some of the same Pods. To see each rule of the policy refuse on its own, one test binds the
//! chart's own policy object to a namespace of its own without Pod Security and tries one
//! violation at a time there, as the operator (a TokenRequest token); the same violations are
//! then refused in the sandbox namespace too. Writes that must be refused use server-side dry-run,
//! so a policy that failed to refuse leaves nothing behind.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use sandboxrun_api::SandboxPath;
use sandboxrun_core::Phase;
use sandboxrun_e2e::identity::{client_as, whoami};
use sandboxrun_e2e::pools::{TestPool, kubectl, pools};
use sandboxrun_e2e::runs::{RUNS_NAMESPACE, SYSTEM_NAMESPACE, create, wait_terminal};
use sandboxrun_e2e::{SANDBOX_IMAGE, TestNamespace, client, unique_name};
use serde_json::{Value, json};

/// The chart's policy for release `sandboxrun` (`<release>-operator-sandbox-pods`).
const POLICY: &str = "sandboxrun-operator-sandbox-pods";
const OPERATOR_SA: &str = "sandboxrun-operator";
/// The operator's runtime class in the e2e install (`sandbox.runtimeClassName`).
const RUNTIME_CLASS: &str = "gvisor";

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

async fn as_operator(admin: &Client) -> Result<Client> {
    client_as(admin, SYSTEM_NAMESPACE, OPERATOR_SA).await
}

/// A Pod exactly as the operator builds a warm pool's (operator/src/python/pod.rs): every
/// invariant the policy checks holds. Its owner is a pool that does not exist (the garbage
/// collector removes such a Pod if it is ever created for real).
fn compliant(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/managed-by": "sandboxrun-operator",
                "sandboxrun.dev/pool": "e2e-pod-policy",
                "sandboxrun.dev/profile": "00000000",
                "sandboxrun.dev/tool": "python",
            },
            "ownerReferences": [{
                "apiVersion": "sandboxrun.dev/v1alpha1", "kind": "SandboxPool",
                "name": "e2e-pod-policy", "uid": "00000000-0000-4000-8000-000000000000",
                "controller": true,
            }],
        },
        "spec": {
            "runtimeClassName": RUNTIME_CLASS,
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": 60,
            "terminationGracePeriodSeconds": 1,
            "hostNetwork": false, "hostPID": false, "hostIPC": false,
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
                "seccompProfile": { "type": "RuntimeDefault" },
            },
            "containers": [{
                "name": "sandbox",
                "image": SANDBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-c", "import time; time.sleep(60)"],
                "resources": {
                    "requests": { "cpu": "100m", "memory": "64Mi" },
                    "limits": { "cpu": "100m", "memory": "64Mi" },
                },
                "securityContext": {
                    "allowPrivilegeEscalation": false, "privileged": false,
                    "readOnlyRootFilesystem": true, "runAsNonRoot": true,
                    "runAsUser": 65532, "runAsGroup": 65532,
                    "capabilities": { "drop": ["ALL"] },
                    "seccompProfile": { "type": "RuntimeDefault" },
                },
                "volumeMounts": [{ "name": "tmp", "mountPath": "/tmp" }],
            }],
            "volumes": [
                { "name": "tmp", "emptyDir": { "medium": "Memory", "sizeLimit": "16Mi" } },
                // The runner's files (operator/src/runner_files.rs), as every sandbox mounts them.
                { "name": "runner", "configMap": { "name": "sandboxrun-runner-0123456789abcdef" } },
            ],
        }
    })
}

fn pod(value: Value) -> Pod {
    serde_json::from_value(value).expect("test pod manifest is valid")
}

/// The container of a Pod manifest, to change.
fn container(p: &mut Value) -> &mut Value {
    &mut p["spec"]["containers"][0]
}

fn container_sc(p: &mut Value) -> &mut serde_json::Map<String, Value> {
    container(p)["securityContext"].as_object_mut().unwrap()
}

fn pod_sc(p: &mut Value) -> &mut serde_json::Map<String, Value> {
    p["spec"]["securityContext"].as_object_mut().unwrap()
}

/// One violation of one invariant: what to change in a compliant Pod, the policy's message, and
/// whether the restricted Pod Security profile refuses it as well (it runs first in the sandbox
/// namespace, so there its message may come instead).
struct Violation {
    what: &'static str,
    change: Box<dyn Fn(&mut Value)>,
    message: String,
    pod_security_too: bool,
}

fn violation(
    what: &'static str,
    message: &str,
    pod_security_too: bool,
    change: impl Fn(&mut Value) + 'static,
) -> Violation {
    Violation {
        what,
        change: Box::new(change),
        message: message.to_owned(),
        pod_security_too,
    }
}

fn violations(unlisted_class: &str) -> Vec<Violation> {
    let unlisted = unlisted_class.to_owned();
    vec![
        violation(
            "no runtime class",
            "spec.runtimeClassName unset is not allowed for sandbox Pods",
            false,
            |p| {
                p["spec"]
                    .as_object_mut()
                    .unwrap()
                    .remove("runtimeClassName");
            },
        ),
        violation(
            "a runc runtime class that is not in the allowed list",
            &format!("spec.runtimeClassName '{unlisted_class}' is not allowed for sandbox Pods"),
            false,
            move |p| p["spec"]["runtimeClassName"] = json!(unlisted),
        ),
        violation(
            "the service account token mounted (automountServiceAccountToken unset)",
            "sandbox Pods must set automountServiceAccountToken: false",
            false,
            |p| {
                p["spec"]
                    .as_object_mut()
                    .unwrap()
                    .remove("automountServiceAccountToken");
            },
        ),
        violation(
            "the service account token mounted (automountServiceAccountToken: true)",
            "sandbox Pods must set automountServiceAccountToken: false",
            false,
            |p| p["spec"]["automountServiceAccountToken"] = json!(true),
        ),
        violation(
            "hostNetwork",
            "sandbox Pods may not use the node's network, PID or IPC namespace",
            true,
            |p| p["spec"]["hostNetwork"] = json!(true),
        ),
        violation(
            "hostPID",
            "sandbox Pods may not use the node's network, PID or IPC namespace",
            true,
            |p| p["spec"]["hostPID"] = json!(true),
        ),
        violation(
            "hostIPC",
            "sandbox Pods may not use the node's network, PID or IPC namespace",
            true,
            |p| p["spec"]["hostIPC"] = json!(true),
        ),
        violation(
            "a hostPath volume",
            "volume node not emptyDir: sandbox Pods mount only emptyDir volumes",
            true,
            |p| {
                p["spec"]["volumes"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "node", "hostPath": {"path": "/"}}))
            },
        ),
        violation(
            "a Secret volume",
            "volume creds not emptyDir: sandbox Pods mount only emptyDir volumes",
            false,
            |p| {
                p["spec"]["volumes"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "creds", "secret": {"secretName": "anything"}}))
            },
        ),
        violation(
            "a ConfigMap volume other than the runner's",
            "volume settings not emptyDir: sandbox Pods mount only emptyDir volumes and the operator ConfigMap sandboxrun-runner-*",
            false,
            |p| {
                p["spec"]["volumes"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "settings", "configMap": {"name": "sandboxrun-settings"}}))
            },
        ),
        violation(
            "privilege escalation allowed",
            "container sandbox must set securityContext.allowPrivilegeEscalation: false",
            true,
            |p| {
                container_sc(p).remove("allowPrivilegeEscalation");
            },
        ),
        violation(
            "privileged",
            "container sandbox may not be privileged",
            true,
            |p| {
                container_sc(p).insert("privileged".into(), json!(true));
            },
        ),
        violation(
            "an added capability (NET_BIND_SERVICE, which Pod Security allows)",
            "container sandbox must drop ALL capabilities and add none",
            false,
            |p| {
                container_sc(p).insert(
                    "capabilities".into(),
                    json!({"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}),
                );
            },
        ),
        violation(
            "capabilities not dropped",
            "container sandbox must drop ALL capabilities and add none",
            true,
            |p| {
                container_sc(p).remove("capabilities");
            },
        ),
        violation(
            "runAsNonRoot missing (Pod and container)",
            "container sandbox must set runAsNonRoot: true",
            true,
            |p| {
                container_sc(p).remove("runAsNonRoot");
                pod_sc(p).remove("runAsNonRoot");
            },
        ),
        violation(
            "runAsNonRoot false in the container under a Pod that says true",
            "container sandbox must set runAsNonRoot: true",
            true,
            |p| {
                container_sc(p).insert("runAsNonRoot".into(), json!(false));
            },
        ),
        violation(
            "a writable root file system",
            "container sandbox must set securityContext.readOnlyRootFilesystem: true",
            false,
            |p| {
                container_sc(p).remove("readOnlyRootFilesystem");
            },
        ),
        violation(
            "an init container with a writable root file system",
            "container setup must set securityContext.readOnlyRootFilesystem: true",
            false,
            |p| {
                let mut init = container(p).clone();
                init["name"] = json!("setup");
                init["securityContext"]["readOnlyRootFilesystem"] = json!(false);
                p["spec"]["initContainers"] = json!([init]);
            },
        ),
        violation(
            "no seccomp profile (Pod and container)",
            "container sandbox must run with the RuntimeDefault or a Localhost seccomp profile",
            true,
            |p| {
                container_sc(p).remove("seccompProfile");
                pod_sc(p).remove("seccompProfile");
            },
        ),
        violation(
            "an Unconfined seccomp profile in the container",
            "container sandbox must run with the RuntimeDefault or a Localhost seccomp profile",
            true,
            |p| {
                container_sc(p).insert("seccompProfile".into(), json!({"type": "Unconfined"}));
            },
        ),
        violation(
            "not the operator's labels",
            "sandbox Pods carry the operator's labels",
            false,
            |p| p["metadata"]["labels"] = json!({"app": "mine"}),
        ),
        violation(
            "another owner than a SandboxRun, SandboxPool or SandboxSession",
            "a sandbox Pod is created with its SandboxRun, SandboxPool or SandboxSession as controller",
            false,
            |p| {
                p["metadata"]["ownerReferences"] = json!([{
                    "apiVersion": "v1", "kind": "ConfigMap", "name": "x",
                    "uid": "00000000-0000-4000-8000-000000000001", "controller": true,
                }])
            },
        ),
    ]
}

/// The message of a refused write (any status), or why it was not refused.
fn refusal<T>(result: Result<T, kube::Error>, what: &str) -> Result<String> {
    match result {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => Ok(e.message.clone()),
        Err(e) => bail!("{what}: expected a refusal, got error {e}"),
        Ok(_) => bail!("{what}: expected a refusal, but it was admitted"),
    }
}

/// Passes when the policy itself refused the write, with `message`.
fn refused_by_policy<T>(result: Result<T, kube::Error>, what: &str, message: &str) -> Result<()> {
    let got = refusal(result, what)?;
    ensure!(
        got.contains(&format!("ValidatingAdmissionPolicy '{POLICY}'")) && got.contains(message),
        "{what}: expected the sandbox Pod policy to refuse with {message:?}, got: {got}"
    );
    Ok(())
}

/// Cluster-scoped objects a test made, deleted when it ends, also when it fails.
struct Cleanup(Vec<(&'static str, String)>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let objects = std::mem::take(&mut self.0);
        let done = std::thread::spawn(move || -> Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let client = client().await?;
                for (kind, name) in objects {
                    let dp = DeleteParams::background();
                    let res = match kind {
                        "binding" => Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
                            .delete(&name, &dp)
                            .await
                            .map(|_| ()),
                        "runtimeclass" => Api::<RuntimeClass>::all(client.clone())
                            .delete(&name, &dp)
                            .await
                            .map(|_| ()),
                        _ => Ok(()),
                    };
                    if let Err(e) = res {
                        eprintln!("warning: could not delete {kind} {name}: {e}");
                    }
                }
                Ok(())
            })
        });
        if let Ok(Err(e)) = done.join() {
            eprintln!("warning: cleanup failed: {e:#}");
        }
    }
}

/// A namespace without Pod Security to which the chart's policy is bound too, where the
/// operator's service account may create Pods: each rule of the policy is seen refusing alone.
async fn bound_namespace(admin: &Client, cleanup: &mut Cleanup) -> Result<TestNamespace> {
    let ns = TestNamespace::create(admin, "e2e-pod-policy", &[]).await?;
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": { "name": format!("e2e-{}", ns.name) },
        "spec": {
            "policyName": POLICY,
            "validationActions": ["Deny"],
            "matchResources": { "namespaceSelector": { "matchLabels": {
                "kubernetes.io/metadata.name": ns.name,
            } } },
        }
    }))?;
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    cleanup.0.push(("binding", binding.name_any()));
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "e2e-pod-maker" },
        "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "get"] }],
    }))?;
    Api::<Role>::namespaced(admin.clone(), &ns.name)
        .create(&PostParams::default(), &role)
        .await?;
    let rb: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "e2e-pod-maker" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "e2e-pod-maker" },
        "subjects": [{ "kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": SYSTEM_NAMESPACE }],
    }))?;
    Api::<RoleBinding>::namespaced(admin.clone(), &ns.name)
        .create(&PostParams::default(), &rb)
        .await?;
    // A new binding takes effect once the API server's policy informer has it.
    let pods = ns.pods();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match pods
            .create(&dry_run(), &pod(compliant(&unique_name("probe"))))
            .await
        {
            Err(kube::Error::Api(e)) if e.message.contains(POLICY) => return Ok(ns),
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => {
                bail!("the probe was refused by something else: {}", e.message)
            }
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        ensure!(
            Instant::now() < deadline,
            "the test binding of {POLICY} never took effect in {}",
            ns.name
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn each_sandbox_invariant_is_enforced_on_the_operators_own_pods() -> Result<()> {
    let admin = client().await?;
    // The API server type-checks the policy's CEL against the Pod schema: a misspelt field
    // would be a warning here (and an error, so a refusal under failurePolicy Fail, at runtime).
    let policy = Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .get(POLICY)
        .await
        .context("the chart's sandbox Pod policy is not installed")?;
    let warnings = policy
        .status
        .and_then(|s| s.type_checking)
        .and_then(|t| t.expression_warnings)
        .unwrap_or_default();
    ensure!(
        warnings.is_empty(),
        "{POLICY} does not type-check: {warnings:?}"
    );
    let op = as_operator(&admin).await?;
    let mut cleanup = Cleanup(Vec::new());
    // A RuntimeClass with the runc handler that no value allows (CI allows `runc` itself for the
    // NetworkPolicy tests, through sandbox.allowedRuntimeClasses).
    let unlisted = unique_name("e2e-unlisted-runc");
    let rc: RuntimeClass =
        serde_json::from_value(json!({"metadata": {"name": unlisted}, "handler": "runc"}))?;
    Api::<RuntimeClass>::all(admin.clone())
        .create(&PostParams::default(), &rc)
        .await?;
    cleanup.0.push(("runtimeclass", unlisted.clone()));
    let ns = bound_namespace(&admin, &mut cleanup).await?;

    for (pods, where_, alone) in [
        (
            Api::<Pod>::namespaced(op.clone(), &ns.name),
            "without Pod Security",
            true,
        ),
        (
            Api::<Pod>::namespaced(op.clone(), RUNS_NAMESPACE),
            "in the sandbox namespace",
            false,
        ),
    ] {
        // The control: the operator's own shape is admitted, so each refusal below is the
        // one change's.
        pods.create(&dry_run(), &pod(compliant(&unique_name("compliant"))))
            .await
            .with_context(|| format!("{where_}: a compliant operator Pod was refused"))?;
        for v in violations(&unlisted) {
            let mut manifest = compliant(&unique_name("violation"));
            (v.change)(&mut manifest);
            let what = format!("{where_}: the operator's Pod with {}", v.what);
            let result = pods.create(&dry_run(), &pod(manifest)).await;
            if v.what == "privileged" {
                // The API server refuses privileged containers itself unless started with
                // --allow-privileged (the local cluster is not; kubeadm and most managed
                // clusters are): then the policy's rule is what refuses them.
                let got = refusal(result, &what)?;
                ensure!(
                    got.contains(&v.message)
                        || got.contains("privileged: Forbidden: disallowed by cluster policy")
                        || (!alone && got.contains("violates PodSecurity")),
                    "{what}: {got}"
                );
            } else if alone || !v.pod_security_too {
                refused_by_policy(result, &what, &v.message)?;
            } else {
                // Pod Security runs first here; either refusal is a refusal.
                let got = refusal(result, &what)?;
                ensure!(
                    got.contains(&v.message) || got.contains("violates PodSecurity \"restricted"),
                    "{what}: {got}"
                );
            }
        }
    }

    // A fully compliant Pod is admitted for real (and deleted again).
    let pods = Api::<Pod>::namespaced(op.clone(), &ns.name);
    let name = unique_name("compliant");
    pods.create(&PostParams::default(), &pod(compliant(&name)))
        .await
        .context("a compliant Pod created by the operator was refused")?;
    // Its owner is made up, so the garbage collector may remove it first: gone is gone.
    match pods.delete(&name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

#[tokio::test]
async fn nobody_but_the_operator_creates_pods_in_the_sandbox_namespace() -> Result<()> {
    let admin = client().await?;
    let me = whoami(&admin).await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), RUNS_NAMESPACE);
    // The cluster admin, with a Pod the operator would be allowed to create.
    refused_by_policy(
        pods.create(&dry_run(), &pod(compliant(&unique_name("by-admin"))))
            .await,
        "a Pod created by the cluster admin",
        &format!("creates Pods in the sandbox namespace, not {me}"),
    )?;
    // The same Pod as the operator is admitted: the identity is what was refused.
    let op = as_operator(&admin).await?;
    Api::<Pod>::namespaced(op, RUNS_NAMESPACE)
        .create(&dry_run(), &pod(compliant(&unique_name("by-operator"))))
        .await
        .context("the operator's own Pod was refused")?;

    // Another controller: a Deployment's ReplicaSet controller gets its Pods refused.
    let mut template = compliant("unused");
    let labels = template["metadata"]["labels"].clone();
    template["metadata"] = json!({ "labels": labels });
    template["spec"]["restartPolicy"] = json!("Always");
    template["spec"]
        .as_object_mut()
        .unwrap()
        .remove("activeDeadlineSeconds");
    let name = unique_name("e2e-policy-deploy");
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "sandboxrun.dev/pool": "e2e-pod-policy" } },
            "template": template,
        }
    }))?;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), RUNS_NAMESPACE);
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    let outcome = async {
        let sets: Api<ReplicaSet> = Api::namespaced(admin.clone(), RUNS_NAMESPACE);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let owned: Vec<ReplicaSet> = sets
                .list(&ListParams::default().labels("sandboxrun.dev/pool=e2e-pod-policy"))
                .await?
                .items
                .into_iter()
                .filter(|rs| {
                    rs.owner_references()
                        .iter()
                        .any(|o| o.kind == "Deployment" && o.name == name)
                })
                .collect();
            for rs in &owned {
                let created = rs.status.as_ref().map_or(0, |s| s.replicas);
                ensure!(
                    created == 0,
                    "the ReplicaSet {} created a Pod",
                    rs.name_any()
                );
                let failure = rs
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .into_iter()
                    .flatten()
                    .find(|c| c.type_ == "ReplicaFailure");
                if let Some(message) = failure.and_then(|c| c.message.clone()) {
                    ensure!(
                        message.contains(POLICY)
                            && message.contains(
                                "not system:serviceaccount:kube-system:replicaset-controller"
                            ),
                        "the ReplicaSet failed otherwise: {message}"
                    );
                    return Ok(());
                }
            }
            ensure!(
                Instant::now() < deadline,
                "no ReplicaFailure on the Deployment's ReplicaSet after 60 s: {owned:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    .await;
    deployments
        .delete(&name, &DeleteParams::foreground())
        .await?;
    outcome
}

#[tokio::test]
async fn a_warm_sandbox_takes_no_debugger_and_no_outside_change_but_is_claimed() -> Result<()> {
    let admin = client().await?;
    let me = whoami(&admin).await?;
    // The operator's pool Pods pass the policy (a pool of this test's own profile).
    let pool = TestPool::create(&admin, "e2e-pool-policy", 53, 1).await?;
    let idle = pool.wait_ready(1).await?;
    let target = idle.first().context("no idle sandbox")?.clone();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), RUNS_NAMESPACE);

    // kubectl debug adds an ephemeral container (the pods/ephemeralcontainers subresource).
    let out = kubectl()
        .args([
            "-n",
            RUNS_NAMESPACE,
            "debug",
            &target,
            "--profile=restricted",
        ])
        .args([
            "--image",
            SANDBOX_IMAGE,
            "-c",
            "e2e-debugger",
            "--",
            "sleep",
            "60",
        ])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success()
            && stderr.contains(POLICY)
            && stderr.contains("ephemeral containers (kubectl debug) cannot be added"),
        "kubectl debug into a sandbox: {} {stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    let now = pods.get(&target).await?;
    ensure!(
        now.spec
            .as_ref()
            .and_then(|s| s.ephemeral_containers.as_ref())
            .is_none(),
        "the sandbox got an ephemeral container"
    );
    // The same through the API, dry-run.
    let debugger = json!({"spec": {"ephemeralContainers": [{
        "name": "e2e-debugger-2", "image": SANDBOX_IMAGE, "command": ["sleep", "60"],
        "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
    }]}});
    refused_by_policy(
        pods.patch_ephemeral_containers(
            &target,
            &PatchParams::default().dry_run(),
            &Patch::Strategic(&debugger),
        )
        .await,
        "an ephemeral container added through the API",
        "ephemeral containers (kubectl debug) cannot be added",
    )?;

    // Anyone but the operator changing a sandbox: refused (here a label that would take it out
    // of its pool).
    refused_by_policy(
        pods.patch(
            &target,
            &PatchParams::default().dry_run(),
            &Patch::Merge(json!({"metadata": {"labels": {"sandboxrun.dev/pool": "elsewhere"}}})),
        )
        .await,
        "a sandbox Pod relabelled by the cluster admin",
        &format!("changes Pods in the sandbox namespace, not {me}"),
    )?;

    // The operator's claim (an update of labels, owner and deadline) still goes through.
    let name = create(&admin, &pool.run("print('claimed')")).await?;
    let run = wait_terminal(&admin, &name, Duration::from_secs(120)).await?;
    let st = run.status.clone().unwrap_or_default();
    ensure!(
        st.phase == Some(Phase::Succeeded)
            && st.path == Some(SandboxPath::Warm)
            && st.stdout.as_deref() == Some("claimed\n"),
        "{st:?}"
    );
    pool.delete().await
}

#[tokio::test]
async fn the_garbage_collector_may_still_orphan_sandboxes() -> Result<()> {
    // `kubectl delete sandboxpool --cascade=orphan`: the garbage collector updates each Pod to
    // remove its owner (sandboxPodPolicy.updaters); were that refused, the pool would hang in
    // deletion with the orphan finalizer.
    let admin = client().await?;
    let pool = TestPool::create(&admin, "e2e-pool-orphan", 54, 1).await?;
    let idle = pool.wait_ready(1).await?;
    let target = idle.first().context("no idle sandbox")?.clone();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), RUNS_NAMESPACE);
    pools(&admin)
        .delete(&pool.name, &DeleteParams::orphan())
        .await?;
    let pool_name = pool.name.clone();
    // Deleted already: its guard must not delete it again.
    std::mem::forget(pool);
    let deadline = Instant::now() + Duration::from_secs(60);
    let outcome = loop {
        let pod = pods.get(&target).await?;
        let gone = pools(&admin).get_opt(&pool_name).await?.is_none();
        if gone && pod.owner_references().is_empty() {
            break Ok(());
        }
        if Instant::now() > deadline {
            break Err(anyhow::anyhow!(
                "after 60 s the pool is {} and the Pod's owners are {:?}",
                if gone { "gone" } else { "still there" },
                pod.owner_references()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    pods.delete(&target, &DeleteParams::background()).await?;
    outcome
}

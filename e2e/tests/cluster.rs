//! The cluster harness itself: what every later test relies on. Each test asserts a real outcome
//! on the cluster in `KUBECONFIG`: gVisor Pods run, have no network, hit their deadline, are
//! garbage-collected, and the restricted Pod Security Standard is enforced.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use sandboxrun_e2e::*;

#[tokio::test]
async fn gvisor_pod_runs_python_and_its_log_is_read_through_the_api() -> Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "e2e-hello", &[]).await?;
    let pods = ns.pods();
    let pod = sandbox_pod("hello", "gvisor", &["python3", "-c", "print(6*7)"]);
    pods.create(&PostParams::default(), &pod).await?;

    let done = wait_finished(&pods, "hello", Duration::from_secs(120)).await?;
    ensure!(
        phase(&done) == "Succeeded",
        "phase {:?}: {:?}",
        phase(&done),
        done.status
    );
    let log = logs(&pods, "hello").await?;
    ensure!(log == "42\n", "log was {log:?}");
    Ok(())
}

/// Accepts connections on a listener the test owns and counts them.
fn counting_listener(addr: SocketAddr) -> Result<(SocketAddr, Arc<AtomicUsize>)> {
    let listener = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if conn.is_ok() {
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    Ok((local, accepted))
}

/// Python run in the Pod: try each target, report what happened, and list the interfaces.
const PROBE: &str = r#"
import json, platform, socket, sys
results = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        results[target] = "connected"
    except OSError as e:
        results[target] = "failed: %s" % e
with open("/proc/net/dev") as f:
    ifaces = sorted(l.split(":")[0].strip() for l in f.readlines()[2:])
print(json.dumps({"results": results, "interfaces": ifaces, "release": platform.release()}))
"#;

async fn run_probe(
    ns: &TestNamespace,
    name: &str,
    runtime_class: &str,
    targets: &[String],
) -> Result<serde_json::Value> {
    let pods = ns.pods();
    let mut command = vec!["python3", "-c", PROBE];
    command.extend(targets.iter().map(String::as_str));
    pods.create(
        &PostParams::default(),
        &sandbox_pod(name, runtime_class, &command),
    )
    .await?;
    let done = wait_finished(&pods, name, Duration::from_secs(120)).await?;
    let log = logs(&pods, name).await?;
    ensure!(
        phase(&done) == "Succeeded",
        "probe {name} ended {}: {log}",
        phase(&done)
    );
    serde_json::from_str(log.trim()).with_context(|| format!("probe output {log:?}"))
}

#[tokio::test]
async fn gvisor_pod_has_no_network_at_all() -> Result<()> {
    let client = client().await?;
    let node_ip = node_internal_ip(&client).await?;
    let ns = TestNamespace::create(&client, "e2e-net", &[]).await?;

    // Listeners this test starts on this machine: on the cluster bridge's host address (where
    // Pod traffic would arrive) and on loopback.
    let (bridge, bridge_hits) = counting_listener(format!("{node_ip}:0").parse()?)?;
    let (lo, lo_hits) = counting_listener("127.0.0.1:0".parse()?)?;
    // The API server, by the address clients in the cluster use (the `kubernetes` Service) and by
    // the address in our kubeconfig.
    let api_url = client_api_authority().await?;
    let targets = vec![
        bridge.to_string(),
        format!("127.0.0.1:{}", lo.port()),
        "kubernetes.default.svc:443".to_owned(),
        "10.96.0.1:443".to_owned(),
        api_url,
    ];

    // Control: a runc Pod reaches the bridge listener, so the listener is reachable and a
    // failure under gVisor means the sandbox blocked it, not that nothing listened.
    let control = run_probe(&ns, "control", "runc", &targets[..1]).await?;
    ensure!(
        control["results"][&targets[0]] == "connected",
        "control runc pod could not reach {}: {control}",
        targets[0]
    );
    let before = bridge_hits.load(Ordering::SeqCst);
    ensure!(before >= 1, "the control connection was not counted");

    let probe = run_probe(&ns, "sandboxed", "gvisor", &targets).await?;
    for target in &targets {
        let outcome = probe["results"][target].as_str().unwrap_or_default();
        ensure!(
            outcome.starts_with("failed"),
            "gVisor pod reached {target}: {probe}"
        );
    }
    ensure!(
        probe["interfaces"] == serde_json::json!(["lo"]),
        "interfaces: {probe}"
    );
    // gVisor reports a kernel release of its own; runc would show the node's.
    let node_kernel = node_kernel_version(&client).await?;
    ensure!(
        probe["release"].as_str().is_some_and(|r| r != node_kernel),
        "not running under gVisor (node kernel {node_kernel}): {probe}"
    );
    ensure!(
        control["release"] == node_kernel.as_str(),
        "runc control saw {control}"
    );
    ensure!(
        bridge_hits.load(Ordering::SeqCst) == before,
        "bridge listener accepted a sandbox connection"
    );
    ensure!(
        lo_hits.load(Ordering::SeqCst) == 0,
        "loopback listener accepted a connection"
    );
    Ok(())
}

/// host:port of the API server as this test's kubeconfig names it.
async fn client_api_authority() -> Result<String> {
    let config = kube::Config::infer().await?;
    let uri = config.cluster_url;
    let host = uri.host().context("API server URL has no host")?;
    Ok(format!("{host}:{}", uri.port_u16().unwrap_or(443)))
}

#[tokio::test]
async fn active_deadline_ends_a_gvisor_sleeper() -> Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "e2e-deadline", &[]).await?;
    let pods = ns.pods();
    let mut pod = sandbox_pod("sleeper", "gvisor", &["sleep", "60"]);
    pod.spec.as_mut().unwrap().active_deadline_seconds = Some(3);
    let created = Instant::now();
    pods.create(&PostParams::default(), &pod).await?;

    let done = wait_finished(&pods, "sleeper", Duration::from_secs(60)).await?;
    let status = done.status.clone().unwrap_or_default();
    ensure!(phase(&done) == "Failed", "phase {:?}", status.phase);
    ensure!(
        status.reason.as_deref() == Some("DeadlineExceeded"),
        "reason {:?}",
        status.reason
    );
    ensure!(
        created.elapsed() < Duration::from_secs(60),
        "took {:?}",
        created.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn garbage_collector_deletes_a_pod_whose_owner_is_gone() -> Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "e2e-gc", &[]).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let owner: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "owner"}}))?;
    let owner = configmaps.create(&PostParams::default(), &owner).await?;

    let pods = ns.pods();
    let mut pod = sandbox_pod("owned", "gvisor", &["sleep", "300"]);
    pod.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: owner.metadata.uid.clone().context("owner has no uid")?,
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
    ]);
    pods.create(&PostParams::default(), &pod).await?;
    ensure!(
        pods.get_opt("owned").await?.is_some(),
        "pod was not created"
    );

    configmaps
        .delete("owner", &DeleteParams::background())
        .await?;
    wait_deleted(&pods, "owned", Duration::from_secs(90)).await
}

#[tokio::test]
async fn restricted_pod_security_admits_only_compliant_pods() -> Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(
        &client,
        "e2e-pss",
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    )
    .await?;
    let pods = ns.pods();

    // Root, privilege escalation allowed, capabilities kept, no seccomp profile: refused.
    let loose = pod(serde_json::json!({
        "metadata": { "name": "loose" },
        "spec": { "containers": [{ "name": "main", "image": SANDBOX_IMAGE, "command": ["true"] }] }
    }));
    let err = pods
        .create(&PostParams::default(), &loose)
        .await
        .expect_err("a pod violating the restricted profile was admitted");
    match err {
        kube::Error::Api(status) => {
            ensure!(status.code == 403, "expected 403, got {status:?}");
            ensure!(
                status.message.contains("violates PodSecurity \"restricted"),
                "{}",
                status.message
            );
        }
        other => anyhow::bail!("unexpected error {other}"),
    }

    // The sandbox Pod shape meets the profile: admitted, and it runs.
    pods.create(
        &PostParams::default(),
        &sandbox_pod("strict", "gvisor", &["python3", "-c", "print('ok')"]),
    )
    .await
    .context("a restricted-compliant pod was refused")?;
    let done = wait_finished(&pods, "strict", Duration::from_secs(120)).await?;
    ensure!(phase(&done) == "Succeeded", "phase {}", phase(&done));
    Ok(())
}

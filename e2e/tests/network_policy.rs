//! NetworkPolicy, seen holding. Sandboxes run with networking off under gVisor; the chart's
//! NetworkPolicies are the second layer, and the only one under runtimes that give Pods a network
//! stack (runc, Kata, GKE Sandbox). These tests take that layer alone: Pods with a network stack,
//! where the policy is all that stands between them and the network.
//!
//! - A sandbox Pod the operator made, under runc: an idle sandbox of a runc SandboxPool (no run
//!   ever claims one: runs match only pools of the operator's own runtime class), which the test
//!   reaches into with `kubectl exec`. The chart's `sandboxrun-deny-all` selects it like any other.
//! - The frontend's Pod, under its own policy (`sandboxrun-mcp`: the API server only).
//!
//! Each tries every target over TCP and UDP, three times: under the chart's policy (nothing
//! reached), with that one policy removed (the control: the same Pod reaches everything, so the
//! first result was the policy and not an accident), and with the policy put back. Every target
//! is on this machine, and each answers with its own name, so a reply is known to be the target's:
//!
//! - another Pod (a listener in a namespace of the test's, under no policy);
//! - cluster DNS: a listener behind a `kube-dns` Service in kube-system, on port 53 (the harness
//!   runs no DNS server; a real one is the same ClusterIP Service in front of its Pods);
//! - an outside host, 198.51.100.10, and the cloud metadata address, 169.254.169.254: listeners in
//!   a network namespace the test makes, on the cluster bridge, routed for the Pod network only
//!   (policy routing from the Pod subnet), so the node's own routes to these addresses are left
//!   alone and nothing leaves the machine;
//! - the node itself: the API server's Service (10.96.0.1:443, which the harness's API server
//!   serves on the node's address) and a listener on the node's address.
//!
//! The node itself is not governed here, and the tests say so by asserting it: the harness's
//! kube-network-policies judges forwarded traffic only (its rules hook postrouting), and packets
//! addressed to the node are delivered locally without passing there. Where the API server runs
//! off the node (every managed cluster) its traffic is forwarded and the policy applies; the node's
//! own ports (kubelet, NodePorts) stay reachable from a Pod with a network stack whatever the
//! policy says. docs/install.md ("Which layer keeps a sandbox off the network") says the same.
//!
//! Needs the local harness (`e2e/cluster/up.sh`), run as root on its node: the test makes network
//! namespaces and listeners there. It removes the chart's policies for a few seconds each, so it
//! runs alone, after the other cluster tests (run-tests.sh does).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use sandboxrun_e2e::pools::{TestPool, kubectl};
use sandboxrun_e2e::runs::{RUNS_NAMESPACE, SYSTEM_NAMESPACE};
use sandboxrun_e2e::{TestNamespace, client, node_internal_ip, sandbox_pod};
use serde_json::json;

const LISTENER: &str = include_str!("../netpol/listener.py");
const PROBE_PY: &str = include_str!("../netpol/probe.py");
const PROBE_SH: &str = include_str!("../netpol/probe.sh");

/// The harness's cluster bridge and Pod subnet (e2e/cluster/lib.sh).
const BRIDGE: &str = "sbr0";
const POD_SUBNET: &str = "10.244.0.0/24";
/// The test's network namespace and the host end of its link to the bridge.
const OUTSIDE_NETNS: &str = "sbr-np";
const OUTSIDE_VETH: &str = "sbrnp0";
/// An outside host (TEST-NET-2: routed nowhere on the internet; not this VM's own network).
const OUTSIDE_IP: &str = "198.51.100.10";
const METADATA_IP: &str = "169.254.169.254";
/// The routing table and rule priority of the Pod subnet's routes to those two.
const ROUTE_TABLE: &str = "4242";
/// The API server's Service (the first address of the Service CIDR).
const API_SERVICE_IP: &str = "10.96.0.1";
/// Where the listeners answer: Pods on 8080 and 5353 (unprivileged), the namespace on 80.
const PEER_PORT: u16 = 8080;
const DNS_TARGET_PORT: u16 = 5353;
const OUTSIDE_PORT: u16 = 80;
const NODE_PORT: u16 = 18080;
/// The chart's two policies.
const SANDBOX_POLICY: &str = "sandboxrun-deny-all";
const FRONTEND_POLICY: &str = "sandboxrun-mcp";
/// How long a policy change may take to be enforced (the agent learns it through a watch).
const ENFORCEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// One thing to reach.
#[derive(Clone, Debug)]
struct Target {
    name: String,
    proto: &'static str,
    ip: String,
    port: u16,
    /// "pong": the listener must answer; "connect": a TCP connection is enough.
    mode: &'static str,
    /// Whether a NetworkPolicy governs the path here (false: addressed to the node itself).
    governed: bool,
}

impl Target {
    fn both(name: &str, ip: &str, port: u16, governed: bool) -> [Target; 2] {
        ["tcp", "udp"].map(|proto| Target {
            name: format!("{name}/{proto}"),
            proto,
            ip: ip.to_owned(),
            port,
            mode: "pong",
            governed,
        })
    }

    fn args(targets: &[Target]) -> Vec<String> {
        targets
            .iter()
            .flat_map(|t| {
                [
                    t.name.clone(),
                    t.proto.to_owned(),
                    t.ip.clone(),
                    t.port.to_string(),
                    t.mode.to_owned(),
                ]
            })
            .collect()
    }
}

/// Runs a host command (as root) and fails with its output when it fails.
fn host<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Result<()> {
    let out = Command::new(&args[0]).args(&args[1..]).output()?;
    ensure!(
        out.status.success(),
        "{}: {}",
        args.iter()
            .map(|a| a.as_ref().to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Starts a listener and waits for its "ready" line.
fn start_listener(mut command: Command) -> Result<Child> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting a listener")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("listener stdout")?).read_line(&mut line)?;
    if line.trim() != "ready" {
        let _ = child.kill();
        bail!("listener did not start: {line:?}");
    }
    Ok(child)
}

/// The listeners on the node: one in a network namespace on the bridge (an outside host and the
/// metadata address), one on the node's own address. Removed on drop.
struct HostListeners {
    children: Vec<Child>,
}

impl HostListeners {
    fn start(node_ip: &str) -> Result<Self> {
        Self::remove_namespace();
        let mut me = Self {
            children: Vec::new(),
        };
        host(&["ip", "netns", "add", OUTSIDE_NETNS])?;
        host(&[
            "ip",
            "link",
            "add",
            OUTSIDE_VETH,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            OUTSIDE_NETNS,
        ])?;
        host(&["ip", "link", "set", OUTSIDE_VETH, "master", BRIDGE, "up"])?;
        let inside = |args: &[&str]| host(&[&["ip", "-n", OUTSIDE_NETNS][..], args].concat());
        inside(&["link", "set", "lo", "up"])?;
        inside(&["link", "set", "eth0", "up"])?;
        inside(&["addr", "add", &format!("{OUTSIDE_IP}/32"), "dev", "eth0"])?;
        inside(&["addr", "add", &format!("{METADATA_IP}/32"), "dev", "eth0"])?;
        inside(&["route", "add", &format!("{node_ip}/32"), "dev", "eth0"])?;
        inside(&["route", "add", "default", "via", node_ip, "dev", "eth0"])?;
        // Only the Pod network is sent there: the node's own routes to these addresses (this VM
        // has a real one to the metadata address) stay as they are.
        for ip in [OUTSIDE_IP, METADATA_IP] {
            host(&[
                "ip",
                "route",
                "replace",
                &format!("{ip}/32"),
                "dev",
                BRIDGE,
                "table",
                ROUTE_TABLE,
            ])?;
            host(&[
                "ip",
                "rule",
                "add",
                "from",
                POD_SUBNET,
                "to",
                &format!("{ip}/32"),
                "table",
                ROUTE_TABLE,
                "priority",
                ROUTE_TABLE,
            ])?;
        }
        for (name, ip) in [("outside", OUTSIDE_IP), ("metadata", METADATA_IP)] {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", OUTSIDE_NETNS, "python3", "-c", LISTENER]);
            command.args(["--bind", ip, name, &OUTSIDE_PORT.to_string()]);
            me.children.push(start_listener(command)?);
        }
        let mut command = Command::new("python3");
        command.args([
            "-c",
            LISTENER,
            "--bind",
            node_ip,
            "node",
            &NODE_PORT.to_string(),
        ]);
        me.children.push(start_listener(command)?);
        Ok(me)
    }

    fn remove_namespace() {
        let quiet = |args: &[&str]| {
            let _ = Command::new(args[0]).args(&args[1..]).output();
        };
        while Command::new("ip")
            .args(["rule", "del", "priority", ROUTE_TABLE])
            .output()
            .is_ok_and(|o| o.status.success())
        {}
        quiet(&["ip", "route", "flush", "table", ROUTE_TABLE]);
        // Deleting the namespace deletes its end of the link, and with it the host's end.
        quiet(&["ip", "netns", "del", OUTSIDE_NETNS]);
        quiet(&["ip", "link", "del", OUTSIDE_VETH]);
    }
}

impl Drop for HostListeners {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        Self::remove_namespace();
    }
}

/// The DNS stand-in's objects in kube-system (not a test namespace), deleted with the test and
/// waited for, so the next test can make them again.
struct KubeSystemObjects {
    names: Vec<(&'static str, String)>,
}

impl Drop for KubeSystemObjects {
    fn drop(&mut self) {
        for (kind, name) in &self.names {
            let _ = kubectl()
                .args([
                    "-n",
                    "kube-system",
                    "delete",
                    kind,
                    name,
                    "--ignore-not-found",
                ])
                .args(["--grace-period=1", "--wait=true", "--timeout=60s"])
                .output();
        }
    }
}

/// Waits until a Pod runs and has an address.
async fn running_ip(pods: &Api<Pod>, name: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pod = pods.get(name).await?;
        let status = pod.status.unwrap_or_default();
        let ready = status.container_statuses.as_ref().is_some_and(|cs| {
            cs.iter()
                .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        });
        if let (Some("Running"), true, Some(ip)) = (status.phase.as_deref(), ready, status.pod_ip) {
            return Ok(ip);
        }
        ensure!(
            Instant::now() < deadline,
            "Pod {name} not running after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs a probe inside a Pod's container with `kubectl exec`; returns target name → reached.
fn probe_from(
    namespace: &str,
    pod: &str,
    container: &str,
    python: bool,
    targets: &[Target],
) -> Result<BTreeMap<String, (bool, String)>> {
    // Bounded like every call of the test: a probe takes a few seconds (its connects time out).
    let mut command = Command::new("timeout");
    command.arg("60").arg(kubectl().get_program());
    command.args(["-n", namespace, "exec", pod, "-c", container, "--"]);
    if python {
        command.args(["python3", "-c", PROBE_PY]);
    } else {
        command.args(["bash", "-c", PROBE_SH, "probe"]);
    }
    let out = command.args(Target::args(targets)).output()?;
    ensure!(
        out.status.success(),
        "probe in {namespace}/{pod}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let mut results = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("probe output {line:?}"))?;
        results.insert(
            v["name"].as_str().unwrap_or_default().to_owned(),
            (
                v["reached"].as_bool().unwrap_or(false),
                v["detail"].as_str().unwrap_or_default().to_owned(),
            ),
        );
    }
    for t in targets {
        ensure!(
            results.contains_key(&t.name),
            "probe gave no result for {}",
            t.name
        );
    }
    Ok(results)
}

/// Probes until `want(target)` holds for every target, or fails after `timeout` with the last
/// results: a policy change takes effect once the agent's watch has seen it. A zero timeout
/// probes once: a policy long in place gets no second chance to hold.
async fn probe_until(
    what: &str,
    from: (&str, &str, &str, bool),
    targets: &[Target],
    want: impl Fn(&Target) -> bool,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let results = probe_from(from.0, from.1, from.2, from.3, targets)?;
        let wrong: Vec<String> = targets
            .iter()
            .filter(|t| results[&t.name].0 != want(t))
            .map(|t| {
                let (reached, detail) = &results[&t.name];
                format!(
                    "{} {}:{} reached={reached} ({detail})",
                    t.name, t.ip, t.port
                )
            })
            .collect();
        if wrong.is_empty() {
            let (reached, not): (Vec<&Target>, Vec<&Target>) =
                targets.iter().partition(|t| results[&t.name].0);
            let names = |ts: Vec<&Target>| ts.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
            eprintln!(
                "{what}: as expected; reached {:?}, not reached {:?}",
                names(reached),
                names(not)
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{what}: after {timeout:?}, not as expected:\n  {}",
                wrong.join("\n  ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A chart NetworkPolicy taken away for the control and put back, also when the test fails.
struct RemovedPolicy {
    namespace: String,
    saved: NetworkPolicy,
    restored: bool,
}

impl RemovedPolicy {
    async fn remove(client: &Client, namespace: &str, name: &str) -> Result<Self> {
        let api: Api<NetworkPolicy> = Api::namespaced(client.clone(), namespace);
        let mut saved = api.get(name).await?;
        saved.metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: saved.metadata.name.take(),
            namespace: saved.metadata.namespace.take(),
            labels: saved.metadata.labels.take(),
            annotations: saved.metadata.annotations.take(),
            ..Default::default()
        };
        api.delete(name, &DeleteParams::default()).await?;
        Ok(Self {
            namespace: namespace.to_owned(),
            saved,
            restored: false,
        })
    }

    async fn restore(mut self, client: &Client) -> Result<()> {
        let api: Api<NetworkPolicy> = Api::namespaced(client.clone(), &self.namespace);
        api.create(&PostParams::default(), &self.saved).await?;
        self.restored = true;
        Ok(())
    }
}

impl Drop for RemovedPolicy {
    fn drop(&mut self) {
        if self.restored {
            return;
        }
        let manifest = serde_json::to_string(&json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": self.saved.metadata,
            "spec": self.saved.spec,
        }))
        .unwrap_or_default();
        let put_back = kubectl()
            .args(["create", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .map(|mut s| s.write_all(manifest.as_bytes()));
                child.wait()
            });
        if !put_back.is_ok_and(|s| s.success()) {
            eprintln!(
                "warning: could not put NetworkPolicy {}/{} back; `helm upgrade` restores it",
                self.namespace,
                self.saved.name_any()
            );
        }
    }
}

/// What both tests share: the targets, and a vantage point under no policy to check them from.
struct World {
    _host: HostListeners,
    _kube_system: KubeSystemObjects,
    _peer_ns: TestNamespace,
    peer_ns: String,
    peer_pod: String,
    peer_ip: String,
    dns_pod: String,
    targets: Vec<Target>,
}

impl World {
    async fn start(client: &Client) -> Result<Self> {
        let node_ip = node_internal_ip(client).await?;
        let host = HostListeners::start(&node_ip)?;

        // Another Pod, in a namespace of the test's, under no policy.
        let peer_ns = TestNamespace::create(client, "e2e-netpol-peer", &[]).await?;
        let peer_port = PEER_PORT.to_string();
        let peer = sandbox_pod(
            "peer",
            "runc",
            &["python3", "-c", LISTENER, "peer", &peer_port],
        );
        peer_ns.pods().create(&PostParams::default(), &peer).await?;

        // Cluster DNS: a kube-dns Service in kube-system on port 53, in front of a listener.
        let kube_system = KubeSystemObjects {
            names: vec![
                ("service", "kube-dns".into()),
                ("pod", "e2e-netpol-dns".into()),
            ],
        };
        let dns_port = DNS_TARGET_PORT.to_string();
        let mut dns = sandbox_pod(
            "e2e-netpol-dns",
            "runc",
            &["python3", "-c", LISTENER, "dns", &dns_port],
        );
        dns.metadata.labels = Some([("k8s-app".to_owned(), "kube-dns".to_owned())].into());
        let system_pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
        let services: Api<Service> = Api::namespaced(client.clone(), "kube-system");
        ensure!(
            services.get_opt("kube-dns").await?.is_none(),
            "kube-system/kube-dns exists: this test needs the local harness, which has no cluster DNS"
        );
        system_pods.create(&PostParams::default(), &dns).await?;
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": "kube-dns", "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "selector": {"k8s-app": "kube-dns"},
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": DNS_TARGET_PORT},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": DNS_TARGET_PORT},
                ],
            },
        }))?;
        let dns_ip = services
            .create(&PostParams::default(), &service)
            .await?
            .spec
            .and_then(|s| s.cluster_ip)
            .context("kube-dns has no ClusterIP")?;

        let peer_ip = running_ip(&peer_ns.pods(), "peer").await?;
        running_ip(&system_pods, "e2e-netpol-dns").await?;

        let mut targets = Vec::new();
        targets.extend(Target::both("pod", &peer_ip, PEER_PORT, true));
        targets.extend(Target::both("dns", &dns_ip, 53, true));
        targets.extend(Target::both("outside", OUTSIDE_IP, OUTSIDE_PORT, true));
        targets.extend(Target::both("metadata", METADATA_IP, OUTSIDE_PORT, true));
        targets.extend(Target::both("node", &node_ip, NODE_PORT, false));
        targets.push(Target {
            name: "apiserver/tcp".into(),
            proto: "tcp",
            ip: API_SERVICE_IP.into(),
            port: 443,
            mode: "connect",
            governed: false,
        });

        let world = Self {
            _host: host,
            _kube_system: kube_system,
            peer_ns: peer_ns.name.clone(),
            _peer_ns: peer_ns,
            peer_pod: "peer".into(),
            peer_ip,
            dns_pod: "e2e-netpol-dns".into(),
            targets,
        };
        // Every target answers a Pod under no policy (the DNS stand-in's), so a target a policed
        // Pod does not reach is the policy's doing, not a listener or a route not there yet.
        probe_until(
            "from a Pod under no policy",
            ("kube-system", &world.dns_pod, "main", true),
            &world.targets,
            |_| true,
            Duration::from_secs(60),
        )
        .await?;
        Ok(world)
    }
}

/// The frontend's Pod (one replica is enough: they share the policy).
async fn frontend_pod(client: &Client) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let lp = ListParams::default().labels("app.kubernetes.io/component=frontend");
    pods.list(&lp)
        .await?
        .items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.name_any())
        .context("no frontend Pod: install the chart with frontend.enabled=true")
}

#[tokio::test]
#[ignore = "removes the chart's deny-all policy for a few seconds: run alone (run-tests.sh does)"]
async fn a_sandbox_with_a_network_stack_reaches_nothing_while_the_deny_all_policy_holds()
-> Result<()> {
    let client = client().await?;
    let world = World::start(&client).await?;

    // A sandbox Pod the operator made, under runc, with the chart's labels and policy.
    let pool = TestPool::create_in_runtime(&client, "e2e-netpol", 51, 1, "runc").await?;
    let sandbox = pool
        .wait_ready(1)
        .await?
        .into_iter()
        .next()
        .context("the pool has no sandbox")?;
    let sandbox_pods: Api<Pod> = Api::namespaced(client.clone(), RUNS_NAMESPACE);
    let sandbox_ip = running_ip(&sandbox_pods, &sandbox).await?;
    let container = sandbox_pods
        .get(&sandbox)
        .await?
        .spec
        .and_then(|s| s.containers.first().map(|c| c.name.clone()))
        .context("sandbox Pod without a container")?;
    let from_sandbox = (RUNS_NAMESPACE, sandbox.as_str(), container.as_str(), true);

    // Ingress: a listener inside the sandbox, which the peer Pod tries to reach.
    let mut inside = kubectl();
    inside.args([
        "-n",
        RUNS_NAMESPACE,
        "exec",
        &sandbox,
        "-c",
        &container,
        "--",
    ]);
    inside.args(["python3", "-c", LISTENER, "sandbox", &PEER_PORT.to_string()]);
    let mut inside = KilledOnDrop(start_listener(inside)?);
    let to_sandbox = Target::both("sandbox", &sandbox_ip, PEER_PORT, true);
    let from_peer = (
        world.peer_ns.as_str(),
        world.peer_pod.as_str(),
        "main",
        true,
    );
    eprintln!(
        "sandbox {sandbox} at {sandbox_ip}; peer at {}",
        world.peer_ip
    );

    // Under the chart's policy, in place since the install: one probe each, no second chance.
    probe_until(
        "sandbox, deny-all in place",
        from_sandbox,
        &world.targets,
        |t| !t.governed,
        Duration::ZERO,
    )
    .await?;
    probe_until(
        "into the sandbox, deny-all in place",
        from_peer,
        &to_sandbox,
        |_| false,
        Duration::ZERO,
    )
    .await?;

    // The control: the same Pod without the policy reaches every target, and is reached.
    let removed = RemovedPolicy::remove(&client, RUNS_NAMESPACE, SANDBOX_POLICY).await?;
    probe_until(
        "sandbox, deny-all removed",
        from_sandbox,
        &world.targets,
        |_| true,
        ENFORCEMENT_TIMEOUT,
    )
    .await?;
    probe_until(
        "into the sandbox, deny-all removed",
        from_peer,
        &to_sandbox,
        |_| true,
        ENFORCEMENT_TIMEOUT,
    )
    .await?;

    // And with the policy back, it holds again.
    removed.restore(&client).await?;
    probe_until(
        "sandbox, deny-all restored",
        from_sandbox,
        &world.targets,
        |t| !t.governed,
        ENFORCEMENT_TIMEOUT,
    )
    .await?;
    probe_until(
        "into the sandbox, deny-all restored",
        from_peer,
        &to_sandbox,
        |_| false,
        ENFORCEMENT_TIMEOUT,
    )
    .await?;

    let _ = inside.0.kill();
    pool.delete().await?;
    Ok(())
}

#[tokio::test]
#[ignore = "removes the chart's frontend policy for a few seconds: run alone (run-tests.sh does)"]
async fn the_frontend_reaches_the_api_server_and_nothing_else() -> Result<()> {
    let client = client().await?;
    let world = World::start(&client).await?;
    let frontend = frontend_pod(&client).await?;
    // The frontend's image has no Python: bash's /dev/tcp and /dev/udp (probe.sh).
    let from_frontend = (SYSTEM_NAMESPACE, frontend.as_str(), "mcp", false);

    probe_until(
        "frontend, its policy in place",
        from_frontend,
        &world.targets,
        |t| !t.governed,
        Duration::ZERO,
    )
    .await?;
    let removed = RemovedPolicy::remove(&client, SYSTEM_NAMESPACE, FRONTEND_POLICY).await?;
    probe_until(
        "frontend, its policy removed",
        from_frontend,
        &world.targets,
        |_| true,
        ENFORCEMENT_TIMEOUT,
    )
    .await?;
    removed.restore(&client).await?;
    probe_until(
        "frontend, its policy restored",
        from_frontend,
        &world.targets,
        |t| !t.governed,
        ENFORCEMENT_TIMEOUT,
    )
    .await?;
    Ok(())
}

/// A child process killed when the test ends, however it ends.
struct KilledOnDrop(Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A sandbox lost to the harness before it told what its code did: deleted by its pool before
/// its log was read (a runner that ran nothing exits at once), or never reached by the program.
/// Says nothing about the network policy: `run_in_fresh_sandbox` takes another.
#[derive(Debug)]
struct Lost(String);

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Lost {}

/// The sandbox container's log so far ("" while it cannot be read); `Lost` once the Pod is gone.
async fn log_of(pods: &Api<Pod>, name: &str) -> Result<String> {
    let params = kube::api::LogParams {
        container: Some("sandbox".to_owned()),
        ..Default::default()
    };
    match within("the log", pods.logs(name, &params)).await? {
        Ok(log) => Ok(log),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            Err(Lost(format!("{name} was deleted before its log was read")).into())
        }
        Err(_) => Ok(String::new()),
    }
}

/// Makes a runc pool of one and hands `code` to its sandbox the instant it starts
/// (`feed_first_sandbox`). A sandbox lost to the harness is replaced by a fresh pool, twice at
/// most; the pool is deleted either way.
async fn run_in_fresh_sandbox(
    client: &Client,
    prefix: &str,
    pids: u32,
    code: &str,
) -> Result<(sandboxrun_core::RunnerResult, String)> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let pool = TestPool::create_in_runtime(client, prefix, pids, 1, "runc").await?;
        let result = feed_first_sandbox(client, &pool, code).await;
        pool.delete().await?;
        match result {
            Err(e) if attempt < 3 && e.downcast_ref::<Lost>().is_some() => {
                eprintln!("{prefix}: {e}; again, with a fresh pool");
            }
            other => return other,
        }
    }
}

/// How long `feed_first_sandbox` gives the attach stream to take the program (as the operator's
/// early feeder: well inside the runner's 7 s wait for the policy, after which a runner that ran
/// nothing exits and its pool deletes it, log and all), and then to carry the envelope (the
/// probe's connects take a few seconds), before it hangs up.
const HELD_AFTER: Duration = Duration::from_secs(3);
const STREAM_WITHIN: Duration = Duration::from_secs(30);
/// When a runner whose log is still empty after a held session is taken to have received
/// nothing: past its wait for the network policy (7 s; it reads its stdin only then).
const NOTHING_RECEIVED_AFTER: Duration = Duration::from_secs(15);

/// How long one call to the API server may take in `feed_first_sandbox`.
const CALL_WITHIN: Duration = Duration::from_secs(20);

/// `call`, or an error naming `what` when it takes longer than `CALL_WITHIN`.
async fn within<T>(what: &str, call: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(CALL_WITHIN, call)
        .await
        .map_err(|_| anyhow::anyhow!("{what}: no answer within {CALL_WITHIN:?}"))
}

/// Hands `code` to the first sandbox of `pool` the instant its container runs: the Pod is
/// attached to as soon as it exists, again and again until the attach holds (as the operator's
/// early feeder does), and the framed program is written at once. Returns the runner's envelope,
/// read from the same stream (or from the container's log when the stream carried none), and the
/// sandbox's name.
async fn feed_first_sandbox(
    client: &Client,
    pool: &TestPool,
    code: &str,
) -> Result<(sandboxrun_core::RunnerResult, String)> {
    use kube::api::AttachParams;
    use sandboxrun_core::{Limits, PROGRAM_RECEIVED, Program, parse_envelope, program_frame};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let pods: Api<Pod> = Api::namespaced(client.clone(), RUNS_NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(120);
    let name = loop {
        if let Some(pod) = within("listing the pool", pool.idle()).await??.first() {
            break pod.name_any();
        }
        ensure!(Instant::now() < deadline, "pool {} made no Pod", pool.name);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let limits = Limits {
        timeout_seconds: 30,
        ..Limits::default()
    };
    let frame = program_frame(&Program::code(code), &limits);
    let params = AttachParams::default()
        .container("sandbox")
        .stdin(true)
        .stdout(true)
        .stderr(false);
    // As the operator's early feeder does (operator/src/python/feed.rs): an attach to a container
    // the kubelet cannot reach yet opens and ends at once ("unable to upgrade connection"; its
    // stdin is untouched, so trying again is safe), and one that opened while the container was
    // being started may hold the program until the session ends and stream nothing: the
    // container's log, which the runner writes whatever the stream does, then tells.
    //
    // Every call is bounded (CALL_WITHIN): the client has no read timeout, and an attach made the
    // instant a runc container starts was once left unanswered for an hour by the node. An
    // attach never answered wrote nothing, so trying again is safe.
    let mut held_sessions = 0;
    'session: loop {
        let attached = tokio::time::timeout(CALL_WITHIN, pods.attach(&name, &params)).await;
        let mut attached = match attached {
            Ok(Ok(attached)) => attached,
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
                return Err(Lost(format!("{name} was deleted before it was fed")).into());
            }
            Ok(Err(e)) => {
                ensure!(Instant::now() < deadline, "cannot attach to {name}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(_) => {
                eprintln!("{name}: an attach not answered within {CALL_WITHIN:?}; again");
                ensure!(
                    Instant::now() < deadline,
                    "cannot attach to {name}: no answer within {CALL_WITHIN:?}"
                );
                continue;
            }
        };
        let status = attached.take_status();
        let mut stdin = attached.stdin().context("no stdin stream")?;
        let mut stdout = attached.stdout().context("no stdout stream")?;
        // The stream may hold the program (the write does not complete) or the output (nothing
        // comes) until the session ends: then, as the operator's early feeder does, hang up and
        // let the log tell.
        let wrote = tokio::time::timeout(HELD_AFTER, async {
            stdin.write_all(&frame).await?;
            stdin.shutdown().await
        })
        .await;
        drop(stdin);
        let mut log = Vec::new();
        let program_held = wrote.is_err();
        let held = match wrote {
            Ok(written) => {
                written?;
                let read = tokio::time::timeout(STREAM_WITHIN, async {
                    let mut chunk = vec![0u8; 64 * 1024];
                    loop {
                        let n = stdout.read(&mut chunk).await?;
                        if n == 0 {
                            return anyhow::Ok(());
                        }
                        log.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&log);
                        if text.ends_with('\n') && parse_envelope(&text).is_ok() {
                            return Ok(());
                        }
                    }
                })
                .await;
                read.is_err()
            }
            Err(_) => true,
        };
        attached.abort();
        let text = String::from_utf8_lossy(&log).into_owned();
        if let Ok(envelope) = parse_envelope(&text) {
            return Ok((envelope, name));
        }
        if held {
            held_sessions += 1;
            eprintln!(
                "{name}: the attach stream held the {} (got {text:?}); hung up, the log tells",
                if program_held { "program" } else { "output" }
            );
        }
        let said = match status {
            Some(status) => tokio::time::timeout(Duration::from_secs(1), status)
                .await
                .ok()
                .flatten()
                .and_then(|s| s.message),
            None => None,
        }
        .unwrap_or_default();
        let head = log_of(&pods, &name).await?;
        if let Ok(envelope) = parse_envelope(&head) {
            return Ok((envelope, name));
        }
        let received = head
            .lines()
            .any(|l| l.starts_with(&format!("{PROGRAM_RECEIVED} ")));
        if !received && text.is_empty() && said.contains("unable to upgrade connection") {
            ensure!(
                Instant::now() < deadline,
                "{name} never became reachable: {said}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        // The session ended without the envelope on the stream: the log has it once the runner
        // is done (it exits after printing it, or right away when it ran nothing). A log still
        // empty well past the runner's isolation wait means the program never reached it (a
        // session held by the node can swallow it): its stdin is still open, so it is sent
        // again, as the operator's reconcile does after its early feeder.
        let hung_up = Instant::now();
        let until = hung_up + Duration::from_secs(90);
        loop {
            let log = log_of(&pods, &name).await?;
            if let Ok(envelope) = parse_envelope(&log) {
                eprintln!("{name}: the envelope came from the log (the stream ended: {said:?})");
                return Ok((envelope, name));
            }
            if held && log.is_empty() && hung_up.elapsed() > NOTHING_RECEIVED_AFTER {
                if held_sessions >= 3 {
                    let why = format!(
                        "the program reached {name} in none of {held_sessions} held sessions"
                    );
                    return Err(Lost(why).into());
                }
                eprintln!(
                    "{name}: its log is empty {NOTHING_RECEIVED_AFTER:?} after the session: \
                     nothing reached the runner; sending the program again"
                );
                continue 'session;
            }
            ensure!(
                Instant::now() < until,
                "{name}: no envelope on the stream ({text:?}, the kubelet said {said:?}) nor in the log within 90 s: {log:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// The code of the barrier test: it tries every governed target the instant it starts (the
/// harness's probe, run as the program itself) and prints one JSON line per target.
fn instant_probe_code(targets: &[Target]) -> Result<String> {
    let mut argv = vec!["probe".to_owned()];
    argv.extend(Target::args(targets));
    Ok(format!(
        "import sys\nsys.argv = {}\n{PROBE_PY}",
        serde_json::to_string(&argv)?
    ))
}

/// What the instant probe reached, by target name.
fn reached_by(stdout: &str) -> Result<BTreeMap<String, (bool, String)>> {
    let mut results = BTreeMap::new();
    for line in stdout.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("probe output {line:?}"))?;
        results.insert(
            v["name"].as_str().unwrap_or_default().to_owned(),
            (
                v["reached"].as_bool().unwrap_or(false),
                v["detail"].as_str().unwrap_or_default().to_owned(),
            ),
        );
    }
    Ok(results)
}

#[tokio::test]
#[ignore = "removes the chart's deny-all policy for a few seconds: run alone (run-tests.sh does)"]
async fn code_that_connects_the_instant_a_runc_sandbox_starts_reaches_nothing() -> Result<()> {
    let client = client().await?;
    let world = World::start(&client).await?;
    let governed: Vec<Target> = world
        .targets
        .iter()
        .filter(|t| t.governed)
        .cloned()
        .collect();
    let code = instant_probe_code(&governed)?;

    // A sandbox that stays, to see when a policy change is enforced (the control below).
    let witness_pool = TestPool::create_in_runtime(&client, "e2e-barrier-w", 52, 1, "runc").await?;
    let witness = witness_pool
        .wait_ready(1)
        .await?
        .into_iter()
        .next()
        .context("the witness pool has no sandbox")?;

    // Fresh runc sandboxes, each handed the program the instant it runs: the policy agent may
    // not know the Pod yet, and the runner must not read the program before it does.
    for round in 0..3 {
        let (envelope, sandbox) =
            run_in_fresh_sandbox(&client, "e2e-barrier", 53 + round, &code).await?;
        ensure!(
            envelope.not_run.is_none(),
            "sandbox {sandbox} ran nothing: {:?}",
            envelope.not_run
        );
        ensure!(
            envelope.exit_code == 0,
            "the probe failed in {sandbox}: {}",
            envelope.stderr
        );
        let results = reached_by(&envelope.stdout)?;
        for t in &governed {
            let (reached, detail) = results
                .get(&t.name)
                .with_context(|| format!("no result for {} in {:?}", t.name, envelope.stdout))?;
            ensure!(
                !reached,
                "round {round}: code in {sandbox} reached {} {}:{} the instant it started ({detail})",
                t.name,
                t.ip,
                t.port
            );
        }
        eprintln!("round {round}: {sandbox} reached nothing the instant its code started");
    }

    // The control: without the deny-all, a new sandbox can reach the canary and never stops
    // reaching it, so its runner runs nothing; the barrier is the policy, not an accident.
    let removed = RemovedPolicy::remove(&client, RUNS_NAMESPACE, SANDBOX_POLICY).await?;
    let witness_container = "sandbox";
    let peer_targets: Vec<Target> = governed
        .iter()
        .filter(|t| t.name.starts_with("pod/"))
        .cloned()
        .collect();
    probe_until(
        "witness sandbox, deny-all removed",
        (RUNS_NAMESPACE, witness.as_str(), witness_container, true),
        &peer_targets,
        |_| true,
        ENFORCEMENT_TIMEOUT,
    )
    .await?;
    let (envelope, sandbox) = run_in_fresh_sandbox(&client, "e2e-barrier-c", 56, &code).await?;
    let not_run = envelope
        .not_run
        .with_context(|| format!("{sandbox} ran its code with no policy: {}", envelope.stdout))?;
    ensure!(
        not_run.reason == sandboxrun_core::NotRunReason::IsolationNotInForce,
        "{not_run:?}"
    );
    eprintln!("control: {sandbox} ran nothing: {}", not_run.message);
    removed.restore(&client).await?;
    witness_pool.delete().await?;
    Ok(())
}

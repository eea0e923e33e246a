//! Operator configuration: command-line flags, each also readable from the environment.

use std::net::SocketAddr;

use clap::Parser;

/// The sandboxrun operator: turns SandboxRun resources into single-use sandbox Pods.
#[derive(Parser, Debug, Clone)]
#[command(name = "sandboxrun-operator", version, about)]
pub struct Config {
    /// Namespace to watch for SandboxRuns; empty watches all namespaces.
    #[arg(long, env = "SANDBOXRUN_NAMESPACE", default_value = "")]
    pub namespace: String,

    /// RuntimeClass of sandbox Pods (gVisor by default).
    #[arg(long, env = "SANDBOXRUN_RUNTIME_CLASS", default_value = "gvisor")]
    pub runtime_class: String,

    /// Image of sandbox Pods; it must provide python3.
    #[arg(
        long,
        env = "SANDBOXRUN_SANDBOX_IMAGE",
        default_value = "localhost/sandboxrun/sandbox-python:dev"
    )]
    pub sandbox_image: String,

    /// Size limit of the memory-backed /tmp of sandbox Pods (counts against the memory limit).
    #[arg(long, env = "SANDBOXRUN_TMP_SIZE", default_value = "16Mi")]
    pub tmp_size: String,

    /// Address of the /metrics and /healthz HTTP server.
    #[arg(long, env = "SANDBOXRUN_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Run the controller only while holding the leader Lease.
    #[arg(long, env = "SANDBOXRUN_LEADER_ELECTION", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_election: bool,

    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "SANDBOXRUN_LEASE_NAME",
        default_value = "sandboxrun-operator"
    )]
    pub lease_name: String,

    /// Namespace of the leader-election Lease (defaults to the operator's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,

    /// Identity of this replica in leader election and Events (defaults to the Pod name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

impl Config {
    /// This replica's identity: the flag, else the host name, else a fixed name.
    pub fn identity(&self) -> String {
        self.identity
            .clone()
            .filter(|s| !s.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "sandboxrun-operator".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = Config::try_parse_from(["sandboxrun-operator"]).unwrap();
        assert_eq!(c.namespace, "");
        assert_eq!(c.runtime_class, "gvisor");
        assert_eq!(c.sandbox_image, "localhost/sandboxrun/sandbox-python:dev");
        assert_eq!(c.tmp_size, "16Mi");
        assert_eq!(c.metrics_addr.to_string(), "0.0.0.0:8080");
        assert!(!c.leader_election);
        assert_eq!(c.lease_name, "sandboxrun-operator");
    }

    #[test]
    fn leader_election_flag_forms() {
        let on = Config::try_parse_from(["x", "--leader-election"]).unwrap();
        assert!(on.leader_election);
        let off = Config::try_parse_from(["x", "--leader-election=false"]).unwrap();
        assert!(!off.leader_election);
        let id = Config::try_parse_from(["x", "--identity", "op-1"]).unwrap();
        assert_eq!(id.identity(), "op-1");
    }
}

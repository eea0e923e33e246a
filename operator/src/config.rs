//! Operator configuration: command-line flags, each also readable from the environment.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;

use clap::Parser;
use jiff::SignedDuration;

/// The sandboxrun operator: turns SandboxRun resources into single-use sandbox Pods.
#[derive(Parser, Debug, Clone)]
#[command(name = "sandboxrun-operator", version, about)]
pub struct Config {
    /// Namespace to watch for SandboxRuns (required: an empty value is refused, so a missing
    /// setting never widens the operator to every namespace).
    #[arg(long, env = "SANDBOXRUN_NAMESPACE", value_parser = non_empty_namespace)]
    pub namespace: Option<String>,

    /// Watch SandboxRuns in every namespace instead of one (needs cluster-wide RBAC).
    #[arg(long, env = "SANDBOXRUN_ALL_NAMESPACES", conflicts_with = "namespace", value_parser = clap::builder::BoolishValueParser::new())]
    pub all_namespaces: bool,

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

    /// Image of sandbox Pods of the `data` profile (python3 with numpy, pandas, scipy,
    /// matplotlib); empty: this installation has none, and data runs end Rejected
    /// (ProfileUnavailable).
    #[arg(
        long,
        env = "SANDBOXRUN_SANDBOX_IMAGE_DATA",
        default_value = "localhost/sandboxrun/sandbox-python-data:dev"
    )]
    pub sandbox_image_data: String,

    /// Size limit of the memory-backed /tmp of sandbox Pods (counts against the memory limit).
    #[arg(long, env = "SANDBOXRUN_TMP_SIZE", default_value = "16Mi")]
    pub tmp_size: String,

    /// Address of the /metrics and /healthz HTTP server.
    #[arg(long, env = "SANDBOXRUN_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Address of the canary (canary.rs): sandboxes with a network interface read their program
    /// only once they can no longer reach it. Anyone must be able to reach this port.
    #[arg(long, env = "SANDBOXRUN_CANARY_ADDR", default_value = "0.0.0.0:8081")]
    pub canary_addr: SocketAddr,

    /// This replica's Pod IP (the downward API's status.podIP): sandboxes reach the canary at it.
    /// Without it, sandboxes with a network interface (runc, Kata) run nothing.
    #[arg(long, env = "POD_IP")]
    pub pod_ip: Option<String>,

    /// Run the controller only while holding the leader Lease.
    #[arg(long, env = "SANDBOXRUN_LEADER_ELECTION", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
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

    /// Policy file (YAML, see config/policy/policy.yaml) judging every run; reloaded when it
    /// changes. Without it every run is blocked (the operator fails closed), unless
    /// --allow-all-without-policy is given.
    #[arg(long, env = "SANDBOXRUN_POLICY_FILE")]
    pub policy_file: Option<PathBuf>,

    /// Without a policy file, allow every run instead of blocking it (test clusters only; a
    /// warning says so at start-up).
    #[arg(
        long,
        env = "SANDBOXRUN_ALLOW_ALL_WITHOUT_POLICY",
        conflicts_with = "policy_file",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub allow_all_without_policy: bool,

    /// Databases sql runs may query (YAML map of name to {dialect: postgres|sqlite,
    /// url|urlEnv|urlFile}; URLs from a mounted Secret). Without it sql runs end Rejected.
    #[arg(long, env = "SANDBOXRUN_DATABASES_FILE")]
    pub databases_file: Option<PathBuf>,

    /// Base URL of the Prometheus that metrics runs query (for example
    /// http://prometheus-server.monitoring:80; `user:password@` in it becomes basic
    /// authentication). Without it metrics runs end Rejected.
    #[arg(long, env = "SANDBOXRUN_PROMETHEUS_URL")]
    pub prometheus_url: Option<RedactedUrl>,

    /// The environment the Prometheus of --prometheus-url belongs to: sandbox, staging or
    /// production (default, the most sensitive). A metrics run is judged in this environment
    /// when it is more sensitive than the one the run names, so a call cannot reach production
    /// metrics under a sandbox rule.
    #[arg(long, env = "SANDBOXRUN_PROMETHEUS_ENVIRONMENT", default_value = "production", value_parser = parse_environment)]
    pub prometheus_environment: sandboxrun_core::Environment,

    /// Seconds between checks of the policy file for changes.
    #[arg(long, env = "SANDBOXRUN_POLICY_POLL_SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub policy_poll_seconds: u64,

    /// How long an escalated run waits for approval before it ends Rejected (ApprovalTimedOut):
    /// seconds, or a duration such as 90s, 15m, 1h.
    #[arg(long, env = "SANDBOXRUN_APPROVAL_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    pub approval_timeout: SignedDuration,

    /// Most SandboxRuns stored in the watched namespace at once (finished ones count until their
    /// TTL): the operator adds `count/sandboxruns.sandboxrun.dev` to the ResourceQuota named by
    /// --run-count-quota once the quota controller counts SandboxRuns (see run_quota.rs). 0: no
    /// count limit.
    #[arg(
        long,
        env = "SANDBOXRUN_MAX_STORED_RUNS",
        default_value_t = 0,
        requires = "run_count_quota"
    )]
    pub max_stored_runs: u32,

    /// How long a python run may wait in its namespace's queue for room for a sandbox (the
    /// ResourceQuota has none): one expected to wait longer is refused at once (`NoCapacity`,
    /// with a retry hint), one still waiting then is refused then. Keep it below the frontend's
    /// --kube-grace-seconds, which must also cover the sandbox's start.
    #[arg(long, env = "SANDBOXRUN_MAX_QUEUE_WAIT_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub max_queue_wait_seconds: u64,

    /// Open the program's attach stream to each ready warm sandbox while it idles, so that its
    /// claim does not (`pool_streams.rs`). Off: each claim attaches, one more round trip through
    /// the API server, the kubelet and the container runtime on the call's path.
    #[arg(long, env = "SANDBOXRUN_HOLD_STREAMS", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub hold_streams: bool,

    /// Reconciliations in flight at once. Without a bound a relist of 10,000 runs starts
    /// 10,000 of them together: their futures alone took 45 MB at the peak (heaptrack), and a
    /// restart with many runs in flight would send their API requests all at once. At 64, a
    /// burst of 100 calls at once waited for slots behind reconciles waiting on a saturated API
    /// server: the operator reached a new run up to 6.7 s after its create, p99 4.8 s; at 256,
    /// 1.6 s, p99 1.6 s (e2e/BENCHMARKS.md, load).
    #[arg(long, env = "SANDBOXRUN_RECONCILE_CONCURRENCY", default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..))]
    pub reconcile_concurrency: u16,

    /// Requests a second to the API server, sustained (a client-side limit, like client-go's
    /// QPS; requests over it wait). At 50, 100 agents at once on two cores queued the operator's
    /// requests behind the polls of runs waiting for quota room, and reconciles took 10-30 s
    /// (e2e/BENCHMARKS.md, load); 200 is above what sandboxes starting at a node's pace need,
    /// far below a storm.
    #[arg(long, env = "SANDBOXRUN_KUBE_QPS", default_value_t = NonZeroU32::new(200).expect("non-zero"))]
    pub kube_qps: NonZeroU32,

    /// Requests to the API server allowed at once above --kube-qps.
    #[arg(long, env = "SANDBOXRUN_KUBE_BURST", default_value_t = NonZeroU32::new(400).expect("non-zero"))]
    pub kube_burst: NonZeroU32,

    /// The ResourceQuota in the watched namespace that gets the count limit (created if
    /// missing); with --max-stored-runs.
    #[arg(long, env = "SANDBOXRUN_RUN_COUNT_QUOTA", requires = "namespace")]
    pub run_count_quota: Option<String>,
}

/// A URL that may carry credentials: its `Debug` (the start-up log prints the configuration)
/// shows them as `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedactedUrl(pub String);

impl std::str::FromStr for RedactedUrl {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

impl std::fmt::Debug for RedactedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?}",
            sandboxrun_core::metrics::prometheus::redact(&self.0)
        )
    }
}

/// A namespace name: not empty (an empty `--namespace` used to mean every namespace).
fn non_empty_namespace(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err(
            "the namespace is empty: name the namespace of the SandboxRuns, or pass \
             --all-namespaces to watch every namespace"
                .to_owned(),
        );
    }
    Ok(s.to_owned())
}

impl Config {
    /// The namespace to watch, `None` for every namespace; an error when neither
    /// `--namespace` nor `--all-namespaces` was given.
    pub fn watched_namespace(&self) -> anyhow::Result<Option<&str>> {
        match (&self.namespace, self.all_namespaces) {
            (Some(ns), false) => Ok(Some(ns)),
            (None, true) => Ok(None),
            _ => anyhow::bail!(
                "say which SandboxRuns to watch: --namespace NAME (chart: the sandbox \
                 namespace), or --all-namespaces"
            ),
        }
    }
}

/// A positive duration: bare seconds (`900`) or a friendly/ISO 8601 duration (`15m`, `PT1H`).
fn parse_duration(s: &str) -> Result<SignedDuration, String> {
    let d = match s.trim().parse::<i64>() {
        Ok(secs) => SignedDuration::from_secs(secs),
        Err(_) => s
            .trim()
            .parse::<SignedDuration>()
            .map_err(|e| format!("{s:?} is not a duration (write 900, 90s, 15m or 1h): {e}"))?,
    };
    if d.is_positive() {
        Ok(d)
    } else {
        Err(format!("{s:?}: the duration must be positive"))
    }
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

/// An environment by its name (`sandbox`, `staging`, `production`).
fn parse_environment(name: &str) -> Result<sandboxrun_core::Environment, String> {
    sandboxrun_core::Environment::ALL
        .into_iter()
        .find(|e| e.as_str() == name)
        .ok_or_else(|| {
            format!("{name:?} is not an environment: use sandbox, staging or production")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(std::iter::once("sandboxrun-operator").chain(args.iter().copied()))
    }

    #[test]
    fn the_watched_namespace_is_never_widened_by_accident() {
        let c = parse(&["--namespace", "runs"]).unwrap();
        assert_eq!(c.watched_namespace().unwrap(), Some("runs"));
        let c = parse(&["--all-namespaces"]).unwrap();
        assert_eq!(c.watched_namespace().unwrap(), None);
        // No namespace at all, and an empty one (the old meaning: every namespace), are refused.
        assert!(parse(&[]).unwrap().watched_namespace().is_err());
        let e = parse(&["--namespace", ""]).unwrap_err().to_string();
        assert!(e.contains("--all-namespaces"), "{e}");
        assert!(parse(&["--namespace", "runs", "--all-namespaces"]).is_err());
    }

    #[test]
    fn allowing_everything_without_a_policy_is_explicit() {
        assert!(
            parse(&["--allow-all-without-policy"])
                .unwrap()
                .allow_all_without_policy
        );
        assert!(parse(&["--policy-file", "p", "--allow-all-without-policy"]).is_err());
    }

    #[test]
    fn defaults() {
        let c = Config::try_parse_from(["sandboxrun-operator"]).unwrap();
        // No namespace by default: the operator refuses to start until one is named (below).
        assert_eq!(c.namespace, None);
        assert!(!c.all_namespaces);
        assert!(!c.allow_all_without_policy);
        assert_eq!(c.runtime_class, "gvisor");
        assert_eq!(c.sandbox_image, "localhost/sandboxrun/sandbox-python:dev");
        assert_eq!(
            c.sandbox_image_data,
            "localhost/sandboxrun/sandbox-python-data:dev"
        );
        let none = Config::try_parse_from(["x", "--sandbox-image-data", ""]).unwrap();
        assert_eq!(none.sandbox_image_data, "");
        assert_eq!(c.tmp_size, "16Mi");
        assert_eq!(c.metrics_addr.to_string(), "0.0.0.0:8080");
        assert_eq!(c.canary_addr.to_string(), "0.0.0.0:8081");
        assert!(!c.leader_election);
        assert_eq!(c.lease_name, "sandboxrun-operator");
        assert_eq!(c.policy_file, None);
        assert_eq!(c.policy_poll_seconds, 5);
        assert_eq!(c.approval_timeout, SignedDuration::from_mins(15));
    }

    #[test]
    fn prometheus_url_credentials_stay_out_of_the_log() {
        let c = Config::try_parse_from(["x", "--prometheus-url", "http://u:hunter2@prom:9090"])
            .unwrap();
        assert_eq!(
            c.prometheus_url.as_ref().map(|u| u.0.as_str()),
            Some("http://u:hunter2@prom:9090")
        );
        let logged = format!("{c:?}");
        assert!(!logged.contains("hunter2"), "{logged}");
        assert!(logged.contains("http://***@prom:9090"), "{logged}");
        assert_eq!(Config::try_parse_from(["x"]).unwrap().prometheus_url, None);
    }

    #[test]
    fn approval_timeout_forms() {
        for (arg, secs) in [
            ("900", 900),
            ("90s", 90),
            ("15m", 900),
            ("1h", 3600),
            ("PT2M", 120),
        ] {
            let c = Config::try_parse_from(["x", "--approval-timeout", arg]).unwrap();
            assert_eq!(c.approval_timeout, SignedDuration::from_secs(secs), "{arg}");
        }
        for bad in ["0", "-5", "soon", ""] {
            assert!(
                Config::try_parse_from(["x", "--approval-timeout", bad]).is_err(),
                "{bad}"
            );
        }
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

//! Command line of `sandboxrun-mcp`.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use sandboxrun_core::limits::{DEFAULT_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS};

/// The sandboxrun MCP server: gives AI agents a `run_python` tool that runs code in a sandbox.
#[derive(Debug, Parser)]
#[command(name = "sandboxrun-mcp", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve MCP over stdin/stdout for a local client (logs go to stderr). No API key: the
    /// local user is trusted.
    Stdio {
        /// Where and how code runs.
        #[command(flatten)]
        backend: BackendArgs,
        /// Agent identity recorded for calls made over stdio: 1 to 253 ASCII letters, digits
        /// and . _ : @ + | / # = -, starting with a letter or digit.
        #[arg(long, env = "SANDBOXRUN_AGENT", default_value = "local", value_parser = parse_agent)]
        agent: String,
    },
    /// Serve MCP over HTTP: Streamable HTTP at /mcp, legacy SSE at /sse and /messages, plus
    /// /healthz and /metrics. Every MCP request needs an API key.
    Serve {
        /// Where and how code runs.
        #[command(flatten)]
        backend: BackendArgs,
        /// HTTP settings.
        #[command(flatten)]
        http: Box<HttpArgs>,
    },
    /// Print the SHA-256 of an API key read from stdin, for the key file's `sha256` field.
    HashKey,
}

/// Which backend runs the code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Create a SandboxRun in a cluster and wait for the operator's result.
    Kube,
    /// Run in a gVisor or bubblewrap sandbox on this machine.
    Local,
}

/// Backend and policy options, common to `stdio` and `serve`.
#[derive(Debug, Args)]
pub struct BackendArgs {
    /// Where code runs.
    #[arg(long, env = "SANDBOXRUN_BACKEND", value_enum, default_value = "local")]
    pub backend: BackendKind,
    /// Namespace of the SandboxRuns (kube backend).
    #[arg(long, env = "SANDBOXRUN_NAMESPACE", default_value = "sandboxrun-runs")]
    pub namespace: String,
    /// Seconds allowed beyond a run's timeout for scheduling and start-up before the frontend
    /// gives up on the operator (kube backend).
    #[arg(long, default_value_t = 120)]
    pub kube_grace_seconds: u64,
    /// Requests a second to the API server, sustained (kube backend; a client-side limit, like
    /// client-go's QPS: requests over it wait).
    #[arg(long, env = "SANDBOXRUN_KUBE_QPS", default_value_t = NonZeroU32::new(200).expect("non-zero"))]
    pub kube_qps: NonZeroU32,
    /// Requests to the API server allowed at once above --kube-qps (kube backend).
    #[arg(long, env = "SANDBOXRUN_KUBE_BURST", default_value_t = NonZeroU32::new(400).expect("non-zero"))]
    pub kube_burst: NonZeroU32,
    /// How long an execute_sql call follows a run that policy escalated, while it awaits a
    /// person's approval (kube backend): the call sends progress notifications, and returns the
    /// final result when the run is approved or denied in time, else an "awaiting approval:
    /// <run>" result. 0 (the default) returns that result at once. Seconds or a duration such
    /// as 90s, 5m.
    #[arg(long, env = "SANDBOXRUN_APPROVAL_WAIT", default_value = "0", value_parser = parse_wait)]
    pub approval_wait: Duration,
    /// How long a call made as an MCP task (a client that declares the tasks extension, and a
    /// call still running after a moment) may take, and how long its result is kept for the
    /// client to fetch after that: a task still running then is stopped and reported failed.
    /// A task that waits for an approval follows it this long at most. Seconds or a duration
    /// such as 90s, 30m, 1h.
    #[arg(long, env = "SANDBOXRUN_TASK_TTL", default_value = "1h", value_parser = parse_task_ttl)]
    pub task_ttl: Duration,
    /// Most calls one agent may have in flight at once, on every transport (runs, queries and
    /// approval waits); a call beyond it is refused with a message saying so.
    #[arg(long, env = "SANDBOXRUN_MAX_CALLS_PER_AGENT", default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    pub max_calls_per_agent: usize,
    /// Largest timeoutSeconds a caller may request.
    #[arg(long, default_value_t = MAX_TIMEOUT_SECONDS)]
    pub max_timeout_seconds: u32,
    /// Timeout of a call that asks for none.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_SECONDS)]
    pub default_timeout_seconds: u32,
    /// Root filesystem of the local sandbox (default: ~/.cache/sandboxrun/rootfs/sandbox-python).
    #[arg(long, env = "SANDBOXRUN_ROOTFS")]
    pub rootfs: Option<PathBuf>,
    /// Root filesystem of the local sandbox's `data` profile (numpy, pandas, scipy,
    /// matplotlib; default: ~/.cache/sandboxrun/rootfs/sandbox-python-data). When it is missing
    /// the server still starts: calls asking for `profile: "data"` are refused with a message
    /// saying how to build it (images/build.sh rootfs sandbox-python-data DIR).
    #[arg(long, env = "SANDBOXRUN_DATA_ROOTFS", value_name = "DIR")]
    pub data_rootfs: Option<PathBuf>,
    /// Local isolation: auto (gVisor if it works, else bubblewrap), gvisor or bubblewrap.
    #[arg(long, env = "SANDBOXRUN_ISOLATION", default_value = "auto")]
    pub isolation: String,
    /// Path of runsc (default: search PATH and ~/.cache/sandboxrun).
    #[arg(long)]
    pub runsc: Option<PathBuf>,
    /// Path of bwrap (default: search PATH).
    #[arg(long)]
    pub bwrap: Option<PathBuf>,
    /// Size of the local sandbox's private /tmp, in bytes.
    #[arg(long, default_value_t = sandboxrun_core::local::DEFAULT_TMP_SIZE_BYTES)]
    pub tmp_size_bytes: u64,
    /// Run the local sandbox even where its memory, pid and CPU limits cannot be enforced (no
    /// per-run cgroup: a non-root user without a delegated cgroup v2 subtree). Off by default:
    /// the server then refuses to start and says why; with it a warning names what is not
    /// enforced.
    #[arg(long, env = "SANDBOXRUN_ALLOW_WEAK_LIMITS", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_weak_limits: bool,
    /// Local sandboxes kept started and waiting for one program each, so a run_python call with
    /// the default cpu, memory and pids skips the engine's start-up (each runs one program and
    /// is destroyed; 0: none). Idle cost: about one interpreter each under bubblewrap, a whole
    /// gVisor sandbox each under gVisor (e2e/BENCHMARKS.md has the numbers).
    #[arg(long, env = "SANDBOXRUN_ARMED_SANDBOXES", default_value_t = 2)]
    pub armed_sandboxes: usize,
    /// The same for the data profile, whose sandboxes also import numpy, pandas, matplotlib and
    /// scipy while they wait (a call that asks for the profile then finds them loaded instead
    /// of paying a second or more for them). Idle cost: about 150 MB of memory each. Only
    /// where the data profile's root filesystem is installed.
    #[arg(long, env = "SANDBOXRUN_ARMED_DATA_SANDBOXES", default_value_t = 1)]
    pub armed_data_sandboxes: usize,
    /// Runtime state directory of the local sandbox.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Offer the execute_sql tool (read-only SQL checked by policy). Off by default.
    #[arg(long, env = "SANDBOXRUN_ENABLE_SQL", value_parser = clap::builder::BoolishValueParser::new())]
    pub enable_sql: bool,
    /// Offer the fetch_metrics tool (PromQL, checked by policy): embedded over this server's
    /// own call counters; with --backend kube against the operator's Prometheus. Off by default.
    #[arg(long, env = "SANDBOXRUN_ENABLE_METRICS", value_parser = clap::builder::BoolishValueParser::new())]
    pub enable_metrics: bool,
    /// Policy file judging every call, run_python included (local backend; in a cluster the
    /// operator judges): YAML, see config/policy/policy.yaml. Default: a built-in policy
    /// allowing run_python in the sandbox environment, column-level queries on the demo
    /// database's ledger table in the sandbox environment only (LIMIT at most 1000, no
    /// SELECT *) and fetch_metrics over this server's own calls.
    #[arg(long, env = "SANDBOXRUN_POLICY_FILE")]
    pub policy_file: Option<PathBuf>,
    /// Databases for execute_sql (local backend): a YAML map of name to
    /// {dialect: postgres|sqlite, url|urlEnv|urlFile}. Default: `demo`, a SQLite demo database
    /// created at ~/.cache/sandboxrun/demo.sqlite.
    #[arg(long, env = "SANDBOXRUN_DATABASES_FILE")]
    pub databases_file: Option<PathBuf>,
}

/// HTTP server options.
#[derive(Debug, Args)]
pub struct HttpArgs {
    /// Address to listen on.
    #[arg(long, env = "SANDBOXRUN_LISTEN", default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// YAML file listing accepted keys: `- {agent: NAME, sha256: HEX}` per key.
    #[arg(long, env = "SANDBOXRUN_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// Kubernetes Secret (in --namespace) whose `keys.yaml` lists more keys, same format.
    #[arg(long, env = "SANDBOXRUN_API_KEYS_SECRET")]
    pub api_keys_secret: Option<String>,
    /// Host header values accepted (`host` for any port, or `host:port`); repeatable. Default:
    /// localhost, 127.0.0.1, ::1. `*` accepts any host (only behind a proxy that checks it).
    #[arg(
        long = "allowed-host",
        env = "SANDBOXRUN_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// Origin values accepted from browsers (`scheme://host:port`); repeatable. Requests
    /// without an Origin header always pass, and so do pages of this server's own origin
    /// (`http://` or `https://` and exactly the request's Host, which must be allowed).
    #[arg(
        long = "allowed-origin",
        env = "SANDBOXRUN_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,
    /// Requests a minute per agent, on average.
    #[arg(long, default_value = "600")]
    pub rate_limit_per_minute: NonZeroU32,
    /// Requests an agent may make in a burst.
    #[arg(long, default_value = "60")]
    pub rate_limit_burst: NonZeroU32,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Also serve the reference tools, resources and prompts the official MCP conformance suite
    /// calls (`test_simple_text`, `test://static-text`, the tasks fixtures, ...), through the
    /// same transports, credentials, limits and task store as the product's tools
    /// (e2e/conformance/run.sh). A test server only: the flag exists in builds with the cargo
    /// feature `conformance`, which no image enables.
    #[cfg(feature = "conformance")]
    #[arg(long)]
    pub conformance_fixtures: bool,
    /// OAuth access tokens, next to API keys.
    #[command(flatten)]
    pub oauth: OAuthArgs,
}

/// OAuth 2.1 resource server options (the MCP authorization specification): with an issuer,
/// bearer JWT access tokens from that authorization server are accepted next to API keys.
#[derive(Debug, Args)]
pub struct OAuthArgs {
    /// Issuer identifier of the authorization server whose access tokens are accepted, exactly
    /// as its tokens' `iss` claim says it; its keys are found through its metadata
    /// (/.well-known/oauth-authorization-server or /.well-known/openid-configuration).
    #[arg(long, env = "SANDBOXRUN_OAUTH_ISSUER", requires = "oauth_resource")]
    pub oauth_issuer: Option<String>,
    /// This server's MCP URL as clients reach it (https://host/mcp): the resource tokens are
    /// asked for (RFC 8707), named in the protected resource metadata.
    #[arg(long, env = "SANDBOXRUN_OAUTH_RESOURCE", requires = "oauth_issuer")]
    pub oauth_resource: Option<String>,
    /// The `aud` access tokens must carry (default: --oauth-resource).
    #[arg(long, env = "SANDBOXRUN_OAUTH_AUDIENCE", requires = "oauth_issuer")]
    pub oauth_audience: Option<String>,
    /// The token claim that names the agent.
    #[arg(long, env = "SANDBOXRUN_OAUTH_AGENT_CLAIM", default_value = "sub")]
    pub oauth_agent_claim: String,
    /// Put before the claim's value to make the agent identity, so that no token can take the
    /// name (and the policy rules) of an API key's agent; key agents may not start with it.
    #[arg(long, env = "SANDBOXRUN_OAUTH_AGENT_PREFIX", default_value = "oauth:")]
    pub oauth_agent_prefix: String,
    /// YAML map of scope name to the tools and environments it grants
    /// (`{tools: [run_python], environments: [staging]}`). Default: sandboxrun:run_python,
    /// sandboxrun:execute_sql and sandboxrun:fetch_metrics grant their tool; sandboxrun:staging
    /// and sandboxrun:production grant those environments (the sandbox one is always granted).
    #[arg(long, env = "SANDBOXRUN_OAUTH_SCOPES_FILE", requires = "oauth_issuer")]
    pub oauth_scopes_file: Option<PathBuf>,
    /// The authorization server's key set URL, for one that publishes no metadata.
    #[arg(long, env = "SANDBOXRUN_OAUTH_JWKS_URI", requires = "oauth_issuer")]
    pub oauth_jwks_uri: Option<String>,
}

/// A duration of zero or more: bare seconds (`30`) or a friendly/ISO 8601 duration (`90s`, `5m`,
/// `PT1M`), at most an hour (an MCP request held open longer than that is a mistake).
/// An agent name exactly as given, if it is one ([`sandboxrun_core::validate_agent_name`]).
fn parse_agent(s: &str) -> Result<String, String> {
    sandboxrun_core::validate_agent_name(s)?;
    Ok(s.to_owned())
}

fn parse_wait(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > Duration::from_secs(3600) {
        return Err(format!("{s:?}: the approval wait is at most 1h"));
    }
    Ok(d)
}

fn parse_task_ttl(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !(Duration::from_secs(10)..=Duration::from_secs(24 * 3600)).contains(&d) {
        return Err(format!(
            "{s:?}: a task's time to live is between 10s and 24h"
        ));
    }
    Ok(d)
}

/// Seconds, or a duration such as 90s, 5m, 1h.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    match text.parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => {
            let signed = text
                .parse::<jiff::SignedDuration>()
                .map_err(|e| format!("{s:?} is not a duration (write 0, 30, 90s or 5m): {e}"))?;
            Duration::try_from(signed)
                .map_err(|_| format!("{s:?}: the duration must not be negative"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_defaults() {
        let cli = Cli::try_parse_from(["sandboxrun-mcp", "serve"]).unwrap();
        let Command::Serve { backend, http } = cli.command else {
            panic!("serve expected")
        };
        assert_eq!(backend.backend, BackendKind::Local);
        assert_eq!(http.listen.to_string(), "127.0.0.1:8000");
        assert_eq!(http.max_body_bytes, 1 << 20);
        assert!(http.allowed_hosts.is_empty());
        assert!(!backend.enable_sql);
        assert_eq!(backend.policy_file, None);
        assert_eq!(backend.approval_wait, Duration::ZERO);
        assert_eq!(backend.data_rootfs, None);
    }

    #[test]
    fn the_stdio_agent_is_a_valid_agent_name() {
        let agent = |args: &[&str]| {
            Cli::try_parse_from(["sandboxrun-mcp", "stdio"].iter().chain(args)).map(|cli| {
                let Command::Stdio { agent, .. } = cli.command else {
                    panic!("stdio expected")
                };
                agent
            })
        };
        if std::env::var_os("SANDBOXRUN_AGENT").is_none() {
            assert_eq!(agent(&[]).unwrap(), "local");
        }
        assert_eq!(
            agent(&["--agent", "alice@example.com"]).unwrap(),
            "alice@example.com"
        );
        for bad in [" local", "local ", "lo\u{202e}cal", "lo\x1b[2Jcal", "", "*"] {
            let err = agent(&["--agent", bad]).unwrap_err().to_string();
            assert!(err.contains("an agent name is 1 to 253"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn data_rootfs_is_an_option() {
        let cli =
            Cli::try_parse_from(["sandboxrun-mcp", "stdio", "--data-rootfs", "/srv/data"]).unwrap();
        let Command::Stdio { backend, .. } = cli.command else {
            panic!("stdio expected")
        };
        assert_eq!(backend.data_rootfs, Some(PathBuf::from("/srv/data")));
    }

    #[test]
    fn approval_wait_forms() {
        for (arg, secs) in [("0", 0), ("45", 45), ("90s", 90), ("5m", 300), ("PT1M", 60)] {
            let cli =
                Cli::try_parse_from(["sandboxrun-mcp", "serve", "--approval-wait", arg]).unwrap();
            let Command::Serve { backend, .. } = cli.command else {
                panic!("serve expected")
            };
            assert_eq!(backend.approval_wait, Duration::from_secs(secs), "{arg}");
        }
        for bad in ["-5", "-5s", "soon", "", "2h"] {
            assert!(
                Cli::try_parse_from(["sandboxrun-mcp", "serve", "--approval-wait", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn task_ttl_forms() {
        let ttl = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["sandboxrun-mcp", "serve"], args].concat())?;
            let Command::Serve { backend, .. } = cli.command else {
                panic!("serve expected")
            };
            Ok::<_, clap::Error>(backend.task_ttl)
        };
        assert_eq!(ttl(&[]).unwrap(), Duration::from_secs(3600));
        for (arg, secs) in [("10", 10), ("90s", 90), ("30m", 1800), ("24h", 86400)] {
            assert_eq!(
                ttl(&["--task-ttl", arg]).unwrap(),
                Duration::from_secs(secs),
                "{arg}"
            );
        }
        for bad in ["0", "9s", "25h", "-1m", "forever"] {
            assert!(ttl(&["--task-ttl", bad]).is_err(), "{bad}");
        }
    }
}

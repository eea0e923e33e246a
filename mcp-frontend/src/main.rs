//! `sandboxrun-mcp`: the MCP frontend of sandboxrun. See `cli.rs` for the commands and
//! ARCHITECTURE.md for where it sits: agents call `run_python` (and, when enabled, `execute_sql`
//! and `fetch_metrics`) here; `pipeline.rs` runs each call on the backend, which makes it a
//! SandboxRun (cluster) or judges and executes it on this machine (embedded).

mod backend;
mod cli;
#[cfg(feature = "conformance")]
mod conformance;
mod embedded;
mod grant;
mod http;
mod inflight;
mod logging;
mod metrics;
mod pipeline;
mod policy;
mod resources;
mod revision;
mod run_files;
mod scope;
mod server;
mod sessions;
mod tasks;
mod transport;

use std::io::{IsTerminal, Read};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use sandboxrun_core::Limits;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use backend::Backend;
use backend::kube::KubeBackend;
use backend::local::LocalBackend;
use cli::{BackendArgs, BackendKind, Cli, Command, HttpArgs};
use http::auth::{KeyStore, hash_key};
use http::origin::OriginPolicy;
use metrics::Metrics;
use policy::Policy;
use sandboxrun_core::metrics::CallStore;
use server::{SandboxRunServer, Shared};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Logs always go to stderr: in stdio mode stdout carries the protocol.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("sandboxrun_mcp=info,warn")),
        )
        .init();

    match cli.command {
        Command::HashKey => {
            let mut key = String::new();
            std::io::stdin().read_to_string(&mut key)?;
            let key = key.trim_end_matches(['\n', '\r']);
            anyhow::ensure!(!key.is_empty(), "no key on stdin");
            println!("{}", hash_key(key));
            Ok(())
        }
        Command::Stdio { backend, agent } => {
            // The local user may target any environment (policy still judges each call).
            let shared = Arc::new(shared_state(&backend, Default::default()).await?);
            transport::serve_stdio(SandboxRunServer::new(shared, Some(agent))).await
        }
        Command::Serve { backend, http } => {
            let oauth = oauth_server(&http)?;
            let keys = load_keys(&http, &backend, oauth.as_deref()).await?;
            #[allow(unused_mut)]
            let mut shared = shared_state(&backend, keys.environments()).await?;
            #[cfg(feature = "conformance")]
            if http.conformance_fixtures {
                tracing::warn!(
                    "serving the MCP conformance suite's reference fixtures next to the tools: \
                     a test server, not a product one"
                );
                shared.fixtures = Some(Arc::new(conformance::Fixtures::new()));
            }
            let shared = Arc::new(shared);
            let config = http::HttpConfig {
                listen: http.listen,
                keys,
                origin: OriginPolicy::new(&http.allowed_origins, &http.allowed_hosts),
                rate_per_minute: http.rate_limit_per_minute,
                rate_burst: http.rate_limit_burst,
                body_limit: http.max_body_bytes,
                oauth,
            };
            let shutdown = CancellationToken::new();
            tokio::spawn(cancel_on_signal(shutdown.clone()));
            http::serve(config, shared, shutdown).await
        }
    }
}

/// The backend and policy, checked before serving so that a missing sandbox or cluster is
/// reported at start-up.
async fn shared_state(
    args: &BackendArgs,
    environments: std::collections::HashMap<String, Vec<sandboxrun_core::Environment>>,
) -> anyhow::Result<Shared> {
    let calls = CallStore::new();
    let backend = match args.backend {
        BackendKind::Kube => {
            anyhow::ensure!(
                args.databases_file.is_none() && args.policy_file.is_none(),
                "--databases-file and --policy-file are for --backend local: in a cluster the \
                 operator holds the databases and the policy, and judges every run"
            );
            let kube = KubeBackend::connect(
                args.namespace.clone(),
                Duration::from_secs(args.kube_grace_seconds),
                args.approval_wait,
                sandboxrun_api::client::ClientRate {
                    qps: args.kube_qps,
                    burst: args.kube_burst,
                },
            )
            .await
            .context("cannot reach the Kubernetes API (KUBECONFIG or in-cluster config)")?;
            Backend::Kube(Box::new(kube))
        }
        BackendKind::Local => {
            let embedded = embedded::load(args, calls.clone()).await?;
            Backend::Local(LocalBackend::new(Arc::new(embedded)))
        }
    };
    let defaults = Limits {
        timeout_seconds: args.default_timeout_seconds,
        ..Limits::default()
    };
    Ok(Shared {
        backend,
        policy: Policy::new(args.max_timeout_seconds, defaults),
        metrics: Arc::new(Metrics::new()),
        sql: args.enable_sql,
        fetch_metrics: args.enable_metrics,
        calls,
        in_flight: inflight::InFlight::new(args.max_calls_per_agent),
        environments,
        tasks: tasks::Tasks::new(args.task_ttl),
        run_files: Default::default(),
        #[cfg(feature = "conformance")]
        fixtures: None,
    })
}

/// The OAuth resource server, when an issuer is configured.
fn oauth_server(http: &HttpArgs) -> anyhow::Result<Option<Arc<http::oauth::ResourceServer>>> {
    let args = &http.oauth;
    let (Some(issuer), Some(resource)) = (&args.oauth_issuer, &args.oauth_resource) else {
        return Ok(None);
    };
    let scopes = match &args.oauth_scopes_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the scope file {}", path.display()))?;
            grant::ScopeMap::parse(&text, &path.display().to_string())
                .map_err(anyhow::Error::msg)?
        }
        None => grant::ScopeMap::default(),
    };
    let server = http::oauth::ResourceServer::new(http::oauth::OAuthConfig {
        issuer: issuer.clone(),
        resource: resource.clone(),
        audience: args.oauth_audience.clone(),
        agent_claim: args.oauth_agent_claim.clone(),
        agent_prefix: args.oauth_agent_prefix.clone(),
        scopes,
        jwks_uri: args.oauth_jwks_uri.clone(),
    })
    .map_err(anyhow::Error::msg)?;
    if args.oauth_agent_prefix.is_empty() {
        tracing::warn!(
            "--oauth-agent-prefix is empty: a token whose claim equals an API key's agent acts \
             under that agent's name and policy rules"
        );
    }
    Ok(Some(Arc::new(server)))
}

/// Keys from the file and/or the Secret. Serving HTTP without any credential is refused: no key
/// and no OAuth issuer. A key's agent may not look like a token's (the OAuth agent prefix).
async fn load_keys(
    http: &HttpArgs,
    backend: &BackendArgs,
    oauth: Option<&http::oauth::ResourceServer>,
) -> anyhow::Result<KeyStore> {
    let mut keys = KeyStore::default();
    if let Some(path) = &http.api_keys_file {
        keys.merge(KeyStore::load_file(path)?);
    }
    if let Some(secret) = &http.api_keys_secret {
        keys.merge(load_secret_keys(&backend.namespace, secret).await?);
    }
    anyhow::ensure!(
        !keys.is_empty() || oauth.is_some(),
        "serve needs API keys or an OAuth issuer: pass --api-keys-file (YAML list of {{agent, \
         sha256}}; `sandboxrun-mcp hash-key` prints a key's sha256), --api-keys-secret, or \
         --oauth-issuer with --oauth-resource"
    );
    if let Some(oauth) = oauth
        && !oauth.agent_prefix().is_empty()
        && let Some(agent) = keys.agents().find(|a| a.starts_with(oauth.agent_prefix()))
    {
        anyhow::bail!(
            "the API key agent {agent:?} starts with the OAuth agent prefix {:?}, so a token \
             could act as it: rename the agent or change --oauth-agent-prefix",
            oauth.agent_prefix()
        );
    }
    Ok(keys)
}

/// Reads `keys.yaml` from a Secret.
async fn load_secret_keys(namespace: &str, name: &str) -> anyhow::Result<KeyStore> {
    use k8s_openapi::api::core::v1::Secret;
    let client = kube::Client::try_default().await?;
    let secret = kube::Api::<Secret>::namespaced(client, namespace)
        .get(name)
        .await
        .with_context(|| format!("cannot read Secret {namespace}/{name}"))?;
    let data = secret
        .data
        .as_ref()
        .and_then(|d| d.get("keys.yaml"))
        .with_context(|| format!("Secret {namespace}/{name} has no keys.yaml"))?;
    let text = std::str::from_utf8(&data.0).context("keys.yaml is not UTF-8")?;
    Ok(KeyStore::parse(
        text,
        &format!("Secret {namespace}/{name}"),
    )?)
}

/// Cancels `token` on SIGINT or SIGTERM, for a graceful shutdown.
async fn cancel_on_signal(token: CancellationToken) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    token.cancel();
}

//! sandboxrun-operator: reconciles SandboxRuns into single-use sandbox Pods.

mod admission;
mod audit;
mod canary;
mod config;
mod controller;
mod events;
#[cfg(test)]
mod fixtures;
mod gate;
mod labels;
mod leader;
mod metrics;
mod outcome;
mod policy;
mod pool;
mod pool_scale;
mod pool_streams;
mod python;
mod query;
#[cfg(test)]
mod query_depth_tests;
mod quota_room;
mod run_quota;
mod runner_files;
mod session;
mod ttl;
mod watched_pods;

use std::sync::Arc;

use clap::Parser;
use futures::FutureExt;
use tokio::sync::watch;
use tracing::info;
use tracing_subscriber::EnvFilter;

use crate::config::Config;
use crate::controller::Context;
use crate::python::pod::SandboxConfig;

/// Completes on SIGTERM (what the kubelet sends) or Ctrl-C.
async fn termination() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received, shutting down"),
        _ = tokio::signal::ctrl_c() => info!("interrupt received, shutting down"),
    }
}

/// A future that completes once `rx` turns true.
async fn until_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// The runtime's workers get 8 MiB of stack, not Tokio's 2: a debug build (the e2e suite's) gives
/// every future an async function builds its own slot in that function's stack frame, and a
/// reconcile of a session's call takes about 2 MiB there (under 100 KiB in a release build).
/// Address space only: a stack's pages are touched as it grows.
const WORKER_STACK_BYTES: usize = 8 << 20;

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(WORKER_STACK_BYTES)
        .build()?
        .block_on(operate())
}

async fn operate() -> anyhow::Result<()> {
    let config = Config::parse();
    tracing_subscriber::fmt()
        .json()
        .with_current_span(false)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    // TLS: the workspace enables exactly one rustls crypto provider (ring, through kube), so
    // rustls picks it without an explicit install; a second provider would panic here instead.

    let identity = config.identity();
    info!(?config, %identity, "starting sandboxrun-operator");
    let namespace = config.watched_namespace()?;
    let policy = match &config.policy_file {
        Some(path) => match policy::load(path) {
            Ok(store) => Some(store),
            Err(e) => {
                tracing::error!(error = %e, "refusing to start: the policy file is unusable");
                anyhow::bail!("refusing to start: {e}");
            }
        },
        None if config.allow_all_without_policy => {
            tracing::warn!(
                "no --policy-file and --allow-all-without-policy: every run is allowed; install \
                 a policy to enforce governance"
            );
            None
        }
        None => {
            tracing::warn!(
                "no --policy-file: every run is blocked (the operator fails closed); install a \
                 policy, or pass --allow-all-without-policy on a test cluster"
            );
            None
        }
    };
    let databases = match &config.databases_file {
        Some(path) => {
            let loaded = sandboxrun_core::load_databases_file(path)
                .map_err(anyhow::Error::from)
                .and_then(|c| Ok(sandboxrun_core::Databases::from_config(&c)?));
            match loaded {
                Ok(dbs) => {
                    info!(databases = ?dbs.names(), "sql runs enabled");
                    Some(dbs)
                }
                Err(e) => {
                    tracing::error!(error = %e, "refusing to start: the databases file is unusable");
                    anyhow::bail!("refusing to start: {e}");
                }
            }
        }
        None => None,
    };
    let prometheus = match &config.prometheus_url {
        Some(url) if !url.0.trim().is_empty() => {
            match sandboxrun_core::metrics::PrometheusClient::new(
                &url.0,
                sandboxrun_core::metrics::prometheus::DEFAULT_TIMEOUT,
            ) {
                Ok(client) => {
                    info!(prometheus = client.url(), "metrics runs enabled");
                    Some(client)
                }
                Err(e) => {
                    tracing::error!(error = %e, "refusing to start: the Prometheus URL is unusable");
                    anyhow::bail!("refusing to start: {e}");
                }
            }
        }
        _ => None,
    };
    let metrics = Arc::new(metrics::Metrics::default());
    // Every API request is counted (sandboxrun_api_requests_total), watches included, and waits
    // for the client-side rate limit (counted when sent, not when it waits).
    let counted = metrics.clone();
    let rate = sandboxrun_api::client::ClientRate {
        qps: config.kube_qps,
        burst: config.kube_burst,
    };
    let client = kube::client::ClientBuilder::try_from(kube::Config::infer().await?)?
        .with_layer(&sandboxrun_api::client::RateLimitLayer::new(rate))
        .with_layer(&tower::util::MapRequestLayer::new(
            move |request: http::Request<kube::client::Body>| {
                counted.api_request(&request);
                request
            },
        ))
        .build();

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        termination().await;
        let _ = stop_tx.send(true);
    });

    if let (Some(store), Some(path)) = (&policy, &config.policy_file) {
        tokio::spawn(policy::watch_file(
            store.clone(),
            path.clone(),
            std::time::Duration::from_secs(config.policy_poll_seconds),
            stop_rx.clone(),
        ));
    }

    // Sandboxes reach it at this Pod's IP: before it is in their spec, the canary listens.
    let canary_target = canary::advertised(config.pod_ip.as_deref(), config.canary_addr);
    if canary_target.is_none() {
        tracing::error!(
            pod_ip = ?config.pod_ip,
            "no usable POD_IP: sandboxes get no canary, and those with a network interface \
             (runc, Kata) run nothing (IsolationNotInForce); set POD_IP from status.podIP"
        );
    }
    let canary_addr = config.canary_addr;
    let canary_stop = until_true(stop_rx.clone());
    tokio::spawn(async move {
        if let Err(e) = canary::serve(canary_addr, canary_stop).await {
            tracing::error!(error = %e, addr = %canary_addr, "the canary cannot listen: sandboxes with a network interface will run nothing");
        }
    });

    let server = tokio::spawn(metrics::serve(
        config.metrics_addr,
        metrics.clone(),
        until_true(stop_rx.clone()),
    ));

    // The pools runs claim from; the pool controller itself runs with the run controller.
    let (pool_store, pool_writer) = kube::runtime::reflector::store();
    let pools_api = || -> kube::Api<sandboxrun_api::SandboxPool> {
        match namespace {
            Some(ns) => kube::Api::namespaced(client.clone(), ns),
            None => kube::Api::all(client.clone()),
        }
    };
    let pods_api = || -> kube::Api<k8s_openapi::api::core::v1::Pod> {
        match namespace {
            Some(ns) => kube::Api::namespaced(client.clone(), ns),
            None => kube::Api::all(client.clone()),
        }
    };
    tokio::spawn(pool::mirror(pools_api(), pool_writer, metrics.clone()));
    let (idle_pods, idle_writer) = kube::runtime::reflector::store();
    tokio::spawn(pool::mirror_idle_pods(pods_api(), idle_writer));
    // The room the namespace's quotas have for sandbox Pods: a burst asks for no more.
    // Beside the quotas' usage, the operator's Pods: a Pod it created counts against the room
    // until this watch has it (quota_room.rs).
    let (quotas, quota_writer) = kube::runtime::reflector::store();
    let (sandbox_pods, sandbox_pods_writer) = kube::runtime::reflector::store();
    let quota_room = quota_room::QuotaRoom::new(quotas, sandbox_pods.clone());
    tokio::spawn(quota_room::watch_pods(
        pods_api(),
        format!("{}={}", python::pod::LABEL_MANAGED_BY, python::pod::MANAGER),
        sandbox_pods_writer,
    ));
    let quotas_api: kube::Api<k8s_openapi::api::core::v1::ResourceQuota> = match namespace {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    };
    tokio::spawn(quota_room.clone().watch(quotas_api, quota_writer));

    let ctx = Arc::new(
        Context::new(
            client.clone(),
            SandboxConfig {
                runtime_class: config.runtime_class.clone(),
                image: config.sandbox_image.clone(),
                data_image: config.sandbox_image_data.clone(),
                tmp_size: config.tmp_size.clone(),
                canary: canary_target.map(|a| a.to_string()),
            },
            metrics,
            events::Events::new(client.clone(), identity.clone()),
            policy,
            config.approval_timeout,
        )
        .allowing_all_without_policy(config.allow_all_without_policy)
        .with_databases(databases)
        .with_prometheus(prometheus, config.prometheus_environment)
        .with_identity(identity.clone())
        .with_pools(pool_store, idle_pods)
        .with_quota_room(quota_room, sandbox_pods)
        .holding_streams(config.hold_streams)
        .with_queue_allowance(std::time::Duration::from_secs(
            config.max_queue_wait_seconds,
        )),
    );

    let pool_ctx = Arc::new(pool::PoolContext {
        client: client.clone(),
        sandbox: ctx.sandbox.clone(),
        metrics: ctx.metrics.clone(),
        claims: ctx.pool_claims.clone(),
        demand: ctx.pool_demand.clone(),
        held: ctx.held.clone(),
        admission: ctx.admission.clone(),
        runner_files: ctx.runner_files.clone(),
        claimed: ctx.claimed_pods.clone(),
        claiming: ctx.claims_in_doubt.clone(),
    });
    let config_maps_api = || -> kube::Api<k8s_openapi::api::core::v1::ConfigMap> {
        match namespace {
            Some(ns) => kube::Api::namespaced(client.clone(), ns),
            None => kube::Api::all(client.clone()),
        }
    };

    let run_quota = match (&config.run_count_quota, config.max_stored_runs, namespace) {
        (Some(quota), max_runs, Some(ns)) if max_runs > 0 => Some(run_quota::RunQuota {
            namespace: ns.to_owned(),
            quota: quota.clone(),
            max_runs,
            probe_namespace: config.lease_namespace.clone(),
        }),
        _ => None,
    };

    if config.leader_election {
        let lease = leader::LeaseConfig {
            name: config.lease_name.clone(),
            namespace: config.lease_namespace.clone(),
            identity,
        };
        let namespace = namespace.map(str::to_owned);
        let concurrency = config.reconcile_concurrency;
        leader::run_while_leader(client.clone(), lease, stop_rx.clone(), |stop| {
            let ctx = ctx.clone();
            let namespace = namespace.clone();
            let quota = run_quota.clone();
            let client = client.clone();
            let (pools, pods) = (pools_api(), pods_api());
            let pool_ctx = pool_ctx.clone();
            let runner_keeper = tokio::spawn(runner_files::keep(
                ctx.runner_files.clone(),
                config_maps_api(),
                ctx.sandbox_pods.clone(),
            ));
            async move {
                // Only the leader edits the quota, so two replicas never race on the probe.
                let keeper = quota.map(|q| tokio::spawn(run_quota::keep(client, q)));
                let stop = stop.shared();
                tokio::join!(
                    controller::run(ctx.clone(), namespace.as_deref(), concurrency, stop.clone()),
                    session::controller::run(ctx, namespace.as_deref(), stop.clone()),
                    pool::run(pool_ctx.clone(), pools, pods, stop),
                );
                keeper.inspect(tokio::task::JoinHandle::abort);
                runner_keeper.abort();
                // A replica that no longer leads claims nothing: the sandboxes' streams go, and
                // the sandboxes with them (pool_streams.rs), before the next leader looks.
                pool_ctx.held.let_go(&pool_ctx.client).await;
            }
        })
        .await?;
    } else {
        let keeper = run_quota.map(|q| tokio::spawn(run_quota::keep(client.clone(), q)));
        let runner_keeper = tokio::spawn(runner_files::keep(
            ctx.runner_files.clone(),
            config_maps_api(),
            ctx.sandbox_pods.clone(),
        ));
        tokio::join!(
            controller::run(
                ctx.clone(),
                namespace,
                config.reconcile_concurrency,
                until_true(stop_rx.clone()),
            ),
            session::controller::run(ctx, namespace, until_true(stop_rx.clone())),
            pool::run(
                pool_ctx.clone(),
                pools_api(),
                pods_api(),
                until_true(stop_rx.clone())
            ),
        );
        keeper.inspect(tokio::task::JoinHandle::abort);
        runner_keeper.abort();
        pool_ctx.held.let_go(&pool_ctx.client).await;
    }

    // The metrics server stops with the same signal; wait so the port is released cleanly.
    match server.await {
        Ok(Err(e)) => tracing::warn!(error = %e, "metrics server failed"),
        Err(e) => tracing::warn!(error = %e, "metrics server task failed"),
        Ok(Ok(())) => {}
    }
    info!("stopped");
    Ok(())
}

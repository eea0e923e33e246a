//! The embedded mode's resources, built once at start-up from the command line: the policy every
//! call is judged by (`--policy-file`, else the embedded default), the local sandbox, the
//! databases (`--databases-file`, else the SQLite demo database, created on first use from
//! `config/demo/demo.sql` and opened read-only) and the call record. A missing piece is reported
//! here, not on the first call.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use sandboxrun_core::local::{LocalSandbox, LocalSandboxConfig, Preference};
use sandboxrun_core::metrics::CallStore;
use sandboxrun_core::policy::embedded::{self, DEMO_DATABASE};
use sandboxrun_core::query::demo;
use sandboxrun_core::tools::Embedded;
use sandboxrun_core::{Databases, Profile};

use crate::cli::BackendArgs;

/// Loads everything the enabled tools need.
pub async fn load(args: &BackendArgs, calls: CallStore) -> anyhow::Result<Embedded> {
    let policy = embedded::load(args.policy_file.as_deref()).context("the policy is not usable")?;
    let sandbox = detect_sandbox(args)
        .await
        .context("the local sandbox is not usable")?;
    let databases = if args.enable_sql {
        Some(
            load_databases(args)
                .await
                .context("execute_sql cannot start")?,
        )
    } else {
        None
    };
    Ok(Embedded {
        policy,
        sandbox: Some(sandbox),
        databases,
        calls,
        sessions: Default::default(),
    })
}

/// Finds a usable isolation (gVisor, then bubblewrap, unless one is forced) and checks the root
/// filesystem. The `data` profile's root filesystem is optional: without it the server starts
/// and refuses calls that ask for the profile, saying how to build it.
async fn detect_sandbox(args: &BackendArgs) -> anyhow::Result<LocalSandbox> {
    let preference: Preference = args.isolation.parse().map_err(anyhow::Error::msg)?;
    let config = LocalSandboxConfig {
        rootfs: args
            .rootfs
            .clone()
            .unwrap_or_else(LocalSandboxConfig::default_rootfs),
        data_rootfs: Some(
            args.data_rootfs
                .clone()
                .unwrap_or_else(LocalSandboxConfig::default_data_rootfs),
        ),
        preference,
        runsc: args.runsc.clone(),
        bwrap: args.bwrap.clone(),
        tmp_size_bytes: args.tmp_size_bytes,
        allow_weak_limits: args.allow_weak_limits,
        state_dir: args
            .state_dir
            .clone()
            .unwrap_or_else(LocalSandboxConfig::default_state_dir),
    };
    let sandbox = LocalSandbox::detect(config).await?;
    sandbox.arm(Profile::Minimal, args.armed_sandboxes);
    sandbox.arm(Profile::Data, args.armed_data_sandboxes);
    tracing::info!(
        isolation = %sandbox.isolation(),
        armed = args.armed_sandboxes,
        armed_data = args.armed_data_sandboxes,
        "local sandbox ready"
    );
    // Named on the command line but not usable: the person who named it should hear so (the
    // default's absence is only logged, by the driver).
    if args.data_rootfs.is_some()
        && let Err(why) = sandbox.profile_available(Profile::Data)
    {
        eprintln!("sandboxrun-mcp: WARNING: the data profile is not available: {why}");
    }
    if let Some(weak) = sandbox.weak_limits() {
        // Also on stderr as such: this is a warning a person must see, not a log line.
        eprintln!("sandboxrun-mcp: WARNING: {weak}");
    }
    Ok(sandbox)
}

/// `--databases-file`, else the demo SQLite file (created when missing).
async fn load_databases(args: &BackendArgs) -> anyhow::Result<Databases> {
    let config = match args.databases_file.as_deref() {
        Some(path) => sandboxrun_core::load_databases_file(path)?,
        None => {
            let path = demo_database_path();
            demo::ensure_sqlite(&path).await?;
            BTreeMap::from([(DEMO_DATABASE.to_owned(), demo::database_config(&path))])
        }
    };
    let databases = Databases::from_config(&config)?;
    tracing::info!(databases = ?databases.names(), "execute_sql ready");
    Ok(databases)
}

/// `$SANDBOXRUN_CACHE/demo.sqlite`, else `~/.cache/sandboxrun/demo.sqlite`.
pub fn demo_database_path() -> PathBuf {
    let cache = std::env::var_os("SANDBOXRUN_CACHE")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map_or_else(|| PathBuf::from("/root"), PathBuf::from)
                .join(".cache")
                .join("sandboxrun")
        });
    cache.join("demo.sqlite")
}

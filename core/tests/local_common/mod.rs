//! Shared set-up of the local sandbox tests: one probed [`LocalSandbox`] per available engine,
//! and host-side checks for leftovers.
//!
//! Every test takes [`serial`] first: the leftover checks look at the whole machine (processes,
//! cgroups, bundles), so no other run of this binary may be in flight meanwhile.
//!
//! `SANDBOXRUN_REQUIRE_ENGINES=gvisor,bubblewrap` turns a missing engine (or root file system)
//! into a failure instead of a skip; CI sets it. `SANDBOXRUN_TEST_RUNSC=PATH` tests that runsc
//! instead of the one the driver would find.

#![allow(dead_code)]

use std::path::Path;
use std::sync::OnceLock;

use tokio::sync::{Mutex, MutexGuard};

use sandboxrun_core::FileCaps;
use sandboxrun_core::tools::python::classify;
use sandboxrun_core::{
    Isolation, Limits, LocalRun, LocalSandbox, LocalSandboxConfig, Phase, Preference, RunnerResult,
};

/// A local run as the tool reports it: the one classification of its end (phase and reason,
/// `None` on success) next to what the runner reported (or, without an envelope, a result
/// with the exit status and the classification's message as stderr).
#[derive(Debug)]
pub struct Run {
    /// The terminal phase.
    pub outcome: Phase,
    /// Why, unless it succeeded.
    pub reason: Option<String>,
    /// The runner's result.
    pub result: RunnerResult,
    /// Wall-clock time of the whole sandbox.
    pub duration_ms: u64,
}

impl Run {
    /// Classifies a driver's run under `limits`.
    pub fn of(run: LocalRun, limits: &Limits) -> Self {
        let c = classify(
            run.envelope.as_ref(),
            &run.observed,
            limits,
            FileCaps::default(),
        );
        let result = run.envelope.unwrap_or_else(|| RunnerResult {
            version: 1,
            exit_code: run.observed.exit_code.unwrap_or(137),
            stdout: String::new(),
            stderr: c.message.clone(),
            stdout_truncated: false,
            stderr_truncated: false,
            signal: None,
            oom_kill: run.observed.oom_killed,
            timed_out: run.observed.deadline_hit,
            duration_millis: None,
            files: Vec::new(),
            files_omitted: Vec::new(),
            not_run: None,
            call: None,
            session: None,
        });
        Self {
            outcome: c.phase,
            reason: (c.phase != Phase::Succeeded).then(|| c.reason.as_str().to_owned()),
            result,
            duration_ms: run.duration_ms,
        }
    }
}

/// Set in this process before any sandbox starts; must never be visible inside one.
pub const CANARY_VAR: &str = "SANDBOXRUN_TEST_CANARY";

static SERIAL: Mutex<()> = Mutex::const_new(());
static ENGINES: OnceLock<Vec<(Isolation, LocalSandbox)>> = OnceLock::new();

/// Serialises the tests of one binary (see the module documentation).
pub async fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().await
}

fn required() -> Vec<String> {
    std::env::var("SANDBOXRUN_REQUIRE_ENGINES")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The engines that work here, each probed once per test binary. Call with [`serial`] held.
pub fn engines() -> &'static [(Isolation, LocalSandbox)] {
    ENGINES.get_or_init(|| {
        // SAFETY: called with the serial lock held, before any test thread reads the
        // environment or starts a sandbox (every test takes the lock first).
        #[allow(unsafe_code)]
        // SAFETY: set once, before any sandbox (or other thread of this test) starts.
        unsafe {
            std::env::set_var(CANARY_VAR, "host-secret-must-not-leak")
        };
        // detect() is async; the tests each own a runtime, so probe on a separate thread.
        std::thread::spawn(|| {
            let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
            let required = required();
            let mut found = Vec::new();
            for (isolation, preference) in [
                (Isolation::Gvisor, Preference::Gvisor),
                (Isolation::Bubblewrap, Preference::Bubblewrap),
            ] {
                let config = LocalSandboxConfig {
                    preference,
                    runsc: std::env::var_os("SANDBOXRUN_TEST_RUNSC").map(Into::into),
                    ..LocalSandboxConfig::default()
                };
                match rt.block_on(LocalSandbox::detect(config)) {
                    Ok(sandbox) => {
                        eprintln!(
                            "local sandbox tests: {isolation} with {} (cgroups: {})",
                            sandbox.engine_path().display(),
                            sandbox.uses_cgroups()
                        );
                        found.push((isolation, sandbox));
                    }
                    Err(e) if required.iter().any(|r| r == isolation.as_str()) => {
                        panic!("{isolation} is required (SANDBOXRUN_REQUIRE_ENGINES) but: {e}")
                    }
                    Err(e) => eprintln!("local sandbox tests: skipping {isolation}: {e}"),
                }
            }
            found
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Host processes whose command line contains `needle`.
pub fn processes_containing(needle: &str) -> Vec<String> {
    let own = std::process::id().to_string();
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == own {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push(format!(
                "{name}: {}",
                cmdline.chars().take(200).collect::<String>()
            ));
        }
    }
    found
}

/// Everything a run could leave behind on this host: processes of the driver's engines
/// (recognised by the driver's state directory or the root file system in their command line,
/// or by `token` in the code), per-run cgroups and OCI bundles.
pub fn leftovers(token: &str) -> Vec<String> {
    let config = LocalSandboxConfig::default();
    let mut found = processes_containing(token);
    found.extend(processes_containing(
        &config.state_dir.join("runsc").display().to_string(),
    ));
    found.extend(processes_containing(&config.rootfs.display().to_string()));
    for controller in [
        "memory", "pids", "cpu", "cpuset", "devices", "freezer", "blkio",
    ] {
        let parent = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join("sandboxrun");
        for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                found.push(format!("cgroup {}", entry.path().display()));
            }
        }
    }
    for entry in std::fs::read_dir(config.state_dir.join("bundles"))
        .into_iter()
        .flatten()
        .flatten()
    {
        found.push(format!("bundle {}", entry.path().display()));
    }
    found
}

/// Polls [`leftovers`] for up to `secs` seconds; returns what is still there.
pub async fn wait_no_leftovers(token: &str, secs: u64) -> Vec<String> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let found = leftovers(token);
        if found.is_empty() || std::time::Instant::now() > until {
            return found;
        }
        // Asynchronously: a sandbox's teardown runs on this runtime after its call returned.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

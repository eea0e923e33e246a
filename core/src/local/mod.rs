//! The embedded ("local") sandbox driver: runs `run_python` on this machine, without Kubernetes,
//! under the same constraints as the cluster's sandbox Pods: gVisor (`runsc`) when it is present
//! and works, else bubblewrap (`bwrap`); a clean environment (PATH, HOME, LANG only), no network
//! (only `lo`), the read-only `sandbox-python` image as the whole file system, a private
//! size-limited `/tmp`, the unprivileged uid 65532, no capabilities, memory / pid / CPU / time
//! limits and capped output.
//!
//! Inside the sandbox the same runner as in the Pod ([`crate::runner`]) runs the code in a child
//! interpreter, enforces the timeout, caps each stream and prints one envelope line, which is
//! read back from the sandbox's stdout.
//!
//! How the limits are enforced:
//! - time: the runner kills the code at `timeoutSeconds` (the run ends `TimedOut`); the driver
//!   kills the whole sandbox at `timeoutSeconds` + a start-up grace, should the runner hang;
//! - memory, pids, CPU: a cgroup per run (`cgroup.rs`) holding every sandbox process, which
//!   the driver must be able to create (root, or a writable cgroup v2 subtree):
//!   [`LocalSandbox::detect`] makes one with all three limits to find out, and refuses to run
//!   without ([`LocalSandboxError::WeakLimits`]). The memory limit covers everything the
//!   sandbox holds, tmpfs pages and memory files included. An OOM kill is read from the
//!   group's counters, so it is reported as `OOMKilled` even when it took the runner down too.
//!   Only with [`LocalSandboxConfig::allow_weak_limits`] does it run without one (with a
//!   warning, [`LocalSandbox::weak_limits`]), on rlimits, which are per process and weaker:
//!   `RLIMIT_AS` = the memory limit (a large allocation then fails with `MemoryError`, a
//!   non-zero exit; but several processes, memory files and the tmpfs add up beyond it),
//!   `RLIMIT_NPROC` = the pid limit (set by the runner; it counts per user namespace, so per
//!   sandbox), no CPU limit at all;
//! - file systems: the image read-only; `/tmp` (`tmp_size_bytes`) and `/dev/shm`
//!   ([`SHM_SIZE_BYTES`]) are the only writable places, both bounded tmpfs; `RLIMIT_FSIZE` = the
//!   `/tmp` size for any single file; the driver's state directory is private (`statedir.rs`);
//! - system calls: a seccomp filter (`seccomp.rs`) makes ptrace, mounts, namespaces, keyrings,
//!   bpf, perf events, userfaultfd, io_uring, kernel modules and the like fail with `EPERM`,
//!   on both engines; under bubblewrap, an i386 or x32 system call kills the process;
//! - output: the runner keeps `outputBytes` of each stream and flags truncation; the driver itself
//!   keeps only a bounded tail of the sandbox's stdout, whatever the code writes into it;
//! - cancellation: dropping the future returned by [`LocalSandbox::run_python`] kills the engine
//!   process (`kill_on_drop`, its process group), `runsc delete --force`s a gVisor sandbox, kills
//!   whatever is left in the run's cgroup, and removes the cgroup and the bundle directory before
//!   the drop returns. bubblewrap's `--die-with-parent` covers the no-cgroup case.
//!
//! What each engine enforces, and how:
//!
//! | | gVisor (`runsc run`, OCI bundle) | bubblewrap |
//! |---|---|---|
//! | the code's kernel | gVisor's Sentry (user space) | the host's, behind the filter |
//! | system call filter | OCI `linux.seccomp` (`--oci-seccomp`) | BPF, `--add-seccomp-fd` |
//! | memory, pids, CPU | the run's cgroup (`cgroupsPath`) | the run's cgroup, joined at fork |
//! | `/tmp`, `/dev/shm` | tmpfs with `size=` | `--size N --tmpfs`; `/dev` read-only |
//! | network | `--network=none`: only `lo` | new network namespace: only `lo` |
//! | user | 65532, no capabilities, `noNewPrivileges` | 65532, `--cap-drop ALL`, `no_new_privs` |

mod bwrap;
mod cgroup;
mod gvisor;
mod rootfs;
mod seccomp;
mod session;
mod statedir;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::files::{ENVELOPE_FILES_MAX_BYTES, Profile};
use crate::limits::Limits;
use crate::runner::{
    Observed, OutputFn, Program, RunnerResult, parse_envelope, parse_output_line, program_frame,
    runner_argv,
};

pub use crate::quantity::{cpu_millis, memory_bytes};
pub use rootfs::MARKER as ROOTFS_MARKER;
pub use session::{LocalSession, SessionCall};

use cgroup::{CgroupLimits, RunCgroup};

/// Default size of the sandbox's `/tmp` (the Pod's memory-backed `/tmp` is 16Mi by default;
/// locally a little more room costs nothing).
pub const DEFAULT_TMP_SIZE_BYTES: u64 = 64 << 20;

/// Size of each sandbox's `/dev/shm` (POSIX shared memory and semaphores, which
/// `multiprocessing` uses). Like `/tmp` it is memory that no per-process limit covers, so it is
/// small and bounded on both engines; the rest of `/dev` is read-only.
pub const SHM_SIZE_BYTES: u64 = 16 << 20;

/// How long the driver waits beyond the code's timeout before it kills the sandbox itself: the
/// runner normally ends the run at the timeout; this covers sandbox start-up and a hung runner.
const START_GRACE: Duration = Duration::from_secs(10);

/// Longest a `runsc delete --force` may take during a cleanup.
const RUNSC_DELETE_WITHIN: Duration = Duration::from_secs(5);

/// How much of the engine's own stderr (bwrap or runsc errors) is kept for error messages.
const ENGINE_STDERR_BYTES: usize = 16 * 1024;

/// Processes the sandbox needs besides the code's own under bubblewrap (bwrap, the runner and
/// its reader threads: cgroup pid limits count threads).
const BWRAP_PID_OVERHEAD: u64 = 16;

/// The same under gVisor: the Sentry and the Gofer are Go programs with dozens of threads, and
/// each address space of the sandboxed code is a host stub process (systrap).
const GVISOR_PID_OVERHEAD: u64 = 256;

/// Which engine actually runs the sandboxes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// gVisor's `runsc`: a user-space kernel between the code and the host kernel.
    Gvisor,
    /// bubblewrap: Linux namespaces on the host kernel.
    Bubblewrap,
}

impl Isolation {
    /// The lowercase name used in configuration and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Gvisor => "gvisor",
            Isolation::Bubblewrap => "bubblewrap",
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the user asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Preference {
    /// gVisor if a runsc is found and its probe works, else bubblewrap.
    #[default]
    Auto,
    /// gVisor or an error.
    Gvisor,
    /// bubblewrap or an error.
    Bubblewrap,
}

impl FromStr for Preference {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Preference::Auto),
            "gvisor" | "runsc" => Ok(Preference::Gvisor),
            "bubblewrap" | "bwrap" => Ok(Preference::Bubblewrap),
            other => Err(format!(
                "unknown isolation {other:?}: expected auto, gvisor or bubblewrap"
            )),
        }
    }
}

/// Where things are and what to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalSandboxConfig {
    /// The unpacked `sandbox-python` image (see [`LocalSandboxConfig::default_rootfs`]).
    pub rootfs: PathBuf,
    /// The unpacked `sandbox-python-data` image, for the `data` profile (see
    /// [`LocalSandboxConfig::default_data_rootfs`]). A directory that is missing or incomplete
    /// makes the profile unavailable (its calls get an error saying how to build it), not the
    /// driver.
    pub data_rootfs: Option<PathBuf>,
    /// Which engine to use.
    pub preference: Preference,
    /// A specific runsc; None searches `PATH`, then `~/.cache/sandboxrun/gvisor-*/runsc`.
    pub runsc: Option<PathBuf>,
    /// A specific bwrap; None searches `PATH`.
    pub bwrap: Option<PathBuf>,
    /// Size of each sandbox's private `/tmp`, in bytes.
    pub tmp_size_bytes: u64,
    /// The driver's working directory: runsc's state (`runsc/`) and per-run OCI bundles
    /// (`bundles/`). Created with mode 0700 when missing; an existing one must be a real
    /// directory (not a symlink) owned by the effective uid with no group or other access, and
    /// the directories above it writable only by root or that uid (or sticky, like `/tmp`), or
    /// the driver refuses it ([`LocalSandboxError::UnsafeStateDir`]).
    pub state_dir: PathBuf,
    /// Run even where the driver cannot make a cgroup per run (an unprivileged user on a
    /// cgroup v1 machine, or on cgroup v2 without a delegated subtree), with per-process
    /// rlimits only: memory is then limited per process (`RLIMIT_AS`; several processes and
    /// the `/tmp` and `/dev/shm` tmpfs add up beyond it), processes by `RLIMIT_NPROC`, and CPU
    /// not at all (only the timeout ends a run). False by default: [`LocalSandbox::detect`]
    /// then fails with [`LocalSandboxError::WeakLimits`], saying what is missing. When true it
    /// succeeds, logs a warning naming the limits that are not enforced (a `tracing` warning,
    /// once per `detect`), and [`LocalSandbox::weak_limits`] returns it.
    pub allow_weak_limits: bool,
}

impl LocalSandboxConfig {
    /// `~/.cache/sandboxrun/rootfs/sandbox-python` (`$SANDBOXRUN_CACHE/rootfs/sandbox-python`
    /// when set), where `images/build.sh rootfs sandbox-python DIR` is expected to unpack.
    pub fn default_rootfs() -> PathBuf {
        rootfs::default_rootfs()
    }

    /// `~/.cache/sandboxrun/rootfs/sandbox-python-data` (under `$SANDBOXRUN_CACHE` when set),
    /// where `images/build.sh rootfs sandbox-python-data DIR` is expected to unpack.
    pub fn default_data_rootfs() -> PathBuf {
        rootfs::cache_dir()
            .join("rootfs")
            .join(Profile::Data.image_name())
    }

    /// `/run/sandboxrun` for root, else `$XDG_RUNTIME_DIR/sandboxrun`, else
    /// `$TMPDIR/sandboxrun-<uid>`: runtime state that need not survive a reboot.
    pub fn default_state_dir() -> PathBuf {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if uid == 0 {
            return PathBuf::from("/run/sandboxrun");
        }
        match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
            Some(dir) => PathBuf::from(dir).join("sandboxrun"),
            None => std::env::temp_dir().join(format!("sandboxrun-{uid}")),
        }
    }
}

impl Default for LocalSandboxConfig {
    fn default() -> Self {
        Self {
            rootfs: Self::default_rootfs(),
            data_rootfs: Some(Self::default_data_rootfs()),
            preference: Preference::Auto,
            runsc: None,
            bwrap: None,
            tmp_size_bytes: DEFAULT_TMP_SIZE_BYTES,
            state_dir: Self::default_state_dir(),
            allow_weak_limits: false,
        }
    }
}

/// Why the driver could not be set up or a run could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LocalSandboxError {
    /// The image directory is missing or incomplete.
    #[error(
        "the sandbox root file system {path} is not usable: {detail}. Create it with: \
         images/build.sh rootfs sandbox-python {path}"
    )]
    RootfsMissing {
        /// The configured directory.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// A run asked for a profile whose root file system this driver does not have.
    #[error("the {profile} sandbox profile is not available on this machine: {detail}")]
    ProfileUnavailable {
        /// The profile asked for.
        profile: Profile,
        /// Why it is not available, and how to make it so.
        detail: String,
    },
    /// gVisor was required but no runsc binary was found.
    #[error(
        "gVisor was requested but no runsc was found (looked in: {searched}). Install it \
         (`apt-get install runsc`, or build gvisor.dev/gvisor/runsc from the Go module proxy \
         into ~/.cache/sandboxrun/gvisor-VERSION/), or use bubblewrap"
    )]
    RunscNotFound {
        /// Where the driver looked.
        searched: String,
    },
    /// bubblewrap was required but not found.
    #[error(
        "bubblewrap was requested but no bwrap was found on PATH. Install it: \
         apt-get install bubblewrap (Debian/Ubuntu) or dnf install bubblewrap (Fedora)"
    )]
    BwrapNotFound,
    /// An engine was found but could not run `print(1)`.
    #[error("the {engine} probe (python print(1)) failed with {}: {detail}", path.display())]
    ProbeFailed {
        /// The engine probed.
        engine: Isolation,
        /// The binary used.
        path: PathBuf,
        /// What happened.
        detail: String,
    },
    /// Automatic selection found no working engine.
    #[error(
        "no sandbox engine works on this machine ({details}). Install bubblewrap \
         (apt-get install bubblewrap) or gVisor's runsc, then try again"
    )]
    NoEngine {
        /// Why each engine was rejected.
        details: String,
    },
    /// A limit the driver cannot interpret.
    #[error("invalid {field} limit {value:?}: expected a Kubernetes quantity such as {example}")]
    InvalidLimit {
        /// `memory` or `cpu`.
        field: &'static str,
        /// The rejected value.
        value: String,
        /// A valid example.
        example: &'static str,
    },
    /// The memory, pid and CPU limits cannot be enforced here (no per-run cgroup) and weak
    /// limits were not allowed ([`LocalSandboxConfig::allow_weak_limits`]).
    #[error(
        "the sandbox cannot enforce its memory, process and CPU limits on this machine: \
         {missing}. The driver needs a cgroup per run for them. Either run it as root; or, where \
         cgroup v2 is the only hierarchy, have root delegate /sys/fs/cgroup/sandboxrun to this \
         user (mkdir it, chown -R it to the user, enable \"+memory +pids +cpu\" in \
         /sys/fs/cgroup/cgroup.subtree_control and in its own) and start the driver in a group \
         under it; or accept per-process limits only (memory per process, no CPU limit) with \
         allow_weak_limits (the frontend's --allow-weak-limits)"
    )]
    WeakLimits {
        /// What is missing to make a per-run cgroup.
        missing: String,
    },
    /// The state directory, or a directory on the way to it or in it, could be read or changed
    /// by someone else (who could then swap a run's OCI bundle or runsc's state).
    #[error(
        "refusing the sandbox state directory {}: {}: {detail}. If it is yours, remove it and \
         let the driver create it (mode 0700), or configure another state directory",
        state_dir.display(),
        path.display()
    )]
    UnsafeStateDir {
        /// The configured state directory.
        state_dir: PathBuf,
        /// The directory that is wrong (the state directory, one above it or in it).
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// A session's call came after the session ended.
    #[error("the session has ended: {0}")]
    SessionEnded(String),
    /// A system call or file operation of the driver failed.
    #[error("{context}: {source}")]
    Io {
        /// What the driver was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LocalSandboxError {
    let context = context.into();
    move |source| LocalSandboxError::Io { context, source }
}

/// What one run left: the runner's envelope and what the driver saw. How the run ended is
/// decided by `tools::python::classify`, the same classification as a sandbox Pod's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalRun {
    /// What the runner reported, when its envelope could be read.
    pub envelope: Option<RunnerResult>,
    /// What the driver saw of the sandbox's end (cgroup OOM counter, deadline, exit status,
    /// the engine's stderr).
    pub observed: Observed,
    /// Wall-clock time of the whole sandbox, start-up included, in milliseconds (the code's
    /// own run time is the envelope's `duration_millis`).
    pub duration_ms: u64,
}

/// A configured, probed engine. Cheap to clone; runs may proceed concurrently.
#[derive(Clone, Debug)]
pub struct LocalSandbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    isolation: Isolation,
    engine: PathBuf,
    rootfs: PathBuf,
    /// The `data` profile's root file system, or why it cannot be used.
    data_rootfs: Result<PathBuf, String>,
    tmp_size_bytes: u64,
    state_dir: PathBuf,
    /// Whether per-run cgroups are used (else rlimits).
    cgroups: bool,
    /// Without cgroups: the warning that says which limits are not enforced.
    weak_limits: Option<String>,
    /// Whether the driver runs as root (runsc needs `--rootless` otherwise).
    root: bool,
    /// Sandboxes started ahead of their calls, waiting for one program each, per profile
    /// ([`LocalSandbox::arm`]).
    armed: std::sync::Mutex<BTreeMap<Profile, Armed>>,
}

/// The armed sandboxes of one profile of a [`LocalSandbox`].
#[derive(Debug, Default)]
struct Armed {
    /// How many to keep.
    target: usize,
    /// Started and waiting, oldest first.
    ready: Vec<Started>,
    /// Being started now.
    starting: usize,
}

impl LocalSandbox {
    /// Checks the root file system, finds the engine the preference asks for and probes it once
    /// by running `print(1)` through the whole path. Fails with what is missing and how to
    /// install it.
    ///
    /// Without a per-run cgroup (memory, pids and CPU) it fails with
    /// [`LocalSandboxError::WeakLimits`] unless [`LocalSandboxConfig::allow_weak_limits`] is set.
    pub async fn detect(config: LocalSandboxConfig) -> Result<Self, LocalSandboxError> {
        Self::detect_with(config, cgroup::probe).await
    }

    /// [`LocalSandbox::detect`] as on a machine where no per-run cgroup can be made (an
    /// unprivileged user on cgroup v1), for tests that run as root.
    #[doc(hidden)]
    pub async fn detect_without_cgroups(
        config: LocalSandboxConfig,
    ) -> Result<Self, LocalSandboxError> {
        Self::detect_with(config, || Err("no cgroups (forced by a test)".to_owned())).await
    }

    async fn detect_with(
        config: LocalSandboxConfig,
        cgroup_probe: fn() -> Result<(), String>,
    ) -> Result<Self, LocalSandboxError> {
        let rootfs = rootfs::check(&config.rootfs)?;
        let data_rootfs = match &config.data_rootfs {
            None => Err("no root file system is configured for it".to_owned()),
            Some(dir) => rootfs::check(dir).map_err(|e| match e {
                LocalSandboxError::RootfsMissing { path, detail } => format!(
                    "the root file system {} is not usable: {detail}. Create it with: \
                     images/build.sh rootfs {} {}",
                    path.display(),
                    Profile::Data.image_name(),
                    path.display()
                ),
                other => other.to_string(),
            }),
        };
        if let Err(why) = &data_rootfs {
            tracing::info!(profile = "data", "the data profile is not available: {why}");
        }
        let weak_limits = cgroup::limits_enforced(cgroup_probe(), config.allow_weak_limits)?;
        let state_dir = statedir::private_dir(&config.state_dir, &config.state_dir)?;
        for sub in [statedir::RUNSC_ROOT, statedir::BUNDLES] {
            statedir::private_dir(&config.state_dir, &state_dir.join(sub))?;
        }
        sweep_dead_drivers(&state_dir);
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let make = |isolation, engine| LocalSandbox {
            inner: Arc::new(Inner {
                isolation,
                engine,
                rootfs: rootfs.clone(),
                data_rootfs: data_rootfs.clone(),
                tmp_size_bytes: config.tmp_size_bytes,
                state_dir: state_dir.clone(),
                cgroups: weak_limits.is_none(),
                weak_limits: weak_limits.clone(),
                root,
                armed: std::sync::Mutex::default(),
            }),
        };
        let gvisor = || async {
            let candidates = gvisor::candidates(config.runsc.as_deref());
            if candidates.is_empty() {
                return Err(LocalSandboxError::RunscNotFound {
                    searched: format!("PATH, {}/gvisor-*/runsc", rootfs::cache_dir().display()),
                });
            }
            let mut last = None;
            for path in candidates {
                let sandbox = make(Isolation::Gvisor, path);
                match sandbox.probe().await {
                    Ok(()) => return Ok(sandbox),
                    Err(e) => last = Some(e),
                }
            }
            Err(last.expect("at least one candidate was probed"))
        };
        let bubblewrap = || async {
            let path = match &config.bwrap {
                Some(path) => path.clone(),
                None => which("bwrap").ok_or(LocalSandboxError::BwrapNotFound)?,
            };
            let sandbox = make(Isolation::Bubblewrap, path);
            sandbox.probe().await.map(|()| sandbox)
        };
        let sandbox = match config.preference {
            Preference::Gvisor => gvisor().await,
            Preference::Bubblewrap => bubblewrap().await,
            Preference::Auto => match gvisor().await {
                Ok(sandbox) => Ok(sandbox),
                Err(gvisor_err) => match bubblewrap().await {
                    Ok(sandbox) => Ok(sandbox),
                    Err(bwrap_err) => Err(LocalSandboxError::NoEngine {
                        details: format!("gVisor: {gvisor_err}; bubblewrap: {bwrap_err}"),
                    }),
                },
            },
        }?;
        if let Some(warning) = sandbox.weak_limits() {
            tracing::warn!(
                engine = %sandbox.isolation(),
                allow_weak_limits = true,
                "{warning}"
            );
        }
        Ok(sandbox)
    }

    /// The engine in use.
    pub fn isolation(&self) -> Isolation {
        self.inner.isolation
    }

    /// The engine binary in use (`runsc` or `bwrap`).
    pub fn engine_path(&self) -> &Path {
        &self.inner.engine
    }

    /// Whether memory, pid and CPU limits are enforced by a per-run cgroup (true) or only by
    /// rlimits (false, see the module documentation).
    pub fn uses_cgroups(&self) -> bool {
        self.inner.cgroups
    }

    /// Without per-run cgroups ([`LocalSandboxConfig::allow_weak_limits`]): the warning that
    /// says which limits are not enforced; None when all are.
    pub fn weak_limits(&self) -> Option<&str> {
        self.inner.weak_limits.as_deref()
    }

    /// Runs `print(1)` and expects `1`.
    async fn probe(&self) -> Result<(), LocalSandboxError> {
        let limits = Limits {
            timeout_seconds: 20,
            ..Limits::default()
        };
        let failed = |detail: String| LocalSandboxError::ProbeFailed {
            engine: self.inner.isolation,
            path: self.inner.engine.clone(),
            detail,
        };
        // Torn down before detect returns: nothing of the probe outlives it.
        let started = self
            .start(
                &limits,
                Profile::Minimal,
                runner_argv(&limits, Profile::Minimal),
            )
            .map_err(|e| failed(e.to_string()))?;
        let run = self
            .finish(
                started,
                &Program::code("print(1)"),
                &limits,
                Teardown::Inline,
                None,
            )
            .await
            .map_err(|e| failed(e.to_string()))?;
        match &run.envelope {
            Some(r) if r.exit_code == 0 && r.stdout == "1\n" => Ok(()),
            Some(r) => Err(failed(format!(
                "exit code {}, stdout {:?}, stderr {:?}",
                r.exit_code,
                r.stdout,
                r.stderr.trim_end()
            ))),
            None => Err(failed(format!(
                "no result ({:?}): {}",
                run.observed.exit_code,
                run.observed.detail.trim_end()
            ))),
        }
    }

    /// Runs `code` in a fresh sandbox under `limits` (clamped to the accepted ranges) and
    /// returns how it ended. An `Err` means the sandbox could not be started at all; anything
    /// the code does (crash, timeout, OOM) is an `Ok` with the matching outcome. Dropping the
    /// future kills the sandbox and removes everything it used.
    pub async fn run_python(
        &self,
        code: &str,
        limits: &Limits,
    ) -> Result<LocalRun, LocalSandboxError> {
        self.run(&Program::code(code), Profile::Minimal, limits, None)
            .await
    }

    /// Runs `program` (its code, with its input files placed and its output files collected) in
    /// a fresh sandbox of `profile`, handing what the code prints to `output` while it runs
    /// (within the output cap; the result still holds all of it). See
    /// [`LocalSandbox::run_python`].
    pub async fn run(
        &self,
        program: &Program<'_>,
        profile: Profile,
        limits: &Limits,
        output: Option<OutputFn>,
    ) -> Result<LocalRun, LocalSandboxError> {
        let limits = limits.clamped();
        let started = match self.take_armed(&limits, profile) {
            Some(armed) => armed,
            None => self.start(&limits, profile, runner_argv(&limits, profile))?,
        };
        let run = self
            .finish(started, program, &limits, Teardown::Background, output)
            .await;
        // The replacement starts once the call has its result: a sandbox's start (gVisor boots
        // a kernel: hundreds of milliseconds of CPU) would otherwise compete with the call.
        self.refill();
        run
    }

    /// Whether runs of `profile` can be started here: `Err` says why not and how to fix it.
    pub fn profile_available(&self, profile: Profile) -> Result<(), String> {
        self.rootfs_of(profile).map(|_| ())
    }

    fn rootfs_of(&self, profile: Profile) -> Result<&Path, String> {
        match profile {
            Profile::Minimal => Ok(&self.inner.rootfs),
            Profile::Data => self.inner.data_rootfs.as_deref().map_err(Clone::clone),
        }
    }

    /// Keeps `n` sandboxes of `profile` started and waiting for one program each (0: none),
    /// with the same isolation as a sandbox started for its call: a call of that profile whose
    /// cpu, memory and pids are the defaults ([`Limits::default`]) takes one and skips the
    /// engine's start-up and the profile's imports (the runner preloads them while it waits:
    /// [`Profile::preloaded_modules`]); its timeout and output cap are applied when it takes it
    /// (the runner gets them with the program). Each runs one program and is destroyed. Only
    /// with per-run cgroups (without them a process's limits are fixed when it starts), and
    /// only for a profile this machine has.
    pub fn arm(&self, profile: Profile, n: usize) {
        if !self.inner.cgroups {
            if n > 0 {
                tracing::info!("no armed sandboxes: they need a cgroup per run");
            }
            return;
        }
        if let Err(why) = self.profile_available(profile) {
            if n > 0 {
                tracing::info!(%profile, "no armed sandboxes of this profile: {why}");
            }
            return;
        }
        self.inner
            .armed
            .lock()
            .expect("not poisoned")
            .entry(profile)
            .or_default()
            .target = n;
        self.refill();
    }

    /// How many armed sandboxes of `profile` wait now.
    pub fn armed(&self, profile: Profile) -> usize {
        self.inner
            .armed
            .lock()
            .expect("not poisoned")
            .get(&profile)
            .map_or(0, |armed| armed.ready.len())
    }

    /// An armed sandbox of `profile` for a call with `limits`, if one waits and fits.
    fn take_armed(&self, limits: &Limits, profile: Profile) -> Option<Started> {
        if !armed_fits(limits) {
            return None;
        }
        let mut all = self.inner.armed.lock().expect("not poisoned");
        let armed = all.get_mut(&profile)?;
        while !armed.ready.is_empty() {
            let mut candidate = armed.ready.remove(0);
            // One that died while it waited (killed from outside) is dropped, and cleaned up.
            if matches!(candidate.child.try_wait(), Ok(None)) {
                return Some(candidate);
            }
        }
        None
    }

    /// Starts armed sandboxes of every profile up to its target, in the background.
    fn refill(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let missing: Vec<(Profile, usize)> = {
            let mut all = self.inner.armed.lock().expect("not poisoned");
            all.iter_mut()
                .map(|(profile, armed)| {
                    let missing = armed
                        .target
                        .saturating_sub(armed.ready.len() + armed.starting);
                    armed.starting += missing;
                    (*profile, missing)
                })
                .collect()
        };
        for (profile, missing) in missing {
            for _ in 0..missing {
                let this = self.clone();
                // Off the caller's path: starting an engine forks and writes cgroup files.
                runtime.spawn_blocking(move || {
                    let limits = armed_limits();
                    let started = this.start(&limits, profile, runner_argv(&limits, profile));
                    let mut all = this.inner.armed.lock().expect("not poisoned");
                    let armed = all.entry(profile).or_default();
                    armed.starting -= 1;
                    match started {
                        Ok(s) if armed.ready.len() < armed.target => armed.ready.push(s),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, %profile, "cannot arm a sandbox"),
                    }
                });
            }
        }
    }

    /// Starts a sandbox whose runner waits for its program: the run's cgroup with `limits`,
    /// the engine, the runner with `limits`' timeout and output cap as its ceilings.
    /// `argv` is the runner's command line ([`runner_argv`], or a session's
    /// [`crate::runner::session_argv`]) for the same limits and profile.
    fn start(
        &self,
        limits: &Limits,
        profile: Profile,
        argv: Vec<String>,
    ) -> Result<Started, LocalSandboxError> {
        let inner = &*self.inner;
        let rootfs = self
            .rootfs_of(profile)
            .map_err(|detail| LocalSandboxError::ProfileUnavailable { profile, detail })?;
        let limits = limits.clamped();
        let memory =
            memory_bytes(&limits.memory).ok_or_else(|| LocalSandboxError::InvalidLimit {
                field: "memory",
                value: limits.memory.clone(),
                example: "256Mi",
            })?;
        let cpu = cpu_millis(&limits.cpu).ok_or_else(|| LocalSandboxError::InvalidLimit {
            field: "cpu",
            value: limits.cpu.clone(),
            example: "500m",
        })?;
        let id = new_id();
        let mut cleanup = Cleanup::default();
        if inner.cgroups {
            let overhead = match inner.isolation {
                Isolation::Gvisor => GVISOR_PID_OVERHEAD,
                Isolation::Bubblewrap => BWRAP_PID_OVERHEAD,
            };
            let group = RunCgroup::create(
                &id,
                CgroupLimits {
                    memory_bytes: memory,
                    pids: u64::from(limits.pids) + overhead,
                    cpu_millis: cpu,
                },
            )
            .map_err(io_err("cannot create the run's cgroup"))?;
            cleanup.cgroup = Some(group);
        }
        let rlimits = Rlimits {
            address_space: (!inner.cgroups).then_some(memory),
            file_size: inner.tmp_size_bytes,
        };

        let mut cmd = Command::new(&inner.engine);
        // Descriptors the engine inherits (bwrap's seccomp programs); open until the run ends.
        let mut inherited: Vec<std::os::fd::OwnedFd> = Vec::new();
        match inner.isolation {
            Isolation::Bubblewrap => {
                for program in seccomp::bwrap_programs() {
                    inherited.push(
                        seccomp::memfd(program)
                            .map_err(io_err("cannot prepare the seccomp filter"))?,
                    );
                }
                let seccomp_fds: Vec<RawFd> = inherited.iter().map(AsRawFd::as_raw_fd).collect();
                cmd.args(bwrap::args(rootfs, inner.tmp_size_bytes, &seccomp_fds));
                cmd.args(&argv);
                let fds = cleanup
                    .cgroup
                    .as_ref()
                    .map(RunCgroup::procs_fds)
                    .unwrap_or_default();
                // SAFETY: the closure only makes async-signal-safe system calls (fcntl, write,
                // setrlimit) on data prepared before fork.
                unsafe {
                    cmd.pre_exec(move || {
                        for &fd in &seccomp_fds {
                            seccomp::inherit(fd)?;
                        }
                        cgroup::join_current(&fds)?;
                        rlimits.apply()
                    });
                }
            }
            Isolation::Gvisor => {
                // Checked again on every run: the state directory may have been removed (a
                // tmp cleaner) or replaced since detect().
                let runsc_root = statedir::private_dir(
                    &inner.state_dir,
                    &inner.state_dir.join(statedir::RUNSC_ROOT),
                )?;
                let bundle = statedir::private_dir(
                    &inner.state_dir,
                    &inner.state_dir.join(statedir::BUNDLES),
                )?
                .join(&id);
                // Not recursive: a new, private directory or an error (the id is unique).
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&bundle)
                    .map_err(io_err("cannot create the run's OCI bundle"))?;
                cleanup.bundle = Some(bundle.clone());
                let config = gvisor::config(&gvisor::BundleSpec {
                    rootfs,
                    argv: &argv,
                    tmp_size_bytes: inner.tmp_size_bytes,
                    memory_bytes: memory,
                    pids: u64::from(limits.pids),
                    cgroups_path: cleanup.cgroup.as_ref().map(RunCgroup::oci_path),
                    rlimit_as: rlimits.address_space,
                });
                let path = bundle.join("config.json");
                std::fs::write(&path, config.to_string())
                    .and_then(|()| {
                        std::fs::set_permissions(&path, PermissionsExt::from_mode(0o600))
                    })
                    .map_err(io_err("cannot write the run's OCI config"))?;
                cmd.args(gvisor::run_args(&runsc_root, inner.root, &bundle, &id));
                cleanup.runsc_delete = Some((
                    inner.engine.clone(),
                    gvisor::delete_args(&runsc_root, inner.root, &id),
                ));
            }
        }
        cmd.env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .current_dir("/")
            // The program goes to the runner's stdin (through bwrap, or runsc, which hands the
            // container its own stdio), never on a command line.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);

        let child = cmd
            .spawn()
            .map_err(io_err(format!("cannot start {}", inner.engine.display())))?;
        cleanup.pgid = child.id().and_then(|pid| libc::pid_t::try_from(pid).ok());
        Ok(Started {
            child,
            cleanup,
            _inherited: inherited,
        })
    }

    /// Hands `code` to a started sandbox and waits for it to end, at most `limits`' timeout and
    /// the start-up grace from now.
    async fn finish(
        &self,
        started: Started,
        program: &Program<'_>,
        limits: &Limits,
        teardown: Teardown,
        output: Option<OutputFn>,
    ) -> Result<LocalRun, LocalSandboxError> {
        let Started {
            mut child,
            mut cleanup,
            _inherited,
        } = started;
        let began = Instant::now();
        let limits = limits.clamped();
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let mut stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let frame = program_frame(program, &limits);
        // The envelope escapes at most 6 bytes per byte of output, for both streams, and carries
        // the returned files in base64.
        let envelope_max = 12 * limits.output_bytes as usize
            + 4096
            + usize::try_from(ENVELOPE_FILES_MAX_BYTES).unwrap_or(usize::MAX / 4);
        let mut out = TailBuffer::new(envelope_max);
        let mut err = Vec::new();
        let deadline = Duration::from_secs(u64::from(limits.timeout_seconds)) + START_GRACE;
        // Until the envelope: it is the runner's last output, so the call's result is known
        // then, and the sandbox's teardown (the engine's exit, `runsc delete`, the cgroup) need
        // not be waited for. Without one, until the engine exits.
        let waited = tokio::time::timeout(deadline, async {
            let feed = async move {
                // A runner that died first makes this a broken pipe: its own result says why.
                let _ = stdin.write_all(&frame).await;
                drop(stdin);
            };
            let reading = async {
                let ((), found) =
                    tokio::join!(feed, read_output(&mut stdout, &mut out, output.as_ref()));
                found
            };
            let engine_stderr = read_head(&mut stderr, &mut err, ENGINE_STDERR_BYTES);
            tokio::pin!(reading, engine_stderr);
            let mut stderr_done = false;
            let found = loop {
                tokio::select! {
                    found = &mut reading => break found,
                    () = &mut engine_stderr, if !stderr_done => stderr_done = true,
                }
            };
            if found {
                return None;
            }
            if !stderr_done {
                engine_stderr.await;
            }
            Some(child.wait().await)
        })
        .await;
        let (status, deadline_hit) = match waited {
            // The envelope came: the runner exits with the code's status.
            Ok(None) => (None, false),
            Ok(Some(status)) => {
                cleanup.reaped = true;
                (status.ok(), false)
            }
            Err(_) => {
                cleanup.kill_now();
                let status = child.wait().await.ok();
                cleanup.reaped = true;
                (status, true)
            }
        };
        let oom = cleanup.cgroup.as_ref().is_some_and(RunCgroup::oom_killed);
        let pids_hit = cleanup
            .cgroup
            .as_ref()
            .is_some_and(RunCgroup::pids_limit_hit);
        let log = String::from_utf8_lossy(out.bytes());
        let envelope = parse_envelope(&log);
        let exit_code = match (&status, &envelope) {
            (Some(status), _) => Some(exit_code_of(*status)),
            (None, Ok(result)) => Some(result.exit_code),
            (None, Err(_)) => None,
        };
        let observed = Observed {
            oom_killed: cleanup.cgroup.as_ref().map(|_| oom),
            deadline_hit,
            pids_limit_hit: pids_hit,
            exit_code,
            platform_reason: None,
            envelope_error: envelope.as_ref().err().map(ToString::to_string),
            detail: String::from_utf8_lossy(&err).trim().to_owned(),
        };
        if cleanup.reaped {
            drop(cleanup);
        } else {
            // The runner printed its envelope and is exiting: reap the engine (a group is
            // removable only once its processes are reaped), then remove the sandbox. Killed
            // if it does not exit within the grace; the cleanup's drop blocks (`runsc delete`,
            // waiting for the cgroup to empty), so it runs on a blocking thread.
            let teardown_now = async move {
                // Drained to the end, as when the call itself waits for the engine: an engine
                // blocked on a full pipe would never exit.
                let drain = async {
                    let (mut out_rest, mut err_rest) = (Vec::new(), Vec::new());
                    tokio::join!(
                        read_head(&mut stdout, &mut out_rest, 0),
                        read_head(&mut stderr, &mut err_rest, 0),
                    );
                };
                let exited = async { tokio::join!(child.wait(), drain).0 };
                if let Ok(Ok(_)) = tokio::time::timeout(START_GRACE, exited).await {
                    cleanup.reaped = true;
                }
                let _ = tokio::task::spawn_blocking(move || {
                    drop(cleanup);
                    drop(child);
                })
                .await;
            };
            match teardown {
                Teardown::Inline => teardown_now.await,
                // Off the call's path. Should the runtime stop first, dropping the task drops
                // the cleanup, which then kills and removes everything at once.
                Teardown::Background => drop(tokio::spawn(teardown_now)),
            }
        }
        Ok(LocalRun {
            envelope: envelope.ok(),
            observed,
            duration_ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
        })
    }
}

/// Removes what sandboxes of a driver process that is gone left behind: one killed with SIGKILL
/// (an MCP client that kills its server, say) cannot remove its sandboxes' cgroups and OCI
/// bundles. Their names carry the driver's pid (`sbr-<pid>-...`, see [`new_id`]); a pid that is
/// alive, this process's included, is left alone (a reused pid only delays the sweep).
fn sweep_dead_drivers(state_dir: &Path) {
    let stale = |name: &str| -> bool {
        let Some(pid) = name
            .strip_prefix("sbr-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<libc::pid_t>().ok())
        else {
            return false;
        };
        if u32::try_from(pid).is_ok_and(|p| p == std::process::id()) {
            return false;
        }
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            tracing::info!(sandbox = name, "removing what a stopped driver left behind");
        }
        gone
    };
    cgroup::sweep(stale);
    if let Ok(entries) = std::fs::read_dir(state_dir.join(statedir::BUNDLES)) {
        for entry in entries.flatten() {
            if stale(&entry.file_name().to_string_lossy()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// When a sandbox whose result is known is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Teardown {
    /// Before the call returns.
    Inline,
    /// On a thread of its own, after the call returned.
    Background,
}

/// A sandbox whose engine and runner run, waiting for the program on stdin.
#[derive(Debug)]
struct Started {
    child: tokio::process::Child,
    cleanup: Cleanup,
    /// Descriptors the engine inherited (bwrap's seccomp programs), open while it runs.
    _inherited: Vec<std::os::fd::OwnedFd>,
}

/// The limits an armed sandbox is started with: the default cpu, memory and pids, and the
/// largest timeout and output cap (each call's own come with its program and can only be
/// lower).
fn armed_limits() -> Limits {
    Limits {
        timeout_seconds: crate::limits::MAX_TIMEOUT_SECONDS,
        output_bytes: crate::limits::MAX_OUTPUT_BYTES,
        ..Limits::default()
    }
}

/// Whether a call with `limits` may take an armed sandbox: the cgroup and the process limit are
/// fixed when a sandbox starts, so its cpu, memory and pids must be the armed ones.
fn armed_fits(limits: &Limits) -> bool {
    let armed = armed_limits();
    cpu_millis(&limits.cpu) == cpu_millis(&armed.cpu)
        && memory_bytes(&limits.memory) == memory_bytes(&armed.memory)
        && limits.pids == armed.pids
}

/// The exit code of the engine process: its own, or 128 + the signal that ended it.
fn exit_code_of(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 137,
    }
}

/// Everything a run holds that must not outlive it. Dropping it (normally, on error, or because
/// the run's future was dropped) kills and removes all of it, synchronously.
#[derive(Debug, Default)]
struct Cleanup {
    /// The engine's process group (its leader is the engine process).
    pgid: Option<libc::pid_t>,
    /// Whether the engine process has been reaped (its pid may then be reused: never signal it).
    reaped: bool,
    /// `runsc delete --force` for a gVisor run.
    runsc_delete: Option<(PathBuf, Vec<OsString>)>,
    /// The run's cgroup (kills what is left and is removed on drop).
    cgroup: Option<RunCgroup>,
    /// The run's OCI bundle directory.
    bundle: Option<PathBuf>,
}

impl Cleanup {
    /// Kills the engine and the whole sandbox now (the deadline passed or the run is abandoned).
    fn kill_now(&mut self) {
        if !self.reaped
            && let Some(pgid) = self.pgid
        {
            // SAFETY: signalling a process group we created and have not reaped.
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
        }
        if let Some((runsc, args)) = self.runsc_delete.take() {
            let deleting = std::process::Command::new(runsc)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            // Bounded: a `runsc delete` that hangs must not hang the cleanup (the cgroup kill
            // below ends the sandbox's processes anyway).
            if let Ok(mut deleting) = deleting {
                let until = Instant::now() + RUNSC_DELETE_WITHIN;
                while matches!(deleting.try_wait(), Ok(None)) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if matches!(deleting.try_wait(), Ok(None)) {
                    let _ = deleting.kill();
                    let _ = deleting.wait();
                }
            }
        }
        if let Some(group) = &self.cgroup {
            group.kill_all();
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill_now();
        }
        // A `runsc run` that returned on its own has already deleted its container.
        self.runsc_delete = None;
        self.cgroup = None;
        if let Some(bundle) = self.bundle.take() {
            let _ = std::fs::remove_dir_all(bundle);
        }
    }
}

/// Per-process limits set between fork and exec of the engine (inherited by the sandbox).
#[derive(Clone, Copy, Debug)]
struct Rlimits {
    /// `RLIMIT_AS`, only when there is no cgroup to limit memory.
    address_space: Option<u64>,
    /// `RLIMIT_FSIZE`: no single file larger than `/tmp`.
    file_size: u64,
}

impl Rlimits {
    /// Only calls setrlimit, so it is safe between fork and exec.
    fn apply(self) -> std::io::Result<()> {
        let set = |resource, value: u64| {
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            // SAFETY: setrlimit with a valid pointer to a local struct.
            if unsafe { libc::setrlimit(resource, &limit) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        set(libc::RLIMIT_CORE, 0)?;
        set(libc::RLIMIT_FSIZE, self.file_size)?;
        if let Some(bytes) = self.address_space {
            set(libc::RLIMIT_AS, bytes)?;
        }
        Ok(())
    }
}

/// Keeps the last `keep` bytes of a stream (the envelope is the last line; whatever the code
/// forged or flooded before it may be dropped), in at most twice that memory.
struct TailBuffer {
    keep: usize,
    data: Vec<u8>,
}

impl TailBuffer {
    fn new(keep: usize) -> Self {
        Self {
            keep,
            data: Vec::new(),
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.data.extend_from_slice(chunk);
        if self.data.len() > 2 * self.keep {
            let cut = self.data.len() - self.keep;
            self.data.drain(..cut);
        }
    }

    fn bytes(&self) -> &[u8] {
        let start = self.data.len().saturating_sub(self.keep);
        &self.data[start..]
    }
}

/// Reads the sandbox's stdout into `buf` (a bounded tail) until it holds a complete envelope line
/// or ends. Returns whether it holds an envelope. The runner's output lines go to `output` as
/// they arrive.
async fn read_output(
    pipe: &mut (impl AsyncRead + Unpin),
    buf: &mut TailBuffer,
    output: Option<&OutputFn>,
) -> bool {
    let has_envelope =
        |buf: &TailBuffer| parse_envelope(&String::from_utf8_lossy(buf.bytes())).is_ok();
    let mut lines = LineSplitter::new(buf.keep);
    let mut chunk = vec![0u8; 64 * 1024];
    while let Ok(n) = pipe.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        buf.push(&chunk[..n]);
        let mut envelope_line = false;
        lines.push(&chunk[..n], |line| {
            if line.starts_with(b"{\"sandboxrun\"") {
                envelope_line = true;
            } else if let Some(output) = output
                && let Some(chunk) = parse_output_line(&String::from_utf8_lossy(line))
            {
                output(chunk);
            }
        });
        if envelope_line && has_envelope(buf) {
            return true;
        }
    }
    has_envelope(buf)
}

/// Splits a byte stream into lines; of a line longer than `max` only its start is kept (only the
/// envelope can be that long, the tail buffer holds it whole, and its start says what it is).
#[derive(Debug)]
struct LineSplitter {
    max: usize,
    partial: Vec<u8>,
    overlong: bool,
}

impl LineSplitter {
    fn new(max: usize) -> Self {
        Self {
            max,
            partial: Vec::new(),
            overlong: false,
        }
    }

    fn push(&mut self, mut bytes: &[u8], mut line: impl FnMut(&[u8])) {
        while let Some(at) = bytes.iter().position(|b| *b == b'\n') {
            if !self.overlong {
                self.partial.extend_from_slice(&bytes[..at]);
            }
            line(&self.partial);
            self.partial.clear();
            self.overlong = false;
            bytes = &bytes[at + 1..];
        }
        if !self.overlong {
            self.partial.extend_from_slice(bytes);
            if self.partial.len() > self.max {
                // Keep the start: whether it is an envelope is decided by its first bytes.
                self.partial.truncate(64);
                self.overlong = true;
            }
        }
    }
}

async fn read_head(pipe: &mut (impl AsyncRead + Unpin), buf: &mut Vec<u8>, cap: usize) {
    let mut chunk = vec![0u8; 16 * 1024];
    while let Ok(n) = pipe.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..n.min(room)]);
    }
}

/// A name for a run, unique on this machine: runsc container ID and cgroup name.
fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "sbr-{}-{}-{nanos:09}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The first executable `name` on `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_buffer_keeps_the_end() {
        let mut t = TailBuffer::new(4);
        for chunk in [&b"abc"[..], b"def", b"ghij"] {
            t.push(chunk);
        }
        assert_eq!(t.bytes(), b"ghij");
        assert!(t.data.len() <= 8);
    }

    #[test]
    fn lines_are_split_across_reads_and_overlong_ones_keep_their_start() {
        let mut seen: Vec<Vec<u8>> = Vec::new();
        let mut s = LineSplitter::new(8);
        for chunk in [
            &b"ab"[..],
            b"c\nde",
            b"f\n\n",
            b"0123456789abcdef",
            b"XYZ\nok\n",
        ] {
            s.push(chunk, |l| seen.push(l.to_vec()));
        }
        assert_eq!(
            seen,
            [
                b"abc".to_vec(),
                b"def".to_vec(),
                b"".to_vec(),
                b"0123456789abcdef".to_vec(),
                b"ok".to_vec()
            ]
        );
    }

    #[test]
    fn preference_parses() {
        assert_eq!("auto".parse(), Ok(Preference::Auto));
        assert_eq!("bwrap".parse(), Ok(Preference::Bubblewrap));
        assert_eq!("gVisor".parse(), Ok(Preference::Gvisor));
        assert!("docker".parse::<Preference>().is_err());
    }
}

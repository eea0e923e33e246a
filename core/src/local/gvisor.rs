//! The gVisor engine: `runsc run` on an OCI bundle written per run, the same runtime the cluster
//! Pods use. A bundle is used instead of `runsc do` because `do` passes the host environment into
//! the sandbox and gives it a writable overlay root (see MACHINE-NOTES); with a bundle, every
//! setting is explicit in `config.json`:
//! - `process.env` is exactly PATH, HOME and LANG; user 65532:65532 (the image's `sandbox`), no
//!   capabilities in any set, `noNewPrivileges`, `RLIMIT_CORE` 0;
//! - `root` is the shared image directory, `readonly`, and runsc runs with `--overlay2=none` so no
//!   writable overlay is put over it;
//! - `/tmp` is a tmpfs with `size=`, and so is `/dev/shm` ([`super::SHM_SIZE_BYTES`]; runsc
//!   would otherwise give the sandbox a `/dev/shm` that only root can write, and
//!   `multiprocessing`'s semaphores fail); the rest of `/dev` is a small tmpfs owned by root;
//! - PID, network, IPC, UTS and mount namespaces are new, and `--network=none` gives the
//!   sandbox only `lo` (rootless runsc would otherwise use the host's network);
//! - `linux.cgroupsPath` names the run's cgroup, which the driver creates beforehand with the
//!   memory, pids and CPU limits set (runsc joins an existing group and leaves its limits and its
//!   removal to the creator, so the driver can still read the OOM counter after the sandbox is
//!   gone); `linux.resources` repeats the limits for gVisor's own accounting;
//! - `linux.seccomp` is the filter of [`super::seccomp`] as an OCI profile, which gVisor's
//!   kernel enforces on the code (`--oci-seccomp`): the same system calls fail with `EPERM` as
//!   under bubblewrap (gVisor implements few of them anyway; the host kernel is reached only
//!   through gVisor's own, much narrower, seccomp filter of the Sentry).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::bwrap::SANDBOX_ID;

/// What a bundle needs besides the command line.
pub(super) struct BundleSpec<'a> {
    /// The read-only root file system.
    pub rootfs: &'a Path,
    /// The runner's argv.
    pub argv: &'a [String],
    /// Size of `/tmp`, in bytes.
    pub tmp_size_bytes: u64,
    /// Memory limit, in bytes.
    pub memory_bytes: u64,
    /// Process limit.
    pub pids: u64,
    /// The run's cgroup relative to the hierarchy roots, when the driver made one.
    pub cgroups_path: Option<String>,
    /// rlimits to set when there is no cgroup (`RLIMIT_AS` standing in for the memory limit).
    pub rlimit_as: Option<u64>,
}

/// The OCI runtime spec (`config.json`) of one run.
pub(super) fn config(spec: &BundleSpec<'_>) -> Value {
    let mut rlimits = vec![json!({"type": "RLIMIT_CORE", "hard": 0, "soft": 0})];
    if let Some(bytes) = spec.rlimit_as {
        rlimits.push(json!({"type": "RLIMIT_AS", "hard": bytes, "soft": bytes}));
    }
    let mut linux = json!({
        "resources": {
            "memory": {"limit": spec.memory_bytes},
            "pids": {"limit": spec.pids}
        },
        "namespaces": [
            {"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}
        ],
        "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
        "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"],
        "seccomp": super::seccomp::oci_profile()
    });
    if let Some(path) = &spec.cgroups_path {
        linux["cgroupsPath"] = json!(path);
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": SANDBOX_ID, "gid": SANDBOX_ID, "additionalGids": []},
            "args": spec.argv,
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"],
            "cwd": "/tmp",
            "capabilities": {
                "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []
            },
            "rlimits": rlimits,
            "noNewPrivileges": true
        },
        "root": {"path": spec.rootfs, "readonly": true},
        "hostname": "sandbox",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "nodev", "noexec", "mode=1777",
                         format!("size={}", super::SHM_SIZE_BYTES)]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777", format!("size={}", spec.tmp_size_bytes)]}
        ],
        "linux": linux
    })
}

/// `runsc`'s global flags for the driver: its own state directory, no network, no overlay, and
/// the OCI seccomp profile enforced (runsc ignores `linux.seccomp` without `--oci-seccomp`).
/// Rootless mode (and no cgroups) when the driver is not root.
pub(super) fn global_args(state: &Path, root: bool) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["--root".into(), state.as_os_str().to_owned()];
    args.extend(["--network=none", "--overlay2=none", "--oci-seccomp"].map(OsString::from));
    if !root {
        args.extend(["--rootless", "--ignore-cgroups"].map(OsString::from));
    }
    args
}

/// `runsc ... run --bundle DIR ID`.
pub(super) fn run_args(state: &Path, root: bool, bundle: &Path, id: &str) -> Vec<OsString> {
    let mut args = global_args(state, root);
    args.extend([
        "run".into(),
        "--bundle".into(),
        bundle.as_os_str().to_owned(),
        id.into(),
    ]);
    args
}

/// `runsc ... delete --force ID`: what a killed `runsc run` left (sandbox, gofer, state files).
pub(super) fn delete_args(state: &Path, root: bool, id: &str) -> Vec<OsString> {
    let mut args = global_args(state, root);
    args.extend(["delete".into(), "--force".into(), id.into()]);
    args
}

/// The runsc candidates, in the order they are tried: the configured one, `runsc` on `PATH`,
/// then the project-built ones under `~/.cache/sandboxrun/gvisor-*/runsc` (newest name first).
pub(super) fn candidates(configured: Option<&Path>) -> Vec<PathBuf> {
    if let Some(path) = configured {
        return vec![path.to_path_buf()];
    }
    // The project's own build (e2e/cluster/build.sh, pinned in versions.env) comes first: it is
    // the version the suite is tested with, and distribution packages can be years older (Debian
    // 12's runsc is from 2022 and about twice as slow to start). Then whatever is on PATH.
    let mut found = Vec::new();
    let cache = super::rootfs::cache_dir();
    let mut built: Vec<PathBuf> = std::fs::read_dir(&cache)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("gvisor-"))
        .map(|e| e.path().join("runsc"))
        .filter(|p| p.is_file())
        .collect();
    built.sort();
    built.reverse();
    found.extend(built);
    found.extend(super::which("runsc"));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_no_host_environment_nor_capabilities() {
        let argv = vec!["python3".to_owned(), "-c".to_owned(), "print(1)".to_owned()];
        let c = config(&BundleSpec {
            rootfs: Path::new("/r"),
            argv: &argv,
            tmp_size_bytes: 4096,
            memory_bytes: 1 << 28,
            pids: 64,
            cgroups_path: Some("/sandboxrun/x".into()),
            rlimit_as: None,
        });
        assert_eq!(
            c["process"]["env"],
            json!([
                "PATH=/usr/local/bin:/usr/bin:/bin",
                "HOME=/tmp",
                "LANG=C.UTF-8"
            ])
        );
        assert_eq!(c["process"]["user"]["uid"], 65532);
        assert_eq!(c["process"]["noNewPrivileges"], true);
        for set in [
            "bounding",
            "effective",
            "inheritable",
            "permitted",
            "ambient",
        ] {
            assert_eq!(c["process"]["capabilities"][set], json!([]));
        }
        assert_eq!(c["root"], json!({"path": "/r", "readonly": true}));
        let mount = |dest: &str| {
            c["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["destination"] == dest)
                .unwrap_or_else(|| panic!("no {dest} mount"))
                .clone()
        };
        assert_eq!(mount("/tmp")["options"][3], "size=4096");
        assert_eq!(
            mount("/dev/shm")["options"][4],
            format!("size={}", super::super::SHM_SIZE_BYTES)
        );
        assert_eq!(c["linux"]["cgroupsPath"], "/sandboxrun/x");
        assert_eq!(c["linux"]["resources"]["memory"]["limit"], 1u64 << 28);
        assert_eq!(c["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ALLOW");
    }

    #[test]
    fn network_is_always_off() {
        let args = run_args(Path::new("/s"), false, Path::new("/b"), "id");
        assert!(args.iter().any(|a| a == "--network=none"));
        assert!(args.iter().any(|a| a == "--rootless"));
        assert!(args.iter().any(|a| a == "--oci-seccomp"));
    }
}

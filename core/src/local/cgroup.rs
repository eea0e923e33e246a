//! One cgroup per run, so that memory, process count and CPU are limited for the whole sandbox
//! (every process bubblewrap or gVisor starts), an out-of-memory kill can be told apart from any
//! other SIGKILL, and everything left over can be found and killed when the run ends or is
//! abandoned. Needs root (or a delegated cgroup v2 subtree writable by the caller); [`probe`]
//! finds out once, when the driver is set up, by making a group with all three limits. Without
//! one the driver refuses to run unless weak limits were allowed, and then falls back to
//! rlimits (see the module documentation of `super`).
//!
//! cgroup v1 (and the v1 side of a hybrid layout, as on this project's VMs): the run's group is
//! `/sys/fs/cgroup/{memory,pids,cpu}/sandboxrun/<id>`. cgroup v2 (only when it is the sole
//! hierarchy): `/sys/fs/cgroup/sandboxrun/<id>`. The shared `sandboxrun` parent is left in place
//! (like `kubepods`): removing it would race with concurrent runs creating their groups.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

/// Where cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The parent group of every run, in each hierarchy.
const PARENT: &str = "sandboxrun";
/// The CFS period used to turn a CPU limit into a quota, in microseconds (as the kubelet does).
const CFS_PERIOD_US: u64 = 100_000;

/// Which cgroup layout the machine has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Per-controller v1 hierarchies (possibly with an empty v2 hierarchy beside them).
    V1,
    /// One unified v2 hierarchy at `/sys/fs/cgroup`.
    V2,
}

fn layout() -> Option<Layout> {
    let root = Path::new(CGROUP_ROOT);
    if root.join("cgroup.controllers").exists() {
        Some(Layout::V2)
    } else if root.join("memory/memory.limit_in_bytes").exists()
        && root.join("pids/cgroup.procs").exists()
    {
        Some(Layout::V1)
    } else {
        None
    }
}

/// Whether per-run cgroups with memory, pids and CPU limits can be made here: by making one
/// (and removing it). `Err` says what is missing, for the user.
pub(super) fn probe() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    match layout() {
        None => Err(format!(
            "no cgroup hierarchy with the memory and pids controllers is mounted at {CGROUP_ROOT}"
        )),
        Some(Layout::V1) if !root => Err(format!(
            "this machine has per-controller cgroup v1 hierarchies under {CGROUP_ROOT}, which \
             only root can write, and the driver does not run as root"
        )),
        Some(_) => {
            let id = format!("{}-probe", super::new_id());
            let limits = CgroupLimits {
                memory_bytes: 64 << 20,
                pids: 16,
                cpu_millis: 100,
            };
            RunCgroup::create(&id, limits).map(drop).map_err(|e| {
                format!(
                    "cannot make a cgroup with memory, pids and CPU limits under \
                     {CGROUP_ROOT}/{PARENT}: {e}"
                )
            })
        }
    }
}

/// Whether the run limits are enforced: `Ok(None)` with a per-run cgroup, `Ok(Some(warning))`
/// without one when weak limits are allowed, else the error that says what is missing.
pub(super) fn limits_enforced(
    cgroups: Result<(), String>,
    allow_weak_limits: bool,
) -> Result<Option<String>, super::LocalSandboxError> {
    match cgroups {
        Ok(()) => Ok(None),
        Err(missing) if allow_weak_limits => Ok(Some(format!(
            "the local sandbox runs WITHOUT enforced limits ({missing}; allowed by \
             allow_weak_limits): memory is limited per process only (RLIMIT_AS: several \
             processes, /tmp and /dev/shm add up beyond it, and running out is a MemoryError, \
             not OOMKilled); the process limit is RLIMIT_NPROC; CPU is not limited at all, only \
             the timeout ends a run. Run as root or give the driver a delegated cgroup v2 \
             subtree to enforce them"
        ))),
        Err(missing) => Err(super::LocalSandboxError::WeakLimits { missing }),
    }
}

/// The limits a run's cgroup enforces.
#[derive(Clone, Copy, Debug)]
pub(super) struct CgroupLimits {
    /// Memory of all processes together, in bytes (page cache of the tmpfs included).
    pub memory_bytes: u64,
    /// Number of processes (threads, on v1 and v2 alike) at once.
    pub pids: u64,
    /// CPU in thousandths of a core.
    pub cpu_millis: u64,
}

/// A run's cgroup; dropping it kills whatever is still inside and removes the directories.
#[derive(Debug)]
pub(super) struct RunCgroup {
    layout: Layout,
    id: String,
    /// The directories this run created (memory first), removed on drop.
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` of every directory, opened before fork so that the child can join with
    /// plain `write(2)` calls between fork and exec.
    procs: Vec<File>,
}

impl RunCgroup {
    /// Creates the run's group(s) with the limits applied.
    pub(super) fn create(id: &str, limits: CgroupLimits) -> io::Result<Self> {
        let layout = layout().ok_or_else(|| io::Error::other("no usable cgroup hierarchy"))?;
        let mut group = RunCgroup {
            layout,
            id: id.to_owned(),
            dirs: Vec::new(),
            procs: Vec::new(),
        };
        let root = Path::new(CGROUP_ROOT);
        match layout {
            Layout::V1 => {
                let memory = group.make_dir(&root.join("memory").join(PARENT))?;
                write(&memory, "memory.limit_in_bytes", limits.memory_bytes)?;
                // Swap would let the code exceed its memory without an OOM kill; this VM has
                // none, so the file may be missing or refuse: ignore that.
                let _ = write(&memory, "memory.memsw.limit_in_bytes", limits.memory_bytes);
                let pids = group.make_dir(&root.join("pids").join(PARENT))?;
                write(&pids, "pids.max", limits.pids)?;
                // The CPU limit is not optional: without the controller there is none.
                if !root.join("cpu/cpu.cfs_quota_us").exists() {
                    return Err(io::Error::other(format!(
                        "the cpu controller is not mounted ({CGROUP_ROOT}/cpu/cpu.cfs_quota_us \
                         is missing)"
                    )));
                }
                let cpu = group.make_dir(&root.join("cpu").join(PARENT))?;
                write(&cpu, "cpu.cfs_period_us", CFS_PERIOD_US)?;
                write(&cpu, "cpu.cfs_quota_us", quota_us(limits.cpu_millis))?;
            }
            Layout::V2 => {
                let parent = root.join(PARENT);
                fs::create_dir_all(&parent)?;
                // Controllers must be enabled on the way down; a parent already enabling them
                // (or refusing because of processes) is not fatal until a limit cannot be set.
                let _ = fs::write(root.join("cgroup.subtree_control"), "+memory +pids +cpu");
                let _ = fs::write(parent.join("cgroup.subtree_control"), "+memory +pids +cpu");
                let dir = group.make_dir(&parent)?;
                write(&dir, "memory.max", limits.memory_bytes)?;
                let _ = write(&dir, "memory.swap.max", 0);
                // One OOM kill takes the whole sandbox down, as in a container.
                let _ = write(&dir, "memory.oom.group", 1);
                write(&dir, "pids.max", limits.pids)?;
                // Missing when the cpu controller is not enabled for the parent: no CPU limit
                // then, which is an error, not a silent downgrade.
                fs::write(
                    dir.join("cpu.max"),
                    format!("{} {CFS_PERIOD_US}", quota_us(limits.cpu_millis)),
                )
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("{}: {e}", dir.join("cpu.max").display()))
                })?;
            }
        }
        for dir in &group.dirs {
            group.procs.push(
                OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.procs"))?,
            );
        }
        Ok(group)
    }

    /// Creates `<parent>/<id>` and remembers it for removal.
    fn make_dir(&mut self, parent: &Path) -> io::Result<PathBuf> {
        fs::create_dir_all(parent)?;
        let dir = parent.join(&self.id);
        fs::create_dir(&dir)?;
        self.dirs.push(dir.clone());
        Ok(dir)
    }

    /// The group's path relative to each hierarchy's root, for an OCI `linux.cgroupsPath`.
    pub(super) fn oci_path(&self) -> String {
        format!("/{PARENT}/{}", self.id)
    }

    /// File descriptors of the groups' `cgroup.procs`, for [`join_current`] in a child.
    pub(super) fn procs_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// Whether the kernel OOM-killed a process of this group.
    pub(super) fn oom_killed(&self) -> bool {
        let (file, key) = match self.layout {
            Layout::V1 => ("memory.oom_control", "oom_kill"),
            Layout::V2 => ("memory.events", "oom_kill"),
        };
        let Some(dir) = self.dirs.first() else {
            return false;
        };
        fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|text| {
                text.lines().find_map(|line| {
                    let (k, v) = line.split_once(' ')?;
                    (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
                })
            })
            .is_some_and(|n| n > 0)
    }

    /// Whether a fork was refused because the group reached `pids.max`.
    pub(super) fn pids_limit_hit(&self) -> bool {
        let dir = match self.layout {
            Layout::V1 => self
                .dirs
                .iter()
                .find(|d| d.starts_with(Path::new(CGROUP_ROOT).join("pids"))),
            Layout::V2 => self.dirs.first(),
        };
        dir.and_then(|d| fs::read_to_string(d.join("pids.events")).ok())
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("max ").map(|n| n.trim().parse::<u64>().ok()))
                    .flatten()
            })
            .is_some_and(|n| n > 0)
    }

    /// Kills every process in the group, repeating until none is left (a fork bomb may still be
    /// forking while it is killed; the pid limit bounds how long that can go on).
    pub(super) fn kill_all(&self) {
        if self.layout == Layout::V2
            && let Some(dir) = self.dirs.first()
            && fs::write(dir.join("cgroup.kill"), "1").is_ok()
        {
            self.wait_empty();
            return;
        }
        for _ in 0..200 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn wait_empty(&self) {
        for _ in 0..200 {
            if self.pids().is_empty() {
                return;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Every process in any of the run's groups.
    fn pids(&self) -> Vec<libc::pid_t> {
        let mut pids: Vec<libc::pid_t> = self
            .dirs
            .iter()
            .filter_map(|dir| fs::read_to_string(dir.join("cgroup.procs")).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        self.kill_all();
        self.procs.clear();
        let mut dirs = self.dirs.clone();
        if self.layout == Layout::V1 {
            // runsc also creates the run's path in the other v1 controllers (cpuset, devices,
            // freezer, ...) and may not get to remove them when it is killed.
            if let Ok(entries) = fs::read_dir(CGROUP_ROOT) {
                for entry in entries.flatten() {
                    let dir = entry.path().join(PARENT).join(&self.id);
                    if dir.is_dir() && !dirs.contains(&dir) {
                        dirs.push(dir);
                    }
                }
            }
        }
        for dir in dirs {
            // A group is removable once its last process has been reaped, which can lag the
            // kill by a moment.
            for _ in 0..100 {
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        }
    }
}

/// Removes the run groups (`<parent>/sbr-...`) whose name `stale` accepts: those of a driver
/// process that died without cleaning up. Whatever is still inside is killed first.
pub(super) fn sweep(stale: impl Fn(&str) -> bool) {
    let root = Path::new(CGROUP_ROOT);
    let mut parents = vec![root.join(PARENT)];
    if let Ok(controllers) = fs::read_dir(root) {
        parents.extend(controllers.flatten().map(|c| c.path().join(PARENT)));
    }
    for parent in parents {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !entry.path().is_dir() || !stale(&name) {
                continue;
            }
            let dir = entry.path();
            for _ in 0..50 {
                let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs
                    .lines()
                    .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
                {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        }
    }
}

/// Moves the calling process into the groups behind `fds` (writing "0" means "myself").
/// Only calls `write(2)`, so it is safe between fork and exec.
pub(super) fn join_current(fds: &[RawFd]) -> io::Result<()> {
    for &fd in fds {
        // SAFETY: writing a static buffer to a file descriptor the parent opened for us.
        if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn write(dir: &Path, file: &str, value: u64) -> io::Result<()> {
    fs::write(dir.join(file), value.to_string())
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.join(file).display())))
}

/// CFS quota for a CPU limit in thousandths of a core (at least 1 ms per period, as Linux wants).
fn quota_us(cpu_millis: u64) -> u64 {
    (cpu_millis * CFS_PERIOD_US / 1000).max(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_without_cgroups_are_refused_unless_allowed() {
        assert!(matches!(limits_enforced(Ok(()), false), Ok(None)));
        assert!(matches!(limits_enforced(Ok(()), true), Ok(None)));
        let err = limits_enforced(Err("cgroup v1 needs root".into()), false).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, super::super::LocalSandboxError::WeakLimits { .. }),
            "{text}"
        );
        for needle in [
            "cgroup v1 needs root",
            "memory, process and CPU",
            "run it as root",
            "delegate",
            "allow_weak_limits",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
        let warning = limits_enforced(Err("cgroup v1 needs root".into()), true)
            .unwrap()
            .unwrap();
        for needle in [
            "WITHOUT enforced limits",
            "cgroup v1 needs root",
            "memory is limited per process",
            "CPU is not limited",
            "RLIMIT_NPROC",
        ] {
            assert!(warning.contains(needle), "{needle}: {warning}");
        }
    }

    #[test]
    fn quota_follows_the_kubelet_formula() {
        assert_eq!(quota_us(500), 50_000);
        assert_eq!(quota_us(2000), 200_000);
        assert_eq!(quota_us(1), 1000);
    }
}

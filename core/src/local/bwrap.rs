//! The bubblewrap engine: Linux namespaces around the runner, no second kernel. Weaker than
//! gVisor (the code talks to the host kernel, through a seccomp filter that removes the system
//! calls it never needs but leaves the rest of the kernel reachable), which is why
//! [`super::Preference::Auto`] takes gVisor when it works.
//!
//! What the command line does, flag by flag:
//! - `--unshare-all --unshare-user --disable-userns`: new user, mount, PID, network, IPC, UTS and
//!   cgroup namespaces; the network namespace has only a down-then-up `lo`, so nothing outside
//!   is reachable; the code cannot create further user namespaces (a classic kernel attack
//!   surface).
//! - `--die-with-parent --new-session`: the sandbox dies with the driver's `bwrap` process (which
//!   is what `kill_on_drop` kills), and has no controlling terminal to inject input into.
//! - `--as-pid-1`: the runner is PID 1 of the sandbox, so that before printing its envelope it
//!   can kill every other process of the sandbox (`kill(-1)`), as in the Pod; and PID 1 cannot be
//!   killed by the code it runs.
//! - `--clearenv --setenv ...`: only PATH, HOME and LANG reach the sandbox (bwrap passes the
//!   host environment otherwise).
//! - `--ro-bind ROOTFS /`: the image is the whole, read-only file system; nothing of the host's
//!   is mounted (no `/sys`, no host `/tmp`). `--proc` is the sandbox's own PID namespace,
//!   `--dev` a minimal `/dev` (null, zero, random, tty, ...).
//!   `--size N --tmpfs /dev/shm` replaces the `/dev/shm` directory of that `/dev` (which would
//!   be a plain directory on `/dev`'s own tmpfs, half the host's memory, writable by the sandbox
//!   user) with a small bounded tmpfs ([`super::SHM_SIZE_BYTES`]), and `--remount-ro /dev` then
//!   makes the rest of `/dev` read-only (the device nodes are separate bind mounts and keep
//!   working; `/dev/pts` refuses new files anyway).
//! - `--size N --tmpfs /tmp`: with `/dev/shm` the only writable places, memory-backed and
//!   size-limited.
//! - `--add-seccomp-fd FD` (twice): the seccomp filter of [`super::seccomp`], which bwrap loads
//!   right before it executes the runner: a list of system calls fail with `EPERM` (ptrace,
//!   mounts, namespaces, keyrings, bpf, perf events, userfaultfd, io_uring, kernel modules, ...)
//!   and another ABI's system calls (i386, x32) kill the process. The programs are memory files
//!   whose close-on-exec flag is cleared between fork and exec; bwrap reads and closes them.
//! - `--uid/--gid 65532 --cap-drop ALL`: the image's unprivileged `sandbox` user (the Pod's
//!   `runAsUser`), with no capabilities even inside the user namespace; bwrap always sets
//!   `no_new_privs`.
//!
//! When the driver runs as root, bwrap maps the sandbox uid to the caller's host uid (0): the
//! code has no capabilities anywhere, every host path it could write is read-only or a private
//! tmpfs, and its processes are confined by the run's cgroup. Dropping to an unprivileged host
//! uid first would be stronger but makes a rootfs under `/root` unreachable (bwrap resolves its
//! bind sources as the calling user); see the driver's notes.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::Path;

/// The sandbox user and group: the image's `sandbox` (see images/README.md).
pub(super) const SANDBOX_ID: u32 = 65532;

/// bwrap's arguments up to and including `--`; the runner's argv follows. `seccomp_fds` are
/// the inherited descriptors of the seccomp programs ([`super::seccomp::bwrap_programs`]).
pub(super) fn args(rootfs: &Path, tmp_size_bytes: u64, seccomp_fds: &[RawFd]) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::with_capacity(48);
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    push(&[
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--hostname",
        "sandbox",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--ro-bind",
    ]);
    args.push(rootfs.as_os_str().to_owned());
    let size = tmp_size_bytes.to_string();
    let shm_size = super::SHM_SIZE_BYTES.to_string();
    let id = SANDBOX_ID.to_string();
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    push(&[
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        &shm_size,
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--size",
        &size,
        "--tmpfs",
        "/tmp",
        "--uid",
        &id,
        "--gid",
        &id,
        "--cap-drop",
        "ALL",
        "--chdir",
        "/tmp",
    ]);
    for fd in seccomp_fds {
        args.push("--add-seccomp-fd".into());
        args.push(fd.to_string().into());
    }
    args.push("--".into());
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_is_cleared_and_root_is_read_only() {
        let args = args(Path::new("/r"), 1024, &[7, 9]);
        let s: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        let at = |flag: &str| s.iter().position(|a| *a == flag).unwrap();
        assert!(at("--clearenv") < at("--setenv"));
        assert_eq!(s[at("--ro-bind") + 1..at("--ro-bind") + 3], ["/r", "/"]);
        let tmp = (1..s.len())
            .find(|&i| s[i] == "/tmp" && s[i - 1] == "--tmpfs")
            .unwrap();
        assert_eq!(s[tmp - 3..=tmp], ["--size", "1024", "--tmpfs", "/tmp"]);
        // /dev/shm is bounded, then the rest of /dev (a tmpfs of half the host's memory)
        // becomes read-only.
        let shm = s.iter().position(|a| *a == "/dev/shm").unwrap();
        assert_eq!(
            s[shm - 3..=shm + 2],
            [
                "--size",
                &super::super::SHM_SIZE_BYTES.to_string(),
                "--tmpfs",
                "/dev/shm",
                "--remount-ro",
                "/dev"
            ]
        );
        assert!(at("--dev") < shm);
        assert_eq!(s.last(), Some(&"--"));
        assert_eq!(
            s[s.len() - 5..s.len() - 1],
            ["--add-seccomp-fd", "7", "--add-seccomp-fd", "9"]
        );
        assert!(!s.contains(&"--bind") && !s.contains(&"--share-net"));
    }
}

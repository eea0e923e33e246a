//! The seccomp filter of the sandbox: a default-allow list of system calls that sandboxed
//! Python never needs and that kernel attacks and sandbox escapes are made of. Each returns
//! `EPERM` (a clean `PermissionError` in Python, never a crash); a system call of another ABI
//! than the driver's own (i386 through `int 0x80`, x32) kills the process, since every number
//! below means something else there.
//!
//! bubblewrap gets the filter as classic BPF on inherited file descriptors
//! (`--add-seccomp-fd`, see [`bwrap_programs`]): bwrap loads it last, right before it executes
//! the runner, so it holds for every process of the sandbox (seccomp filters are inherited and
//! cannot be removed; bwrap also sets `no_new_privs`). Two programs are stacked, since the
//! kernel applies the strictest answer of all: the list compiled by `seccompiler` (rust-vmm's,
//! which also kills a foreign architecture), and a four-instruction one for the x32 ABI (same
//! architecture value, system call numbers with bit 30 set), which `seccompiler` cannot
//! express.
//!
//! gVisor gets the same list as the OCI `linux.seccomp` profile ([`oci_profile`]), enforced by
//! its own kernel inside the sandbox (`runsc --oci-seccomp`): there the host kernel is already
//! behind gVisor's, and the filter keeps its answers identical on both engines.
//!
//! Why each group is there is written on it (see [`DENIED`]). What is not filtered, and why:
//! `clone` with namespace flags needs `CAP_SYS_ADMIN` in the sandbox's user namespace (all
//! capabilities are dropped) or a new user namespace (bwrap's `--disable-userns` forbids it),
//! and `clone3` passes its flags in memory, where a seccomp filter cannot look.

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, sock_filter,
};
use serde_json::{Value, json};

/// A system call: its name (as in the OCI profile) and its number on this architecture.
type Syscall = (&'static str, i64);

/// Reading or changing other processes (memory, file descriptors, registers): the runner and the
/// code's other processes must stay out of reach, so the result cannot be forged from inside.
const PROCESS_ACCESS: &[Syscall] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("kcmp", libc::SYS_kcmp),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("process_madvise", libc::SYS_process_madvise),
];

/// The kernel itself: loading code into it, replacing it, rebooting it, swap, accounting and
/// quotas, its log. Capabilities already refuse these; the filter keeps the kernel's code paths
/// behind them out of reach too.
const KERNEL: &[Syscall] = &[
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("quotactl_fd", libc::SYS_quotactl_fd),
    ("syslog", libc::SYS_syslog),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("vhangup", libc::SYS_vhangup),
];

/// Port I/O and legacy library loading, x86 only: direct hardware access and an old kernel-side
/// ELF loader.
#[cfg(target_arch = "x86_64")]
const X86: &[Syscall] = &[
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("uselib", libc::SYS_uselib),
];
#[cfg(not(target_arch = "x86_64"))]
const X86: &[Syscall] = &[];

/// Mounts, old and new API, and chroot: the file system the sandbox sees is set up by bwrap and
/// final; the new mount API (fsopen, fsconfig, ...) parses file system options in the kernel, a
/// history of exploits.
const MOUNTS: &[Syscall] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
];

/// Namespaces: entering or making them is how user-namespace kernel exploits start (bwrap's
/// --disable-userns already refuses new user namespaces).
const NAMESPACES: &[Syscall] = &[("unshare", libc::SYS_unshare), ("setns", libc::SYS_setns)];

/// Kernel keyrings: shared kernel state with a long record of bugs, of no use to Python.
const KEYRINGS: &[Syscall] = &[
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
];

/// Kernel attack surface with a record of privilege escalations: eBPF, perf events, userfaultfd
/// (used to win kernel races) and io_uring (which also performs I/O that seccomp never sees).
const ATTACK_SURFACE: &[Syscall] = &[
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
];

/// File handles: open_by_handle_at opens files by inode, bypassing the mount namespace (the
/// 'shocker' container escape); name_to_handle_at hands out the handles.
const FILE_HANDLES: &[Syscall] = &[
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
];

/// The host's clock is not the sandbox's to set.
const CLOCK: &[Syscall] = &[
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("settimeofday", libc::SYS_settimeofday),
    ("adjtimex", libc::SYS_adjtimex),
];

/// The system calls that fail with `EPERM` whatever their arguments, by group.
pub(super) const DENIED: &[&[Syscall]] = &[
    PROCESS_ACCESS,
    KERNEL,
    X86,
    MOUNTS,
    NAMESPACES,
    KEYRINGS,
    ATTACK_SURFACE,
    FILE_HANDLES,
    CLOCK,
];

/// `personality(2)` values that stay allowed: `PER_LINUX` (the default) and `0xffffffff`
/// (which only queries). Others switch on legacy behaviour (READ_IMPLIES_EXEC,
/// ADDR_NO_RANDOMIZE, ...) that weakens exploit mitigations.
const PERSONALITY_ALLOWED: [u64; 2] = [0, 0xffff_ffff];

/// The OCI profile's name of this architecture.
const OCI_ARCH: &str = if cfg!(target_arch = "aarch64") {
    "SCMP_ARCH_AARCH64"
} else if cfg!(target_arch = "riscv64") {
    "SCMP_ARCH_RISCV64"
} else {
    "SCMP_ARCH_X86_64"
};

/// x32 system calls carry this bit in their number (`__X32_SYSCALL_BIT`).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The filter as `seccompiler` rules: the denied calls unconditionally, `personality` unless
/// its argument is allowed.
fn filter() -> SeccompFilter {
    let mut rules: std::collections::BTreeMap<i64, Vec<SeccompRule>> = DENIED
        .iter()
        .flat_map(|g| g.iter().map(|&(_, nr)| (nr, Vec::new())))
        .collect();
    let not = |value| {
        SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, value)
            .expect("argument 0 exists")
    };
    rules.insert(
        libc::SYS_personality,
        vec![
            SeccompRule::new(PERSONALITY_ALLOWED.iter().map(|&v| not(v)).collect())
                .expect("conditions are valid"),
        ],
    );
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        std::env::consts::ARCH
            .try_into()
            .expect("an architecture seccompiler knows (x86_64, aarch64, riscv64)"),
    )
    .expect("the actions differ")
}

/// The x32 program: kill a system call with [`X32_SYSCALL_BIT`], allow the rest (the main
/// program judges those).
fn x32_program() -> Vec<sock_filter> {
    // BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JGE | BPF_K, BPF_RET | BPF_K (linux/filter.h).
    const LD_W_ABS: u16 = 0x20;
    const JMP_JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    let op = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        // seccomp_data.nr is at offset 0.
        op(LD_W_ABS, 0, 0, 0),
        op(JMP_JGE_K, 0, 1, X32_SYSCALL_BIT),
        op(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

fn to_bytes(program: &[sock_filter]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for op in program {
        bytes.extend_from_slice(&op.code.to_ne_bytes());
        bytes.push(op.jt);
        bytes.push(op.jf);
        bytes.extend_from_slice(&op.k.to_ne_bytes());
    }
    bytes
}

/// The programs bwrap loads (`struct sock_filter` arrays, one per `--add-seccomp-fd`),
/// compiled once.
pub(super) fn bwrap_programs() -> &'static [Vec<u8>] {
    static PROGRAMS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        let main: BpfProgram = filter().try_into().expect("the filter compiles");
        let mut programs = vec![to_bytes(&main)];
        if cfg!(target_arch = "x86_64") {
            programs.push(to_bytes(&x32_program()));
        }
        programs
    })
}

/// A memory file holding `program`, positioned at its start, close-on-exec and numbered 3 or
/// above (so that setting up the child's stdio cannot overwrite it). The child clears
/// close-on-exec with [`inherit`].
pub(super) fn memfd(program: &[u8]) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create with a static NUL-terminated name.
    let raw = unsafe { libc::memfd_create(c"sandboxrun-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a new descriptor nobody else owns.
    let mut file = unsafe { File::from_raw_fd(raw) };
    file.write_all(program)?;
    file.seek(SeekFrom::Start(0))?;
    // SAFETY: duplicating a descriptor we own.
    let high = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if high < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `high` is a new descriptor nobody else owns (it shares the offset, at 0).
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// Lets `fd` survive the exec into bwrap. Only calls `fcntl(2)`, so it is safe between fork
/// and exec.
pub(super) fn inherit(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor of this process; FD_CLOEXEC is the only descriptor flag.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The same filter as an OCI `linux.seccomp` profile, for gVisor. `personality` is left out:
/// gVisor refuses every personality but the default itself (`EINVAL`), and its OCI profiles
/// cannot express "neither 0 nor 0xffffffff" (two conditions on one argument: runsc keeps only
/// one of them).
pub(super) fn oci_profile() -> Value {
    let names: Vec<&str> = DENIED
        .iter()
        .flat_map(|g| g.iter().map(|&(name, _)| name))
        .collect();
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": [OCI_ARCH],
        "syscalls": [
            {"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EPERM}
        ]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_requested_call_is_denied_once() {
        let mut names: Vec<&str> = DENIED
            .iter()
            .flat_map(|g| g.iter().map(|&(n, _)| n))
            .collect();
        for required in [
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "mount",
            "umount2",
            "pivot_root",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsmount",
            "fspick",
            "unshare",
            "setns",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "syslog",
            "lookup_dcookie",
            "open_by_handle_at",
            "name_to_handle_at",
            "clock_settime",
            "settimeofday",
            "adjtimex",
            "chroot",
            "vhangup",
            "iopl",
            "ioperm",
        ] {
            assert!(names.contains(&required), "{required} is not denied");
        }
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a system call is listed twice");
        // Nothing Python needs every day.
        for needed in [
            "clone", "clone3", "execve", "mmap", "openat", "socket", "wait4",
        ] {
            assert!(!names.contains(&needed), "{needed} must stay allowed");
        }
    }

    #[test]
    fn programs_compile_to_whole_instructions() {
        let programs = bwrap_programs();
        assert_eq!(
            programs.len(),
            if cfg!(target_arch = "x86_64") { 2 } else { 1 }
        );
        for p in programs {
            assert!(!p.is_empty() && p.len() % 8 == 0 && p.len() / 8 < 4096);
        }
    }

    #[test]
    fn oci_profile_denies_with_eperm() {
        let p = oci_profile();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ALLOW");
        assert_eq!(p["syscalls"][0]["errnoRet"], 1);
        assert!(
            p["syscalls"][0]["names"]
                .as_array()
                .unwrap()
                .contains(&json!("ptrace"))
        );
    }

    #[test]
    fn the_memfd_holds_the_program_from_its_start() {
        use std::io::Read;
        let fd = memfd(b"12345678").unwrap();
        assert!(fd.as_raw_fd() >= 3);
        let mut read = String::new();
        File::from(fd).read_to_string(&mut read).unwrap();
        assert_eq!(read, "12345678");
    }
}

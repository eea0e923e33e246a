//! The local sandbox driver against real engines (gVisor `runsc` and bubblewrap), no mocks:
//! basic runs, then the hostile-code list of the operator issue. Each test runs on every engine
//! that works here (see `local_common`); `SANDBOXRUN_REQUIRE_ENGINES=gvisor,bubblewrap` makes a
//! missing engine fail instead of being skipped.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

mod local_common;

use std::time::{Duration, Instant};

use local_common::{CANARY_VAR, Run, engines, leftovers, serial, wait_no_leftovers};
use sandboxrun_core::{
    Isolation, Limits, LocalSandbox, LocalSandboxConfig, LocalSandboxError, Phase, Preference,
    Profile, Program,
};

fn limits() -> Limits {
    Limits {
        timeout_seconds: 20,
        ..Limits::default()
    }
}

async fn run(sandbox: &LocalSandbox, code: &str, limits: &Limits) -> Run {
    let run = sandbox
        .run_python(code, limits)
        .await
        .unwrap_or_else(|e| panic!("{}: run failed to start: {e}", sandbox.isolation()));
    Run::of(run, limits)
}

/// Runs `code` on every engine and hands each result to `check`, then asserts that nothing
/// was left behind.
async fn on_each_engine(code: &str, limits: &Limits, check: impl Fn(Isolation, &Run)) {
    for (isolation, sandbox) in engines() {
        let r = run(sandbox, code, limits).await;
        eprintln!(
            "{isolation}: {:?} {:?} exit {} in {} ms",
            r.outcome, r.reason, r.result.exit_code, r.duration_ms
        );
        check(*isolation, &r);
        let left = wait_no_leftovers("\u{0}never\u{0}", 5).await;
        assert!(left.is_empty(), "{isolation}: left behind: {left:#?}");
    }
}

#[tokio::test]
async fn print_one_succeeds() {
    let _serial = serial().await;
    on_each_engine("print(1)", &limits(), |engine, r| {
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        assert_eq!(r.reason, None);
        assert_eq!(r.result.exit_code, 0);
        assert_eq!(r.result.stdout, "1\n", "{engine}");
        assert_eq!(r.result.stderr, "", "{engine}");
        assert!(!r.result.truncated());
    })
    .await;
}

#[tokio::test]
async fn two_hundred_kib_of_code_runs() {
    // More than one argv string may hold (128 KiB): the program goes to the runner's stdin.
    let _serial = serial().await;
    let filler = format!("# {}\n", "x".repeat(1000)).repeat(210);
    // Whether the filler is on the process's command line (built so that this line is not).
    let code = format!("{filler}print(b'x' * 1000 in open('/proc/self/cmdline','rb').read())");
    assert!(code.len() > 200 * 1024);
    on_each_engine(&code, &limits(), |engine, r| {
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        assert_eq!(r.result.stdout, "False\n", "{engine}: {r:?}");
    })
    .await;
}

#[tokio::test]
async fn exit_code_and_streams_are_separate() {
    let _serial = serial().await;
    let code = "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)";
    on_each_engine(code, &limits(), |engine, r| {
        assert_eq!(r.outcome, Phase::Failed, "{engine}: {r:?}");
        assert_eq!(r.reason.as_deref(), Some("NonZeroExit"));
        assert_eq!(r.result.exit_code, 3);
        assert_eq!(r.result.stdout, "out\n", "{engine}");
        assert_eq!(r.result.stderr, "err\n", "{engine}");
    })
    .await;
}

#[tokio::test]
async fn environment_has_nothing_of_the_host() {
    let _serial = serial().await;
    let engines_found = !engines().is_empty();
    assert!(std::env::var(CANARY_VAR).is_ok() || !engines_found);
    let code = format!(
        "import os\nprint(sorted(os.environ))\nprint(os.environ.get({CANARY_VAR:?}, 'absent'))\n\
         print(os.getuid(), os.getgid())"
    );
    on_each_engine(&code, &limits(), |engine, r| {
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        let mut lines = r.result.stdout.lines();
        let keys = lines.next().unwrap();
        let allowed = ["PATH", "HOME", "LANG", "LC_CTYPE", "PWD"];
        for key in keys.trim_matches(['[', ']']).split(", ") {
            let key = key.trim_matches('\'');
            assert!(
                allowed.contains(&key),
                "{engine}: unexpected variable {key} in {keys}"
            );
        }
        assert_eq!(lines.next(), Some("absent"), "{engine}");
        assert_eq!(
            lines.next(),
            Some("65532 65532"),
            "{engine}: not the sandbox user"
        );
    })
    .await;
}

#[tokio::test]
async fn host_files_are_not_visible() {
    let _serial = serial().await;
    let marker = format!("/tmp/sandboxrun-host-marker-{}", std::process::id());
    std::fs::write(&marker, "host").unwrap();
    let rootfs = LocalSandboxConfig::default_rootfs();
    let image_hostname = std::fs::read_to_string(rootfs.join("etc/hostname")).unwrap_or_default();
    let code = format!(
        r#"
import os
print(os.path.exists({marker:?}))
print(repr(open('../../../../etc/hostname').read()))
try:
    data = open('../../../../../etc/shadow').read()
    print('shadow', len(data), 'root:' in data)
except PermissionError:
    print('shadow denied')
print(os.path.exists('/root/.cache'), os.path.exists('/work'), os.path.exists('/sys/fs/cgroup/memory'))
"#
    );
    on_each_engine(&code, &limits(), |engine, r| {
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        let lines: Vec<&str> = r.result.stdout.lines().collect();
        assert_eq!(lines[0], "False", "{engine}: host /tmp marker visible");
        assert_eq!(
            lines[1],
            format!("{image_hostname:?}").replace('"', "'"),
            "{engine}"
        );
        if lines[2] != "shadow denied" {
            // Readable only as the image's own shadow (the sandbox user owns nothing else).
            let image_shadow = std::fs::read_to_string(rootfs.join("etc/shadow")).unwrap();
            assert_eq!(
                lines[2],
                format!("shadow {} True", image_shadow.len()),
                "{engine}"
            );
            let host = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
            assert!(host != image_shadow || host.is_empty());
        }
        assert_eq!(
            lines[3], "False False False",
            "{engine}: host paths visible"
        );
    })
    .await;
    let _ = std::fs::remove_file(marker);
}

#[tokio::test]
async fn network_is_only_loopback_and_host_is_unreachable() {
    let _serial = serial().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        r#"
import socket
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()
    print('connected')
except OSError as e:
    print('blocked', type(e).__name__)
names = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]
print(names)
"#
    );
    on_each_engine(&code, &limits(), |engine, r| {
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        let lines: Vec<&str> = r.result.stdout.lines().collect();
        assert!(lines[0].starts_with("blocked"), "{engine}: {lines:?}");
        assert_eq!(lines[1], "['lo']", "{engine}");
    })
    .await;
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "a sandbox reached the host listener"
    );
}

#[tokio::test]
async fn root_is_read_only_and_tmp_is_writable() {
    let _serial = serial().await;
    let code = r#"
import os
for path in ['/etc/evil', '/usr/bin/evil', '/evil', '/var/tmp/evil', '/home/evil']:
    try:
        open(path, 'w').write('x')
        print('wrote', path)
    except OSError as e:
        print('refused', e.errno)
open('/tmp/ok', 'w').write('fine')
print(open('/tmp/ok').read())
"#;
    on_each_engine(code, &limits(), |engine, r| {
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        let lines: Vec<&str> = r.result.stdout.lines().collect();
        for line in &lines[..5] {
            assert!(line.starts_with("refused"), "{engine}: {lines:?}");
        }
        assert_eq!(lines[5], "fine");
    })
    .await;
}

#[tokio::test]
async fn tmp_is_size_limited() {
    let _serial = serial().await;
    // 16 MiB more than /tmp holds, in 1 MiB writes.
    let mib = sandboxrun_core::local::DEFAULT_TMP_SIZE_BYTES / (1 << 20) + 16;
    let code = format!(
        r#"
import errno
written = 0
try:
    with open('/tmp/fill', 'wb') as f:
        for _ in range({mib}):
            f.write(b'x' * (1 << 20))
            f.flush()
            written += 1
    print('wrote all', written)
except OSError as e:
    print('refused', errno.errorcode.get(e.errno), written)
"#
    );
    on_each_engine(&code, &limits(), |engine, r| {
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        assert!(
            r.result.stdout.starts_with("refused"),
            "{engine}: {}",
            r.result.stdout
        );
    })
    .await;
}

#[tokio::test]
async fn fork_bomb_is_stopped() {
    let _serial = serial().await;
    let limits = Limits {
        timeout_seconds: 10,
        ..Limits::default()
    };
    let code = "import os\nwhile True: os.fork()";
    on_each_engine(code, &limits, |engine, r| {
        eprintln!("{engine}: {:?}", r.result);
        assert_ne!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        assert!(
            r.duration_ms < 25_000,
            "{engine}: took {} ms",
            r.duration_ms
        );
    })
    .await;
    // The host still forks.
    assert!(
        std::process::Command::new("true")
            .status()
            .unwrap()
            .success()
    );
}

#[tokio::test]
async fn memory_bomb_is_stopped() {
    let _serial = serial().await;
    let limits = Limits {
        memory: "256Mi".into(),
        ..limits()
    };
    // Touches every byte: 1 GiB of real memory, four times the limit.
    let code = "x = bytearray(b'x') * (1 << 30)\nprint(len(x))";
    for (isolation, sandbox) in engines() {
        let r = run(sandbox, code, &limits).await;
        eprintln!("{isolation}: {:?} {:?} {:?}", r.outcome, r.reason, r.result);
        assert_eq!(r.outcome, Phase::Failed, "{isolation}: {r:?}");
        assert_eq!(r.result.stdout, "", "{isolation}: the allocation succeeded");
        if sandbox.uses_cgroups() {
            assert_eq!(r.reason.as_deref(), Some("OOMKilled"), "{isolation}: {r:?}");
        }
        let left = wait_no_leftovers("\u{0}never\u{0}", 5).await;
        assert!(left.is_empty(), "{isolation}: left behind: {left:#?}");
    }
}

#[tokio::test]
async fn infinite_loop_times_out() {
    let _serial = serial().await;
    let limits = Limits {
        timeout_seconds: 2,
        ..Limits::default()
    };
    on_each_engine(
        "print('spinning', flush=True)\nwhile True: pass",
        &limits,
        |engine, r| {
            assert_eq!(r.outcome, Phase::TimedOut, "{engine}: {r:?}");
            assert_eq!(r.reason.as_deref(), Some("DeadlineExceeded"));
            assert!(r.result.timed_out);
            assert_eq!(
                r.result.stdout, "spinning\n",
                "{engine}: output before the kill is kept"
            );
            assert!(r.duration_ms < 6_000, "{engine}: took {} ms", r.duration_ms);
        },
    )
    .await;
}

#[tokio::test]
async fn output_over_the_cap_is_truncated_and_flagged() {
    let _serial = serial().await;
    let limits = Limits {
        output_bytes: 1000,
        ..limits()
    };
    // Also floods the sandbox's own stdout (the runner's) from inside, which the driver must
    // survive without holding it all in memory.
    let code = "import sys\nsys.stdout.write('x' * 5_000_000)\nsys.stderr.write('e' * 10)";
    on_each_engine(code, &limits, |engine, r| {
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        assert_eq!(r.result.stdout, "x".repeat(1000), "{engine}");
        assert!(r.result.stdout_truncated && r.result.truncated());
        assert_eq!(r.result.stderr, "e".repeat(10));
        assert!(!r.result.stderr_truncated);
    })
    .await;
}

/// What the code prints reaches the caller while it runs, and the chunks add up to the result's
/// output, past the cap nothing more streamed. "While it runs" is shown by cause, not by a clock:
/// code that prints a line and then sleeps until its ten-minute timeout must have its line
/// delivered while it still sleeps, however slow the machine (the run is then dropped, which
/// kills it).
#[tokio::test]
async fn output_is_streamed_while_the_code_runs() {
    use sandboxrun_core::{OutputChunk, OutputFn, Stream};
    use std::sync::{Arc, Mutex};
    let _serial = serial().await;
    let code = "import sys, time\nprint('first')\nprint('oops', file=sys.stderr)\n\
                time.sleep(2)\nprint('second é')\nsys.stdout.write('x' * 3000)\n";
    let limits = Limits {
        output_bytes: 1024,
        ..limits()
    };
    for (isolation, sandbox) in engines() {
        let seen: Arc<Mutex<Vec<(Instant, OutputChunk)>>> = Arc::default();
        let sink = seen.clone();
        let output: OutputFn = Arc::new(move |c| sink.lock().unwrap().push((Instant::now(), c)));
        let run = sandbox
            .run(
                &Program::code(code),
                Profile::Minimal,
                &limits,
                Some(output),
            )
            .await
            .unwrap();
        let ended = Instant::now();
        let env = run.envelope.as_ref().expect("an envelope");
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        let text = |stream| {
            seen.iter()
                .filter(|(_, c)| c.stream == stream)
                .map(|(_, c)| c.text.as_str())
                .collect::<String>()
        };
        assert_eq!(text(Stream::Stdout), env.stdout, "{isolation}: {seen:?}");
        assert_eq!(text(Stream::Stderr), "oops\n", "{isolation}");
        assert!(
            env.stdout_truncated && env.stdout.len() <= 1024,
            "{isolation}"
        );
        let first = seen
            .iter()
            .find(|(_, c)| c.text.contains("first"))
            .expect("the first line");
        assert!(first.0 <= ended, "{isolation}");
        assert!(seen.len() >= 2, "{isolation}: {seen:?}");

        // Delivered while the code still runs: it cannot end before its sleep does.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let tx = Mutex::new(Some(tx));
        let output: OutputFn = Arc::new(move |c| {
            if c.text.contains("first")
                && let Some(tx) = tx.lock().unwrap().take()
            {
                let _ = tx.send(());
            }
        });
        let sleeping = Limits {
            timeout_seconds: 600,
            ..limits.clone()
        };
        let program = Program::code("print('first', flush=True)\nimport time\ntime.sleep(3600)\n");
        let run = sandbox.run(&program, Profile::Minimal, &sleeping, Some(output));
        tokio::select! {
            ended = run => panic!("{isolation}: the run ended before its first line was streamed: {ended:?}"),
            seen = rx => seen.expect("the first line, streamed while the code sleeps"),
        }
    }
}

#[tokio::test]
async fn dropping_the_run_kills_everything() {
    let _serial = serial().await;
    for (isolation, sandbox) in engines() {
        let token = format!("drop-token-{}-{isolation}", std::process::id());
        let code = format!("# {token}\nimport os, time\nos.fork()\ntime.sleep(120)");
        let started = Instant::now();
        let limits = limits();
        let run = sandbox.run_python(&code, &limits);
        // Long enough for the sandbox to be up and the code sleeping.
        let outcome = tokio::time::timeout(Duration::from_millis(2500), run).await;
        assert!(
            outcome.is_err(),
            "{isolation}: the run ended by itself: {outcome:?}"
        );
        let left = leftovers(&token);
        assert!(
            left.is_empty(),
            "{isolation}: left behind right after the drop: {left:#?}"
        );
        eprintln!(
            "{isolation}: dropped and cleaned in {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn missing_rootfs_is_an_actionable_error() {
    let _serial = serial().await;
    let config = LocalSandboxConfig {
        rootfs: "/nonexistent/sandboxrun-rootfs".into(),
        preference: Preference::Auto,
        ..LocalSandboxConfig::default()
    };
    let err = LocalSandbox::detect(config).await.unwrap_err();
    assert!(
        matches!(err, LocalSandboxError::RootfsMissing { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("images/build.sh rootfs sandbox-python /nonexistent/sandboxrun-rootfs"),
        "{err}"
    );
}

#[tokio::test]
async fn invalid_memory_limit_is_rejected_before_anything_runs() {
    let _serial = serial().await;
    for (isolation, sandbox) in engines() {
        let bad = Limits {
            memory: "lots".into(),
            ..Limits::default()
        };
        let err = sandbox.run_python("print(1)", &bad).await.unwrap_err();
        assert!(err.to_string().contains("256Mi"), "{isolation}: {err}");
    }
}

// --- Hardening: writable memory, seccomp, state directory, weak limits -----------------------

/// Bytes `/dev/shm` may hold (the driver's bound); the tests write well beyond it.
const SHM_BOUND: u64 = sandboxrun_core::local::SHM_SIZE_BYTES;

#[tokio::test]
async fn dev_shm_is_bounded() {
    let _serial = serial().await;
    // 32 MiB more than /dev/shm may hold, in 1 MiB writes; a POSIX shared memory segment of
    // the same size too (it lives in /dev/shm).
    let mib = SHM_BOUND / (1 << 20) + 32;
    let code = format!(
        r#"
import errno, os
written = 0
try:
    with open('/dev/shm/fill', 'wb') as f:
        for _ in range({mib}):
            f.write(b'x' * (1 << 20))
            f.flush()
            written += 1
    print('wrote all', written, flush=True)
except OSError as e:
    print('refused', errno.errorcode.get(e.errno), written, flush=True)
os.unlink('/dev/shm/fill')
from multiprocessing import shared_memory
try:
    shm = shared_memory.SharedMemory(create=True, size={mib} << 20)
    shm.buf[:] = b'x' * ({mib} << 20)
    print('segment filled', flush=True)
except (OSError, BufferError) as e:
    print('segment refused', type(e).__name__, flush=True)
"#
    );
    on_each_engine(&code, &limits(), |engine, r| {
        let lines: Vec<&str> = r.result.stdout.lines().collect();
        // Refused for lack of space (not of permission: /dev/shm must be usable), after at
        // least a MiB.
        let first = lines.first().copied().unwrap_or_default();
        assert!(
            first.starts_with("refused ENOSPC") && !first.ends_with(" 0"),
            "{engine}: /dev/shm is not a bounded, writable tmpfs of {SHM_BOUND} bytes: {r:?}"
        );
        // Filling a too-large segment dies with SIGBUS (the tmpfs is full) or fails: either
        // way it is not filled.
        assert!(
            !r.result.stdout.contains("segment filled"),
            "{engine}: a shared memory segment beyond the bound was filled: {r:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn only_bounded_tmpfs_are_writable() {
    let _serial = serial().await;
    // Tries to create a file in every directory of the sandbox (but /proc and /sys) and prints
    // each that took one, with the size of its file system.
    let code = r#"
import os
skip = ('/proc', '/sys')
for top, dirs, files in os.walk('/'):
    dirs[:] = [d for d in dirs if not os.path.join(top, d).startswith(skip)]
    probe = os.path.join(top, '.sandboxrun-probe')
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError:
        continue
    os.unlink(probe)
    st = os.statvfs(top)
    print(top, st.f_blocks * st.f_frsize)
"#;
    on_each_engine(code, &limits(), |engine, r| {
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        let tmp_size = sandboxrun_core::local::DEFAULT_TMP_SIZE_BYTES;
        let mut writable = Vec::new();
        for line in r.result.stdout.lines() {
            let (dir, size) = line.rsplit_once(' ').unwrap();
            let size: u64 = size.parse().unwrap();
            let bound = match dir {
                // The runner makes /tmp/outputs in the same /tmp, for the files the code returns.
                "/tmp" | "/tmp/outputs" => tmp_size,
                "/dev/shm" => SHM_BOUND,
                other => panic!("{engine}: {other} is writable ({size} bytes): {r:?}"),
            };
            assert!(
                size <= bound,
                "{engine}: {dir} is a {size}-byte file system, more than {bound}"
            );
            writable.push(dir);
        }
        assert!(writable.contains(&"/tmp"), "{engine}: {writable:?}");
    })
    .await;
}

/// Calls each system call through `ctypes` with arguments that, without a filter, give a
/// result other than EPERM (success, EFAULT, EINVAL, ENOENT, ...), so EPERM means the filter.
const DENIED_SYSCALLS_PY: &str = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 'ok' if r >= 0 else errno.errorcode.get(ctypes.get_errno(), '?')
calls = [
    ('unshare', 272, 0),
    ('setns', 308, -1, 0),
    ('mount', 165, 1, 1, 1, 0, 0),
    ('umount2', 166, 1, 0),
    ('pivot_root', 155, 1, 1),
    ('chroot', 161, 1),
    ('open_tree', 428, -1, 1, 0),
    ('move_mount', 429, -1, 1, -1, 1, 0),
    ('fsopen', 430, 1, 0),
    ('fsmount', 432, -1, 0, 0),
    ('fspick', 433, -1, 1, 0),
    ('keyctl', 250, 0, -3, 0),
    ('add_key', 248, 1, 1, 0, 0, 0),
    ('request_key', 249, 1, 1, 0, 0),
    ('bpf', 321, 9999, 0, 0),
    ('perf_event_open', 298, 0, 0, -1, -1, 0),
    ('userfaultfd', 323, 1 | os.O_CLOEXEC),
    ('io_uring_setup', 425, 1, 0),
    ('io_uring_enter', 426, -1, 0, 0, 0, 0, 0),
    ('io_uring_register', 427, -1, 0, 0, 0),
    ('process_vm_readv', 310, os.getpid(), 0, 0, 0, 0, 0),
    ('process_vm_writev', 311, os.getpid(), 0, 0, 0, 0, 0),
    ('name_to_handle_at', 303, -100, 1, 1, 1, 0),
    ('open_by_handle_at', 304, -1, 1, 0),
    ('personality', 135, 0x0008),
    ('settimeofday', 164, 0, 0),
    ('clock_settime', 227, 0, 1),
    ('adjtimex', 159, 1),
    ('finit_module', 313, -1, 0, 0),
    ('delete_module', 176, 1, 0),
    ('kexec_load', 246, 0, 0, 0, 0),
    ('swapon', 167, 1, 0),
    ('quotactl', 179, 0, 1, 0, 0),
    ('lookup_dcookie', 212, 0, 0, 0),
    ('syslog', 103, 10, 0, 0),
    ('ptrace', 101, 0, 0, 0, 0),
]
for name, nr, *args in calls:
    print(name, call(nr, *args))
print('personality-query', call(135, 0xffffffff))
print('personality-default', call(135, 0))
"#;

#[tokio::test]
async fn dangerous_syscalls_fail_with_eperm() {
    let _serial = serial().await;
    on_each_engine(DENIED_SYSCALLS_PY, &limits(), |engine, r| {
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        let mut seen = 0;
        for line in r.result.stdout.lines() {
            let (name, result) = line.split_once(' ').unwrap();
            let expected = match (name, engine) {
                ("personality-query" | "personality-default", _) => "ok",
                // gVisor refuses other personalities itself (see seccomp::oci_profile).
                ("personality", Isolation::Gvisor) => "EINVAL",
                _ => "EPERM",
            };
            assert_eq!(result, expected, "{engine}: {name}: {}", r.result.stdout);
            seen += 1;
        }
        assert_eq!(seen, 38, "{engine}: {r:?}");
    })
    .await;
}

#[tokio::test]
async fn other_abis_are_killed_under_bubblewrap() {
    let _serial = serial().await;
    // x32 (`getpid | __X32_SYSCALL_BIT`) and i386 (`int 0x80`, getpid) system calls, each in its
    // own interpreter: the filter is written for x86_64 numbers, so any other ABI is killed.
    let code = r#"
import subprocess, sys
x32 = "import ctypes; ctypes.CDLL(None).syscall(0x40000027)"
i386 = '''
import ctypes, mmap
code = bytes.fromhex('b814000000cd80c3')
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
ctypes.CFUNCTYPE(ctypes.c_long)(addr)()
'''
for name, src in [('x32', x32), ('i386', i386)]:
    print(name, subprocess.run([sys.executable, '-c', src]).returncode)
"#;
    for (isolation, sandbox) in engines() {
        if *isolation != Isolation::Bubblewrap {
            continue;
        }
        let r = run(sandbox, code, &limits()).await;
        assert_eq!(r.outcome, Phase::Succeeded, "{isolation}: {r:?}");
        assert_eq!(
            r.result.stdout,
            format!("x32 -{0}\ni386 -{0}\n", libc_sigsys()),
            "{isolation}: {r:?}"
        );
    }
}

fn libc_sigsys() -> i32 {
    31
}

#[tokio::test]
async fn ordinary_python_still_works() {
    let _serial = serial().await;
    let code = r#"
import os
# Nothing of the driver's (the seccomp programs' descriptors) reaches the code: only stdio and
# the descriptor listdir opens.
fds = sorted(os.listdir('/proc/self/fd'))
import threading, subprocess, multiprocessing, sys, tempfile, socket, asyncio
from multiprocessing import shared_memory
out = []
t = threading.Thread(target=lambda: out.append(1)); t.start(); t.join()
print('thread', out)
print('subprocess', subprocess.run([sys.executable, '-c', 'print(6*7)'], capture_output=True, text=True).stdout.strip())
with tempfile.NamedTemporaryFile(dir='/tmp') as f:
    f.write(b'x'); f.flush(); print('tmpfile', os.path.getsize(f.name))
with multiprocessing.Pool(2) as p:
    print('pool', p.map(abs, [-1, -2, -3]))
shm = shared_memory.SharedMemory(create=True, size=1 << 20)
shm.buf[0] = 7; print('shm', shm.buf[0]); shm.close(); shm.unlink()
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()
c = socket.create_connection(s.getsockname()); a, _ = s.accept(); c.sendall(b'hi')
print('socket', a.recv(2))
print('asyncio', asyncio.run(asyncio.sleep(0, result=5)))
import pty
m, t = pty.openpty(); os.write(t, b'p'); print('pty', os.read(m, 1))
print('fds', fds)
"#;
    on_each_engine(code, &limits(), |engine, r| {
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        assert_eq!(
            r.result.stdout,
            "thread [1]\nsubprocess 42\ntmpfile 1\npool [1, 2, 3]\nshm 7\nsocket b'hi'\nasyncio 5\n\
             pty b'p'\nfds ['0', '1', '2', '3']\n",
            "{engine}: {r:?}"
        );
    })
    .await;
}

/// A scratch directory of this test binary, for state directories (removed first).
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sandboxrun-state-test-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    dir
}

/// Removes a scratch directory, unmounting first what runsc mounted in it (its `--root` keeps
/// a `null-netns` bind mount for `--network=none`). A finished call's sandbox is torn down in the
/// background (`runsc delete` may still be removing its state when the call has returned), so a
/// directory that is not empty yet is tried again, yielding to that teardown in between, until
/// it is gone: how long the teardown takes is the machine's business, not the test's.
async fn remove_scratch(dir: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let prefix = format!("{}/", dir.display());
        for target in mounts.lines().filter_map(|l| l.split(' ').nth(1)) {
            if target.starts_with(&prefix) {
                let _ = std::process::Command::new("umount")
                    .args(["-l", target])
                    .status();
            }
        }
        match std::fs::remove_dir_all(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e)
                if e.kind() == std::io::ErrorKind::DirectoryNotEmpty
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("removing {}: {e}", dir.display()),
        }
    }
}

/// A config with `state_dir` for the first engine that works here, if any.
fn config_with_state_dir(state_dir: &std::path::Path) -> Option<LocalSandboxConfig> {
    let (isolation, _) = engines().first()?;
    Some(LocalSandboxConfig {
        preference: match isolation {
            Isolation::Gvisor => Preference::Gvisor,
            Isolation::Bubblewrap => Preference::Bubblewrap,
        },
        runsc: std::env::var_os("SANDBOXRUN_TEST_RUNSC").map(Into::into),
        state_dir: state_dir.to_path_buf(),
        ..LocalSandboxConfig::default()
    })
}

async fn refused_state_dir(state_dir: &std::path::Path, why: &str) {
    let Some(config) = config_with_state_dir(state_dir) else {
        return;
    };
    let err = LocalSandbox::detect(config)
        .await
        .map(|s| s.isolation())
        .expect_err("an unsafe state directory was accepted");
    assert!(
        matches!(err, LocalSandboxError::UnsafeStateDir { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&state_dir.display().to_string()) && text.contains(why),
        "{text}"
    );
}

#[tokio::test]
async fn state_dir_owned_by_another_user_is_refused() {
    let _serial = serial().await;
    use std::os::unix::fs::MetadataExt;
    let base = scratch("other-owner");
    if std::fs::metadata(&base).unwrap().uid() != 0 {
        eprintln!("skipped: needs root to chown a directory to nobody");
        std::fs::remove_dir_all(base).unwrap();
        return;
    }
    let dir = base.join("state");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    refused_state_dir(&dir, "owned by uid 65534").await;
    assert_eq!(
        std::fs::metadata(&dir).unwrap().uid(),
        65534,
        "chowned back"
    );
    remove_scratch(&base).await;
}

#[tokio::test]
async fn state_dir_symlink_is_refused() {
    let _serial = serial().await;
    let base = scratch("symlink");
    let target = base.join("elsewhere");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let link = base.join("state");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    refused_state_dir(&link, "symbolic link").await;
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "followed");
    remove_scratch(&base).await;
}

#[tokio::test]
async fn state_dir_open_to_others_is_refused() {
    let _serial = serial().await;
    use std::os::unix::fs::PermissionsExt;
    let base = scratch("mode");
    let dir = base.join("state");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o777)).unwrap();
    refused_state_dir(&dir, "0777").await;
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o777, "the driver changed someone's directory");
    remove_scratch(&base).await;
}

#[tokio::test]
async fn runsc_root_planted_as_a_symlink_is_refused() {
    let _serial = serial().await;
    if !engines().iter().any(|(i, _)| *i == Isolation::Gvisor) {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let base = scratch("runsc-root");
    let dir = base.join("state");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o700)).unwrap();
    let elsewhere = base.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dir.join("runsc")).unwrap();
    let config = LocalSandboxConfig {
        preference: Preference::Gvisor,
        runsc: std::env::var_os("SANDBOXRUN_TEST_RUNSC").map(Into::into),
        state_dir: dir.clone(),
        ..LocalSandboxConfig::default()
    };
    let err = LocalSandbox::detect(config)
        .await
        .map(|s| s.isolation())
        .expect_err("a planted runsc root was accepted");
    assert!(
        matches!(err, LocalSandboxError::UnsafeStateDir { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "followed"
    );
    remove_scratch(&base).await;
}

#[tokio::test]
async fn fresh_state_dir_is_created_private() {
    let _serial = serial().await;
    use std::os::unix::fs::PermissionsExt;
    let base = scratch("fresh");
    let dir = base.join("a").join("state");
    let Some(config) = config_with_state_dir(&dir) else {
        return;
    };
    let sandbox = LocalSandbox::detect(config).await.unwrap();
    let r = run(&sandbox, "print(2)", &limits()).await;
    assert_eq!(r.result.stdout, "2\n", "{r:?}");
    for created in [base.join("a"), dir.clone()] {
        let mode = std::fs::metadata(&created).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{}", created.display());
    }
    for sub in ["runsc", "bundles"] {
        if let Ok(meta) = std::fs::symlink_metadata(dir.join(sub)) {
            assert!(meta.is_dir());
            assert_eq!(meta.permissions().mode() & 0o077, 0, "{sub}");
        }
    }
    remove_scratch(&base).await;
}

#[tokio::test]
async fn without_cgroups_detect_refuses_unless_weak_limits_are_allowed() {
    let _serial = serial().await;
    for (isolation, _) in engines() {
        let config = LocalSandboxConfig {
            preference: match isolation {
                Isolation::Gvisor => Preference::Gvisor,
                Isolation::Bubblewrap => Preference::Bubblewrap,
            },
            runsc: std::env::var_os("SANDBOXRUN_TEST_RUNSC").map(Into::into),
            ..LocalSandboxConfig::default()
        };
        assert!(!config.allow_weak_limits, "weak limits are opt-in");
        let err = LocalSandbox::detect_without_cgroups(config.clone())
            .await
            .map(|s| s.isolation())
            .expect_err("unenforceable limits passed silently");
        assert!(
            matches!(err, LocalSandboxError::WeakLimits { .. }),
            "{isolation}: {err:?}"
        );
        let text = err.to_string();
        for needle in [
            "memory, process and CPU",
            "root",
            "cgroup v2",
            "allow_weak_limits",
        ] {
            assert!(
                text.contains(needle),
                "{isolation}: no {needle:?} in: {text}"
            );
        }

        // Opted in: it runs, says what is not enforced, and what rlimits can do still holds.
        let sandbox = LocalSandbox::detect_without_cgroups(LocalSandboxConfig {
            allow_weak_limits: true,
            ..config
        })
        .await
        .unwrap_or_else(|e| panic!("{isolation}: {e}"));
        assert!(!sandbox.uses_cgroups());
        let warning = sandbox.weak_limits().expect("a warning");
        assert!(
            warning.contains("CPU is not limited") && warning.contains("per process"),
            "{isolation}: {warning}"
        );
        let r = run(&sandbox, "print(1)", &limits()).await;
        assert_eq!(r.result.stdout, "1\n", "{isolation}: {r:?}");
        let bomb = Limits {
            memory: "256Mi".into(),
            ..limits()
        };
        let r = run(&sandbox, "x = bytearray(1 << 30)\nprint(len(x))", &bomb).await;
        assert_eq!(r.outcome, Phase::Failed, "{isolation}: {r:?}");
        assert_eq!(r.result.stdout, "", "{isolation}: {r:?}");
        let left = wait_no_leftovers("\u{0}never\u{0}", 5).await;
        assert!(left.is_empty(), "{isolation}: left behind: {left:#?}");
    }
    // With cgroups (root here), detect needs no opt-in and reports no weakness.
    for (isolation, sandbox) in engines() {
        if sandbox.uses_cgroups() {
            assert_eq!(sandbox.weak_limits(), None, "{isolation}");
        }
    }
}

#[tokio::test]
async fn memory_in_files_counts_against_the_limit() {
    let _serial = serial().await;
    let limits = Limits {
        memory: "128Mi".into(),
        ..limits()
    };
    // Memory that no process maps: memory files (memfd_create) filled with small writes, 3
    // times the limit in total. The cgroup charges their pages to the sandbox.
    let code = r#"
import os
chunk = b'x' * (1 << 20)
held = []
def fill(fd, mib):
    for _ in range(mib):
        os.write(fd, chunk)
for i in range(12):
    fd = os.memfd_create(f'm{i}')
    fill(fd, 32)
    held.append(fd)
print('memfds held', 12 * 32, flush=True)
"#;
    for (isolation, sandbox) in engines() {
        if !sandbox.uses_cgroups() {
            // Documented: without a cgroup, memory outside processes is not limited.
            continue;
        }
        let r = run(sandbox, code, &limits).await;
        eprintln!("{isolation}: {:?} {:?} {:?}", r.outcome, r.reason, r.result);
        assert_eq!(r.outcome, Phase::Failed, "{isolation}: {r:?}");
        assert!(
            !r.result.stdout.contains("held"),
            "{isolation}: 384 MiB held in memory files under a 128Mi limit: {r:?}"
        );
        let left = wait_no_leftovers("\u{0}never\u{0}", 5).await;
        assert!(left.is_empty(), "{isolation}: left behind: {left:#?}");
    }
}

#[tokio::test]
async fn state_dir_under_a_world_writable_parent_is_refused() {
    let _serial = serial().await;
    use std::os::unix::fs::PermissionsExt;
    let base = scratch("open-parent");
    let parent = base.join("shared");
    std::fs::create_dir(&parent).unwrap();
    std::fs::set_permissions(&parent, PermissionsExt::from_mode(0o777)).unwrap();
    // Others could rename the state directory away and put theirs in its place.
    let dir = parent.join("state");
    refused_state_dir(&dir, "without the sticky bit").await;
    assert!(!dir.exists(), "created under an unsafe parent");
    remove_scratch(&base).await;
}

#[tokio::test]
async fn state_dir_replaced_after_detect_is_refused_at_the_next_run() {
    let _serial = serial().await;
    if !engines().iter().any(|(i, _)| *i == Isolation::Gvisor) {
        return;
    }
    let base = scratch("replaced");
    let dir = base.join("state");
    let config = LocalSandboxConfig {
        preference: Preference::Gvisor,
        runsc: std::env::var_os("SANDBOXRUN_TEST_RUNSC").map(Into::into),
        state_dir: dir.clone(),
        ..LocalSandboxConfig::default()
    };
    let sandbox = LocalSandbox::detect(config).await.unwrap();
    // The bundles directory becomes a symlink to somewhere else after set-up.
    let elsewhere = base.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::remove_dir(dir.join("bundles")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dir.join("bundles")).unwrap();
    let err = sandbox
        .run_python("print(1)", &limits())
        .await
        .map(|_| ())
        .expect_err("a run used a replaced bundles directory");
    assert!(
        matches!(err, LocalSandboxError::UnsafeStateDir { .. }),
        "{err:?}"
    );
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "followed"
    );
    remove_scratch(&base).await;
}

/// A forgery attempt (see the fixture) that ends by sending the runner `signal`.
fn forgery(signal: &str) -> String {
    include_str!("fixtures/forge_result.py").replace("THE_SIGNAL", signal)
}

#[tokio::test]
async fn the_code_cannot_forge_or_hide_its_result() {
    let _serial = serial().await;
    let limits = Limits {
        timeout_seconds: 3,
        ..limits()
    };
    for sig in [
        "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGSEGV", "SIGABRT", "SIGALRM",
        "SIGKILL", "SIGSTOP",
    ] {
        on_each_engine(&forgery(sig), &limits, |engine, r| {
            // Never the forged result, whatever happened.
            assert!(
                !r.result.stdout.contains("FORGED") && r.result.exit_code != 0,
                "{engine} {sig}: forged: {r:?}"
            );
            // The runner ignores every signal it can. SIGKILL and SIGSTOP it cannot: as the
            // sandbox's init under bubblewrap the kernel drops them; gVisor's Sentry delivers them
            // to its init, so there the run ends without a result (NoResult, or TimedOut for a
            // stopped runner) - an honest failure, never the code's choice of result.
            let unblockable = matches!(sig, "SIGKILL" | "SIGSTOP");
            if unblockable && engine == Isolation::Gvisor && r.result.stdout.is_empty() {
                assert!(
                    matches!(r.reason.as_deref(), Some("NoResult" | "DeadlineExceeded")),
                    "{engine} {sig}: {r:?}"
                );
                return;
            }
            // Otherwise the runner's own result: the code exited 3 and printed what each door
            // did, and every door was shut (the channel is out of reach, not only outlasted).
            assert_eq!(r.outcome, Phase::Failed, "{engine} {sig}: {r:?}");
            assert_eq!(r.result.exit_code, 3, "{engine} {sig}: {r:?}");
            assert!(
                r.result.stdout.contains("shut /proc/") && !r.result.stdout.contains("OPEN"),
                "{engine} {sig}: a door was open: {}",
                r.result.stdout
            );
        })
        .await;
    }
}

/// A driver of its own on `isolation` (not the shared one of [`engines`]): for tests that arm
/// sandboxes, which dropping it destroys.
async fn own_sandbox(isolation: Isolation) -> LocalSandbox {
    let preference = match isolation {
        Isolation::Gvisor => Preference::Gvisor,
        Isolation::Bubblewrap => Preference::Bubblewrap,
    };
    LocalSandbox::detect(LocalSandboxConfig {
        preference,
        runsc: std::env::var_os("SANDBOXRUN_TEST_RUNSC").map(Into::into),
        ..LocalSandboxConfig::default()
    })
    .await
    .unwrap()
}

/// Waits until `sandbox` has `n` armed sandboxes of the minimal profile waiting.
async fn wait_armed(sandbox: &LocalSandbox, n: usize) {
    wait_armed_of(sandbox, Profile::Minimal, n).await;
}

/// Waits until `sandbox` has `n` armed sandboxes of `profile` waiting.
async fn wait_armed_of(sandbox: &LocalSandbox, profile: Profile, n: usize) {
    let until = Instant::now() + Duration::from_secs(60);
    while sandbox.armed(profile) != n {
        assert!(
            Instant::now() < until,
            "{}: {} armed of {profile}, not {n}",
            sandbox.isolation(),
            sandbox.armed(profile)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn armed_sandboxes_serve_one_call_each_with_its_own_limits_and_leave_nothing_behind() {
    let _serial = serial().await;
    let isolations: Vec<Isolation> = engines().iter().map(|(i, _)| *i).collect();
    for isolation in isolations {
        let sandbox = own_sandbox(isolation).await;
        sandbox.arm(Profile::Minimal, 2);
        wait_armed(&sandbox, 2).await;
        // One program each: what the first leaves in /tmp, the second does not see.
        let first = run(
            &sandbox,
            "open('/tmp/left-by-the-first', 'w').write('x'); import os; print(os.getpid())",
            &limits(),
        )
        .await;
        assert_eq!(first.outcome, Phase::Succeeded, "{isolation}: {first:?}");
        let second = run(
            &sandbox,
            "import os; print(os.path.exists('/tmp/left-by-the-first'))",
            &limits(),
        )
        .await;
        assert_eq!(second.result.stdout, "False\n", "{isolation}: {second:?}");
        // The call's own timeout, applied when it took the sandbox (armed with the longest).
        wait_armed(&sandbox, 2).await;
        let short = Limits {
            timeout_seconds: 1,
            ..Limits::default()
        };
        let slept = run(&sandbox, "import time; time.sleep(10)", &short).await;
        assert_eq!(slept.outcome, Phase::TimedOut, "{isolation}: {slept:?}");
        // 200 KiB of code.
        wait_armed(&sandbox, 2).await;
        let filler = format!("# {}\n", "x".repeat(1000)).repeat(210);
        let big = run(&sandbox, &format!("{filler}print('big')"), &limits()).await;
        assert_eq!(big.result.stdout, "big\n", "{isolation}: {big:?}");
        // Other cgroup limits never take an armed sandbox.
        wait_armed(&sandbox, 2).await;
        let other = Limits {
            cpu: "250m".into(),
            ..limits()
        };
        let cold = run(&sandbox, "print(2)", &other).await;
        assert_eq!(cold.result.stdout, "2\n", "{isolation}: {cold:?}");
        assert_eq!(
            sandbox.armed(Profile::Minimal),
            2,
            "{isolation}: an armed sandbox ran other limits"
        );
        // Side by side: a call that takes an armed sandbox, and one that starts its own.
        let t = Instant::now();
        run(&sandbox, "print(1)", &limits()).await;
        let armed_ms = t.elapsed().as_millis();
        let t = Instant::now();
        run(&sandbox, "print(1)", &other).await;
        eprintln!(
            "{isolation}: armed {armed_ms} ms, cold {} ms",
            t.elapsed().as_millis()
        );
        // Dropping the driver destroys what waits.
        drop(sandbox);
        let left = wait_no_leftovers("\u{0}never\u{0}", 10).await;
        assert!(left.is_empty(), "{isolation}: left behind: {left:#?}");
    }
}

#[tokio::test]
async fn what_a_killed_driver_left_behind_is_removed_at_the_next_detect() {
    let _serial = serial().await;
    if engines().is_empty() {
        return;
    }
    // A driver that died with SIGKILL leaves its sandboxes' cgroups and bundles, named after its
    // pid. A pid that is surely gone: a child that has exited and been reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let name = format!("sbr-{dead}-1-000000001");
    let config = LocalSandboxConfig::default();
    let mut planted = Vec::new();
    for controller in ["memory", "pids", "cpu"] {
        let parent = std::path::Path::new("/sys/fs/cgroup")
            .join(controller)
            .join("sandboxrun");
        if parent.is_dir() && std::fs::create_dir(parent.join(&name)).is_ok() {
            planted.push(parent.join(&name));
        }
    }
    let bundle = config.state_dir.join("bundles").join(&name);
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(bundle.join("config.json"), "{}").unwrap();
    // Ours, alive: never touched.
    let ours = config
        .state_dir
        .join("bundles")
        .join(format!("sbr-{}-1-000000001", std::process::id()));
    std::fs::create_dir_all(&ours).unwrap();
    let (isolation, _) = &engines()[0];
    own_sandbox(*isolation).await;
    for dir in &planted {
        assert!(!dir.exists(), "{} is still there", dir.display());
    }
    assert!(!bundle.exists(), "{} is still there", bundle.display());
    assert!(ours.exists(), "a live driver's bundle was removed");
    std::fs::remove_dir_all(&ours).unwrap();
}

// Files in and out, and the data profile, in real sandboxes.

fn envelope_file(r: &sandboxrun_core::RunnerResult, name: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    r.files.iter().find(|f| f.name == name).map(|f| {
        base64::engine::general_purpose::STANDARD
            .decode(&f.data)
            .unwrap()
    })
}

#[tokio::test]
async fn input_files_are_read_only_and_hostile_outputs_stay_inside() {
    let _serial = serial().await;
    let inputs = [sandboxrun_core::InputFile {
        name: "in.txt".into(),
        content: b"given".to_vec(),
    }];
    let code = "import os\n\
        print(open('/tmp/inputs/in.txt').read())\n\
        try:\n    open('/tmp/inputs/in.txt', 'a').write('x'); print('writable')\n\
        except OSError as e: print('read-only', e.errno)\n\
        try:\n    open('/tmp/inputs/new.txt', 'w'); print('dir writable')\n\
        except OSError as e: print('dir read-only', e.errno)\n\
        os.symlink('/etc/passwd', '/tmp/outputs/passwd')\n\
        os.symlink('/proc/self/environ', '/tmp/outputs/environ')\n\
        os.symlink('/tmp/inputs/in.txt', '/tmp/outputs/input-link')\n\
        os.mkfifo('/tmp/outputs/fifo')\n\
        os.mkdir('/tmp/outputs/dir')\n\
        open('/tmp/outputs/result.csv', 'w').write('a,b\\n1,2\\n')\n";
    for (isolation, sandbox) in engines() {
        let program = Program {
            code,
            inputs: &inputs,
            outputs: sandboxrun_core::FileCaps::default(),
        };
        let run = sandbox
            .run(&program, Profile::Minimal, &limits(), None)
            .await
            .unwrap();
        let env = run.envelope.expect("an envelope");
        assert_eq!(
            env.stdout, "given\nread-only 13\ndir read-only 13\n",
            "{isolation}: {}",
            env.stderr
        );
        let names: Vec<&str> = env.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["result.csv"], "{isolation}");
        assert_eq!(
            envelope_file(&env, "result.csv").unwrap(),
            b"a,b\n1,2\n",
            "{isolation}"
        );
        assert_eq!(
            env.files_omitted.len(),
            5,
            "{isolation}: {:?}",
            env.files_omitted
        );
        let all = serde_json::to_string(&env).unwrap();
        assert!(
            !all.contains("root:x:0:0"),
            "{isolation}: /etc/passwd leaked"
        );
        assert!(!all.contains("PATH="), "{isolation}: an environment leaked");
    }
}

/// The data profile's root file system, when this machine has one; CI requires it
/// (`SANDBOXRUN_REQUIRE_DATA_PROFILE=1`).
fn data_profile_available(sandbox: &LocalSandbox) -> bool {
    match sandbox.profile_available(Profile::Data) {
        Ok(()) => true,
        Err(why) if std::env::var("SANDBOXRUN_REQUIRE_DATA_PROFILE").as_deref() == Ok("1") => {
            panic!("SANDBOXRUN_REQUIRE_DATA_PROFILE=1 but: {why}")
        }
        Err(why) => {
            eprintln!("skipped: the data profile is not available: {why}");
            false
        }
    }
}

#[tokio::test]
async fn the_data_profile_reads_a_csv_with_pandas_and_returns_a_matplotlib_chart() {
    let _serial = serial().await;
    let inputs = [sandboxrun_core::InputFile {
        name: "sales.csv".into(),
        content: b"month,amount\n1,10\n2,15\n3,12\n4,20\n".to_vec(),
    }];
    let code = "import pandas as pd, numpy as np, matplotlib.pyplot as plt\n\
        df = pd.read_csv('/tmp/inputs/sales.csv')\n\
        print(int(df.amount.sum()), float(np.mean(df.amount)))\n\
        fig = plt.figure(figsize=(6.4, 4.8), dpi=100)\n\
        plt.plot(df.month, df.amount); plt.title('Sales')\n\
        fig.savefig('/tmp/outputs/chart.png')\n";
    let limits = Limits {
        timeout_seconds: 60,
        memory: "512Mi".into(),
        ..limits()
    };
    for (isolation, sandbox) in engines() {
        if !data_profile_available(sandbox) {
            return;
        }
        let program = Program {
            code,
            inputs: &inputs,
            outputs: sandboxrun_core::FileCaps::default(),
        };
        let run = sandbox
            .run(&program, Profile::Data, &limits, None)
            .await
            .unwrap();
        let env = run.envelope.expect("an envelope");
        assert_eq!(env.exit_code, 0, "{isolation}: {}", env.stderr);
        assert_eq!(env.stdout, "57 14.25\n", "{isolation}");
        let png = envelope_file(&env, "chart.png").expect("chart.png");
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{isolation}");
        // IHDR: width and height, big-endian, at bytes 16..24.
        let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
        let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
        assert_eq!((width, height), (640, 480), "{isolation}");
        // The minimal profile has none of it.
        let run = sandbox
            .run(
                &Program::code("import pandas"),
                Profile::Minimal,
                &limits,
                None,
            )
            .await
            .unwrap();
        assert!(
            run.envelope
                .unwrap()
                .stderr
                .contains("No module named 'pandas'"),
            "{isolation}"
        );
    }
}

#[tokio::test]
async fn a_data_sandbox_has_its_stack_loaded_before_the_code_starts_armed_or_not() {
    let _serial = serial().await;
    // What the code finds at its first line, then BLAS (one thread, inherited across the fork)
    // and the backend at work, and the code's process still single-threaded.
    let code = "import sys\n\
        print(sorted(m for m in ('numpy', 'pandas', 'matplotlib.pyplot', 'scipy') if m in sys.modules))\n\
        import os, matplotlib, numpy as np\n\
        a = np.arange(250000, dtype=float).reshape(500, 500)\n\
        print(matplotlib.get_backend().lower(), bool(np.isclose(np.trace(a @ a.T), (a * a).sum())))\n\
        print(len(os.listdir('/proc/self/task')))\n";
    let expected = "['matplotlib.pyplot', 'numpy', 'pandas', 'scipy']\nagg True\n1\n";
    let isolations: Vec<Isolation> = engines().iter().map(|(i, _)| *i).collect();
    for isolation in isolations {
        let sandbox = own_sandbox(isolation).await;
        if !data_profile_available(&sandbox) {
            return;
        }
        // Started for its call (other limits than the armed ones).
        let cold = Limits {
            memory: "300Mi".into(),
            ..limits()
        };
        let run = sandbox
            .run(&Program::code(code), Profile::Data, &cold, None)
            .await
            .unwrap();
        let env = run.envelope.expect("an envelope");
        assert_eq!(env.stdout, expected, "{isolation}: {}", env.stderr);
        // Armed: the imports were paid while it waited. The target back to 0 (the one waiting
        // stays), so that the call's taking it shows: none waits after it.
        sandbox.arm(Profile::Data, 1);
        wait_armed_of(&sandbox, Profile::Data, 1).await;
        sandbox.arm(Profile::Data, 0);
        let run = sandbox
            .run(&Program::code(code), Profile::Data, &limits(), None)
            .await
            .unwrap();
        let env = run.envelope.expect("an envelope");
        assert_eq!(env.stdout, expected, "{isolation}: {}", env.stderr);
        assert_eq!(
            sandbox.armed(Profile::Data),
            0,
            "{isolation}: the call did not take the armed sandbox"
        );
        drop(sandbox);
        let left = wait_no_leftovers("\u{0}never\u{0}", 10).await;
        assert!(left.is_empty(), "{isolation}: left behind: {left:#?}");
    }
}

#[tokio::test]
async fn an_outputs_directory_replaced_by_a_link_returns_nothing_on_either_engine() {
    // gVisor follows a final symlink when O_DIRECTORY and O_NOFOLLOW are given together (Linux
    // refuses it): the runner must not rely on that pair.
    let _serial = serial().await;
    for target in ["/etc", "/proc/self", "/tmp/inputs"] {
        let code = format!(
            "import os\nos.rmdir('/tmp/outputs')\nos.symlink({target:?}, '/tmp/outputs')\nprint('swapped')"
        );
        for (isolation, sandbox) in engines() {
            let run = sandbox.run_python(&code, &limits()).await.unwrap();
            let env = run.envelope.expect("an envelope");
            assert_eq!(env.stdout, "swapped\n", "{isolation}: {}", env.stderr);
            assert!(
                env.files.is_empty() && env.files_omitted.is_empty(),
                "{isolation}, {target}: {:?} {:?}",
                env.files.iter().map(|f| &f.name).collect::<Vec<_>>(),
                env.files_omitted
            );
        }
    }
}

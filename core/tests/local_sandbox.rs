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
        let left = wait_no_leftovers("\u{0}never\u{0}", 5);
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
        let left = wait_no_leftovers("\u{0}never\u{0}", 5);
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

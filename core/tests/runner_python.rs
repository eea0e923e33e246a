//! Runs the real runner script with the host's `python3`, as the sandbox container does, and
//! checks what it reports. Pid limits are not tested here: RLIMIT_NPROC does not bind root, and
//! these tests may run as root; the end-to-end suite covers fork bombs in a real sandbox.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sandboxrun_core::{
    Limits, NO_PROGRAM_EXIT, RunnerResult, parse_envelope, program_frame, runner_argv,
};

fn run(code: &str, output_bytes: u32) -> (RunnerResult, Output) {
    run_with(
        code,
        Limits {
            output_bytes,
            ..Limits::default()
        },
    )
}

/// The runner as the sandbox starts it, given `stdin`; its output once it exits.
fn runner(limits: &Limits, stdin: &[u8]) -> Output {
    use std::io::Write;
    let argv = runner_argv(limits);
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        // Must not reach the child: the runner hands it a fixed, minimal environment.
        .env("SANDBOXRUN_TEST_SECRET", "leaked")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 on PATH");
    let mut pipe = child.stdin.take().unwrap();
    // The runner may stop reading early (a bad header): a broken pipe is its answer, not ours.
    let _ = pipe.write_all(stdin);
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn run_with(code: &str, limits: Limits) -> (RunnerResult, Output) {
    let out = runner(&limits, &program_frame(code, &limits));
    let log = String::from_utf8(out.stdout.clone()).expect("runner output is UTF-8");
    let result = parse_envelope(&log).unwrap_or_else(|e| {
        panic!(
            "{e}; stdout={log:?} stderr={:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (result, out)
}

#[test]
fn success_reports_stdout_and_exit_zero() {
    let (r, out) = run("print('hello from sandboxrun')", 65_536);
    assert_eq!(r.exit_code, 0);
    assert_eq!(r.stdout, "hello from sandboxrun\n");
    assert_eq!(r.stderr, "");
    assert_eq!(r.signal, None);
    assert!(!r.truncated());
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn streams_and_exit_code_are_separate() {
    let (r, out) = run(
        "import sys\nprint('to out')\nprint('to err', file=sys.stderr)\nsys.exit(3)",
        65_536,
    );
    assert_eq!(r.exit_code, 3);
    assert_eq!(r.stdout, "to out\n");
    assert_eq!(r.stderr, "to err\n");
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn exceptions_exit_one_with_traceback_on_stderr() {
    let (r, _) = run("raise ValueError('boom')", 65_536);
    assert_eq!(r.exit_code, 1);
    assert!(r.stderr.contains("ValueError: boom"), "{}", r.stderr);
}

#[test]
fn the_code_runs_as_main_as_python_dash_c_would() {
    // The child is a fork of the runner: it must look like a fresh `python3 -I -c CODE`.
    let (r, _) = run(
        "print(__name__, sorted(k for k in globals() if not k.startswith('__')))\nimport sys\nprint(sys.argv)",
        65_536,
    );
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, "__main__ []\n['-c']\n");

    let (r, _) = run("def f():\n    1/0\nf()", 65_536);
    assert_eq!(r.exit_code, 1);
    assert!(
        r.stderr.starts_with(
            "Traceback (most recent call last):\n  File \"<string>\", line 3, in <module>\n"
        ),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("become_user_program"),
        "runner frames leak: {}",
        r.stderr
    );

    let (r, _) = run("x = (", 65_536);
    assert_eq!(r.exit_code, 1);
    assert!(r.stderr.contains("SyntaxError"), "{}", r.stderr);
}

#[test]
fn exit_is_the_interpreters_threads_atexit_and_sys_exit_message() {
    let (r, _) = run(
        "import atexit, threading, time\natexit.register(print, 'atexit ran')\nthreading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()",
        65_536,
    );
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, "thread done\natexit ran\n");

    let (r, _) = run("import sys\nsys.exit('bad input')", 65_536);
    assert_eq!(r.exit_code, 1);
    assert_eq!(r.stderr, "bad input\n");
}

#[test]
fn output_is_capped_and_flagged_while_the_rest_is_drained() {
    // 10 MB is far more than a pipe buffer: the child would hang if the runner stopped reading.
    let (r, _) = run(
        "import sys\nsys.stdout.write('x' * 10_000_000)\nsys.stderr.write('e' * 50)",
        100,
    );
    assert_eq!(r.exit_code, 0);
    assert_eq!(r.stdout, "x".repeat(100));
    assert!(r.stdout_truncated);
    assert_eq!(r.stderr, "e".repeat(50));
    assert!(!r.stderr_truncated);
}

#[test]
fn output_exactly_at_the_cap_is_not_truncated() {
    let (r, _) = run("import sys; sys.stdout.write('y' * 64)", 64);
    assert_eq!(r.stdout.len(), 64);
    assert!(!r.stdout_truncated);
}

#[test]
fn capping_never_splits_a_character() {
    // "é" is two bytes: a cap of 5 keeps two of them, not two and a half.
    let (r, _) = run("print('é' * 10)", 5);
    assert_eq!(r.stdout, "éé");
    assert!(r.stdout_truncated);
    let (r, _) = run("import sys; sys.stdout.write('😀😀')", 7);
    assert_eq!(r.stdout, "😀");
}

#[test]
fn invalid_utf8_is_replaced() {
    let (r, _) = run("import sys; sys.stdout.buffer.write(b'ok\\xff')", 100);
    assert_eq!(r.stdout, "ok\u{fffd}");
}

#[test]
fn death_by_signal_is_reported() {
    let (r, out) = run(
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        100,
    );
    assert_eq!(r.signal, Some(9));
    assert_eq!(r.exit_code, 137);
    assert_eq!(out.status.code(), Some(137));
}

#[test]
fn child_gets_a_minimal_environment_cwd_and_no_stdin() {
    let (r, _) = run(
        "import os\nprint(sorted(os.environ.items()))\nprint(os.getcwd())\ntry:\n    input()\nexcept EOFError:\n    print('no stdin')",
        65_536,
    );
    assert_eq!(
        r.stdout,
        "[('HOME', '/tmp'), ('LANG', 'C.UTF-8'), ('PATH', '/usr/local/bin:/usr/bin:/bin')]\n/tmp\nno stdin\n"
    );
}

#[test]
fn leftover_processes_neither_hang_the_runner_nor_forge_the_result() {
    // The child leaves a grandchild that holds stdout open and keeps writing forged envelopes.
    let code = r#"
import os, sys, time
if os.fork() == 0:
    while True:
        sys.stdout.write('{"sandboxrun":1,"exitCode":99,"stdout":"forged","stderr":"","stdoutTruncated":false,"stderrTruncated":false,"signal":null}\n')
        sys.stdout.flush()
        time.sleep(0.01)
time.sleep(0.2)
print('real')
"#;
    let started = Instant::now();
    let (r, _) = run(code, 1_000_000);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(r.exit_code, 0);
    // The forged lines are part of the child's stdout (which is what it printed); the result
    // itself is the runner's.
    assert!(r.stdout.contains("real\n"), "{:?}", r.stdout);
}

#[test]
fn forged_envelope_written_to_the_runners_stdout_loses() {
    // Same uid: the child can write to the runner's own stdout through /proc. The runner's
    // envelope comes last, on a line of its own, so the parser still finds the real one.
    let code = r#"
import os
fd = os.open('/proc/%d/fd/1' % os.getppid(), os.O_WRONLY)
os.write(fd, b'{"sandboxrun":1,"exitCode":0,"stdout":"forged","stderr":"","stdoutTruncated":false,"stderrTruncated":false,"signal":null}\n{"partial')
raise SystemExit(5)
"#;
    let (r, out) = run(code, 100);
    assert_eq!(r.exit_code, 5);
    assert_eq!(r.stdout, "");
    assert_eq!(out.status.code(), Some(5));
}

#[test]
fn the_timeout_kills_the_code_and_keeps_its_output() {
    let started = Instant::now();
    let (r, out) = run_with(
        "print('before', flush=True)\nwhile True: pass",
        Limits {
            timeout_seconds: 1,
            ..Limits::default()
        },
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(r.timed_out);
    assert_eq!(r.signal, Some(9));
    assert_eq!(r.exit_code, 137);
    assert_eq!(r.oom_kill, None);
    assert_eq!(r.stdout, "before\n");
    assert_eq!(out.status.code(), Some(137));
    let ms = r.duration_millis.unwrap();
    assert!((1000..5000).contains(&ms), "{ms}");
}

#[test]
fn code_larger_than_an_argv_string_runs() {
    // One argv string holds at most 128 KiB (MAX_ARG_STRLEN); the program comes on stdin.
    let filler = format!("# {}\n", "x".repeat(1000)).repeat(210);
    let code = format!("{filler}print(len(open('/proc/self/cmdline','rb').read()) < 65536)");
    assert!(code.len() > 200 * 1024);
    let (r, _) = run(&code, 65_536);
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, "True\n"), "{r:?}");
}

#[test]
fn a_program_cut_short_or_missing_is_refused_not_run() {
    let limits = Limits::default();
    let frame = program_frame("import sys\nprint('ran')\nsys.exit(0)", &limits);
    // Every prefix of the frame: missing, a bare or partial header, a truncated program.
    for cut in [0, 1, 2, 3, 10, frame.len() - 1] {
        let out = runner(&limits, &frame[..cut]);
        assert_eq!(
            out.status.code(),
            Some(NO_PROGRAM_EXIT),
            "cut at {cut}: {out:?}"
        );
        assert!(out.stdout.is_empty(), "cut at {cut}: {out:?}");
        assert!(
            !String::from_utf8_lossy(&out.stderr).is_empty(),
            "cut at {cut}"
        );
    }
    // Not a header at all, a negative or an absurd size.
    for bad in [
        &b"print(1)\n"[..],
        b"-5\nprint(1)",
        b"99999999999\n",
        b"12345678901234567890123\n",
        // Per-run limits that are not numbers, not positive, or half there.
        b"8 x 100\nprint(1)",
        b"8 0 100\nprint(1)",
        b"8 5 -1\nprint(1)",
        b"8 5\nprint(1)",
    ] {
        let out = runner(&limits, bad);
        assert_eq!(out.status.code(), Some(NO_PROGRAM_EXIT), "{bad:?}: {out:?}");
    }
    // Bytes after the announced program are not part of it, and the code cannot read them.
    let mut extra = program_frame("import sys\nprint(repr(sys.stdin.read()))", &limits);
    extra.extend_from_slice(b"\nprint('smuggled')");
    let out = runner(&limits, &extra);
    let r = parse_envelope(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(r.stdout, "''\n", "{r:?}");
}

#[test]
fn the_frame_tightens_the_sandboxs_limits_and_never_loosens_them() {
    // A warm sandbox: its argv has its pool's ceilings (60 s, 1000 bytes).
    let ceilings = Limits {
        timeout_seconds: 60,
        output_bytes: 1000,
        ..Limits::default()
    };
    let code = "import time\nprint('x' * 5000, flush=True)\ntime.sleep(30)";
    let tighter = Limits {
        timeout_seconds: 1,
        output_bytes: 10,
        ..Limits::default()
    };
    let out = runner(&ceilings, &program_frame(code, &tighter));
    let r = parse_envelope(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.stdout.len(), 10, "{r:?}");
    // Asking for more than the ceilings gets the ceilings.
    let looser = Limits {
        timeout_seconds: 3600,
        output_bytes: 1_000_000,
        ..Limits::default()
    };
    let fast = Limits {
        timeout_seconds: 1,
        ..ceilings.clone()
    };
    let out = runner(&fast, &program_frame(code, &looser));
    let r = parse_envelope(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.stdout.len(), 1000, "{r:?}");
}

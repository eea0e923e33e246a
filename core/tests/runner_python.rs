//! Runs the real runner script with the host's `python3`, as the sandbox container does, and
//! checks what it reports. Pid limits are not tested here: RLIMIT_NPROC does not bind root, and
//! these tests may run as root; the end-to-end suite covers fork bombs in a real sandbox.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sandboxrun_core::files::OmitReason;
use sandboxrun_core::runner::ISOLATION_NOT_IN_FORCE_EXIT;
use sandboxrun_core::{
    CANARY_ENV, FileCaps, IDLE_MARK, InputFile, Limits, NO_PROGRAM_EXIT, NotRunReason, Profile,
    Program, RunnerResult, parse_envelope, program_frame, runner_argv,
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

/// The runner as the sandbox starts it, given `stdin`; its output once it exits. It runs on
/// this host, whose network no NetworkPolicy guards: the canary is `none` (the barrier's own
/// tests below set theirs).
fn runner(limits: &Limits, stdin: &[u8]) -> Output {
    let argv = runner_argv(limits, Profile::Minimal);
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]).env(CANARY_ENV, "none");
    run_command(command, stdin)
}

/// Runs `command` (the runner's argv, perhaps behind a wrapper) with a private /tmp, writes
/// `stdin` and returns its output once it exits.
fn run_command(mut command: Command, stdin: &[u8]) -> Output {
    use std::io::Write;
    // A private directory in place of the sandbox's own /tmp (inputs/ and outputs/ live there).
    let tmp = scratch_dir();
    let mut child = command
        // Must not reach the child: the runner hands it a fixed, minimal environment.
        .env("SANDBOXRUN_TEST_SECRET", "leaked")
        .env("SANDBOXRUN_RUNNER_TMP", &tmp)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 on PATH");
    let mut pipe = child.stdin.take().unwrap();
    // The runner may stop reading early (a bad header): a broken pipe is its answer, not ours.
    let _ = pipe.write_all(stdin);
    drop(pipe);
    let out = child.wait_with_output().unwrap();
    // Read-only inputs: make them removable again.
    let _ = Command::new("chmod")
        .arg("-R")
        .arg("u+w")
        .arg(&tmp)
        .status();
    let _ = std::fs::remove_dir_all(&tmp);
    out
}

/// A new, empty directory under the system's temporary directory.
fn scratch_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sandboxrun-runner-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir(&dir).unwrap();
    dir
}

fn run_with(code: &str, limits: Limits) -> (RunnerResult, Output) {
    run_framed(&Program::code(code), &limits)
}

/// Runs `program` under `limits` and reads its envelope (which must be there).
fn run_framed(program: &Program<'_>, limits: &Limits) -> (RunnerResult, Output) {
    let out = runner(limits, &program_frame(program, limits));
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

/// The runner with PRELOAD `preload` (a profile's argument; the data profile's libraries are not
/// on this host, so standard modules stand in: the data profile's own run is in local_engines.rs),
/// given `code`.
fn run_preloading(preload: &str, code: &str) -> Output {
    let limits = Limits::default();
    let mut argv = runner_argv(&limits, Profile::Minimal);
    argv.push(preload.to_owned());
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]).env(CANARY_ENV, "none");
    run_command(command, &program_frame(&Program::code(code), &limits))
}

#[test]
fn preloaded_modules_are_loaded_when_the_code_starts_and_it_still_starts_as_python_dash_c() {
    let out = run_preloading(
        "json,email.mime.text,this",
        "import sys\nprint(sorted(m for m in ('json', 'email.mime.text', 'this') if m in sys.modules))\n\
         print(__name__, sorted(k for k in globals() if not k.startswith('__')), sys.argv)",
    );
    let log = String::from_utf8_lossy(&out.stdout);
    let r = parse_envelope(&log).unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "['email.mime.text', 'json', 'this']\n__main__ ['sys'] ['-c']\n"
    );
    // `this` prints the Zen of Python when imported: on the runner's stderr, never on its stdout
    // (the result channel), and not in the code's output either.
    assert!(!log.contains("Beautiful is better"), "{log}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Beautiful is better"),
        "{out:?}"
    );
}

#[test]
fn a_module_that_fails_to_preload_is_left_to_the_code() {
    let out = run_preloading("json,no_such_module_here", "import no_such_module_here");
    let r = parse_envelope(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(r.exit_code, 1);
    assert!(r.stderr.contains("ModuleNotFoundError"), "{}", r.stderr);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("preloading no_such_module_here failed"),
        "{out:?}"
    );
}

#[test]
fn a_preload_that_is_not_a_module_name_runs_nothing() {
    for preload in ["os;print(1)", "json,,os", "../x", "json, os"] {
        let out = run_preloading(preload, "print('ran')");
        assert_eq!(out.status.code(), Some(125), "{preload}: {out:?}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("ran"),
            "{out:?}"
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("not a dotted name"),
            "{preload}: {out:?}"
        );
    }
}

/// The runner with PRELOAD `preload` (none when empty), started with nothing on its stdin yet,
/// as a warm sandbox waits; and its private /tmp.
fn idle_runner(preload: &str) -> (std::process::Child, std::path::PathBuf) {
    let mut argv = runner_argv(&Limits::default(), Profile::Minimal);
    if !preload.is_empty() {
        argv.push(preload.to_owned());
    }
    // The interpreter itself, not a launcher in front of it (pyenv's shim is a shell script whose
    // children are not the runner's).
    let python = Command::new(&argv[0])
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on PATH");
    let python = String::from_utf8(python.stdout).unwrap();
    let tmp = scratch_dir();
    let child = Command::new(python.trim_end())
        .args(&argv[1..])
        .env(CANARY_ENV, "none")
        .env("SANDBOXRUN_RUNNER_TMP", &tmp)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 on PATH");
    (child, tmp)
}

/// The processes `pid` has forked (Linux's /proc/PID/task/PID/children).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

/// Waits until the idle runner `pid` has forked its code's process (the cause, not a time: the
/// bound only keeps a broken runner from hanging the test) and returns that process's pid.
fn prepared_child(pid: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let [child] = children_of(pid)[..] {
            return child;
        }
        assert!(
            Instant::now() < deadline,
            "runner {pid} forked no process while it waited for its program"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Code that prints its pid, which modules of `names` it finds loaded, its open descriptors
/// (without the one that lists them) and what its stdin holds.
const REPORTS_ITSELF: &str = r#"import os, sys
print(os.getpid())
print(sorted(m for m in ('json', 'email.mime.text') if m in sys.modules))
fds = []
for fd in range(256):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
print(fds)
print(repr(sys.stdin.read()))
"#;

#[test]
fn the_codes_process_is_forked_before_the_program_arrives_and_gets_nothing_of_the_runners() {
    use std::io::Write;
    for preload in ["", "json,email.mime.text"] {
        let (mut runner, tmp) = idle_runner(preload);
        // A warm sandbox: the fork (and the imports before it) happen while nothing has come.
        let prepared = prepared_child(runner.id());
        let limits = Limits::default();
        let mut stdin = runner.stdin.take().unwrap();
        let mut frame = program_frame(&Program::code(REPORTS_ITSELF), &limits);
        // Bytes after the program are the runner's stdin, never the code's.
        frame.extend_from_slice(b"not for the code");
        stdin.write_all(&frame).unwrap();
        drop(stdin);
        let out = runner.wait_with_output().unwrap();
        let _ = std::fs::remove_dir_all(&tmp);
        let r = parse_envelope(&String::from_utf8_lossy(&out.stdout)).unwrap();
        assert_eq!(r.exit_code, 0, "{preload:?}: {}", r.stderr);
        let loaded = if preload.is_empty() {
            "[]"
        } else {
            "['email.mime.text', 'json']"
        };
        // The process that ran the code is the one forked before the program came; it has its
        // three standard descriptors and nothing else (not the pipe its code came on, not the
        // runner's stdin or log), and an empty stdin.
        assert_eq!(
            r.stdout,
            format!("{prepared}\n{loaded}\n[0, 1, 2]\n''\n"),
            "{preload:?}"
        );
    }
}

#[test]
fn a_preloading_runner_marks_itself_idle_once_its_imports_are_done_and_it_has_forked() {
    use std::io::Write;
    for preload in ["", "json,email.mime.text"] {
        let (mut runner, tmp) = idle_runner(preload);
        let mark = tmp.join(Path::new(IDLE_MARK).file_name().unwrap());
        let prepared = prepared_child(runner.id());
        if preload.is_empty() {
            // Nothing to import: ready as it starts, no probe, no mark (the fork came after
            // anything the runner does before its program).
            assert!(!mark.exists(), "a runner without PRELOAD made the mark");
        } else {
            // What a pool's startup probe waits for (the cause, bounded only against a broken
            // runner). By then the imports are done and the code's process forked: a claim
            // waits for neither.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !mark.exists() {
                assert!(Instant::now() < deadline, "never marked idle");
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(children_of(runner.id()), [prepared]);
        }
        let mut stdin = runner.stdin.take().unwrap();
        stdin
            .write_all(&program_frame(
                &Program::code("print(1)"),
                &Limits::default(),
            ))
            .unwrap();
        drop(stdin);
        let out = runner.wait_with_output().unwrap();
        let r = parse_envelope(&String::from_utf8_lossy(&out.stdout)).unwrap();
        assert_eq!(r.stdout, "1\n", "{preload:?}: {}", r.stderr);
        // Nothing about the mark on the runner's stderr (it could be made).
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("idle"),
            "{preload:?}: {out:?}"
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }
}

#[test]
fn a_runner_that_gets_no_program_leaves_no_process_behind() {
    for preload in ["", "json"] {
        let (mut runner, tmp) = idle_runner(preload);
        let prepared = prepared_child(runner.id());
        // The sender hangs up without a program (a warm sandbox deleted, a sender that died).
        drop(runner.stdin.take());
        let out = runner.wait_with_output().unwrap();
        let _ = std::fs::remove_dir_all(&tmp);
        assert_eq!(out.status.code(), Some(NO_PROGRAM_EXIT), "{out:?}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("sandboxrun\":"),
            "{out:?}"
        );
        // The prepared process was killed and reaped by the runner before it exited.
        assert!(
            !std::path::Path::new(&format!("/proc/{prepared}")).exists(),
            "{preload:?}: the prepared process {prepared} outlived its runner"
        );
    }
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
    // The working directory is the sandbox's /tmp (here the test's stand-in for it).
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "[('HOME', '/tmp'), ('LANG', 'C.UTF-8'), ('PATH', '/usr/local/bin:/usr/bin:/bin')]"
    );
    assert!(lines[1].contains("sandboxrun-runner-test-"), "{}", lines[1]);
    assert_eq!(lines[2..], ["no stdin"]);
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
    assert!(started.elapsed() < Duration::from_secs(60));
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
    assert!(started.elapsed() < Duration::from_secs(60));
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
    // Whether the filler is on the process's command line (built so that this line is not).
    let code = format!("{filler}print(b'x' * 1000 in open('/proc/self/cmdline','rb').read())");
    assert!(code.len() > 200 * 1024);
    let (r, _) = run(&code, 65_536);
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, "False\n"), "{r:?}");
}

#[test]
fn a_program_cut_short_or_missing_is_refused_not_run() {
    let limits = Limits::default();
    let frame = program_frame(
        &Program::code("import sys\nprint('ran')\nsys.exit(0)"),
        &limits,
    );
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
    let mut extra = program_frame(
        &Program::code("import sys\nprint(repr(sys.stdin.read()))"),
        &limits,
    );
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
    let out = runner(&ceilings, &program_frame(&Program::code(code), &tighter));
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
    let out = runner(&fast, &program_frame(&Program::code(code), &looser));
    let r = parse_envelope(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.stdout.len(), 1000, "{r:?}");
}

// Files in and out. The runner is the one that places inputs and collects outputs, so its rules
// are tested here on every kind of entry hostile code can leave in outputs/; the sandboxes'
// own tests (local_sandbox.rs, the MCP client suite) repeat the important ones end to end.

fn run_program(program: &Program<'_>) -> (RunnerResult, Output) {
    run_framed(program, &Limits::default())
}

fn with_outputs(code: &str, caps: FileCaps) -> RunnerResult {
    run_program(&Program {
        code,
        inputs: &[],
        outputs: caps,
    })
    .0
}

fn decoded(r: &RunnerResult, name: &str) -> Vec<u8> {
    use base64::Engine as _;
    let f = r.files.iter().find(|f| f.name == name).unwrap();
    base64::engine::general_purpose::STANDARD
        .decode(&f.data)
        .unwrap()
}

fn omitted(r: &RunnerResult) -> Vec<(String, OmitReason)> {
    r.files_omitted
        .iter()
        .map(|o| (o.name.clone(), o.reason))
        .collect()
}

#[test]
fn input_files_are_placed_before_the_code_runs_byte_for_byte() {
    let inputs = [
        InputFile {
            name: "sales.csv".into(),
            content: b"region,amount\nnorth,3\nsouth,4\n".to_vec(),
        },
        InputFile {
            name: "blob.bin".into(),
            content: (0u8..=255).collect(),
        },
    ];
    let code = "import os, hashlib\n\
        print(sorted(os.listdir('inputs')))\n\
        print(open('inputs/sales.csv').read().count('\\n'))\n\
        print(hashlib.sha256(open('inputs/blob.bin','rb').read()).hexdigest())\n\
        print(oct(os.stat('inputs/sales.csv').st_mode & 0o777), oct(os.stat('inputs').st_mode & 0o777))";
    let (r, _) = run_program(&Program {
        code,
        inputs: &inputs,
        outputs: FileCaps::default(),
    });
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    let sha = {
        use std::fmt::Write;
        let digest = sha256(&inputs[1].content);
        digest.iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    };
    assert_eq!(
        r.stdout,
        format!("['blob.bin', 'sales.csv']\n3\n{sha}\n0o444 0o555\n")
    );
}

/// SHA-256 through the host's python3 (no hashing crate in this workspace's dev dependencies).
fn sha256(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new("python3")
        .args(["-c", "import sys,hashlib; sys.stdout.write(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let hex = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn a_frame_with_a_hostile_input_name_or_a_cut_input_section_is_refused_and_nothing_runs() {
    let limits = Limits::default();
    let frame = |section: &[u8]| {
        let code = b"open('/dev/stderr','w').write('RAN')";
        let mut f = format!("{} 30 65536 {} 20 1000\n", code.len(), section.len()).into_bytes();
        f.extend_from_slice(code);
        f.extend_from_slice(section);
        f
    };
    let long = format!("101 1\n{}x", "a".repeat(101));
    for section in [
        &b"8 1\n../escapex"[..],
        b"11 1\n/etc/passwdx",
        b"7 1\n.hiddenx",
        b"3 1\na/bx",
        b"3 1\na\0bx",
        b"3 1\na\nbx",
        b"0 1\nx",
        long.as_bytes(),
        // The same name twice.
        b"1 1\nax1 1\nay",
        // Lengths past the section's end.
        b"1 99\nax",
        b"not a header",
        b"-1 1\nax",
    ] {
        let out = runner(&limits, &frame(section));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(NO_PROGRAM_EXIT),
            "{:?}: {stderr}",
            String::from_utf8_lossy(section)
        );
        assert!(!stderr.contains("RAN"), "the code ran: {stderr}");
        assert!(parse_envelope(&String::from_utf8_lossy(&out.stdout)).is_err());
    }
    // A section announced longer than what arrives (the sender died mid-write).
    let mut cut = frame(b"5 100\nhello");
    let announced = b" 111 20 1000\n";
    let at = cut.iter().position(|&b| b == b' ').unwrap();
    let header_end = cut.iter().position(|&b| b == b'\n').unwrap();
    let mut fixed = cut[..at].to_vec();
    fixed.extend_from_slice(b" 30 65536");
    fixed.extend_from_slice(announced);
    fixed.extend_from_slice(&cut.split_off(header_end + 1));
    let out = runner(&limits, &fixed);
    assert_eq!(out.status.code(), Some(NO_PROGRAM_EXIT));
}

#[test]
fn regular_output_files_come_back_whole_by_name_order() {
    let r = with_outputs(
        "open('outputs/b.txt','w').write('bee')\n\
         open('outputs/a.bin','wb').write(bytes(range(256)))\n\
         open('outputs/empty','w').close()",
        FileCaps::default(),
    );
    let names: Vec<&str> = r.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["a.bin", "b.txt", "empty"]);
    assert_eq!(decoded(&r, "a.bin"), (0u8..=255).collect::<Vec<u8>>());
    assert_eq!(decoded(&r, "b.txt"), b"bee");
    assert!(decoded(&r, "empty").is_empty());
    assert!(r.files_omitted.is_empty());
}

#[test]
fn links_and_special_files_in_outputs_are_never_followed_or_read() {
    let secret = scratch_dir().join("secret.txt");
    std::fs::write(&secret, "TOP-SECRET-CONTENT").unwrap();
    let code = format!(
        "import os, socket\n\
         os.symlink({secret:?}, 'outputs/link.txt')\n\
         os.symlink('/proc/self/environ', 'outputs/environ')\n\
         os.symlink('/etc', 'outputs/etc')\n\
         os.symlink('missing', 'outputs/dangling')\n\
         os.mkfifo('outputs/fifo')\n\
         os.mkdir('outputs/sub'); open('outputs/sub/inner.txt','w').write('x')\n\
         s = socket.socket(socket.AF_UNIX); s.bind('outputs/sock')\n\
         open('outputs/ok.txt','w').write('fine')",
        secret = secret.to_str().unwrap()
    );
    let started = Instant::now();
    let r = with_outputs(&code, FileCaps::default());
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "a FIFO blocked the runner"
    );
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    let names: Vec<&str> = r.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["ok.txt"]);
    let mut left = omitted(&r);
    left.sort();
    assert_eq!(
        left,
        [
            ("dangling".into(), OmitReason::NotARegularFile),
            ("environ".into(), OmitReason::NotARegularFile),
            ("etc".into(), OmitReason::NotARegularFile),
            ("fifo".into(), OmitReason::NotARegularFile),
            ("link.txt".into(), OmitReason::NotARegularFile),
            ("sock".into(), OmitReason::NotARegularFile),
            ("sub".into(), OmitReason::NotARegularFile),
        ]
    );
    let envelope = serde_json::to_string(&r).unwrap();
    assert!(!envelope.contains("TOP-SECRET"));
    let _ = std::fs::remove_dir_all(secret.parent().unwrap());
}

#[test]
fn an_outputs_directory_replaced_by_a_link_returns_nothing() {
    for target in ["/etc", "inputs", "/proc/self"] {
        let code = format!(
            "import os\nos.rmdir('outputs')\nos.symlink({target:?}, 'outputs')\nprint('swapped')"
        );
        let r = with_outputs(&code, FileCaps::default());
        assert_eq!(r.stdout, "swapped\n", "{}", r.stderr);
        assert!(r.files.is_empty(), "{target}: {:?}", r.files);
    }
    // Removed altogether, or replaced by a file: nothing, and no failure.
    let r = with_outputs(
        "import os\nos.rmdir('outputs')\nopen('outputs','w').write('x')",
        FileCaps::default(),
    );
    assert_eq!(r.exit_code, 0);
    assert!(r.files.is_empty());
}

#[test]
fn caps_on_count_and_bytes_are_kept_and_what_they_leave_out_is_reported() {
    let caps = FileCaps {
        max_files: 2,
        max_bytes: 1000,
    };
    let r = with_outputs(
        "for i in range(5): open(f'outputs/f{i}.txt','w').write('x'*100)",
        caps,
    );
    assert_eq!(r.files.len(), 2);
    assert_eq!(
        omitted(&r),
        [
            ("f2.txt".into(), OmitReason::FileCount),
            ("f3.txt".into(), OmitReason::FileCount),
            ("f4.txt".into(), OmitReason::FileCount),
        ]
    );
    // A file that does not fit is left out whole; a smaller one after it still fits.
    let r = with_outputs(
        "open('outputs/a.txt','w').write('x'*600)\n\
         open('outputs/b.txt','w').write('x'*600)\n\
         open('outputs/c.txt','w').write('x'*300)",
        FileCaps {
            max_files: 10,
            max_bytes: 1000,
        },
    );
    let names: Vec<&str> = r.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["a.txt", "c.txt"]);
    assert_eq!(omitted(&r), [("b.txt".into(), OmitReason::ByteCount)]);
    // No frame can raise the runner's own ceilings.
    let r = with_outputs(
        "open('outputs/big.bin','wb').write(b'x' * (400 * 1024))",
        FileCaps {
            max_files: 1000,
            max_bytes: u64::MAX,
        },
    );
    assert!(r.files.is_empty());
    assert_eq!(omitted(&r), [("big.bin".into(), OmitReason::ByteCount)]);
}

#[test]
fn names_that_are_not_plain_file_names_are_reported_not_returned() {
    let r = with_outputs(
        "import os\n\
         for n in ['a\\nb', '.hidden', '-rf', 'x'*101, 'caf\\u00e9', 'sp ace', 'ok']:\n\
         \x20   open(os.path.join('outputs', n), 'w').write('x')",
        FileCaps::default(),
    );
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    let names: Vec<&str> = r.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["ok"]);
    assert_eq!(r.files_omitted.len(), 6);
    assert!(
        r.files_omitted
            .iter()
            .all(|o| o.reason == OmitReason::BadName && o.name.chars().count() <= 100)
    );
}

#[test]
fn thousands_of_files_leave_a_bounded_envelope() {
    let r = with_outputs(
        "for i in range(3000): open(f'outputs/f{i:05}','w').write('x')",
        FileCaps::default(),
    );
    assert_eq!(r.files.len(), 20);
    assert_eq!(r.files_omitted.len(), 50);
    assert!(serde_json::to_string(&r).unwrap().len() < 20_000);
}

#[test]
fn an_output_directory_of_200000_files_is_listed_within_its_bounds() {
    // Empty files: the host's /tmp holds them whatever its size. Created by the code, as an
    // attacker would, then the runner lists what it left.
    let started = Instant::now();
    // The code's own time limit is generous too: creating the files takes a few seconds on an
    // idle machine, and CI may run this beside other work.
    let limits = Limits {
        timeout_seconds: 300,
        ..Limits::default()
    };
    let (r, _) = run_framed(
        &Program {
            code: "import os\nfor i in range(200000): os.close(os.open(f'outputs/f{i:06}', os.O_CREAT | os.O_WRONLY, 0o644))",
            inputs: &[],
            outputs: FileCaps::default(),
        },
        &limits,
    );
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    assert_eq!(r.files.len(), 20);
    assert!(r.files_omitted.len() <= 50);
    // What was not looked at is reported, as one omission with its count.
    let last = r.files_omitted.last().unwrap();
    assert_eq!(last.reason, OmitReason::FileCount);
    assert!(last.name.ends_with("more entries not examined"), "{last:?}");
    let counted: u64 = last
        .name
        .trim_start_matches("over ")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // At most 1000 entries are looked at; the rest is counted (all of them, unless the listing's
    // time ran out first, which the name then says).
    assert!(counted >= 199_000, "{last:?}");
    assert!(
        counted == 199_000 || last.name.starts_with("over "),
        "{last:?}"
    );
    assert!(serde_json::to_string(&r).unwrap().len() < 20_000);
    // A generous bound (creating the files is most of it): the listing does not grow with them.
    assert!(started.elapsed() < Duration::from_secs(360));
}

/// A TCP listener in place of the operator's canary: it accepts and answers while `open`; once
/// closed (`close`), its accept queue is left full, so that the kernel drops every new
/// connection's SYN, as a NetworkPolicy that came into force does (a closed port would answer
/// with a reset, which proves a path, not a barrier).
struct Canary {
    address: String,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    // Held open for the test's length (the accept thread has a clone).
    _listener: std::net::TcpListener,
    // The connections that fill the queue, kept open.
    fillers: Vec<std::net::TcpStream>,
}

impl Canary {
    fn start() -> Canary {
        use std::io::Write;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        // Backlog 0: the accept queue holds one connection, and the next SYN is dropped.
        let listener = listen_with_backlog_zero();
        let address = listener.local_addr().unwrap().to_string();
        let open = std::sync::Arc::new(AtomicBool::new(true));
        let accepted = std::sync::Arc::new(AtomicU64::new(0));
        let (server, flag, count) = (
            listener.try_clone().unwrap(),
            open.clone(),
            accepted.clone(),
        );
        std::thread::spawn(move || {
            while flag.load(Ordering::SeqCst) {
                if let Ok((mut s, _)) = server.accept() {
                    if !flag.load(Ordering::SeqCst) {
                        // The connection that woke the closing accept: keep it queued-looking.
                        std::mem::forget(s);
                        break;
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    let _ = s.write_all(b"sandboxrun-canary\n");
                }
            }
        });
        Canary {
            address,
            open,
            accepted,
            _listener: listener,
            fillers: Vec::new(),
        }
    }

    /// Stops answering and fills the accept queue: from now on a connection gets no answer.
    fn close(&mut self) {
        use std::sync::atomic::Ordering;
        self.open.store(false, Ordering::SeqCst);
        // Wakes the accept thread, which stops, then fills the queue until a connect times out.
        for _ in 0..8 {
            match std::net::TcpStream::connect_timeout(
                &self.address.parse().unwrap(),
                Duration::from_secs(2),
            ) {
                Ok(s) => self.fillers.push(s),
                Err(_) => return,
            }
        }
        panic!("the canary's accept queue never filled");
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A listener on 127.0.0.1 with a zero backlog (std's `bind` takes 128).
fn listen_with_backlog_zero() -> std::net::TcpListener {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
    socket.listen(0).unwrap();
    socket.into()
}

/// The runner with `canary` in its environment (None: none set), started on this host (which
/// has routes out), its program `code` written at once; and its private /tmp.
fn runner_with_canary(
    canary: Option<&str>,
    code: &str,
) -> (std::process::Child, std::path::PathBuf) {
    let limits = Limits::default();
    let argv = runner_argv(&limits, Profile::Minimal);
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]);
    match canary {
        Some(c) => command.env(CANARY_ENV, c),
        None => command.env_remove(CANARY_ENV),
    };
    let tmp = scratch_dir();
    let mut child = command
        .env("SANDBOXRUN_RUNNER_TMP", &tmp)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 on PATH");
    use std::io::Write;
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(&program_frame(&Program::code(code), &limits))
        .unwrap();
    drop(pipe);
    (child, tmp)
}

#[test]
fn the_runner_reads_no_program_while_the_canary_answers_and_runs_it_once_blocked() {
    let mut canary = Canary::start();
    // The probe in the code: it connects the instant it starts.
    let code = format!(
        "import socket\ns = socket.socket()\ns.settimeout(1.5)\ntry:\n    s.connect(('127.0.0.1', {port}))\n    print('reached')\nexcept OSError as e:\n    print('blocked', e)",
        port = canary.address.rsplit(':').next().unwrap()
    );
    let (child, tmp) = runner_with_canary(Some(&canary.address), &code);
    // While the canary answers, the runner keeps probing it: wait until it has probed a few
    // times (a condition, not a duration). It has read nothing: the program (written at once)
    // would have made it create outputs/ in its /tmp.
    let deadline = Instant::now() + Duration::from_secs(60);
    while canary.accepted() < 3 {
        assert!(
            Instant::now() < deadline,
            "the runner never probed the canary"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!tmp.join("outputs").exists(), "the program was read");
    canary.close();
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
    let log = String::from_utf8_lossy(&out.stdout);
    // It read the program once a probe went unanswered, and the code's own connection, made
    // the instant it started, was blocked as well.
    assert!(log.contains("sandboxrun-program-received"), "{log}");
    let r = parse_envelope(&log).unwrap();
    assert_eq!(r.not_run, None, "{log}");
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    assert!(r.stdout.starts_with("blocked"), "{}", r.stdout);
}

#[test]
fn a_canary_that_keeps_answering_ends_the_run_unrun() {
    let canary = Canary::start();
    let (child, tmp) = runner_with_canary(Some(&canary.address), "print('ran')");
    let out = child.wait_with_output().unwrap();
    assert!(!tmp.join("outputs").exists(), "the program was read");
    let _ = std::fs::remove_dir_all(&tmp);
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(!log.contains("sandboxrun-program-received"), "{log}");
    assert!(!log.contains("ran"), "{log}");
    let r = parse_envelope(&log).unwrap();
    let not_run = r.not_run.expect("the envelope says why nothing ran");
    assert_eq!(not_run.reason, NotRunReason::IsolationNotInForce);
    assert!(
        not_run.message.contains(&canary.address),
        "{}",
        not_run.message
    );
    assert_eq!(out.status.code(), Some(ISOLATION_NOT_IN_FORCE_EXIT));
    assert!(canary.accepted() >= 2);
}

#[test]
fn a_reset_from_the_canarys_host_is_a_path_not_a_barrier() {
    // Nothing listens there: the host answers every connection with a reset.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let (child, tmp) = runner_with_canary(Some(&closed), "print('ran')");
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
    let r = parse_envelope(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(
        r.not_run.map(|n| n.reason),
        Some(NotRunReason::IsolationNotInForce)
    );
}

#[test]
fn a_sandbox_with_a_route_out_and_no_valid_canary_runs_nothing() {
    for canary in [
        None,
        Some(""),
        Some("localhost:80"),
        Some("10.0.0.1"),
        Some("[::1]:0"),
    ] {
        let (child, tmp) = runner_with_canary(canary, "print('ran')");
        let out = child.wait_with_output().unwrap();
        let _ = std::fs::remove_dir_all(&tmp);
        let log = String::from_utf8_lossy(&out.stdout);
        assert!(!log.contains("program-received"), "{canary:?}: {log}");
        let r = parse_envelope(&log).unwrap();
        assert_eq!(
            r.not_run.map(|n| n.reason),
            Some(NotRunReason::IsolationNotInForce),
            "{canary:?}"
        );
    }
}

#[test]
fn a_sandbox_with_only_loopback_needs_no_canary() {
    // A new network namespace (through a user namespace: no privilege needed) has `lo` only,
    // as gVisor with `network = "none"` and the embedded sandboxes give.
    let limits = Limits::default();
    let mut command = Command::new("unshare");
    command
        .args(["--user", "--map-root-user", "--net", "--"])
        .args(runner_argv(&limits, Profile::Minimal))
        .env_remove(CANARY_ENV);
    let out = run_command(
        command,
        &program_frame(&Program::code("print('ran')"), &limits),
    );
    let log = String::from_utf8_lossy(&out.stdout);
    let r = parse_envelope(&log)
        .unwrap_or_else(|e| panic!("{e}: {log} {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(r.not_run, None);
    assert_eq!(r.stdout, "ran\n");
}

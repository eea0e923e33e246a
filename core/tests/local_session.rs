//! Sessions in the local sandbox driver, against the real engines (gVisor `runsc` and
//! bubblewrap; see `local_common`): state kept between calls, files kept, sessions kept apart,
//! results that stay the runner's whatever a call leaves running, and nothing left behind when a
//! session ends, however it ends.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

mod local_common;

use local_common::{Run, engines, serial, wait_no_leftovers};
use sandboxrun_core::{
    Isolation, Limits, LocalSandbox, LocalSandboxError, LocalSession, Phase, Profile, Program,
};

fn limits() -> Limits {
    Limits {
        timeout_seconds: 20,
        ..Limits::default()
    }
}

/// One call in `session`, classified as a single run is; and whether the session ended with it.
async fn call(session: &mut LocalSession, name: &str, code: &str) -> (Run, Option<String>) {
    call_with(session, name, code, &limits()).await
}

async fn call_with(
    session: &mut LocalSession,
    name: &str,
    code: &str,
    limits: &Limits,
) -> (Run, Option<String>) {
    let done = session
        .call(name, &Program::code(code), limits, None)
        .await
        .unwrap_or_else(|e| panic!("call {name} could not be sent: {e}"));
    (Run::of(done.run, limits), done.ended)
}

fn open(sandbox: &LocalSandbox) -> LocalSession {
    sandbox
        .open_session(Profile::Minimal, &limits())
        .unwrap_or_else(|e| panic!("{}: cannot open a session: {e}", sandbox.isolation()))
}

/// Runs `test` with a fresh session on every engine, then closes it and checks that nothing of
/// it is left on the host.
async fn on_each_engine<F>(test: F)
where
    F: AsyncFn(Isolation, &mut LocalSession),
{
    for (isolation, sandbox) in engines() {
        let mut session = open(sandbox);
        test(*isolation, &mut session).await;
        session.close().await;
        let left = wait_no_leftovers("\u{0}never\u{0}", 10).await;
        assert!(left.is_empty(), "{isolation}: left behind: {left:#?}");
    }
}

fn ok(engine: Isolation, run: &Run, ended: &Option<String>, stdout: &str) {
    assert_eq!(run.outcome, Phase::Succeeded, "{engine}: {run:?}");
    assert_eq!(run.result.stdout, stdout, "{engine}: {run:?}");
    assert_eq!(ended, &None, "{engine}");
}

#[tokio::test]
async fn variables_and_imports_are_kept_between_calls() {
    let _serial = serial().await;
    on_each_engine(async |engine, s| {
        let (r, ended) = call(s, "a", "x = 41\nimport json").await;
        ok(engine, &r, &ended, "");
        let (r, ended) = call(s, "b", "print(x + 1, json.dumps([1]))").await;
        ok(engine, &r, &ended, "42 [1]\n");
        assert_eq!(s.calls(), 2);
    })
    .await;
}

#[tokio::test]
async fn a_file_written_in_one_call_is_read_in_the_next() {
    let _serial = serial().await;
    on_each_engine(async |engine, s| {
        let (r, ended) = call(s, "w", "open('notes.txt', 'w').write('kept')").await;
        ok(engine, &r, &ended, "");
        let (r, ended) = call(
            s,
            "r",
            "import os; print(os.getcwd(), open('notes.txt').read())",
        )
        .await;
        ok(engine, &r, &ended, "/tmp kept\n");
    })
    .await;
}

#[tokio::test]
async fn a_failing_call_or_a_system_exit_leaves_the_session_going() {
    let _serial = serial().await;
    on_each_engine(async |engine, s| {
        let (r, ended) = call(s, "boom", "y = 7\nraise ValueError('boom')").await;
        assert_eq!(r.outcome, Phase::Failed, "{engine}: {r:?}");
        assert_eq!(r.result.exit_code, 1);
        assert!(
            r.result.stderr.contains("ValueError: boom"),
            "{engine}: {r:?}"
        );
        assert_eq!(ended, None);
        let (r, ended) = call(s, "exit", "import sys; sys.exit(3)").await;
        assert_eq!(r.result.exit_code, 3, "{engine}: {r:?}");
        assert_eq!(ended, None);
        let (r, ended) = call(s, "after", "print(y)").await;
        ok(engine, &r, &ended, "7\n");
    })
    .await;
}

#[tokio::test]
async fn what_a_call_leaves_running_cannot_write_into_a_later_call() {
    let _serial = serial().await;
    // A daemon thread, a thread the interpreter would wait for, a process in its own session, and
    // a copy of the call's stdout, all writing for ever; then envelope-looking lines and a forged
    // runner message on every descriptor the code can reach.
    let leave = r#"
import os, subprocess, sys, threading, time
def spam(tag):
    while True:
        print(tag, flush=True)
        time.sleep(0.005)
threading.Thread(target=spam, args=("LEAK-daemon",), daemon=True).start()
threading.Thread(target=spam, args=("LEAK-thread",)).start()
subprocess.Popen(["python3", "-c", "import time\nwhile True:\n print('LEAK-process', flush=True); time.sleep(0.005)"], start_new_session=True)
kept = os.dup(1)
time.sleep(0.05)
print("first")
"#;
    on_each_engine(async |engine, s| {
        let (r, ended) = call(s, "leave", leave).await;
        assert_eq!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        // What they wrote until the call ended is the call's own output.
        assert!(r.result.stdout.contains("first\n"), "{engine}: {r:?}");
        assert_eq!(ended, None);
        for n in 0..3 {
            let (r, ended) = call(
                s,
                &format!("later-{n}"),
                "import os, time\ntry:\n    os.write(kept, b'LEAK-kept\\n')\nexcept OSError:\n    pass\ntime.sleep(0.1)\nprint('clean')",
            )
            .await;
            ok(engine, &r, &ended, "clean\n");
            assert_eq!(r.result.stderr, "", "{engine}");
        }
        let (r, ended) = call(s, "count", "import threading; print(threading.active_count())").await;
        ok(engine, &r, &ended, "1\n");
    })
    .await;
}

#[tokio::test]
async fn replaced_builtins_and_handlers_are_restored_for_the_next_call() {
    let _serial = serial().await;
    let tamper = r#"
import builtins, signal, sys
builtins.print = lambda *a, **k: None
builtins.exec = builtins.compile = None
builtins.extra = 1
sys.stdout = None
sys.excepthook = lambda *a: None
signal.signal(signal.SIGTERM, lambda *a: None)
sys.settrace(lambda *a: None)
"#;
    on_each_engine(async |engine, s| {
        let (r, ended) = call(s, "tamper", tamper).await;
        assert_eq!(ended, None, "{engine}: {r:?}");
        let (r, ended) = call(
            s,
            "after",
            "import signal, sys\nprint(hasattr(__builtins__, 'extra'), signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, sys.gettrace())\nraise KeyError('shown')",
        )
        .await;
        assert_eq!(r.result.stdout, "False True None\n", "{engine}: {r:?}");
        assert!(r.result.stderr.contains("KeyError: 'shown'"), "{engine}: {r:?}");
        assert_eq!(ended, None);
    })
    .await;
}

#[tokio::test]
async fn forged_envelopes_and_messages_do_not_become_a_result() {
    let _serial = serial().await;
    let forge = r#"
import os
fake = b'\n{"sandboxrun":1,"exitCode":0,"stdout":"forged","stderr":"","stdoutTruncated":false,"stderrTruncated":false,"signal":null,"oomKill":null,"timedOut":false,"durationMillis":1,"call":"next","session":{"alive":true,"ended":null,"message":null}}\n'
for fd in range(0, 64):
    try:
        os.write(fd, fake)
    except OSError:
        pass
"#;
    on_each_engine(async |engine, s| {
        let (r, ended) = call(s, "forge", forge).await;
        assert_ne!(r.result.stdout, "forged", "{engine}: {r:?}");
        if ended.is_none() {
            let (r, _) = call(s, "next", "print('real')").await;
            assert_ne!(r.result.stdout, "forged", "{engine}: {r:?}");
            // Its fake `done` on the interpreter's own pipe came out of turn: either the session
            // ended, or the call ran for real.
            assert!(
                r.result.stdout == "real\n" || s.ended().is_some(),
                "{engine}: {r:?}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_call_that_kills_its_interpreter_ends_the_session_and_its_sandbox() {
    let _serial = serial().await;
    for (engine, sandbox) in engines() {
        for (name, code) in [
            ("exit", "import os; os._exit(5)"),
            (
                "kill",
                "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
            ),
        ] {
            let mut s = open(sandbox);
            let (r, ended) = call(&mut s, "set", "x = 1").await;
            ok(*engine, &r, &ended, "");
            let (r, ended) = call(&mut s, name, code).await;
            assert_eq!(r.outcome, Phase::Failed, "{engine} {name}: {r:?}");
            let ended = ended.unwrap_or_else(|| panic!("{engine} {name}: the session went on"));
            assert!(ended.contains("exited"), "{engine} {name}: {ended}");
            assert_eq!(s.ended(), Some(ended.as_str()));
            let refused = s
                .call("after", &Program::code("print(x)"), &limits(), None)
                .await;
            assert!(
                matches!(refused, Err(LocalSandboxError::SessionEnded(_))),
                "{engine} {name}: {refused:?}"
            );
            let left = wait_no_leftovers("\u{0}never\u{0}", 10).await;
            assert!(left.is_empty(), "{engine} {name}: left behind: {left:#?}");
            drop(s);
        }
    }
}

#[tokio::test]
async fn a_call_past_its_timeout_ends_the_session() {
    let _serial = serial().await;
    for (engine, sandbox) in engines() {
        let mut s = open(sandbox);
        let short = Limits {
            timeout_seconds: 1,
            ..limits()
        };
        let (r, ended) = call_with(
            &mut s,
            "spin",
            "print('started', flush=True)\nwhile True: pass",
            &short,
        )
        .await;
        assert_eq!(r.outcome, Phase::TimedOut, "{engine}: {r:?}");
        assert_eq!(r.result.stdout, "started\n", "{engine}: {r:?}");
        assert!(ended.is_some_and(|e| e.contains("timeout")), "{engine}");
        let left = wait_no_leftovers("\u{0}never\u{0}", 10).await;
        assert!(left.is_empty(), "{engine}: left behind: {left:#?}");
    }
}

#[tokio::test]
async fn two_sessions_share_nothing() {
    let _serial = serial().await;
    for (engine, sandbox) in engines() {
        let mut a = open(sandbox);
        let mut b = open(sandbox);
        let (r, ended) = call(
            &mut a,
            "a1",
            "secret = 'a'\nopen('mine.txt', 'w').write('a')",
        )
        .await;
        ok(*engine, &r, &ended, "");
        let (r, ended) = call(
            &mut b,
            "b1",
            "import os\nprint('secret' in globals(), os.path.exists('mine.txt'))",
        )
        .await;
        ok(*engine, &r, &ended, "False False\n");
        let (r, ended) = call(&mut a, "a2", "print(secret, open('mine.txt').read())").await;
        ok(*engine, &r, &ended, "a a\n");
        a.close().await;
        // Dropped without a close: the sandbox goes with it.
        drop(b);
        let left = wait_no_leftovers("\u{0}never\u{0}", 10).await;
        assert!(left.is_empty(), "{engine}: left behind: {left:#?}");
    }
}

#[tokio::test]
async fn hostile_code_inside_a_session_is_contained_as_in_a_single_run() {
    let _serial = serial().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let network = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n    print('connected')\nexcept OSError as e:\n    print('blocked')"
    );
    let forgery =
        |signal: &str| include_str!("fixtures/forge_result.py").replace("THE_SIGNAL", signal);
    for (engine, sandbox) in engines() {
        let mut s = open(sandbox);
        let (r, ended) = call(&mut s, "net", &network).await;
        ok(*engine, &r, &ended, "blocked\n");
        let (r, ended) = call(
            &mut s,
            "root",
            "try:\n    open('/etc/evil', 'w')\n    print('wrote')\nexcept OSError:\n    print('refused')",
        )
        .await;
        ok(*engine, &r, &ended, "refused\n");
        for sig in ["SIGTERM", "SIGUSR1", "SIGINT"] {
            let (r, ended) = call(&mut s, &format!("forge-{sig}"), &forgery(sig)).await;
            assert!(
                !r.result.stdout.contains("FORGED") && r.result.exit_code == 3,
                "{engine} {sig}: {r:?}"
            );
            assert!(
                r.result.stdout.contains("shut /proc/") && !r.result.stdout.contains("OPEN"),
                "{engine} {sig}: a door was open: {}",
                r.result.stdout
            );
            assert_eq!(ended, None, "{engine} {sig}");
        }
        // A fork bomb: the call fails or times out; the host still forks; if the session goes
        // on, its next call runs.
        let short = Limits {
            timeout_seconds: 10,
            ..limits()
        };
        let (r, ended) =
            call_with(&mut s, "bomb", "import os\nwhile True: os.fork()", &short).await;
        assert_ne!(r.outcome, Phase::Succeeded, "{engine}: {r:?}");
        assert!(
            std::process::Command::new("true")
                .status()
                .unwrap()
                .success()
        );
        if ended.is_none() {
            let (r, ended) = call(&mut s, "after-bomb", "print('still here')").await;
            ok(*engine, &r, &ended, "still here\n");
        } else {
            s = open(sandbox);
        }
        // Memory past the limit: the interpreter is killed, and the session with it.
        let (r, ended) = call(
            &mut s,
            "oom",
            "x = bytearray(b'x') * (1 << 30)\nprint(len(x))",
        )
        .await;
        assert_eq!(r.outcome, Phase::Failed, "{engine}: {r:?}");
        assert_eq!(r.result.stdout, "", "{engine}: the allocation succeeded");
        assert!(
            ended.is_some(),
            "{engine}: the session outlived its interpreter"
        );
        drop(s);
        let left = wait_no_leftovers("\u{0}never\u{0}", 10).await;
        assert!(left.is_empty(), "{engine}: left behind: {left:#?}");
    }
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "a session reached the host listener"
    );
}

/// An embedded server's executor over `sandbox`, with the embedded default policy (which allows
/// sessions).
fn embedded(sandbox: &LocalSandbox) -> sandboxrun_core::tools::Embedded {
    sandboxrun_core::tools::Embedded {
        policy: sandboxrun_core::PolicyStore::new(
            sandboxrun_core::Policy::from_yaml(
                sandboxrun_core::policy::embedded::EMBEDDED_POLICY,
                "<embedded>",
            )
            .unwrap(),
        ),
        sandbox: Some(sandbox.clone()),
        databases: None,
        calls: sandboxrun_core::metrics::CallStore::new(),
        sessions: Default::default(),
    }
}

async fn tool_call(
    embedded: &sandboxrun_core::tools::Embedded,
    agent: &str,
    args: serde_json::Value,
) -> sandboxrun_core::tools::python::PythonOutput {
    tool_call_with_output(embedded, agent, args, None).await
}

async fn tool_call_with_output(
    embedded: &sandboxrun_core::tools::Embedded,
    agent: &str,
    args: serde_json::Value,
    output: Option<sandboxrun_core::OutputFn>,
) -> sandboxrun_core::tools::python::PythonOutput {
    use sandboxrun_core::tools::ToolSpec;
    use sandboxrun_core::tools::python::RunPython;
    let serde_json::Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let call = RunPython::parse(&args, &Default::default()).unwrap();
    RunPython::run_embedded(
        embedded,
        agent,
        format!("local-{}", rand_suffix()),
        call,
        output,
    )
    .await
    .unwrap()
}

/// An output callback that wakes `started` once the code printed `started`: the call is then
/// running in its session, however long the machine took to get there.
fn on_started(started: &std::sync::Arc<tokio::sync::Notify>) -> sandboxrun_core::OutputFn {
    let started = std::sync::Arc::clone(started);
    std::sync::Arc::new(move |chunk: sandboxrun_core::OutputChunk| {
        if chunk.text.contains("started") {
            started.notify_one();
        }
    })
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Opens a session for agent `a` through the executor (`x = 1` in it); its id.
async fn open_through_the_tool(
    embedded: &sandboxrun_core::tools::Embedded,
    engine: Isolation,
) -> String {
    let opened = tool_call(
        embedded,
        "a",
        serde_json::json!({"code": "x = 1", "session": "new"}),
    )
    .await;
    opened
        .session
        .clone()
        .unwrap_or_else(|| panic!("{engine}: {opened:?}"))
}

/// A two-minute call in session `id` that prints `started` first, and what wakes once it did.
fn long_call<'a>(
    embedded: &'a sandboxrun_core::tools::Embedded,
    id: &str,
) -> (
    impl std::future::Future<Output = sandboxrun_core::tools::python::PythonOutput> + 'a,
    std::sync::Arc<tokio::sync::Notify>,
) {
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let call = tool_call_with_output(
        embedded,
        "a",
        serde_json::json!({"code": "import time\nprint('started', flush=True)\ntime.sleep(120)\nprint('finished')", "session": id, "timeoutSeconds": 300}),
        Some(on_started(&started)),
    );
    (call, started)
}

/// Session `id` is gone for its agent, and nothing of it is left on the host.
async fn assert_gone(embedded: &sandboxrun_core::tools::Embedded, engine: Isolation, id: &str) {
    let after = tool_call(
        embedded,
        "a",
        serde_json::json!({"code": "print(x)", "session": id}),
    )
    .await;
    assert_eq!(
        after.reason.as_deref(),
        Some("SessionNotFound"),
        "{engine}: {after:?}"
    );
    assert_eq!(embedded.sessions.held_by("a"), 0, "{engine}");
    let left = wait_no_leftovers("\u{0}never\u{0}", 10).await;
    assert!(left.is_empty(), "{engine}: left behind: {left:#?}");
}

#[tokio::test]
async fn a_cancelled_call_ends_its_session_and_its_sandbox() {
    let _serial = serial().await;
    for (engine, sandbox) in engines() {
        let embedded = embedded(sandbox);
        let id = open_through_the_tool(&embedded, *engine).await;
        // The caller goes away while the call runs: the future is dropped once the code runs.
        let (long, started) = long_call(&embedded, &id);
        tokio::select! {
            out = long => panic!("{engine}: the call ended by itself: {out:?}"),
            () = started.notified() => {}
        }
        assert_gone(&embedded, *engine, &id).await;
    }
}

#[tokio::test]
async fn a_session_idle_past_its_timeout_is_ended_with_its_sandbox() {
    use sandboxrun_core::policy::SessionRules;
    let _serial = serial().await;
    for (engine, sandbox) in engines() {
        let sessions = sandboxrun_core::tools::python_session::Sessions::default();
        // Shorter than any policy may set (10 s): the registry enforces what it is given.
        let rules = SessionRules {
            idle_timeout_seconds: 1,
            ..SessionRules::default()
        };
        let (id, _) = sessions
            .open("a", Profile::Minimal, &limits(), rules, sandbox)
            .unwrap_or_else(|e| panic!("{engine}: {e:?}"));
        assert!(sessions.find("a", &id).is_some(), "{engine}");
        assert!(
            sessions.find("b", &id).is_none(),
            "{engine}: another agent found it"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        assert!(sessions.find("a", &id).is_none(), "{engine}: still open");
        assert_eq!(sessions.held_by("a"), 0);
        let left = wait_no_leftovers("\u{0}never\u{0}", 10).await;
        assert!(left.is_empty(), "{engine}: left behind: {left:#?}");
    }
}

#[tokio::test]
async fn under_gvisor_two_sessions_are_two_kernels() {
    let _serial = serial().await;
    for (engine, sandbox) in engines() {
        if *engine != Isolation::Gvisor {
            continue;
        }
        let boot_id = "print(open('/proc/sys/kernel/random/boot_id').read().strip())";
        let mut a = open(sandbox);
        let mut b = open(sandbox);
        let (ra, _) = call(&mut a, "a", boot_id).await;
        let (rb, _) = call(&mut b, "b", boot_id).await;
        assert_eq!(ra.outcome, Phase::Succeeded, "{ra:?}");
        assert_eq!(rb.outcome, Phase::Succeeded, "{rb:?}");
        assert_ne!(ra.result.stdout, rb.result.stdout, "the same boot id");
        // And a session keeps its kernel from call to call.
        let (again, _) = call(&mut a, "a2", boot_id).await;
        assert_eq!(again.result.stdout, ra.result.stdout);
        a.close().await;
        b.close().await;
    }
}

#[tokio::test]
async fn closing_a_session_stops_the_call_running_in_it() {
    let _serial = serial().await;
    for (engine, sandbox) in engines() {
        let embedded = embedded(sandbox);
        let id = open_through_the_tool(&embedded, *engine).await;
        let (long, started) = long_call(&embedded, &id);
        let close = async {
            started.notified().await;
            embedded.sessions.close("a", &id).await
        };
        let (stopped, closed) = tokio::join!(long, close);
        closed.unwrap_or_else(|e| panic!("{engine}: {e}"));
        assert_eq!(stopped.phase, Phase::Cancelled, "{engine}: {stopped:?}");
        assert!(
            !stopped.stdout.contains("finished"),
            "{engine}: {stopped:?}"
        );
        assert!(stopped.session_ended.is_some(), "{engine}: {stopped:?}");
        assert_gone(&embedded, *engine, &id).await;
    }
}

//! The runner's session mode (`runner.py --session`) with the host's `python3`: how it reads
//! calls from a stdin that senders may cut short, what it answers to frames that are not whole,
//! the files of a session's calls, and its end. The local sandbox tests (`local_session.rs`) run
//! the same runner in real sandboxes, with hostile code.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use sandboxrun_core::{
    CANARY_ENV, FileCaps, InputFile, Limits, NotRunReason, PROGRAM_RECEIVED, Profile, Program,
    RunnerResult, SESSION_CLOSE, parse_call_envelope, session_argv, session_frame,
};

struct Runner {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    tmp: std::path::PathBuf,
}

impl Runner {
    fn start() -> Self {
        let tmp = std::env::temp_dir().join(format!(
            "sandboxrun-session-test-{}-{}",
            std::process::id(),
            uuid_like()
        ));
        std::fs::create_dir(&tmp).unwrap();
        let argv = session_argv(&Limits::default(), Profile::Minimal);
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .env(CANARY_ENV, "none")
            .env("SANDBOXRUN_RUNNER_TMP", &tmp)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 on PATH");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
            tmp,
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stdin.write_all(bytes).unwrap();
        self.stdin.flush().unwrap();
    }

    /// The lines the runner prints up to the envelope of `call`, and that envelope.
    fn result(&mut self, call: &str) -> (Vec<String>, RunnerResult) {
        let mut seen = Vec::new();
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the runner ended before the result of {call}; it printed {seen:?}"
            );
            if let Ok(result) = parse_call_envelope(&line, call) {
                return (seen, result);
            }
            seen.push(line.trim_end().to_owned());
        }
    }

    fn call(&mut self, call: &str, program: &Program<'_>) -> RunnerResult {
        self.send(&session_frame(call, program, &Limits::default()));
        let (lines, result) = self.result(call);
        assert!(
            lines.contains(&format!("{PROGRAM_RECEIVED} {call}")),
            "{lines:?}"
        );
        result
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("chmod")
            .arg("-R")
            .arg("u+w")
            .arg(&self.tmp)
            .status();
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

fn uuid_like() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn a_call_cut_short_is_dropped_and_the_next_whole_one_runs() {
    let mut r = Runner::start();
    let cut = session_frame("cut", &Program::code("print('CUT')"), &Limits::default());
    // Every cut: mid-header, mid-base64, before the end line.
    for at in [10, cut.len() / 2, cut.len() - 5] {
        r.send(&cut[..at]);
        let result = r.call(&format!("whole-{at}"), &Program::code("print('whole')"));
        assert_eq!(result.stdout, "whole\n");
    }
    // Lines outside any call, a payload of another size, a line that is not base64.
    r.send(b"\nnot a call\nsandboxrun-call bad 5\nAAAA\nsandboxrun-end bad\n");
    r.send(b"\nsandboxrun-call bad2 3\n!!!!\nsandboxrun-end bad2\n");
    let result = r.call("after", &Program::code("print('after')"));
    assert_eq!(result.stdout, "after\n");
    assert!(result.session.unwrap().alive);
}

#[test]
fn a_call_sent_again_under_its_name_runs_once() {
    // An operator that restarted before the confirmation of a call reached the log sends it
    // again: the code must not run twice.
    let mut r = Runner::start();
    let program = Program::code("n = globals().get('n', 0) + 1\nprint(n)");
    let first = r.call("once", &program);
    assert_eq!(first.stdout, "1\n");
    r.send(&session_frame("once", &program, &Limits::default()));
    let next = r.call("next", &Program::code("print(n)"));
    assert_eq!(next.stdout, "1\n", "the call sent again ran a second time");
}

#[test]
fn a_payload_that_is_no_program_is_not_run_and_the_session_goes_on() {
    use base64::Engine as _;
    let mut r = Runner::start();
    let payload = b"not a program header\n";
    let b64 = base64::engine::general_purpose::STANDARD.encode(payload);
    r.send(
        format!(
            "\nsandboxrun-call junk {}\n{b64}\nsandboxrun-end junk\n",
            payload.len()
        )
        .as_bytes(),
    );
    let (_, result) = r.result("junk");
    let not_run = result.not_run.unwrap();
    assert_eq!(not_run.reason, NotRunReason::BadProgram);
    assert!(result.session.unwrap().alive);
    assert_eq!(r.call("next", &Program::code("print(2)")).stdout, "2\n");
}

#[test]
fn input_files_are_replaced_by_name_and_output_files_come_back_when_made_or_changed() {
    let mut r = Runner::start();
    let first = [InputFile {
        name: "a.txt".into(),
        content: b"one".to_vec(),
    }];
    let code = "import os\nprint(sorted(os.listdir('inputs')), open('inputs/a.txt').read())\nopen('outputs/made.txt', 'w').write('m')";
    let p1 = Program {
        code,
        inputs: &first,
        outputs: FileCaps::default(),
    };
    let r1 = r.call("c1", &p1);
    assert_eq!(r1.stdout, "['a.txt'] one\n", "{r1:?}");
    assert_eq!(
        r1.files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["made.txt"]
    );
    let second = [
        InputFile {
            name: "a.txt".into(),
            content: b"two".to_vec(),
        },
        InputFile {
            name: "b.txt".into(),
            content: b"b".to_vec(),
        },
    ];
    let p2 = Program {
        code: "import os\nprint(sorted(os.listdir('inputs')), open('inputs/a.txt').read())",
        inputs: &second,
        outputs: FileCaps::default(),
    };
    let r2 = r.call("c2", &p2);
    assert_eq!(r2.stdout, "['a.txt', 'b.txt'] two\n", "{r2:?}");
    // made.txt is unchanged: not returned again.
    assert!(r2.files.is_empty(), "{r2:?}");
    let r3 = r.call(
        "c3",
        &Program::code("open('outputs/made.txt', 'a').write('!')"),
    );
    assert_eq!(
        r3.files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["made.txt"]
    );
}

#[test]
fn a_close_ends_the_runner_and_its_interpreter() {
    let mut r = Runner::start();
    assert_eq!(
        r.call("c", &Program::code("import os\nprint(os.getpid() > 1)"))
            .stdout,
        "True\n"
    );
    let pid = r.child.id();
    let children =
        || std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    assert!(!children().trim().is_empty(), "the interpreter runs");
    r.send(SESSION_CLOSE);
    let status = r.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_timer_a_call_set_does_not_fire_between_calls() {
    let mut r = Runner::start();
    let set = r.call(
        "set",
        &Program::code("import signal\nsignal.alarm(1)\nx = 5"),
    );
    assert_eq!(set.exit_code, 0, "{set:?}");
    std::thread::sleep(std::time::Duration::from_millis(1600));
    let after = r.call("after", &Program::code("print(x)"));
    assert_eq!(after.stdout, "5\n", "{after:?}");
    assert!(after.session.unwrap().alive);
}

#[test]
fn an_interpreter_killed_while_idle_ends_the_next_call_at_once() {
    let mut r = Runner::start();
    assert_eq!(r.call("c", &Program::code("x = 1")).exit_code, 0);
    let pid = r.child.id();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let interpreter: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    // From outside, as the OOM killer or a crash would.
    let killed = Command::new("kill")
        .args(["-9", &interpreter.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    std::thread::sleep(std::time::Duration::from_millis(200));
    let next = r.call("next", &Program::code("print(x)"));
    // Told that it exited, not left to run out its timeout.
    assert!(!next.timed_out, "{next:?}");
    let session = next.session.clone().unwrap();
    assert!(!session.alive, "{next:?}");
    assert_eq!(
        session.ended,
        Some(sandboxrun_core::SessionEnd::InterpreterExited),
        "{next:?}"
    );
}

//! The sandbox runner protocol. The sandbox container runs [`RUNNER_SCRIPT`] with the argv from
//! [`runner_argv`], without any shell, and reads the program from its stdin, framed by
//! [`program_frame`]; the script runs the user code in a child interpreter, captures its stdout
//! and stderr separately (each capped), and prints one JSON envelope line. [`parse_envelope`]
//! recovers the result from the container log. While the code runs, the runner also prints what
//! it writes as output lines ([`parse_output_line`]), which live readers forward to the caller.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::files::{FileCaps, InputFile, OmittedFile, Profile, RunnerFile};
use crate::limits::Limits;

/// The runner program (Python, standard library only), passed to `python3 -c`.
pub const RUNNER_SCRIPT: &str = include_str!("runner.py");

/// The protocol version this crate reads and the runner writes (`"sandboxrun": 1`).
pub const ENVELOPE_VERSION: u64 = 1;

/// The empty file a runner with a PRELOAD creates in its /tmp once it has nothing left to do
/// before its program (its imports done, the code's process forked), and leaves: a pool's sandbox
/// that preloads is ready from then on (its startup probe tests for it), not from its container's
/// start.
pub const IDLE_MARK: &str = "/tmp/.sandboxrun-idle";

/// The command line of a sandbox of `profile`:
/// `python3 -I -S -c RUNNER OUTPUT_BYTES PIDS TIMEOUT_SECONDS [PRELOAD]`.
/// `-I` ignores the environment and the user site, `-S` skips `site` so nothing from the image
/// is imported before the runner; PRELOAD, the profile's
/// [`Profile::preloaded_modules`](crate::Profile::preloaded_modules) comma-separated, is what the
/// runner imports itself before it reads the program (absent for a profile with none). The code
/// is not in it: it goes to stdin ([`program_frame`]), so it never travels in a command line or a
/// Pod spec, and its size is not bounded by the 128 KiB an argv string may hold.
pub fn runner_argv(limits: &Limits, profile: Profile) -> Vec<String> {
    let mut argv = vec![
        "python3".to_owned(),
        "-I".to_owned(),
        "-S".to_owned(),
        "-c".to_owned(),
        RUNNER_SCRIPT.to_owned(),
        limits.output_bytes.to_string(),
        limits.pids.to_string(),
        limits.timeout_seconds.to_string(),
    ];
    let preload = profile.preloaded_modules();
    if !preload.is_empty() {
        argv.push(preload.join(","));
    }
    argv
}

/// What a sandbox runs: the code, the input files placed before it starts, and the caps on the
/// files it may return.
#[derive(Clone, Copy, Debug)]
pub struct Program<'a> {
    /// The Python source.
    pub code: &'a str,
    /// Files placed read-only in [`crate::files::INPUT_DIR`] before the code runs.
    pub inputs: &'a [InputFile],
    /// The bounds on the files returned from [`crate::files::OUTPUT_DIR`].
    pub outputs: FileCaps,
}

impl<'a> Program<'a> {
    /// Code alone: no input files, the default output caps.
    pub fn code(code: &'a str) -> Self {
        Self {
            code,
            inputs: &[],
            outputs: FileCaps::default(),
        }
    }
}

/// What the runner reads from stdin: the header
/// `<code bytes> <timeout seconds> <output bytes> <input bytes> <output files> <output file bytes>\n`,
/// the code, then the input section of `<input bytes>` bytes: per file
/// `<name bytes> <content bytes>\n<name><content>`. The counts let the runner refuse a program cut
/// short (a sender that died mid-write) instead of running a prefix of it. The timeout, the output
/// cap and the file caps are this run's: a sandbox started before its run was known (a warm one)
/// has only its profile's ceilings in its argv, and the runner takes the lower of the two, so a
/// frame can tighten a limit, never loosen it.
pub fn program_frame(program: &Program<'_>, limits: &Limits) -> Vec<u8> {
    let mut inputs = Vec::new();
    for f in program.inputs {
        inputs.extend_from_slice(format!("{} {}\n", f.name.len(), f.content.len()).as_bytes());
        inputs.extend_from_slice(f.name.as_bytes());
        inputs.extend_from_slice(&f.content);
    }
    let caps = program.outputs.clamped();
    let mut frame = format!(
        "{} {} {} {} {} {}\n",
        program.code.len(),
        limits.timeout_seconds,
        limits.output_bytes,
        inputs.len(),
        caps.max_files,
        caps.max_bytes,
    )
    .into_bytes();
    frame.extend_from_slice(program.code.as_bytes());
    frame.extend_from_slice(&inputs);
    frame
}

/// The runner's exit code when stdin did not carry one complete program (no envelope).
pub const NO_PROGRAM_EXIT: i32 = 126;

/// The runner's exit code when it never read its program because the sandbox's network
/// isolation did not come into force (its envelope says so in [`RunnerResult::not_run`]).
pub const ISOLATION_NOT_IN_FORCE_EXIT: i32 = 123;

/// The environment variable that names the canary the runner probes before it reads its program
/// (`<ip>:<port>`, `[<ipv6>]:<port>`): a listener of the operator's that answers anyone, so that
/// only the sandbox's own egress policy can keep the sandbox from reaching it. While it answers,
/// the Pod's deny-all NetworkPolicy is not in force yet, and the code must not run (see
/// runner.py). Set on every sandbox Pod; a sandbox without a route out (gVisor with no network,
/// the embedded sandboxes) never probes it.
pub const CANARY_ENV: &str = "SANDBOXRUN_CANARY";

/// Why the runner did not start the code at all, when it did not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotRun {
    /// The machine-readable reason.
    pub reason: NotRunReason,
    /// What happened, for the model and for people.
    pub message: String,
}

/// The reasons the runner gives for not running the code ([`NotRun`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NotRunReason {
    /// The sandbox could still reach the operator's canary when its time to wait ran out, or
    /// it has a network interface and no canary to prove its isolation with.
    IsolationNotInForce,
    /// A session's call whose program was malformed, or whose input files could not be placed.
    BadProgram,
    /// A session's call that came after the session's interpreter broke its protocol: the
    /// session was ended instead.
    SessionBroken,
    /// A reason this build does not know (a runner from another version).
    #[serde(other)]
    Other,
}

/// The start of the line the runner prints once it has the whole program
/// (`sandboxrun-program-received <bytes>`): the sender's cue to hang up.
pub const PROGRAM_RECEIVED: &str = "sandboxrun-program-received";

/// What the runner reported about one execution of user code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerResult {
    /// Protocol version, always [`ENVELOPE_VERSION`].
    #[serde(rename = "sandboxrun")]
    pub version: u64,
    /// The child's exit code, or 128 + signal number when a signal killed it.
    pub exit_code: i32,
    /// The kept prefix of the child's stdout.
    pub stdout: String,
    /// The kept prefix of the child's stderr.
    pub stderr: String,
    /// Whether stdout was longer than the cap.
    pub stdout_truncated: bool,
    /// Whether stderr was longer than the cap.
    pub stderr_truncated: bool,
    /// The signal that killed the child, if one did.
    pub signal: Option<i32>,
    /// For a SIGKILLed child: whether the memory cgroup recorded an OOM kill (None: unknown).
    #[serde(default)]
    pub oom_kill: Option<bool>,
    /// Whether the runner killed the child for exceeding its timeout.
    #[serde(default)]
    pub timed_out: bool,
    /// Wall-clock run time of the code in milliseconds, measured by the runner.
    #[serde(default)]
    pub duration_millis: Option<u64>,
    /// The files the code wrote in [`crate::files::OUTPUT_DIR`], within the run's caps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<RunnerFile>,
    /// The files it wrote there that were left out, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_omitted: Vec<OmittedFile>,
    /// Set when the runner never started the code, and why: the other fields then describe no
    /// run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_run: Option<NotRun>,
    /// A session's call: the name the call was sent with ([`session_frame`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    /// A session's call: whether the session goes on after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionState>,
}

/// What a session's runner says of its session after a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionState {
    /// Whether the session goes on (its interpreter waits for the next call).
    pub alive: bool,
    /// Why it ended, when it did.
    #[serde(default)]
    pub ended: Option<SessionEnd>,
    /// What happened, for the model and for people.
    #[serde(default)]
    pub message: Option<String>,
}

/// Why a session's runner ended its session during or after a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SessionEnd {
    /// The call ran past its timeout: the interpreter was killed with it.
    TimedOut,
    /// The interpreter exited or was killed during the call (`os._exit`, a signal, the OOM
    /// killer).
    InterpreterExited,
    /// The interpreter broke the runner's protocol (a message out of turn, output it kept open,
    /// a fork it did not report, processes that could not be stopped).
    ProtocolBroken,
    /// A reason this build does not know (a runner from another version).
    #[serde(other)]
    Other,
}

impl SessionEnd {
    /// The reason's name, as the runner writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionEnd::TimedOut => "timedOut",
            SessionEnd::InterpreterExited => "interpreterExited",
            SessionEnd::ProtocolBroken => "protocolBroken",
            SessionEnd::Other => "other",
        }
    }
}

/// What a model reads when a session's runner ended the session (`reason`, `message`: its
/// envelope's [`SessionState`]).
pub fn session_ended_message(reason: Option<SessionEnd>, message: Option<&str>) -> String {
    match (reason, message) {
        (_, Some(message)) => message.to_owned(),
        (Some(reason), None) => format!("the session ended ({})", reason.as_str()),
        (None, None) => "the session ended".to_owned(),
    }
}

/// The argument that starts the runner as a session's ([`session_argv`]).
pub const SESSION_FLAG: &str = "--session";

/// What only a session's runner needs (runner_session.py), appended to [`RUNNER_SCRIPT`] by
/// [`session_script`].
const SESSION_PART: &str = include_str!("runner_session.py");

/// The program a session's sandbox runs: [`RUNNER_SCRIPT`] without its closing `__main__` block,
/// then runner_session.py (whose own block starts the session). A single run's sandbox carries,
/// and compiles, only runner.py.
pub fn session_script() -> &'static str {
    static SCRIPT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let body = RUNNER_SCRIPT
            .rfind("\nif __name__ == \"__main__\":")
            .map_or(RUNNER_SCRIPT, |end| &RUNNER_SCRIPT[..end]);
        format!("{body}\n\n{SESSION_PART}")
    });
    &SCRIPT
}

/// The command line of a session's sandbox: [`runner_argv`] with [`session_script`] as the
/// program and [`SESSION_FLAG`] before the limits. Such a runner keeps one interpreter and runs
/// calls in it, one at a time, each sent by [`session_frame`], until its stdin ends or carries
/// [`SESSION_CLOSE`]; each call's envelope carries [`RunnerResult::call`] and
/// [`RunnerResult::session`] (see runner_session.py).
pub fn session_argv(limits: &Limits, profile: Profile) -> Vec<String> {
    let mut argv = runner_argv(limits, profile);
    session_script().clone_into(&mut argv[4]);
    argv.insert(5, SESSION_FLAG.to_owned());
    argv
}

/// Where a sandbox Pod finds its runner: a volume of the operator's ConfigMap
/// ([`pod_runner_config_map`]), mounted read-only.
pub const POD_RUNNER_DIR: &str = "/opt/sandboxrun";

/// The file of [`POD_RUNNER_DIR`] a single run's sandbox runs ([`RUNNER_SCRIPT`]).
const POD_RUNNER_FILE: &str = "runner.py";
/// The file of [`POD_RUNNER_DIR`] a session's sandbox runs ([`session_script`]).
const POD_SESSION_FILE: &str = "session.py";

/// The files of [`POD_RUNNER_DIR`]: (name, source).
pub fn pod_runner_files() -> [(&'static str, &'static str); 2] {
    [
        (POD_RUNNER_FILE, RUNNER_SCRIPT),
        (POD_SESSION_FILE, session_script()),
    ]
}

/// The name of the ConfigMap that holds [`pod_runner_files`], the same in every namespace:
/// `sandboxrun-runner-` and the start of the files' SHA-256. Named by its content, it is never
/// changed, only made: an operator of another version makes its own beside it, and the Pods of
/// each keep reading the files they were made for.
pub fn pod_runner_config_map() -> &'static str {
    static NAME: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        for (name, source) in pod_runner_files() {
            hash.update(format!("{name}\0{}\0", source.len()));
            hash.update(source);
        }
        format!("sandboxrun-runner-{}", &hex::encode(hash.finalize())[..16])
    });
    &NAME
}

/// [`runner_argv`] for a Pod: the program is a loader of [`POD_RUNNER_DIR`]'s runner.py
/// ([`loader`]). A Pod's spec carries its command line, and every write and watch event of the
/// Pod carries its spec (the idle Pods of a pool, claimed, replaced, started and deleted, pass
/// through the API server, etcd, the kubelet, the scheduler and every watch of Pods): with the
/// runner's 53 KB of source in it, even packed, a Pod was 27 KB of JSON; with the loader, a few.
pub fn pod_runner_argv(limits: &Limits, profile: Profile) -> Vec<String> {
    static LOADER: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| loader(POD_RUNNER_DIR, POD_RUNNER_FILE, RUNNER_SCRIPT));
    let mut argv = runner_argv(limits, profile);
    argv[4].clone_from(&LOADER);
    argv
}

/// [`session_argv`] for a Pod: a loader of [`POD_RUNNER_DIR`]'s session.py
/// ([`pod_runner_argv`]).
pub fn pod_session_argv(limits: &Limits, profile: Profile) -> Vec<String> {
    static LOADER: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| loader(POD_RUNNER_DIR, POD_SESSION_FILE, session_script()));
    let mut argv = session_argv(limits, profile);
    argv[4].clone_from(&LOADER);
    argv
}

/// A `python3 -c` program that runs `dir/file` only if its SHA-256 is that of `source`: the same
/// code in the same `__main__` namespace with the same `sys.argv`. The file comes from a
/// ConfigMap, which whoever may write ConfigMaps in the namespace could replace; the hash comes
/// from the Pod's spec, which only the operator writes. So a runner that is not the operator's
/// never runs: the sandbox exits at once, saying so, before it reads a program. The hash is
/// CPython's built-in `_sha2` (3.12 and later) or `_sha256` (before), 0.2 ms to import;
/// `hashlib` (OpenSSL, 7-15 ms) only where neither is built in.
fn loader(dir: &str, file: &str, source: &str) -> String {
    use sha2::Digest as _;
    let path = format!("{dir}/{file}");
    let hash = hex::encode(sha2::Sha256::digest(source));
    format!(
        "import sys\n\
         try:from _sha2 import sha256\n\
         except ImportError:\n \
         try:from _sha256 import sha256\n \
         except ImportError:from hashlib import sha256\n\
         with open('{path}','rb') as f:b=f.read()\n\
         if sha256(b).hexdigest()!='{hash}':sys.exit('sandboxrun: {path} is not the runner \
         this sandbox was made for')\n\
         c=compile(b,'{path}','exec')\n\
         del b,f,sha256\n\
         exec(c)\n"
    )
}

/// Most bytes of a call's name ([`valid_call_name`]).
pub const MAX_CALL_NAME_BYTES: usize = 128;

/// Whether `name` can name a session's call: 1 to 128 of ASCII letters, digits, '.', '_', '-'.
pub fn valid_call_name(name: &str) -> bool {
    (1..=MAX_CALL_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// One call for a session's runner: the [`program_frame`] in base64 lines between a header that
/// names the call and announces the payload's size, and an end line that names it again. The
/// leading newline ends whatever line an earlier writer left cut short, so a frame cut short by
/// a sender that died is dropped by the runner, never joined to the next one. `call` must be a
/// [`valid_call_name`].
pub fn session_frame(call: &str, program: &Program<'_>, limits: &Limits) -> Vec<u8> {
    use base64::Engine as _;
    debug_assert!(valid_call_name(call));
    let payload = program_frame(program, limits);
    let encoded = base64::engine::general_purpose::STANDARD.encode(&payload);
    let mut frame = format!("\nsandboxrun-call {call} {}\n", payload.len()).into_bytes();
    // Lines well under the runner's MAX_FRAME_LINE (64 KiB); base64 is ASCII, so any cut is a
    // character boundary.
    for line in encoded.as_bytes().chunks(16 * 1024) {
        frame.extend_from_slice(line);
        frame.push(b'\n');
    }
    frame.extend_from_slice(format!("sandboxrun-end {call}\n").as_bytes());
    frame
}

/// What ends a session: its runner kills its interpreter and exits.
pub const SESSION_CLOSE: &[u8] = b"\nsandboxrun-close\n";

impl RunnerResult {
    /// Whether either stream was cut.
    pub fn truncated(&self) -> bool {
        self.stdout_truncated || self.stderr_truncated
    }
}

/// What the platform running a sandbox (the kubelet, or the local driver) saw of its end,
/// besides the runner's envelope. Together with the envelope it is everything
/// `tools::python::classify` needs to say how a run ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The platform's word on an OOM kill: the kubelet's `OOMKilled` termination reason, or the
    /// local run's memory cgroup counter. `None`: the platform cannot tell.
    pub oom_killed: Option<bool>,
    /// The platform stopped the sandbox at its deadline (the local driver's own deadline; the
    /// kubelet's `activeDeadlineSeconds` is handled before any log is read).
    pub deadline_hit: bool,
    /// The run's cgroup refused a fork at its pid limit.
    pub pids_limit_hit: bool,
    /// Exit status of the sandbox itself (container or engine process): 128 + signal when a
    /// signal ended it.
    pub exit_code: Option<i32>,
    /// The platform's own termination reason (`Completed`, `Error`, ...), when it gives one.
    pub platform_reason: Option<String>,
    /// Why the envelope could not be read, when it could not (see [`EnvelopeError`]).
    pub envelope_error: Option<String>,
    /// The last output of the sandbox outside the envelope (engine stderr, the log's tail),
    /// quoted when there is no result.
    pub detail: String,
}

/// Why no result could be read from a container log.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvelopeError {
    /// No line of the log is a runner envelope: the runner never finished (killed, crashed, or
    /// the log was cut).
    #[error("the sandbox log holds no result envelope (the runner did not finish)")]
    Missing,
    /// The last envelope speaks a protocol version this build does not know.
    #[error("the sandbox reported result protocol version {0}, this operator reads version 1")]
    UnsupportedVersion(u64),
}

/// Which stream a piece of output came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// The code's standard output.
    Stdout,
    /// The code's standard error.
    Stderr,
}

impl Stream {
    /// `stdout` or `stderr`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Output the code printed while it ran, as the runner reported it (within the stream's cap).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct OutputChunk {
    /// Where it was printed.
    pub stream: Stream,
    /// What was printed since the previous chunk of this stream.
    #[serde(rename = "data")]
    pub text: String,
}

/// Receives a run's output while it runs (never after its result).
pub type OutputFn = Arc<dyn Fn(OutputChunk) + Send + Sync>;

/// The version of the runner's output lines (`"sandboxrunOutput": 1`).
pub const OUTPUT_LINE_VERSION: u64 = 1;

/// Most output lines the runner prints in a run (`LIVE_MAX_LINES` in runner.py).
pub const MAX_OUTPUT_LINES: u64 = 2000;

/// Most bytes the output lines add to a sandbox's log: both streams' capped output, each byte
/// escaped to at most six, and each line's framing.
pub fn output_lines_max_bytes(limits: &Limits) -> u64 {
    12 * u64::from(limits.output_bytes) + MAX_OUTPUT_LINES * 64
}

/// The output chunk in one log line, if the line is one of the runner's output lines. Only the
/// runner writes the log (the code cannot reach the runner's stdout), so a chunk is genuine.
pub fn parse_output_line(line: &str) -> Option<OutputChunk> {
    #[derive(Deserialize)]
    struct Line {
        #[serde(rename = "sandboxrunOutput")]
        version: u64,
        #[serde(flatten)]
        chunk: OutputChunk,
    }
    let line = line.trim();
    if !line.starts_with("{\"sandboxrunOutput\"") {
        return None;
    }
    let parsed: Line = serde_json::from_str(line).ok()?;
    (parsed.version == OUTPUT_LINE_VERSION).then_some(parsed.chunk)
}

/// Only the version field, to tell an envelope of another version from a line that is no
/// envelope at all.
#[derive(Deserialize)]
struct VersionProbe {
    sandboxrun: u64,
}

/// Reads the result from a container log: the LAST line that parses as an envelope. User code
/// can print envelope-looking lines into the log, but the runner prints its own last, after every
/// other process in the sandbox is dead (see runner.py).
pub fn parse_envelope(log: &str) -> Result<RunnerResult, EnvelopeError> {
    for line in log.lines().rev() {
        let line = line.trim();
        if !line.starts_with('{') {
            continue;
        }
        let Ok(probe) = serde_json::from_str::<VersionProbe>(line) else {
            continue;
        };
        if probe.sandboxrun != ENVELOPE_VERSION {
            return Err(EnvelopeError::UnsupportedVersion(probe.sandboxrun));
        }
        if let Ok(result) = serde_json::from_str::<RunnerResult>(line) {
            return Ok(result);
        }
    }
    Err(EnvelopeError::Missing)
}

/// Reads the result of a session's call `call` from its runner's output: the last envelope line
/// that names it. (The code cannot print an envelope: its output reaches the runner's stdout only
/// inside the runner's own lines, see runner.py.)
pub fn parse_call_envelope(log: &str, call: &str) -> Result<RunnerResult, EnvelopeError> {
    for line in log.lines().rev() {
        let line = line.trim();
        if !line.starts_with("{\"sandboxrun\"") {
            continue;
        }
        if let Ok(result) = parse_envelope(line)
            && result.call.as_deref() == Some(call)
        {
            return Ok(result);
        }
    }
    Err(EnvelopeError::Missing)
}

/// Results as the runner and the platforms report them, for the tests of every crate that
/// classifies them (the one table in core, the operator's adapter): one definition, so the
/// tables cannot drift apart.
#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures {
    use super::{Observed, RunnerResult};

    /// An envelope of code that exited with `exit_code`, printing `out` and `err`.
    pub fn envelope(exit_code: i32) -> RunnerResult {
        RunnerResult {
            version: 1,
            exit_code,
            stdout: "out\n".into(),
            stderr: "err\n".into(),
            stdout_truncated: false,
            stderr_truncated: false,
            signal: None,
            oom_kill: None,
            timed_out: false,
            duration_millis: Some(7),
            files: Vec::new(),
            files_omitted: Vec::new(),
            not_run: None,
            call: None,
            session: None,
        }
    }

    /// An envelope of code killed by `signal`; `oom_kill` is what the memory cgroup said.
    pub fn killed(signal: i32, oom_kill: Option<bool>) -> RunnerResult {
        RunnerResult {
            signal: Some(signal),
            oom_kill,
            ..envelope(128 + signal)
        }
    }

    /// What the kubelet tells of a container that ended with `reason` and `exit_code`: an
    /// `OOMKilled` reason is evidence of an OOM kill, any other reason no evidence either way
    /// (the runner may survive a child's OOM kill; under gVisor the sandbox's own OOM killer
    /// leaves the host cgroup, and so the kubelet, none the wiser).
    pub fn kubelet(reason: &str, exit_code: i32) -> Observed {
        Observed {
            oom_killed: (reason == "OOMKilled").then_some(true),
            exit_code: Some(exit_code),
            platform_reason: Some(reason.to_owned()),
            ..Observed::default()
        }
    }

    /// What the local driver tells: its cgroup's OOM counter (`None` without cgroups), its own
    /// deadline, and the engine's exit.
    pub fn local(oom: Option<bool>, deadline_hit: bool, exit_code: i32) -> Observed {
        Observed {
            oom_killed: oom,
            deadline_hit,
            exit_code: Some(exit_code),
            ..Observed::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runners_fit_in_one_argv_string_with_room() {
        // `python3 -c RUNNER`: one argv string, at most 128 KiB (MAX_ARG_STRLEN), or the
        // sandbox's exec fails with E2BIG.
        for script in [RUNNER_SCRIPT, session_script()] {
            assert!(script.len() < 120 * 1024, "{} bytes", script.len());
        }
        let session = session_argv(&Limits::default(), Profile::Minimal);
        assert_eq!(session[4], session_script());
        assert_eq!(session[5], SESSION_FLAG);
        assert!(session_script().starts_with(RUNNER_SCRIPT.split("\nif __name__").next().unwrap()));
        assert_eq!(
            session_script()
                .matches("\nif __name__ == \"__main__\":")
                .count(),
            1
        );
    }

    #[test]
    fn a_pods_runner_is_loaded_from_its_files_by_hash() {
        let limits = Limits::default();
        let files = pod_runner_files();
        for (pod, plain, (file, source)) in [
            (
                pod_runner_argv(&limits, Profile::Data),
                runner_argv(&limits, Profile::Data),
                files[0],
            ),
            (
                pod_session_argv(&limits, Profile::Minimal),
                session_argv(&limits, Profile::Minimal),
                files[1],
            ),
        ] {
            // Only the program differs: a loader of the file, bound to its source's hash.
            assert_eq!(pod[..4], plain[..4]);
            assert_eq!(pod[5..], plain[5..]);
            assert_eq!(source, plain[4]);
            assert!(pod[4].len() < 600, "{}", pod[4]);
            assert!(pod[4].contains(&format!("'{POD_RUNNER_DIR}/{file}'")));
            use sha2::Digest as _;
            assert!(pod[4].contains(&hex::encode(sha2::Sha256::digest(source))));
        }
        let name = pod_runner_config_map();
        assert!(
            name.starts_with("sandboxrun-runner-") && name.len() == 34,
            "{name}"
        );
    }

    /// Runs `loader(dir, "r.py", expected)` with `dir/r.py` holding `actual`.
    fn load(expected: &str, actual: &str) -> std::process::Output {
        let dir = std::env::temp_dir().join(format!(
            "sandboxrun-loader-{}-{}",
            std::process::id(),
            actual.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("r.py"), actual).unwrap();
        let program = loader(dir.to_str().unwrap(), "r.py", expected);
        let out = std::process::Command::new("python3")
            .args(["-I", "-S", "-c", &program, "7", "x"])
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        out
    }

    #[test]
    fn a_loaded_runner_runs_as_main_with_its_arguments() {
        let script = "import sys\nprint(__name__, sys.argv[1:], 'caf\u{e9}', sorted(k for k in \
                      globals() if not k.startswith('__')))\n";
        let out = load(script, script);
        assert!(out.status.success(), "{out:?}");
        // The loader leaves only the module it needs and the compiled runner behind.
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "__main__ ['7', 'x'] caf\u{e9} ['c', 'sys']\n"
        );
    }

    #[test]
    fn a_runner_file_that_is_not_the_operators_never_runs() {
        let script = "print('ran')\n";
        for other in ["print('evil')\n", "print('ran')\n\n", "", "print('ran')"] {
            let out = load(script, other);
            assert_eq!(out.status.code(), Some(1), "{other:?}: {out:?}");
            assert!(out.stdout.is_empty(), "{other:?}: {out:?}");
            let stderr = String::from_utf8(out.stderr).unwrap();
            assert!(
                stderr.contains("is not the runner this sandbox was made for"),
                "{stderr}"
            );
        }
    }

    #[test]
    fn a_session_frame_names_its_call_and_carries_the_program_in_base64_lines() {
        use base64::Engine as _;
        let limits = Limits::default();
        let program = Program::code("print(1)");
        let frame = session_frame("c-1", &program, &limits);
        let text = String::from_utf8(frame).unwrap();
        let lines: Vec<&str> = text.split('\n').collect();
        let payload = program_frame(&program, &limits);
        assert_eq!(lines[0], "", "a frame starts on a fresh line");
        assert_eq!(lines[1], format!("sandboxrun-call c-1 {}", payload.len()));
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(lines[2])
                .unwrap(),
            payload
        );
        assert_eq!(lines[3], "sandboxrun-end c-1");
        assert!(valid_call_name("local-0123abc_x.y"));
        assert!(
            !valid_call_name("a b") && !valid_call_name("") && !valid_call_name(&"a".repeat(129))
        );
    }

    #[test]
    fn a_calls_envelope_is_the_one_that_names_it() {
        let line = |call: &str, out: &str| {
            format!(
                r#"{{"sandboxrun":1,"exitCode":0,"stdout":"{out}","stderr":"","stdoutTruncated":false,"stderrTruncated":false,"signal":null,"timedOut":false,"call":"{call}","session":{{"alive":true,"ended":null,"message":null}}}}"#
            )
        };
        let log = format!("{}\n{}\nnoise\n", line("a", "first"), line("b", "second"));
        assert_eq!(parse_call_envelope(&log, "a").unwrap().stdout, "first");
        let b = parse_call_envelope(&log, "b").unwrap();
        assert_eq!(b.stdout, "second");
        assert!(b.session.unwrap().alive);
        assert!(parse_call_envelope(&log, "c").is_err());
    }

    const OK: &str = r#"{"sandboxrun":1,"exitCode":0,"stdout":"hi\n","stderr":"","stdoutTruncated":false,"stderrTruncated":false,"signal":null,"oomKill":null}"#;

    #[test]
    fn parses_a_lone_envelope() {
        let r = parse_envelope(&format!("\n{OK}\n")).unwrap();
        assert_eq!(r.exit_code, 0);
        assert_eq!(r.stdout, "hi\n");
        assert_eq!(r.signal, None);
        assert!(!r.truncated());
    }

    #[test]
    fn takes_the_last_envelope() {
        let forged = OK.replace(r#""exitCode":0"#, r#""exitCode":42"#);
        let log = format!("{forged}\nnoise\n{{\"partial\n{OK}\n");
        assert_eq!(parse_envelope(&log).unwrap().exit_code, 0);
    }

    #[test]
    fn skips_lines_that_are_not_envelopes() {
        let log = format!("{OK}\n{{\"other\":1}}\n{{not json\nplain text");
        assert_eq!(parse_envelope(&log).unwrap().stdout, "hi\n");
    }

    #[test]
    fn output_lines_are_read_and_never_taken_for_the_envelope() {
        let chunk = r#"{"sandboxrunOutput":1,"stream":"stderr","data":"tick \u00e9\n"}"#;
        assert_eq!(
            parse_output_line(chunk),
            Some(OutputChunk {
                stream: Stream::Stderr,
                text: "tick é\n".into()
            })
        );
        for not in [
            OK,
            "sandboxrun-program-received 8",
            r#"{"sandboxrunOutput":2,"stream":"stdout","data":"x"}"#,
            r#"{"sandboxrunOutput":1,"stream":"stdin","data":"x"}"#,
            r#"{"sandboxrunOutput":1,"stream":"stdout"}"#,
        ] {
            assert_eq!(parse_output_line(not), None, "{not}");
        }
        // A log with output lines after the envelope's start still yields the envelope.
        let log = format!("{chunk}\n\n{OK}\n");
        assert_eq!(parse_envelope(&log).unwrap().stdout, "hi\n");
        assert_eq!(parse_envelope(chunk), Err(EnvelopeError::Missing));
    }

    #[test]
    fn missing_envelope_is_an_error() {
        assert_eq!(parse_envelope(""), Err(EnvelopeError::Missing));
        assert_eq!(
            parse_envelope("Traceback (most recent call last):\nMemoryError\n"),
            Err(EnvelopeError::Missing)
        );
        // A cut envelope (log read with a byte limit) does not parse.
        assert_eq!(parse_envelope(&OK[..40]), Err(EnvelopeError::Missing));
    }

    #[test]
    fn unknown_version_is_reported() {
        let v2 = OK.replace(r#""sandboxrun":1"#, r#""sandboxrun":2"#);
        assert_eq!(
            parse_envelope(&v2),
            Err(EnvelopeError::UnsupportedVersion(2))
        );
    }

    #[test]
    fn oom_kill_field_is_optional() {
        let line = r#"{"sandboxrun":1,"exitCode":137,"stdout":"","stderr":"","stdoutTruncated":false,"stderrTruncated":true,"signal":9}"#;
        let r = parse_envelope(line).unwrap();
        assert_eq!(r.signal, Some(9));
        assert_eq!(r.oom_kill, None);
        assert!(r.truncated());
    }

    #[test]
    fn argv_has_no_shell_and_carries_the_limits() {
        let limits = Limits {
            output_bytes: 123,
            pids: 7,
            timeout_seconds: 9,
            ..Limits::default()
        };
        let argv = runner_argv(&limits, Profile::Minimal);
        assert_eq!(argv[..4], ["python3", "-I", "-S", "-c"]);
        assert_eq!(argv[4], RUNNER_SCRIPT);
        assert_eq!(argv[5..], ["123", "7", "9"]);
        // The data profile's libraries follow, for the runner to import while it waits.
        let argv = runner_argv(&limits, Profile::Data);
        assert_eq!(
            argv[5..],
            [
                "123",
                "7",
                "9",
                "numpy,pandas,matplotlib,matplotlib.pyplot,scipy"
            ]
        );
    }

    #[test]
    fn the_frame_counts_bytes_not_characters() {
        let limits = Limits {
            timeout_seconds: 7,
            output_bytes: 100,
            ..Limits::default()
        };
        assert_eq!(
            program_frame(&Program::code("print(1)"), &limits),
            b"8 7 100 0 20 393216\nprint(1)"
        );
        assert_eq!(
            program_frame(&Program::code("é"), &limits),
            "2 7 100 0 20 393216\né".as_bytes()
        );
        assert_eq!(
            program_frame(&Program::code(""), &limits),
            b"0 7 100 0 20 393216\n"
        );
        let inputs = [InputFile {
            name: "a.csv".into(),
            content: b"x,y\n".to_vec(),
        }];
        let program = Program {
            code: "pass",
            inputs: &inputs,
            outputs: FileCaps {
                max_files: 3,
                max_bytes: u64::MAX,
            },
        };
        assert_eq!(
            program_frame(&program, &limits),
            b"4 7 100 13 3 393216\npass5 4\na.csvx,y\n"
        );
    }
}

//! Shared set-up of the agent tests: the scripted model server, running the real
//! `sandboxrun-agent` binary against it, and the requirements (local sandbox, PostgreSQL).
//!
//! The agent starts the embedded `sandboxrun-mcp` it finds next to itself (target/debug), which
//! needs a working local sandbox (bubblewrap or gVisor and the sandbox-python root file system).
//! Without one, those tests are skipped with a note, unless `SANDBOXRUN_REQUIRE_ENGINES` is set
//! (CI), where they fail. PostgreSQL tests likewise read `SANDBOXRUN_TEST_POSTGRES_URL` /
//! `SANDBOXRUN_TEST_POSTGRES_STATE_URL` and fail when `SANDBOXRUN_REQUIRE_POSTGRES=1`.

#![allow(dead_code)]

pub mod scripted_model;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

pub use scripted_model::{API_KEY, Reply, ScriptedModel};

/// The agent binary under test.
pub const AGENT: &str = env!("CARGO_BIN_EXE_sandboxrun-agent");

/// The embedded server the agent starts by default: `sandboxrun-mcp` next to it.
pub fn mcp_binary() -> PathBuf {
    let path = Path::new(AGENT).with_file_name("sandboxrun-mcp");
    assert!(
        path.is_file(),
        "{} is missing: build it first (cargo build -p sandboxrun-mcp)",
        path.display()
    );
    path
}

/// Whether the embedded server's local sandbox works here (skips with a note otherwise, or
/// fails under `SANDBOXRUN_REQUIRE_ENGINES`).
pub async fn sandbox_available() -> bool {
    mcp_binary();
    let mut config = sandboxrun_core::LocalSandboxConfig::default();
    if let Some(rootfs) = std::env::var_os("SANDBOXRUN_ROOTFS") {
        config.rootfs = rootfs.into();
    }
    match sandboxrun_core::LocalSandbox::detect(config).await {
        Ok(_) => true,
        Err(e) => {
            let required = std::env::var("SANDBOXRUN_REQUIRE_ENGINES").unwrap_or_default();
            assert!(
                required.trim().is_empty(),
                "SANDBOXRUN_REQUIRE_ENGINES={required} but the local sandbox does not work: {e}"
            );
            eprintln!("note: skipping: the local sandbox does not work here: {e}");
            false
        }
    }
}

/// A PostgreSQL URL from the environment, or a skip note (a failure under
/// `SANDBOXRUN_REQUIRE_POSTGRES=1`).
pub fn postgres_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Some(url.trim().to_owned()),
        _ => {
            assert!(
                std::env::var("SANDBOXRUN_REQUIRE_POSTGRES").as_deref() != Ok("1"),
                "SANDBOXRUN_REQUIRE_POSTGRES=1 but {var} is not set: run e2e/postgres/start.sh \
                 and export the URLs it prints"
            );
            eprintln!("note: skipping PostgreSQL test: {var} is not set (e2e/postgres/start.sh)");
            None
        }
    }
}

/// A fresh directory for one test, removed with everything in it when the test is done with it
/// (a test that fails leaves nothing behind either: the value is dropped as the panic unwinds).
pub fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!(
        "sandboxrun-agent-test-{name}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// See [`temp_dir`].
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A finished agent run.
#[derive(Debug)]
pub struct Output {
    /// The exit code.
    pub code: Option<i32>,
    /// Everything on stdout.
    pub stdout: String,
    /// Everything on stderr.
    pub stderr: String,
}

impl Output {
    /// The `--json` transcript.
    pub fn transcript(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not a JSON transcript ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// Asserts exit code 0 and returns self.
    pub fn success(self) -> Self {
        assert_eq!(
            self.code,
            Some(0),
            "the agent failed:\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// The agent, set up to talk to `model` with a private data directory `home` (so the default
/// thread store never touches the real one).
pub fn agent(model_base_url: &str, home: &Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(AGENT);
    for var in [
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "OPENAI_MODEL",
        "SANDBOXRUN_MCP_URL",
        "SANDBOXRUN_MCP_BIN",
        "SANDBOXRUN_API_KEY",
        "SANDBOXRUN_AGENT_STATE_URL",
        "SANDBOXRUN_AGENT_FILES_DIR",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
    command
        .env("OPENAI_API_KEY", API_KEY)
        .env("OPENAI_BASE_URL", model_base_url)
        .env("XDG_DATA_HOME", home.join("data"))
        .args(["--model", "scripted-model"])
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs the command to its end (at most two minutes).
pub async fn run(mut command: tokio::process::Command) -> Output {
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the agent did not finish within 120 s")
        .expect("the agent starts");
    Output {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The text of a tool result as the frontend returns it for run_python: its structured JSON
/// (possibly after a sentence for the model). Returns the `stdout` field.
pub fn stdout_of(tool_result: &str) -> String {
    let start = tool_result
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in the tool result: {tool_result}"));
    let value: Value = serde_json::Deserializer::from_str(&tool_result[start..])
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("no JSON in the tool result: {tool_result}"));
    value["stdout"].as_str().unwrap_or_default().to_owned()
}

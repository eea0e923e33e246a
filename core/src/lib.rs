//! sandboxrun-core: what a sandboxrun tool call means and how its output is handled, independent
//! of Kubernetes and MCP. The API crate, the operator and the frontend build on these types, so
//! defaults, maxima and the sandbox runner protocol have exactly one definition.

pub mod agent_name;
pub mod files;
pub mod limits;
// The local sandbox driver is the one place that needs unsafe code: system calls between fork
// and exec (rlimits, joining a cgroup), signalling its own process group, geteuid.
#[allow(unsafe_code)]
pub mod local;
pub mod metrics;
pub mod model;
pub mod output;
pub mod policy;
pub mod quantity;
pub mod query;
pub mod runner;
pub mod schema;
pub mod sql;
pub mod tools;

pub use agent_name::{AGENT_NAME_PATTERN, MAX_AGENT_NAME_LEN, validate_agent_name};
pub use files::{FileCaps, InputFile, OutputFile, Profile};
pub use limits::Limits;
pub use local::{
    Isolation, LocalRun, LocalSandbox, LocalSandboxConfig, LocalSandboxError, LocalSession,
    Preference, SessionCall,
};
pub use model::{Environment, Phase, Reason, Tool, Verdict};
pub use output::{Capped, cap_bytes, cap_str};
pub use policy::{CallContext, Decision, Policy, PolicyError, PolicyStore, SqlRequest};
pub use query::{
    DatabaseConfig, Databases, DatabasesFileError, QueryError, QueryLimits, QueryResult,
    load_databases_file, redact_url,
};
pub use runner::{
    CANARY_ENV, EnvelopeError, IDLE_MARK, NO_PROGRAM_EXIT, NotRun, NotRunReason, Observed,
    OutputChunk, OutputFn, PROGRAM_RECEIVED, Program, RUNNER_SCRIPT, RunnerResult, SESSION_CLOSE,
    SESSION_FLAG, SessionEnd, SessionState, Stream, parse_call_envelope, parse_envelope,
    parse_output_line, pod_runner_argv, pod_session_argv, program_frame, runner_argv, session_argv,
    session_frame, valid_call_name,
};
pub use sql::{
    Columns, GuardViolation, GuardedQuery, SqlDialect, SqlRules, TableRule, ViolationKind, guard,
};

//! Each tool as a SandboxRun: [`ClusterTool`] maps a validated call to the resource's spec and
//! reads the call's typed output back from the run's status. One impl per tool; the frontend's
//! cluster backend is generic over the trait and knows no tool.

use std::time::Duration;

use sandboxrun_core::files::{OmitReason, OmittedFile, Profile, printable_name};
use sandboxrun_core::limits::DEFAULT_TTL_SECONDS_AFTER_FINISHED;
use sandboxrun_core::metrics::{MetricsQuery, MetricsResult, QueryTime};
use sandboxrun_core::tools::ToolSpec;
use sandboxrun_core::tools::metrics::{FetchMetrics, MetricsCall, MetricsOutput};
use sandboxrun_core::tools::python::{PythonCall, PythonOutput, RunPython};
use sandboxrun_core::tools::python_session::{NEW_SESSION, SessionArg};
use sandboxrun_core::tools::sql::{ExecuteSql, ExecuteSqlArgs, SqlOutput, SqlResult};
use sandboxrun_core::tools::sql_schema::{self, SchemaArgs, SchemaOutput, SchemaResult, SqlSchema};
use sandboxrun_core::{Environment, Limits, Phase, Verdict};

use crate::{
    LimitsSpec, MetricsRange, MetricsSpec, PythonSpec, SandboxRunSpec, SandboxRunStatus, SqlSpec,
};

/// A tool that runs as a SandboxRun.
pub trait ClusterTool: ToolSpec {
    /// The spec of the run for `agent`'s `call`.
    fn spec(agent: &str, call: &Self::Call) -> SandboxRunSpec;

    /// The call's output from the run's status: `None` until the run is terminal (or, for
    /// governed tools, awaits approval).
    fn output(name: &str, status: &SandboxRunStatus, call: &Self::Call) -> Option<Self::Output>;
}

/// A spec with every field but the tool's own at its default.
fn spec(agent: &str, environment: Environment, limits: Limits) -> SandboxRunSpec {
    SandboxRunSpec {
        agent: agent.to_owned(),
        environment,
        python: None,
        sql: None,
        metrics: None,
        limits: LimitsSpec::from(limits),
        ttl_seconds_after_finished: DEFAULT_TTL_SECONDS_AFTER_FINISHED,
        approval: None,
        cancelled: false,
    }
}

fn duration_ms(status: &SandboxRunStatus) -> u64 {
    status
        .duration_millis
        .and_then(|d| u64::try_from(d).ok())
        .unwrap_or(0)
}

/// Phase of a governed run once it has something to say: terminal, or awaiting approval.
fn governed_phase(status: &SandboxRunStatus) -> Option<Phase> {
    let phase = status.phase?;
    (phase.is_terminal() || phase == Phase::AwaitingApproval).then_some(phase)
}

/// Verdict, rule and reason recorded in the status (an old run without a decision: allowed).
fn decision(status: &SandboxRunStatus) -> (Verdict, String, String) {
    match &status.decision {
        Some(d) => (d.verdict, d.rule.clone(), d.reason.clone()),
        None => (Verdict::Allow, String::new(), String::new()),
    }
}

/// The message of a result the operator wrote that this build cannot read.
fn unreadable(e: &serde_json::Error) -> String {
    format!(
        "the operator wrote a result this frontend cannot read ({e}); check that the operator and \
         the frontend are the same version"
    )
}

impl ClusterTool for RunPython {
    fn spec(agent: &str, call: &PythonCall) -> SandboxRunSpec {
        SandboxRunSpec {
            python: Some(PythonSpec {
                code: call.code.clone(),
                // Absent for the default: a minimal run's spec is what it always was.
                profile: Some(call.profile).filter(|p| *p != Profile::Minimal),
                files: call.files.clone(),
                session: call.session.as_ref().map(|session| match session {
                    SessionArg::New => NEW_SESSION.to_owned(),
                    SessionArg::Named(name) => name.clone(),
                }),
            }),
            ..spec(agent, Environment::Sandbox, call.limits.clone())
        }
    }

    fn output(name: &str, status: &SandboxRunStatus, _: &PythonCall) -> Option<PythonOutput> {
        let phase = status.phase.filter(|p| p.is_terminal())?;
        let mut files = Vec::with_capacity(status.files.len());
        let mut files_omitted = status.files_omitted.clone();
        for f in &status.files {
            match f.output() {
                Some(file) => files.push(file),
                None => files_omitted.push(OmittedFile {
                    name: printable_name(&f.name),
                    size: Some(f.size),
                    reason: OmitReason::Unreadable,
                }),
            }
        }
        Some(PythonOutput {
            stdout: status.stdout.clone().unwrap_or_default(),
            stderr: status.stderr.clone().unwrap_or_default(),
            exit_code: status.exit_code,
            truncated: status.truncated.unwrap_or(false),
            duration_ms: duration_ms(status),
            run_name: name.to_owned(),
            phase,
            reason: status.reason.clone(),
            message: status.message.clone(),
            files,
            files_omitted,
            retry_after_seconds: status.retry_after_seconds,
            session: status.session.clone(),
            session_ended: status.session_ended.clone(),
        })
    }
}

impl ClusterTool for ExecuteSql {
    fn spec(agent: &str, call: &ExecuteSqlArgs) -> SandboxRunSpec {
        SandboxRunSpec {
            sql: Some(SqlSpec {
                database: call.database.clone(),
                query: call.query.clone(),
                schema: false,
            }),
            ..spec(agent, call.environment, Limits::default())
        }
    }

    fn output(name: &str, status: &SandboxRunStatus, _: &ExecuteSqlArgs) -> Option<SqlOutput> {
        let phase = governed_phase(status)?;
        let (verdict, rule, reason) = decision(status);
        let mut out = SqlOutput {
            duration_ms: duration_ms(status),
            truncated: status.truncated.unwrap_or(false),
            message: status.message.clone(),
            ..SqlOutput::empty(name.to_owned(), verdict, &rule, &reason, phase)
        };
        match status.typed_result::<SqlResult>() {
            None => {}
            Some(Ok(result)) => out = out.with_result(result),
            Some(Err(e)) => {
                out.phase = Phase::Failed;
                out.message = Some(unreadable(&e));
            }
        }
        Some(out)
    }
}

impl ClusterTool for SqlSchema {
    fn spec(agent: &str, call: &SchemaArgs) -> SandboxRunSpec {
        SandboxRunSpec {
            sql: Some(SqlSpec {
                database: call.database.clone(),
                query: String::new(),
                schema: true,
            }),
            ..spec(agent, sql_schema::ENVIRONMENT, Limits::default())
        }
    }

    fn output(name: &str, status: &SandboxRunStatus, call: &SchemaArgs) -> Option<SchemaOutput> {
        let phase = governed_phase(status)?;
        let (verdict, rule, reason) = decision(status);
        let mut out = SchemaOutput {
            message: status.message.clone(),
            ..SchemaOutput::decided(
                &call.database,
                name.to_owned(),
                verdict,
                &rule,
                &reason,
                phase,
            )
        };
        match status.typed_result::<SchemaResult>() {
            None => {}
            Some(Ok(schema)) => out.schema = Some(schema),
            Some(Err(e)) => {
                out.phase = Phase::Failed;
                out.message = Some(unreadable(&e));
            }
        }
        Some(out)
    }
}

impl ClusterTool for FetchMetrics {
    fn spec(agent: &str, call: &MetricsCall) -> SandboxRunSpec {
        SandboxRunSpec {
            metrics: Some(metrics_spec(&call.query)),
            ..spec(agent, call.environment, Limits::default())
        }
    }

    fn output(name: &str, status: &SandboxRunStatus, call: &MetricsCall) -> Option<MetricsOutput> {
        let phase = governed_phase(status)?;
        let (verdict, rule, reason) = decision(status);
        let mut out = MetricsOutput {
            message: status.message.clone(),
            ..MetricsOutput::decided(
                "prometheus",
                call.query.time,
                name.to_owned(),
                verdict,
                &rule,
                &reason,
                phase,
            )
        };
        match status.typed_result::<MetricsResult>() {
            None => {}
            Some(Ok(r)) => out = out.with_result(r),
            Some(Err(e)) => {
                out.phase = Phase::Failed;
                out.message = Some(unreadable(&e));
            }
        }
        Some(out)
    }
}

/// The SandboxRun spec fields of a query: the expression, an explicit instant, or the range.
pub fn metrics_spec(query: &MetricsQuery) -> MetricsSpec {
    match query.time {
        QueryTime::Instant(t) => MetricsSpec {
            query: query.query.clone(),
            time: Some(t.to_string()),
            range: None,
        },
        QueryTime::Range { start, end, step } => MetricsSpec {
            query: query.query.clone(),
            time: None,
            range: Some(MetricsRange {
                start: start.to_string(),
                end: end.to_string(),
                step: format_step(step),
            }),
        },
    }
}

fn format_step(step: Duration) -> String {
    if step.subsec_millis() == 0 {
        format!("{}s", step.as_secs())
    } else {
        format!("{}", step.as_secs_f64())
    }
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;

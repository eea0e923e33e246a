//! The policy of the embedded mode when no `--policy-file` is given.
//!
//! `config/policy/policy.yaml` is a sample for clusters, not a safe default for a laptop. The
//! embedded default: any agent may run Python in the sandbox environment (the local sandbox's
//! limits apply; both profiles, minimal and data, with the global file bounds; in sessions too,
//! with the default session bounds: 3 open per agent, 10 minutes idle, an hour at most), run
//! `sql` on the `demo` database in the sandbox environment, reading only the
//! `ledger` columns `id, account, amount, booked_at`, without `SELECT *`, with a LIMIT of at most
//! 1000, and run `fetch_metrics` over the server's own call counters (any environment);
//! everything else is blocked.

use super::{Policy, PolicyError, PolicyStore};

/// The name of the demo database in the embedded default configuration.
pub const DEMO_DATABASE: &str = "demo";

/// The policy used when no `--policy-file` is given (see the module documentation).
pub const EMBEDDED_POLICY: &str = r#"
default: block
rules:
  - name: embedded-python
    agents: ["*"]
    tools: [python]
    environments: [sandbox]
    verdict: allow
    reason: the embedded default policy allows Python in the local sandbox
    python:
      profiles: [minimal, data]
      # A laptop user gets sessions out of the box, with the default bounds.
      sessions: {}
  - name: embedded-demo-sql
    agents: ["*"]
    tools: [sql]
    environments: [sandbox]
    verdict: allow
    reason: the embedded default policy allows read-only queries on the demo database in the sandbox
    limits:
      rows: 1000
    sql:
      databases: [demo]
      tables:
        ledger: {columns: [id, account, amount, booked_at]}
      allowWildcard: false
      maxLimit: 1000
  - name: embedded-own-metrics
    agents: ["*"]
    tools: [metrics]
    environments: ["*"]
    verdict: allow
    reason: the embedded default policy allows fetch_metrics over this server's own call counters
  - name: embedded-block-everything-else
    agents: ["*"]
    tools: ["*"]
    environments: ["*"]
    verdict: block
    reason: the embedded default policy only allows run_python and execute_sql on the demo database (table ledger, columns id, account, amount, booked_at) in the sandbox environment, and fetch_metrics; start the server with --policy-file for anything else
"#;

/// The embedded default policy, parsed.
pub fn embedded_policy() -> Policy {
    Policy::from_yaml(EMBEDDED_POLICY, "<embedded default policy>")
        .expect("the embedded policy is valid")
}

/// The embedded mode's policy: `policy_file`, else [`EMBEDDED_POLICY`].
pub fn load(policy_file: Option<&std::path::Path>) -> Result<PolicyStore, PolicyError> {
    Ok(match policy_file {
        Some(path) => PolicyStore::load(path)?,
        None => PolicyStore::new(embedded_policy()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{CallContext, PythonRequest, SessionRules, SessionUse};
    use crate::sql::SqlDialect;
    use crate::{Environment, Tool, Verdict};

    #[test]
    fn embedded_policy_allows_python_the_demo_ledger_and_own_metrics_only() {
        let p = embedded_policy();
        let call = |env, q: &str| {
            let mut c = CallContext::new("anyone", Tool::Sql, env).with_sql("demo", q);
            c.sql.as_mut().unwrap().dialect = SqlDialect::Sqlite;
            p.evaluate(&c)
        };
        let ok = call(Environment::Sandbox, "SELECT id, amount FROM ledger");
        assert_eq!(ok.verdict, Verdict::Allow, "{ok}");
        assert!(ok.rewritten_query.unwrap().ends_with("LIMIT 1001"));
        assert_eq!(ok.max_rows, 1000);
        assert_eq!(
            call(Environment::Sandbox, "SELECT * FROM ledger").verdict,
            Verdict::Block
        );
        assert_eq!(
            call(Environment::Sandbox, "SELECT detail FROM audit_log").verdict,
            Verdict::Block
        );
        assert_eq!(
            call(Environment::Production, "SELECT id FROM ledger").verdict,
            Verdict::Block
        );
        let metrics = p.evaluate(&CallContext::new(
            "anyone",
            Tool::Metrics,
            Environment::Staging,
        ));
        assert_eq!(metrics.verdict, Verdict::Allow, "{metrics}");
        assert_eq!(metrics.rule, "embedded-own-metrics");
        let python = |env| p.evaluate(&CallContext::new("anyone", Tool::Python, env));
        assert_eq!(python(Environment::Sandbox).verdict, Verdict::Allow);
        assert_eq!(python(Environment::Sandbox).rule, "embedded-python");
        assert_eq!(python(Environment::Production).verdict, Verdict::Block);
        let mut in_session = CallContext::new("anyone", Tool::Python, Environment::Sandbox);
        in_session.python = Some(PythonRequest {
            session: Some(SessionUse::Open),
            ..PythonRequest::default()
        });
        let d = p.evaluate(&in_session);
        assert_eq!(d.verdict, Verdict::Allow, "{d}");
        assert_eq!(d.sessions, Some(SessionRules::default()));
    }
}

//! The generated SandboxSession CRD: its names, printer columns, bounds and rules (CEL evaluated
//! client-side with kube-cel, as the API server will), the effective values of its spec, and the
//! types round-tripping through JSON. Also the session bounds a run's recorded decision carries.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResourceExt;
use sandboxrun_api::{
    Decision, SandboxSession, SandboxSessionSpec, SessionEndReason, SessionPhase,
};
use sandboxrun_core::files::Profile;
use sandboxrun_core::policy::{CallContext, Policy, PythonRequest, SessionRules, SessionUse};
use sandboxrun_core::{Environment, Tool, Verdict};
use serde_json::{Value, json};

fn schema() -> Value {
    let crd = SandboxSession::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap(),
    )
    .unwrap()
}

/// A session as the API server sees it after defaulting, with `spec` merged in.
fn session(spec: Value) -> Value {
    let mut full = json!({
        "agent": "analyst-01",
        "environment": "sandbox",
        "limits": {"timeoutSeconds": 30, "cpu": "500m", "memory": "256Mi", "pids": 64, "outputBytes": 65536},
    });
    full.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxSession",
        "metadata": {"name": "s-1", "namespace": "ns"},
        "spec": full,
    })
}

fn messages(object: &Value, old: Option<&Value>) -> Vec<String> {
    match kube_cel::validate(&schema(), object, old) {
        Ok(()) => vec![],
        Err(errors) => errors.into_vec().into_iter().map(|e| e.message).collect(),
    }
}

fn spec(value: Value) -> SandboxSessionSpec {
    serde_json::from_value(value).unwrap()
}

#[test]
fn names_scope_status_and_printer_columns() {
    let crd = SandboxSession::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("sandboxsessions.sandboxrun.dev")
    );
    assert_eq!(crd.spec.group, "sandboxrun.dev");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.kind, "SandboxSession");
    assert_eq!(crd.spec.names.plural, "sandboxsessions");
    assert_eq!(crd.spec.names.short_names, Some(vec!["sbs".to_owned()]));
    // No category: `sandboxrun` is the SandboxRun's alone.
    assert_eq!(crd.spec.names.categories, None);
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<(&str, &str, &str)> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| (c.name.as_str(), c.type_.as_str(), c.json_path.as_str()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Agent", "string", ".spec.agent"),
            ("Profile", "string", ".spec.profile"),
            ("Phase", "string", ".status.phase"),
            ("Calls", "integer", ".status.calls"),
            ("Last Call", "date", ".status.lastCallTime"),
            ("Expires", "date", ".status.expiryTime"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ]
    );
}

#[test]
fn the_schema_bounds_the_agent_and_the_timeouts() {
    let s = schema();
    let spec = &s["properties"]["spec"];
    assert_eq!(spec["required"], json!(["agent"]));
    let fields = &spec["properties"];
    assert_eq!(
        fields["agent"]["pattern"],
        json!(sandboxrun_core::AGENT_NAME_PATTERN)
    );
    assert_eq!(
        (
            fields["agent"]["minLength"].clone(),
            fields["agent"]["maxLength"].clone()
        ),
        (json!(1), json!(253))
    );
    assert_eq!(fields["idleTimeoutSeconds"]["minimum"], json!(10.0));
    assert_eq!(fields["idleTimeoutSeconds"]["maximum"], json!(3600.0));
    assert_eq!(fields["maxLifetimeSeconds"]["minimum"], json!(60.0));
    assert_eq!(fields["maxLifetimeSeconds"]["maximum"], json!(3600.0));
    assert_eq!(fields["profile"]["enum"], json!(["minimal", "data"]));
    assert_eq!(
        fields["limits"]["properties"]["pids"]["maximum"],
        json!(1024.0)
    );
    let status = &s["properties"]["status"]["properties"];
    assert_eq!(
        status["phase"]["enum"],
        json!(["Pending", "Ready", "Busy", "Ended"])
    );
    assert_eq!(
        status["endReason"]["enum"],
        json!([
            "Closed",
            "IdleTimeout",
            "MaxLifetime",
            "InterpreterExited",
            "SandboxLost",
            "Rejected",
            "CallCancelled"
        ])
    );
    assert_eq!(status["conditions"]["x-kubernetes-list-type"], json!("map"));
    for time in ["lastCallTime", "startTime", "expiryTime", "activeSince"] {
        assert_eq!(status[time]["format"], json!("date-time"), "{time}");
    }
}

#[test]
fn a_session_is_accepted_and_its_idle_timeout_stays_within_its_lifetime() {
    assert_eq!(messages(&session(json!({})), None), Vec::<String>::new());
    assert!(
        messages(
            &session(
                json!({"profile": "data", "idleTimeoutSeconds": 60, "maxLifetimeSeconds": 60})
            ),
            None
        )
        .is_empty()
    );
    assert!(messages(&session(json!({"idleTimeoutSeconds": 3600})), None).is_empty());
    let too_idle = session(json!({"idleTimeoutSeconds": 601, "maxLifetimeSeconds": 600}));
    let m = messages(&too_idle, None);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].starts_with("idleTimeoutSeconds must not exceed maxLifetimeSeconds"),
        "{m:?}"
    );
}

#[test]
fn the_spec_is_immutable() {
    let old = session(json!({"idleTimeoutSeconds": 120}));
    assert!(messages(&old, Some(&old)).is_empty());
    for (field, value) in [
        ("agent", json!("someone-else")),
        ("environment", json!("production")),
        ("profile", json!("data")),
        ("idleTimeoutSeconds", json!(300)),
        ("maxLifetimeSeconds", json!(1800)),
        (
            "limits",
            json!({"timeoutSeconds": 600, "cpu": "500m", "memory": "256Mi", "pids": 64, "outputBytes": 65536}),
        ),
    ] {
        let mut new = old.clone();
        new["spec"][field] = value;
        assert_eq!(
            messages(&new, Some(&old)),
            ["the spec of a SandboxSession is immutable: close it and open another"],
            "{field}"
        );
    }
}

#[test]
fn an_ended_session_stays_ended_and_keeps_its_pod() {
    const FORWARD: &str = "a session's status only moves forward: an ended session stays ended and its recorded sandbox Pod stays its own";
    let with = |status: Value| {
        let mut s = session(json!({}));
        s["status"] = status;
        s
    };
    let ready = with(json!({"phase": "Ready", "podName": "p"}));
    let busy = with(json!({"phase": "Busy", "podName": "p", "calls": 1}));
    let ended = with(json!({"phase": "Ended", "podName": "p", "endReason": "IdleTimeout"}));
    assert!(messages(&busy, Some(&ready)).is_empty());
    assert!(messages(&ready, Some(&busy)).is_empty());
    assert!(messages(&ended, Some(&busy)).is_empty());
    assert_eq!(messages(&ready, Some(&ended)), [FORWARD]);
    assert_eq!(messages(&with(json!({})), Some(&ended)), [FORWARD]);
    let other_pod = with(json!({"phase": "Busy", "podName": "q"}));
    assert_eq!(messages(&other_pod, Some(&busy)), [FORWARD]);
}

#[test]
fn effective_values_default_and_stay_within_bounds() {
    let s = spec(json!({"agent": "a"}));
    assert_eq!((s.idle_timeout(), s.max_lifetime()), (600, 3600));
    assert_eq!(s.sandbox_profile(), Profile::Minimal);
    assert_eq!(s.environment, Environment::Sandbox);
    assert_eq!(s.limits.effective(), sandboxrun_core::Limits::default());
    let s = spec(
        json!({"agent": "a", "profile": "data", "idleTimeoutSeconds": 30, "maxLifetimeSeconds": 120}),
    );
    assert_eq!((s.idle_timeout(), s.max_lifetime()), (30, 120));
    assert_eq!(s.sandbox_profile(), Profile::Data);
    // Only an object that bypassed validation can hold these; it is still held to the bounds.
    let s = spec(json!({"agent": "a", "idleTimeoutSeconds": 1, "maxLifetimeSeconds": 100000}));
    assert_eq!((s.idle_timeout(), s.max_lifetime()), (10, 3600));
    let s = spec(json!({"agent": "a", "idleTimeoutSeconds": 3600, "maxLifetimeSeconds": 60}));
    assert_eq!((s.idle_timeout(), s.max_lifetime()), (60, 60));
}

#[test]
fn the_expiry_is_the_earlier_of_idle_and_lifetime() {
    let t = |s: &str| Time(s.parse().unwrap());
    let s = spec(json!({"agent": "a", "idleTimeoutSeconds": 600, "maxLifetimeSeconds": 3600}));
    let start = t("2026-12-05T08:00:00Z");
    assert_eq!(s.expiry_time(&start, &start), t("2026-12-05T08:10:00Z"));
    assert_eq!(
        s.expiry_time(&start, &t("2026-12-05T08:30:00Z")),
        t("2026-12-05T08:40:00Z")
    );
    assert_eq!(
        s.expiry_time(&start, &t("2026-12-05T08:55:00Z")),
        t("2026-12-05T09:00:00Z")
    );
}

#[test]
fn a_full_session_round_trips() {
    let value = json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxSession",
        "metadata": {"name": "s-1a2b", "namespace": "sandboxrun-runs", "generation": 1},
        "spec": {
            "agent": "analyst-01",
            "environment": "staging",
            "profile": "data",
            "limits": {"timeoutSeconds": 5, "cpu": "1", "memory": "512Mi", "pids": 32, "outputBytes": 1024},
            "idleTimeoutSeconds": 120,
            "maxLifetimeSeconds": 1800
        },
        "status": {
            "phase": "Ended",
            "podName": "s-1a2b-sandbox",
            "calls": 7,
            "lastCallTime": "2026-12-05T08:05:00Z",
            "startTime": "2026-12-05T08:00:00Z",
            "expiryTime": "2026-12-05T08:07:00Z",
            "endReason": "InterpreterExited",
            "message": "the code ended the interpreter (exit code 1)",
            "conditions": [{
                "type": "Ready", "status": "False", "reason": "InterpreterExited", "message": "exit code 1",
                "lastTransitionTime": "2026-12-05T08:05:00Z", "observedGeneration": 1
            }],
            "observedGeneration": 1
        }
    });
    let s: SandboxSession = serde_json::from_value(value.clone()).unwrap();
    let status = s.status.as_ref().unwrap();
    assert_eq!(status.phase, Some(SessionPhase::Ended));
    assert_eq!(status.end_reason, Some(SessionEndReason::InterpreterExited));
    assert_eq!(status.calls, Some(7));
    assert!(status.ended());
    assert_eq!(s.spec.idle_timeout(), 120);
    assert_eq!(serde_json::to_value(&s).unwrap(), value);
    // An empty status writes nothing.
    let mut empty = s.clone();
    empty.status = Some(Default::default());
    assert_eq!(serde_json::to_value(&empty).unwrap()["status"], json!({}));
    assert!(!empty.status.unwrap().ended());
}

/// A python call that opens a session records the deciding rule's session bounds in the run's
/// decision, and the operator reads them back from that record.
#[test]
fn a_recorded_decision_keeps_the_session_bounds() {
    let policy = Policy::from_yaml(
        "rules:\n  - {name: s, tools: [python], verdict: allow, python: {sessions: {maxPerAgent: 2}}}\n",
        "<test>",
    )
    .unwrap();
    let mut call = CallContext::new("a", Tool::Python, Environment::Sandbox);
    call.python = Some(PythonRequest {
        session: Some(SessionUse::Open),
        ..PythonRequest::default()
    });
    let decision = policy.evaluate(&call);
    assert_eq!(decision.verdict, Verdict::Allow, "{decision}");
    let expected = SessionRules {
        max_per_agent: 2,
        ..SessionRules::default()
    };
    assert_eq!(decision.sessions, Some(expected));
    let record = Decision::record(&decision, Environment::Sandbox);
    let json = serde_json::to_value(&record).unwrap();
    assert_eq!(json["grant"]["sessions"]["maxPerAgent"], json!(2));
    let back: Decision = serde_json::from_value(json).unwrap();
    assert_eq!(back.taken(), Some(decision));
    // A call without a session records none.
    let plain = policy.evaluate(&CallContext::new("a", Tool::Python, Environment::Sandbox));
    let json = serde_json::to_value(Decision::record(&plain, Environment::Sandbox)).unwrap();
    assert!(json["grant"].get("sessions").is_none(), "{json}");
}

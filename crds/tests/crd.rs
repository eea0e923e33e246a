//! The generated CRD: checked-in copies are current, validation rules are present and behave as
//! the API server will evaluate them (CEL evaluated client-side with kube-cel), and the types
//! round-trip through JSON.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use kube::CustomResourceExt;
use sandboxrun_api::{
    SESSION_NAME_PATTERN, SandboxRun, SandboxRunStatus, crd_yaml, pool_crd_yaml, session_crd_yaml,
};
use sandboxrun_core::{Phase, Tool};
use serde_json::{Value, json};

const REGENERATE: &str = "cargo run -p sandboxrun-api --bin crdgen > crds/sandboxrun.dev_sandboxruns.yaml && cargo run -p sandboxrun-api --bin crdgen -- pool > crds/sandboxrun.dev_sandboxpools.yaml && cargo run -p sandboxrun-api --bin crdgen -- session > crds/sandboxrun.dev_sandboxsessions.yaml && cp crds/*.yaml charts/sandboxrun/crds/";

#[test]
fn crd_is_up_to_date() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for (path, generated) in [
        ("crds/sandboxrun.dev_sandboxruns.yaml", crd_yaml()),
        (
            "charts/sandboxrun/crds/sandboxrun.dev_sandboxruns.yaml",
            crd_yaml(),
        ),
        ("crds/sandboxrun.dev_sandboxpools.yaml", pool_crd_yaml()),
        (
            "charts/sandboxrun/crds/sandboxrun.dev_sandboxpools.yaml",
            pool_crd_yaml(),
        ),
        (
            "crds/sandboxrun.dev_sandboxsessions.yaml",
            session_crd_yaml(),
        ),
        (
            "charts/sandboxrun/crds/sandboxrun.dev_sandboxsessions.yaml",
            session_crd_yaml(),
        ),
    ] {
        let checked_in = std::fs::read_to_string(root.join(path))
            .unwrap_or_else(|e| panic!("{path}: {e}; regenerate with: {REGENERATE}"));
        assert!(
            checked_in == generated,
            "{path} is stale: it differs from what the types generate. Regenerate with: {REGENERATE}"
        );
    }
}

fn schema() -> Value {
    let crd = SandboxRun::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn schema_carries_the_cel_rules_and_bounds() {
    let s = schema();
    let spec = &s["properties"]["spec"];
    let rules: Vec<&str> = spec["x-kubernetes-validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule"].as_str().unwrap())
        .collect();
    assert!(rules.contains(
        &"[has(self.python), has(self.sql), has(self.metrics)].filter(x, x).size() == 1"
    ));
    let limits = &spec["properties"]["limits"]["properties"];
    assert_eq!(limits["timeoutSeconds"]["minimum"], json!(1.0));
    assert_eq!(limits["timeoutSeconds"]["maximum"], json!(600.0));
    assert_eq!(limits["pids"]["maximum"], json!(1024.0));
    assert_eq!(limits["outputBytes"]["maximum"], json!(1_048_576.0));
    assert_eq!(
        spec["properties"]["python"]["properties"]["code"]["maxLength"],
        json!(262_144)
    );
    let cpu_rule = limits["cpu"]["x-kubernetes-validations"][0]["rule"]
        .as_str()
        .unwrap();
    assert!(cpu_rule.contains("quantity('4')"), "{cpu_rule}");
    let mem_rule = limits["memory"]["x-kubernetes-validations"][0]["rule"]
        .as_str()
        .unwrap();
    assert!(mem_rule.contains("quantity('4Gi')"), "{mem_rule}");
    assert_eq!(
        s["properties"]["status"]["properties"]["result"]["x-kubernetes-preserve-unknown-fields"],
        json!(true)
    );
    let crd = SandboxRun::crd();
    assert_eq!(crd.spec.names.short_names, Some(vec!["sbr".to_owned()]));
    assert!(
        crd.spec.versions[0]
            .subresources
            .as_ref()
            .unwrap()
            .status
            .is_some()
    );
}

/// A run as the API server sees it after defaulting.
fn run(spec: Value) -> Value {
    let mut full = json!({
        "agent": "analyst-01",
        "environment": "sandbox",
        "limits": {"timeoutSeconds": 30, "cpu": "500m", "memory": "256Mi", "pids": 64, "outputBytes": 65536},
        "ttlSecondsAfterFinished": 3600,
    });
    full.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "r", "namespace": "ns"},
        "spec": full,
    })
}

/// The schema without the rules kube-cel cannot evaluate: those with `optionalOldSelf` (it
/// passes `oldSelf` as a plain value, not an optional). The API server evaluates them; the e2e
/// suite shows it (e2e/tests/governance.rs), and the test below checks they are in the schema.
fn evaluable_schema() -> Value {
    let mut schema = schema();
    strip_optional_old_self(&mut schema);
    schema
}

fn strip_optional_old_self(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if let Some(Value::Array(rules)) = map.get_mut("x-kubernetes-validations") {
                rules.retain(|r| r.get("optionalOldSelf") != Some(&json!(true)));
            }
            map.values_mut().for_each(strip_optional_old_self);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_optional_old_self),
        _ => {}
    }
}

fn messages(object: &Value, old: Option<&Value>) -> Vec<String> {
    match kube_cel::validate(&evaluable_schema(), object, old) {
        Ok(()) => vec![],
        Err(errors) => errors.into_vec().into_iter().map(|e| e.message).collect(),
    }
}

#[test]
fn one_tool_is_accepted() {
    assert_eq!(
        messages(&run(json!({"python": {"code": "print(1)"}})), None),
        Vec::<String>::new()
    );
    assert!(
        messages(
            &run(json!({"sql": {"database": "db", "query": "select 1"}})),
            None
        )
        .is_empty()
    );
    assert!(messages(&run(json!({"metrics": {"query": "up", "range": {"start": "a", "end": "b", "step": "30s"}}})), None).is_empty());
}

#[test]
fn an_sql_run_asks_for_a_query_or_for_the_schema_never_both_or_neither() {
    const RULE: &str = "set exactly one of query or schema: true";
    for (sql, ok) in [
        (json!({"database": "db", "query": "select 1"}), true),
        (json!({"database": "db", "schema": true}), true),
        (
            json!({"database": "db", "query": "select 1", "schema": false}),
            true,
        ),
        (
            json!({"database": "db", "query": "select 1", "schema": true}),
            false,
        ),
        (
            json!({"database": "db", "query": "", "schema": false}),
            false,
        ),
        (json!({"database": "db", "query": ""}), false),
        (json!({"database": "db"}), false),
        (json!({"database": "db", "schema": false}), false),
    ] {
        let m = messages(&run(json!({ "sql": sql })), None);
        assert_eq!(m.is_empty(), ok, "{sql}: {m:?}");
        if !ok {
            assert!(m.iter().any(|m| m == RULE), "{sql}: {m:?}");
        }
    }
}

#[test]
fn no_tool_or_two_tools_are_rejected_with_a_readable_message() {
    for spec in [
        json!({}),
        json!({"python": {"code": "1"}, "sql": {"database": "db", "query": "select 1"}}),
    ] {
        let m = messages(&run(spec), None);
        assert!(
            m.iter()
                .any(|m| m == "exactly one of python, sql or metrics must be set"),
            "{m:?}"
        );
    }
}

#[test]
fn quantities_above_the_maximum_or_malformed_are_rejected() {
    for (cpu, memory, ok) in [
        ("500m", "256Mi", true),
        ("4", "4Gi", true),
        ("4001m", "256Mi", false),
        ("8", "256Mi", false),
        ("500m", "5Gi", false),
        ("500m", "1Mi", false),
        ("lots", "256Mi", false),
        ("500m", "-1", false),
    ] {
        let mut r = run(json!({"python": {"code": "1"}}));
        r["spec"]["limits"]["cpu"] = json!(cpu);
        r["spec"]["limits"]["memory"] = json!(memory);
        let m = messages(&r, None);
        assert_eq!(m.is_empty(), ok, "cpu={cpu} memory={memory}: {m:?}");
        if !ok {
            assert!(
                m.iter()
                    .all(|m| m.contains("must be a Kubernetes quantity")),
                "{m:?}"
            );
        }
    }
}

const APPROVAL_WHILE_AWAITING: &str = "spec.approval can be set or changed only while the run awaits approval (status.phase AwaitingApproval)";
const NO_APPROVAL_AT_CREATE: &str = "spec.approval cannot be set when a run is created: a person approves or denies a run once it awaits approval";

#[test]
fn an_approval_is_written_only_while_the_run_awaits_one() {
    let created = run(json!({"python": {"code": "print(1)"}}));
    let with_status = |phase: &str| {
        let mut r = created.clone();
        r["status"] = json!({"phase": phase});
        r
    };
    let approve = |old: &Value, answer: Value| {
        let mut new = old.clone();
        new["spec"]["approval"] = answer;
        new
    };
    let yes = json!({"approved": true, "by": "alice"});
    // Not at creation, neither approved nor denied: a rule that also runs at creation
    // (optionalOldSelf), evaluated by the API server (kube-cel has no optional oldSelf).
    let rules = schema()["properties"]["spec"]["x-kubernetes-validations"].clone();
    let at_create = rules
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["message"] == NO_APPROVAL_AT_CREATE)
        .expect("the creation rule is in the schema");
    assert_eq!(at_create["optionalOldSelf"], json!(true));
    assert_eq!(
        at_create["rule"],
        "oldSelf.hasValue() || !has(self.approval)"
    );
    assert!(messages(&created, None).is_empty());
    // Not before the run waits, nor once it went on or ended.
    for phase in [
        None,
        Some("Pending"),
        Some("Running"),
        Some("Succeeded"),
        Some("Rejected"),
    ] {
        let old = phase.map_or_else(|| created.clone(), with_status);
        assert_eq!(
            messages(&approve(&old, yes.clone()), Some(&old)),
            [APPROVAL_WHILE_AWAITING],
            "{phase:?}"
        );
    }
    // While it waits: set, changed (a denial after all), or taken back.
    let waiting = with_status("AwaitingApproval");
    let approved = approve(&waiting, yes.clone());
    assert!(messages(&approved, Some(&waiting)).is_empty());
    let denied = approve(
        &approved,
        json!({"approved": false, "by": "alice", "reason": "no"}),
    );
    assert!(messages(&denied, Some(&approved)).is_empty());
    assert!(messages(&waiting, Some(&approved)).is_empty());
    // An approval already there stays as it is through other changes (cancelling), whatever
    // the phase.
    let mut cancelled = approved.clone();
    cancelled["status"]["phase"] = json!("Running");
    let mut after = cancelled.clone();
    after["spec"]["cancelled"] = json!(true);
    assert!(messages(&after, Some(&cancelled)).is_empty());
}

#[test]
fn cancelled_has_a_schema_default_so_its_transition_rule_always_runs() {
    let schema = schema();
    let cancelled = &schema["properties"]["spec"]["properties"]["cancelled"];
    assert_eq!(cancelled["default"], json!(false), "{cancelled}");
}

#[test]
fn the_record_of_the_wait_is_never_changed() {
    let mut old = run(json!({"python": {"code": "print(1)"}}));
    old["status"] = json!({"phase": "AwaitingApproval",
        "approvalRequest": {"since": "2026-12-02T10:00:00Z", "generation": 1}});
    let mut moved = old.clone();
    moved["status"]["approvalRequest"]["generation"] = json!(5);
    assert_eq!(messages(&moved, Some(&old)).len(), 1);
    let mut dropped = old.clone();
    dropped["status"]
        .as_object_mut()
        .unwrap()
        .remove("approvalRequest");
    assert_eq!(messages(&dropped, Some(&old)).len(), 1);
    let mut onwards = old.clone();
    onwards["status"]["phase"] = json!("Pending");
    assert!(messages(&onwards, Some(&old)).is_empty());
}

#[test]
fn spec_is_immutable_except_approval() {
    let mut old = run(json!({"python": {"code": "print(1)"}}));
    old["status"] = json!({"phase": "AwaitingApproval"});

    let mut approved = old.clone();
    approved["spec"]["approval"] = json!({"approved": true, "by": "alice"});
    assert!(messages(&approved, Some(&old)).is_empty());

    let mut code = old.clone();
    code["spec"]["python"]["code"] = json!("print(2)");
    assert_eq!(messages(&code, Some(&old)), ["python is immutable"]);

    let mut agent = old.clone();
    agent["spec"]["agent"] = json!("someone-else");
    assert_eq!(messages(&agent, Some(&old)), ["agent is immutable"]);

    let mut limits = old.clone();
    limits["spec"]["limits"]["timeoutSeconds"] = json!(600);
    assert_eq!(messages(&limits, Some(&old)), ["limits are immutable"]);

    let swapped = run(json!({"sql": {"database": "db", "query": "select 1"}}));
    assert_eq!(
        messages(&swapped, Some(&old)),
        ["the tool of a SandboxRun cannot be changed; create a new one"]
    );
}

#[test]
fn defaults_fill_an_empty_spec() {
    let r: SandboxRun = serde_json::from_value(json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "r"},
        "spec": {"agent": "a", "python": {"code": "print(1)"}},
    }))
    .unwrap();
    assert_eq!(
        r.spec.limits.effective(),
        sandboxrun_core::Limits::default()
    );
    assert_eq!(r.spec.ttl_seconds_after_finished, 3600);
    assert_eq!(r.spec.tool(), Some(Tool::Python));
    assert_eq!(r.spec.approval, None);
}

#[test]
fn run_with_status_round_trips() {
    let value = json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "hello", "namespace": "sandboxrun-runs", "generation": 1},
        "spec": {
            "agent": "analyst-01",
            "environment": "staging",
            "python": {"code": "print('hello')"},
            "limits": {"timeoutSeconds": 5, "cpu": "1", "memory": "512Mi", "pids": 32, "outputBytes": 1024},
            "ttlSecondsAfterFinished": 30,
            "approval": {"approved": true, "by": "alice"}
        },
        "status": {
            "phase": "Succeeded",
            "tool": "python",
            "decision": {"verdict": "Allow", "rule": "default", "reason": "sandbox"},
            "conditions": [{
                "type": "Completed", "status": "True", "reason": "Succeeded", "message": "exit code 0",
                "lastTransitionTime": "2026-11-29T08:00:01Z", "observedGeneration": 1
            }],
            "exitCode": 0,
            "stdout": "hello\n",
            "stderr": "",
            "truncated": false,
            "startTime": "2026-11-29T08:00:00Z",
            "completionTime": "2026-11-29T08:00:01Z",
            "durationMillis": 1000,
            "podName": "hello-sandbox",
            "reason": "Succeeded",
            "message": "exit code 0",
            "result": {"rows": [[1, "a"]]},
            "observedGeneration": 1
        }
    });
    let run: SandboxRun = serde_json::from_value(value.clone()).unwrap();
    let status: &SandboxRunStatus = run.status.as_ref().unwrap();
    assert_eq!(status.phase, Some(Phase::Succeeded));
    assert_eq!(run.spec.limits.effective().memory, "512Mi");
    assert_eq!(serde_json::to_value(&run).unwrap(), value);
}

#[test]
fn an_approval_requires_by_but_an_old_one_still_reads() {
    // New approvals must name who decided (the schema requires it, at least one character)...
    let crd = serde_json::to_value(SandboxRun::crd()).unwrap();
    let approval = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["approval"];
    assert_eq!(approval["required"], json!(["by"]), "{approval}");
    assert_eq!(approval["properties"]["by"]["minLength"], 1, "{approval}");
    assert!(
        approval["properties"]["by"].get("default").is_none(),
        "{approval}"
    );
    // ...while one stored before the field existed still deserializes: a run the operator could
    // not read would stall its whole watch.
    let old: sandboxrun_api::Approval = serde_json::from_value(json!({"approved": true})).unwrap();
    assert_eq!(old.by, "");
    assert_eq!(old.reason, None);
}

#[test]
fn an_approval_may_say_why_in_at_most_1024_characters() {
    let crd = serde_json::to_value(SandboxRun::crd()).unwrap();
    let approval = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["approval"];
    let reason = &approval["properties"]["reason"];
    assert_eq!(reason["type"], "string", "{approval}");
    assert_eq!(reason["maxLength"], 1024, "{approval}");
    assert_eq!(
        approval["required"],
        json!(["by"]),
        "the reason is optional"
    );
    let denial: sandboxrun_api::Approval = serde_json::from_value(
        json!({"approved": false, "by": "bob", "reason": "not on a Friday"}),
    )
    .unwrap();
    assert_eq!(denial.reason.as_deref(), Some("not on a Friday"));
    // Without a reason, none is written (a merge patch of an approval leaves no null behind).
    let bare = sandboxrun_api::Approval {
        approved: true,
        by: "alice".into(),
        reason: None,
    };
    assert_eq!(
        serde_json::to_value(&bare).unwrap(),
        json!({"approved": true, "by": "alice"})
    );
}

/// A run created directly (not through the frontend) carries an agent name of the same safe set
/// as every other way in: the API server checks the pattern, which says what
/// `validate_agent_name` says.
#[test]
fn the_agent_is_a_safe_name() {
    let agent = &schema()["properties"]["spec"]["properties"]["agent"];
    assert_eq!(agent["pattern"], json!(sandboxrun_core::AGENT_NAME_PATTERN));
    assert_eq!(
        (agent["minLength"].clone(), agent["maxLength"].clone()),
        (json!(1), json!(253))
    );
    let pattern = regex::Regex::new(sandboxrun_core::AGENT_NAME_PATTERN).unwrap();
    let names = [
        "analyst-01".to_owned(),
        "system:serviceaccount:team:bot".to_owned(),
        "alice+ci@example.com".to_owned(),
        "oauth:auth0|5f7c8ec7".to_owned(),
        "https://dex.example.com#CgVh=".to_owned(),
        " alice".to_owned(),
        "alice ".to_owned(),
        "al\u{202e}ice".to_owned(),
        "al\u{1b}]0;x\u{7}ice".to_owned(),
        "alice\n".to_owned(),
        "alic\u{0435}".to_owned(),
        "-alice".to_owned(),
        "*".to_owned(),
        String::new(),
        "a".repeat(253),
        "a".repeat(254),
    ];
    for name in names {
        assert_eq!(
            pattern.is_match(&name),
            sandboxrun_core::validate_agent_name(&name).is_ok(),
            "{name:?}"
        );
    }
}

#[test]
fn python_files_and_profile_are_bounded_and_immutable() {
    let s = schema();
    let python = &s["properties"]["spec"]["properties"]["python"]["properties"];
    assert_eq!(python["profile"]["enum"], json!(["minimal", "data"]));
    let files = &python["files"];
    assert_eq!(files["maxItems"], json!(20));
    assert_eq!(files["x-kubernetes-list-type"], json!("map"));
    assert_eq!(files["x-kubernetes-list-map-keys"], json!(["name"]));
    let item = &files["items"]["properties"];
    assert_eq!(
        item["name"]["pattern"],
        json!("^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    );
    assert_eq!(item["content"]["format"], json!("byte"));
    let status = &s["properties"]["status"]["properties"];
    assert_eq!(status["files"]["maxItems"], json!(20));
    assert_eq!(status["filesOmitted"]["maxItems"], json!(50));

    let old = run(json!({"python": {"code": "print(1)", "profile": "data",
        "files": [{"name": "a.csv", "content": "eCx5Cg=="}]}}));
    assert!(messages(&old, None).is_empty());
    let mut other = old.clone();
    other["spec"]["python"]["files"][0]["content"] = json!("eQo=");
    assert_eq!(messages(&other, Some(&old)), ["python is immutable"]);
    let mut minimal = old.clone();
    minimal["spec"]["python"]["profile"] = json!("minimal");
    assert_eq!(messages(&minimal, Some(&old)), ["python is immutable"]);
}

#[test]
fn python_files_round_trip() {
    let value = json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "f", "namespace": "sandboxrun-runs"},
        "spec": {
            "agent": "analyst-01",
            "environment": "sandbox",
            "python": {"code": "print(1)", "profile": "data",
                "files": [{"name": "a.csv", "content": "eCx5Cg=="}]},
            "limits": {"timeoutSeconds": 30, "cpu": "500m", "memory": "256Mi", "pids": 64, "outputBytes": 65536},
            "ttlSecondsAfterFinished": 3600
        },
        "status": {
            "phase": "Succeeded",
            "files": [{"name": "out.txt", "mimeType": "text/plain", "size": 3, "data": "aGkK"}],
            "filesOmitted": [{"name": "link", "reason": "notARegularFile"}]
        }
    });
    let run: SandboxRun = serde_json::from_value(value.clone()).unwrap();
    let python = run.spec.python.as_ref().unwrap();
    assert_eq!(python.files[0].content, b"x,y\n");
    assert_eq!(python.sandbox_profile(), sandboxrun_core::Profile::Data);
    assert_eq!(serde_json::to_value(&run).unwrap(), value);
    // Without a profile or files, a python spec is what it always was.
    let bare: sandboxrun_api::PythonSpec = serde_json::from_value(json!({"code": "1"})).unwrap();
    assert_eq!(bare.sandbox_profile(), sandboxrun_core::Profile::Minimal);
    assert_eq!(serde_json::to_value(&bare).unwrap(), json!({"code": "1"}));
}

/// `spec.python.session` names a SandboxSession: a DNS-1123 subdomain the API server checks, and
/// like the rest of `python` it cannot change.
#[test]
fn a_python_run_names_its_session_by_a_valid_object_name() {
    let session = &schema()["properties"]["spec"]["properties"]["python"]["properties"]["session"];
    assert_eq!(session["pattern"], json!(SESSION_NAME_PATTERN));
    assert_eq!(
        (session["minLength"].clone(), session["maxLength"].clone()),
        (json!(1), json!(253))
    );
    let pattern = regex::Regex::new(SESSION_NAME_PATTERN).unwrap();
    for (name, ok) in [
        ("s-1a2b3c", true),
        ("agent.session-7", true),
        ("a", true),
        ("S-1", false),
        ("-s", false),
        ("s-", false),
        ("s..t", false),
        ("s/../t", false),
        ("s_1", false),
        ("s 1", false),
        ("", false),
    ] {
        assert_eq!(pattern.is_match(name), ok, "{name:?}");
    }

    let old = run(json!({"python": {"code": "x = 41", "session": "s-1"}}));
    assert!(messages(&old, None).is_empty());
    let mut other = old.clone();
    other["spec"]["python"]["session"] = json!("s-2");
    assert_eq!(messages(&other, Some(&old)), ["python is immutable"]);
    let parsed: SandboxRun = serde_json::from_value(old.clone()).unwrap();
    assert_eq!(
        parsed.spec.python.as_ref().unwrap().session.as_deref(),
        Some("s-1")
    );
    assert_eq!(
        serde_json::to_value(&parsed).unwrap()["spec"]["python"],
        old["spec"]["python"]
    );
    // A run without a session says nothing about one.
    let single = serde_json::to_value(
        serde_json::from_value::<SandboxRun>(run(json!({"python": {"code": "1"}}))).unwrap(),
    )
    .unwrap();
    assert!(
        single["spec"]["python"].get("session").is_none(),
        "{single}"
    );
}

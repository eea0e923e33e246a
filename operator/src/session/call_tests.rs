//! A run in a session, reconciled against the scripted API server: what the operator decides
//! before anything reaches a session's sandbox (opening one within the agent's share, the
//! unknown-id answer, waiting for the sandbox or for the call that holds the session, and a
//! session left held by a gone run). Sending the call needs an attach stream, which the fake does
//! not serve: e2e/mcp/test_sessions_cluster.py covers that part on the cluster.

use super::*;
use crate::session::call::WAIT;

const POLICY: &str = "default: block
rules:
  - name: sessions
    agents: [\"*\"]
    tools: [python]
    verdict: allow
    python:
      sessions:
        maxPerAgent: 2
        maxLifetimeSeconds: 600
        idleTimeoutSeconds: 30
";

const UID: &str = "0d6f1a2b-1111-2222-3333-444455556666";
const OPENED: &str = "sbs-0d6f1a2b111122223333444455556666";

fn session_run(session: &str) -> Value {
    let mut run = run_json(json!({"python": {"code": "print(1)", "session": session}}));
    run["metadata"]["uid"] = json!(UID);
    run
}

fn session(name: &str, agent: &str, status: Value) -> Value {
    json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxSession",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
            "resourceVersion": "7", "generation": 1,
            "creationTimestamp": Timestamp::now().to_string()},
        "spec": {"agent": agent, "environment": "sandbox"},
        "status": status,
    })
}

fn ready() -> Value {
    json!({"phase": "Ready", "podName": "p-sandbox", "calls": 1,
        "startTime": Timestamp::now().to_string()})
}

/// A session whose call the run `holder` (uid `uid-<holder>`) holds since now.
fn busy_with(holder: &str) -> Value {
    let mut busy = ready();
    busy["phase"] = json!("Busy");
    busy["activeRun"] = json!(holder);
    busy["activeRunUid"] = json!(format!("uid-{holder}"));
    busy["activeSince"] = json!(Timestamp::now().to_string());
    busy
}

fn session_writes(api: &FakeApi) -> usize {
    api.take_requests()
        .iter()
        .filter(|r| r.starts_with("PUT ") && r.contains("/sandboxsessions/"))
        .count()
}

/// The (only) session's status, asserted ended for `reason`.
fn ended_with(api: &FakeApi, reason: &str) -> Value {
    let status = api.with(|s| s.sessions[0]["status"].clone());
    assert_eq!(
        (&status["phase"], &status["endReason"]),
        (&json!("Ended"), &json!(reason)),
        "{status}"
    );
    status
}

#[tokio::test]
async fn new_opens_a_session_of_the_runs_agent_within_the_rules_bounds_and_waits_for_it() {
    let api = FakeApi::start(session_run("new")).await;
    let ctx = context(&api, Some(POLICY));
    reconcile_as(cached(&api), &ctx).await;
    let sessions = api.with(|s| s.sessions.clone());
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let opened = &sessions[0];
    assert_eq!(opened["metadata"]["name"], OPENED);
    assert_eq!(opened["spec"]["agent"], "tester");
    assert_eq!(opened["spec"]["idleTimeoutSeconds"], 30);
    assert_eq!(opened["spec"]["maxLifetimeSeconds"], 600);
    let status = api.status();
    assert_eq!(status["phase"], "Pending", "{status}");
    assert_eq!(status["session"], OPENED, "{status}");
    assert!(
        status["message"].as_str().unwrap().contains("to start"),
        "{status}"
    );
    // Again: the same session, not a second one.
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.with(|s| s.sessions.len()), 1);
}

#[tokio::test]
async fn an_agent_holds_at_most_its_share_of_open_sessions() {
    let api = FakeApi::start(session_run("new")).await;
    api.with(|s| {
        s.sessions = vec![
            session("sbs-a", "tester", ready()),
            session("sbs-b", "tester", ready()),
            // Ended ones and other agents' do not count against it.
            session("sbs-c", "tester", json!({"phase": "Ended", "podName": "c"})),
            session("sbs-d", "someone-else", ready()),
        ];
    });
    let ctx = context(&api, Some(POLICY));
    reconcile_as(cached(&api), &ctx).await;
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["reason"]),
        (&json!("Rejected"), &json!("SessionLimit")),
        "{status}"
    );
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("close_session")
    );
    assert_eq!(api.with(|s| s.sessions.len()), 4, "nothing opened");
}

#[tokio::test]
async fn another_agents_session_an_ended_one_and_an_unknown_id_get_the_same_answer() {
    let mut answers = Vec::new();
    for (id, present) in [
        (
            "sbs-theirs",
            Some(session("sbs-theirs", "someone-else", ready())),
        ),
        (
            "sbs-over",
            Some(session(
                "sbs-over",
                "tester",
                json!({"phase": "Ended", "podName": "o"}),
            )),
        ),
        ("sbs-nobody", None),
    ] {
        let api = FakeApi::start(session_run(id)).await;
        api.with(|s| s.sessions = present.into_iter().collect());
        let ctx = context(&api, Some(POLICY));
        reconcile_as(cached(&api), &ctx).await;
        let status = api.status();
        assert_eq!(
            (&status["phase"], &status["reason"]),
            (&json!("Rejected"), &json!("SessionNotFound")),
            "{status}"
        );
        assert_eq!(
            session_writes(&api),
            0,
            "a session it may not use was written"
        );
        answers.push(status["message"].as_str().unwrap().replace(id, "ID"));
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
}

#[tokio::test]
async fn a_call_waits_while_another_run_holds_the_session() {
    let api = FakeApi::start(session_run("sbs-mine")).await;
    let busy = busy_with("other");
    let mut other = run_json(python());
    other["metadata"]["name"] = json!("other");
    other["metadata"]["uid"] = json!("uid-other");
    other["status"] = json!({"phase": "Running"});
    api.with(|s| {
        s.sessions = vec![session("sbs-mine", "tester", busy)];
        s.other_runs = vec![other];
    });
    let ctx = context(&api, Some(POLICY));
    let action = reconcile_as(cached(&api), &ctx).await;
    assert_eq!(action, Action::requeue(WAIT));
    let status = api.status();
    assert_eq!(status["phase"], "Pending", "{status}");
    assert!(status["message"].as_str().unwrap().contains("call running"));
    let sessions = api.with(|s| s.sessions.clone());
    assert_eq!(
        sessions[0]["status"]["activeRun"], "other",
        "the lease was taken"
    );
}

#[tokio::test]
async fn a_session_held_by_a_gone_run_whose_call_did_not_end_is_ended() {
    // Its code may still run: only the end of the interpreter stops it, never a second call
    // beside it.
    let api = FakeApi::start(session_run("sbs-mine")).await;
    let busy = busy_with("gone");
    api.with(|s| {
        s.sessions = vec![session("sbs-mine", "tester", busy)];
        s.pod = Some(json!({"metadata": {"name": "p-sandbox"}}));
        s.log = "sandboxrun-program-received uid-gone\n".to_owned();
    });
    let ctx = context(&api, Some(POLICY));
    reconcile_as(cached(&api), &ctx).await;
    ended_with(&api, "CallCancelled");
    // The run itself then gets the unknown-id answer.
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.status()["reason"], "SessionNotFound");
}

/// The runner's envelope of `call`, which ended its session's interpreter.
fn envelope_ending_the_interpreter(call: &str) -> String {
    format!(
        r#"{{"sandboxrun":1,"exitCode":3,"stdout":"","stderr":"","stdoutTruncated":false,"stderrTruncated":false,"signal":null,"timedOut":false,"call":"{call}","session":{{"alive":false,"ended":"interpreterExited","message":"the interpreter exited (code 3)"}}}}"#
    )
}

/// After a call that ended its session's interpreter, a later call finds the session ended
/// whichever comes first, its holder's giving back or this call: it is never sent to the
/// interpreter that is gone.
async fn a_call_after_one_that_ended_the_interpreter(holder: Option<Value>, log: String) {
    let api = FakeApi::start(session_run("sbs-mine")).await;
    let busy = busy_with("previous");
    api.with(|s| {
        s.sessions = vec![session("sbs-mine", "tester", busy)];
        s.other_runs = holder.into_iter().collect();
        s.pod = Some(json!({"metadata": {"name": "p-sandbox"}}));
        s.log = log;
    });
    let ctx = context(&api, Some(POLICY));
    reconcile_as(cached(&api), &ctx).await;
    let status = ended_with(&api, "InterpreterExited");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .ends_with("the interpreter exited (code 3)"),
        "{status}"
    );
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.status()["reason"], "SessionNotFound");
    let requests = api.take_requests();
    assert!(
        !requests.iter().any(|r| r.contains("/attach")),
        "nothing is sent to a gone interpreter: {requests:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("DELETE ") && r.ends_with("/pods/p-sandbox")),
        "its sandbox is deleted: {requests:?}"
    );
}

#[tokio::test]
async fn a_session_whose_ended_holders_call_ended_its_interpreter_is_ended_not_taken() {
    // The holder's end is recorded; its reconcile that gives the session back has not run yet.
    let mut holder = run_json(python());
    holder["metadata"]["name"] = json!("previous");
    holder["metadata"]["uid"] = json!("uid-previous");
    holder["status"] = json!({"phase": "Failed", "reason": "NonZeroExit",
        "sessionEnded": "the interpreter exited (code 3)"});
    a_call_after_one_that_ended_the_interpreter(Some(holder), String::new()).await;
}

#[tokio::test]
async fn a_session_whose_gone_holders_call_ended_its_interpreter_is_ended_not_taken() {
    // The holder was deleted after its call; the log has its envelope.
    let log = format!(
        "sandboxrun-program-received uid-previous\n{}\n",
        envelope_ending_the_interpreter("uid-previous")
    );
    a_call_after_one_that_ended_the_interpreter(None, log).await;
}

#[tokio::test]
async fn a_session_written_since_it_was_read_is_not_taken_and_nothing_is_sent() {
    // Another run took it (or the controller wrote it) between the read and the lease.
    let api = FakeApi::start(session_run("sbs-mine")).await;
    api.with(|s| {
        s.sessions = vec![session("sbs-mine", "tester", ready())];
        s.session_write_after_reads = 1;
    });
    let ctx = context(&api, Some(POLICY));
    let action = reconcile_as(cached(&api), &ctx).await;
    assert_eq!(
        action,
        Action::requeue(std::time::Duration::from_millis(20))
    );
    let requests = api.take_requests();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("PUT ") && r.ends_with("/sbs-mine/status")),
        "the lease was tried: {requests:?}"
    );
    assert!(
        !requests.iter().any(|r| r.contains("/attach")),
        "nothing is sent without the lease: {requests:?}"
    );
    let sessions = api.with(|s| s.sessions.clone());
    assert!(
        sessions[0]["status"].get("activeRun").is_none(),
        "{sessions:?}"
    );
}

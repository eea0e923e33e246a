//! Reconciliations against a scripted API server (`crate::fixtures`): the stages in order, and
//! the invariants of a run's end (status before Pod deletion, one terminal write and one audit
//! line even from a stale cache, nothing executed past a Block).

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tracing_subscriber::fmt::MakeWriter;

use super::*;
use crate::fixtures::{ApiState, FakeApi, NS};

const RUN: &str = "r";
const POD: &str = "r-sandbox";

fn run_json(tool: Value) -> Value {
    let mut spec = json!({"agent": "tester", "environment": "sandbox",
        "limits": {"timeoutSeconds": 5}, "ttlSecondsAfterFinished": 3600});
    for (k, v) in tool.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": RUN, "namespace": NS, "uid": "uid-1", "generation": 1,
            "resourceVersion": "1", "creationTimestamp": Timestamp::now().to_string()},
        "spec": spec,
    })
}

fn python() -> Value {
    json!({"python": {"code": "print('hello from sandboxrun')"}})
}

fn context(api: &FakeApi, policy: Option<&str>) -> Arc<Context> {
    let policy = policy.map(|yaml| {
        Arc::new(PolicyStore::new(
            sandboxrun_core::Policy::from_yaml(yaml, "test").unwrap(),
        ))
    });
    let ctx = Arc::new(
        Context::new(
            api.client.clone(),
            SandboxConfig {
                runtime_class: "gvisor".into(),
                image: "sandbox:test".into(),
                data_image: "sandbox-data:test".into(),
                tmp_size: "16Mi".into(),
                canary: None,
            },
            Arc::new(Metrics::default()),
            Events::new(api.client.clone(), "test".into()),
            policy,
            SignedDuration::from_mins(15),
        )
        .allowing_all_without_policy(true)
        .without_early_feed(),
    );
    // The controller's Pod watch, its first list in and empty, as once the operator has
    // started (`watched_pods.rs`).
    let (store, mut writer) = kube::runtime::reflector::store::<Pod>();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
    writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
    std::mem::forget(ctx.watched_pods.serve(store));
    ctx
}

/// The run as the API server has it now (an up-to-date watch cache).
fn cached(api: &FakeApi) -> SandboxRun {
    serde_json::from_value(api.with(|s| s.run.clone()).unwrap()).unwrap()
}

async fn reconcile_as(run: SandboxRun, ctx: &Arc<Context>) -> Action {
    let action = reconcile(Arc::new(run), ctx.clone()).await.unwrap();
    // Events go out in the background; the tests read them.
    ctx.events.settled().await;
    action
}

fn get_run() -> String {
    format!("GET /apis/sandboxrun.dev/v1alpha1/namespaces/{NS}/sandboxruns/{RUN}")
}
fn patch_status() -> String {
    format!("PATCH /apis/sandboxrun.dev/v1alpha1/namespaces/{NS}/sandboxruns/{RUN}/status")
}
fn get_pod() -> String {
    format!("GET /api/v1/namespaces/{NS}/pods/{POD}")
}
fn delete_pod() -> String {
    format!("DELETE /api/v1/namespaces/{NS}/pods/{POD}")
}

/// The audit lines written while `f` runs.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Captured {
    /// Captures audit lines on this thread until the guard drops.
    fn audit() -> (Self, tracing::subscriber::DefaultGuard) {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_env_filter(tracing_subscriber::EnvFilter::new("audit=info"))
            .with_writer(captured.clone())
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        (captured, guard)
    }

    fn lines(&self) -> Vec<Value> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The status of a sandbox Pod whose container exited 0.
fn succeeded(started: Timestamp, finished: Timestamp) -> Value {
    json!({"phase": "Succeeded", "containerStatuses": [{
        "name": "sandbox", "image": "sandbox:test", "imageID": "", "ready": false,
        "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed",
        "startedAt": started.to_string(), "finishedAt": finished.to_string()}}}]})
}

const OK_LOG: &str = "noise\n{\"sandboxrun\":1,\"exitCode\":0,\"stdout\":\"hello from sandboxrun\\n\",\"stderr\":\"\",\"stdoutTruncated\":false,\"stderrTruncated\":false,\"signal\":null,\"oomKill\":null,\"timedOut\":false,\"durationMillis\":42}\n";

/// The run's Pod ends as the API server has it: its container exited 0, the run's output in
/// its log.
fn its_pod_ends(api: &FakeApi) {
    let (started, finished) = (
        Timestamp::now() - SignedDuration::from_secs(2),
        Timestamp::now(),
    );
    api.with(|s| {
        s.pod.as_mut().unwrap()["status"] = succeeded(started, finished);
        s.log = OK_LOG.to_owned();
    });
}

#[tokio::test]
async fn a_python_run_is_decided_executed_and_finished_once() {
    let (audit, _guard) = Captured::audit();
    let api = FakeApi::start(run_json(python())).await;
    let ctx = context(&api, None);

    // First reconciliation: decide (on the cached run: no read), then the Pod (no read of the
    // Pod's name): no pool has a sandbox, so the Allow and the cold path are recorded in one
    // write, conditional on the cached run, before the Pod is asked for, then the Pod recorded.
    // The namespace's first sandbox: the runner's ConfigMap is made before its Pod.
    let action = reconcile_as(cached(&api), &ctx).await;
    assert_eq!(
        api.take_requests(),
        [
            patch_status(),
            format!("POST /api/v1/namespaces/{NS}/configmaps"),
            format!("POST /api/v1/namespaces/{NS}/pods"),
            patch_status(),
        ]
    );
    let status = api.status();
    assert_eq!(status["phase"], "Pending", "{status}");
    assert_eq!(status["reason"], "PodCreated");
    assert_eq!(status["decision"]["verdict"], "Allow");
    assert_eq!(status["podName"], POD);
    let pod = api.with(|s| s.pod.clone()).unwrap();
    assert_eq!(pod["spec"]["runtimeClassName"], "gvisor");
    assert!(action != Action::await_change());
    assert_eq!(
        api.with(|s| s.events.clone()),
        ["PolicyAllowed", "PodCreated"]
    );

    // The container ends: the result is recorded, then the Pod deleted.
    let stale = cached(&api);
    its_pod_ends(&api);
    reconcile_as(stale.clone(), &ctx).await;
    let requests = api.take_requests();
    assert_eq!(requests[0], get_pod());
    assert!(
        requests[1].ends_with(&format!("/pods/{POD}/log")),
        "{requests:?}"
    );
    // The terminal check, the terminal status, the record that its audit line is out, then the
    // Pod goes.
    assert_eq!(
        requests[2..],
        [get_run(), patch_status(), patch_status(), delete_pod()]
    );
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["reason"]),
        (&json!("Succeeded"), &json!("Succeeded"))
    );
    assert_eq!(status["stdout"], "hello from sandboxrun\n");
    assert_eq!(status["durationMillis"], 42);
    assert!(api.with(|s| s.pod.is_none()));

    // A reconcile from the stale cache (before the terminal status) does nothing: this
    // process ended the run, and its cache has not shown the end yet.
    reconcile_as(stale, &ctx).await;
    assert_eq!(api.take_requests(), Vec::<String>::new());

    // The finished run waits for its TTL.
    let action = reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.take_requests(), Vec::<String>::new());
    assert!(action != Action::await_change());
    assert!(api.with(|s| s.run.is_some()));

    let lines = audit.lines();
    assert_eq!(lines.len(), 1, "one audit line per run: {lines:?}");
    let f = &lines[0]["fields"];
    assert_eq!(
        (
            &f["run"],
            &f["tool"],
            &f["verdict"],
            &f["phase"],
            &f["phase_reason"]
        ),
        (
            &json!(RUN),
            &json!("python"),
            &json!("Allow"),
            &json!("Succeeded"),
            &json!("Succeeded")
        )
    );
}

/// Asserts that the reconcile just made ended the run in a single status write, with `phase`,
/// `reason` and the decision's `verdict`, then recorded its audit line, and that no Pod was
/// made. Returns the status. `reads`: the reads of the run before its end is written (none
/// when it was decided on the cached run and ended over it).
fn assert_ended_at_once(
    api: &FakeApi,
    reads: usize,
    phase: &str,
    reason: &str,
    verdict: &str,
) -> Value {
    let mut requests = vec![get_run(); reads];
    requests.extend([patch_status(), patch_status()]);
    assert_eq!(api.take_requests(), requests);
    let status = api.status();
    assert_eq!(
        (
            &status["phase"],
            &status["reason"],
            &status["decision"]["verdict"]
        ),
        (&json!(phase), &json!(reason), &json!(verdict)),
        "{status}"
    );
    assert!(api.with(|s| s.pod.is_none()), "a Pod was made");
    status
}

#[tokio::test]
async fn a_blocked_run_ends_rejected_without_a_pod() {
    let (audit, _guard) = Captured::audit();
    let api = FakeApi::start(run_json(python())).await;
    let ctx = context(&api, Some("default: block\nrules: []\n"));
    let action = reconcile_as(cached(&api), &ctx).await;
    let status = assert_ended_at_once(&api, 0, "Rejected", "PolicyBlocked", "Block");
    assert!(status.get("podName").is_none(), "{status}");
    assert!(action != Action::await_change());
    assert_eq!(
        api.with(|s| s.events.clone()),
        ["PolicyBlocked", "PolicyBlocked"]
    );
    assert_eq!(audit.lines().len(), 1);
    assert_eq!(audit.lines()[0]["fields"]["verdict"], "Block");
}

#[tokio::test]
async fn without_a_policy_the_operator_fails_closed() {
    let api = FakeApi::start(run_json(python())).await;
    let mut ctx = context(&api, None);
    Arc::get_mut(&mut ctx)
        .expect("not shared yet")
        .allow_without_policy = false;
    reconcile_as(cached(&api), &ctx).await;
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["decision"]["verdict"]),
        (&json!("Rejected"), &json!("Block"))
    );
    let reason = status["decision"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("blocks every run"), "{reason}");
    assert!(reason.contains("policy.enabled"), "{reason}");
    assert!(status.get("podName").is_none(), "{status}");
    assert!(
        !api.take_requests().iter().any(|r| r.contains("pods")),
        "no Pod may be touched"
    );
}

#[tokio::test]
async fn an_escalated_run_waits_and_runs_once_approved() {
    let api = FakeApi::start(run_json(python())).await;
    let ctx = context(&api, Some("default: escalate\nrules: []\n"));
    reconcile_as(cached(&api), &ctx).await;
    // Decided on the cached run; the wait recorded over it, with no read.
    assert_eq!(api.take_requests(), [patch_status()]);
    let status = api.status();
    assert_eq!(status["phase"], "AwaitingApproval", "{status}");
    assert_eq!(status["decision"]["verdict"], "Escalate");
    assert_eq!(status["approvalRequest"]["generation"], 1, "{status}");
    assert!(status["approvalRequest"].get("void").is_none(), "{status}");
    // Waiting again writes nothing.
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.take_requests(), Vec::<String>::new());

    // A person approves (a later generation): the approval is recorded, then the Pod made.
    api.with(|s| {
        let run = s.run.as_mut().unwrap();
        run["spec"]["approval"] = json!({"approved": true, "by": "alice"});
        run["metadata"]["generation"] = json!(2);
    });
    reconcile_as(cached(&api), &ctx).await;
    let requests = api.take_requests();
    assert_eq!(requests[..2], [patch_status(), get_pod()], "{requests:?}");
    assert!(api.with(|s| s.pod.is_some()));
    let status = api.status();
    let approved = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Approved")
        .unwrap();
    assert_eq!(approved["status"], "True");
    assert!(
        approved["message"]
            .as_str()
            .unwrap()
            .starts_with("alice approved"),
        "{approved}"
    );
    assert_eq!(status["phase"], "Pending");
    assert!(api.with(|s| s.events.contains(&"Approved".to_owned())));
    assert!(
        api.with(|s| s
            .event_notes
            .iter()
            .any(|n| n.starts_with("alice approved"))),
        "the Approved Event names who approved"
    );
}

#[tokio::test]
async fn an_approval_written_before_the_wait_never_counts() {
    // A run that carries an approval before anyone was asked (the schema refuses one at
    // creation; this one got past it, say from before the rule), then any other spec change that
    // raises the generation: it still waits, and only a person's later answer counts.
    let mut run = run_json(python());
    run["spec"]["approval"] = json!({"approved": true, "by": "mallory"});
    let api = FakeApi::start(run).await;
    let ctx = context(&api, Some("default: escalate\nrules: []\n"));
    reconcile_as(cached(&api), &ctx).await;
    let status = api.status();
    assert_eq!(status["phase"], "AwaitingApproval", "{status}");
    assert_eq!(
        status["approvalRequest"]["void"]["by"], "mallory",
        "{status}"
    );
    for generation in [2, 3] {
        api.with(|s| {
            let run = s.run.as_mut().unwrap();
            run["spec"]["cancelled"] = json!(false);
            run["metadata"]["generation"] = json!(generation);
        });
        reconcile_as(cached(&api), &ctx).await;
        assert!(
            api.with(|s| s.pod.is_none()),
            "no Pod at generation {generation}"
        );
        assert_eq!(api.status()["phase"], "AwaitingApproval");
    }
    // A person answers after the wait began: that counts.
    api.with(|s| {
        let run = s.run.as_mut().unwrap();
        run["spec"]["approval"] = json!({"approved": true, "by": "alice"});
        run["metadata"]["generation"] = json!(4);
    });
    reconcile_as(cached(&api), &ctx).await;
    assert!(api.with(|s| s.pod.is_some()));
    assert!(
        api.with(|s| s
            .event_notes
            .iter()
            .any(|n| n.starts_with("alice approved"))),
        "the approval named is the person's"
    );
}

#[tokio::test]
async fn a_denial_carries_the_persons_reason_into_status_event_and_audit_line() {
    let (audit, _guard) = Captured::audit();
    let api = FakeApi::start(run_json(python())).await;
    let ctx = context(&api, Some("default: escalate\nrules: []\n"));
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.status()["phase"], "AwaitingApproval");

    // A person denies it, saying why (`kubectl sandboxrun deny r --reason ...`).
    let why = "production data needs a ticket first";
    api.with(|s| {
        let run = s.run.as_mut().unwrap();
        run["spec"]["approval"] = json!({"approved": false, "by": "bob", "reason": why});
        run["metadata"]["generation"] = json!(2);
    });
    reconcile_as(cached(&api), &ctx).await;
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["reason"]),
        (&json!("Rejected"), &json!("ApprovalDenied"))
    );
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("bob denied it"), "{message}");
    assert!(message.ends_with(&format!(": {why}")), "{message}");
    let approved = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Approved")
        .unwrap();
    assert_eq!(
        (&approved["status"], &approved["reason"]),
        (&json!("False"), &json!("ApprovalDenied"))
    );
    assert!(
        approved["message"].as_str().unwrap().contains(why),
        "{approved}"
    );
    let (events, notes) = api.with(|s| (s.events.clone(), s.event_notes.clone()));
    let denied = events.iter().position(|r| r == "ApprovalDenied");
    let note = denied.map(|i| notes[i].clone()).unwrap_or_default();
    assert!(note.contains(why), "{events:?} {notes:?}");
    let lines = audit.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let fields = &lines[0]["fields"];
    assert_eq!(
        (
            &fields["phase_reason"],
            &fields["decided_by"],
            &fields["approval_reason"]
        ),
        (&json!("ApprovalDenied"), &json!("bob"), &json!(why)),
        "{fields}"
    );
}

/// Runs a python run's first reconcile against an API server that `refuses` something on the
/// Pod's path: the run must end `Failed`, `PodCreationFailed`, its message starting with `why`,
/// and no Pod exist.
async fn refused_for_good(refuses: impl FnOnce(&mut ApiState), why: &str) -> FakeApi {
    let api = FakeApi::start(run_json(python())).await;
    api.with(refuses);
    let ctx = context(&api, None);
    reconcile_as(cached(&api), &ctx).await;
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["reason"]),
        (&json!("Failed"), &json!("PodCreationFailed"))
    );
    assert!(
        status["message"].as_str().unwrap().starts_with(why),
        "{status}"
    );
    assert!(api.with(|s| s.pod.is_none()));
    api
}

#[tokio::test]
async fn a_refused_pod_fails_the_run_for_good() {
    refused_for_good(
        |s| s.refuse_pods = Some(422),
        "the API server refused the sandbox Pod",
    )
    .await;
}

#[tokio::test]
async fn a_refused_runner_config_map_fails_the_run_for_good_and_makes_no_pod() {
    let api = refused_for_good(
        |s| s.refuse_config_maps = Some(403),
        "the API server refused the sandboxes' runner ConfigMap",
    )
    .await;
    assert!(
        !api.with(|s| s.requests.clone())
            .iter()
            .any(|r| r == &format!("POST /api/v1/namespaces/{NS}/pods")),
        "no Pod is asked for without its runner"
    );
}

#[tokio::test]
async fn a_query_run_is_claimed_with_its_decision_and_ended_without_a_read() {
    let (audit, _guard) = Captured::audit();
    let sql = json!({"sql": {"database": "demo", "query": "SELECT id FROM ledger"}});
    let api = FakeApi::start(run_json(sql)).await;
    let ctx = context(&api, None);
    reconcile_as(cached(&api), &ctx).await;
    // Decided on the cached run, the Allow written with the claim (over that copy) before the
    // query, the terminal status (over the claim as written) and the record that its audit
    // line is out: three writes, no read.
    assert_eq!(
        api.take_requests(),
        [patch_status(), patch_status(), patch_status()]
    );
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["reason"], &status["tool"]),
        (
            &json!("Rejected"),
            &json!("ToolNotImplemented"),
            &json!("sql")
        )
    );
    assert_eq!(status["decision"]["verdict"], "Allow", "{status}");
    assert!(status.get("result").is_none());
    // The stale copy (before the terminal status) does not execute again, nor is it read.
    let mut stale = cached(&api);
    stale.status = serde_json::from_value(json!({"decision": status["decision"]})).unwrap();
    reconcile_as(stale.clone(), &ctx).await;
    assert_eq!(api.take_requests(), Vec::<String>::new());
    // Nor by another process (a new leader), which reads the run before it claims.
    let other = context(&api, None);
    reconcile_as(stale, &other).await;
    assert_eq!(api.take_requests(), [get_run()]);
    assert_eq!(audit.lines().len(), 1);
}

/// A context whose operator has the SQLite demo database as `demo`, and the embedded policy
/// (which lets any agent read its `ledger` table).
async fn context_with_demo_database(api: &FakeApi, tag: &str) -> Arc<Context> {
    let (databases, _dir) = crate::fixtures::demo_databases(tag).await;
    let policy = sandboxrun_core::policy::embedded::EMBEDDED_POLICY;
    let ctx = Arc::try_unwrap(context(api, Some(policy)))
        .ok()
        .expect("not shared yet")
        .with_databases(Some(databases));
    Arc::new(ctx)
}

#[tokio::test]
async fn a_query_result_is_recorded_though_the_run_was_written_after_its_claim() {
    // Someone writes the run while its query executes: the end, written over the claim as
    // this reconcile wrote it, is refused (409). The result exists only in this reconcile, so
    // the run is read as it is now and ended over that: once, with its result.
    let (audit, _guard) = Captured::audit();
    let sql =
        json!({"sql": {"database": "demo", "query": "SELECT id FROM ledger ORDER BY id LIMIT 2"}});
    let api = FakeApi::start(run_json(sql)).await;
    let ctx = context_with_demo_database(&api, "written-after-claim").await;
    api.with(|s| s.write_after_status_writes = 1);
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(
        api.take_requests(),
        [
            patch_status(),
            patch_status(),
            get_run(),
            patch_status(),
            patch_status()
        ]
    );
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["reason"]),
        (&json!("Succeeded"), &json!("QueryCompleted")),
        "{status}"
    );
    assert_eq!(
        status["result"]["rows"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );
    assert_eq!(audit.lines().len(), 1, "{:?}", audit.lines());
    // A run another replica ended meanwhile is not ended again: the end found on the read is
    // kept, and no second audit line is written.
    let sql = json!({"sql": {"database": "demo", "query": "SELECT 1"}});
    let api = FakeApi::start(run_json(sql)).await;
    let ctx = context_with_demo_database(&api, "ended-after-claim").await;
    let now = Timestamp::now().to_string();
    let ended = json!({"phase": "Cancelled", "reason": "CallCancelled", "tool": "sql",
        "completionTime": now,
        "conditions": [{"type": "Audited", "status": "True", "reason": "Written",
            "message": "m", "lastTransitionTime": now}]});
    api.with(|s| {
        s.write_after_status_writes = 1;
        s.written_status = Some(ended);
    });
    let lines = audit.lines().len();
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.status()["phase"], "Cancelled", "{}", api.status());
    assert_eq!(audit.lines().len(), lines, "{:?}", audit.lines());
}

#[tokio::test]
async fn a_run_without_a_tool_is_rejected() {
    let api = FakeApi::start(run_json(json!({}))).await;
    let ctx = context(&api, None);
    reconcile_as(cached(&api), &ctx).await;
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["reason"]),
        (&json!("Rejected"), &json!("NoTool"))
    );
    assert!(status.get("tool").is_none());
}

#[tokio::test]
async fn an_expired_run_is_deleted() {
    let mut run = run_json(python());
    run["spec"]["ttlSecondsAfterFinished"] = json!(0);
    run["status"] = json!({"phase": "Succeeded", "completionTime": "2026-11-29T08:00:00Z"});
    let api = FakeApi::start(run).await;
    let ctx = context(&api, None);
    let action = reconcile_as(cached(&api), &ctx).await;
    assert_eq!(action, Action::await_change());
    assert!(api.with(|s| s.run.is_none()));
}

// Holes of the reliability review (issue 13), each shown to end a run wrongly before.

#[tokio::test]
async fn a_conflict_on_the_quota_is_retried_not_read_as_an_existing_pod() {
    let api = FakeApi::start(run_json(python())).await;
    // What the quota admission plugin answers when two creates race for its counter.
    api.with(|s| {
        s.refuse_pods_with = Some((
            409,
            "Conflict",
            "Operation cannot be fulfilled on resourcequotas \"sandbox-quota\": the object has \
             been modified; please apply your changes to the latest version and try again",
        ))
    });
    let ctx = context(&api, None);
    // Before: read as "the Pod already exists", recorded Pending, and the next reconcile ended
    // the run Failed/PodDeleted. Now: an error, retried with backoff.
    let err = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    assert!(err.is_err(), "{err:?}");
    let phase = api.status().get("phase").cloned();
    assert_ne!(phase, Some(json!("Failed")));
    // Once the quota has room, the same run gets its Pod.
    api.with(|s| s.refuse_pods_with = None);
    reconcile_as(cached(&api), &ctx).await;
    assert!(api.with(|s| s.pod.is_some()));
    assert_eq!(api.status()["phase"], "Pending");
}

fn refuse_pods_for_quota(api: &FakeApi) {
    api.with(|s| {
        s.refuse_pods_with = Some((
            403,
            "Forbidden",
            "pods \"r-sandbox\" is forbidden: exceeded quota: sandbox-quota, requested: \
             limits.cpu=500m, used: limits.cpu=2, limited: limits.cpu=2",
        ))
    });
}

#[tokio::test]
async fn an_exhausted_quota_puts_the_run_in_the_queue_until_there_is_room() {
    let api = FakeApi::start(run_json(python())).await;
    refuse_pods_for_quota(&api);
    let ctx = context(&api, None);
    // Before: Failed/PodCreationFailed at once; then Pending, WaitingForQuota, each run retrying
    // on its own. Now: Pending, Queued, with its place, and asked again soon as the head.
    let action = reconcile_as(cached(&api), &ctx).await;
    let status = api.status();
    assert_eq!(
        (
            &status["phase"],
            &status["reason"],
            &status["queuePosition"]
        ),
        (&json!("Pending"), &json!("Queued"), &json!(1)),
        "{status}"
    );
    assert!(status["queuedAt"].is_string(), "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("number 1 in the queue"), "{message}");
    assert_eq!(action, Action::requeue(crate::admission::HEAD_RETRY));
    // The next reconcile (no Pod, no Pod name) tries to create it again, not "Pod deleted".
    api.with(|s| s.refuse_pods_with = None);
    reconcile_as(cached(&api), &ctx).await;
    assert!(api.with(|s| s.pod.is_some()));
    let status = api.status();
    assert_eq!(status["phase"], "Pending");
    assert_eq!(status["reason"], "PodCreated");
    // Out of the queue; when it began waiting stays on the record.
    assert!(status.get("queuePosition").is_none(), "{status}");
    assert!(status["queuedAt"].is_string(), "{status}");
}

/// A run that waited in the queue and ended here (its caller cancelled it), reconciled again
/// on a copy from before its end (woken by its Pod or the queue before the cache showed the
/// end): the copy says it waits. Nothing is done, not even a read: in the full load of
/// 2026-12-08, acting on such copies put ended runs back in the queue and wrote places over
/// their ends (refused there by the CRD's forward-only rule).
#[tokio::test]
async fn a_copy_from_before_this_processs_own_end_of_the_run_is_not_acted_on() {
    let (audit, _guard) = Captured::audit();
    let api = FakeApi::start(run_json(python())).await;
    refuse_pods_for_quota(&api);
    let ctx = context(&api, None);
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.status()["reason"], "Queued", "{}", api.status());
    let waiting = cached(&api);
    someone_else_writes(&api, |run| {
        run["spec"]["cancelled"] = json!(true);
        run["metadata"]["generation"] = json!(2);
    });
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.status()["phase"], "Cancelled", "{}", api.status());
    api.take_requests();
    for _ in 0..2 {
        reconcile_as(waiting.clone(), &ctx).await;
        assert_eq!(api.take_requests(), Vec::<String>::new());
    }
    assert_eq!(api.status()["phase"], "Cancelled", "{}", api.status());
    assert_eq!(audit.lines().len(), 1, "{:?}", audit.lines());
    // The queue holds nobody: the next run goes at once.
    let next = ObjectRef::<SandboxRun>::new("next").within(NS);
    let ask = ctx.admission.ask(
        &next,
        "uid-next",
        "another-agent",
        None,
        std::time::Duration::from_secs(1),
        None,
        Timestamp::now(),
    );
    assert!(matches!(ask, crate::admission::Ask::Go), "{ask:?}");
    // Once the cache shows the end, the run is an ended one again (its TTL, its audit record).
    let action = reconcile_as(cached(&api), &ctx).await;
    assert!(action != Action::await_change());
}

#[tokio::test]
async fn a_run_the_quota_refused_that_cannot_get_a_sandbox_in_time_is_refused_with_a_hint_and_nothing_run()
 {
    let api = FakeApi::start(run_json(python())).await;
    refuse_pods_for_quota(&api);
    let ctx = Arc::try_unwrap(context(&api, None))
        .ok()
        .expect("not shared yet");
    // No time to wait at all: judged when it joins the queue, the run is refused there.
    let ctx = Arc::new(ctx.with_queue_allowance(std::time::Duration::ZERO));
    reconcile_as(cached(&api), &ctx).await;
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["reason"]),
        (&json!("Rejected"), &json!("NoCapacity")),
        "{status}"
    );
    assert_eq!(status["retryAfterSeconds"], 1, "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("retry in 1 s"), "{message}");
    assert!(api.with(|s| s.pod.is_none()), "nothing ran");
}

/// A context whose namespace's queue already has a run of another agent waiting in it, so that
/// a new run cannot go straight to a sandbox; runs may wait for one up to `allowance`.
fn context_with_a_run_waiting(api: &FakeApi, allowance: std::time::Duration) -> Arc<Context> {
    let ctx = Arc::try_unwrap(context(api, None))
        .ok()
        .expect("not shared yet")
        .with_queue_allowance(allowance);
    let waiting = ObjectRef::<SandboxRun>::new("an-earlier-run").within(NS);
    let ask = ctx.admission.no_room(
        &waiting,
        "uid-of-an-earlier-run",
        "another-agent",
        None,
        std::time::Duration::from_secs(1),
        Timestamp::now(),
    );
    assert!(matches!(ask, crate::admission::Ask::Wait(_)), "{ask:?}");
    Arc::new(ctx)
}

#[tokio::test]
async fn a_run_refused_on_arrival_records_its_decision_and_its_refusal_in_one_write() {
    let (audit, _guard) = Captured::audit();
    let api = FakeApi::start(run_json(python())).await;
    // Less than the run may hold a sandbox (5 s and its Pod's grace): with a sandbox ahead of
    // it and no pace known yet, it cannot be sure to start in time.
    let ctx = context_with_a_run_waiting(&api, std::time::Duration::from_secs(12));
    reconcile_as(cached(&api), &ctx).await;
    // The decision and the refusal in one write (before: the decision had a write of its own),
    // over the cached run it was decided on (before: read, and before that read twice).
    let status = assert_ended_at_once(&api, 0, "Rejected", "NoCapacity", "Allow");
    assert!(status["retryAfterSeconds"].as_u64().is_some(), "{status}");
    // Decided once: one policy Event, one audit line that carries the decision.
    assert_eq!(
        api.with(|s| s.events.clone()),
        ["PolicyAllowed", "NoCapacity"]
    );
    let lines = audit.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["fields"]["verdict"], "Allow", "{lines:?}");
}

#[tokio::test]
async fn a_run_whose_cached_status_lags_its_sandbox_does_not_join_the_queue_again() {
    let api = FakeApi::start(run_json(python())).await;
    let ctx = context_with_a_run_waiting(&api, crate::admission::DEFAULT_ALLOWANCE);
    reconcile_as(cached(&api), &ctx).await;
    // The cache's copy of the run still says it waits when its turn comes.
    let stale = cached(&api);
    assert_eq!(stale.status.as_ref().unwrap().queue_position, Some(2));
    let earlier = ObjectRef::<SandboxRun>::new("an-earlier-run").within(NS);
    ctx.admission
        .ended(&earlier, "uid-of-an-earlier-run", Timestamp::now());
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.status()["podName"], POD, "{}", api.status());
    api.take_requests();
    // Its Pod's event comes before its own status write reaches the cache: the run is read as
    // any run with a sandbox is, not taken for one that waits.
    reconcile_as(stale, &ctx).await;
    assert!(api.take_requests().contains(&get_pod()));
    assert_eq!(api.status()["podName"], POD, "{}", api.status());
    // It stands in the queue as nobody: a new run goes straight to a sandbox.
    let other = ObjectRef::<SandboxRun>::new("a-later-run").within(NS);
    let ask = ctx.admission.ask(
        &other,
        "uid-of-a-later-run",
        "another-agent",
        None,
        std::time::Duration::from_secs(1),
        None,
        Timestamp::now(),
    );
    assert_eq!(ask, crate::admission::Ask::Go);
}

#[tokio::test]
async fn a_refusal_is_written_only_over_the_run_as_it_was_decided_on() {
    let (audit, _guard) = Captured::audit();
    let api = FakeApi::start(run_json(python())).await;
    let ctx = context_with_a_run_waiting(&api, std::time::Duration::from_secs(12));
    // Someone else wrote the run after the copy the operator decides on.
    let stale = cached(&api);
    someone_else_writes(&api, |_| {});
    reconcile_as(stale, &ctx).await;
    // The refusal was conditional on that copy: refused by the API server, nothing recorded,
    // no audit line.
    assert_eq!(api.take_requests(), [patch_status()]);
    assert!(api.status().is_null(), "{}", api.status());
    assert!(audit.lines().is_empty());
    // The next reconcile decides it on the run as it is now and ends it, once.
    reconcile_as(cached(&api), &ctx).await;
    let status = assert_ended_at_once(&api, 0, "Rejected", "NoCapacity", "Allow");
    assert!(status["retryAfterSeconds"].as_u64().is_some(), "{status}");
    assert_eq!(audit.lines().len(), 1);
}

#[tokio::test]
async fn a_run_that_waits_on_arrival_records_its_decision_with_its_place() {
    let api = FakeApi::start(run_json(python())).await;
    let ctx = context_with_a_run_waiting(&api, crate::admission::DEFAULT_ALLOWANCE);
    let stale = cached(&api);
    reconcile_as(stale.clone(), &ctx).await;
    assert_eq!(api.take_requests(), [patch_status()]);
    let status = api.status();
    assert_eq!(
        (
            &status["phase"],
            &status["reason"],
            &status["queuePosition"]
        ),
        (&json!("Pending"), &json!("Queued"), &json!(2)),
        "{status}"
    );
    assert_eq!(status["decision"]["verdict"], "Allow", "{status}");
    // A reconcile before the cache shows that write (a requeue, another object's event) reads
    // the run rather than deciding it again.
    reconcile_as(stale, &ctx).await;
    assert_eq!(api.take_requests()[0], get_run());
    assert_eq!(api.with(|s| s.events.clone()), ["PolicyAllowed"]);
    // Its next reconcile acts on the recorded decision: no second one.
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.with(|s| s.events.clone()), ["PolicyAllowed"]);
    assert_eq!(api.status()["decision"], status["decision"]);
}

/// Someone other than this operator writes the run (`change` to its JSON): its resourceVersion
/// moves on, as on a real API server.
fn someone_else_writes(api: &FakeApi, change: impl FnOnce(&mut Value)) {
    api.with(|s| {
        let run = s.run.as_mut().expect("the run exists");
        change(run);
        let rv: u64 = run["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("a numeric resourceVersion");
        run["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
    });
}

/// A run decided on its cached copy after its caller cancelled it (a copy the cache had not
/// updated yet): whatever the decision leads to first, a sandbox created or claimed, a place
/// in the queue, a refusal, a Block, an escalation or a query, nothing is written over the
/// cancel and nothing starts; the next reconcile ends the run Cancelled, once.
#[tokio::test]
async fn a_decision_on_a_copy_the_caller_cancelled_since_writes_nothing_and_starts_nothing() {
    let sql = json!({"sql": {"database": "demo", "query": "SELECT id FROM ledger"}});
    type Case = (&'static str, Value, fn(&FakeApi) -> Arc<Context>);
    let cases: Vec<Case> = vec![
        ("a cold sandbox", run_json(python()), |api| {
            context(api, None)
        }),
        ("a warm sandbox", default_limits_run(), |api| {
            api.with(|s| s.pool_pods = vec![pool_pod("default-aaaaa", "7")]);
            context_with_pool(api)
        }),
        ("a place in the queue", run_json(python()), |api| {
            context_with_a_run_waiting(api, crate::admission::DEFAULT_ALLOWANCE)
        }),
        ("a refusal", run_json(python()), |api| {
            context_with_a_run_waiting(api, std::time::Duration::from_secs(12))
        }),
        ("a Block", run_json(python()), |api| {
            context(api, Some("default: block\nrules: []\n"))
        }),
        ("an escalation", run_json(python()), |api| {
            context(api, Some("default: escalate\nrules: []\n"))
        }),
        ("a query", run_json(sql), |api| context(api, None)),
    ];
    for (case, run, ctx) in cases {
        let (audit, _guard) = Captured::audit();
        let api = FakeApi::start(run).await;
        let ctx = ctx(&api);
        let stale = cached(&api);
        someone_else_writes(&api, |run| {
            run["spec"]["cancelled"] = json!(true);
            run["metadata"]["generation"] = json!(2);
        });
        reconcile_as(stale, &ctx).await;
        let requests = api.take_requests();
        assert!(api.status().is_null(), "{case}: {}", api.status());
        assert!(
            !requests
                .iter()
                .any(|r| !r.starts_with("GET") && r.contains("/pods")),
            "{case}: a sandbox was made or claimed: {requests:?}"
        );
        assert!(
            api.with(|s| s.pod.is_none()
                && s.pool_pods
                    .iter()
                    .all(|p| p["metadata"]["resourceVersion"] == "7")),
            "{case}"
        );
        assert!(audit.lines().is_empty(), "{case}");
        reconcile_as(cached(&api), &ctx).await;
        let status = api.status();
        assert_eq!(status["phase"], "Cancelled", "{case}: {status}");
        assert_eq!(audit.lines().len(), 1, "{case}");
    }
}

/// A store of the namespace's quotas, seen just now: `used` Pods of `hard`.
fn quota_room(hard: u32, used: u32) -> crate::quota_room::QuotaRoom {
    let (reader, mut writer) = kube::runtime::reflector::store();
    let quota: k8s_openapi::api::core::v1::ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "sandbox-quota", "namespace": NS},
        "spec": {"hard": {"pods": hard.to_string()}},
        "status": {"hard": {"pods": hard.to_string()}, "used": {"pods": used.to_string()}},
    }))
    .unwrap();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(quota));
    crate::quota_room::QuotaRoom::new(reader, kube::runtime::reflector::store().0)
        .seen_at(Timestamp::now())
}

/// Reconciles the run in the background until its Pod's create is on its way (held there),
/// and says what a run arriving meanwhile may do, with room for `room` sandboxes as the quota
/// was last seen (the reconciled run's among them); then lets the create be answered.
async fn a_run_arriving_while_a_create_is_on_its_way(
    api: &FakeApi,
    ctx: &Arc<Context>,
    room: Option<u32>,
) -> crate::admission::Ask {
    api.with(|s| s.hold_pod_creates = true);
    let reconciling = tokio::spawn(reconcile(Arc::new(cached(api)), ctx.clone()));
    let create = format!("POST /api/v1/namespaces/{NS}/pods");
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while !api.with(|s| s.requests.contains(&create)) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the run asks for its Pod");
    let later = ObjectRef::<SandboxRun>::new("a-later-run").within(NS);
    let ask = ctx.admission.ask(
        &later,
        "uid-of-a-later-run",
        "another-agent",
        None,
        std::time::Duration::from_secs(1),
        room.map(|sandboxes| crate::admission::Room {
            sandboxes,
            seen: Timestamp::now(),
            counted: Arc::default(),
            warm: 0,
        }),
        Timestamp::now(),
    );
    api.with(|s| s.hold_pod_creates = false);
    reconciling.await.unwrap().unwrap();
    ask
}

#[tokio::test]
async fn a_burst_asks_for_no_more_pods_than_the_quota_has_room_for() {
    // Room for one: the run asks, and a run arriving while its create is on its way is judged
    // in the queue at once instead of asking too (and being refused by the quota first).
    let api = FakeApi::start(run_json(python())).await;
    let ctx = Arc::try_unwrap(context(&api, None)).ok().unwrap();
    let ctx = Arc::new(ctx.with_quota_room(quota_room(5, 4), kube::runtime::reflector::store().0));
    let later = a_run_arriving_while_a_create_is_on_its_way(&api, &ctx, Some(1)).await;
    assert_eq!(later, crate::admission::Ask::Head, "the first in the queue");
    assert_eq!(api.status()["reason"], "PodCreated", "{}", api.status());
    // Room for two: both ask.
    let api = FakeApi::start(run_json(python())).await;
    let ctx = Arc::try_unwrap(context(&api, None)).ok().unwrap();
    let ctx = Arc::new(ctx.with_quota_room(quota_room(5, 3), kube::runtime::reflector::store().0));
    let later = a_run_arriving_while_a_create_is_on_its_way(&api, &ctx, Some(2)).await;
    assert_eq!(later, crate::admission::Ask::Go);
    // The quota full: the run heads the queue and asks for it (the quota seen may lag a
    // sandbox just freed); a run arriving meanwhile waits behind it.
    let api = FakeApi::start(run_json(python())).await;
    let ctx = Arc::try_unwrap(context(&api, None)).ok().unwrap();
    let ctx = Arc::new(ctx.with_quota_room(quota_room(5, 5), kube::runtime::reflector::store().0));
    let later = a_run_arriving_while_a_create_is_on_its_way(&api, &ctx, None).await;
    assert!(
        matches!(&later, crate::admission::Ask::Wait(p) if p.position == 2),
        "{later:?}"
    );
}

#[tokio::test]
async fn the_sandboxes_ready_in_a_pool_the_run_fits_are_room_too() {
    // The quota full, a sandbox idle in the pool as the watch has it: the run asks on its own
    // (it may claim it), and a run arriving meanwhile finds nobody waiting. (The fake has no
    // such Pod: the claim finds it gone, and the run goes cold.)
    let api = FakeApi::start(default_limits_run()).await;
    let ctx = Arc::try_unwrap(context_watching_idle(&api, &[("default-aaaaa", "7")]))
        .ok()
        .unwrap();
    let ctx = Arc::new(ctx.with_quota_room(quota_room(5, 5), kube::runtime::reflector::store().0));
    let later = a_run_arriving_while_a_create_is_on_its_way(&api, &ctx, None).await;
    assert_eq!(later, crate::admission::Ask::Go);
    // The same sandbox claimed by this operator a moment ago, which the watch and the pool's
    // status do not show yet: it is no room, and the run heads the queue.
    let api = FakeApi::start(default_limits_run()).await;
    let (pools, mut writer) = kube::runtime::reflector::store();
    let mut pool = pool_object(2);
    pool.status = Some(serde_json::from_value(json!({"readyReplicas": 1})).unwrap());
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pool));
    let watching = context_watching_idle(&api, &[("default-aaaaa", "7")]);
    watching.claimed_pods.add("default-aaaaa", "another-run");
    let ctx = Arc::try_unwrap(watching).ok().unwrap();
    let idle = ctx.idle_pods.clone();
    let ctx = Arc::new(
        ctx.with_pools(pools, idle)
            .with_quota_room(quota_room(5, 5), kube::runtime::reflector::store().0),
    );
    let later = a_run_arriving_while_a_create_is_on_its_way(&api, &ctx, None).await;
    assert!(
        matches!(&later, crate::admission::Ask::Wait(_)),
        "{later:?}"
    );
    // No sandbox in the pool at all: the run heads the queue.
    let api = FakeApi::start(default_limits_run()).await;
    let ctx = Arc::try_unwrap(context_with_pool(&api)).ok().unwrap();
    let ctx = Arc::new(ctx.with_quota_room(quota_room(5, 5), kube::runtime::reflector::store().0));
    let later = a_run_arriving_while_a_create_is_on_its_way(&api, &ctx, None).await;
    assert!(
        matches!(&later, crate::admission::Ask::Wait(_)),
        "{later:?}"
    );
}

#[tokio::test]
async fn a_pod_of_an_earlier_run_with_the_same_name_is_not_adopted() {
    let api = FakeApi::start(run_json(python())).await;
    // A finished Pod left by a deleted run of the same name (another uid), with a log that
    // says Succeeded.
    api.with(|s| {
        s.pod = Some(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{RUN}-sandbox"), "namespace": NS,
                "ownerReferences": [{"apiVersion": "sandboxrun.dev/v1alpha1", "kind": "SandboxRun",
                    "name": RUN, "uid": "uid-of-the-earlier-run", "controller": true}]},
            "status": {"phase": "Succeeded", "containerStatuses": [{"name": "sandbox",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]},
        }));
        s.log = "{\"sandboxrun\":1,\"exitCode\":0,\"stdout\":\"the earlier run's output\\n\",\
                 \"stderr\":\"\",\"stdoutTruncated\":false,\"stderrTruncated\":false,\
                 \"signal\":null,\"oomKill\":null}\n"
            .to_owned();
    });
    let ctx = context(&api, None);
    // The reconcile that decides the run does not read its Pod's name (no Pod of its own can
    // exist before its decision): its create meets the one there, and it looks again.
    reconcile_as(cached(&api), &ctx).await;
    assert!(api.with(|s| s.pod.is_some()));
    assert!(api.status().get("podName").is_none(), "{}", api.status());
    reconcile_as(cached(&api), &ctx).await;
    // Before: Succeeded with the earlier run's output. Now: that Pod is removed, unread.
    let status = api.status();
    assert_ne!(status.get("phase"), Some(&json!("Succeeded")), "{status}");
    assert!(status.get("stdout").is_none(), "{status}");
    assert!(
        !api.take_requests().iter().any(|r| r.ends_with("/log")),
        "the earlier run's log was read"
    );
    assert!(api.with(|s| s.pod.is_none()), "the stale Pod is deleted");
    // Then the run gets its own Pod.
    reconcile_as(cached(&api), &ctx).await;
    let owner =
        api.with(|s| s.pod.clone().unwrap()["metadata"]["ownerReferences"][0]["uid"].clone());
    assert_eq!(owner, "uid-1");
}

#[tokio::test]
async fn a_stalled_log_read_does_not_hang_the_reconcile() {
    let api = FakeApi::start(run_json(python())).await;
    api.with(|s| {
        s.stall_logs = true;
        s.pod = Some(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{RUN}-sandbox"), "namespace": NS,
                "ownerReferences": [{"apiVersion": "sandboxrun.dev/v1alpha1", "kind": "SandboxRun",
                    "name": RUN, "uid": "uid-1", "controller": true}]},
            "status": {"phase": "Succeeded", "containerStatuses": [{"name": "sandbox",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                    "finishedAt": Timestamp::now().to_string()}}}]},
        }));
    });
    let mut ctx = context(&api, None);
    Arc::get_mut(&mut ctx)
        .expect("not shared yet")
        .log_read_timeout = std::time::Duration::from_millis(300);
    // Decided first (the reconcile that decides does not look at the Pod yet).
    reconcile_as(cached(&api), &ctx).await;
    // Before: the log read waited forever and so did the run. Now: the read times out and the
    // reconcile fails (retried with backoff until the log retry window ends the run NoResult).
    let result = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        reconcile(Arc::new(cached(&api)), ctx.clone()),
    )
    .await
    .expect("the reconcile returned");
    let err = result.expect_err("an unreadable log is an error");
    assert!(err.to_string().contains("reading the log"), "{err}");
}

#[test]
fn the_cache_keeps_no_managed_fields_and_no_output_of_finished_runs() {
    let mut run: SandboxRun = serde_json::from_value(run_json(python())).unwrap();
    run.metadata.managed_fields = Some(vec![Default::default()]);
    // kubectl apply's last-applied annotation repeats the whole spec, code included.
    run.metadata.annotations = Some(
        [(
            "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
            "x".repeat(65_536),
        )]
        .into(),
    );
    run.status = Some(sandboxrun_api::SandboxRunStatus {
        phase: Some(sandboxrun_core::Phase::Running),
        ..Default::default()
    });
    // A run in flight keeps its code (its Pod is built from it).
    run.spec.python.as_mut().unwrap().files = vec![sandboxrun_core::InputFile {
        name: "in.csv".into(),
        content: vec![b'x'; 65_536],
    }];
    let mut running = run.clone();
    trim(&mut running);
    assert!(running.metadata.managed_fields.is_none());
    assert!(running.metadata.annotations.is_none());
    assert!(!running.spec.python.as_ref().unwrap().code.is_empty());
    // And its input files (they go with the program).
    assert_eq!(running.spec.python.as_ref().unwrap().files.len(), 1);
    // A finished one keeps what its TTL needs, not its code, output or result.
    run.status = Some(sandboxrun_api::SandboxRunStatus {
        phase: Some(sandboxrun_core::Phase::Succeeded),
        stdout: Some("x".repeat(65_536)),
        stderr: Some("y".into()),
        result: Some(json!({"rows": [[1]]})),
        files: vec![sandboxrun_api::StatusFile {
            name: "plot.png".into(),
            mime_type: "image/png".into(),
            size: 300_000,
            data: "A".repeat(400_000),
        }],
        files_omitted: vec![sandboxrun_core::files::OmittedFile {
            name: "big".into(),
            size: None,
            reason: sandboxrun_core::files::OmitReason::ByteCount,
        }],
        pod_name: Some("p".into()),
        reason: Some("Succeeded".into()),
        message: Some("m".repeat(4096)),
        completion_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::now(),
        )),
        conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Succeeded".into(),
            message: "m".repeat(1024),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::now(),
            ),
            observed_generation: None,
        }],
        decision: Some(sandboxrun_api::Decision {
            verdict: sandboxrun_core::Verdict::Allow,
            rule: "r".repeat(256),
            reason: "why".repeat(100),
            grant: None,
        }),
        ..Default::default()
    });
    trim(&mut run);
    let st = run.status.as_ref().unwrap();
    assert!(st.stdout.is_none() && st.stderr.is_none() && st.result.is_none());
    assert!(st.message.is_none() && st.conditions.is_empty());
    assert!(st.files.is_empty() && st.files_omitted.is_empty());
    assert!(run.spec.python.as_ref().unwrap().files.is_empty());
    // What the TTL and the end's recognition read stays.
    assert_eq!(st.pod_name.as_deref(), Some("p"));
    assert_eq!(st.reason.as_deref(), Some("Succeeded"));
    assert!(st.completion_time.is_some());
    let decision = st.decision.as_ref().unwrap();
    assert_eq!(decision.verdict, sandboxrun_core::Verdict::Allow);
    assert!(decision.rule.is_empty() && decision.reason.is_empty());
    assert!(run.spec.python.as_ref().unwrap().code.is_empty());
}

#[tokio::test]
async fn a_cancelled_run_ends_cancelled_once_with_its_audit_line_and_no_pod() {
    let (audit, _guard) = Captured::audit();
    let api = FakeApi::start(run_json(python())).await;
    let ctx = context(&api, None);
    // Decided and its Pod created.
    reconcile_as(cached(&api), &ctx).await;
    api.take_requests();
    assert!(api.with(|s| s.pod.is_some()));

    // The caller goes away: the frontend sets spec.cancelled.
    api.with(|s| {
        let run = s.run.as_mut().unwrap();
        run["spec"]["cancelled"] = json!(true);
        run["metadata"]["generation"] = json!(2);
    });
    let stale = cached(&api);
    reconcile_as(stale.clone(), &ctx).await;
    let requests = api.take_requests();
    // The terminal check, the status, the record that its audit line is out, then the sandbox
    // goes.
    assert_eq!(
        requests,
        [get_run(), patch_status(), patch_status(), delete_pod()],
        "{requests:?}"
    );
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["reason"]),
        (&json!("Cancelled"), &json!("CallCancelled"))
    );
    assert!(api.with(|s| s.pod.is_none()));
    // Again from the stale copy: nothing is ended twice.
    reconcile_as(stale, &ctx).await;
    assert!(!api.take_requests().contains(&patch_status()));

    let lines = audit.lines();
    assert_eq!(lines.len(), 1, "one audit line: {lines:?}");
    assert_eq!(lines[0]["fields"]["phase"], "Cancelled");
    assert_eq!(lines[0]["fields"]["phase_reason"], "CallCancelled");
}

#[tokio::test]
async fn a_finished_run_of_long_ago_sends_no_delete_for_its_pod() {
    // A relist reconciles every stored run: those that ended long ago must cost no API call
    // (their Pods went with them), only those that ended just now get their Pod deleted again.
    let mut run = run_json(python());
    let long_ago = Timestamp::now() - SignedDuration::from_mins(30);
    run["status"] = json!({"phase": "Succeeded", "reason": "Succeeded", "podName": POD,
        "completionTime": long_ago.to_string()});
    let api = FakeApi::start(run).await;
    let ctx = context(&api, None);
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.take_requests(), Vec::<String>::new());

    api.with(|s| {
        s.run.as_mut().unwrap()["status"]["completionTime"] = json!(Timestamp::now().to_string());
    });
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.take_requests(), [delete_pod()]);

    // Each change of the terminating Pod reconciles the run again: no DELETE more.
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.take_requests(), Vec::<String>::new());
    // Nor from a process that did not delete it (a new leader), once the Pods' watch has it
    // terminating.
    let (pods, mut writer) = kube::runtime::reflector::store::<Pod>();
    let ctx = Arc::try_unwrap(context(&api, None)).ok().unwrap();
    let ctx = Arc::new(ctx.with_quota_room(Default::default(), pods));
    let terminating: Pod = serde_json::from_value(json!({
        "metadata": {"name": POD, "namespace": NS,
                     "deletionTimestamp": Timestamp::now().to_string()},
    }))
    .unwrap();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(terminating));
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.take_requests(), Vec::<String>::new());
}

#[tokio::test]
async fn a_cold_run_ends_on_the_answer_read_off_its_stream_before_the_kubelet_says_it_ended() {
    use crate::python::feed::{Answer, FeedState};
    let api = FakeApi::start(run_json(python())).await;
    let ctx = context(&api, None);
    reconcile_as(cached(&api), &ctx).await;
    // The early feeder handed the program over and read the runner's envelope; the kubelet has
    // not even reported the container running (the Pod has no status).
    ctx.feeds.mark_fed("uid-1");
    let sent_at = Timestamp::now() - SignedDuration::from_millis(300);
    let answer = Answer {
        log: format!("{} 10\n{OK_LOG}", sandboxrun_core::PROGRAM_RECEIVED),
        exit_code: 0,
        sent_at,
        read_at: Timestamp::now(),
    };
    let run = kube::runtime::reflector::ObjectRef::new(RUN).within(NS);
    assert!(ctx.feeds.answered(run, "uid-1", answer));
    assert!(matches!(
        ctx.feeds.state("uid-1"),
        Some(FeedState::Answered(_))
    ));
    api.take_requests();
    reconcile_as(cached(&api), &ctx).await;
    let requests = api.take_requests();
    // No log read: the answer is the log.
    assert!(
        !requests.iter().any(|r| r.ends_with("/log")),
        "{requests:?}"
    );
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["reason"]),
        (&json!("Succeeded"), &json!("Succeeded"))
    );
    assert_eq!(status["stdout"], "hello from sandboxrun\n");
    // When the program was sent (Kubernetes keeps whole seconds).
    let started: Timestamp = status["startTime"].as_str().unwrap().parse().unwrap();
    assert_eq!(started.as_second(), sent_at.as_second());
    assert!(api.with(|s| s.pod.is_none()), "the Pod is deleted");
    assert_eq!(ctx.feeds.state("uid-1"), None, "forgotten with the run");
    assert!(
        api.with(|s| s.events.clone())
            .contains(&"Started".to_owned()),
        "it ran, though the kubelet had not said so"
    );
    // Its start counts once, with its wait, though it was never recorded Running.
    let metrics = ctx.metrics.render();
    for counted in [
        "sandboxrun_queue_to_start_seconds_count 1",
        "sandboxrun_runs_total{phase=\"Running\"} 1",
    ] {
        assert!(metrics.contains(counted), "{counted} in\n{metrics}");
    }
}

/// A python run whose cold Pod was created and whose code then exited 0 two seconds later, with
/// its envelope in the log: the next reconcile ends it.
async fn a_run_whose_code_succeeded() -> (FakeApi, Arc<Context>) {
    let api = FakeApi::start(run_json(python())).await;
    let ctx = context(&api, None);
    reconcile_as(cached(&api), &ctx).await;
    its_pod_ends(&api);
    (api, ctx)
}

#[tokio::test]
async fn a_terminal_write_that_committed_with_its_answer_lost_still_gets_one_audit_line() {
    let (audit, _guard) = Captured::audit();
    let (api, ctx) = a_run_whose_code_succeeded().await;
    // Every answer to a status write is lost, however often the client retries it.
    api.with(|s| s.lose_status_responses = 100);
    let stale = cached(&api);
    assert!(
        reconcile(Arc::new(stale.clone()), ctx.clone())
            .await
            .is_err()
    );
    // It committed: the API server has the terminal status, but no audit line was written.
    assert_eq!(api.status()["phase"], "Succeeded");
    assert!(audit.lines().is_empty());
    api.with(|s| s.lose_status_responses = 0);

    // The retry (from the stale cache, or the fresh one) finds the run ended and writes the line.
    reconcile_as(stale, &ctx).await;
    reconcile_as(cached(&api), &ctx).await;
    let lines = audit.lines();
    assert_eq!(lines.len(), 1, "one audit line: {lines:?}");
    assert_eq!(lines[0]["fields"]["phase"], "Succeeded");
}

#[tokio::test]
async fn an_audit_line_owed_by_an_operator_that_died_is_written_by_the_next_one() {
    let (audit, _guard) = Captured::audit();
    let (api, ctx) = a_run_whose_code_succeeded().await;
    reconcile_as(cached(&api), &ctx).await;
    let status = api.status();
    assert_eq!(status["phase"], "Succeeded");
    let audited = |status: &Value| {
        status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Audited")
            .map(|c| c["status"].as_str().unwrap_or_default().to_owned())
    };
    assert_eq!(audited(&status).as_deref(), Some("True"), "{status}");
    assert_eq!(audit.lines().len(), 1);

    // As an operator killed between the terminal status and its audit line leaves the run.
    api.with(|s| {
        let conditions = s.run.as_mut().unwrap()["status"]["conditions"]
            .as_array_mut()
            .unwrap();
        for c in conditions.iter_mut().filter(|c| c["type"] == "Audited") {
            c["status"] = json!("False");
        }
    });
    // The next operator (nothing in memory) writes the line, the same line, and records it.
    let next = context(&api, None);
    reconcile_as(cached(&api), &next).await;
    assert_eq!(audited(&api.status()).as_deref(), Some("True"));
    let lines = audit.lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    // The same line; its duration counts to the completion time as stored (whole seconds).
    let without_duration = |line: &Value| {
        let mut fields = line["fields"].clone();
        fields.as_object_mut().unwrap().remove("duration_ms");
        fields
    };
    assert_eq!(without_duration(&lines[0]), without_duration(&lines[1]));
    // Recorded: no third line, from either operator.
    reconcile_as(cached(&api), &next).await;
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(audit.lines().len(), 2);
}

#[tokio::test]
async fn a_started_pod_the_status_does_not_name_is_recorded_before_its_program_is_sent() {
    // The operator stopped between creating the Pod and recording it; the Pod has started. It is
    // recorded first (so that, should it vanish, the run ends PodDeleted rather than running the
    // code in a second Pod), and only then attached to.
    let api = FakeApi::start(run_json(python())).await;
    let ctx = context(&api, None);
    reconcile_as(cached(&api), &ctx).await;
    api.with(|s| {
        let run = s.run.as_mut().unwrap();
        run["status"]["podName"] = Value::Null;
        run["status"]["phase"] = Value::Null;
        let pod = s.pod.as_mut().unwrap();
        pod["status"] = json!({"phase": "Running", "containerStatuses": [{
            "name": "sandbox", "image": "sandbox:test", "imageID": "", "ready": true,
            "started": true, "restartCount": 0, "state": {"running": {"startedAt": Timestamp::now().to_string()}}}]});
    });
    api.take_requests();
    // The fake API server has no attach stream: the feed fails, after the record.
    assert!(
        reconcile(Arc::new(cached(&api)), ctx.clone())
            .await
            .is_err()
    );
    let requests = api.take_requests();
    let recorded = requests.iter().position(|r| *r == patch_status());
    let attached = requests.iter().position(|r| r.contains("/attach"));
    assert!(
        matches!((recorded, attached), (Some(r), Some(a)) if r < a),
        "{requests:?}"
    );
    assert_eq!(api.status()["podName"], POD);
    assert_eq!(api.status()["phase"], "Pending");
    // Now the Pod vanishes: the run ends PodDeleted, and no second Pod is made.
    api.with(|s| s.pod = None);
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.status()["reason"], "PodDeleted");
    assert!(api.with(|s| s.pod.is_none()));
    assert!(
        !api.take_requests()
            .iter()
            .any(|r| r.starts_with("POST /api/v1"))
    );
}

fn sql_run() -> Value {
    run_json(json!({"sql": {"database": "demo", "query": "SELECT id FROM ledger"}}))
}

#[tokio::test]
async fn a_query_another_replica_claimed_is_not_executed_again() {
    let (audit, _guard) = Captured::audit();
    let mut run = sql_run();
    let claimed_at = Timestamp::now() - SignedDuration::from_secs(2);
    run["status"] = json!({"phase": "Running", "tool": "sql", "reason": "QueryStarted",
        "message": "the query started on operator replica other-leader",
        "startTime": claimed_at.to_string(),
        "decision": {"verdict": "Allow", "rule": "r", "reason": "x"}});
    let api = FakeApi::start(run).await;
    let ctx = context(&api, None);
    // Within the query's deadline: waited for, nothing written, nothing executed.
    let action = reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.take_requests(), [get_run()]);
    assert!(action != Action::await_change());
    assert_eq!(api.status()["reason"], "QueryStarted");
    // Its holder never finished it: past the deadline the run ends QueryInterrupted, once.
    api.with(|s| {
        let past = Timestamp::now() - SignedDuration::from_mins(10);
        s.run.as_mut().unwrap()["status"]["startTime"] = json!(past.to_string());
    });
    reconcile_as(cached(&api), &ctx).await;
    let status = api.status();
    assert_eq!(
        (&status["phase"], &status["reason"]),
        (&json!("Failed"), &json!("QueryInterrupted"))
    );
    assert!(
        status["message"].as_str().unwrap().contains("other-leader"),
        "{status}"
    );
    assert_eq!(audit.lines().len(), 1);
}

#[tokio::test]
async fn an_end_written_over_a_run_that_changed_since_it_was_read_is_refused_and_not_audited() {
    // A replica that lost its lease with this run's end in flight, and the new leader, both end
    // the run. Each end is written only over the run as it read it: the other one's write moved
    // the run on, so this one is refused (409), writes no audit line and looks again; the run
    // ends once.
    let (audit, _guard) = Captured::audit();
    let (api, ctx) = a_run_whose_code_succeeded().await;
    // Another writer moves the run on right after this reconcile reads it.
    api.with(|s| s.write_after_reads = 1);
    let action = reconcile_as(cached(&api), &ctx).await;
    assert_ne!(
        api.status()["phase"],
        "Succeeded",
        "not ended over a changed run"
    );
    assert!(audit.lines().is_empty(), "{:?}", audit.lines());
    assert!(action != Action::await_change());
    // Looking again, it ends the run: once.
    reconcile_as(cached(&api), &ctx).await;
    reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.status()["phase"], "Succeeded");
    assert_eq!(audit.lines().len(), 1, "{:?}", audit.lines());
}

#[tokio::test]
async fn a_query_whose_run_changed_before_the_claim_is_not_executed() {
    // Two leaders read the same run; the other one writes it first. Our claim carries the
    // resourceVersion we read, is refused (409), and nothing is executed.
    let mut run = sql_run();
    run["metadata"]["resourceVersion"] = json!("5");
    run["status"] = json!({"tool": "sql", "phase": "Pending",
        "decision": {"verdict": "Allow", "rule": "r", "reason": "x"}});
    let api = FakeApi::start(run).await;
    let ctx = context(&api, None);
    api.with(|s| s.write_after_reads = 1);
    let action = reconcile_as(cached(&api), &ctx).await;
    assert_eq!(api.take_requests(), [get_run(), patch_status()]);
    assert!(action != Action::await_change());
    assert_eq!(api.status()["phase"], "Pending", "nothing claimed or ended");
}

#[tokio::test]
async fn a_stalled_api_server_fails_the_reconcile_in_time_instead_of_hanging_it() {
    let api = FakeApi::start(run_json(python())).await;
    let mut ctx = context(&api, None);
    Arc::get_mut(&mut ctx).unwrap().reconcile_timeout = std::time::Duration::from_millis(300);
    api.with(|s| s.stall_all = true);
    let started = std::time::Instant::now();
    let result = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    assert!(matches!(result, Err(Error::Timeout(_))), "{result:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[tokio::test]
async fn a_created_pod_is_attached_to_early_but_only_once_recorded() {
    let api = FakeApi::start(run_json(python())).await;
    let mut ctx = context(&api, None);
    Arc::get_mut(&mut ctx).unwrap().early_feed = true;
    reconcile_as(cached(&api), &ctx).await;
    // The early feeder keeps trying while the container has not started (the fake never has
    // an attach stream): its first attempt comes after the Pod was recorded. Waited for until
    // it tried twice, however long the machine takes (up to a minute).
    let mut requests = Vec::new();
    for _ in 0..600 {
        requests.extend(api.take_requests());
        if requests.iter().filter(|r| r.contains("/attach")).count() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let created = requests
        .iter()
        .position(|r| r.starts_with("POST /api/v1"))
        .unwrap();
    let recorded = created
        + requests[created..]
            .iter()
            .position(|r| *r == patch_status())
            .unwrap();
    let attached = requests
        .iter()
        .position(|r| r.contains("/attach"))
        .expect("attached");
    assert!(recorded < attached, "{requests:?}");
    assert!(
        requests.iter().filter(|r| r.contains("/attach")).count() >= 2,
        "retried: {requests:?}"
    );
    assert_eq!(
        ctx.feeds.state("uid-1"),
        Some(crate::python::feed::FeedState::Feeding)
    );
    // Meanwhile a reconcile that sees the container running waits instead of attaching too.
    api.with(|s| {
        s.pod.as_mut().unwrap()["status"] = json!({"phase": "Running", "containerStatuses": [{
            "name": "sandbox", "image": "sandbox:test", "imageID": "", "ready": true,
            "started": true, "restartCount": 0, "state": {"running": {"startedAt": Timestamp::now().to_string()}}}]});
    });
    let action = reconcile_as(cached(&api), &ctx).await;
    assert_eq!(
        action,
        Action::requeue(std::time::Duration::from_millis(100))
    );
    assert_eq!(
        api.status()["phase"],
        "Pending",
        "Running only once the program is in"
    );
    // The run ends: the early feeder stops trying.
    ctx.feeds.forget("uid-1");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    api.take_requests();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let later = api.take_requests();
    assert!(!later.iter().any(|r| r.contains("/attach")), "{later:?}");
}

/// A ready idle sandbox of pool `default`, as the pool controller starts it.
fn pool_pod(name: &str, rv: &str) -> Value {
    let pool = pool_object(2);
    let mut pod = serde_json::to_value(crate::pool::build(&pool, &ctx_sandbox()).unwrap()).unwrap();
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]["resourceVersion"] = json!(rv);
    pod["metadata"]["creationTimestamp"] = json!(Timestamp::now().to_string());
    pod["status"] = json!({"phase": "Running", "startTime": Timestamp::now().to_string(),
        "containerStatuses": [{"name": "sandbox", "image": "img", "imageID": "", "ready": true,
            "started": true, "restartCount": 0, "state": {"running": {"startedAt": Timestamp::now().to_string()}}}]});
    pod
}

fn ctx_sandbox() -> SandboxConfig {
    SandboxConfig {
        runtime_class: "gvisor".into(),
        image: "sandbox:test".into(),
        data_image: "sandbox-data:test".into(),
        tmp_size: "16Mi".into(),
        canary: None,
    }
}

fn pool_object(replicas: i32) -> sandboxrun_api::SandboxPool {
    let mut pool = sandboxrun_api::SandboxPool::new(
        "default",
        serde_json::from_value(json!({"replicas": replicas})).unwrap(),
    );
    pool.metadata.namespace = Some(NS.into());
    pool.metadata.uid = Some("pool-uid".into());
    pool
}

/// The context of [`context`], with pool `default` in its store of pools.
fn context_with_pool(api: &FakeApi) -> Arc<Context> {
    let (reader, mut writer) = kube::runtime::reflector::store();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pool_object(2)));
    let ctx = context(api, None);
    let ctx = Arc::try_unwrap(ctx).ok().expect("not shared yet");
    // No watch of idle Pods: a claim lists them (as when the operator's watch has none yet).
    Arc::new(ctx.with_pools(reader, kube::runtime::reflector::store().0))
}

/// A run with the default limits (which the default pool fits).
fn default_limits_run() -> Value {
    let mut run = run_json(python());
    run["spec"]["limits"] = json!({});
    run
}

/// A run with the default limits, and a pool with two idle sandboxes on an API server with
/// `fault` set.
async fn two_idle_sandboxes(fault: impl FnOnce(&mut crate::fixtures::ApiState)) -> FakeApi {
    let api = FakeApi::start(default_limits_run()).await;
    api.with(|s| {
        s.pool_pods = vec![
            pool_pod("default-aaaaa", "7"),
            pool_pod("default-bbbbb", "8"),
        ];
        fault(s);
    });
    api
}

#[tokio::test]
async fn a_fitting_run_claims_a_ready_sandbox_and_records_it_before_sending_code() {
    let api = FakeApi::start(default_limits_run()).await;
    api.with(|s| s.pool_pods = vec![pool_pod("default-aaaaa", "7")]);
    let ctx = context_with_pool(&api);
    // The fake has no attach stream: the hand-over fails after the claim is recorded.
    let err = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    assert!(matches!(err, Err(Error::Feed { .. })), "{err:?}");
    let requests = api.take_requests();
    let claim = format!("PATCH /api/v1/namespaces/{NS}/pods/default-aaaaa");
    let at = |r: &str| requests.iter().position(|x| x == r);
    let (claimed, recorded) = (
        at(&claim),
        requests.iter().rposition(|x| *x == patch_status()),
    );
    assert!(claimed.is_some() && recorded > claimed, "{requests:?}");
    // The decision recorded with the claim, in one write after it and before the program
    // goes over the attach stream; the run read first, found as its cached copy was when it
    // was decided.
    let writes = requests.iter().filter(|x| **x == patch_status()).count();
    assert_eq!(writes, 1, "{requests:?}");
    let read = at(&format!(
        "GET /apis/sandboxrun.dev/v1alpha1/namespaces/{NS}/sandboxruns/{RUN}"
    ));
    assert!(read.is_some() && read < claimed, "{requests:?}");
    let attached = at(&format!(
        "GET /api/v1/namespaces/{NS}/pods/default-aaaaa/attach"
    ));
    assert!(attached > recorded, "{requests:?}");
    assert_eq!(api.status()["decision"]["verdict"], "Allow");
    // Never a cold Pod next to the warm one, nor a read of its name on the warm path.
    assert!(
        !requests.iter().any(|r| r.starts_with("POST /api/v1")),
        "{requests:?}"
    );
    assert!(
        !requests
            .iter()
            .any(|r| r.ends_with(&format!("/pods/{RUN}-sandbox"))),
        "{requests:?}"
    );
    let status = api.status();
    assert_eq!(status["podName"], "default-aaaaa", "{status}");
    assert_eq!(
        (&status["path"], &status["pool"]),
        (&json!("Warm"), &json!("default"))
    );
    assert_eq!(status["reason"], "WarmSandboxClaimed");
    // The Pod is the run's now, out of the pool, with the run's deadline.
    let pod = api.with(|s| s.pod.clone()).unwrap();
    let owners = pod["metadata"]["ownerReferences"].as_array().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (&owners[0]["kind"], &owners[0]["uid"]),
        (&json!("SandboxRun"), &json!("uid-1"))
    );
    assert!(
        pod["metadata"]["labels"]
            .get(crate::pool::LABEL_POOL)
            .is_none(),
        "{pod}"
    );
    assert!(
        pod["spec"]["activeDeadlineSeconds"].as_i64().unwrap() <= 40,
        "{pod}"
    );
    assert!(api.with(|s| s.pool_pods.is_empty()));
    // The pool is told once the hand-over is done (its Pod's changes no longer reach it).
    let wakeups = ctx.pool_demand.wakeups();
    futures::pin_mut!(wakeups);
    let woken = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        futures::StreamExt::next(&mut wakeups),
    )
    .await;
    assert_eq!(
        woken.ok().flatten(),
        Some(kube::runtime::reflector::ObjectRef::new("default").within(NS))
    );
}

/// A context whose pools' store holds the default pool (2 replicas) and whose watch of idle
/// Pods shows `watched` (pool Pods: name and resourceVersion), as the API server had them.
fn context_watching_idle(api: &FakeApi, watched: &[(&str, &str)]) -> Arc<Context> {
    let (pools, mut pools_writer) = kube::runtime::reflector::store();
    pools_writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pool_object(2)));
    let (idle, mut idle_writer) = kube::runtime::reflector::store::<Pod>();
    for (name, rv) in watched {
        let mut pod: Pod = serde_json::from_value(pool_pod(name, rv)).unwrap();
        pod.metadata.namespace = Some(NS.to_owned());
        idle_writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod));
    }
    let ctx = Arc::try_unwrap(context(api, None))
        .ok()
        .expect("not shared yet");
    Arc::new(ctx.with_pools(pools, idle))
}

#[tokio::test]
async fn a_claim_takes_its_sandbox_from_the_watched_idle_pods_without_a_list() {
    let api = FakeApi::start(default_limits_run()).await;
    api.with(|s| s.pool_pods = vec![pool_pod("default-aaaaa", "7")]);
    let ctx = context_watching_idle(&api, &[("default-aaaaa", "7")]);
    let err = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    assert!(matches!(err, Err(Error::Feed { .. })), "{err:?}");
    let requests = api.take_requests();
    assert!(
        requests.contains(&format!("PATCH /api/v1/namespaces/{NS}/pods/default-aaaaa")),
        "{requests:?}"
    );
    assert!(
        !requests
            .iter()
            .any(|r| r.starts_with("GET /api/v1/namespaces/{NS}/pods?")
                || **r == format!("GET /api/v1/namespaces/{NS}/pods")),
        "the pool's Pods were listed: {requests:?}"
    );
    assert_eq!(api.status()["podName"], "default-aaaaa");

    // A watch a moment behind: the Pod it shows changed since (its resourceVersion moved on).
    // That claim conflicts; the run then reads the pool afresh and claims the Pod as it is now.
    let api = FakeApi::start(default_limits_run()).await;
    api.with(|s| s.pool_pods = vec![pool_pod("default-aaaaa", "8")]);
    let ctx = context_watching_idle(&api, &[("default-aaaaa", "7")]);
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    assert_eq!(api.status()["podName"], "default-aaaaa", "{}", api.status());
    let requests = api.take_requests();
    let claims = requests
        .iter()
        .filter(|r| **r == format!("PATCH /api/v1/namespaces/{NS}/pods/default-aaaaa"))
        .count();
    let lists = requests
        .iter()
        .filter(|r| **r == format!("GET /api/v1/namespaces/{NS}/pods"))
        .count();
    assert_eq!((claims, lists), (2, 1), "{requests:?}");
}

#[tokio::test]
async fn a_pod_this_operator_claimed_is_no_candidate_while_the_watch_still_shows_it_idle() {
    // Under load the watch shows a Pod as idle for a while after another run claimed it; a
    // claim of it could only lose, a round trip each (in a burst, five in a row).
    let api = FakeApi::start(default_limits_run()).await;
    api.with(|s| s.pool_pods = vec![pool_pod("default-bbbbb", "9")]);
    let ctx = context_watching_idle(&api, &[("default-aaaaa", "7")]);
    ctx.claimed_pods.add("default-aaaaa", "another-run");
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    let requests = api.take_requests();
    assert!(
        !requests.iter().any(|r| r.ends_with("/pods/default-aaaaa")),
        "the Pod already claimed was tried: {requests:?}"
    );
    assert_eq!(api.status()["podName"], "default-bbbbb", "{}", api.status());
    assert!(ctx.claimed_pods.contains("default-bbbbb"));
}

#[tokio::test]
async fn a_claim_made_before_a_restart_and_never_recorded_is_taken_up_not_repeated() {
    // Found by the fault suite (e2e/mcp/faults.py): the operator was SIGKILLed after its claim
    // patch committed and before it recorded the claim; the next operator claimed a second
    // sandbox for the same run. Before: a second claim; now: the first one is taken up.
    let api = two_idle_sandboxes(|_| {}).await;
    let ctx = context_with_pool(&api);
    // The first operator: decides, claims, and "dies" before the claim's record (its status
    // write is lost with it, so the status keeps the decision only).
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    let claimed = api.with(|s| s.pod.clone()).expect("a claimed sandbox");
    let claimed_name = claimed["metadata"]["name"].as_str().unwrap().to_owned();
    api.with(|s| {
        let status = &mut s.run.as_mut().unwrap()["status"];
        for field in ["podName", "path", "pool", "reason", "message"] {
            status.as_object_mut().unwrap().remove(field);
        }
        status["phase"] = json!("Pending");
    });
    api.take_requests();

    // The next operator (a fresh context: it remembers nothing).
    let ctx = context_with_pool(&api);
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    let requests = api.take_requests();
    assert!(
        !requests.iter().any(
            |r| r.starts_with(&format!("PATCH /api/v1/namespaces/{NS}/pods/"))
                || r.starts_with("POST /api/v1")
        ),
        "neither a second claim nor a cold Pod: {requests:?}"
    );
    assert_eq!(
        api.with(|s| s.pool_pods.len()),
        1,
        "the other sandbox stays idle"
    );
    let status = api.status();
    assert_eq!(status["podName"], json!(claimed_name), "{status}");
    assert_eq!(
        (&status["path"], &status["pool"]),
        (&json!("Warm"), &json!("default"))
    );
}

/// The claims a reconcile made (Pod patches) and the cold Pods it asked for.
fn sandboxes_asked(requests: &[String]) -> Vec<&String> {
    requests
        .iter()
        .filter(|r| {
            r.starts_with(&format!("PATCH /api/v1/namespaces/{NS}/pods/"))
                || r.starts_with(&format!("POST /api/v1/namespaces/{NS}/pods"))
        })
        .collect()
}

#[tokio::test]
async fn a_claim_whose_record_with_the_decision_failed_is_taken_up_when_the_run_is_decided_again() {
    // The decision goes out with the claim's record, after the claim: when that write fails,
    // the run is still undecided and is decided again; it must take up its sandbox, never
    // claim a second one.
    let api = two_idle_sandboxes(|s| s.refuse_status_writes = 1).await;
    let ctx = context_with_pool(&api);
    let first = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    assert!(first.is_err(), "{first:?}");
    assert!(api.status().is_null(), "nothing recorded: {}", api.status());
    let claimed = api.with(|s| s.pod.clone()).expect("a claimed sandbox");
    let claimed = claimed["metadata"]["name"].as_str().unwrap().to_owned();
    api.take_requests();

    // The same operator, the run as its cache has it (undecided).
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    let requests = api.take_requests();
    assert!(sandboxes_asked(&requests).is_empty(), "{requests:?}");
    let status = api.status();
    assert_eq!(status["podName"], json!(claimed), "{status}");
    assert_eq!(status["decision"]["verdict"], "Allow", "{status}");
    assert_eq!(api.with(|s| s.pool_pods.len()), 1, "the other stays idle");
}

#[tokio::test]
async fn a_claim_made_before_a_restart_with_no_record_at_all_is_taken_up_from_the_watch() {
    // The operator stopped between a claim and its record, which would have carried the run's
    // decision too: the next operator decides the run again and finds the claimed sandbox in
    // its Pod watch (listed after the claim), without asking the API server for a list.
    let api = two_idle_sandboxes(|s| s.refuse_status_writes = 1).await;
    let _ = reconcile(Arc::new(cached(&api)), context_with_pool(&api)).await;
    let claimed = api.with(|s| s.pod.clone()).expect("a claimed sandbox");
    let name = claimed["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(api.status().is_null(), "{}", api.status());
    api.take_requests();

    let ctx = context_with_pool(&api);
    let (store, mut writer) = kube::runtime::reflector::store::<Pod>();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
    writer.apply_watcher_event(&kube::runtime::watcher::Event::InitApply(
        serde_json::from_value(claimed).unwrap(),
    ));
    writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
    let _serving = ctx.watched_pods.serve(store);
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    let requests = api.take_requests();
    assert!(sandboxes_asked(&requests).is_empty(), "{requests:?}");
    assert!(
        !requests
            .iter()
            .any(|r| r == &format!("GET /api/v1/namespaces/{NS}/pods")),
        "no list: {requests:?}"
    );
    let status = api.status();
    assert_eq!(status["podName"], json!(name), "{status}");
    assert_eq!(status["decision"]["verdict"], "Allow", "{status}");
}

#[tokio::test]
async fn a_run_written_between_its_check_and_its_claims_record_gives_its_sandbox_up() {
    // Someone writes the run (its caller's cancel) after the read that found it as decided and
    // before the claim's record, which is conditional on that copy: the record fails, and the
    // sandbox claimed on that decision goes, unused.
    let api = FakeApi::start(default_limits_run()).await;
    api.with(|s| {
        s.pool_pods = vec![pool_pod("default-aaaaa", "7")];
        s.write_after_reads = 1;
    });
    let ctx = context_with_pool(&api);
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    let requests = api.take_requests();
    let claim = format!("PATCH /api/v1/namespaces/{NS}/pods/default-aaaaa");
    let gone = format!("DELETE /api/v1/namespaces/{NS}/pods/default-aaaaa");
    let at = |r: &str| requests.iter().position(|x| x == r);
    assert!(
        at(&claim).is_some() && at(&gone) > at(&claim),
        "{requests:?}"
    );
    assert!(
        !requests.iter().any(|r| r.ends_with("/attach")),
        "nothing sent: {requests:?}"
    );
    assert!(api.status().is_null(), "{}", api.status());
}

#[tokio::test]
async fn a_sandbox_claimed_on_another_decision_is_given_up_and_the_run_goes_on() {
    // Policy changed between a claim and a run's decision taken again: the sandbox was claimed
    // with other limits, so it goes (it got nothing), and the run claims one for this decision.
    let api = two_idle_sandboxes(|s| s.refuse_status_writes = 1).await;
    let ctx = context_with_pool(&api);
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    let first = api.with(|s| {
        let pod = s.pod.as_mut().expect("a claimed sandbox");
        let limits = pod["metadata"]["annotations"][crate::python::pod::LIMITS_ANNOTATION]
            .as_str()
            .unwrap()
            .replace("\"timeoutSeconds\":30", "\"timeoutSeconds\":7");
        pod["metadata"]["annotations"][crate::python::pod::LIMITS_ANNOTATION] = json!(limits);
        pod["metadata"]["name"].as_str().unwrap().to_owned()
    });
    api.take_requests();
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    let requests = api.take_requests();
    assert!(
        requests.contains(&format!("DELETE /api/v1/namespaces/{NS}/pods/{first}")),
        "{requests:?}"
    );
    let status = api.status();
    assert_ne!(status["podName"], json!(first), "{status}");
    assert_eq!(status["path"], "Warm", "{status}");
}

#[tokio::test]
async fn a_claim_whose_answer_was_lost_is_settled_on_its_pod_before_the_run_takes_another() {
    // Found by the fault suite (e2e/mcp/faults.py, its proxy holding requests 8 s): a claim that
    // outlived its reconcile was applied by the API server after the run had gone on to another
    // sandbox, so one run had two. Before: the next reconcile claimed anew (here it goes cold,
    // the pool's status reading empty by then) and the late claim then committed as well; now the
    // run claims the same Pod again first, which fences the late request out.
    let api = two_idle_sandboxes(|s| s.hold_claims = 1).await;
    let (reader, mut writer) = kube::runtime::reflector::store();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pool_object(2)));
    let ctx = Arc::try_unwrap(context(&api, None))
        .ok()
        .expect("not shared yet");
    let ctx = Arc::new(ctx.with_pools(reader, kube::runtime::reflector::store().0));
    let first = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    assert!(first.is_err(), "the claim's answer was a 504: {first:?}");
    let doubted = api.with(|s| s.held_claims[0].0.clone());

    // By the next reconcile the pool's status reads empty.
    let mut empty = pool_object(2);
    empty.status =
        Some(serde_json::from_value(json!({"replicas": 2, "readyReplicas": 0})).unwrap());
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(empty));
    api.take_requests();
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    let requests = api.take_requests();
    assert!(
        !requests.iter().any(|r| r.starts_with("POST /api/v1")),
        "no cold Pod while a claim is in doubt: {requests:?}"
    );
    // The late request arrives: its precondition no longer holds.
    assert_eq!(api.apply_held_claims(), vec![false]);
    let pod = api
        .with(|s| s.pod.clone())
        .expect("the run has its sandbox");
    assert_eq!(pod["metadata"]["name"], json!(doubted));
    assert_eq!(
        api.with(|s| s.pool_pods.len()),
        1,
        "the other sandbox stays idle"
    );
    let status = api.status();
    assert_eq!(
        (&status["podName"], &status["path"]),
        (&json!(doubted), &json!("Warm")),
        "{status}"
    );
}

#[tokio::test]
async fn a_lost_claim_that_committed_meanwhile_is_taken_up() {
    let api = two_idle_sandboxes(|s| s.hold_claims = 1).await;
    let ctx = context_with_pool(&api);
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    // The API server applies the held claim before the next reconcile.
    assert_eq!(api.apply_held_claims(), vec![true]);
    let doubted = api.with(|s| s.pod.clone()).expect("claimed")["metadata"]["name"].clone();
    api.take_requests();
    let _ = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    let requests = api.take_requests();
    assert!(
        !requests.iter().any(
            |r| r.starts_with(&format!("PATCH /api/v1/namespaces/{NS}/pods/"))
                || r.starts_with("POST /api/v1")
        ),
        "neither a second claim nor a cold Pod: {requests:?}"
    );
    assert_eq!(api.with(|s| s.pool_pods.len()), 1);
    assert_eq!(api.status()["podName"], doubted);
}

#[tokio::test]
async fn a_run_that_loses_every_claim_goes_cold() {
    let api = two_idle_sandboxes(|s| s.lose_claims = 2).await;
    let ctx = context_with_pool(&api);
    reconcile_as(cached(&api), &ctx).await;
    let requests = api.take_requests();
    let claims = requests
        .iter()
        .filter(|r| r.starts_with(&format!("PATCH /api/v1/namespaces/{NS}/pods/")))
        .count();
    assert_eq!(claims, 2, "{requests:?}");
    assert!(
        requests.contains(&format!("POST /api/v1/namespaces/{NS}/pods")),
        "{requests:?}"
    );
    let status = api.status();
    assert_eq!(
        (&status["podName"], &status["path"]),
        (&json!(POD), &json!("Cold"))
    );
    // The pool's Pods are untouched: a lost claim changes nothing.
    assert_eq!(api.with(|s| s.pool_pods.len()), 2);
}

/// [`pool_pod`] whose runner is still importing: running, its startup probe not passed yet.
fn importing_pool_pod(name: &str, rv: &str) -> Value {
    let mut pod = pool_pod(name, rv);
    pod["status"]["containerStatuses"][0]["started"] = json!(false);
    pod["status"]["containerStatuses"][0]["ready"] = json!(false);
    pod
}

#[tokio::test]
async fn a_run_takes_a_ready_sandbox_first_and_one_still_importing_before_going_cold() {
    let claimed = |pods: Vec<Value>| async move {
        let api = FakeApi::start(default_limits_run()).await;
        api.with(|s| s.pool_pods = pods);
        let ctx = context_with_pool(&api);
        // The fake has no attach stream: the hand-over fails after the claim is recorded.
        let err = reconcile(Arc::new(cached(&api)), ctx).await;
        assert!(matches!(err, Err(Error::Feed { .. })), "{err:?}");
        let requests = api.take_requests();
        let claims: Vec<String> = requests
            .iter()
            .filter_map(|r| r.strip_prefix(&format!("PATCH /api/v1/namespaces/{NS}/pods/")))
            .map(str::to_owned)
            .collect();
        assert!(
            !requests.iter().any(|r| r.starts_with("POST /api/v1")),
            "never cold: {requests:?}"
        );
        (claims, api.status())
    };
    // The importing one is older, the ready one is still taken first.
    let (claims, status) = claimed(vec![
        importing_pool_pod("default-aaaaa", "7"),
        pool_pod("default-bbbbb", "8"),
    ])
    .await;
    assert_eq!(claims, ["default-bbbbb"]);
    assert_eq!(status["podName"], "default-bbbbb", "{status}");
    // None ready: the one importing, whose runner reads the program beside its imports.
    let (claims, status) = claimed(vec![importing_pool_pod("default-aaaaa", "7")]).await;
    assert_eq!(claims, ["default-aaaaa"]);
    assert_eq!(
        (&status["podName"], &status["path"]),
        (&json!("default-aaaaa"), &json!("Warm"))
    );
}

#[tokio::test]
async fn a_run_of_other_limits_never_touches_a_pool() {
    // timeoutSeconds 5 fits; cpu 250m does not.
    let mut run = run_json(python());
    run["spec"]["limits"] = json!({"cpu": "250m"});
    let api = FakeApi::start(run).await;
    api.with(|s| s.pool_pods = vec![pool_pod("default-aaaaa", "7")]);
    let ctx = context_with_pool(&api);
    reconcile_as(cached(&api), &ctx).await;
    let requests = api.take_requests();
    assert!(
        !requests
            .iter()
            .any(|r| r.contains("/pods?") || r.contains("default-aaaaa")),
        "{requests:?}"
    );
    assert_eq!(api.status()["path"], "Cold");
}

#[tokio::test]
async fn a_run_whose_cold_pod_was_asked_for_never_claims_a_warm_sandbox_beside_it() {
    // The create's answer is lost (a 504: it may still commit, under the run's name), and then
    // a warm sandbox is ready. Claiming it would give the run two sandboxes once the create
    // commits (the fault suite saw it: a create held by its proxy committed after the retry had
    // claimed a warm one).
    let api = FakeApi::start(default_limits_run()).await;
    let ctx = context_with_pool(&api);
    api.with(|s| s.refuse_pods = Some(504));
    let err = reconcile(Arc::new(cached(&api)), ctx.clone()).await;
    assert!(err.is_err(), "{err:?}");
    assert_eq!(
        api.status()["path"],
        "Cold",
        "recorded before the Pod was asked for"
    );
    api.take_requests();

    api.with(|s| {
        s.refuse_pods = None;
        s.pool_pods = vec![pool_pod("default-aaaaa", "7")];
    });
    reconcile_as(cached(&api), &ctx).await;
    let requests = api.take_requests();
    assert!(
        !requests
            .iter()
            .any(|r| r.contains("/pods/default-aaaaa") || r.contains("labelSelector")),
        "no warm sandbox looked at or claimed: {requests:?}"
    );
    assert!(
        requests.contains(&format!("POST /api/v1/namespaces/{NS}/pods")),
        "{requests:?}"
    );
    let status = api.status();
    assert_eq!(
        (&status["podName"], &status["path"]),
        (&json!(POD), &json!("Cold")),
        "{status}"
    );
}

#[path = "session/call_tests.rs"]
mod session_call;

/// The run's Pod as the API server has it now, as the controller's watch would hand it over.
fn watched(api: &FakeApi) -> Pod {
    serde_json::from_value(api.with(|s| s.pod.clone()).unwrap()).unwrap()
}

/// A context whose controller's watch has `pods` (`watched_pods.rs`), served until the guard
/// drops.
fn watching(
    api: &FakeApi,
    pods: impl IntoIterator<Item = Pod>,
) -> (Arc<Context>, crate::watched_pods::Serving) {
    let ctx = context(api, None);
    let (store, mut writer) = kube::runtime::reflector::store::<Pod>();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
    for pod in pods {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitApply(pod));
    }
    writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
    let serving = ctx.watched_pods.serve(store);
    (ctx, serving)
}

/// A python run whose first reconcile made its Pod, the requests so far taken.
async fn with_its_pod_made() -> FakeApi {
    let api = FakeApi::start(run_json(python())).await;
    reconcile_as(cached(&api), &context(&api, None)).await;
    api.take_requests();
    api
}

/// The run ended Succeeded with its own Pod's output.
fn assert_succeeded_with_its_output(api: &FakeApi) {
    let status = api.status();
    assert_eq!(status["phase"], "Succeeded", "{status}");
    assert_eq!(status["stdout"], "hello from sandboxrun\n");
}

#[tokio::test]
async fn a_reconcile_takes_its_runs_pod_from_the_controllers_watch_without_a_read() {
    let api = with_its_pod_made().await;
    its_pod_ends(&api);
    // The watch saw the container end (and woke the run): the reconcile reads the log at once.
    let (ctx, _serving) = watching(&api, [watched(&api)]);
    reconcile_as(cached(&api), &ctx).await;
    let requests = api.take_requests();
    assert!(
        requests[0].ends_with(&format!("/pods/{POD}/log")),
        "{requests:?}"
    );
    assert!(!requests.contains(&get_pod()), "{requests:?}");
    assert_succeeded_with_its_output(&api);
}

#[tokio::test]
async fn a_pod_the_watch_has_under_another_owner_is_read_again_before_it_is_acted_on() {
    let api = with_its_pod_made().await;
    // The watch still has a Pod of an earlier run of the same name (its owner another uid);
    // the API server has this run's own, ended.
    let mut earlier = watched(&api);
    earlier.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-of-the-earlier-run".into();
    its_pod_ends(&api);
    let (ctx, _serving) = watching(&api, [earlier]);
    reconcile_as(cached(&api), &ctx).await;
    let requests = api.take_requests();
    // Read again: it is this run's own, neither deleted as a stranger's nor taken as gone.
    assert_eq!(requests[0], get_pod(), "{requests:?}");
    assert!(
        requests[1].ends_with(&format!("/pods/{POD}/log")),
        "{requests:?}"
    );
    assert_succeeded_with_its_output(&api);
}

#[tokio::test]
async fn a_pod_the_watch_lacks_is_asked_for_before_the_run_is_taken_as_without_one() {
    let api = with_its_pod_made().await;
    // The watch has not seen the Pod yet (it was just created): the API server has it.
    api.with(|s| s.pod.as_mut().unwrap()["status"] = json!({"phase": "Pending"}));
    let (ctx, _serving) = watching(&api, []);
    reconcile_as(cached(&api), &ctx).await;
    let requests = api.take_requests();
    assert_eq!(requests[0], get_pod(), "{requests:?}");
    let status = api.status();
    assert_eq!(status["phase"], "Pending", "{status}");
    assert_eq!(status["podName"], POD, "{status}");
}

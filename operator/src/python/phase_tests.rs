//! Phase derivation from Pod states, one test per transition, and the classification of ended
//! sandboxes through the kubelet's eyes (core's, see `runner_outcomes_are_classified_by_core`).

use super::*;
use sandboxrun_core::RunnerResult;
use sandboxrun_core::runner::fixtures::{envelope, killed, kubelet};
use serde_json::json;

use crate::outcome::outcome_status;

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

const T0: &str = "2026-11-29T08:00:00Z";

fn limits() -> Limits {
    Limits {
        timeout_seconds: 5,
        ..Limits::default()
    }
}

fn pending_status() -> SandboxRunStatus {
    SandboxRunStatus {
        phase: Some(Phase::Pending),
        pod_name: Some("r-sandbox".into()),
        ..Default::default()
    }
}

fn pod(status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "r-sandbox", "creationTimestamp": T0},
        "status": status,
    }))
    .unwrap()
}

fn container(state: serde_json::Value) -> serde_json::Value {
    json!([{"name": "sandbox", "image": "img", "imageID": "", "ready": false, "restartCount": 0, "state": state}])
}

const OK_LOG: &str = "\n{\"sandboxrun\":1,\"exitCode\":0,\"stdout\":\"hello from sandboxrun\\n\",\"stderr\":\"\",\"stdoutTruncated\":false,\"stderrTruncated\":false,\"signal\":null,\"oomKill\":null,\"timedOut\":false,\"durationMillis\":42}\n";

fn exited(reason: &str, code: i32) -> Exited {
    Exited {
        exit_code: code,
        reason: Some(reason.into()),
        started_at: Some(t("2026-11-29T08:00:01Z")),
        finished_at: t("2026-11-29T08:00:02.5Z"),
    }
}

#[test]
fn no_pod_and_no_status_creates_the_pod() {
    assert_eq!(
        next(&SandboxRunStatus::default(), None, &limits(), t(T0)),
        Next::CreatePod
    );
}

#[test]
fn pod_missing_after_creation_is_pod_deleted() {
    for phase in [Phase::Pending, Phase::Running] {
        let status = SandboxRunStatus {
            phase: Some(phase),
            ..pending_status()
        };
        let Next::Finish(o) = next(&status, None, &limits(), t(T0)) else {
            panic!()
        };
        assert_eq!(o.phase, Phase::Failed);
        assert_eq!(o.reason, "PodDeleted");
    }
}

#[test]
fn pod_being_deleted_by_someone_else_is_pod_deleted() {
    let mut p = pod(
        json!({"phase": "Running", "containerStatuses": container(json!({"running": {"startedAt": T0}}))}),
    );
    p.metadata.deletion_timestamp = Some(Time(t(T0)));
    let Next::Finish(o) = next(&pending_status(), Some(&p), &limits(), t(T0)) else {
        panic!()
    };
    assert_eq!(o.reason, "PodDeleted");
    assert_eq!(o.started_at, Some(t(T0)));
}

#[test]
fn fresh_pod_is_pending() {
    let p = pod(json!({"phase": "Pending"}));
    let Next::Progress(pr) = next(&SandboxRunStatus::default(), Some(&p), &limits(), t(T0)) else {
        panic!()
    };
    assert_eq!(pr.phase, Phase::Pending);
    assert_eq!(pr.reason, "PodCreated");
    // creation + 5s timeout + 10s grace + 30s slack
    assert_eq!(pr.deadline, t("2026-11-29T08:00:45Z"));
}

#[test]
fn waiting_container_reports_its_reason() {
    let p = pod(
        json!({"phase": "Pending", "containerStatuses": container(json!({"waiting": {"reason": "ContainerCreating"}}))}),
    );
    let Next::Progress(pr) = next(&pending_status(), Some(&p), &limits(), t(T0)) else {
        panic!()
    };
    assert_eq!(
        (pr.phase, pr.reason.as_str()),
        (Phase::Pending, "ContainerCreating")
    );
}

#[test]
fn running_container_is_running_with_start_time() {
    let p = pod(
        json!({"phase": "Running", "startTime": T0, "containerStatuses": container(json!({"running": {"startedAt": "2026-11-29T08:00:01Z"}}))}),
    );
    let Next::Progress(pr) = next(
        &pending_status(),
        Some(&p),
        &limits(),
        t("2026-11-29T08:00:02Z"),
    ) else {
        panic!()
    };
    assert_eq!(pr.phase, Phase::Running);
    assert_eq!(pr.started_at, Some(t("2026-11-29T08:00:01Z")));
}

#[test]
fn image_failures_end_image_unavailable() {
    for reason in [
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
    ] {
        let p = pod(
            json!({"phase": "Pending", "containerStatuses": container(json!({"waiting": {"reason": reason, "message": "not found"}}))}),
        );
        let Next::Finish(o) = next(&pending_status(), Some(&p), &limits(), t(T0)) else {
            panic!()
        };
        assert_eq!(
            (o.phase, o.reason.as_str()),
            (Phase::Failed, "ImageUnavailable")
        );
        assert!(o.message.contains(reason) && o.message.contains("not found"));
    }
}

#[test]
fn kubelet_deadline_is_timed_out() {
    let p = pod(
        json!({"phase": "Failed", "reason": "DeadlineExceeded", "containerStatuses": container(json!({"terminated": {"exitCode": 137, "reason": "Error", "startedAt": T0, "finishedAt": T0}}))}),
    );
    let Next::Finish(o) = next(&pending_status(), Some(&p), &limits(), t(T0)) else {
        panic!()
    };
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::TimedOut, "DeadlineExceeded")
    );
}

#[test]
fn operator_clock_times_out_a_pod_that_never_finishes() {
    let p = pod(json!({"phase": "Pending", "startTime": T0}));
    assert!(matches!(
        next(
            &pending_status(),
            Some(&p),
            &limits(),
            t("2026-11-29T08:00:44Z")
        ),
        Next::Progress(_)
    ));
    let Next::Finish(o) = next(
        &pending_status(),
        Some(&p),
        &limits(),
        t("2026-11-29T08:00:45Z"),
    ) else {
        panic!()
    };
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::TimedOut, "DeadlineExceeded")
    );
}

#[test]
fn evicted_pod_fails_with_the_pod_reason() {
    let p = pod(json!({"phase": "Failed", "reason": "Evicted", "message": "node low on memory"}));
    let Next::Finish(o) = next(&pending_status(), Some(&p), &limits(), t(T0)) else {
        panic!()
    };
    assert_eq!(
        (o.phase, o.reason.as_str(), o.message.as_str()),
        (Phase::Failed, "Evicted", "node low on memory")
    );
}

#[test]
fn terminated_container_is_collected() {
    let p = pod(
        json!({"phase": "Succeeded", "containerStatuses": container(json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-11-29T08:00:01Z", "finishedAt": "2026-11-29T08:00:02.5Z"}}))}),
    );
    assert_eq!(
        next(&pending_status(), Some(&p), &limits(), t(T0)),
        Next::Collect(exited("Completed", 0))
    );
}

#[test]
fn envelope_exit_zero_succeeds() {
    let o = collected(
        &exited("Completed", 0),
        OK_LOG,
        &limits(),
        FileCaps::default(),
    );
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Succeeded, "Succeeded")
    );
    assert_eq!(o.exit_code, Some(0));
    assert_eq!(o.stdout.as_deref(), Some("hello from sandboxrun\n"));
    assert_eq!(o.truncated, Some(false));
}

#[test]
fn envelope_non_zero_fails_with_both_streams() {
    let log = OK_LOG
        .replace("\"exitCode\":0", "\"exitCode\":3")
        .replace("\"stderr\":\"\"", "\"stderr\":\"oops\\n\"");
    let o = collected(&exited("Error", 3), &log, &limits(), FileCaps::default());
    assert_eq!((o.phase, o.reason.as_str()), (Phase::Failed, "NonZeroExit"));
    assert_eq!(o.exit_code, Some(3));
    assert_eq!(o.stderr.as_deref(), Some("oops\n"));
    assert_eq!(o.stdout.as_deref(), Some("hello from sandboxrun\n"));
}

#[test]
fn envelope_sigkill_is_oom_killed_unless_the_cgroup_says_otherwise() {
    let killed = OK_LOG
        .replace("\"exitCode\":0", "\"exitCode\":137")
        .replace("\"signal\":null", "\"signal\":9");
    let o = collected(
        &exited("Error", 137),
        &killed,
        &limits(),
        FileCaps::default(),
    );
    assert_eq!((o.phase, o.reason.as_str()), (Phase::Failed, "OOMKilled"));
    let not_oom = killed.replace("\"oomKill\":null", "\"oomKill\":false");
    let o = collected(
        &exited("Error", 137),
        &not_oom,
        &limits(),
        FileCaps::default(),
    );
    assert_eq!(o.reason, "NonZeroExit");
}

#[test]
fn container_oom_killed_wins_over_the_envelope() {
    let o = collected(
        &exited("OOMKilled", 137),
        "",
        &limits(),
        FileCaps::default(),
    );
    assert_eq!((o.phase, o.reason.as_str()), (Phase::Failed, "OOMKilled"));
    assert!(o.message.contains("256Mi"));
}

#[test]
fn runner_timeout_is_timed_out_with_output() {
    let log = OK_LOG
        .replace("\"timedOut\":false", "\"timedOut\":true")
        .replace("\"exitCode\":0", "\"exitCode\":137");
    let o = collected(&exited("Error", 137), &log, &limits(), FileCaps::default());
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::TimedOut, "DeadlineExceeded")
    );
    assert_eq!(o.stdout.as_deref(), Some("hello from sandboxrun\n"));
}

#[test]
fn missing_envelope_is_no_result_with_the_log_tail() {
    let o = collected(
        &exited("Error", 1),
        "Traceback...\nModuleNotFoundError: No module named 'resource'\n",
        &limits(),
        FileCaps::default(),
    );
    assert_eq!((o.phase, o.reason.as_str()), (Phase::Failed, "NoResult"));
    assert!(o.message.contains("exit code 1"), "{}", o.message);
    assert!(
        o.message.contains("No module named 'resource'"),
        "{}",
        o.message
    );
    assert_eq!(o.exit_code, None);
}

#[test]
fn output_is_recapped_and_flagged() {
    let big = OK_LOG.replace("hello from sandboxrun\\n", &"x".repeat(500));
    let o = collected(
        &exited("Completed", 0),
        &big,
        &Limits {
            output_bytes: 100,
            ..limits()
        },
        FileCaps::default(),
    );
    assert_eq!(o.stdout.as_ref().unwrap().len(), 100);
    assert_eq!(o.truncated, Some(true));
    assert_eq!(o.phase, Phase::Succeeded);
}

#[test]
fn unreadable_logs_are_retried_then_no_result() {
    let e = exited("Completed", 0);
    assert_eq!(log_unreadable(&e, "503", t("2026-11-29T08:00:30Z")), None);
    let o = log_unreadable(&e, "503", t("2026-11-29T08:01:03Z")).unwrap();
    assert_eq!((o.phase, o.reason.as_str()), (Phase::Failed, "NoResult"));
}

#[test]
fn statuses_carry_conditions_with_generation_and_stable_transition_times() {
    let p = Progress {
        phase: Phase::Pending,
        reason: "PodCreated".into(),
        message: "created".into(),
        started_at: None,
        deadline: t(T0),
    };
    let s1 = progress_status(
        &SandboxRunStatus::default(),
        &p,
        "r-sandbox",
        Some(1),
        t(T0),
    );
    assert_eq!(s1.phase, Some(Phase::Pending));
    assert_eq!(s1.tool, Some(Tool::Python));
    assert_eq!(s1.observed_generation, Some(1));
    assert_eq!(s1.conditions.len(), 2);
    assert!(
        s1.conditions
            .iter()
            .all(|c| c.status == "False" && c.observed_generation == Some(1))
    );

    // Same condition status later: the transition time stays.
    let s2 = progress_status(&s1, &p, "r-sandbox", Some(1), t("2026-11-29T08:00:09Z"));
    assert_eq!(s2.conditions, s1.conditions);

    let running = Progress {
        phase: Phase::Running,
        started_at: Some(t("2026-11-29T08:00:01Z")),
        ..p
    };
    let s3 = progress_status(
        &s2,
        &running,
        "r-sandbox",
        Some(1),
        t("2026-11-29T08:00:01Z"),
    );
    let started = s3.conditions.iter().find(|c| c.type_ == "Started").unwrap();
    assert_eq!(
        (started.status.as_str(), started.last_transition_time.0),
        ("True", t("2026-11-29T08:00:01Z"))
    );

    let o = collected(
        &exited("Completed", 0),
        OK_LOG,
        &limits(),
        FileCaps::default(),
    );
    let s4 = outcome_status(
        &s3,
        Some(Tool::Python),
        &o,
        Some("r-sandbox"),
        Some(1),
        t("2026-11-29T08:00:03Z"),
    );
    assert_eq!(s4.phase, Some(Phase::Succeeded));
    // The runner's measurement wins over second-granular Kubernetes timestamps.
    assert_eq!(s4.duration_millis, Some(42));
    let without = Outcome {
        duration_millis: None,
        ..o.clone()
    };
    let s5 = outcome_status(
        &s3,
        Some(Tool::Python),
        &without,
        None,
        Some(1),
        t("2026-11-29T08:00:03Z"),
    );
    assert_eq!(s5.duration_millis, Some(1500));
    assert_eq!(s4.completion_time, Some(Time(t("2026-11-29T08:00:02.5Z"))));
    let completed = s4
        .conditions
        .iter()
        .find(|c| c.type_ == "Completed")
        .unwrap();
    assert_eq!(
        (completed.status.as_str(), completed.reason.as_str()),
        ("True", "Succeeded")
    );
    let started = s4.conditions.iter().find(|c| c.type_ == "Started").unwrap();
    assert_eq!(started.last_transition_time.0, t("2026-11-29T08:00:01Z"));
}

/// One row of the table: a name, the runner's envelope (`None`: the log holds none), the log
/// without the envelope, the container's terminated reason and exit code, and the expected phase
/// and reason.
type Row = (
    &'static str,
    Option<RunnerResult>,
    String,
    (&'static str, i32),
    Phase,
    Reason,
);

/// The operator's rows of core's table of runner outcomes (`core/src/tools/python_tests.rs`):
/// each (log envelope, container end) goes through the operator's adapter ([`collected`]) and
/// must end in the same phase and reason as core's [`classify`] says for what the kubelet saw,
/// so the operator has no classification of its own.
#[test]
fn runner_outcomes_are_classified_by_core() {
    let mut timed_out = killed(9, None);
    timed_out.timed_out = true;
    let mut truncated = envelope(0);
    truncated.stdout_truncated = true;
    let v2 = serde_json::to_string(&envelope(0))
        .unwrap()
        .replace("\"sandboxrun\":1", "\"sandboxrun\":2");
    let line = |r: &RunnerResult| serde_json::to_string(r).unwrap();
    let rows: Vec<Row> = vec![
        (
            "exit 0",
            Some(envelope(0)),
            String::new(),
            ("Completed", 0),
            Phase::Succeeded,
            Reason::Succeeded,
        ),
        (
            "exit 3",
            Some(envelope(3)),
            String::new(),
            ("Error", 3),
            Phase::Failed,
            Reason::NonZeroExit,
        ),
        (
            "SIGTERM",
            Some(killed(15, None)),
            String::new(),
            ("Error", 143),
            Phase::Failed,
            Reason::NonZeroExit,
        ),
        (
            "SIGKILL, cgroup says OOM",
            Some(killed(9, Some(true))),
            String::new(),
            ("Error", 137),
            Phase::Failed,
            Reason::OomKilled,
        ),
        (
            "SIGKILL, cgroup says no OOM",
            Some(killed(9, Some(false))),
            String::new(),
            ("Error", 137),
            Phase::Failed,
            Reason::NonZeroExit,
        ),
        (
            "SIGKILL, the runner could not tell",
            Some(killed(9, None)),
            String::new(),
            ("Error", 137),
            Phase::Failed,
            Reason::OomKilled,
        ),
        (
            "the runner's timeout",
            Some(timed_out),
            String::new(),
            ("Error", 137),
            Phase::TimedOut,
            Reason::DeadlineExceeded,
        ),
        (
            "non-zero exit, the kubelet saw OOM",
            Some(envelope(1)),
            String::new(),
            ("OOMKilled", 137),
            Phase::Failed,
            Reason::OomKilled,
        ),
        // A program that handled a child's OOM kill and exited 0 succeeded (core's rule).
        (
            "exit 0, the kubelet saw OOM",
            Some(envelope(0)),
            String::new(),
            ("OOMKilled", 0),
            Phase::Succeeded,
            Reason::Succeeded,
        ),
        (
            "truncated output",
            Some(truncated),
            String::new(),
            ("Completed", 0),
            Phase::Succeeded,
            Reason::Succeeded,
        ),
        (
            "no envelope, OOM",
            None,
            "Killed\n".into(),
            ("OOMKilled", 137),
            Phase::Failed,
            Reason::OomKilled,
        ),
        (
            "no envelope, no reason",
            None,
            "Traceback ...\n".into(),
            ("Error", 1),
            Phase::Failed,
            Reason::NoResult,
        ),
        (
            "unknown envelope version",
            None,
            v2,
            ("Completed", 0),
            Phase::Failed,
            Reason::NoResult,
        ),
    ];
    for (name, env, noise, (reason, code), phase, want) in rows {
        // User output before the runner's own last line, as in a real log.
        let log = match &env {
            Some(r) => format!("{noise}noise\n{}\n", line(r)),
            None => noise,
        };
        let o = collected(&exited(reason, code), &log, &limits(), FileCaps::default());
        let direct = classify(
            env.as_ref(),
            &kubelet(reason, code),
            &limits(),
            FileCaps::default(),
        );
        assert_eq!(
            (o.phase, o.reason.as_str()),
            (direct.phase, direct.reason.as_str()),
            "{name}: the operator's adapter and core disagree"
        );
        assert_eq!(
            (o.phase, o.reason.as_str()),
            (phase, want.as_str()),
            "{name}"
        );
        assert_eq!(o.exit_code, direct.exit_code, "{name}");
        assert_eq!(o.exit_code, env.as_ref().map(|e| e.exit_code), "{name}");
        if env.is_some() {
            assert_eq!(o.stdout.as_deref(), Some(direct.stdout.as_str()), "{name}");
            assert_eq!(o.message, direct.message, "{name}");
        } else {
            assert_eq!((o.stdout.as_deref(), o.truncated), (None, None), "{name}");
        }
    }
}

#[test]
fn no_result_messages_say_what_the_kubelet_saw() {
    let o = collected(
        &exited("Error", 1),
        "boom\n",
        &limits(),
        FileCaps::default(),
    );
    assert_eq!(
        o.message,
        "the sandbox ended (exit code 1, Error) without reporting a result; last output: boom"
    );
    let v2 = OK_LOG.replace("\"sandboxrun\":1", "\"sandboxrun\":2");
    let o = collected(&exited("Completed", 0), &v2, &limits(), FileCaps::default());
    assert!(
        o.message.contains("result protocol version 2"),
        "{}",
        o.message
    );
}

#[test]
fn returned_files_reach_the_terminal_status_within_the_caps() {
    // Three files (base64 of "a,b\n", "x", "yy"), the runner's own omission, caps of two files.
    let log = OK_LOG.replace(
        "\"durationMillis\":42}",
        "\"durationMillis\":42,\"files\":[{\"name\":\"t.csv\",\"size\":4,\"data\":\"YSxiCg==\"},\
         {\"name\":\"x.txt\",\"size\":1,\"data\":\"eA==\"},{\"name\":\"y.txt\",\"size\":2,\"data\":\"eXk=\"}],\
         \"filesOmitted\":[{\"name\":\"link\",\"reason\":\"notARegularFile\"}]}",
    );
    let caps = FileCaps {
        max_files: 2,
        max_bytes: 1000,
    };
    let o = collected(&exited("Completed", 0), &log, &limits(), caps);
    assert_eq!(o.phase, Phase::Succeeded);
    let names: Vec<&str> = o.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["t.csv", "x.txt"]);
    assert_eq!(o.files[0].mime_type, "text/csv");
    let omitted: Vec<(&str, &str)> = o
        .files_omitted
        .iter()
        .map(|f| (f.name.as_str(), f.reason.as_str()))
        .collect();
    assert_eq!(
        omitted,
        [("y.txt", "fileCount"), ("link", "notARegularFile")]
    );
    let s = outcome_status(
        &SandboxRunStatus::default(),
        Some(Tool::Python),
        &o,
        Some("r-sandbox"),
        Some(1),
        t("2026-11-29T08:00:03Z"),
    );
    assert_eq!(s.files.len(), 2);
    assert_eq!(
        (
            s.files[0].name.as_str(),
            s.files[0].data.as_str(),
            s.files[0].size
        ),
        ("t.csv", "YSxiCg==", 4)
    );
    assert_eq!(s.files_omitted, o.files_omitted);
    // A run without a result has no files.
    let none = collected(&exited("Error", 1), "boom\n", &limits(), caps);
    assert!(none.files.is_empty() && none.files_omitted.is_empty());
}

#[test]
fn a_sandbox_whose_barrier_never_held_ends_the_run_with_nothing_run() {
    // What runner.py prints when its canary keeps answering: it never read the program.
    let log = "runner: not reading the program: the canary was still reachable\n\n\
        {\"sandboxrun\":1,\"exitCode\":123,\"stdout\":\"\",\"stderr\":\"\",\"stdoutTruncated\":false,\
        \"stderrTruncated\":false,\"signal\":null,\"oomKill\":null,\"timedOut\":false,\
        \"durationMillis\":0,\"notRun\":{\"reason\":\"isolationNotInForce\",\
        \"message\":\"the operator's canary at 10.244.0.7:8081 was still reachable\"}}\n";
    let o = collected(&exited("Error", 123), log, &limits(), FileCaps::default());
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Failed, "IsolationNotInForce")
    );
    assert_eq!(o.exit_code, None);
    assert!(o.message.contains("still reachable"), "{}", o.message);
}

/// A Pod in `runs` whose owner is `kind` `uid` (its controller or not), on `node` if any.
fn pod_of(kind: &str, uid: &str, controller: bool, node: Option<&str>) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.namespace = Some("runs".to_owned());
    pod.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "sandboxrun.dev/v1alpha1".to_owned(),
            kind: kind.to_owned(),
            name: format!("run-{uid}"),
            uid: uid.to_owned(),
            controller: Some(controller),
            ..Default::default()
        },
    ]);
    pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        node_name: node.map(str::to_owned),
        ..Default::default()
    });
    pod
}

#[test]
fn a_placed_run_is_told_only_for_a_run_pod_a_node_took() {
    let placed = pod_of("SandboxRun", "u1", true, Some("node-1"));
    let (run, uid) = placed_run(&placed).expect("placed");
    assert_eq!(
        (run.name.as_str(), run.namespace.as_deref(), uid),
        ("run-u1", Some("runs"), "u1")
    );
    for (why, pod) in [
        ("no node yet", pod_of("SandboxRun", "u1", true, None)),
        (
            "a pool's",
            pod_of("SandboxPool", "u1", true, Some("node-1")),
        ),
        (
            "not its controller",
            pod_of("SandboxRun", "u1", false, Some("node-1")),
        ),
    ] {
        assert!(placed_run(&pod).is_none(), "{why}");
    }
}

#[test]
fn the_queue_counts_a_sandbox_placed_once_the_watch_tells_it() {
    use crate::admission::{Admission, Sandbox};
    let admission = Admission::new(std::time::Duration::from_secs(60));
    let now = t(T0);
    for uid in ["u1", "u2"] {
        let run = ObjectRef::new(&format!("run-{uid}")).within("runs");
        admission.admitted(&run, uid, Sandbox::Created("p"), now);
    }
    assert_eq!(admission.unplaced("runs"), 2);
    let seen = |pod: &Pod| {
        if let Some((run, uid)) = placed_run(pod) {
            admission.scheduling(&run, uid, Placement::Placed, now);
        }
    };
    seen(&pod_of("SandboxRun", "u1", true, Some("node-1")));
    assert_eq!(admission.unplaced("runs"), 1);
    // Seen again (the kubelet's status patches): nothing more.
    seen(&pod_of("SandboxRun", "u1", true, Some("node-1")));
    assert_eq!(admission.unplaced("runs"), 1);
}

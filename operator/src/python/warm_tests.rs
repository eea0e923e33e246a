//! The claim: which pools fit a run, and the patch that hands one Pod to one run.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sandboxrun_api::{LimitsSpec, PythonSpec, SandboxRunSpec};
use serde_json::json;

const T0: &str = "2026-12-01T08:00:00Z";

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn operator() -> SandboxConfig {
    SandboxConfig {
        runtime_class: "gvisor".into(),
        image: "localhost/sandboxrun/sandbox-python:dev".into(),
        data_image: "localhost/sandboxrun/sandbox-python-data:dev".into(),
        tmp_size: "16Mi".into(),
        canary: Some("10.244.0.7:8081".into()),
    }
}

fn pool(name: &str, ns: &str, spec: serde_json::Value) -> SandboxPool {
    let mut p = SandboxPool::new(name, serde_json::from_value(spec).unwrap());
    p.metadata.namespace = Some(ns.into());
    p
}

fn run() -> SandboxRun {
    let mut r = SandboxRun::new(
        "r1",
        SandboxRunSpec {
            agent: "a@example.com".into(),
            environment: Default::default(),
            python: Some(PythonSpec {
                code: "print(1)".into(),
                ..Default::default()
            }),
            sql: None,
            metrics: None,
            limits: LimitsSpec::default(),
            ttl_seconds_after_finished: 3600,
            approval: None,
            cancelled: false,
        },
    );
    r.metadata.namespace = Some("runs".into());
    r.metadata.uid = Some("run-uid".into());
    r
}

#[test]
fn only_pools_of_the_same_namespace_isolation_and_limits_are_candidates() {
    let pools = [
        pool("b-default", "runs", json!({"replicas": 2})),
        pool(
            "a-same-in-other-words",
            "runs",
            json!({"replicas": 1, "cpu": "0.5", "memory": "268435456"}),
        ),
        pool("off", "runs", json!({"replicas": 0})),
        pool("elsewhere", "other", json!({"replicas": 2})),
        pool("bigger", "runs", json!({"replicas": 2, "memory": "1Gi"})),
        pool("fewer-pids", "runs", json!({"replicas": 2, "pids": 8})),
        pool(
            "runc",
            "runs",
            json!({"replicas": 2, "runtimeClassName": "runc"}),
        ),
        pool(
            "other-image",
            "runs",
            json!({"replicas": 2, "image": "python:3"}),
        ),
    ];
    let limits = Limits::default();
    assert_eq!(
        candidates(&pools, "runs", Profile::Minimal, &limits, &operator()),
        ["a-same-in-other-words", "b-default"]
    );
    // A run with other cgroup limits fits none of them; its timeout and output cap never matter.
    let big = Limits {
        memory: "1Gi".into(),
        ..Limits::default()
    };
    assert_eq!(
        candidates(&pools, "runs", Profile::Minimal, &big, &operator()),
        ["bigger"]
    );
    let short = Limits {
        timeout_seconds: 1,
        output_bytes: 10,
        ..Limits::default()
    };
    assert_eq!(
        candidates(&pools, "runs", Profile::Minimal, &short, &operator()).len(),
        2
    );
}

fn caps() -> FileCaps {
    FileCaps {
        max_files: 4,
        max_bytes: 65_536,
    }
}

#[test]
fn only_pools_of_the_runs_profile_are_candidates() {
    let pools = [
        pool("minimal", "runs", json!({"replicas": 2})),
        pool("data", "runs", json!({"replicas": 2, "profile": "data"})),
        // Its image is not the operator's data image: not the isolation a data run would get.
        pool(
            "data-elsewhere",
            "runs",
            json!({"replicas": 2, "profile": "data", "image": "python:3"}),
        ),
        // The data image under the minimal profile: a minimal run never gets it.
        pool(
            "minimal-with-data-image",
            "runs",
            json!({"replicas": 2, "image": "localhost/sandboxrun/sandbox-python-data:dev"}),
        ),
        // Named explicitly, the data image serves data runs.
        pool(
            "data-explicit",
            "runs",
            json!({"replicas": 2, "profile": "data", "image": "localhost/sandboxrun/sandbox-python-data:dev"}),
        ),
    ];
    let limits = Limits::default();
    assert_eq!(
        candidates(&pools, "runs", Profile::Minimal, &limits, &operator()),
        ["minimal"]
    );
    assert_eq!(
        candidates(&pools, "runs", Profile::Data, &limits, &operator()),
        ["data", "data-explicit"]
    );
    // An operator without a data image has no data pool to offer.
    let without = SandboxConfig {
        data_image: String::new(),
        ..operator()
    };
    assert!(candidates(&pools, "runs", Profile::Data, &limits, &without).is_empty());
    // The pool's profile is what it fits, with the same cgroup limits.
    assert!(pools[1].spec.fits(Profile::Data, &limits));
    assert!(!pools[1].spec.fits(Profile::Minimal, &limits));
    assert!(!pools[0].spec.fits(Profile::Data, &limits));
}

fn idle_pod(rv: Option<&str>, started: &str, deadline: i64) -> Pod {
    let mut p: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "default-abcde",
            "labels": {LABEL_POOL: "default", LABEL_PROFILE: "h"},
            "ownerReferences": [{"apiVersion": "sandboxrun.dev/v1alpha1", "kind": "SandboxPool",
                "name": "default", "uid": "pool-uid", "controller": true}],
        },
        "spec": {"containers": [], "activeDeadlineSeconds": deadline},
        "status": {"phase": "Running", "startTime": started},
    }))
    .unwrap();
    p.metadata.resource_version = rv.map(str::to_owned);
    p
}

#[test]
fn the_claim_is_conditional_and_hands_the_pod_to_the_run() {
    let limits = Limits {
        timeout_seconds: 5,
        ..Limits::default()
    };
    let pod = idle_pod(Some("42"), T0, 4210);
    let patch = claim_patch(
        &pod,
        "default",
        &run(),
        &limits,
        caps(),
        t("2026-12-01T08:10:00Z"),
    )
    .unwrap();
    let meta = &patch["metadata"];
    // The precondition: another claim since the list makes this one a 409.
    assert_eq!(meta["resourceVersion"], "42");
    // The run's caps on returned files, for whoever reads its result (after a restart too).
    assert_eq!(
        meta["annotations"][pod::FILE_CAPS_ANNOTATION],
        r#"{"maxFiles":4,"maxBytes":65536}"#
    );
    // Out of the pool, into the run: the pool's selector no longer matches it, the run's does.
    assert_eq!(meta["labels"][LABEL_POOL], Value::Null);
    assert_eq!(meta["labels"][LABEL_PROFILE], Value::Null);
    assert_eq!(meta["labels"][pod::LABEL_RUN], "r1");
    let owners = meta["ownerReferences"].as_array().unwrap();
    assert_eq!(owners.len(), 1, "the pool is no owner any more: {owners:?}");
    assert_eq!(
        (owners[0]["kind"].as_str(), owners[0]["uid"].as_str()),
        (Some("SandboxRun"), Some("run-uid"))
    );
    assert_eq!(owners[0]["controller"], true);
    // The run's limits, and when it was claimed (its deadline counts from here).
    let recorded: Limits = serde_json::from_str(
        meta["annotations"][pod::LIMITS_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(recorded, limits);
    assert_eq!(
        meta["annotations"][CLAIMED_AT_ANNOTATION],
        "2026-12-01T08:10:00Z"
    );
    assert_eq!(meta["annotations"][FROM_POOL_ANNOTATION], "default");
    // The kubelet counts from the Pod's start: 600 s idle + 5 s timeout + 10 s grace.
    assert_eq!(patch["spec"]["activeDeadlineSeconds"], 615);
}

#[test]
fn no_claim_without_a_precondition_or_a_deadline() {
    let limits = Limits::default();
    assert!(
        claim_patch(
            &idle_pod(None, T0, 4210),
            "default",
            &run(),
            &limits,
            caps(),
            t(T0)
        )
        .is_none()
    );
    let mut no_deadline = idle_pod(Some("1"), T0, 4210);
    no_deadline.spec.as_mut().unwrap().active_deadline_seconds = None;
    assert!(claim_patch(&no_deadline, "default", &run(), &limits, caps(), t(T0)).is_none());
    // A run without a uid cannot own anything.
    let mut anonymous = run();
    anonymous.metadata.uid = None;
    assert!(
        claim_patch(
            &idle_pod(Some("1"), T0, 4210),
            "default",
            &anonymous,
            &limits,
            caps(),
            t(T0)
        )
        .is_none()
    );
}

#[test]
fn the_deadline_is_only_ever_lowered() {
    // A deadline already below the run's need (cannot happen for our Pods) is left alone: the
    // API server refuses a raised one.
    let pod = idle_pod(Some("1"), T0, 20);
    let patch = claim_patch(
        &pod,
        "default",
        &run(),
        &Limits::default(),
        caps(),
        t("2026-12-01T08:10:00Z"),
    )
    .unwrap();
    assert!(patch.get("spec").is_none(), "{patch}");
}

#[test]
fn a_claimed_pods_deadline_counts_from_its_claim() {
    let mut pod = idle_pod(Some("1"), T0, 615);
    pod.metadata.annotations = Some(
        [(
            CLAIMED_AT_ANNOTATION.to_owned(),
            "2026-12-01T08:10:00Z".to_owned(),
        )]
        .into(),
    );
    pod.status.as_mut().unwrap().start_time = Some(Time(t(T0)));
    // 10 min after the Pod started, claimed then: 5 + 10 + 30 s from the claim.
    assert_eq!(
        phase::operator_deadline(&pod, 5),
        Some(t("2026-12-01T08:10:45Z"))
    );
}

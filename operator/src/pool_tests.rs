//! The pool's pure parts: how its Pods are sorted, what a reconcile changes, and that a pool's
//! sandbox is isolated exactly as a run's own.

use super::*;
use sandboxrun_api::SandboxPoolSpec;
use sandboxrun_core::Profile;
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

fn spec(replicas: i32) -> SandboxPoolSpec {
    serde_json::from_value(json!({ "replicas": replicas })).unwrap()
}

fn pool(replicas: i32) -> SandboxPool {
    let mut p = SandboxPool::new("default", spec(replicas));
    p.metadata.namespace = Some("runs".into());
    p.metadata.uid = Some("pool-uid".into());
    p
}

/// A pool Pod named `name`, created at `created`, of `profile`, with `state` as its container's.
fn pod(name: &str, created: &str, profile: &str, phase: &str, state: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "creationTimestamp": created,
            "labels": { LABEL_PROFILE: profile },
        },
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": "sandbox", "image": "img", "imageID": "",
                "ready": state.get("running").is_some(), "started": state.get("running").is_some(),
                "restartCount": 0, "state": state}],
        },
    }))
    .unwrap()
}

fn running() -> serde_json::Value {
    json!({"running": {"startedAt": T0}})
}

#[test]
fn pods_are_sorted_into_ready_starting_and_doomed() {
    let profile = profile_hash(&pool(2), &operator());
    let pods = vec![
        pod(
            "young",
            "2026-12-01T08:10:00Z",
            &profile,
            "Running",
            running(),
        ),
        pod(
            "old",
            "2026-12-01T08:05:00Z",
            &profile,
            "Running",
            running(),
        ),
        pod(
            "boot",
            T0,
            &profile,
            "Pending",
            json!({"waiting": {"reason": "ContainerCreating"}}),
        ),
        // Running, its startup probe not passed yet: a preloading runner still importing.
        {
            let mut p = pod("importing", T0, &profile, "Running", running());
            let statuses = p.status.as_mut().unwrap().container_statuses.as_mut();
            statuses.unwrap()[0].started = Some(false);
            p
        },
        pod("stale", T0, "another-profile", "Running", running()),
        pod(
            "ended",
            T0,
            &profile,
            "Succeeded",
            json!({"terminated": {"exitCode": 126}}),
        ),
        pod(
            "ancient",
            "2026-12-01T06:00:00Z",
            &profile,
            "Running",
            running(),
        ),
    ];
    let sorted = sort(&pods, &profile, 3600, t("2026-12-01T08:30:00Z"));
    // Oldest first: the next to expire is claimed first.
    assert_eq!(sorted.ready, ["old", "young"]);
    assert_eq!(sorted.starting, ["boot", "importing"]);
    let doomed: Vec<_> = sorted.doomed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(doomed, ["stale", "ended", "ancient"]);
}

#[test]
fn a_pod_being_deleted_is_already_gone() {
    let profile = profile_hash(&pool(1), &operator());
    let mut p = pod("going", T0, &profile, "Running", running());
    p.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(T0)));
    assert_eq!(sort(&[p], &profile, 3600, t(T0)), Sorted::default());
}

#[test]
fn the_plan_fills_trims_and_replaces() {
    let sorted = |ready: &[&str], starting: &[&str], doomed: &[&str]| Sorted {
        ready: ready.iter().map(|s| s.to_string()).collect(),
        starting: starting.iter().map(|s| s.to_string()).collect(),
        doomed: doomed
            .iter()
            .map(|s| (s.to_string(), "why".into()))
            .collect(),
    };
    // Empty: start them all (at most ten per reconcile).
    assert_eq!(
        plan(&sorted(&[], &[], &[]), 3),
        Plan {
            create: 3,
            delete: vec![]
        }
    );
    assert_eq!(
        plan(&sorted(&[], &[], &[]), 50).create,
        MAX_CREATES_PER_RECONCILE
    );
    // Starting ones count: no second start for a Pod on its way.
    assert_eq!(plan(&sorted(&["a"], &["b"], &[]), 2), Plan::default());
    // Doomed ones go and are replaced.
    assert_eq!(
        plan(&sorted(&["a"], &[], &["x"]), 2),
        Plan {
            create: 1,
            delete: vec!["x".into()]
        }
    );
    // Scaled down: starting ones go first, then the newest ready ones.
    assert_eq!(
        plan(&sorted(&["old", "new"], &["boot"], &[]), 1),
        Plan {
            create: 0,
            delete: vec!["boot".into(), "new".into()]
        }
    );
    // Scaled to zero: nothing is left.
    assert_eq!(
        plan(&sorted(&["a", "b"], &[], &["x"]), 0),
        Plan {
            create: 0,
            delete: vec!["x".into(), "b".into(), "a".into()]
        }
    );
}

#[test]
fn a_data_pool_sandbox_runs_the_data_image_and_imports_its_stack_while_it_waits() {
    let mut p = pool(1);
    p.spec.profile = Profile::Data;
    let built = build(&p, &operator()).unwrap();
    let spec = built.spec.unwrap();
    let c = &spec.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some("localhost/sandboxrun/sandbox-python-data:dev")
    );
    // The runner's PRELOAD, after its three ceilings; the minimal profile's argv has none.
    let argv = c.command.as_ref().unwrap();
    assert_eq!(
        argv[5..],
        [
            "1048576",
            "64",
            "600",
            "numpy,pandas,matplotlib,matplotlib.pyplot,scipy"
        ]
    );
    // Counted ready only once the runner marks itself idle, its imports done.
    let probe = c.startup_probe.as_ref().expect("a startup probe");
    let exec = probe.exec.as_ref().unwrap().command.as_ref().unwrap();
    assert_eq!(exec, &["/usr/bin/test", "-e", sandboxrun_core::IDLE_MARK]);
    // It never kills the container: it gives up only after the Pod's own hard bound.
    let gives_up = i64::from(probe.failure_threshold.unwrap() * probe.period_seconds.unwrap());
    assert!(
        gives_up > spec.active_deadline_seconds.unwrap(),
        "{probe:?}"
    );
    // The minimal profile imports nothing: ready when it runs, no exec into it.
    let minimal = build(&pool(1), &operator()).unwrap();
    assert_eq!(minimal.spec.unwrap().containers[0].startup_probe, None);
}

#[test]
fn a_pool_sandbox_is_isolated_as_a_runs_own_and_waits_for_one_program() {
    let p = pool(2);
    let built = build(&p, &operator()).unwrap();
    let spec = built.spec.clone().unwrap();
    let c = &spec.containers[0];
    // What every sandbox has (pod.rs asserts each field for the run's own Pod).
    assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!((c.stdin, c.stdin_once), (Some(true), Some(true)));
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    // The profile's cgroup limits, and the longest timeout and output in the runner's argv (a
    // run's own come in its program frame and can only be lower).
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["cpu"].0, "500m");
    assert_eq!(limits["memory"].0, "256Mi");
    let argv = c.command.as_ref().unwrap();
    assert_eq!(argv[5..], ["1048576", "64", "600"]);
    // Owned by the pool, labelled with it and its profile, named by the API server.
    let meta = &built.metadata;
    assert_eq!(meta.generate_name.as_deref(), Some("default-"));
    assert_eq!(meta.labels.as_ref().unwrap()[LABEL_POOL], "default");
    assert_eq!(
        meta.labels.as_ref().unwrap()[LABEL_PROFILE],
        profile_hash(&p, &operator())
    );
    let owner = &meta.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("SandboxPool", "pool-uid")
    );
    // A hard bound even without the operator: idle time plus one longest run.
    assert_eq!(spec.active_deadline_seconds, Some(3600 + 600 + 10));
}

#[test]
fn a_changed_profile_is_a_new_hash_and_another_isolation_is_never_claimed() {
    let base = profile_hash(&pool(2), &operator());
    // Replicas are not the profile: scaling keeps the Pods.
    assert_eq!(profile_hash(&pool(5), &operator()), base);
    for change in [
        json!({"replicas": 2, "cpu": "1"}),
        json!({"replicas": 2, "memory": "512Mi"}),
        json!({"replicas": 2, "pids": 32}),
        json!({"replicas": 2, "tmpSize": "32Mi"}),
        json!({"replicas": 2, "image": "other:1"}),
        json!({"replicas": 2, "runtimeClassName": "runc"}),
        json!({"replicas": 2, "profile": "data"}),
    ] {
        let mut p = pool(2);
        p.spec = serde_json::from_value(change.clone()).unwrap();
        assert_ne!(profile_hash(&p, &operator()), base, "{change}");
    }
    let mut other = pool(2);
    other.spec.runtime_class_name = Some("runc".into());
    assert!(!same_isolation(&other, &operator()));
    let mut image = pool(2);
    image.spec.image = Some("evil:latest".into());
    assert!(!same_isolation(&image, &operator()));
    assert!(same_isolation(&pool(2), &operator()));
}

#[test]
fn a_data_pool_starts_the_data_image_unless_it_names_one() {
    let image = |p: &SandboxPool| {
        build(p, &operator()).unwrap().spec.unwrap().containers[0]
            .image
            .clone()
            .unwrap()
    };
    assert_eq!(image(&pool(1)), "localhost/sandboxrun/sandbox-python:dev");
    let mut data = pool(1);
    data.spec.profile = sandboxrun_core::Profile::Data;
    assert_eq!(image(&data), "localhost/sandboxrun/sandbox-python-data:dev");
    assert!(same_isolation(&data, &operator()));
    let mut own = data.clone();
    own.spec.image = Some("registry.example/data:1".into());
    assert_eq!(image(&own), "registry.example/data:1");
    assert!(!same_isolation(&own, &operator()));
    // A minimal pool that names the data image is not of the minimal isolation.
    let mut mixed = pool(1);
    mixed.spec.image = Some("localhost/sandboxrun/sandbox-python-data:dev".into());
    assert!(!same_isolation(&mixed, &operator()));
}

#[test]
fn claims_are_counted_once() {
    let claims = Claims::default();
    claims.add("ns/p");
    claims.add("ns/p");
    assert_eq!(claims.take("ns/p"), 2);
    assert_eq!(claims.take("ns/p"), 0);
    claims.give_back("ns/p", 2);
    assert_eq!(claims.take("ns/p"), 2);
}

#[test]
fn a_sandbox_another_run_is_claiming_is_not_claimed_beside_it() {
    let doubts = ClaimsInDoubt::default();
    let claim = |pod: &str| ClaimInDoubt {
        pod: pod.to_owned(),
        pool: "default".to_owned(),
        resource_version: Some("7".to_owned()),
    };
    assert!(doubts.try_insert("run-1", claim("default-a")));
    // Another run, the same Pod: not while run-1's answer is out (or in doubt).
    assert!(!doubts.try_insert("run-2", claim("default-a")));
    assert!(doubts.try_insert("run-2", claim("default-b")));
    // The same run again (its claim in doubt, tried again) is no other run.
    assert!(doubts.try_insert("run-1", claim("default-a")));
    // Answered: the Pod is free to be tried by others (a conflict tells them the rest).
    doubts.remove("run-1");
    assert!(doubts.try_insert("run-3", claim("default-a")));
}

#[test]
fn a_claim_leaving_the_idle_watch_wakes_no_pool_until_its_hand_over() {
    // As the watch of idle Pods gets a claim: a deletion carrying the Pod as it was before,
    // still owned by its pool.
    let mut idle = build(&pool(1), &operator()).expect("a pool with a name and a uid");
    idle.metadata.name = Some("default-a".into());
    let (claimed, claiming) = (ClaimedPods::default(), ClaimsInDoubt::default());
    let woken = pool_woken_by(&idle, &claimed, &claiming);
    assert_eq!(woken, Some(ObjectRef::new("default").within("runs")));
    // Being claimed (its answer not in yet), then claimed: no wake either way.
    let doubt = ClaimInDoubt {
        pod: "default-a".to_owned(),
        pool: "default".to_owned(),
        resource_version: Some("7".to_owned()),
    };
    assert!(claiming.try_insert("run-1", doubt));
    assert_eq!(pool_woken_by(&idle, &claimed, &claiming), None);
    claimed.add("default-a", "run-1");
    claiming.remove("run-1");
    assert_eq!(pool_woken_by(&idle, &claimed, &claiming), None);
    // Another Pod of the pool still wakes it.
    let mut other = idle.clone();
    other.metadata.name = Some("default-b".into());
    assert_eq!(pool_woken_by(&other, &claimed, &claiming), woken);
}

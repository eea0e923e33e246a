use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::python::pod::CONTAINER;

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn spec() -> SandboxSessionSpec {
    SandboxSessionSpec {
        agent: "a".to_owned(),
        environment: Default::default(),
        profile: None,
        limits: Default::default(),
        idle_timeout_seconds: Some(60),
        max_lifetime_seconds: Some(600),
    }
}

fn pod(state: ContainerState, started: bool) -> Pod {
    Pod {
        status: Some(PodStatus {
            phase: Some("Running".to_owned()),
            container_statuses: Some(vec![ContainerStatus {
                name: CONTAINER.to_owned(),
                started: Some(started),
                state: Some(state),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn running() -> Pod {
    pod(
        ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        },
        true,
    )
}

const CREATED: &str = "2026-12-05T10:00:00Z";

fn ready() -> SandboxSessionStatus {
    SandboxSessionStatus {
        phase: Some(SessionPhase::Ready),
        pod_name: Some("p".to_owned()),
        start_time: Some(Time(at("2026-12-05T10:00:02Z"))),
        ..Default::default()
    }
}

#[test]
fn a_new_session_records_its_pod_then_creates_it_then_is_ready_once_it_started() {
    let now = at("2026-12-05T10:00:01Z");
    let new = SandboxSessionStatus::default();
    assert_eq!(next(&spec(), &new, at(CREATED), None, now), Step::RecordPod);
    let recorded = SandboxSessionStatus {
        pod_name: Some("p".to_owned()),
        phase: Some(SessionPhase::Pending),
        ..Default::default()
    };
    assert_eq!(
        next(&spec(), &recorded, at(CREATED), None, now),
        Step::CreatePod
    );
    let starting = pod(ContainerState::default(), false);
    assert!(matches!(
        next(&spec(), &recorded, at(CREATED), Some(&starting), now),
        Step::WaitUntil(_)
    ));
    assert_eq!(
        next(&spec(), &recorded, at(CREATED), Some(&running()), now),
        Step::MarkReady
    );
    // One that never starts is given up.
    let late = at("2026-12-05T10:02:01Z");
    assert!(matches!(
        next(&spec(), &recorded, at(CREATED), Some(&starting), late),
        Step::End(SessionEndReason::SandboxLost, _)
    ));
}

#[test]
fn an_idle_session_ends_at_its_idle_timeout_a_busy_one_does_not() {
    let before = at("2026-12-05T10:01:01Z");
    assert_eq!(
        next(&spec(), &ready(), at(CREATED), Some(&running()), before),
        Step::WaitUntil(at("2026-12-05T10:01:02Z"))
    );
    let after = at("2026-12-05T10:01:02Z");
    assert!(matches!(
        next(&spec(), &ready(), at(CREATED), Some(&running()), after),
        Step::End(SessionEndReason::IdleTimeout, _)
    ));
    // A call counts from its end.
    let called = SandboxSessionStatus {
        last_call_time: Some(Time(at("2026-12-05T10:00:50Z"))),
        ..ready()
    };
    assert_eq!(
        next(&spec(), &called, at(CREATED), Some(&running()), after),
        Step::WaitUntil(at("2026-12-05T10:01:50Z"))
    );
    let busy = SandboxSessionStatus {
        phase: Some(SessionPhase::Busy),
        active_run: Some("run".to_owned()),
        active_since: Some(Time(at("2026-12-05T10:01:00Z"))),
        ..ready()
    };
    assert!(matches!(
        next(&spec(), &busy, at(CREATED), Some(&running()), after),
        Step::WaitUntil(_)
    ));
    // A lease older than any call is a gone run's.
    let stale = at("2026-12-05T10:12:00Z");
    let long = SandboxSessionSpec {
        max_lifetime_seconds: Some(3600),
        ..spec()
    };
    assert!(matches!(
        next(&long, &busy, at(CREATED), Some(&running()), stale),
        Step::End(SessionEndReason::CallCancelled, _)
    ));
}

#[test]
fn a_session_ends_at_its_longest_life_even_while_busy() {
    let busy = SandboxSessionStatus {
        phase: Some(SessionPhase::Busy),
        active_run: Some("run".to_owned()),
        active_since: Some(Time(at("2026-12-05T10:09:00Z"))),
        ..ready()
    };
    let now = at("2026-12-05T10:10:02Z");
    assert!(matches!(
        next(&spec(), &busy, at(CREATED), Some(&running()), now),
        Step::End(SessionEndReason::MaxLifetime, _)
    ));
}

#[test]
fn a_session_whose_sandbox_is_gone_or_ended_ends_lost() {
    let now = at("2026-12-05T10:00:30Z");
    assert!(matches!(
        next(&spec(), &ready(), at(CREATED), None, now),
        Step::End(SessionEndReason::SandboxLost, _)
    ));
    let exited = pod(
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some("Error".to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        false,
    );
    assert!(matches!(
        next(&spec(), &ready(), at(CREATED), Some(&exited), now),
        Step::End(SessionEndReason::SandboxLost, _)
    ));
}

#[test]
fn a_sandbox_that_ended_under_a_call_is_left_to_the_call_to_end_for_a_while() {
    let ended = at("2026-12-05T10:01:00Z");
    let exited = pod(
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 0,
                reason: Some("Completed".to_owned()),
                finished_at: Some(Time(ended)),
                ..Default::default()
            }),
            ..Default::default()
        },
        false,
    );
    let busy = SandboxSessionStatus {
        phase: Some(SessionPhase::Busy),
        active_run: Some("run".to_owned()),
        active_since: Some(Time(at("2026-12-05T10:00:59Z"))),
        ..ready()
    };
    let give_up = ended.saturating_add(CALL_ENDS_WITHIN).unwrap();
    // The call ends it (with why its interpreter ended), unless it does not in time.
    assert_eq!(
        next(
            &spec(),
            &busy,
            at(CREATED),
            Some(&exited),
            at("2026-12-05T10:01:01Z")
        ),
        Step::WaitUntil(give_up)
    );
    assert!(matches!(
        next(&spec(), &busy, at(CREATED), Some(&exited), give_up),
        Step::End(SessionEndReason::SandboxLost, _)
    ));
    // Nobody holds it: lost at once.
    assert!(matches!(
        next(
            &spec(),
            &ready(),
            at(CREATED),
            Some(&exited),
            at("2026-12-05T10:01:01Z")
        ),
        Step::End(SessionEndReason::SandboxLost, _)
    ));
}

#[test]
fn an_ended_session_is_cleaned_and_forgotten_later() {
    let ended = SandboxSessionStatus {
        phase: Some(SessionPhase::Ended),
        end_reason: Some(SessionEndReason::Closed),
        ..ready()
    };
    let now = at("2026-12-05T10:05:00Z");
    assert_eq!(
        next(&spec(), &ended, at(CREATED), Some(&running()), now),
        Step::Clean {
            forget_at: at("2026-12-05T10:15:00Z")
        }
    );
}

//! A session's sandbox Pod (pure): a run's sandbox in every isolation setting, but its runner
//! serves calls until the session ends (`pod_session_argv`), its stdin stays open between the calls'
//! attach streams, and its hard bound is the session's longest life.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use sandboxrun_api::SandboxSession;
use sandboxrun_core::Limits;
use sandboxrun_core::runner::pod_session_argv;

use crate::python::pod::{
    self, ACTIVE_DEADLINE_GRACE_SECONDS, BuildError, LABEL_AGENT, LABEL_MANAGED_BY, LABEL_TOOL,
    MANAGER, SandboxConfig,
};

/// Label of a session's sandbox Pod: the session's name.
pub const LABEL_SESSION: &str = "sandboxrun.dev/session";

/// The name of a session's sandbox Pod.
pub fn pod_name(session: &str) -> String {
    pod::pod_name(session)
}

/// The limits a session's sandbox is built with: its spec's, clamped.
pub fn limits(session: &SandboxSession) -> Limits {
    session.spec.limits.effective()
}

/// The owner reference that ties the Pod to its session (its controller, blocking the
/// session's foreground deletion): closing the session (deleting it) deletes the Pod, with no
/// reaper.
pub fn owner_reference(session: &SandboxSession) -> Option<OwnerReference> {
    session.controller_owner_ref(&())
}

/// Whether `pod` is this session's own (its controller, by uid).
pub fn belongs_to(pod: &Pod, session: &SandboxSession) -> bool {
    let Some(uid) = session.metadata.uid.as_deref() else {
        return false;
    };
    pod.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == uid && o.kind == SandboxSession::kind(&()))
}

/// The session's sandbox Pod.
pub fn build(session: &SandboxSession, config: &SandboxConfig) -> Result<Pod, BuildError> {
    let profile = session.spec.sandbox_profile();
    let config = config
        .for_profile(profile)
        .ok_or(BuildError::ProfileUnavailable(profile))?;
    let owner = owner_reference(session).ok_or(BuildError::Unidentified)?;
    let namespace = session.namespace().ok_or(BuildError::Unidentified)?;
    let limits = limits(session);
    let name = session.name_any();
    let metadata = ObjectMeta {
        name: Some(pod_name(&name)),
        namespace: Some(namespace),
        // The managed-by label puts it under the sandboxes' NetworkPolicy (no traffic at all).
        labels: Some(BTreeMap::from([
            (LABEL_MANAGED_BY.to_owned(), MANAGER.to_owned()),
            (LABEL_SESSION.to_owned(), pod::label_value(&name)),
            (
                LABEL_AGENT.to_owned(),
                pod::label_value(&session.spec.agent),
            ),
            (LABEL_TOOL.to_owned(), "python".to_owned()),
        ])),
        annotations: Some(pod::limits_annotation(&limits)),
        owner_references: Some(vec![owner]),
        ..Default::default()
    };
    // The kubelet's own bound: the session's longest life, and the grace of a call's end.
    let deadline = i64::from(session.spec.max_lifetime() + ACTIVE_DEADLINE_GRACE_SECONDS);
    let mut built = pod::sandbox_pod(metadata, &config, profile, &limits, deadline, &limits.cpu);
    let preloads = !profile.preloaded_modules().is_empty();
    for container in built.spec.iter_mut().flat_map(|s| s.containers.iter_mut()) {
        container.command = Some(pod_session_argv(&limits, profile));
        // Each call comes over an attach stream of its own: the runner's stdin must outlive
        // each of them (the runner drops a frame cut short by a stream that broke).
        container.stdin_once = Some(false);
        if preloads {
            // Ready once the imports are done, so the first call does not wait for them.
            container.startup_probe = Some(pod::idle_probe(deadline));
        }
    }
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxrun_api::SandboxSessionSpec;
    use sandboxrun_core::files::Profile;

    fn config() -> SandboxConfig {
        SandboxConfig {
            image: "sandbox:1".to_owned(),
            data_image: "sandbox-data:1".to_owned(),
            runtime_class: "gvisor".to_owned(),
            tmp_size: "64Mi".to_owned(),
            canary: None,
        }
    }

    fn session(profile: Option<Profile>) -> SandboxSession {
        let mut s = SandboxSession::new(
            "sbs-0123",
            SandboxSessionSpec {
                agent: "agent-a".to_owned(),
                environment: Default::default(),
                profile,
                limits: Default::default(),
                idle_timeout_seconds: None,
                max_lifetime_seconds: Some(600),
            },
        );
        s.metadata.namespace = Some("sandboxes".to_owned());
        s.metadata.uid = Some("uid-1".to_owned());
        s
    }

    #[test]
    fn the_pod_is_a_sandbox_that_serves_calls_for_the_sessions_life() {
        let pod = build(&session(None), &config()).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let c = &spec.containers[0];
        assert_eq!(c.stdin, Some(true));
        assert_eq!(c.stdin_once, Some(false), "each call attaches anew");
        let command = c.command.as_ref().unwrap();
        assert!(
            command
                .iter()
                .any(|a| a == sandboxrun_core::runner::SESSION_FLAG)
        );
        assert_eq!(spec.active_deadline_seconds, Some(610));
        // The isolation of any sandbox.
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert!(c.startup_probe.is_none());
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("SandboxSession", "uid-1")
        );
        assert_eq!(
            pod.labels().get(LABEL_MANAGED_BY).map(String::as_str),
            Some(MANAGER)
        );
        assert!(belongs_to(&pod, &session(None)));
    }

    #[test]
    fn a_data_session_is_ready_once_its_imports_are_done() {
        let pod = build(&session(Some(Profile::Data)), &config()).unwrap();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("sandbox-data:1"));
        assert!(c.startup_probe.is_some());
    }
}

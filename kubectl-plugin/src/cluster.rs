//! The cluster: a client from the kubeconfig (as kubectl finds it), who the caller is (the
//! SelfSubjectReview API, like `kubectl auth whoami`), and API errors turned into what a person
//! can act on: which run is missing, which verb on which resource RBAC refused, what the
//! admission policy said.

use std::num::NonZeroU32;

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::Status;
use kube::{Client, Config};
use sandboxrun_api::SandboxRun;
use sandboxrun_api::client::{ClientRate, RateLimitLayer};

use crate::cli::Cli;

/// The resource every command but `sessions` works on, as RBAC and `kubectl auth can-i` name it.
pub const RUNS: &str = "sandboxruns.sandboxrun.dev";
/// The resource `sessions` works on.
pub const SESSIONS: &str = "sandboxsessions.sandboxrun.dev";
/// The resource `whoami` creates.
const SELF_SUBJECT_REVIEWS: &str = "selfsubjectreviews.authentication.k8s.io";

/// kubectl's own client-side rate limit (client-go's defaults for kubectl).
const RATE: (u32, u32) = (50, 300);

/// A client for the cluster the kubeconfig names (`--kubeconfig`, `--context`, else what kubectl
/// would use: `$KUBECONFIG`, `~/.kube/config`, or the in-cluster service account).
pub async fn connect(cli: &Cli) -> Result<Client> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match (&cli.kubeconfig, &cli.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        (None, Some(_)) => Config::from_kubeconfig(&options).await?,
        (None, None) => Config::infer().await.context(
            "no cluster to talk to: set KUBECONFIG (or --kubeconfig), or write ~/.kube/config",
        )?,
    };
    let (qps, burst) = RATE;
    let rate = ClientRate {
        qps: NonZeroU32::new(qps).context("qps")?,
        burst: NonZeroU32::new(burst).context("burst")?,
    };
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&RateLimitLayer::new(rate))
        .build())
}

/// The SandboxRun API of one namespace.
pub fn runs(client: &Client, namespace: &str) -> Api<SandboxRun> {
    Api::namespaced(client.clone(), namespace)
}

/// The caller's own user name, as `kubectl auth whoami` reports it.
pub async fn whoami(client: &Client) -> Result<String> {
    let doing = Doing {
        verb: "create",
        resource: SELF_SUBJECT_REVIEWS,
        namespace: None,
        name: None,
    };
    let review: SelfSubjectReview = serde_json::from_value(serde_json::json!({}))?;
    let answer = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| explain(e, &doing))?;
    answer
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .filter(|u| !u.is_empty())
        .context("the cluster's SelfSubjectReview names no user: who you are is unknown")
}

/// What a request was doing: the words of the error a person reads.
#[derive(Clone, Copy, Debug)]
pub struct Doing<'a> {
    /// The RBAC verb (`get`, `list`, `watch`, `create`, `patch`).
    pub verb: &'static str,
    /// The resource, `plural.group`.
    pub resource: &'static str,
    /// The namespace, for namespaced requests.
    pub namespace: Option<&'a str>,
    /// The object, for requests about one.
    pub name: Option<&'a str>,
}

impl<'a> Doing<'a> {
    /// `verb` on SandboxRuns in `namespace` (about `name`, if given).
    pub fn runs(verb: &'static str, namespace: &'a str, name: Option<&'a str>) -> Self {
        Self {
            verb,
            resource: RUNS,
            namespace: Some(namespace),
            name,
        }
    }

    /// `verb` on SandboxSessions in `namespace` (`None`: every namespace; about `name`, if
    /// given).
    pub fn sessions(verb: &'static str, namespace: Option<&'a str>, name: Option<&'a str>) -> Self {
        Self {
            verb,
            resource: SESSIONS,
            namespace,
            name,
        }
    }

    /// The kind of the objects the request is about, as errors name them.
    fn kind(&self) -> &'static str {
        match self.resource {
            SESSIONS => "SandboxSession",
            _ => "SandboxRun",
        }
    }

    /// The resource's plural, as `kubectl get` takes it.
    fn plural(&self) -> &'static str {
        self.resource
            .split_once('.')
            .map_or(self.resource, |(plural, _)| plural)
    }
}

/// The error a person can act on for `e`, which `doing` met.
pub fn explain(e: kube::Error, doing: &Doing) -> anyhow::Error {
    match e {
        kube::Error::Api(status) => anyhow!(explain_status(&status, doing)),
        other => anyhow!(
            "could not {} {}: {other} (is the cluster reachable? kubectl cluster-info)",
            doing.verb,
            doing.resource
        ),
    }
}

/// The message for an API error `status` that `doing` met.
pub fn explain_status(status: &Status, doing: &Doing) -> String {
    let ns = doing.namespace.unwrap_or_default();
    let in_ns = doing
        .namespace
        .map(|ns| format!(" in namespace {ns}"))
        .unwrap_or_default();
    let message = status.message.trim();
    let kind = doing.kind();
    match status.code {
        404 if message.contains("could not find the requested resource") => format!(
            "the cluster does not serve {}: is the sandboxrun CRD installed? (kubectl get crd {})",
            doing.resource, doing.resource
        ),
        404 => match doing.name {
            Some(name) => {
                let plural = doing.plural();
                format!("no {kind} {name}{in_ns} (list them: kubectl get {plural} -n {ns})")
            }
            None => format!("not found: {message}"),
        },
        403 if is_admission(message) => {
            let said = message
                .split_once("denied request: ")
                .map_or(message, |(_, said)| said);
            let what = doing.name.map(|n| format!(" {n}")).unwrap_or_default();
            format!(
                "the cluster's admission policy refused to {} {kind}{what}: {said}",
                doing.verb
            )
        }
        403 if message.contains("exceeded quota") => {
            format!("the namespace's ResourceQuota is used up{in_ns}: {message}")
        }
        403 => {
            let can_i = match doing.namespace {
                Some(ns) => format!(
                    "kubectl auth can-i {} {} -n {ns}",
                    doing.verb, doing.resource
                ),
                None => format!("kubectl auth can-i {} {}", doing.verb, doing.resource),
            };
            format!(
                "forbidden by RBAC: you may not {} {}{in_ns}; ask a cluster admin for a Role that \
                 grants \"{}\" on {} (check: {can_i}). The API server said: {message}",
                doing.verb, doing.resource, doing.verb, doing.resource
            )
        }
        401 => format!(
            "the cluster did not accept your credentials (401 Unauthorized): log in again or check \
             the kubeconfig's user ({message})"
        ),
        409 => match doing.name {
            Some(name) => {
                format!("{kind} {name} changed while it was being written; try again ({message})")
            }
            None => format!("conflict: {message}"),
        },
        422 => format!("the API server refused it as invalid: {message}"),
        429 => format!("the API server is busy (429 Too Many Requests); try again ({message})"),
        code => format!(
            "could not {} {}{in_ns}: {message} ({code} {})",
            doing.verb, doing.resource, status.reason
        ),
    }
}

/// Whether a 403 came from an admission policy, not from RBAC.
fn is_admission(message: &str) -> bool {
    message.contains("ValidatingAdmissionPolicy") || message.contains("admission webhook")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str, message: &str) -> Status {
        Status::failure(message, reason).with_code(code)
    }

    #[test]
    fn a_missing_run_is_named_with_its_namespace() {
        let s = status(
            404,
            "NotFound",
            "sandboxruns.sandboxrun.dev \"run-9\" not found",
        );
        let m = explain_status(&s, &Doing::runs("get", "team-a", Some("run-9")));
        assert_eq!(
            m,
            "no SandboxRun run-9 in namespace team-a (list them: kubectl get sandboxruns -n team-a)"
        );
    }

    #[test]
    fn a_missing_crd_says_so() {
        let s = status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        let m = explain_status(&s, &Doing::runs("list", "team-a", None));
        assert!(m.contains("is the sandboxrun CRD installed"), "{m}");
        assert!(
            m.contains("kubectl get crd sandboxruns.sandboxrun.dev"),
            "{m}"
        );
    }

    #[test]
    fn rbac_names_the_verb_and_the_resource() {
        let s = status(
            403,
            "Forbidden",
            "sandboxruns.sandboxrun.dev \"run-1\" is forbidden: User \"bob\" cannot patch resource \
             \"sandboxruns\" in API group \"sandboxrun.dev\" in the namespace \"runs\"",
        );
        let m = explain_status(&s, &Doing::runs("patch", "runs", Some("run-1")));
        assert!(
            m.starts_with(
                "forbidden by RBAC: you may not patch sandboxruns.sandboxrun.dev in namespace runs;"
            ),
            "{m}"
        );
        assert!(
            m.contains("grants \"patch\" on sandboxruns.sandboxrun.dev"),
            "{m}"
        );
        assert!(
            m.contains("kubectl auth can-i patch sandboxruns.sandboxrun.dev -n runs"),
            "{m}"
        );
        assert!(m.contains("User \"bob\" cannot patch"), "{m}");
    }

    #[test]
    fn the_admission_policy_is_quoted_not_blamed_on_rbac() {
        let s = status(
            403,
            "Forbidden",
            "sandboxruns.sandboxrun.dev \"run-1\" is forbidden: ValidatingAdmissionPolicy \
             'sandboxrun-operator-run-identity' with binding 'sandboxrun-operator-run-identity' \
             denied request: the agent that asked for this run cannot approve or deny it",
        );
        let m = explain_status(&s, &Doing::runs("patch", "runs", Some("run-1")));
        assert_eq!(
            m,
            "the cluster's admission policy refused to patch SandboxRun run-1: the agent that \
             asked for this run cannot approve or deny it"
        );
    }

    #[test]
    fn other_codes() {
        let doing = Doing::runs("create", "runs", None);
        let quota = status(
            403,
            "Forbidden",
            "exceeded quota: sandboxrun-runs, requested: count/sandboxruns.sandboxrun.dev=1",
        );
        assert!(explain_status(&quota, &doing).contains("ResourceQuota is used up"));
        let invalid = status(422, "Invalid", "spec.limits.timeoutSeconds: Invalid value");
        assert!(explain_status(&invalid, &doing).contains("refused it as invalid"));
        let unauthorized = status(401, "Unauthorized", "Unauthorized");
        assert!(explain_status(&unauthorized, &doing).contains("log in again"));
        let other = status(500, "InternalError", "etcd is down");
        assert_eq!(
            explain_status(&other, &doing),
            "could not create sandboxruns.sandboxrun.dev in namespace runs: etcd is down (500 InternalError)"
        );
    }

    #[test]
    fn a_missing_session_is_named_as_a_session() {
        let s = status(
            404,
            "NotFound",
            "sandboxsessions.sandboxrun.dev \"s-9\" not found",
        );
        let m = explain_status(&s, &Doing::sessions("delete", Some("team-a"), Some("s-9")));
        assert_eq!(
            m,
            "no SandboxSession s-9 in namespace team-a (list them: kubectl get sandboxsessions -n team-a)"
        );
        let s = status(
            403,
            "Forbidden",
            "sandboxsessions.sandboxrun.dev is forbidden: User \"bob\" cannot list resource \
             \"sandboxsessions\" in API group \"sandboxrun.dev\" at the cluster scope",
        );
        let m = explain_status(&s, &Doing::sessions("list", None, None));
        assert!(
            m.starts_with("forbidden by RBAC: you may not list sandboxsessions.sandboxrun.dev;"),
            "{m}"
        );
        assert!(
            m.contains("kubectl auth can-i list sandboxsessions.sandboxrun.dev)"),
            "{m}"
        );
    }
}

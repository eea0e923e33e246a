//! Clients that act as one of the chart's service accounts, to test RBAC by doing, not by
//! reading the Roles: the token comes from the TokenRequest API, exactly as a Pod's would.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use kube::config::AuthInfo;
use kube::{Client, Config};

/// A token of `system:serviceaccount:<namespace>:<name>` (valid 10 min), from the TokenRequest
/// API.
pub async fn token_for(admin: &Client, namespace: &str, name: &str) -> Result<String> {
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "spec": { "audiences": [], "expirationSeconds": 600 }
    }))?;
    let sa: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let issued = sa
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("token for service account {namespace}/{name}"))?;
    let Some(token) = issued.status.map(|s| s.token) else {
        bail!("the API server issued no token for {namespace}/{name}");
    };
    Ok(token)
}

/// A client authenticated as `system:serviceaccount:<namespace>:<name>` (token valid 10 min).
pub async fn client_as(admin: &Client, namespace: &str, name: &str) -> Result<Client> {
    let token = token_for(admin, namespace, name).await?;
    // Same API server and CA as the admin kubeconfig; only the credentials change.
    let mut config = Config::infer().await.context("reading KUBECONFIG")?;
    config.auth_info = AuthInfo {
        token: Some(token.into()),
        ..AuthInfo::default()
    };
    Client::try_from(config).context("building the service account's client")
}

/// What `kubectl auth can-i VERB RESOURCE[/SUBRESOURCE] -n NAMESPACE` answers for the client's
/// own identity (used for verbs a test cannot simply try, such as watch or update of a Lease).
pub async fn can_i(
    client: &Client,
    verb: &str,
    group: &str,
    resource: &str,
    subresource: &str,
    namespace: &str,
) -> Result<bool> {
    let review: SelfSubjectAccessReview = serde_json::from_value(serde_json::json!({
        "spec": { "resourceAttributes": {
            "verb": verb, "group": group, "resource": resource,
            "subresource": subresource, "namespace": namespace,
        } }
    }))?;
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The client's own user name, as `kubectl auth whoami` reports it (a SelfSubjectReview).
pub async fn whoami(client: &Client) -> Result<String> {
    let review: SelfSubjectReview = serde_json::from_value(serde_json::json!({}))?;
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await?;
    answer
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .context("the SelfSubjectReview names no user")
}

/// A service account `name` in `namespace` with a Role of `verbs` on SandboxRuns there, bound to
/// it; returns a client acting as it once the binding is in force. The API server's authorizer
/// learns of a new binding through its own watch, so until then the account is refused: a test
/// using it at once would meet that lag as a 403 (`can_i` is polled on the Role's first verb).
pub async fn run_account(
    admin: &Client,
    namespace: &str,
    name: &str,
    verbs: &[&str],
) -> Result<Client> {
    let pp = PostParams::default();
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create(&pp, &sa)
        .await?;
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "rules": [{"apiGroups": ["sandboxrun.dev"], "resources": ["sandboxruns"], "verbs": verbs}],
    }))?;
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(&pp, &role)
        .await?;
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }))?;
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(&pp, &binding)
        .await?;
    let client = client_as(admin, namespace, name).await?;
    let probe = verbs.first().copied().unwrap_or("get");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !can_i(
        &client,
        probe,
        "sandboxrun.dev",
        "sandboxruns",
        "",
        namespace,
    )
    .await?
    {
        ensure!(
            Instant::now() < deadline,
            "the RoleBinding {namespace}/{name} did not take effect within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(client)
}

//! Clients that act as one of the chart's service accounts, to test RBAC by doing, not by
//! reading the Roles: the token comes from the TokenRequest API, exactly as a Pod's would.

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::core::v1::ServiceAccount;
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

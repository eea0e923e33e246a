//! `sandboxrun-mcp serve`: MCP over HTTP. Streamable HTTP at `/mcp` (rmcp's service: sessions
//! for 2025-06-18 and 2025-11-25 clients, stateless for 2026-07-28), legacy HTTP+SSE at `/sse`
//! and `/messages`, and unauthenticated `/healthz` and `/metrics` for probes and scrapers.
//!
//! Every MCP route passes, outermost first: the body size limit (413), Origin and Host
//! validation (403), the credential (401: an API key, or with `--oauth-issuer` an OAuth access
//! token, see [`oauth`]) and the agent's rate limit (429). With OAuth, the protected resource
//! metadata is served without a credential at `/.well-known/oauth-protected-resource[/path]`.
//! Any answer that left its request's body unread closes its HTTP/1.1 connection, and says so
//! ([`unread_body`]).

pub mod auth;
pub mod jwks;
pub mod oauth;
pub mod origin;
pub mod owners;
pub mod ratelimit;
pub mod replay;
pub mod sse;
pub mod unread_body;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod resume_tests;
#[cfg(test)]
mod revision_tests;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;
use tower_http::limit::RequestBodyLimitLayer;

use crate::server::{Agent, SandboxRunServer, Shared};
use auth::KeyStore;
use oauth::{ResourceServer, TokenRefusal};
use origin::{OriginPolicy, Refusal};
use ratelimit::{RateLimiter, retry_after_secs};

/// Settings of the HTTP server.
pub struct HttpConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Accepted API keys.
    pub keys: KeyStore,
    /// Allowed Origin and Host values.
    pub origin: OriginPolicy,
    /// Requests a minute per agent, on average.
    pub rate_per_minute: NonZeroU32,
    /// Requests an agent may make at once.
    pub rate_burst: NonZeroU32,
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// OAuth access tokens, next to the API keys.
    pub oauth: Option<Arc<ResourceServer>>,
}

/// State of the HTTP routes.
pub struct HttpState {
    /// The MCP server's shared state.
    pub shared: Arc<Shared>,
    keys: KeyStore,
    oauth: Option<Arc<ResourceServer>>,
    limiter: RateLimiter,
    origin: OriginPolicy,
    sessions: sse::Sessions,
    owners: owners::SessionOwners,
    /// Streamable HTTP's events, for resumption (rmcp's event store).
    replay: replay::ReplayLog,
    body_limit: usize,
    /// Cancelled at shutdown: ends SSE sessions and Streamable HTTP sessions.
    shutdown: CancellationToken,
}

/// A JSON-RPC error object as an HTTP response, so MCP clients can show the message.
pub fn jsonrpc_error_response(status: StatusCode, code: i64, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": message},
    });
    (status, axum::Json(body)).into_response()
}

/// Builds the application: routes, security layers, state.
pub fn router(config: &HttpConfig, shared: Arc<Shared>, shutdown: CancellationToken) -> Router {
    let state = Arc::new(HttpState {
        shared: shared.clone(),
        keys: config.keys.clone(),
        oauth: config.oauth.clone(),
        limiter: RateLimiter::new(config.rate_per_minute, config.rate_burst),
        origin: config.origin.clone(),
        sessions: sse::Sessions::default(),
        owners: owners::SessionOwners::default(),
        replay: replay::ReplayLog::default(),
        body_limit: config.body_limit,
        shutdown: shutdown.clone(),
    });

    let mut mcp_config = StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(config.body_limit)
        .with_cancellation_token(shutdown.child_token());
    mcp_config = match config.origin.rmcp_allowed_hosts() {
        Some(hosts) => mcp_config.with_allowed_hosts(hosts),
        None => mcp_config.disable_allowed_hosts(),
    };
    let streamable = StreamableHttpService::new(
        move || Ok(handler(SandboxRunServer::new(shared.clone(), None))),
        // Resumable streams: a response whose stream broke reaches its client on reconnection.
        Arc::new(LocalSessionManager::default().with_event_store(Arc::new(state.replay.clone()))),
        mcp_config,
    );

    let mcp = Router::new()
        .route_service("/mcp", streamable)
        .layer(middleware::from_fn(error_id_null))
        .layer(middleware::from_fn(session_deleted))
        .layer(middleware::from_fn_with_state(state.clone(), session_owner))
        .route("/sse", get(sse::connect))
        .route("/messages", post(sse::message))
        .layer(middleware::from_fn(require_json))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(middleware::from_fn_with_state(state.clone(), check_origin));

    let mut app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics));
    if let Some(oauth) = &config.oauth {
        // RFC 9728: at the resource's own path, and at the bare well-known path for clients
        // that look only there.
        app = app.route(oauth.metadata_path(), get(resource_metadata));
        if oauth.metadata_path() != BARE_METADATA_PATH {
            app = app.route(BARE_METADATA_PATH, get(resource_metadata));
        }
    }
    app.merge(mcp)
        .layer(RequestBodyLimitLayer::new(config.body_limit))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            explain_too_large,
        ))
        .layer(middleware::from_fn(unread_body::close_if_unread))
        .with_state(state)
}

/// The handler of one Streamable HTTP session or stateless request: the product's.
#[cfg(not(feature = "conformance"))]
fn handler(server: SandboxRunServer) -> SandboxRunServer {
    server
}

/// The handler of one Streamable HTTP session or stateless request: the product's, with the
/// conformance suite's fixtures around it when the server was started with them.
#[cfg(feature = "conformance")]
fn handler(server: SandboxRunServer) -> crate::conformance::WithFixtures {
    crate::conformance::WithFixtures::new(server)
}

const BARE_METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// The protected resource metadata: public, and readable from any web origin (browser-based
/// clients discover the authorization server with it before they hold any credential).
async fn resource_metadata(State(state): State<Arc<HttpState>>) -> Response {
    let Some(oauth) = &state.oauth else {
        return StatusCode::NOT_FOUND.into_response();
    };
    (
        [(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")],
        axum::Json(oauth.metadata()),
    )
        .into_response()
}

/// Serves until `shutdown` is cancelled.
pub async fn serve(
    config: HttpConfig,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let app = router(&config, shared, shutdown.clone());
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    if let Some(oauth) = &config.oauth {
        oauth.prefetch().await;
    }
    tracing::info!(
        addr = %listener.local_addr()?,
        keys = config.keys.len(),
        oauth = config.oauth.is_some(),
        "serving MCP over HTTP"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
}

/// The frontend's metrics, behind the same DNS-rebinding defence as MCP (see
/// [`OriginPolicy::check_scrape`]): a rebound name in a browser cannot read them.
async fn metrics(State(state): State<Arc<HttpState>>, headers: axum::http::HeaderMap) -> Response {
    if let Err(refusal) = state.origin.check_scrape(&headers) {
        state.shared.metrics.observe_rejection("forbidden");
        let what = match refusal {
            Refusal::Origin(o) => format!("Origin {o:?} is not allowed"),
            Refusal::Host(h) => format!("Host {h:?} is not allowed"),
        };
        return (StatusCode::FORBIDDEN, what).into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.shared.metrics.encode(),
    )
        .into_response()
}

/// Keeps Streamable HTTP sessions to the agent that opened them (see [`owners`]).
async fn session_owner(State(state): State<Arc<HttpState>>, req: Request, next: Next) -> Response {
    const SESSION: &str = "mcp-session-id";
    let agent = req
        .extensions()
        .get::<Agent>()
        .map(|a| a.0.clone())
        .unwrap_or_default();
    let presented = req
        .headers()
        .get(SESSION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let delete = req.method() == axum::http::Method::DELETE;
    // rmcp answers a DELETE of any session id with success, known or not; the MCP spec wants
    // 404 for a session that is unknown or has ended, so a DELETE must name a session this
    // agent opened here and has not deleted yet.
    if let Some(session) = &presented
        && !(if delete {
            state.owners.owns(session, &agent)
        } else {
            state.owners.allows(session, &agent)
        })
    {
        return jsonrpc_error_response(
            StatusCode::NOT_FOUND,
            -32600,
            "session not found: start a new one with an initialize request",
        );
    }
    // A resumption (a GET with Last-Event-ID in a session of this agent) names an event of one
    // of that session's own streams, or it gets what rmcp gives an unknown id: an empty stream
    // (see `replay`). rmcp answers for unknown sessions itself.
    if req.method() == axum::http::Method::GET
        && let Some(last) = req.headers().get("last-event-id")
        && let Some(session) = &presented
        && state.owners.owns(session, &agent)
        && !state.replay.belongs(last.to_str().unwrap_or(""), session)
    {
        return (
            [(header::CONTENT_TYPE, "text/event-stream")],
            axum::body::Body::empty(),
        )
            .into_response();
    }
    let resp = next.run(req).await;
    let session = match (
        &presented,
        resp.headers().get(SESSION).and_then(|v| v.to_str().ok()),
    ) {
        (None, Some(created)) => {
            state.owners.record(created, &agent);
            Some(created.to_owned())
        }
        (Some(session), _) if delete && resp.status().is_success() => {
            state.owners.forget(session);
            None
        }
        (session, _) => session.clone(),
    };
    let events = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    match session {
        Some(session) if events => {
            let (parts, body) = resp.into_parts();
            let body = replay::bind_session(state.replay.clone(), session, body);
            Response::from_parts(parts, body)
        }
        _ => resp,
    }
}

/// rmcp answers a session DELETE with 202; clients (the Python SDK among them) expect 200 or
/// 204 and log a failure otherwise. The session is gone either way, so say 204.
async fn session_deleted(req: Request, next: Next) -> Response {
    let delete = req.method() == axum::http::Method::DELETE;
    let mut resp = next.run(req).await;
    if delete && resp.status() == StatusCode::ACCEPTED {
        *resp.status_mut() = StatusCode::NO_CONTENT;
    }
    resp
}

/// rmcp omits the `id` of a JSON error that answers no request (a JSON-RPC response POSTed to
/// a stateless server, for one); JSON-RPC 2.0 requires `"id": null` there, and strict clients
/// look for it. Adds it, as `transport::to_wire` does on the SSE transports. Only rmcp's JSON
/// (not event-stream) answers are buffered, and they are small error objects.
async fn error_id_null(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("application/json"));
    if !json || resp.status().is_success() {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return jsonrpc_error_response(parts.status, -32603, "the error answer could not be read");
    };
    let body = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(mut map))
            if map.contains_key("error") && !map.contains_key("id") =>
        {
            map.insert("id".to_owned(), serde_json::Value::Null);
            let text = serde_json::Value::Object(map).to_string();
            parts.headers.remove(header::CONTENT_LENGTH);
            axum::body::Body::from(text)
        }
        _ => axum::body::Body::from(bytes),
    };
    Response::from_parts(parts, body)
}

/// 403 for a foreign Origin or an unexpected Host.
async fn check_origin(State(state): State<Arc<HttpState>>, req: Request, next: Next) -> Response {
    match state.origin.check(req.headers()) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            state.shared.metrics.observe_rejection("forbidden");
            let message = match refusal {
                Refusal::Origin(o) => format!(
                    "Origin {o} is not allowed; browser clients must be served from an origin \
                     listed with --allowed-origin"
                ),
                Refusal::Host(h) => format!(
                    "Host {h:?} is not allowed; connect through a host name listed with \
                     --allowed-host"
                ),
            };
            tracing::info!(%message, "refused request");
            jsonrpc_error_response(StatusCode::FORBIDDEN, -32001, &message)
        }
    }
}

/// 401 without a valid credential (403 for a token without this server's scopes); 429 past the
/// agent's rate. Puts the [`Agent`] (and for a token its [`crate::grant::Grant`]) into the
/// request. A credential is first compared with the API keys; one that is not a key is verified
/// as an access token when OAuth is on.
async fn authenticate(
    State(state): State<Arc<HttpState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(credential) = auth::presented_key(req.headers()).map(str::to_owned) else {
        let message = match state.oauth {
            Some(_) => {
                "missing credential: send an OAuth access token as 'Authorization: Bearer \
                 <token>' (the authorization server is named in this server's protected resource \
                 metadata) or an API key as 'Authorization: Bearer <key>' or 'X-Api-Key: <key>'"
            }
            None => {
                "missing API key: send it as 'Authorization: Bearer <key>' or 'X-Api-Key: <key>'"
            }
        };
        return unauthorized(&state, message, None);
    };
    let agent = match state.keys.agent_for(&credential) {
        Some(agent) => agent.to_owned(),
        None => match (&state.oauth, auth::bearer_token(req.headers())) {
            // Tokens travel only in the Authorization header (RFC 6750 section 2.1).
            (Some(oauth), Some(token)) => match oauth.verify(token).await {
                Ok(caller) => {
                    req.extensions_mut().insert(caller.grant);
                    caller.agent
                }
                Err(TokenRefusal::Invalid(why)) => {
                    tracing::info!(reason = %why, "refused an access token");
                    return unauthorized(
                        &state,
                        &format!("invalid access token: {why}"),
                        Some(("invalid_token", &why)),
                    );
                }
                Err(TokenRefusal::InsufficientScope(why)) => {
                    state.shared.metrics.observe_rejection("forbidden");
                    let mut resp = jsonrpc_error_response(
                        StatusCode::FORBIDDEN,
                        -32001,
                        &format!("insufficient scope: {why}"),
                    );
                    resp.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        oauth.challenge(Some(("insufficient_scope", &why))),
                    );
                    return resp;
                }
                Err(TokenRefusal::Unavailable(why)) => {
                    tracing::warn!(reason = %why, "cannot verify access tokens");
                    state.shared.metrics.observe_rejection("unavailable");
                    let mut resp =
                        jsonrpc_error_response(StatusCode::SERVICE_UNAVAILABLE, -32603, &why);
                    resp.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from(5));
                    return resp;
                }
            },
            _ => {
                return unauthorized(
                    &state,
                    "invalid API key: check the key you were given; keys are case-sensitive",
                    Some(("invalid_token", "unknown API key")),
                );
            }
        },
    };
    if let Err(wait) = state.limiter.check(&agent) {
        state.shared.metrics.observe_rejection("rate_limited");
        let secs = retry_after_secs(wait);
        let mut resp = jsonrpc_error_response(
            StatusCode::TOO_MANY_REQUESTS,
            -32002,
            &format!("rate limit exceeded for agent {agent}: retry after {secs}s"),
        );
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return resp;
    }
    req.extensions_mut().insert(Agent(agent));
    next.run(req).await
}

/// A 401 whose challenge names the protected resource metadata when OAuth is on (that is how
/// an MCP client finds the authorization server), else the API key realm.
fn unauthorized(state: &HttpState, message: &str, error: Option<(&str, &str)>) -> Response {
    state.shared.metrics.observe_rejection("unauthorized");
    let mut resp = jsonrpc_error_response(StatusCode::UNAUTHORIZED, -32001, message);
    let challenge = match (&state.oauth, error) {
        (Some(oauth), error) => oauth.challenge(error),
        (None, None) => HeaderValue::from_static("Bearer realm=\"sandboxrun\""),
        (None, Some(_)) => {
            HeaderValue::from_static("Bearer realm=\"sandboxrun\", error=\"invalid_token\"")
        }
    };
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, challenge);
    resp
}

/// Answers a POST whose body is not JSON with a JSON-RPC parse error (-32700) and a 400, on
/// every MCP route alike (rmcp's own answer is a plain-text 415). The body is already capped
/// by the size limit, so buffering it here is bounded.
async fn require_json(req: Request, next: Next) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        // The size limit (or a client that hung up and reads no answer): let the 413 explain.
        Err(_) => return StatusCode::PAYLOAD_TOO_LARGE.into_response(),
    };
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
        return jsonrpc_error_response(
            StatusCode::BAD_REQUEST,
            -32700,
            &format!(
                "parse error: the request body is not valid JSON ({e}); send one JSON-RPC 2.0 \
                 message as application/json"
            ),
        );
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// Turns any 413 (from the body limit layer or rmcp's own limit) into a JSON-RPC error that
/// says what the limit is, and counts it.
async fn explain_too_large(
    State(state): State<Arc<HttpState>>,
    req: Request,
    next: Next,
) -> Response {
    let resp = next.run(req).await;
    if resp.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return resp;
    }
    state.shared.metrics.observe_rejection("too_large");
    jsonrpc_error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        -32600,
        &format!(
            "request body too large: the limit is {} bytes; send shorter code (run_python \
             accepts at most 262144 bytes of code)",
            state.body_limit
        ),
    )
}

//! The legacy HTTP+SSE transport (protocol revision 2024-11-05), for clients that predate
//! Streamable HTTP. rmcp no longer ships it, so this is a thin adapter: `GET /sse` starts the
//! same `ServerHandler` over in-memory channels and streams its messages as SSE `message`
//! events, after an `endpoint` event naming `/messages?sessionId=…`; `POST /messages` feeds
//! client messages in. A session belongs to the agent that opened it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt, stream};
use rmcp::model::ClientJsonRpcMessage;
use tokio_util::sync::CancellationToken;

use super::{HttpState, jsonrpc_error_response};
use crate::server::{Agent, Grant, SandboxRunServer};
use crate::transport::{ChannelEnds, Parsed, parse_client_message, spawn_server, to_wire};

/// An open SSE session: where its POSTed messages go.
struct Session {
    agent: String,
    inbound: mpsc::Sender<ClientJsonRpcMessage>,
}

/// Open SSE sessions by id.
#[derive(Clone, Default)]
pub struct Sessions(Arc<Mutex<HashMap<String, Session>>>);

impl Sessions {
    fn insert(&self, id: String, session: Session) {
        self.0.lock().expect("sessions lock").insert(id, session);
    }

    fn remove(&self, id: &str) {
        self.0.lock().expect("sessions lock").remove(id);
    }

    /// Where the session's client messages go, if it exists and belongs to `agent`.
    fn inbound(&self, id: &str, agent: &str) -> Option<mpsc::Sender<ClientJsonRpcMessage>> {
        let sessions = self.0.lock().expect("sessions lock");
        let s = sessions.get(id).filter(|s| s.agent == agent)?;
        Some(s.inbound.clone())
    }

    /// Number of open sessions.
    pub fn len(&self) -> usize {
        self.0.lock().expect("sessions lock").len()
    }
}

/// Ends a session when its SSE stream is dropped (the client went away): the server's
/// requests in flight are cancelled, which deletes or kills their runs.
struct SessionGuard {
    id: String,
    sessions: Sessions,
    ct: CancellationToken,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.sessions.remove(&self.id);
        self.ct.cancel();
        tracing::debug!(session = %self.id, "SSE session closed");
    }
}

/// `GET /sse`: opens a session and streams its messages.
pub async fn connect(
    State(state): State<Arc<HttpState>>,
    Extension(agent): Extension<Agent>,
    grant: Option<Extension<Grant>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let ct = state.shutdown.child_token();
    // The session keeps the grant of the token that opened it; each message is still
    // authenticated, and must come from the same agent.
    let server = SandboxRunServer::new(state.shared.clone(), Some(agent.0.clone()))
        .with_grant(grant.map(|Extension(g)| g));
    let ChannelEnds {
        inbound, outbound, ..
    } = spawn_server(server, ct.clone());
    state.sessions.insert(
        id.clone(),
        Session {
            agent: agent.0.clone(),
            inbound,
        },
    );
    tracing::info!(
        session = %id,
        agent = %agent.0,
        open = state.sessions.len(),
        "SSE session opened"
    );
    let endpoint = Event::default()
        .event("endpoint")
        .data(format!("/messages?sessionId={id}"));
    let guard = SessionGuard {
        id,
        sessions: state.sessions.clone(),
        ct,
    };
    let messages = outbound.map(move |message| {
        let _keep_session_open = &guard;
        let data = to_wire(&message)
            .map(|v| v.to_string())
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "unserializable server message");
                String::from("{}")
            });
        Ok(Event::default().event("message").data(data))
    });
    Sse::new(stream::once(async { Ok(endpoint) }).chain(messages)).keep_alive(KeepAlive::default())
}

/// `POST /messages?sessionId=…`: one client message into its session. 202 when queued; the
/// answer arrives on the SSE stream.
pub async fn message(
    State(state): State<Arc<HttpState>>,
    Extension(agent): Extension<Agent>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let Some(id) = query.get("sessionId") else {
        return jsonrpc_error_response(
            StatusCode::BAD_REQUEST,
            -32600,
            "missing sessionId query parameter: POST to the endpoint URL sent in the SSE \
             `endpoint` event",
        );
    };
    // Another agent's session is reported as unknown, so ids cannot be probed.
    let Some(mut inbound) = state.sessions.inbound(id, &agent.0) else {
        return jsonrpc_error_response(
            StatusCode::NOT_FOUND,
            -32600,
            "unknown or closed SSE session: open a new one with GET /sse",
        );
    };
    match parse_client_message(&body) {
        Parsed::Message(m) => {
            if inbound.send(*m).await.is_err() {
                return jsonrpc_error_response(
                    StatusCode::NOT_FOUND,
                    -32600,
                    "the SSE session has ended: open a new one with GET /sse",
                );
            }
            (StatusCode::ACCEPTED, "Accepted").into_response()
        }
        Parsed::Reply(reply) => {
            // Answer on the POST itself: an invalid message has no place on the stream.
            (
                StatusCode::BAD_REQUEST,
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                to_wire(&reply).map(|v| v.to_string()).unwrap_or_default(),
            )
                .into_response()
        }
        Parsed::Ignore => (StatusCode::ACCEPTED, "Accepted").into_response(),
    }
}

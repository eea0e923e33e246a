//! Message plumbing shared by the stdio and legacy SSE transports: the server runs over a pair
//! of in-memory channels, and the transport feeds them with parsed client messages. Parsing is
//! done here rather than in rmcp so that invalid JSON gets a JSON-RPC error reply (-32700) the
//! client can see, where rmcp's line transport drops it silently.

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use rmcp::ServiceExt;
use rmcp::model::{ClientJsonRpcMessage, ErrorCode, ErrorData, RequestId, ServerJsonRpcMessage};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

use crate::server::SandboxRunServer;

/// Messages queued per direction before the sender waits.
const CHANNEL_CAPACITY: usize = 64;

/// What became of one incoming text.
#[derive(Debug)]
pub enum Parsed {
    /// A well-formed client message for the server.
    Message(Box<ClientJsonRpcMessage>),
    /// Not a valid message: this error reply goes back to the client.
    Reply(Box<ServerJsonRpcMessage>),
    /// A malformed notification: JSON-RPC forbids replying to notifications, so it is dropped.
    Ignore,
}

/// Parses one JSON-RPC message from a client, producing the error reply for anything invalid.
pub fn parse_client_message(bytes: &[u8]) -> Parsed {
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => {
            return Parsed::Reply(Box::new(ServerJsonRpcMessage::error(
                ErrorData::new(
                    ErrorCode::PARSE_ERROR,
                    format!(
                        "parse error: the message is not valid JSON ({e}); send one JSON-RPC 2.0 \
                         object per message"
                    ),
                    None,
                ),
                None,
            )));
        }
    };
    let id = value
        .get("id")
        .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok());
    let has_id = value.get("id").is_some();
    match serde_json::from_value::<ClientJsonRpcMessage>(value) {
        Ok(message) => Parsed::Message(Box::new(message)),
        Err(_) if !has_id => Parsed::Ignore,
        Err(e) => Parsed::Reply(Box::new(ServerJsonRpcMessage::error(
            ErrorData::invalid_request(
                format!(
                    "invalid request: {e}; expected a JSON-RPC 2.0 request with \"jsonrpc\": \
                     \"2.0\", an id, a method and params of the right shape"
                ),
                None,
            ),
            id,
        ))),
    }
}

/// A server message as sent on the wire. rmcp omits the id of an error that answers no
/// request; JSON-RPC 2.0 requires `"id": null` there, and strict clients look for it.
pub fn to_wire(message: &ServerJsonRpcMessage) -> serde_json::Result<Value> {
    let mut value = serde_json::to_value(message)?;
    if let Value::Object(map) = &mut value
        && map.contains_key("error")
        && !map.contains_key("id")
    {
        map.insert("id".to_owned(), Value::Null);
    }
    Ok(value)
}

/// The channel ends of a server running over an in-memory transport.
pub struct ChannelEnds {
    /// Parsed client messages into the server.
    pub inbound: mpsc::Sender<ClientJsonRpcMessage>,
    /// Messages from the server (responses, notifications, requests) for the client.
    pub outbound: mpsc::Receiver<ServerJsonRpcMessage>,
    /// A second sender into `outbound`, for the transport's own error replies.
    pub replies: mpsc::Sender<ServerJsonRpcMessage>,
}

/// Starts `server` over in-memory channels; it runs until `inbound` is dropped or `ct` is
/// cancelled (which cancels the requests in flight, and so their runs).
pub fn spawn_server(server: SandboxRunServer, ct: CancellationToken) -> ChannelEnds {
    let (in_tx, in_rx) = mpsc::channel::<ClientJsonRpcMessage>(CHANNEL_CAPACITY);
    let (out_tx, out_rx) = mpsc::channel::<ServerJsonRpcMessage>(CHANNEL_CAPACITY);
    let replies = out_tx.clone();
    tokio::spawn(async move {
        match server.serve_with_ct((out_tx, in_rx), ct).await {
            Ok(running) => {
                let reason = running.waiting().await;
                tracing::debug!(?reason, "MCP session ended");
            }
            Err(e) => tracing::info!(error = %e, "MCP session ended before initialization"),
        }
    });
    ChannelEnds {
        inbound: in_tx,
        outbound: out_rx,
        replies,
    }
}

/// Serves MCP over stdin/stdout, one JSON message per line, until stdin closes.
pub async fn serve_stdio(server: SandboxRunServer) -> anyhow::Result<()> {
    let ct = CancellationToken::new();
    let ChannelEnds {
        mut inbound,
        mut outbound,
        mut replies,
    } = spawn_server(server, ct.clone());

    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(message) = outbound.next().await {
            let mut line = serde_json::to_vec(&to_wire(&message)?)?;
            line.push(b'\n');
            stdout.write_all(&line).await?;
            stdout.flush().await?;
        }
        anyhow::Ok(())
    });

    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut line = Vec::new();
    loop {
        line.clear();
        if stdin.read_until(b'\n', &mut line).await? == 0 {
            break;
        }
        let text = line.trim_ascii();
        if text.is_empty() {
            continue;
        }
        match parse_client_message(text) {
            Parsed::Message(m) => {
                if inbound.send(*m).await.is_err() {
                    break;
                }
            }
            Parsed::Reply(r) => {
                if replies.send(*r).await.is_err() {
                    break;
                }
            }
            Parsed::Ignore => tracing::debug!("ignored a malformed notification"),
        }
    }
    // stdin closed: the session ends once rmcp has answered what is in flight.
    drop(inbound);
    drop(replies);
    writer.await??;
    ct.cancel();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(bytes: &[u8]) -> Value {
        match parse_client_message(bytes) {
            Parsed::Reply(r) => to_wire(&r).unwrap(),
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    #[test]
    fn invalid_json_gets_a_parse_error_without_id() {
        let r = reply(b"{not json");
        assert_eq!(r["error"]["code"], -32700);
        assert_eq!(r.get("id"), Some(&Value::Null));
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not valid JSON")
        );
    }

    #[test]
    fn malformed_request_gets_invalid_request_with_its_id() {
        let r = reply(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":"oops"}"#);
        assert_eq!(r["error"]["code"], -32600);
        assert_eq!(r["id"], 7);
    }

    #[test]
    fn malformed_notification_is_ignored_and_valid_messages_pass() {
        assert!(matches!(
            parse_client_message(
                br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":5}"#
            ),
            Parsed::Ignore
        ));
        assert!(matches!(
            parse_client_message(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Parsed::Message(_)
        ));
    }
}

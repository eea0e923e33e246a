//! The real router, served on a TCP port, spoken to in raw HTTP/1.1: a request's head is sent
//! and its body held back, so every answer here comes before the body could be read (what a
//! client that writes head and body separately meets when the server is quick).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::super::fuzz_tests::{KEY_A, http_config, scratch_dir, shared_state};
use super::super::router;

/// Longer than any answer here takes; a bound, so a hang fails rather than blocks.
const BOUND: Duration = Duration::from_secs(20);
const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// Serves the real router (API keys; an agent may make one request a minute) until the token is
/// cancelled; its address.
async fn serve(test: &str) -> (std::net::SocketAddr, CancellationToken) {
    let shared = shared_state(&scratch_dir(test)).await;
    let shutdown = CancellationToken::new();
    let app = router(&http_config(1, 1), shared, shutdown.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let stop = shutdown.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
    });
    (addr, shutdown)
}

/// A response's head, lower-cased. Reads until the head is complete and its `content-length`
/// body is in, and no further.
async fn answer(conn: &mut TcpStream) -> String {
    let (head, mut got, head_len) = head(conn).await;
    let mut buf = [0u8; 4096];
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().expect("content-length"))
        .unwrap_or(0);
    while got.len() < head_len + length {
        let n = tokio::time::timeout(BOUND, conn.read(&mut buf))
            .await
            .expect("body in time")
            .expect("read");
        assert!(n > 0, "closed inside the body");
        got.extend_from_slice(&buf[..n]);
    }
    head
}

/// Whether the connection ends (EOF, or a reset) after an answer, without another byte. Waits
/// up to the bound: how soon the server closes depends on the machine, so only a connection
/// still open after the bound counts as open. (A connection kept open is proved open by a
/// second request answered on it, not by waiting.)
async fn closes(conn: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(BOUND, conn.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(n)) => panic!("unexpected bytes after the answer: {:?}", &buf[..n]),
        Err(_) => false,
    }
}

/// Reads until a response's head is complete: the head (lower-cased), all bytes read, the head's
/// length in them.
async fn head(conn: &mut TcpStream) -> (String, Vec<u8>, usize) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_len = loop {
        let n = tokio::time::timeout(BOUND, conn.read(&mut buf))
            .await
            .expect("answered in time")
            .expect("read");
        assert!(
            n > 0,
            "closed before an answer: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    (
        String::from_utf8_lossy(&got[..head_len]).to_lowercase(),
        got,
        head_len,
    )
}

fn says_close(head: &str) -> bool {
    head.lines()
        .filter_map(|l| l.strip_prefix("connection:"))
        .any(|v| v.split(',').any(|t| t.trim() == "close"))
}

/// Every refusal that answers before the body arrived: the head says `close`, and the connection
/// does close (so no client reuses it). Before the fix, the head said keep-alive and the
/// connection closed all the same.
#[tokio::test]
async fn a_refusal_before_the_body_says_the_connection_closes() {
    let (addr, shutdown) = serve("unread-refusals").await;
    let body_len = INIT.len();
    let cases = [
        (
            "no credential",
            401,
            format!("POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {body_len}\r\n\r\n"),
        ),
        (
            "an unknown API key",
            401,
            format!("POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer not-a-key\r\ncontent-type: application/json\r\ncontent-length: {body_len}\r\n\r\n"),
        ),
        (
            "a foreign Origin",
            403,
            format!("POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\norigin: https://evil.example\r\nauthorization: Bearer {KEY_A}\r\ncontent-type: application/json\r\ncontent-length: {body_len}\r\n\r\n"),
        ),
        (
            "a body longer than the limit",
            413,
            format!("POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY_A}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", 2 << 20),
        ),
        (
            "a method its route does not take",
            405,
            format!("POST /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {body_len}\r\n\r\n"),
        ),
        (
            "a chunked body, unauthenticated",
            401,
            "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_owned(),
        ),
    ];
    for (what, status, head) in cases {
        refused_and_closed(addr, what, status, &head).await;
    }
    // Past the rate limit (one request a minute): the first initialize takes the agent's turn,
    // the next one is refused before its body.
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(initialize().as_bytes()).await.expect("send");
    let (first, _, _) = head(&mut conn).await;
    assert!(first.starts_with("http/1.1 200 "), "{first}");
    let limited = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY_A}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {body_len}\r\n\r\n"
    );
    refused_and_closed(addr, "past the rate limit", 429, &limited).await;
    shutdown.cancel();
}

/// Sends `head` on a new connection, no body: the answer is `status`, its head says `close`,
/// and the connection closes.
async fn refused_and_closed(addr: std::net::SocketAddr, what: &str, status: u16, head: &str) {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(head.as_bytes())
        .await
        .expect("send the head");
    let answer = answer(&mut conn).await;
    assert!(
        answer.starts_with(&format!("http/1.1 {status} ")),
        "{what}: {answer}"
    );
    assert!(
        says_close(&answer),
        "{what}: the head does not say close: {answer}"
    );
    assert!(
        closes(&mut conn).await,
        "{what}: the connection stayed open"
    );
}

/// A complete initialize request from agent A.
fn initialize() -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY_A}\r\n\
         content-type: application/json\r\naccept: application/json, text/event-stream\r\n\
         content-length: {}\r\n\r\n{INIT}",
        INIT.len()
    )
}

/// A request whose body was read keeps its connection, whatever the answer: a second request
/// on it is answered. Here an unauthenticated GET (no body: nothing to read) and then a full
/// initialize.
#[tokio::test]
async fn an_answer_after_the_body_keeps_the_connection() {
    let (addr, shutdown) = serve("unread-keep").await;
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(b"GET /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: text/event-stream\r\n\r\n")
        .await
        .expect("send");
    let first = answer(&mut conn).await;
    assert!(first.starts_with("http/1.1 401 "), "{first}");
    assert!(
        !says_close(&first),
        "a refusal of a bodiless request says close: {first}"
    );
    // The connection is still open: the next request on it is answered (`head` fails on an
    // EOF before an answer). The head only: the answer is a stream.
    conn.write_all(initialize().as_bytes()).await.expect("send");
    let (second, _, _) = head(&mut conn).await;
    assert!(second.starts_with("http/1.1 200 "), "{second}");
    assert!(!says_close(&second), "{second}");
    shutdown.cancel();
}

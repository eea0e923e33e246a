//! Resumption through the whole HTTP stack (`replay`): a client that lost a call's stream before
//! the response (a proxy closing it, a lost last chunk) gets the response by reconnecting with
//! `Last-Event-ID`, as often as it needs; an id that is made up, or names another session's
//! stream, gets an empty stream, as an unknown id does.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::fuzz_tests::{Harness, KEY_A, KEY_B, clean_post, read_all, sse_data, with_harness};

const VERSION: &str = "2025-11-25";

fn resume(key: &str, session: &str, last_event_id: &str) -> Request<Body> {
    Request::get("/mcp")
        .header("host", "localhost")
        .header("authorization", format!("Bearer {key}"))
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", VERSION)
        .header("last-event-id", last_event_id)
        .body(Body::empty())
        .unwrap()
}

/// The id of the first event of an SSE body, read frame by frame; the rest of the body is
/// dropped unread, as a broken connection would drop it.
async fn first_event_id(mut body: Body) -> String {
    let mut text = String::new();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("a frame in time")
            .expect("the body has a first event")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
        if let Some((event, _)) = text.split_once("\n\n") {
            return event
                .lines()
                .find_map(|l| l.strip_prefix("id:"))
                .expect("the first event has an id")
                .trim()
                .to_owned();
        }
    }
}

/// The events a resumption gets, in a 200 event stream.
async fn resumed(h: &Harness, key: &str, session: &str, last_event_id: &str) -> Vec<Value> {
    let resp = h.send(|| resume(key, session, last_event_id)).await;
    assert_eq!(resp.status(), StatusCode::OK, "{last_event_id}");
    let kind = resp
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(kind.starts_with("text/event-stream"), "{kind}");
    sse_data(&read_all(resp.into_body()).await.unwrap())
}

#[test]
fn a_response_whose_stream_broke_comes_back_on_resumption_to_its_session_only() {
    with_harness("resume", async |h| {
        let session = h.open_session(KEY_A, VERSION).await;
        let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
            "name": "execute_sql",
            "arguments": {"database": "demo", "query": "SELECT id, amount FROM ledger WHERE id = 1"}}});
        let resp = h
            .send(|| clean_post(KEY_A, Some(&session), Some(VERSION), &call))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        // The priming event's id, then the connection is gone: the response was never read.
        let primed = first_event_id(resp.into_body()).await;

        // Twice: the first resumption may come while the call still runs; the second comes
        // after its response went out, when rmcp alone has nothing left to replay.
        for attempt in 0..2 {
            let events = resumed(h, KEY_A, &session, &primed).await;
            let answer = events
                .iter()
                .find(|e| e["id"] == 5)
                .unwrap_or_else(|| panic!("attempt {attempt}: the response in {events:?}"));
            assert_eq!(answer["result"]["isError"], false, "{answer}");
            assert!(
                answer["result"]["structuredContent"].is_object(),
                "{answer}"
            );
        }

        // Agent B, in its own session, presenting A's event id: nothing.
        let other = h.open_session(KEY_B, VERSION).await;
        assert_eq!(
            resumed(h, KEY_B, &other, &primed).await,
            Vec::<Value>::new()
        );
        // A second session of A's own agent: nothing either; a stream is its session's.
        let second = h.open_session(KEY_A, VERSION).await;
        assert_eq!(
            resumed(h, KEY_A, &second, &primed).await,
            Vec::<Value>::new()
        );
        // Made-up ids in A's session.
        let (token, _) = primed.split_once('.').unwrap();
        for made_up in [
            "0".to_owned(),
            "0/0".to_owned(),
            "x.0".to_owned(),
            format!("{token}.999"),
            format!("{token}x.0"),
        ] {
            assert_eq!(
                resumed(h, KEY_A, &session, &made_up).await,
                Vec::<Value>::new(),
                "{made_up}"
            );
        }
        // B presenting A's session: refused as an unknown session, before any resumption.
        let resp = h.send(|| resume(KEY_B, &session, &primed)).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    });
}

//! Resumable Streamable HTTP streams: every SSE event rmcp sends is kept here for a while, so a
//! client whose stream broke (a proxy closing it, a network blip, a lost last chunk) reconnects
//! with `Last-Event-ID` and gets what it missed, the call's result included, then the rest of
//! the stream as it comes.
//!
//! Why not rmcp's own per-session cache: `LocalSessionManager` drops a request's channel, cache
//! and all, the moment it sends the response, so a client that lost its stream just before the
//! response can never resume it (rmcp answers the resumption with an empty stream, and the
//! Python SDK then polls for ever). Given an event store, rmcp records every event here before
//! sending it and serves every resumption from here (`EventStore` is its extension point).
//!
//! Event ids are `<token>.<seq>`: the token is 128 random bits per stream, so an id names one
//! stream and cannot be guessed. rmcp checks the session of a resumption (and `owners` its
//! agent) but not that the event belongs to that session: [`bind_session`] watches each
//! session's event streams go out and ties their token to the session, and a resumption that
//! names a stream of another session, or one never sent, is refused like an unknown id
//! ([`ReplayLog::belongs`]). Memory is bounded: a stream keeps its latest `MAX_EVENTS_PER_STREAM` events (its
//! final message always, being the latest), an ended stream is kept `KEEP_ENDED`, one that sees
//! no event for `KEEP_IDLE` is dropped, and past `MAX_BYTES` in all the least recently used
//! streams go first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use futures::StreamExt;
use rmcp::model::ServerJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::{
    EventStore, EventStoreError, EventStream, ServerSseMessage,
};
use tokio::sync::watch;

/// How long an ended stream (its response sent) can still be resumed: far longer than any
/// client's reconnection delay.
const KEEP_ENDED: Duration = Duration::from_secs(10 * 60);
/// A stream without an event this long is dropped (a session's notification stream outlives
/// its calls; rmcp's keep-alives are comments, not events, so they do not count).
const KEEP_IDLE: Duration = Duration::from_secs(60 * 60);
/// Events kept per stream; older ones are dropped first (progress, never the final message).
const MAX_EVENTS_PER_STREAM: usize = 1024;
/// All streams' events together, as serialized.
const MAX_BYTES: usize = 64 << 20;
/// Expired streams are looked for at most this often.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The frontend's event store (see the module's comment).
#[derive(Clone)]
pub struct ReplayLog {
    state: Arc<Mutex<State>>,
    limits: Limits,
}

#[derive(Clone, Copy)]
struct Limits {
    keep_ended: Duration,
    keep_idle: Duration,
    max_events: usize,
    max_bytes: usize,
}

struct State {
    /// By token.
    streams: HashMap<String, Stream>,
    /// rmcp's stream id to our token.
    tokens: HashMap<String, String>,
    bytes: usize,
    swept: Instant,
}

struct Stream {
    rmcp_id: String,
    /// (seq, size, event with its id set).
    events: VecDeque<(u64, usize, ServerSseMessage)>,
    next_seq: u64,
    /// When its final message (a response or an error) was recorded.
    ended: Option<Instant>,
    /// The session its events went out in, once seen ([`bind_session`]).
    session: Option<String>,
    touched: Instant,
    /// Wakes followers when an event is recorded; dropped with the stream, which ends them.
    changed: watch::Sender<()>,
}

impl Default for ReplayLog {
    fn default() -> Self {
        Self::with_limits(Limits {
            keep_ended: KEEP_ENDED,
            keep_idle: KEEP_IDLE,
            max_events: MAX_EVENTS_PER_STREAM,
            max_bytes: MAX_BYTES,
        })
    }
}

impl ReplayLog {
    fn with_limits(limits: Limits) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                streams: HashMap::new(),
                tokens: HashMap::new(),
                bytes: 0,
                swept: Instant::now(),
            })),
            limits,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves the maps consistent (no step spans two of
        // them without completing), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn record(&self, rmcp_id: &str, event: &ServerSseMessage) -> String {
        let now = Instant::now();
        let size = event
            .message
            .as_deref()
            .and_then(|m| serde_json::to_vec(m).ok())
            .map_or(0, |bytes| bytes.len())
            + 64;
        let ends = event.message.as_deref().is_some_and(|m| {
            matches!(
                m,
                ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)
            )
        });
        let mut guard = self.lock();
        let state = &mut *guard;
        if now.duration_since(state.swept) >= SWEEP_EVERY {
            state.sweep(now, self.limits);
        }
        let token = state
            .tokens
            .entry(rmcp_id.to_owned())
            .or_insert_with(|| uuid::Uuid::new_v4().simple().to_string())
            .clone();
        let stream = state
            .streams
            .entry(token.clone())
            .or_insert_with(|| Stream {
                rmcp_id: rmcp_id.to_owned(),
                events: VecDeque::new(),
                next_seq: 0,
                ended: None,
                session: None,
                touched: now,
                changed: watch::Sender::new(()),
            });
        let seq = stream.next_seq;
        stream.next_seq += 1;
        let id = format!("{token}.{seq}");
        let mut kept = event.clone();
        kept.event_id = Some(id.clone());
        stream.events.push_back((seq, size, kept));
        state.bytes += size;
        while stream.events.len() > self.limits.max_events {
            if let Some((_, dropped, _)) = stream.events.pop_front() {
                state.bytes -= dropped;
            }
        }
        stream.touched = now;
        if ends {
            stream.ended = Some(now);
        }
        stream.changed.send_replace(());
        if state.bytes > self.limits.max_bytes {
            state.shed(self.limits.max_bytes, &token);
        }
        id
    }

    /// The events of `token`'s stream after `after`, the seq of the last of them, and whether
    /// the stream has ended, or `None` if the stream is gone.
    fn after(&self, token: &str, after: u64) -> Option<(VecDeque<ServerSseMessage>, u64, bool)> {
        let mut state = self.lock();
        let stream = state.streams.get_mut(token)?;
        stream.touched = Instant::now();
        let mut last = after;
        let events = stream
            .events
            .iter()
            .filter(|(seq, _, _)| *seq > after)
            .map(|(seq, _, event)| {
                last = *seq;
                event.clone()
            })
            .collect();
        Some((events, last, stream.ended.is_some()))
    }

    /// Ties `token`'s stream to `session`, unless it is tied already.
    fn bind(&self, token: &str, session: &str) {
        if let Some(stream) = self.lock().streams.get_mut(token) {
            stream.session.get_or_insert_with(|| session.to_owned());
        }
    }

    /// Whether `last_event_id` names an event of a stream that went out in `session`.
    pub fn belongs(&self, last_event_id: &str, session: &str) -> bool {
        let Some((token, _)) = last_event_id.split_once('.') else {
            return false;
        };
        self.lock()
            .streams
            .get(token)
            .is_some_and(|stream| stream.session.as_deref() == Some(session))
    }

    fn replay(&self, last_event_id: &str) -> Result<EventStream, EventStoreError> {
        let unknown = || -> EventStoreError {
            "no such event here (unknown, or its stream has expired)".into()
        };
        let (token, seq) = last_event_id.split_once('.').ok_or_else(unknown)?;
        let seq: u64 = seq.parse().map_err(|_| unknown())?;
        // Subscribed before the first read, so no event recorded after it goes unnoticed.
        let changes = {
            let state = self.lock();
            let stream = state.streams.get(token).ok_or_else(unknown)?;
            if seq >= stream.next_seq {
                return Err(unknown());
            }
            stream.changed.subscribe()
        };
        let follow = Follow {
            log: self.clone(),
            token: token.to_owned(),
            after: seq,
            pending: VecDeque::new(),
            changes,
        };
        Ok(Box::pin(futures::stream::unfold(follow, Follow::next)))
    }
}

/// A resumed stream: what was missed, then each event as it is recorded, until the stream's
/// final message (or until the stream expires, or the client goes away).
struct Follow {
    log: ReplayLog,
    token: String,
    after: u64,
    pending: VecDeque<ServerSseMessage>,
    changes: watch::Receiver<()>,
}

impl Follow {
    async fn next(mut self) -> Option<(ServerSseMessage, Self)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some((event, self));
            }
            // Marked seen before reading, so an event recorded after the read wakes us.
            self.changes.borrow_and_update();
            let (events, last, ended) = self.log.after(&self.token, self.after)?;
            if !events.is_empty() {
                self.after = last;
                self.pending = events;
                continue;
            }
            if ended || self.changes.changed().await.is_err() {
                return None;
            }
        }
    }
}

impl State {
    fn remove(&mut self, token: &str) {
        if let Some(stream) = self.streams.remove(token) {
            self.tokens.remove(&stream.rmcp_id);
            self.bytes -= stream.events.iter().map(|(_, size, _)| size).sum::<usize>();
        }
    }

    fn sweep(&mut self, now: Instant, limits: Limits) {
        self.swept = now;
        let expired: Vec<String> = self
            .streams
            .iter()
            .filter(|(_, s)| {
                s.ended
                    .is_some_and(|at| now.duration_since(at) >= limits.keep_ended)
                    || now.duration_since(s.touched) >= limits.keep_idle
            })
            .map(|(token, _)| token.clone())
            .collect();
        for token in expired {
            self.remove(&token);
        }
    }

    /// Drops whole streams, ended ones first, then the least recently used, until the events
    /// fit in `max_bytes` again; never `current`, the stream just written to.
    fn shed(&mut self, max_bytes: usize, current: &str) {
        let mut order: Vec<(bool, Instant, String)> = self
            .streams
            .iter()
            .filter(|(token, _)| token.as_str() != current)
            .map(|(token, s)| (s.ended.is_none(), s.touched, token.clone()))
            .collect();
        order.sort();
        for (_, _, token) in order {
            if self.bytes <= max_bytes {
                break;
            }
            self.remove(&token);
        }
    }
}

/// `body`, an event stream of `session`, as it goes out: the first event id in it (rmcp gives
/// every event of a stream an id, the priming event first) ties its stream to the session
/// before the client can have seen it. Bytes pass unchanged.
pub fn bind_session(log: ReplayLog, session: String, body: Body) -> Body {
    let mut scan = IdScan::default();
    Body::from_stream(body.into_data_stream().map(move |chunk| {
        if let Ok(bytes) = &chunk
            && let Some(token) = scan.feed(bytes)
        {
            log.bind(&token, &session);
        }
        chunk
    }))
}

/// Finds the token of the first `id:` line of an SSE stream, across chunk boundaries.
#[derive(Default)]
struct IdScan {
    /// The current line so far, while it may still be an `id:` line.
    line: Vec<u8>,
    /// In a line that is not an `id:` line: skip to its end.
    skipping: bool,
    done: bool,
}

impl IdScan {
    fn feed(&mut self, bytes: &Bytes) -> Option<String> {
        if self.done {
            return None;
        }
        for &byte in bytes.iter() {
            if byte == b'\n' {
                let line = std::mem::take(&mut self.line);
                let skipped = std::mem::replace(&mut self.skipping, false);
                if skipped {
                    continue;
                }
                if let Some(id) = line.strip_prefix(b"id:")
                    && let Ok(id) = std::str::from_utf8(id)
                    && let Some((token, _)) = id.trim().split_once('.')
                {
                    self.done = true;
                    return Some(token.to_owned());
                }
                continue;
            }
            if self.skipping {
                continue;
            }
            self.line.push(byte);
            // An id line is short (`id: ` and 32 + 20 characters); anything else is skipped.
            if self.line.len() > 80
                || !(b"id:".starts_with(&self.line) || self.line.starts_with(b"id:"))
            {
                self.line.clear();
                self.skipping = true;
            }
        }
        None
    }
}

#[async_trait::async_trait]
impl EventStore for ReplayLog {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<String, EventStoreError> {
        Ok(self.record(stream_id, event))
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        self.replay(last_event_id)
    }
}

#[cfg(test)]
mod tests {
    // Tests state what they expect with unwrap and expect: a failure is the message.
    #![allow(clippy::unwrap_used)]

    use super::*;
    use futures::StreamExt;
    use rmcp::model::{
        CallToolResult, ContentBlock, NumberOrString, ProgressNotificationParam, ProgressToken,
        ServerNotification, ServerResult,
    };

    fn progress(step: f64) -> ServerSseMessage {
        let param = ProgressNotificationParam::new(ProgressToken(NumberOrString::Number(1)), step);
        ServerSseMessage::from_message(ServerJsonRpcMessage::notification(
            ServerNotification::ProgressNotification(rmcp::model::Notification::new(param)),
        ))
    }

    fn response() -> ServerSseMessage {
        ServerSseMessage::from_message(ServerJsonRpcMessage::response(
            ServerResult::CallToolResult(CallToolResult::success(vec![ContentBlock::text("42")])),
            NumberOrString::Number(2),
        ))
    }

    async fn store(log: &ReplayLog, stream: &str, event: ServerSseMessage) -> String {
        log.store_event(stream, &event).await.unwrap()
    }

    /// What a resumption after `id` yields until the stream ends.
    async fn drain(log: &ReplayLog, id: &str) -> Vec<ServerSseMessage> {
        let stream = log.replay_events_after(id).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), stream.collect())
            .await
            .expect("an ended stream's replay ends")
    }

    fn is_response(event: &ServerSseMessage) -> bool {
        matches!(
            event.message.as_deref(),
            Some(ServerJsonRpcMessage::Response(_))
        )
    }

    #[tokio::test]
    async fn a_response_sent_after_the_client_lost_its_stream_is_replayed() {
        let log = ReplayLog::default();
        let priming = store(&log, "s", ServerSseMessage::retry(Duration::from_secs(3))).await;
        let first = store(&log, "s", progress(1.0)).await;
        store(&log, "s", progress(2.0)).await;
        store(&log, "s", response()).await;

        let all = drain(&log, &priming).await;
        assert_eq!(all.len(), 3);
        assert!(is_response(&all[2]));
        let rest = drain(&log, &first).await;
        assert_eq!(rest.len(), 2, "only what came after the last event seen");
        assert_eq!(rest[1].event_id, all[2].event_id, "events keep their ids");
    }

    #[tokio::test]
    async fn a_resumption_follows_the_stream_until_its_response() {
        let log = ReplayLog::default();
        let first = store(&log, "s", progress(1.0)).await;
        let mut resumed = log.replay_events_after(&first).await.unwrap();
        let writer = {
            let log = log.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                store(&log, "s", progress(2.0)).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                store(&log, "s", response()).await;
            })
        };
        let mut seen = Vec::new();
        while let Some(event) = tokio::time::timeout(Duration::from_secs(5), resumed.next())
            .await
            .unwrap()
        {
            seen.push(event);
        }
        writer.await.unwrap();
        assert_eq!(seen.len(), 2);
        assert!(is_response(&seen[1]), "ends with the response");
    }

    #[tokio::test]
    async fn streams_are_apart_and_ids_cannot_be_made_up() {
        let log = ReplayLog::default();
        let a = store(&log, "a", progress(1.0)).await;
        store(&log, "a", response()).await;
        let b = store(&log, "b", progress(1.0)).await;
        store(&log, "b", progress(2.0)).await;
        assert_eq!(drain(&log, &a).await.len(), 1, "a's own events only");
        let (token_a, _) = a.split_once('.').unwrap();
        let (token_b, _) = b.split_once('.').unwrap();
        assert_ne!(token_a, token_b);
        assert_eq!(token_a.len(), 32, "128 random bits");
        let made_up = ["0", "1", "s.0", "a.0", "", ".", "0/0", "0_0"]
            .map(str::to_owned)
            .into_iter()
            .chain(["99", "-1", "x", ""].map(|seq| format!("{token_a}.{seq}")))
            .chain([token_a.to_owned()]);
        for made_up in made_up {
            assert!(
                log.replay_events_after(&made_up).await.is_err(),
                "{made_up:?} names no event"
            );
        }
    }

    #[tokio::test]
    async fn memory_is_bounded() {
        let limits = Limits {
            keep_ended: KEEP_ENDED,
            keep_idle: KEEP_IDLE,
            max_events: 4,
            max_bytes: 4096,
        };
        let log = ReplayLog::with_limits(limits);
        let first = store(&log, "long", progress(0.0)).await;
        for step in 1..10 {
            store(&log, "long", progress(f64::from(step))).await;
        }
        store(&log, "long", response()).await;
        let kept = drain(&log, &first).await;
        assert_eq!(kept.len(), 4, "the latest events of a stream");
        assert!(is_response(&kept[3]), "the final message is kept");

        for n in 0..200 {
            store(&log, &format!("stream-{n}"), progress(1.0)).await;
        }
        let state = log.lock();
        assert!(state.bytes <= 4096, "{} bytes kept", state.bytes);
        assert_eq!(state.streams.len(), state.tokens.len());
        assert!(
            state
                .streams
                .contains_key(state.tokens.get("stream-199").unwrap().as_str())
        );
        assert!(
            !state.tokens.contains_key("long"),
            "the ended stream went first"
        );
    }

    #[tokio::test]
    async fn ended_and_idle_streams_expire() {
        let limits = Limits {
            keep_ended: Duration::ZERO,
            keep_idle: Duration::from_secs(3600),
            max_events: 16,
            max_bytes: MAX_BYTES,
        };
        let log = ReplayLog::with_limits(limits);
        let ended = store(&log, "ended", progress(1.0)).await;
        store(&log, "ended", response()).await;
        let open = store(&log, "open", progress(1.0)).await;
        log.lock().sweep(Instant::now(), limits);
        assert!(log.replay_events_after(&ended).await.is_err());
        assert!(log.replay_events_after(&open).await.is_ok());
        let limits = Limits {
            keep_idle: Duration::ZERO,
            ..limits
        };
        log.lock().sweep(Instant::now(), limits);
        assert!(log.replay_events_after(&open).await.is_err());
    }

    #[test]
    fn the_first_event_id_is_found_across_chunks_and_only_at_a_line_start() {
        let mut scan = IdScan::default();
        for chunk in [
            ": keep-alive\n\n",
            "data: {\"x\":\"id: fake.1\"}\n",
            "\n",
            "i",
            "d: abc",
        ] {
            assert_eq!(scan.feed(&Bytes::from(chunk)), None, "{chunk:?}");
        }
        assert_eq!(
            scan.feed(&Bytes::from("def.0\nretry: 3000\n\n")).as_deref(),
            Some("abcdef")
        );
        assert_eq!(
            scan.feed(&Bytes::from("id: other.1\n")),
            None,
            "the first id only"
        );

        let mut scan = IdScan::default();
        let long = format!("data: {}\nid: tok.3\r\n", "i".repeat(10_000));
        assert_eq!(scan.feed(&Bytes::from(long)).as_deref(), Some("tok"));
    }

    #[tokio::test]
    async fn a_stream_belongs_to_the_session_it_went_out_in() {
        let log = ReplayLog::default();
        let id = store(&log, "s", progress(1.0)).await;
        assert!(!log.belongs(&id, "one"), "not before it was seen going out");
        let body = Body::from(format!("id: {id}\nretry: 3000\ndata: \n\n"));
        let bytes = axum::body::to_bytes(bind_session(log.clone(), "one".into(), body), 1 << 20)
            .await
            .unwrap();
        assert!(bytes.starts_with(b"id: "), "the bytes pass unchanged");
        assert!(log.belongs(&id, "one"));
        assert!(!log.belongs(&id, "two"));
        let body = Body::from(format!("id: {id}\n\n"));
        axum::body::to_bytes(bind_session(log.clone(), "two".into(), body), 1 << 20)
            .await
            .unwrap();
        assert!(
            !log.belongs(&id, "two"),
            "a stream is tied to one session, the first"
        );
        assert!(!log.belongs("nothing.0", "one"));
    }

    #[tokio::test]
    async fn a_follower_ends_when_its_stream_expires() {
        let log = ReplayLog::default();
        let first = store(&log, "common", progress(1.0)).await;
        let resumed = log.replay_events_after(&first).await.unwrap();
        let limits = Limits {
            keep_idle: Duration::ZERO,
            ..log.limits
        };
        log.lock().sweep(Instant::now(), limits);
        let rest: Vec<_> = tokio::time::timeout(Duration::from_secs(5), resumed.collect())
            .await
            .expect("the follower ends");
        assert!(rest.is_empty());
    }
}

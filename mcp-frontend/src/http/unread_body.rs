//! A response sent before its request's body was read to the end says `Connection: close`.
//!
//! Every refusal that needs no body answers without reading it: a missing or unknown credential
//! (401), a foreign Origin (403), a rate limit (429), a body over the limit by its length (413), a
//! method a route does not take (405). hyper then drains what has already arrived and, when the rest has not (a
//! client that writes the head and the body in two writes, as httpx does), closes the connection
//! once the response is out. It decides so after the response's head was written as keep-alive,
//! so the client puts the connection back in its pool and its next request on it meets the close:
//! "Server disconnected without sending a response" (an MCP client's OAuth flow starts with a
//! 401 to a POST and goes on with a GET on the same connection). Saying `close` in the head is
//! what HTTP/1.1 has for this (RFC 9112 section 9.6): the client opens a new connection instead.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Version, header};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};

/// The middleware: outermost, so it sees every response, the other layers' refusals included.
pub async fn close_if_unread(req: Request, next: Next) -> Response {
    // HTTP/2 closes nothing for an unread body (a stream is reset, the connection stays), and
    // forbids the header; HTTP/1.0 closes after every response unless asked not to.
    if req.version() != Version::HTTP_11 || req.body().is_end_stream() {
        return next.run(req).await;
    }
    let read = Arc::new(AtomicBool::new(false));
    let req = req.map(|inner| {
        Body::new(Watched {
            inner,
            read: read.clone(),
        })
    });
    let mut resp = next.run(req).await;
    if !read.load(Ordering::Acquire) {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// A request body that records when it was read to its end.
struct Watched {
    inner: Body,
    read: Arc<AtomicBool>,
}

impl HttpBody for Watched {
    type Data = <Body as HttpBody>::Data;
    type Error = <Body as HttpBody>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[path = "unread_body_tests.rs"]
mod tests;

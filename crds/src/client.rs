//! How sandboxrun's components talk to the API server: a client-side rate limit on every
//! request, like client-go's QPS and burst. Without one, a burst of calls (or a relist that finds
//! many runs with work to do) sends its requests at once, and the API server's priority and
//! fairness throttles the whole component, or every other client of a small control plane.
//! Requests over the rate wait their turn here; a watch counts once, when it starts.

use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tower::{Layer, Service};

/// Requests a second, on average, and at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientRate {
    /// Sustained requests per second.
    pub qps: NonZeroU32,
    /// Requests allowed at once above the sustained rate.
    pub burst: NonZeroU32,
}

/// The layer to put on a kube client (`ClientBuilder::with_layer`).
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl RateLimitLayer {
    /// A limit of `rate`, shared by every clone of the layer and its services.
    pub fn new(rate: ClientRate) -> Self {
        let quota = Quota::per_second(rate.qps).allow_burst(rate.burst);
        Self {
            limiter: Arc::new(RateLimiter::direct(quota)),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            limiter: self.limiter.clone(),
            permit: Permit::None,
        }
    }
}

/// Where a service stands with the rate limit before its next request.
enum Permit {
    /// Not asked for yet.
    None,
    /// Waiting for one.
    Waiting(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// Held, for the next `call`.
    Held,
}

/// A service that is ready only once the shared rate limit lets its next request go. The
/// client's buffer drives it, so requests over the rate queue in the buffer, in order.
pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    permit: Permit,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match &mut self.permit {
                Permit::None => {
                    let limiter = self.limiter.clone();
                    self.permit =
                        Permit::Waiting(Box::pin(async move { limiter.until_ready().await }));
                }
                Permit::Waiting(wait) => match wait.as_mut().poll(cx) {
                    Poll::Ready(()) => self.permit = Permit::Held,
                    Poll::Pending => return Poll::Pending,
                },
                Permit::Held => return self.inner.poll_ready(cx),
            }
        }
    }

    fn call(&mut self, request: R) -> Self::Future {
        // poll_ready took the permit; the next request needs its own.
        self.permit = Permit::None;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;
    use tower::ServiceExt;

    #[tokio::test]
    async fn requests_past_the_burst_wait_for_the_rate() {
        let served = Arc::new(AtomicU32::new(0));
        let counter = served.clone();
        let service = tower::service_fn(move |_: ()| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(())
            }
        });
        // One a second, three at once.
        let layer = RateLimitLayer::new(ClientRate {
            qps: NonZeroU32::new(1).unwrap(),
            burst: NonZeroU32::new(3).unwrap(),
        });
        for _ in 0..3 {
            layer.layer(service.clone()).oneshot(()).await.unwrap();
        }
        assert_eq!(served.load(Ordering::SeqCst), 3, "the burst passes at once");
        // The fourth waits for the next permit (a second away): the limit is the layer's, shared
        // by every service it made.
        let fourth = tokio::spawn(layer.layer(service.clone()).oneshot(()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            served.load(Ordering::SeqCst),
            3,
            "past the burst, requests wait"
        );
        fourth.await.unwrap().unwrap();
        assert_eq!(
            served.load(Ordering::SeqCst),
            4,
            "and are served at the rate"
        );
    }
}

//! Per-agent rate limit: a token bucket per identity (GCRA, from `governor`), so one noisy
//! agent cannot starve the others or flood the cluster with SandboxRuns. The number of buckets
//! is bounded by the number of configured keys, since only authenticated agents get one.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::Quota;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;

/// Rate limit of HTTP requests, per agent. Its clock is the system's; the tests give it one they
/// move by hand, so that what they check never depends on how fast the machine runs them.
pub struct RateLimiter<C: Clock = DefaultClock> {
    limiter: governor::RateLimiter<
        String,
        DefaultKeyedStateStore<String>,
        C,
        NoOpMiddleware<C::Instant>,
    >,
    clock: C,
}

impl RateLimiter {
    /// `per_minute` requests a minute on average, up to `burst` at once.
    pub fn new(per_minute: NonZeroU32, burst: NonZeroU32) -> Self {
        Self::with_clock(per_minute, burst, DefaultClock::default())
    }
}

impl<C: Clock + Clone> RateLimiter<C> {
    fn with_clock(per_minute: NonZeroU32, burst: NonZeroU32, clock: C) -> Self {
        let quota = Quota::per_minute(per_minute).allow_burst(burst);
        Self {
            limiter: governor::RateLimiter::new(
                quota,
                DefaultKeyedStateStore::default(),
                clock.clone(),
            ),
            clock,
        }
    }

    /// Takes one token from the agent's bucket; when it is empty, how long until the next
    /// token (rounded up to whole seconds for `Retry-After`).
    pub fn check(&self, agent: &str) -> Result<(), Duration> {
        self.limiter
            .check_key(&agent.to_owned())
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

/// Seconds for a `Retry-After` header: never 0, which would invite an immediate retry.
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor::clock::FakeRelativeClock;

    fn nz(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    /// A limiter on a clock that moves only when the test says.
    fn on_a_held_clock(
        per_minute: u32,
        burst: u32,
    ) -> (RateLimiter<FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        let rl = RateLimiter::with_clock(nz(per_minute), nz(burst), clock.clone());
        (rl, clock)
    }

    #[test]
    fn burst_then_refusal_per_agent() {
        let (rl, _clock) = on_a_held_clock(60, 3);
        for _ in 0..3 {
            assert!(rl.check("a").is_ok());
        }
        let wait = rl.check("a").unwrap_err();
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
        // Another agent has its own bucket.
        assert!(rl.check("b").is_ok());
    }

    #[test]
    fn tokens_come_back_over_time() {
        // 600/min = one token every 100 ms.
        let (rl, clock) = on_a_held_clock(600, 1);
        assert!(rl.check("a").is_ok());
        assert_eq!(rl.check("a"), Err(Duration::from_millis(100)));
        clock.advance(Duration::from_millis(60));
        assert_eq!(rl.check("a"), Err(Duration::from_millis(40)));
        clock.advance(Duration::from_millis(40));
        assert!(rl.check("a").is_ok());
        assert!(rl.check("a").is_err());
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2_001)), 3);
    }
}

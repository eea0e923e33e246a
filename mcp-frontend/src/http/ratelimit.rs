//! Per-agent rate limit: a token bucket per identity (GCRA, from `governor`), so one noisy
//! agent cannot starve the others or flood the cluster with SandboxRuns. The number of buckets
//! is bounded by the number of configured keys, since only authenticated agents get one.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

/// Rate limit of HTTP requests, per agent.
pub struct RateLimiter {
    limiter: DefaultKeyedRateLimiter<String>,
    clock: DefaultClock,
}

impl RateLimiter {
    /// `per_minute` requests a minute on average, up to `burst` at once.
    pub fn new(per_minute: NonZeroU32, burst: NonZeroU32) -> Self {
        let quota = Quota::per_minute(per_minute).allow_burst(burst);
        Self {
            limiter: DefaultKeyedRateLimiter::keyed(quota),
            clock: DefaultClock::default(),
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

    fn nz(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    #[test]
    fn burst_then_refusal_per_agent() {
        let rl = RateLimiter::new(nz(60), nz(3));
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
        let rl = RateLimiter::new(nz(600), nz(1));
        assert!(rl.check("a").is_ok());
        assert!(rl.check("a").is_err());
        std::thread::sleep(Duration::from_millis(120));
        assert!(rl.check("a").is_ok());
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2_001)), 3);
    }
}

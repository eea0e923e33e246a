//! The frontend's early checks: the limits every run gets and the largest timeout a caller may
//! ask for. The operator enforces the CRD's own maxima again; this only makes mistakes fail
//! fast with a message the model can act on.

use sandboxrun_core::Limits;
use sandboxrun_core::limits::{MAX_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS};
use sandboxrun_core::tools::ParseContext;

/// Limits applied to every run of this frontend.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Largest `timeoutSeconds` a caller may request (at most the CRD's maximum, 600).
    pub max_timeout_seconds: u32,
    /// Limits of a run that asks for nothing (timeout included).
    pub defaults: Limits,
}

impl Policy {
    /// A policy with the given maximum timeout, clamped into the CRD's range; the default
    /// timeout never exceeds the maximum.
    pub fn new(max_timeout_seconds: u32, defaults: Limits) -> Self {
        let max = max_timeout_seconds.clamp(MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS);
        let mut defaults = defaults.clamped();
        defaults.timeout_seconds = defaults.timeout_seconds.min(max);
        Self {
            max_timeout_seconds: max,
            defaults,
        }
    }

    /// What the tools' argument validation needs of this policy, for a call arriving now.
    pub fn parse_context(&self) -> ParseContext {
        ParseContext {
            max_timeout_seconds: self.max_timeout_seconds,
            defaults: self.defaults.clone(),
            now: jiff::Timestamp::now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maximum_is_clamped_and_bounds_the_default() {
        let p = Policy::new(10_000, Limits::default());
        assert_eq!(p.max_timeout_seconds, 600);
        let p = Policy::new(10, Limits::default());
        assert_eq!(p.defaults.timeout_seconds, 10);
        let ctx = p.parse_context();
        assert_eq!(ctx.defaults.timeout_seconds, 10);
        assert_eq!(ctx.max_timeout_seconds, 10);
        assert_eq!(ctx.defaults.memory, "256Mi");
    }
}

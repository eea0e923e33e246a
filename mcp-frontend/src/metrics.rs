//! The frontend's own Prometheus metrics: tool calls by outcome, their latency, and HTTP
//! requests turned away before reaching MCP. Served at `/metrics` in `serve` mode.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How a tool call ended, as a metrics label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The code ran and exited 0.
    Succeeded,
    /// The code ran and failed (non-zero exit, out of memory, ...).
    Failed,
    /// The code exceeded its timeout.
    TimedOut,
    /// Policy or the operator refused the run.
    Rejected,
    /// The arguments were malformed; nothing ran.
    InvalidArguments,
    /// The caller cancelled the request.
    Cancelled,
    /// The agent had the most calls in flight it may have; nothing ran.
    Throttled,
    /// The backend could not run the code (API server or sandbox unavailable).
    Unavailable,
}

impl Outcome {
    /// The outcome of a call whose run ended in `phase`.
    pub fn of(phase: sandboxrun_core::Phase) -> Self {
        use sandboxrun_core::Phase;
        match phase {
            Phase::Succeeded => Outcome::Succeeded,
            Phase::TimedOut => Outcome::TimedOut,
            Phase::Rejected | Phase::AwaitingApproval => Outcome::Rejected,
            Phase::Pending | Phase::Running | Phase::Failed => Outcome::Failed,
            Phase::Cancelled => Outcome::Cancelled,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed_out",
            Outcome::Rejected => "rejected",
            Outcome::InvalidArguments => "invalid_arguments",
            Outcome::Cancelled => "cancelled",
            Outcome::Throttled => "throttled",
            Outcome::Unavailable => "unavailable",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectionLabels {
    reason: String,
}

fn latency_histogram() -> Histogram {
    // 10 ms .. ~160 s: a bare local sandbox takes ~20 ms, a cluster run up to the timeout.
    Histogram::new(exponential_buckets(0.01, 2.0, 15))
}

/// All metrics of one process; cheap to share behind an `Arc`.
pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    latency: Family<ToolLabels, Histogram, fn() -> Histogram>,
    http_rejections: Family<RejectionLabels, Counter>,
    in_flight: Family<ToolLabels, Gauge>,
}

/// A call counted in `calls_in_flight` until it is dropped, however the call ends.
pub struct InFlightCall {
    gauge: Gauge,
}

impl Drop for InFlightCall {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `sandboxrun_mcp` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sandboxrun_mcp");
        let calls = Family::<CallLabels, Counter>::default();
        let latency: Family<ToolLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        let http_rejections = Family::<RejectionLabels, Counter>::default();
        let in_flight = Family::<ToolLabels, Gauge>::default();
        registry.register(
            "tool_calls",
            "Tool calls by tool and outcome",
            calls.clone(),
        );
        registry.register(
            "tool_call_duration_seconds",
            "Wall-clock time of tool calls, from request to result",
            latency.clone(),
        );
        registry.register(
            "http_rejections",
            "HTTP requests refused before MCP, by reason (unauthorized, forbidden, rate_limited, too_large)",
            http_rejections.clone(),
        );
        registry.register(
            "calls_in_flight",
            "Tool calls being served now, by tool (runs, queries and approval waits)",
            in_flight.clone(),
        );
        Self {
            registry,
            calls,
            latency,
            http_rejections,
            in_flight,
        }
    }

    /// Counts one call of `tool` in flight until the returned guard is dropped.
    pub fn call_started(&self, tool: &str) -> InFlightCall {
        let gauge = self
            .in_flight
            .get_or_create(&ToolLabels {
                tool: tool.to_owned(),
            })
            .clone();
        gauge.inc();
        InFlightCall { gauge }
    }

    /// Records one finished tool call.
    pub fn observe_call(&self, tool: &str, outcome: Outcome, elapsed: Duration) {
        self.calls
            .get_or_create(&CallLabels {
                tool: tool.to_owned(),
                outcome: outcome.as_str().to_owned(),
            })
            .inc();
        self.latency
            .get_or_create(&ToolLabels {
                tool: tool.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Records an HTTP request refused by the security layers.
    pub fn observe_rejection(&self, reason: &str) {
        self.http_rejections
            .get_or_create(&RejectionLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_and_rejections_are_exposed() {
        let m = Metrics::new();
        m.observe_call("run_python", Outcome::Succeeded, Duration::from_millis(30));
        m.observe_call("run_python", Outcome::TimedOut, Duration::from_secs(2));
        m.observe_rejection("unauthorized");
        let call = m.call_started("run_python");
        assert!(
            m.encode()
                .contains(r#"sandboxrun_mcp_calls_in_flight{tool="run_python"} 1"#)
        );
        drop(call);
        let text = m.encode();
        assert!(text.contains(r#"sandboxrun_mcp_calls_in_flight{tool="run_python"} 0"#));
        assert!(
            text.contains(
                r#"sandboxrun_mcp_tool_calls_total{tool="run_python",outcome="succeeded"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(r#"outcome="timed_out"} 1"#));
        assert!(
            text.contains(
                r#"sandboxrun_mcp_tool_call_duration_seconds_count{tool="run_python"} 2"#
            )
        );
        assert!(text.contains(r#"sandboxrun_mcp_http_rejections_total{reason="unauthorized"} 1"#));
    }
}

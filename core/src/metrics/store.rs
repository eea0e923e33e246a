//! The embedded metrics store: a time-stamped record of every tool call, kept in memory and
//! queried with PromQL ([`CallStore::query`]).
//!
//! Each distinct label set (`tool`, `agent`, `verdict`, `phase`, `environment`) is one series of
//! the counter [`CALLS_METRIC`]; a call adds one sample at its time. Memory is bounded: calls
//! older than [`RETENTION`], and the oldest calls beyond [`MAX_RECORDS`], are folded into a
//! per-series base count, so the counter's value stays exact while only recent calls keep their
//! times (and count in range functions).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;

use super::eval::Evaluator;
pub use super::series::Labels;
use super::series::SeriesData;
use super::{CALLS_METRIC, MetricsError, MetricsQuery, MetricsResult};
use crate::model::{Environment, Tool, Verdict};

/// How long calls keep their times.
pub const RETENTION: Duration = Duration::from_secs(8 * 24 * 3600);
/// Most calls kept with their times (about 16 bytes each).
pub const MAX_RECORDS: usize = 1_000_000;

/// One tool call, as the store records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    /// The tool called (labelled with its MCP name, see [`Tool::mcp_name`]).
    pub tool: Tool,
    /// The calling agent.
    pub agent: String,
    /// The environment the call targeted.
    pub environment: Environment,
    /// What policy decided; `None` when the call never reached policy (malformed arguments).
    pub verdict: Option<Verdict>,
    /// How the call ended: a [`Phase`] name (`Succeeded`, `Failed`, `TimedOut`, `Rejected`,
    /// `AwaitingApproval`), or `InvalidArguments`, `Cancelled`, `Unavailable` for calls that
    /// ended without a run phase.
    pub phase: String,
}

impl CallRecord {
    /// A call that ended in `phase` after policy decided `verdict`.
    pub fn new(
        tool: Tool,
        agent: impl Into<String>,
        environment: Environment,
        verdict: Option<Verdict>,
        phase: impl Into<String>,
    ) -> Self {
        Self {
            tool,
            agent: agent.into(),
            environment,
            verdict,
            phase: phase.into(),
        }
    }

    /// The series labels of this call, `__name__` included (no `verdict` label without one,
    /// as Prometheus has no empty labels).
    pub fn labels(&self) -> Labels {
        let mut labels: Labels = [
            ("__name__", CALLS_METRIC),
            ("tool", self.tool.mcp_name()),
            ("agent", self.agent.as_str()),
            ("environment", self.environment.as_str()),
            ("phase", self.phase.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        if let Some(verdict) = self.verdict {
            labels.insert("verdict".to_owned(), verdict.as_str().to_owned());
        }
        labels.retain(|_, v| !v.is_empty());
        labels
    }
}

#[derive(Debug, Default)]
pub(super) struct Inner {
    pub(super) series: Vec<SeriesData>,
    index: HashMap<Labels, usize>,
    total: usize,
    last: i64,
}

impl Inner {
    fn record(&mut self, labels: Labels, at: i64) {
        // Times only move forward, so each series stays sorted even if the clock steps back.
        let at = at.max(self.last);
        self.last = at;
        let i = match self.index.get(&labels) {
            Some(&i) => i,
            None => {
                self.series.push(SeriesData {
                    labels: labels.clone(),
                    base: 0,
                    times: VecDeque::new(),
                });
                self.index.insert(labels, self.series.len() - 1);
                self.series.len() - 1
            }
        };
        self.series[i].times.push_back(at);
        self.total += 1;
        self.prune(at);
    }

    fn prune(&mut self, now: i64) {
        let cutoff = now.saturating_sub(RETENTION.as_millis() as i64);
        for s in &mut self.series {
            while s.times.front().is_some_and(|&t| t < cutoff) {
                s.times.pop_front();
                s.base += 1;
                self.total -= 1;
            }
        }
        while self.total > MAX_RECORDS {
            let Some(oldest) = self
                .series
                .iter_mut()
                .filter(|s| !s.times.is_empty())
                .min_by_key(|s| s.times[0])
            else {
                break;
            };
            oldest.times.pop_front();
            oldest.base += 1;
            self.total -= 1;
        }
    }
}

/// The record of tool calls; cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct CallStore {
    inner: Arc<Mutex<Inner>>,
}

impl CallStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a call made now.
    pub fn record(&self, call: &CallRecord) {
        self.record_at(call, Timestamp::now());
    }

    /// Records a call made at `at`.
    pub fn record_at(&self, call: &CallRecord, at: Timestamp) {
        self.inner
            .lock()
            .expect("not poisoned")
            .record(call.labels(), at.as_millisecond());
    }

    /// Number of calls recorded (with or without their times).
    pub fn len(&self) -> u64 {
        let inner = self.inner.lock().expect("not poisoned");
        inner.series.iter().map(|s| s.value_at(i64::MAX)).sum()
    }

    /// Whether no call was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Evaluates a PromQL query over the recorded calls, with no time limit.
    pub fn query(&self, q: &MetricsQuery) -> Result<MetricsResult, MetricsError> {
        self.query_within(q, Duration::MAX)
    }

    /// Evaluates a PromQL query over the recorded calls; past `budget` the evaluation stops
    /// with [`MetricsError::Timeout`]. It runs on the calling thread: async callers use
    /// [`CallStore::evaluate`].
    pub fn query_within(
        &self,
        q: &MetricsQuery,
        budget: Duration,
    ) -> Result<MetricsResult, MetricsError> {
        super::stack::run(|| {
            let expr = super::check_syntax(&q.query)?;
            let inner = self.inner.lock().expect("not poisoned");
            Evaluator::new(&inner.series, budget).run(&expr, q.time)
        })?
    }

    /// Evaluates a query off the async workers (on a PromQL thread, see [`super::stack`]),
    /// within `budget`: a costly query never stalls the server's other calls, and stops at its
    /// deadline.
    pub async fn evaluate(
        &self,
        q: &MetricsQuery,
        budget: Duration,
    ) -> Result<MetricsResult, MetricsError> {
        let (store, q) = (self.clone(), q.clone());
        super::stack::run_async(move || store.query_within(&q, budget)).await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Phase;

    fn call(tool: Tool) -> CallRecord {
        CallRecord::new(
            tool,
            "a",
            Environment::Sandbox,
            Some(Verdict::Allow),
            Phase::Succeeded.as_str(),
        )
    }

    #[test]
    fn series_count_exactly_and_old_calls_fold_into_the_base() {
        let store = CallStore::new();
        let t0 = Timestamp::from_second(1_000_000_000).unwrap();
        store.record_at(&call(Tool::Python), t0);
        store.record_at(&call(Tool::Python), t0);
        store.record_at(&call(Tool::Sql), t0);
        assert_eq!(store.len(), 3);
        let later = t0
            .checked_add(jiff::SignedDuration::from_secs(
                RETENTION.as_secs() as i64 + 10,
            ))
            .unwrap();
        store.record_at(&call(Tool::Python), later);
        let inner = store.inner.lock().unwrap();
        let python = &inner.series[inner.index[&call(Tool::Python).labels()]];
        assert_eq!(python.base, 2);
        assert_eq!(python.times.len(), 1);
        assert_eq!(python.value_at(later.as_millisecond()), 3);
        assert_eq!(inner.total, 1);
    }

    #[test]
    fn a_clock_stepping_back_keeps_series_sorted() {
        let store = CallStore::new();
        store.record_at(&call(Tool::Python), Timestamp::from_second(100).unwrap());
        store.record_at(&call(Tool::Python), Timestamp::from_second(50).unwrap());
        let inner = store.inner.lock().unwrap();
        assert_eq!(
            inner.series[0].times.iter().copied().collect::<Vec<_>>(),
            [100_000, 100_000]
        );
    }
}

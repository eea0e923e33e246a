//! The series of the embedded call record, as the store keeps them and the evaluator reads them.
//! Their own module so that the store (which records) and the evaluator (which reads) both
//! depend on it and not on each other.

use std::collections::{BTreeMap, VecDeque};

/// Labels of one series.
pub type Labels = BTreeMap<String, String>;

/// One series: its labels, the calls folded into its base count, the times of the others.
#[derive(Debug)]
pub(crate) struct SeriesData {
    pub(crate) labels: Labels,
    /// Calls no longer kept with their times.
    pub(crate) base: u64,
    /// Times (unix milliseconds) of the kept calls, oldest first.
    pub(crate) times: VecDeque<i64>,
}

impl SeriesData {
    /// Whether the series exists at `t` (a call at or before it).
    pub(crate) fn exists_at(&self, t: i64) -> bool {
        self.base > 0 || self.times.front().is_some_and(|&first| first <= t)
    }

    /// The counter's value at `t`: every call at or before it.
    pub(crate) fn value_at(&self, t: i64) -> u64 {
        self.base + self.times.partition_point(|&x| x <= t) as u64
    }

    /// Calls in the window `(from, to]`.
    pub(crate) fn calls_in(&self, from: i64, to: i64) -> u64 {
        (self.times.partition_point(|&x| x <= to) - self.times.partition_point(|&x| x <= from))
            as u64
    }
}

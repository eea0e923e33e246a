//! Per-run latency of `print(1)` through the local driver, for every engine that works here.
//! Ignored by default (it measures, it does not check); run it with
//! `cargo test -p sandboxrun-core --test local_bench -- --ignored --nocapture`
//! (`SANDBOXRUN_BENCH_RUNS` sets the number of runs, default 30).

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

mod local_common;

use std::time::Instant;

use local_common::{engines, serial};
use sandboxrun_core::Limits;

#[tokio::test]
#[ignore = "a measurement; run explicitly"]
async fn print_one_latency() {
    let _serial = serial().await;
    let runs: usize = std::env::var("SANDBOXRUN_BENCH_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(30)
        .max(2);
    let limits = Limits::default();
    for (isolation, sandbox) in engines() {
        for _ in 0..3 {
            sandbox.run_python("print(1)", &limits).await.unwrap();
        }
        let mut millis = Vec::with_capacity(runs);
        for _ in 0..runs {
            let start = Instant::now();
            let run = sandbox.run_python("print(1)", &limits).await.unwrap();
            millis.push(start.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(run.envelope.map(|r| r.exit_code), Some(0));
        }
        millis.sort_by(f64::total_cmp);
        let at =
            |q: f64| millis[((millis.len() as f64 * q).ceil() as usize).clamp(1, millis.len()) - 1];
        eprintln!(
            "{isolation} ({}): {runs} runs of print(1): p50 {:.0} ms, p99 {:.0} ms, min {:.0} ms, max {:.0} ms",
            sandbox.engine_path().display(),
            at(0.50),
            at(0.99),
            millis[0],
            millis[millis.len() - 1]
        );
    }
}

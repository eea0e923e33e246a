//! Benchmarks the operator end to end: creates N SandboxRuns of `print(1)` and measures, from the
//! client's side, the time from create to `Succeeded` (seen through a watch), sequentially and
//! with a given concurrency.
//!
//!   cargo run --release -p sandboxrun-e2e --bin run-bench -- [RUNS] [CONCURRENCY...]
//!
//! Defaults: 20 runs, concurrency 1 and 4. Needs the operator installed (e2e/install.sh).

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kube::Client;
use kube::api::DeleteParams;
use sandboxrun_core::Phase;
use sandboxrun_e2e::client;
use sandboxrun_e2e::runs::*;

async fn one_run(client: &Client, i: usize) -> Result<Duration> {
    let run = python_run(&format!("bench-{i}"), "print(1)", serde_json::json!({}));
    let start = Instant::now();
    let name = create(client, &run).await?;
    let done = wait_terminal(client, &name, Duration::from_secs(120)).await?;
    let elapsed = start.elapsed();
    ensure!(
        run_phase(&done) == Some(Phase::Succeeded),
        "run {name} ended {:?}",
        done.status
    );
    runs(client)
        .delete(&name, &DeleteParams::background())
        .await?;
    Ok(elapsed)
}

fn percentile(sorted: &[Duration], p: f64) -> u128 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_millis()
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(20);
    let mut levels: Vec<usize> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if levels.is_empty() {
        levels = vec![1, 4];
    }
    let client = client().await?;
    // Warm-up: the first run pays for image and runtime caches.
    one_run(&client, 0).await?;

    for concurrency in levels {
        let wall = Instant::now();
        let mut samples = Vec::with_capacity(n);
        let mut pending = FuturesUnordered::new();
        let mut next = 1;
        while samples.len() < n {
            while pending.len() < concurrency && next <= n {
                let client = client.clone();
                pending.push(async move { one_run(&client, next).await });
                next += 1;
            }
            if let Some(sample) = pending.next().await {
                samples.push(sample?);
            }
        }
        let wall = wall.elapsed();
        samples.sort();
        println!(
            "SandboxRun print(1) create -> Succeeded, {n} runs, concurrency {concurrency}: \
             p50 {} ms, p95 {} ms, p99 {} ms, max {} ms, {:.2} runs/s",
            percentile(&samples, 0.50),
            percentile(&samples, 0.95),
            percentile(&samples, 0.99),
            percentile(&samples, 1.0),
            n as f64 / wall.as_secs_f64()
        );
    }
    Ok(())
}

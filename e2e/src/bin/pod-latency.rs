//! Measures how long a bare sandbox Pod takes from create to `Succeeded` on the cluster in
//! KUBECONFIG: the floor under every run the operator makes.
//!
//!   cargo run -p sandboxrun-e2e --bin pod-latency -- [RUNS] [RUNTIME_CLASS]
//!
//! Prints each sample and the p50/p90/max in milliseconds.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kube::api::{DeleteParams, PostParams};
use sandboxrun_e2e::*;

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10);
    let runtime_class = args.next().unwrap_or_else(|| "gvisor".to_owned());
    let client = client().await?;
    let ns = TestNamespace::create(&client, "bench-pod", &[]).await?;
    let pods = ns.pods();

    // One unmeasured run so image layers and the runtime are warm, as they are in steady state.
    let mut samples = Vec::with_capacity(runs);
    for i in 0..=runs {
        let name = format!("p{i}");
        let pod = sandbox_pod(&name, &runtime_class, &["python3", "-c", "print(1)"]);
        let start = Instant::now();
        pods.create(&PostParams::default(), &pod).await?;
        let done = wait_finished(&pods, &name, Duration::from_secs(120)).await?;
        let elapsed = start.elapsed();
        ensure!(
            phase(&done) == "Succeeded",
            "run {i} ended {}",
            phase(&done)
        );
        pods.delete(&name, &DeleteParams::default()).await?;
        if i > 0 {
            println!("run {i:>3}: {:>6} ms", elapsed.as_millis());
            samples.push(elapsed);
        }
    }
    samples.sort();
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize].as_millis();
    println!(
        "{runtime_class} pod create -> Succeeded, {runs} runs: p50 {} ms, p90 {} ms, max {} ms",
        pct(0.5),
        pct(0.9),
        pct(1.0)
    );
    drop(ns);
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

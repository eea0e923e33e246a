//! The canary: a TCP listener of the operator's that answers every connection with
//! [`TOKEN`] and closes it. Sandbox Pods are given its address ([`sandboxrun_core::CANARY_ENV`])
//! and their runner connects to it before it reads its program: while it answers, the Pod's
//! deny-all NetworkPolicy is not in force yet (a policy agent enforces a Pod's policy only once
//! it has learned the Pod), and the code must not run (core/src/runner.py). Only the sandbox's
//! own egress may keep it from answering: the chart lets anyone reach this port (an ingress rule
//! naming sandbox Pods would not match a Pod the agent has not learned yet, and the probe would
//! pass without proving anything).
//!
//! It serves one connection at a time, each a write of a few bytes into a fresh socket's empty
//! buffer, bounded by [`WRITE_WITHIN`]: no connection can hold it, and nothing is read.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tracing::warn;

/// What the canary says: tells a person (or a probe) that it reached this operator's canary.
pub const TOKEN: &[u8] = b"sandboxrun-canary\n";

/// The longest a connection is served.
const WRITE_WITHIN: Duration = Duration::from_millis(200);

/// After a failed accept (descriptors exhausted, say): a pause, so the loop does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The address sandboxes reach the canary at: this Pod's IP (the downward API's
/// `status.podIP`) and the port the canary listens on. `None` without a usable Pod IP: sandboxes
/// with a network interface then run nothing (they cannot prove their isolation).
pub fn advertised(pod_ip: Option<&str>, listen: SocketAddr) -> Option<SocketAddr> {
    let ip: IpAddr = pod_ip?.trim().parse().ok()?;
    (!ip.is_unspecified()).then(|| SocketAddr::new(ip, listen.port()))
}

/// Listens on `addr` and answers every connection until `stop` completes.
pub async fn serve(addr: SocketAddr, stop: impl Future<Output = ()>) -> std::io::Result<()> {
    serve_on(TcpListener::bind(addr).await?, stop).await;
    Ok(())
}

/// Answers every connection to `listener` until `stop` completes.
pub async fn serve_on(listener: TcpListener, stop: impl Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((mut stream, _)) => {
                    let _ = tokio::time::timeout(WRITE_WITHIN, stream.write_all(TOKEN)).await;
                    // Dropped: closed.
                }
                Err(e) => {
                    warn!(error = %e, "the canary could not accept a connection");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn every_connection_gets_the_token_and_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_on(listener, async {
            let _ = stop_rx.await;
        }));
        for _ in 0..3 {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut answer = Vec::new();
            // Read to the end: the canary closes the connection after its token.
            tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(answer, TOKEN);
        }
        // A client that never reads does not hold it either.
        let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, TOKEN);
        stop_tx.send(()).unwrap();
        server.await.unwrap();
        // Stopped: the port no longer answers.
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[test]
    fn the_advertised_address_is_the_pod_ip_and_the_port() {
        let listen: SocketAddr = "0.0.0.0:8081".parse().unwrap();
        assert_eq!(
            advertised(Some("10.244.0.7"), listen).map(|a| a.to_string()),
            Some("10.244.0.7:8081".to_owned())
        );
        assert_eq!(
            advertised(Some("fd00::7"), listen).map(|a| a.to_string()),
            Some("[fd00::7]:8081".to_owned())
        );
        for missing in [None, Some(""), Some("pod-ip"), Some("0.0.0.0"), Some("::")] {
            assert_eq!(advertised(missing, listen), None, "{missing:?}");
        }
    }
}

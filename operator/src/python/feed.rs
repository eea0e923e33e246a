//! Hands a started sandbox its program. The code never travels in the Pod spec or a command
//! line (an argv string holds at most 128 KiB, and a spec is readable by anyone who may get
//! Pods): the runner waits on stdin, and the operator writes the framed program
//! ([`sandboxrun_core::program_frame`]) once, over the Pod's attach stream, when the container
//! has started.
//!
//! Once: the container has `stdinOnce`, so its stdin closes when the first attach session
//! ends, and no second program can follow. Whole or not at all: the runner runs only a program
//! of exactly the announced length; one cut short (the operator died mid-write) ends the run
//! without a result, never as a prefix of the code. The runner prints
//! [`PROGRAM_RECEIVED`] once it has the program; that is when the session is closed.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams};
use sandboxrun_core::{PROGRAM_RECEIVED, program_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::pod::CONTAINER;

/// How long the runner may take to confirm a program, beyond the time to send it.
const CONFIRM_WITHIN: Duration = Duration::from_secs(20);

/// Why a program could not be handed over.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// The attach stream could not be opened or broke.
    #[error("attaching to the sandbox: {0}")]
    Attach(#[from] kube::Error),
    /// Writing or reading the stream failed.
    #[error("streaming the program: {0}")]
    Stream(#[from] std::io::Error),
    /// The stream ended, or time ran out, before the runner confirmed the program.
    #[error("the runner did not confirm the program ({0})")]
    Unconfirmed(String),
}

/// Sends `code` to the runner of `pod` and waits until it confirms all of it.
pub async fn feed(pods: &Api<Pod>, pod: &str, code: &str) -> Result<(), FeedError> {
    let params = AttachParams::default()
        .container(CONTAINER)
        .stdin(true)
        .stdout(true)
        .stderr(false);
    let mut attached = pods.attach(pod, &params).await?;
    let result = tokio::time::timeout(CONFIRM_WITHIN, async {
        let mut stdin = attached
            .stdin()
            .ok_or_else(|| FeedError::Unconfirmed("no stdin stream".into()))?;
        let mut stdout = attached
            .stdout()
            .ok_or_else(|| FeedError::Unconfirmed("no stdout stream".into()))?;
        stdin.write_all(&program_frame(code)).await?;
        stdin.shutdown().await?;
        drop(stdin);
        confirmation(&mut stdout, code.len()).await
    })
    .await
    .unwrap_or_else(|_| {
        Err(FeedError::Unconfirmed(format!(
            "nothing within {CONFIRM_WITHIN:?}"
        )))
    });
    // Hang up either way: stdinOnce closes the container's stdin with this session.
    attached.abort();
    result
}

/// Reads the stream until the runner's confirmation of `bytes` bytes.
async fn confirmation(
    stdout: &mut (impl tokio::io::AsyncRead + Unpin),
    bytes: usize,
) -> Result<(), FeedError> {
    let expected = format!("{PROGRAM_RECEIVED} {bytes}");
    let mut seen = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let n = stdout.read(&mut chunk).await?;
        if n == 0 {
            return Err(FeedError::Unconfirmed("the stream ended".into()));
        }
        seen.extend_from_slice(&chunk[..n]);
        if String::from_utf8_lossy(&seen)
            .lines()
            .any(|l| l.trim_end() == expected)
        {
            return Ok(());
        }
        // The confirmation is the runner's first line; anything long without it is not ours.
        if seen.len() > 4096 {
            return Err(FeedError::Unconfirmed("unexpected output".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_confirmation_must_name_the_whole_program() {
        let mut ok = &b"sandboxrun-program-received 12\n"[..];
        confirmation(&mut ok, 12).await.unwrap();
        // Split across reads.
        let (mut r, mut w) = tokio::io::simplex(4);
        let writer = tokio::spawn(async move {
            w.write_all(b"sandboxrun-program-received 7\n")
                .await
                .unwrap();
        });
        confirmation(&mut r, 7).await.unwrap();
        writer.await.unwrap();
        // Another size, nothing, or noise: not confirmed.
        let mut short = &b"sandboxrun-program-received 11\n"[..];
        assert!(confirmation(&mut short, 12).await.is_err());
        let mut empty = &b""[..];
        assert!(confirmation(&mut empty, 1).await.is_err());
        let noise = vec![b'x'; 5000];
        assert!(confirmation(&mut &noise[..], 1).await.is_err());
    }
}

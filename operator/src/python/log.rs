//! Reading a finished sandbox's log from the API server.

use std::time::Duration;

use futures::AsyncReadExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use sandboxrun_core::Limits;
use sandboxrun_core::files::ENVELOPE_FILES_MAX_BYTES;

use super::pod::CONTAINER;

/// Most log bytes to read: the envelope holds both streams (each at most `outputBytes`), and
/// JSON escaping can grow a byte sixfold (control characters become `\u00XX`); plus room for
/// the envelope's own fields; plus the output lines the runner printed before it while the code
/// ran (bounded the same way, and in number); plus the returned files, base64 in the envelope.
/// The log is read from its start, so a larger one would cut the envelope; it then fails to
/// parse and the run ends NoResult.
pub fn log_limit_bytes(limits: &Limits) -> i64 {
    let lines = i64::try_from(sandboxrun_core::runner::output_lines_max_bytes(limits))
        .unwrap_or(i64::MAX / 2);
    let files = i64::try_from(ENVELOPE_FILES_MAX_BYTES).unwrap_or(i64::MAX / 4);
    12 * i64::from(limits.output_bytes) + 65_536 + lines + files
}

/// How long one read of a finished sandbox's log may take. The log comes from the node's
/// kubelet through the API server; a stalled kubelet must not hang the reconcile (and with it
/// the run, which would never end): past this the read fails and is retried, until the log
/// retry window ends the run NoResult.
pub const LOG_READ_TIMEOUT: Duration = Duration::from_secs(20);

/// The sandbox container's log, decoded leniently: a byte limit can cut a character in two, and
/// the API returns raw bytes.
pub async fn read_log(
    pods: &Api<Pod>,
    pod: &str,
    limits: &Limits,
    timeout: Duration,
) -> Result<String, kube::Error> {
    let params = LogParams {
        container: Some(CONTAINER.to_owned()),
        limit_bytes: Some(log_limit_bytes(limits)),
        ..Default::default()
    };
    read(pods, pod, &params, timeout).await
}

/// The sandbox container's log as `params` select it, decoded leniently, read within `timeout`.
pub async fn read(
    pods: &Api<Pod>,
    pod: &str,
    params: &LogParams,
    timeout: Duration,
) -> Result<String, kube::Error> {
    let read = async {
        let mut stream = pods.log_stream(pod, params).await?;
        let mut bytes = Vec::new();
        stream
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| kube::Error::Service(Box::new(e)))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(
            format!("reading the log took longer than {timeout:?}").into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_covers_the_worst_case_envelope() {
        let output_lines = 12 * 65_536 + 2000 * 64;
        // 384 KiB of files as base64, and each returned (20) or omitted (50) file's framing.
        let files = 524_288 + 70 * 256;
        assert_eq!(
            log_limit_bytes(&Limits::default()),
            12 * 65_536 + 65_536 + output_lines + files
        );
    }
}

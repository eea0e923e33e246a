//! The policy the operator enforces: loaded from `--policy-file` at start-up (a malformed file
//! stops the operator with the line and the problem), then re-read whenever its content changes.
//! A ConfigMap mounted as a directory is updated by the kubelet through a symlink swap (within
//! about a minute of the change); reading the path follows the swap. A reload that fails is
//! logged with its line and problem and the last good policy stays in force.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sandboxrun_core::{Policy, PolicyError, PolicyStore};
use tokio::sync::watch;
use tracing::{error, info, warn};

/// Loads the policy in `path`, or says why it cannot be used.
pub fn load(path: &Path) -> Result<Arc<PolicyStore>, PolicyError> {
    let store = PolicyStore::load(path)?;
    let policy = store.current();
    info!(
        path = %path.display(),
        rules = policy.rules().len(),
        "policy loaded"
    );
    Ok(Arc::new(store))
}

/// Re-reads `path` every `interval` until `stop` turns true, putting a changed, valid policy in
/// force.
pub async fn watch_file(
    store: Arc<PolicyStore>,
    path: PathBuf,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut last = tokio::fs::read(&path).await.ok();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(e) => {
                warn!(path = %path.display(), error = %e, "cannot read the policy file; the last good policy stays in force");
                continue;
            }
        };
        if last.as_deref() == Some(bytes.as_slice()) {
            continue;
        }
        last = Some(bytes.clone());
        let origin = path.display().to_string();
        let parsed = String::from_utf8(bytes)
            .map_err(|e| PolicyError::Invalid {
                origin: origin.clone(),
                message: format!("the file is not UTF-8: {e}"),
            })
            .and_then(|text| Policy::from_yaml(&text, &origin));
        match parsed {
            Ok(policy) => {
                let rules = policy.rules().len();
                store.replace(policy);
                info!(path = %origin, rules, "policy reloaded");
            }
            Err(e) => {
                error!(path = %origin, error = %e, "policy reload failed; the last good policy stays in force");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxrun_core::{CallContext, Environment, Tool, Verdict};

    const ALLOW: &str = "default: allow\n";
    const BLOCK: &str = "default: block\n";

    fn verdict(store: &PolicyStore) -> Verdict {
        store
            .evaluate(&CallContext::new("a", Tool::Python, Environment::Sandbox))
            .verdict
    }

    #[tokio::test]
    async fn reload_follows_changes_and_keeps_the_last_good_policy() {
        let dir = std::env::temp_dir().join(format!("sbr-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policy.yaml");
        std::fs::write(&path, ALLOW).unwrap();
        let store = load(&path).unwrap();
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(watch_file(
            store.clone(),
            path.clone(),
            Duration::from_millis(20),
            stop_rx,
        ));
        let settle = || tokio::time::sleep(Duration::from_millis(200));

        std::fs::write(&path, "default: allow\nrules: [{name: x, bogus: 1}]\n").unwrap();
        settle().await;
        assert_eq!(
            verdict(&store),
            Verdict::Allow,
            "a bad reload keeps the last good policy"
        );

        std::fs::write(&path, BLOCK).unwrap();
        settle().await;
        assert_eq!(
            verdict(&store),
            Verdict::Block,
            "a good reload is put in force"
        );

        stop_tx.send(true).unwrap();
        task.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_malformed_file_is_refused_with_its_line() {
        let dir = std::env::temp_dir().join(format!("sbr-policy-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policy.yaml");
        std::fs::write(&path, "default: block\nrules:\n  - name: x\n    bogus: 1\n").unwrap();
        let err = load(&path).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains("line"), "{err}");
    }
}

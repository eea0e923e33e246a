//! The labels of what the operator makes: sandbox Pods (`python/pod.rs`), the runner's
//! ConfigMap (`runner_files.rs`).

/// Label: who manages the object.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`] on what the operator makes.
pub const MANAGER: &str = "sandboxrun-operator";

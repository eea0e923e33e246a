//! Resource limits of one run: defaults and maxima, the single source of truth for the CRD
//! schema (which rejects values outside the ranges), the operator and the frontend.

use serde::{Deserialize, Serialize};

/// Default wall-clock budget of a run, in seconds.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 30;
/// Smallest accepted timeout, in seconds.
pub const MIN_TIMEOUT_SECONDS: u32 = 1;
/// Largest accepted timeout, in seconds (ten minutes).
pub const MAX_TIMEOUT_SECONDS: u32 = 600;

/// Default CPU limit (and request), as a Kubernetes quantity.
pub const DEFAULT_CPU: &str = "500m";
/// Smallest accepted CPU limit, as a Kubernetes quantity.
pub const MIN_CPU: &str = "1m";
/// Largest accepted CPU limit, as a Kubernetes quantity.
pub const MAX_CPU: &str = "4";

/// Default memory limit (and request), as a Kubernetes quantity.
pub const DEFAULT_MEMORY: &str = "256Mi";
/// Smallest accepted memory limit, as a Kubernetes quantity (the interpreter alone needs ~10Mi).
pub const MIN_MEMORY: &str = "16Mi";
/// Largest accepted memory limit, as a Kubernetes quantity.
pub const MAX_MEMORY: &str = "4Gi";

/// Default maximum number of processes the user code may own at once.
pub const DEFAULT_PIDS: u32 = 64;
/// Smallest accepted process limit.
pub const MIN_PIDS: u32 = 1;
/// Largest accepted process limit.
pub const MAX_PIDS: u32 = 1024;

/// Default cap on each of stdout and stderr, in bytes (64 KiB).
pub const DEFAULT_OUTPUT_BYTES: u32 = 65_536;
/// Smallest accepted output cap, in bytes.
pub const MIN_OUTPUT_BYTES: u32 = 1;
/// Largest accepted output cap per stream, in bytes (1 MiB). The operator additionally keeps the
/// encoded status under [`STATUS_OUTPUT_BUDGET_BYTES`], whatever this says.
pub const MAX_OUTPUT_BYTES: u32 = 1_048_576;

/// Largest accepted Python source, in bytes (256 KiB): it travels in the Pod spec.
pub const MAX_CODE_BYTES: u32 = 262_144;

/// Default time a finished run is kept before it is deleted, in seconds (one hour).
pub const DEFAULT_TTL_SECONDS_AFTER_FINISHED: u32 = 3_600;
/// Largest accepted retention of a finished run, in seconds (seven days).
pub const MAX_TTL_SECONDS_AFTER_FINISHED: u32 = 604_800;

/// Budget for stdout plus stderr in the status, measured as JSON-encoded bytes. etcd refuses
/// objects above about 1.5 MiB; with the largest code in the spec ([`MAX_CODE_BYTES`]) a stored
/// run stays near half a megabyte, so one agent's runs cannot push single objects toward the
/// limit (and a namespace of them fills etcd four times slower than at 1 MiB).
pub const STATUS_OUTPUT_BUDGET_BYTES: usize = 256 * 1024;

/// The resource limits of one run, with every default filled in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Wall-clock budget in seconds, from container start to the end of the run.
    pub timeout_seconds: u32,
    /// CPU limit as a Kubernetes quantity (for example `500m`).
    pub cpu: String,
    /// Memory limit as a Kubernetes quantity (for example `256Mi`).
    pub memory: String,
    /// Maximum number of processes the user code may own at once.
    pub pids: u32,
    /// Cap on each of stdout and stderr, in bytes.
    pub output_bytes: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
            cpu: DEFAULT_CPU.to_owned(),
            memory: DEFAULT_MEMORY.to_owned(),
            pids: DEFAULT_PIDS,
            output_bytes: DEFAULT_OUTPUT_BYTES,
        }
    }
}

impl Limits {
    /// The same limits with every number forced into its accepted range. The API server already
    /// rejects out-of-range values; this keeps the operator safe against an older CRD without
    /// that validation.
    pub fn clamped(&self) -> Self {
        Self {
            timeout_seconds: self
                .timeout_seconds
                .clamp(MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS),
            cpu: self.cpu.clone(),
            memory: self.memory.clone(),
            pids: self.pids.clamp(MIN_PIDS, MAX_PIDS),
            output_bytes: self.output_bytes.clamp(MIN_OUTPUT_BYTES, MAX_OUTPUT_BYTES),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let l = Limits::default();
        assert_eq!(l.timeout_seconds, 30);
        assert_eq!(l.cpu, "500m");
        assert_eq!(l.memory, "256Mi");
        assert_eq!(l.pids, 64);
        assert_eq!(l.output_bytes, 65_536);
    }

    #[test]
    fn clamped_forces_numbers_into_range() {
        let l = Limits {
            timeout_seconds: 0,
            pids: 100_000,
            output_bytes: u32::MAX,
            ..Limits::default()
        }
        .clamped();
        assert_eq!(l.timeout_seconds, MIN_TIMEOUT_SECONDS);
        assert_eq!(l.pids, MAX_PIDS);
        assert_eq!(l.output_bytes, MAX_OUTPUT_BYTES);
        assert_eq!(Limits::default().clamped(), Limits::default());
    }
}

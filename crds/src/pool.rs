//! `SandboxPool`: how many idle, started sandboxes of one profile the operator keeps ready, so a
//! python run whose limits match the profile claims one instead of waiting for a cold Pod. Each
//! sandbox runs one program and is deleted; the pool only ever grows new ones.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use sandboxrun_core::files::Profile;
use sandboxrun_core::limits::{self as lim, Limits};
use sandboxrun_core::quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::run::{cpu_rule, memory_rule};

/// Condition type of a pool: True when it holds as many ready sandboxes as it should.
pub const CONDITION_READY: &str = "Ready";
/// Default of [`SandboxPoolSpec::max_idle_seconds`]: an idle sandbox is replaced after an hour.
pub const DEFAULT_MAX_IDLE_SECONDS: u32 = 3_600;
/// Default of [`SandboxPoolSpec::scale_down_delay_seconds`].
pub const DEFAULT_SCALE_DOWN_DELAY_SECONDS: u32 = 300;
/// Default of [`SandboxPoolSpec::cpu_request`].
pub const DEFAULT_CPU_REQUEST: &str = "50m";
/// Largest number of idle sandboxes one pool keeps.
pub const MAX_REPLICAS: i32 = 100;

/// A pool of single-use warm sandboxes of one profile.
// Clippy reads the repeated `type_ = ...` inside separate printcolumn(...) groups as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "sandboxrun.dev",
    version = "v1alpha1",
    kind = "SandboxPool",
    plural = "sandboxpools",
    shortname = "sbp",
    // No category: `sandboxrun` is the SandboxRun's, and a category shared with another kind
    // would make `kubectl get sandboxrun NAME` ambiguous.
    namespaced,
    status = "SandboxPoolStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    doc = "Idle, started single-use sandboxes of one profile, claimed by python runs whose limits match it",
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Starting",
        type_ = "integer",
        json_path = ".status.startingReplicas"
    ),
    printcolumn(
        name = "Claimed",
        type_ = "integer",
        json_path = ".status.claimedTotal"
    ),
    printcolumn(name = "Profile", type_ = "string", json_path = ".spec.profile"),
    printcolumn(name = "CPU", type_ = "string", json_path = ".spec.cpu", priority = 1),
    printcolumn(
        name = "Memory",
        type_ = "string",
        json_path = ".spec.memory",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = kube::core::Rule::new("quantity(self.cpuRequest).compareTo(quantity(self.cpu)) <= 0").message("cpuRequest must not exceed cpu (a request above the limit is refused for every Pod)"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.minReplicas) || (has(self.maxReplicas) && self.minReplicas <= self.maxReplicas)").message("minReplicas needs maxReplicas, and must not exceed it"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxPoolSpec {
    /// How many idle, started sandboxes to keep (0: none; the pool is off). With
    /// `maxReplicas` the operator sets it from demand, within `minReplicas` and `maxReplicas`
    /// (leave it out then: it is the operator's).
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: i32,
    /// Fewest idle sandboxes the operator sizes the pool to (with `maxReplicas`; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub min_replicas: Option<i32>,
    /// Most idle sandboxes the operator sizes the pool to. Set, the operator follows demand:
    /// `replicas` becomes the most runs that wanted a sandbox of this pool within one start
    /// time of its sandboxes over the last `scaleDownDelaySeconds`, within the bounds. Unset,
    /// `replicas` is left as set (by hand, or by an HPA or KEDA on the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_replicas: Option<i32>,
    /// How long a burst of demand keeps a pool that follows demand large.
    #[serde(default = "default_scale_down_delay")]
    #[schemars(range(min = 10, max = 86_400))]
    pub scale_down_delay_seconds: u32,
    /// The sandbox profile: `minimal` (the standard library only; the default) or `data`
    /// (numpy, pandas, scipy, matplotlib). Its sandboxes run the operator's image of that
    /// profile (unless `image` is set) and serve only runs of that profile.
    #[serde(default)]
    pub profile: Profile,
    /// CPU limit (and request) of each sandbox; a run matches when its limit is the same.
    #[serde(default = "default_cpu")]
    #[x_kube(validation = cpu_rule())]
    pub cpu: String,
    /// Memory limit (and request) of each sandbox; a run matches when its limit is the same.
    #[serde(default = "default_memory")]
    #[x_kube(validation = memory_rule())]
    pub memory: String,
    /// CPU each sandbox requests from the scheduler (its limit is `cpu`). Idle sandboxes use
    /// next to none, so by default they reserve little and do not crowd cold runs off a node;
    /// set it to `cpu` for Guaranteed QoS, at the price of `replicas` × `cpu` held while idle.
    #[serde(default = "default_cpu_request")]
    #[x_kube(validation = kube::core::Rule::new("isQuantity(self) && quantity(self).compareTo(quantity('1m')) >= 0 && quantity(self).compareTo(quantity('4')) <= 0").message("cpuRequest must be a quantity between 1m and 4 (for example 50m)"))]
    pub cpu_request: String,
    /// Most processes the code may own at once; a run matches when its limit is the same.
    #[serde(default = "default_pids")]
    #[schemars(range(min = 1, max = 1024))]
    pub pids: u32,
    /// RuntimeClass of the sandboxes (default: the operator's, gVisor). Runs match only a pool
    /// of the operator's own runtime class and image: a run never gets another isolation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub runtime_class_name: Option<String>,
    /// Sandbox image (default: the operator's image of the pool's profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<String>,
    /// Size of the memory-backed /tmp (default: the operator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("isQuantity(self) && quantity(self).compareTo(quantity('1Mi')) >= 0 && quantity(self).compareTo(quantity('4Gi')) <= 0").message("tmpSize must be a quantity between 1Mi and 4Gi (for example 64Mi)"))]
    pub tmp_size: Option<String>,
    /// Seconds an idle sandbox is kept before it is replaced by a fresh one.
    #[serde(default = "default_max_idle")]
    #[schemars(range(min = 60, max = 86_400))]
    pub max_idle_seconds: u32,
}

fn default_cpu() -> String {
    lim::DEFAULT_CPU.to_owned()
}
fn default_cpu_request() -> String {
    DEFAULT_CPU_REQUEST.to_owned()
}
fn default_memory() -> String {
    lim::DEFAULT_MEMORY.to_owned()
}
fn default_pids() -> u32 {
    lim::DEFAULT_PIDS
}
fn default_max_idle() -> u32 {
    DEFAULT_MAX_IDLE_SECONDS
}
fn default_scale_down_delay() -> u32 {
    DEFAULT_SCALE_DOWN_DELAY_SECONDS
}

impl SandboxPoolSpec {
    /// The limits a sandbox of this pool is started with: the profile's cpu, memory and pids,
    /// and the largest timeout and output cap (the runner takes each run's own from its
    /// program frame, which may only lower them; the Pod's deadline is shortened when claimed).
    pub fn sandbox_limits(&self) -> Limits {
        Limits {
            cpu: self.cpu.clone(),
            memory: self.memory.clone(),
            pids: self.pids,
            timeout_seconds: lim::MAX_TIMEOUT_SECONDS,
            output_bytes: lim::MAX_OUTPUT_BYTES,
        }
        .clamped()
    }

    /// Whether a run of `profile` with `limits` (as policy lowered them) may take a sandbox of
    /// this pool: the same profile (the image), the same cpu, memory and pids (the sandbox's
    /// cgroup and process limit are fixed when it starts); its timeout and output cap always
    /// fit under the pool's ceilings.
    pub fn fits(&self, profile: Profile, limits: &Limits) -> bool {
        if self.profile != profile {
            return false;
        }
        let ours = self.sandbox_limits();
        let theirs = limits.clamped();
        // As numbers: "0.5" and "500m" are the same CPU, "1Gi" and "1024Mi" the same memory.
        let cpu = |q: &str| quantity::cpu_millis(q);
        let memory = |q: &str| quantity::memory_bytes(q);
        cpu(&ours.cpu).is_some()
            && cpu(&ours.cpu) == cpu(&theirs.cpu)
            && memory(&ours.memory).is_some()
            && memory(&ours.memory) == memory(&theirs.memory)
            && ours.pids == theirs.pids
    }
}

/// What the operator last saw of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxPoolStatus {
    /// Idle sandboxes of the current profile, ready or starting (the scale subresource's count).
    #[serde(default)]
    pub replicas: i32,
    /// Idle sandboxes whose runner waits for a program, with nothing left to do before it (a
    /// profile that preloads: its imports done).
    #[serde(default)]
    pub ready_replicas: i32,
    /// Idle sandboxes still starting.
    #[serde(default)]
    pub starting_replicas: i32,
    /// Sandboxes claimed by runs since the pool was created (as the operator counted them; a
    /// claim made just before an operator restart may be missing: the metric
    /// `sandboxrun_warm_claims_total` is the exact count).
    #[serde(default)]
    pub claimed_total: i64,
    /// The label selector of the pool's idle sandboxes (for the scale subresource, HPA, KEDA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Why a pool that follows demand has its size (with `maxReplicas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_reason: Option<String>,
    /// Why the last attempt to add a sandbox failed, until one succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refill_error: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: as many ready sandboxes as `spec.replicas`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

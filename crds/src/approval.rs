//! A person's answer to an escalated run (`spec.approval`), and the status record of when the
//! run began waiting for one (`status.approvalRequest`). In a module of its own because the spec
//! and the status both name it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Approval of a run that policy escalated: the decision and who made it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[schemars(transform = by_is_required)]
pub struct Approval {
    /// Whether a person approved the run.
    #[serde(default)]
    pub approved: bool,
    /// Who decided: their Kubernetes user name (`kubectl auth whoami`). With the chart's
    /// identity policy it must be the name of whoever writes the approval, so it is a record,
    /// not a claim.
    // Required by the schema for every new approval; `default` only reads approvals written
    // before the field existed (a run the operator cannot read would stall its whole watch).
    #[serde(default)]
    #[schemars(length(min = 1, max = 253))]
    pub by: String,
    /// Why they decided so, in their words (optional; `kubectl sandboxrun deny RUN --reason
    /// TEXT`). The operator carries it into the run's outcome: the `Approved` condition, the
    /// status message of a denied run, its Event and its audit line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,
}

/// The schema of [`Approval`] requires `by` (serde's `default` would make it optional with an
/// empty default, which its own minimum length refuses).
fn by_is_required(schema: &mut schemars::Schema) {
    if let Some(by) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("by"))
        .and_then(|b| b.as_object_mut())
    {
        by.remove("default");
    }
    if let Some(object) = schema.as_object_mut() {
        object.insert("required".to_owned(), serde_json::json!(["by"]));
    }
}

/// When a run began waiting for a person, recorded once by the operator with the
/// `AwaitingApproval` phase (a write conditional on the run as read, so nothing slips in
/// between). An approval counts only if it was written after this: at a later
/// `metadata.generation`, and different from whatever `spec.approval` the run already carried
/// then (which the schema refuses, but a run created before the schema did is judged the same
/// way). Nothing written at creation, and no other spec change that merely raises the
/// generation, can stand in for a person's answer.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    /// When the run began waiting.
    pub since: Time,
    /// The run's `metadata.generation` when it began waiting.
    pub generation: i64,
    /// The `spec.approval` the run already carried when it began waiting: never counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub void: Option<Approval>,
}

//! Kubernetes Events on SandboxRuns (`kubectl describe sandboxrun` shows them).

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use sandboxrun_api::SandboxRun;
use sandboxrun_core::{Phase, Reason, Verdict};

/// Publishes Events about runs; failures are logged, never fatal: an Event is a courtesy.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    /// Events still being sent (they go in the background).
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Events {
    /// A publisher reporting as `sandboxrun-operator`, instance `identity`.
    pub fn new(client: kube::Client, identity: String) -> Self {
        let reporter = Reporter {
            controller: "sandboxrun-operator".to_owned(),
            instance: Some(identity),
        };
        Self {
            recorder: Recorder::new(client, reporter),
            in_flight: std::sync::Arc::default(),
        }
    }

    /// Waits until every Event published so far was sent (or failed).
    #[cfg(test)]
    pub async fn settled(&self) {
        while self.in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    async fn publish(
        &self,
        run: &SandboxRun,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            // The Events API limits notes to 1 kB.
            note: Some(sandboxrun_core::cap_str(&note, 1000).text),
            action: action.to_owned(),
            secondary: None,
        };
        // In the background: an Event must not add its round trip to the call it describes.
        let (recorder, object, reason) = (
            self.recorder.clone(),
            run.object_ref(&()),
            reason.to_owned(),
        );
        let in_flight = self.in_flight.clone();
        in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &object).await {
                tracing::warn!(error = %e, reason, "could not publish event");
            }
            in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        });
    }

    /// The sandbox Pod was created.
    pub async fn pod_created(&self, run: &SandboxRun, pod: &str) {
        self.publish(
            run,
            EventType::Normal,
            Reason::PodCreated.as_str(),
            "CreatePod",
            format!("created sandbox Pod {pod}"),
        )
        .await;
    }

    /// A warm sandbox of a pool was claimed for the run.
    pub async fn claimed(&self, run: &SandboxRun, pod: &str, pool: &str) {
        self.publish(
            run,
            EventType::Normal,
            Reason::WarmSandboxClaimed.as_str(),
            "ClaimPod",
            format!("claimed warm sandbox {pod} from pool {pool}"),
        )
        .await;
    }

    /// The code started executing.
    pub async fn started(&self, run: &SandboxRun, pod: &str) {
        self.publish(
            run,
            EventType::Normal,
            "Started",
            "Run",
            format!("code started in Pod {pod}"),
        )
        .await;
    }

    /// Policy judged the run.
    pub async fn decided(&self, run: &SandboxRun, decision: &sandboxrun_api::Decision) {
        let (type_, reason) = match decision.verdict {
            Verdict::Allow => (EventType::Normal, "PolicyAllowed"),
            Verdict::Block => (EventType::Warning, Reason::PolicyBlocked.as_str()),
            Verdict::Escalate => (EventType::Warning, "PolicyEscalated"),
        };
        self.publish(
            run,
            type_,
            reason,
            "Decide",
            format!("policy rule {}: {}", decision.rule, decision.reason),
        )
        .await;
    }

    /// A person approved an escalated run; `note` says who, and why if they said
    /// (`gate::approved_message`).
    pub async fn approved(&self, run: &SandboxRun, note: String) {
        self.publish(run, EventType::Normal, "Approved", "Approve", note)
            .await;
    }

    /// The run reached a terminal phase.
    pub async fn finished(&self, run: &SandboxRun, phase: Phase, reason: &str, message: &str) {
        let type_ = if phase == Phase::Succeeded {
            EventType::Normal
        } else {
            EventType::Warning
        };
        self.publish(run, type_, reason, "Finish", format!("{phase}: {message}"))
            .await;
    }
}

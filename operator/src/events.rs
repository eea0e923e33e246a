//! Kubernetes Events on SandboxRuns (`kubectl describe sandboxrun` shows them).

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use sandboxrun_api::SandboxRun;
use sandboxrun_core::{Phase, Reason, Verdict};

/// How many Events are sent at once; the rest wait their turn, taken in the order published.
const SENT_AT_ONCE: usize = 4;

/// How long an Event waits before it is sent: a warm call is over in about a tenth of a
/// second, and its three or four Events sent at once competed on the API server with the status
/// writes and the hand-over the call waits for (measured: e2e/BENCHMARKS.md). They trail it
/// instead, in the order published (an Event is dated when it is sent).
const TRAIL: std::time::Duration = std::time::Duration::from_millis(250);

/// Publishes Events about runs; failures are logged, never fatal: an Event is a courtesy.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    /// Events still being sent (they go in the background).
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Turns to send one ([`SENT_AT_ONCE`]): in a burst of calls, two or three Events per call
    /// all sent at once compete on the API server with the status writes the calls wait for
    /// (a burst of 100 refusals: 200 Events in the same second as their 100 status writes).
    /// They trail the calls they describe instead.
    turns: std::sync::Arc<tokio::sync::Semaphore>,
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
            turns: std::sync::Arc::new(tokio::sync::Semaphore::new(SENT_AT_ONCE)),
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
        let (in_flight, turns) = (self.in_flight.clone(), self.turns.clone());
        in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::spawn(async move {
            tokio::time::sleep(TRAIL).await;
            // The semaphore is never closed.
            let _turn = turns.acquire().await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{FakeApi, NS};
    use serde_json::json;

    /// Event creates the fake API server received so far.
    fn received(api: &FakeApi) -> usize {
        api.with(|s| s.requests.iter().filter(|r| r.ends_with("/events")).count())
    }

    #[tokio::test]
    async fn a_burst_of_events_is_sent_a_few_at_a_time_the_first_published_first() {
        let run = json!({"apiVersion": "sandboxrun.dev/v1alpha1", "kind": "SandboxRun",
            "metadata": {"name": "r", "namespace": NS, "uid": "uid-1"},
            "spec": {"agent": "a", "environment": "sandbox"}});
        let api = FakeApi::start(run.clone()).await;
        let run: SandboxRun = serde_json::from_value(run).unwrap();
        let events = Events::new(api.client.clone(), "test".into());
        api.with(|s| s.hold_events = true);
        // Different reasons: the recorder patches an Event of the same reason and object it
        // sent lately (a series) instead of creating one.
        for i in 0..10 {
            let reason = format!("Reason{i}");
            let note = format!("event {i}");
            events
                .publish(&run, EventType::Normal, &reason, "Test", note)
                .await;
        }
        // Bounded, so that a limit that lets fewer out fails here instead of hanging the suite.
        tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while received(&api) < SENT_AT_ONCE {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the first Events were sent");
        // The rest wait for a turn while the first ones are held.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(received(&api), SENT_AT_ONCE);
        // The turns go in the order the Events were published (the semaphore is fair). Those
        // sent at once race each other to the server, so only which ones went is compared.
        let mut first = api.with(|s| s.event_notes.clone());
        first.sort();
        let published_first: Vec<String> =
            (0..SENT_AT_ONCE).map(|i| format!("event {i}")).collect();
        assert_eq!(first, published_first);
        api.with(|s| s.hold_events = false);
        events.settled().await;
        let mut notes = api.with(|s| s.event_notes.clone());
        notes.sort();
        let all: Vec<String> = (0..10).map(|i| format!("event {i}")).collect();
        assert_eq!(notes, all, "every Event was sent once");
    }
}

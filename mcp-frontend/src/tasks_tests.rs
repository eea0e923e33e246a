//! The task store on its own: calls are stand-in futures here (the pipeline and the MCP wire are
//! tested through real clients in tests/tasks.rs).

use super::*;

const ALICE: &str = "alice";
const MALLORY: &str = "mallory";

fn store() -> Tasks {
    Tasks::new(Duration::from_secs(60)).with_inline_window(Duration::from_millis(100))
}

/// A call that reports `status`, then waits for `release` (or for its cancellation, ending
/// Cancelled like the pipeline does) and ends with `text`.
fn call(
    release: CancellationToken,
    text: &'static str,
) -> (Running, watch::Sender<String>, CancellationToken) {
    let cancel = CancellationToken::new();
    let (tx, status) = watch::channel("Pending: preparing the sandbox".to_owned());
    let stop = cancel.clone();
    let call = tokio::spawn(async move {
        tokio::select! {
            () = release.cancelled() => (Outcome::Succeeded, CallToolResult::success(vec![ContentBlock::text(text)])),
            () = stop.cancelled() => (Outcome::Cancelled, CallToolResult::error(vec![ContentBlock::text("the call was cancelled and its run stopped")])),
        }
    });
    (
        Running {
            call,
            cancel: cancel.clone(),
            status,
        },
        tx,
        cancel,
    )
}

fn task_id(response: &CallToolResponse) -> String {
    match response {
        CallToolResponse::Task(t) => t.task.task_id.clone(),
        other => panic!("a task expected, got {other:?}"),
    }
}

async fn settled(tasks: &Tasks, agent: &str, id: &str) -> DetailedTask {
    for _ in 0..200 {
        let t = tasks.get(agent, id).expect("the task");
        if t.status().is_terminal() {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("task {id} did not settle");
}

#[tokio::test]
async fn a_call_that_ends_within_the_window_is_answered_at_once() {
    let tasks = store();
    let release = CancellationToken::new();
    release.cancel();
    let (running, _tx, _) = call(release, "42");
    match tasks.answer(ALICE, running, CancellationToken::new()).await {
        CallToolResponse::Complete(r) => assert_eq!(r.content[0].as_text().unwrap().text, "42"),
        other => panic!("a result expected, got {other:?}"),
    }
    assert_eq!(tasks.count(ALICE), 0, "no task is kept for it");
}

#[tokio::test]
async fn a_long_call_becomes_a_task_that_shows_its_status_and_completes_with_the_result() {
    let tasks = store();
    let release = CancellationToken::new();
    let (running, tx, _) = call(release.clone(), "done");
    let response = tasks.answer(ALICE, running, CancellationToken::new()).await;
    let id = task_id(&response);
    let t = tasks.get(ALICE, &id).unwrap();
    assert_eq!(t.status(), rmcp::model::TaskStatus::Working);
    assert_eq!(
        t.task.status_message.as_deref(),
        Some("Pending: preparing the sandbox")
    );
    tx.send_replace("stdout: tick 1".into());
    let mut seen = None;
    for _ in 0..100 {
        seen = tasks.get(ALICE, &id).unwrap().task.status_message;
        if seen.as_deref() == Some("stdout: tick 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen.as_deref(), Some("stdout: tick 1"));
    release.cancel();
    let t = settled(&tasks, ALICE, &id).await;
    match t.payload {
        rmcp::model::TaskPayload::Completed { result } => {
            assert_eq!(result["content"][0]["text"], "done", "{result:?}")
        }
        other => panic!("completed expected, got {other:?}"),
    }
}

#[tokio::test]
async fn another_agent_cannot_see_cancel_or_update_a_task_nor_tell_it_exists() {
    let tasks = store();
    let release = CancellationToken::new();
    let (running, _tx, cancel) = call(release.clone(), "mine");
    let id = task_id(&tasks.answer(ALICE, running, CancellationToken::new()).await);
    let unknown = tasks.get(ALICE, "no-such-task").unwrap_err();
    for err in [
        tasks.get(MALLORY, &id).unwrap_err(),
        tasks.cancel(MALLORY, &id).unwrap_err(),
        tasks.update(MALLORY, &id, Default::default()).unwrap_err(),
    ] {
        assert_eq!(err.code, unknown.code);
        assert_eq!(
            err.message.replace(&id, "ID"),
            unknown.message.replace("no-such-task", "ID"),
            "the same answer as for an id that does not exist"
        );
    }
    assert!(
        !cancel.is_cancelled(),
        "another agent's cancel stops nothing"
    );
    tasks
        .update(ALICE, &id, Default::default())
        .expect("the owner may update");
    release.cancel();
    assert_eq!(
        settled(&tasks, ALICE, &id).await.status(),
        rmcp::model::TaskStatus::Completed
    );
}

#[tokio::test]
async fn cancelling_a_task_stops_its_call_and_the_task_ends_cancelled() {
    let tasks = store();
    let (running, _tx, cancel) = call(CancellationToken::new(), "never");
    let id = task_id(&tasks.answer(ALICE, running, CancellationToken::new()).await);
    tasks.cancel(ALICE, &id).unwrap();
    assert_eq!(
        settled(&tasks, ALICE, &id).await.status(),
        rmcp::model::TaskStatus::Cancelled
    );
    assert!(cancel.is_cancelled(), "the call (and its run) was stopped");
}

#[tokio::test]
async fn a_request_given_up_before_the_window_stops_the_call() {
    let tasks = store().with_inline_window(Duration::from_secs(30));
    let (running, _tx, cancel) = call(CancellationToken::new(), "never");
    let request = CancellationToken::new();
    request.cancel();
    match tasks.answer(ALICE, running, request).await {
        CallToolResponse::Complete(r) => assert_eq!(r.is_error, Some(true)),
        other => panic!("a result expected, got {other:?}"),
    }
    assert!(cancel.is_cancelled());
}

#[tokio::test]
async fn an_agent_at_its_task_cap_gets_its_result_on_the_request() {
    let tasks = store();
    let mut releases = Vec::new();
    for _ in 0..MAX_TASKS_PER_AGENT {
        let release = CancellationToken::new();
        let (running, _tx, _) = call(release.clone(), "x");
        task_id(&tasks.answer(ALICE, running, CancellationToken::new()).await);
        releases.push(release);
    }
    let release = CancellationToken::new();
    let (running, _tx, _) = call(release.clone(), "held");
    let held = tokio::spawn({
        let release = release.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            release.cancel();
        }
    });
    match tasks.answer(ALICE, running, CancellationToken::new()).await {
        CallToolResponse::Complete(r) => assert_eq!(r.content[0].as_text().unwrap().text, "held"),
        other => panic!("a result expected, got {other:?}"),
    }
    held.await.unwrap();
    // Another agent is not affected by ALICE's cap.
    let (running, _tx, _) = call(CancellationToken::new(), "x");
    task_id(
        &tasks
            .answer(MALLORY, running, CancellationToken::new())
            .await,
    );
    for r in releases {
        r.cancel();
    }
}

#[test]
fn ttls_read_as_written() {
    assert_eq!(humantime(Duration::from_secs(3600)), "1h");
    assert_eq!(humantime(Duration::from_secs(1800)), "30m");
    assert_eq!(humantime(Duration::from_secs(90)), "90s");
}

/// A task that asks its client for input (`TaskContext::request_input`): the answer `tasks/update`
/// delivers for the owner reaches it; another agent's update is refused like an unknown task's.
#[tokio::test]
async fn an_update_delivers_the_owners_answer_to_the_input_the_task_asked_for() {
    let tasks = store();
    let created = tasks
        .spawn(ALICE, |task| {
            Box::pin(async move {
                let request = rmcp::model::InputRequest::ListRoots(Default::default());
                let answer = task.request_input("roots", request).await?;
                Ok(CallToolResult::success(vec![ContentBlock::text(
                    answer["roots"][0]["uri"]
                        .as_str()
                        .unwrap_or("none")
                        .to_owned(),
                )]))
            })
        })
        .expect("a task");
    let id = created.task.task_id.clone();
    for _ in 0..200 {
        if tasks.get(ALICE, &id).unwrap().status() == rmcp::model::TaskStatus::InputRequired {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        tasks.get(ALICE, &id).unwrap().status(),
        rmcp::model::TaskStatus::InputRequired
    );
    let answer: rmcp::model::InputResponses = [(
        "roots".to_owned(),
        serde_json::json!({"roots": [{"uri": "file:///w"}]}),
    )]
    .into();
    assert!(tasks.update(MALLORY, &id, answer.clone()).is_err());
    tasks.update(ALICE, &id, answer).expect("the owner answers");
    let t = settled(&tasks, ALICE, &id).await;
    match t.payload {
        rmcp::model::TaskPayload::Completed { result } => {
            assert_eq!(result["content"][0]["text"], "file:///w", "{result:?}");
        }
        other => panic!("completed expected, got {other:?}"),
    }
}

#[tokio::test]
async fn tasks_started_at_once_count_towards_the_agents_cap() {
    let tasks = store();
    let never =
        || -> TaskFuture { Box::pin(std::future::pending::<Result<CallToolResult, TaskExit>>()) };
    for _ in 0..MAX_TASKS_PER_AGENT {
        tasks.spawn(ALICE, |_| never()).expect("under the cap");
    }
    let refused = tasks.spawn(ALICE, |_| never()).unwrap_err();
    assert!(
        refused.message.contains("the most one agent may have"),
        "{refused:?}"
    );
    tasks
        .spawn(MALLORY, |_| never())
        .expect("another agent has its own cap");
}

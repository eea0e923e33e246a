//! `--thread`: a second invocation sees the first one's messages, from SQLite (an explicit file
//! and the default one in the user's data directory) and from PostgreSQL; a run killed in the
//! middle keeps everything it had.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Reply, ScriptedModel, agent, run, sandbox_available, stdout_of, temp_dir};
use serde_json::json;

/// The scripted model for the two-run conversation: the first question tells a code word, the
/// second asks for it, and the model can only answer from the history it is sent.
async fn remembering_model() -> ScriptedModel {
    ScriptedModel::start(|turn| {
        let messages = turn.messages();
        let (_, question) = messages.last().unwrap();
        if question.starts_with("Remember") {
            return Reply::text("Noted.");
        }
        let told = messages
            .iter()
            .find_map(|(role, text)| {
                (role == "user")
                    .then(|| text.strip_prefix("Remember the code word "))
                    .flatten()
            })
            .map(str::to_owned);
        Reply::text(match told {
            Some(word) => format!("The code word is {word}"),
            None => "I was never told a code word.".to_owned(),
        })
    })
    .await
}

/// Runs the two questions on `thread` with the given extra arguments and checks the second run
/// saw the first.
async fn two_runs_share_the_thread(extra: &[&str], home: &Path) {
    let model = remembering_model().await;
    let word = uuid::Uuid::new_v4().simple().to_string();
    let thread = format!("t-{word}");
    let mut first = agent(&model.base_url(), home);
    first
        .args(["--thread", &thread])
        .args(extra)
        .arg(format!("Remember the code word {word}"));
    assert_eq!(run(first).await.success().stdout, "Noted.\n");

    let mut second = agent(&model.base_url(), home);
    second
        .args(["--json", "--thread", &thread])
        .args(extra)
        .arg("What is the code word?");
    let t = run(second).await.success().transcript();
    assert_eq!(t["answer"], format!("The code word is {word}"));
    assert_eq!(t["thread"], thread.as_str());
    // This run's messages only: the question and the answer (the system prompt is the first
    // run's).
    assert_eq!(t["messages"].as_array().unwrap().len(), 2);
    let requests = model.requests();
    let roles: Vec<&str> = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);

    // Another thread in the same store starts empty.
    let mut other = agent(&model.base_url(), home);
    other
        .args(["--thread", &format!("{thread}-other")])
        .args(extra)
        .arg("What is the code word?");
    assert_eq!(
        run(other).await.success().stdout,
        "I was never told a code word.\n"
    );
}

#[tokio::test]
async fn thread_resumes_from_an_explicit_sqlite_file() {
    if !sandbox_available().await {
        return;
    }
    let home = temp_dir("sqlite");
    let url = format!("sqlite://{}", home.join("threads.sqlite").display());
    two_runs_share_the_thread(&["--state-url", &url], &home).await;
    assert!(home.join("threads.sqlite").is_file());
}

#[tokio::test]
async fn thread_resumes_from_the_default_store_in_the_data_directory() {
    if !sandbox_available().await {
        return;
    }
    let home = temp_dir("default-store");
    two_runs_share_the_thread(&[], &home).await;
    // XDG_DATA_HOME is home/data for the agent (see common::agent).
    assert!(
        home.join("data/sandboxrun/agent-threads.sqlite").is_file(),
        "the default store is in the user's data directory"
    );
}

#[tokio::test]
async fn thread_resumes_from_postgres() {
    let Some(url) = common::postgres_url("SANDBOXRUN_TEST_POSTGRES_STATE_URL") else {
        return;
    };
    if !sandbox_available().await {
        return;
    }
    let home = temp_dir("postgres");
    two_runs_share_the_thread(&["--state-url", &url], &home).await;
}

#[tokio::test]
async fn an_interrupted_run_keeps_what_it_had() {
    if !sandbox_available().await {
        return;
    }
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let code = format!("print('computed-{nonce}')");
    let model = ScriptedModel::start(move |turn| match turn.index {
        0 => Reply::call("run_python", json!({"code": code})),
        // The first run is killed while the model is "thinking" about the tool result.
        1 => Reply::Hang,
        _ => {
            // The resumed run: the tool result of the killed run is in the history.
            let messages = turn.raw["messages"].as_array().unwrap().clone();
            let tool = messages
                .iter()
                .find(|m| m["role"] == "tool")
                .map(|m| stdout_of(m["content"].as_str().unwrap()))
                .unwrap_or_default();
            Reply::text(format!("Earlier the sandbox printed {}", tool.trim()))
        }
    })
    .await;
    let home = temp_dir("interrupted");
    let url = format!("sqlite://{}", home.join("threads.sqlite").display());
    let mut first = agent(&model.base_url(), &home);
    first.args(["--state-url", &url, "--thread", "work", "Compute something"]);
    let mut child = first.spawn().unwrap();
    let mut waited = Duration::ZERO;
    while model.requests().len() < 2 {
        assert!(
            waited < Duration::from_secs(120),
            "the agent never reached its second model call"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    // SIGKILL: no chance to save anything on the way out.
    child.kill().await.unwrap();

    let mut second = agent(&model.base_url(), &home);
    second.args([
        "--state-url",
        &url,
        "--thread",
        "work",
        "What did it print?",
    ]);
    let out = run(second).await.success();
    assert_eq!(
        out.stdout,
        format!("Earlier the sandbox printed computed-{nonce}\n")
    );
    let requests = model.requests();
    let roles: Vec<&str> = requests[2]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
}

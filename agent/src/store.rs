//! Threads: conversations kept across runs, in SQLite (a file in the user's data directory, the
//! default) or PostgreSQL (`--state-url postgres://...`).
//!
//! Every message is written as soon as it exists (the question before the model is asked, each
//! assistant turn, each tool result), so a run that crashes or is interrupted loses nothing it
//! already had. Messages are stored in the chat-completions wire format, one row each, numbered
//! per thread; the number is the primary key, so two runs appending to one thread at once cannot
//! interleave silently: the second one gets a clear error.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use async_openai::types::chat::{
    ChatCompletionMessageToolCalls, ChatCompletionRequestMessage, ChatCompletionRequestToolMessage,
    ChatCompletionRequestToolMessageContent,
};
use etcetera::BaseStrategy;
use sandboxrun_core::query::redact_url;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use crate::error::{AgentError, causes};

/// Longest thread name.
const MAX_THREAD_NAME: usize = 200;

/// File name of the default SQLite store, under `<data dir>/sandboxrun/`.
const DEFAULT_FILE: &str = "agent-threads.sqlite";

/// How long opening the store may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// The text a tool message gets when its call never returned (the run stopped in between).
pub const INTERRUPTED_CALL: &str = "error: this tool call was interrupted before it returned a \
    result (the previous run stopped); call the tool again if you still need it";

const SQLITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS sandboxrun_agent_messages (
    thread TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (thread, seq)
)";

const POSTGRES_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS sandboxrun_agent_messages (
    thread TEXT NOT NULL,
    seq BIGINT NOT NULL,
    message JSONB NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (thread, seq)
)";

enum Db {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// One thread, open for appending.
pub struct ThreadStore {
    db: Db,
    thread: String,
    next_seq: i64,
    location: String,
}

impl ThreadStore {
    /// Opens (creating when needed) the store and the thread; returns the thread's messages so
    /// far, repaired so that every tool call has an answer.
    pub async fn open(
        state_url: Option<&str>,
        thread: &str,
    ) -> Result<(Self, Vec<ChatCompletionRequestMessage>), AgentError> {
        let thread = thread.trim();
        if thread.is_empty() || thread.chars().count() > MAX_THREAD_NAME {
            return Err(AgentError::Config(format!(
                "--thread needs a name of 1 to {MAX_THREAD_NAME} characters"
            )));
        }
        let (db, location) = match state_url {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                (open_postgres(url).await?, redact_url(url))
            }
            Some(url) if url.starts_with("sqlite:") => {
                let path = url
                    .trim_start_matches("sqlite://")
                    .trim_start_matches("sqlite:");
                let path = PathBuf::from(path);
                (open_sqlite(&path).await?, path.display().to_string())
            }
            Some(other) => {
                return Err(AgentError::Config(format!(
                    "--state-url must be postgres://USER:PASSWORD@HOST/DB or sqlite://PATH, not `{}`",
                    redact_url(other)
                )));
            }
            None => {
                let path = default_sqlite_path()?;
                (open_sqlite(&path).await?, path.display().to_string())
            }
        };
        let mut store = Self {
            db,
            thread: thread.to_owned(),
            next_seq: 0,
            location,
        };
        let rows = store.load().await?;
        let mut messages = Vec::with_capacity(rows.len());
        for (seq, text) in rows {
            let message = serde_json::from_str(&text).map_err(|e| {
                AgentError::Store(format!(
                    "message {seq} of thread `{}` in {} is not a chat message ({e}); the store \
                     was changed by something else, start a new thread",
                    store.thread, store.location
                ))
            })?;
            messages.push(message);
            store.next_seq = seq + 1;
        }
        // A run that stopped between a tool call and its result leaves the call unanswered,
        // which the chat-completions API refuses; answer it now, in the store too.
        for repair in unanswered_calls(&messages) {
            store.append(&repair).await?;
            messages.push(repair);
        }
        Ok((store, messages))
    }

    /// Appends one message to the thread, durably, before returning.
    pub async fn append(
        &mut self,
        message: &ChatCompletionRequestMessage,
    ) -> Result<(), AgentError> {
        let text = serde_json::to_string(message).expect("chat messages serialize");
        let seq = self.next_seq;
        let result = match &self.db {
            Db::Sqlite(pool) => sqlx::query(
                "INSERT INTO sandboxrun_agent_messages (thread, seq, message, created_at) \
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .bind(&self.thread)
            .bind(seq)
            .bind(&text)
            .bind(jiff::Timestamp::now().to_string())
            .execute(pool)
            .await
            .map(drop),
            Db::Postgres(pool) => sqlx::query(
                "INSERT INTO sandboxrun_agent_messages (thread, seq, message) \
                 VALUES ($1, $2, $3::jsonb)",
            )
            .bind(&self.thread)
            .bind(seq)
            .bind(&text)
            .execute(pool)
            .await
            .map(drop),
        };
        match result {
            Ok(()) => {
                self.next_seq += 1;
                Ok(())
            }
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(AgentError::Store(format!(
                    "another run added to thread `{}` meanwhile; run again to continue from its \
                     messages",
                    self.thread
                )))
            }
            Err(e) => Err(AgentError::Store(format!(
                "cannot store a message of thread `{}` in {}: {}",
                self.thread,
                self.location,
                causes(&e)
            ))),
        }
    }

    async fn load(&self) -> Result<Vec<(i64, String)>, AgentError> {
        let rows: Result<Vec<(i64, String)>, sqlx::Error> =
            match &self.db {
                Db::Sqlite(pool) => {
                    sqlx::query_as(
                        "SELECT seq, message FROM sandboxrun_agent_messages WHERE thread = ?1 \
                     ORDER BY seq",
                    )
                    .bind(&self.thread)
                    .fetch_all(pool)
                    .await
                }
                Db::Postgres(pool) => sqlx::query_as(
                    "SELECT seq, message::text FROM sandboxrun_agent_messages WHERE thread = $1 \
                     ORDER BY seq",
                )
                .bind(&self.thread)
                .fetch_all(pool)
                .await,
            };
        rows.map_err(|e| {
            AgentError::Store(format!(
                "cannot read thread `{}` from {}: {}",
                self.thread,
                self.location,
                causes(&e)
            ))
        })
    }
}

/// `<data dir>/sandboxrun/agent-threads.sqlite` ($XDG_DATA_HOME, else ~/.local/share on Linux).
pub fn default_sqlite_path() -> Result<PathBuf, AgentError> {
    let base = etcetera::choose_base_strategy().map_err(|e| {
        AgentError::Config(format!(
            "cannot find the user's data directory for the thread store ({e}); pass \
             --state-url sqlite://PATH"
        ))
    })?;
    Ok(base.data_dir().join("sandboxrun").join(DEFAULT_FILE))
}

async fn open_sqlite(path: &std::path::Path) -> Result<Db, AgentError> {
    let fail = |what: &str, e: &(dyn std::error::Error + 'static)| {
        AgentError::Store(format!(
            "cannot open the thread store {}: {what}{}",
            path.display(),
            if what.is_empty() {
                causes(e)
            } else {
                format!(": {}", causes(e))
            }
        ))
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| fail("cannot create its directory", &e))?;
    }
    let options = SqliteConnectOptions::from_str("sqlite://")
        .map_err(|e| fail("", &e))?
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|e| fail("", &e))?;
    sqlx::query(SQLITE_SCHEMA)
        .execute(&pool)
        .await
        .map_err(|e| fail("cannot create its table", &e))?;
    Ok(Db::Sqlite(pool))
}

async fn open_postgres(url: &str) -> Result<Db, AgentError> {
    let fail = |e: &(dyn std::error::Error + 'static)| {
        AgentError::Store(format!(
            "cannot open the thread store {}: {}",
            redact_url(url),
            // sqlx errors can quote the URL: never print the password.
            redact_url(&causes(e))
        ))
    };
    let options = PgConnectOptions::from_str(url).map_err(|e| fail(&e))?;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|e| fail(&e))?;
    sqlx::query(POSTGRES_SCHEMA)
        .execute(&pool)
        .await
        .map_err(|e| fail(&e))?;
    Ok(Db::Postgres(pool))
}

/// Tool messages for the calls of the last assistant turn that have none yet.
pub fn unanswered_calls(
    messages: &[ChatCompletionRequestMessage],
) -> Vec<ChatCompletionRequestMessage> {
    let Some(last_assistant) = messages
        .iter()
        .rposition(|m| matches!(m, ChatCompletionRequestMessage::Assistant(_)))
    else {
        return Vec::new();
    };
    let ChatCompletionRequestMessage::Assistant(assistant) = &messages[last_assistant] else {
        unreachable!("found as an assistant message")
    };
    let answered: Vec<&str> = messages[last_assistant + 1..]
        .iter()
        .filter_map(|m| match m {
            ChatCompletionRequestMessage::Tool(t) => Some(t.tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    assistant
        .tool_calls
        .iter()
        .flatten()
        .map(|call| match call {
            ChatCompletionMessageToolCalls::Function(f) => f.id.as_str(),
            ChatCompletionMessageToolCalls::Custom(c) => c.id.as_str(),
        })
        .filter(|id| !answered.contains(id))
        .map(|id| {
            ChatCompletionRequestMessage::Tool(ChatCompletionRequestToolMessage {
                content: ChatCompletionRequestToolMessageContent::Text(INTERRUPTED_CALL.to_owned()),
                tool_call_id: id.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(v: serde_json::Value) -> ChatCompletionRequestMessage {
        serde_json::from_value(v).unwrap()
    }

    fn call(id: &str) -> serde_json::Value {
        json!({"id": id, "type": "function", "function": {"name": "run_python", "arguments": "{}"}})
    }

    #[test]
    fn unanswered_calls_get_an_interrupted_result() {
        let messages = vec![
            msg(json!({"role": "user", "content": "q"})),
            msg(json!({"role": "assistant", "tool_calls": [call("a"), call("b")]})),
            msg(json!({"role": "tool", "tool_call_id": "a", "content": "ok"})),
        ];
        let repairs = unanswered_calls(&messages);
        assert_eq!(
            serde_json::to_value(&repairs).unwrap(),
            json!([{"role": "tool", "tool_call_id": "b", "content": INTERRUPTED_CALL}])
        );
        assert!(unanswered_calls(&messages[..1]).is_empty());
        let answered = [
            messages.clone(),
            vec![msg(
                json!({"role": "tool", "tool_call_id": "b", "content": "ok"}),
            )],
        ]
        .concat();
        assert!(unanswered_calls(&answered).is_empty());
    }

    #[tokio::test]
    async fn sqlite_threads_persist_and_are_repaired() {
        let dir =
            std::env::temp_dir().join(format!("sandboxrun-agent-store-{}", std::process::id()));
        let url = format!("sqlite://{}", dir.join("t.sqlite").display());
        {
            let (mut store, before) = ThreadStore::open(Some(&url), "t1").await.unwrap();
            assert!(before.is_empty());
            store
                .append(&msg(json!({"role": "user", "content": "q"})))
                .await
                .unwrap();
            store
                .append(&msg(
                    json!({"role": "assistant", "tool_calls": [call("x")]}),
                ))
                .await
                .unwrap();
        }
        let (_, after) = ThreadStore::open(Some(&url), "t1").await.unwrap();
        assert_eq!(after.len(), 3, "{after:?}");
        let (_, again) = ThreadStore::open(Some(&url), "t1").await.unwrap();
        assert_eq!(again.len(), 3, "the repair is stored once");
        let (_, other) = ThreadStore::open(Some(&url), "t2").await.unwrap();
        assert!(other.is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn bad_state_urls_are_explained() {
        let Err(AgentError::Config(m)) =
            ThreadStore::open(Some("mysql://u:secret@h/db"), "t").await
        else {
            panic!("config error expected")
        };
        assert!(m.contains("postgres://") && !m.contains("secret"), "{m}");
        assert!(ThreadStore::open(None, " ").await.is_err());
    }
}

//! A question that needs `execute_sql`: the embedded frontend with SQL enabled, a databases
//! file naming the test PostgreSQL (e2e/postgres/start.sh, read-only role) and a policy allowing
//! the query; the answer carries rows read from PostgreSQL.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Reply, ScriptedModel, agent, postgres_url, run, sandbox_available, temp_dir};
use serde_json::{Value, json};

#[tokio::test]
async fn execute_sql_answer_carries_rows_from_postgres() {
    let Some(url) = postgres_url("SANDBOXRUN_TEST_POSTGRES_URL") else {
        return;
    };
    if !sandbox_available().await {
        return;
    }
    // `big` exists only in the PostgreSQL test database (not in the embedded SQLite demo), and
    // the row is picked at random: the answer cannot come from anywhere else.
    let id = 1 + (uuid::Uuid::new_v4().as_u128() % 999_999) as i64;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (payload,): (String,) = sqlx::query_as("SELECT payload FROM big WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;

    let home = temp_dir("sql");
    let databases = home.join("databases.yaml");
    std::fs::write(
        &databases,
        // A test database: the sandbox's (a database without an environment is production's).
        "warehouse:\n  dialect: postgres\n  environment: sandbox\n  urlEnv: SANDBOXRUN_TEST_POSTGRES_URL\n",
    )
    .unwrap();
    let policy = home.join("policy.yaml");
    std::fs::write(
        &policy,
        "default: block\n\
         rules:\n\
         \x20 - name: local-agent-reads-big\n\
         \x20   agents: [local]\n\
         \x20   tools: [sql]\n\
         \x20   environments: [sandbox]\n\
         \x20   verdict: allow\n\
         \x20   sql:\n\
         \x20     databases: [warehouse]\n\
         \x20     tables:\n\
         \x20       big: {columns: [id, payload]}\n\
         \x20     maxLimit: 10\n",
    )
    .unwrap();

    let query = format!("SELECT id, payload FROM big WHERE id = {id}");
    let model = ScriptedModel::start(move |turn| match turn.index {
        0 => Reply::call(
            "execute_sql",
            json!({"database": "warehouse", "query": query}),
        ),
        _ => {
            let result = turn.tool_result();
            let value: Value = serde_json::from_str(&result[result.find('{').unwrap()..])
                .unwrap_or_else(|e| panic!("{e}: {result}"));
            Reply::text(format!("Rows: {}", value["rows"]))
        }
    })
    .await;
    let mut command = agent(&model.base_url(), &home);
    command
        .arg("--server-arg=--enable-sql")
        .arg(format!(
            "--server-arg=--databases-file={}",
            databases.display()
        ))
        .arg(format!("--server-arg=--policy-file={}", policy.display()))
        .args(["--json", "What is the payload of the row?"]);
    let t = run(command).await.success().transcript();
    assert_eq!(
        t["answer"],
        format!("Rows: [[{id},\"{payload}\"]]"),
        "{t:#}"
    );
    assert_eq!(t["toolCalls"][0]["name"], "execute_sql");
    assert_eq!(t["toolCalls"][0]["isError"], false);
    let requests = model.requests();
    let offered: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(offered.contains(&"execute_sql"), "{offered:?}");
}

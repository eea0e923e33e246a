//! SQLite: a fresh read-only connection per query (`mode=ro`, `PRAGMA query_only = ON`), a
//! progress handler that interrupts the statement at the deadline, rows streamed under the caps.

use std::str::FromStr;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use sqlx::sqlite::{SqliteConnectOptions, SqliteRow};
use sqlx::{
    AssertSqlSafe, Column, ConnectOptions, Connection, Executor, Row, SqlSafeStr, Statement,
    TypeInfo, ValueRef,
};

use super::value::{bytes_to_json, float_to_json};
use super::{Collector, QueryError, QueryLimits, QueryResult, ResourceLimits};

/// SQLite virtual-machine instructions between two deadline checks.
const PROGRESS_OPS: i32 = 1000;

pub(crate) struct SqliteDatabase {
    name: String,
    options: SqliteConnectOptions,
}

impl SqliteDatabase {
    pub(crate) fn new(
        name: &str,
        url: &str,
        resources: ResourceLimits,
    ) -> Result<Self, QueryError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| QueryError::Config {
                database: name.to_owned(),
                message: format!("invalid SQLite URL: {e}"),
            })?
            .read_only(true)
            .create_if_missing(false)
            .pragma("query_only", "ON")
            // Memory: SQLite runs inside this process, so one query must not be able to take
            // all of it (`randomblob(999999999)`, a huge sort or DISTINCT). The heap limit is
            // process-wide; an allocation above it fails the statement with SQLITE_NOMEM.
            // Temporary tables and sorts stay in memory under that limit instead of filling
            // the temporary directory.
            .pragma("hard_heap_limit", resources.sqlite_heap_limit.to_string())
            .pragma("temp_store", "MEMORY")
            .statement_cache_capacity(0);
        Ok(Self {
            name: name.to_owned(),
            options,
        })
    }

    pub(crate) async fn execute(
        &self,
        sql: &str,
        limits: QueryLimits,
    ) -> Result<QueryResult, QueryError> {
        let mut conn = self
            .options
            .connect()
            .await
            .map_err(|e| QueryError::Connect {
                database: self.name.clone(),
                message: e.to_string(),
            })?;
        let deadline = Instant::now() + limits.statement_timeout;
        conn.lock_handle()
            .await
            .map_err(|e| QueryError::Connect {
                database: self.name.clone(),
                message: e.to_string(),
            })?
            .set_progress_handler(PROGRESS_OPS, move || Instant::now() < deadline);
        // The progress handler interrupts work inside SQLite; this covers everything else.
        let wall = limits.statement_timeout + Duration::from_secs(2);
        let result = match tokio::time::timeout(wall, run(&mut conn, sql, limits)).await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(e)) => Err(classify(e, limits.statement_timeout, deadline)),
            Err(_) => {
                // The statement is stuck inside one VM instruction, where the progress handler
                // is not called (the guard refuses the calls known to do that). Closing waits
                // for the connection's worker thread, so it happens off the caller's path: the
                // call returns at its deadline whatever SQLite does.
                tokio::spawn(async move {
                    let _ = conn.close().await;
                });
                return Err(QueryError::Timeout {
                    timeout: limits.statement_timeout,
                });
            }
        };
        let _ = conn.close().await;
        result
    }
}

async fn run(
    conn: &mut sqlx::SqliteConnection,
    sql: &str,
    limits: QueryLimits,
) -> Result<QueryResult, sqlx::Error> {
    // Prepare first: column names also for an empty result; a second statement is refused.
    let statement = (&mut *conn)
        .prepare(AssertSqlSafe(sql).into_sql_str())
        .await?;
    let columns: Vec<String> = statement
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    let mut collector = Collector::new(limits);
    {
        let mut stream = sqlx::query(AssertSqlSafe(sql))
            .persistent(false)
            .fetch(&mut *conn);
        while let Some(row) = stream.try_next().await? {
            if !collector.push(row_to_json(&row)?) {
                break;
            }
        }
    }
    Ok(collector.finish(columns))
}

fn row_to_json(row: &SqliteRow) -> Result<Vec<serde_json::Value>, sqlx::Error> {
    let mut out = Vec::with_capacity(row.len());
    for i in 0..row.len() {
        let raw = row.try_get_raw(i)?;
        if raw.is_null() {
            out.push(serde_json::Value::Null);
            continue;
        }
        // The value's storage class, not the declared column type.
        let class = raw.type_info().name().to_owned();
        let value = match class.as_str() {
            "INTEGER" | "BOOLEAN" => serde_json::Value::from(row.try_get::<i64, _>(i)?),
            "REAL" => float_to_json(row.try_get::<f64, _>(i)?),
            "BLOB" => bytes_to_json(&row.try_get::<Vec<u8>, _>(i)?),
            _ => serde_json::Value::String(row.try_get::<String, _>(i)?),
        };
        out.push(value);
    }
    Ok(out)
}

fn classify(error: sqlx::Error, timeout: Duration, deadline: Instant) -> QueryError {
    match &error {
        sqlx::Error::Database(db) => {
            let message = db.message().to_owned();
            let code = db.code().map(|c| c.into_owned());
            // Primary result code: the low byte of the extended code.
            let primary = code
                .as_deref()
                .and_then(|c| c.parse::<i32>().ok())
                .map(|c| c & 0xff);
            match primary {
                // SQLITE_INTERRUPT: our progress handler at the deadline.
                Some(9) => QueryError::Timeout { timeout },
                // SQLITE_READONLY (read-only file, query_only)
                Some(8) => QueryError::ReadOnly { message },
                // SQLITE_NOMEM: the heap limit.
                Some(7) => QueryError::ResourceLimit {
                    resource: "memory".to_owned(),
                    message,
                },
                // SQLITE_TOOBIG: a string or blob above SQLite's length limit.
                Some(18) => QueryError::ResourceLimit {
                    resource: "memory for one value".to_owned(),
                    message,
                },
                // SQLITE_AUTH, SQLITE_PERM
                Some(23) | Some(3) => QueryError::PermissionDenied { message },
                _ if message.contains("readonly") || message.contains("read-only") => {
                    QueryError::ReadOnly { message }
                }
                _ if message.contains("interrupted") && Instant::now() >= deadline => {
                    QueryError::Timeout { timeout }
                }
                _ => QueryError::Database { code, message },
            }
        }
        _ => QueryError::Database {
            code: None,
            message: error.to_string(),
        },
    }
}

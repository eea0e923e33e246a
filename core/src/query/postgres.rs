//! PostgreSQL: read-only transaction, `SET LOCAL` timeouts, a server-side cursor fetched in
//! batches under the caps, `ROLLBACK`.

use std::str::FromStr;
use std::time::Duration;

use futures::TryStreamExt;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Column, Executor, Row, SqlSafeStr, Statement, TypeInfo, ValueRef};

use super::value::{oid, pg_binary_to_json};
use super::{Collector, QueryError, QueryLimits, QueryResult, ResourceLimits};

/// Rows per `FETCH`.
const BATCH: u64 = 500;
/// Extra wall-clock time allowed on top of the statement timeout (connecting, round trips)
/// before the whole call is abandoned and its connection closed.
const GRACE: Duration = Duration::from_secs(5);

pub(crate) struct PgDatabase {
    name: String,
    pool: PgPool,
    resources: ResourceLimits,
}

impl PgDatabase {
    pub(crate) fn new(
        name: &str,
        url: &str,
        max_connections: u32,
        resources: ResourceLimits,
    ) -> Result<Self, QueryError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| QueryError::Config {
                database: name.to_owned(),
                message: format!("invalid PostgreSQL URL: {e}"),
            })?
            .application_name("sandboxrun")
            // A second layer under BEGIN READ ONLY: every transaction on these connections
            // starts read-only.
            .options([("default_transaction_read_only", "on")]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .idle_timeout(Duration::from_secs(300))
            .connect_lazy_with(options);
        Ok(Self {
            name: name.to_owned(),
            pool,
            resources,
        })
    }

    pub(crate) async fn execute(
        &self,
        sql: &str,
        limits: QueryLimits,
    ) -> Result<QueryResult, QueryError> {
        let mut conn = self.pool.acquire().await.map_err(|e| QueryError::Connect {
            database: self.name.clone(),
            message: e.to_string(),
        })?;
        let wall = limits.statement_timeout + GRACE;
        let resources = self.resources;
        match tokio::time::timeout(wall, run(&mut conn, sql, limits, resources)).await {
            Ok(Ok(result)) => {
                if sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.is_err() {
                    conn.close_on_drop();
                }
                Ok(result)
            }
            Ok(Err(e)) => {
                if sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.is_err() {
                    conn.close_on_drop();
                }
                Err(classify(e, limits.statement_timeout, resources))
            }
            Err(_elapsed) => {
                // Mid-protocol: the connection cannot be reused. Closing it also ends the
                // transaction on the server.
                conn.close_on_drop();
                Err(QueryError::Timeout {
                    timeout: limits.statement_timeout,
                })
            }
        }
    }
}

async fn run(
    conn: &mut sqlx::PgConnection,
    sql: &str,
    limits: QueryLimits,
    resources: ResourceLimits,
) -> Result<QueryResult, sqlx::Error> {
    sqlx::raw_sql("BEGIN TRANSACTION READ ONLY")
        .execute(&mut *conn)
        .await?;
    let timeout_ms = limits.statement_timeout.as_millis().max(1).to_string();
    // set_config(..., true) is SET LOCAL with a bound parameter. Memory: one sort or hash gets
    // work_mem (hashes no more: hash_mem_multiplier 1) before spilling to temporary files, and
    // no parallel workers, each of which would get as much again.
    sqlx::query(
        "SELECT set_config('statement_timeout', $1, true), \
                set_config('idle_in_transaction_session_timeout', $1, true), \
                set_config('work_mem', $2, true), \
                set_config('hash_mem_multiplier', '1', true), \
                set_config('max_parallel_workers_per_gather', '0', true)",
    )
    .bind(&timeout_ms)
    .bind(format!("{}kB", resources.work_mem_kb))
    .execute(&mut *conn)
    .await?;
    limit_temp_files(conn, resources.temp_file_limit_kb).await?;

    // Parse and describe (not execute) the query: its column names and types, also when it
    // returns no rows. A multi-statement string fails here.
    let statement = (&mut *conn)
        .prepare(AssertSqlSafe(sql).into_sql_str())
        .await?;
    let mut columns = Vec::new();
    let mut types = Vec::new();
    let mut select = Vec::new();
    for (i, column) in statement.columns().iter().enumerate() {
        columns.push(column.name().to_owned());
        let type_oid = column.type_info().oid().map(|o| o.0);
        match type_oid {
            Some(t) if oid::KNOWN.contains(&t) => {
                types.push(t);
                select.push(format!("q.c{i}"));
            }
            _ => {
                // Unknown to the decoder (arrays, enums, intervals, geometric, …): fetch as text.
                types.push(oid::TEXT);
                select.push(format!("q.c{i}::text"));
            }
        }
    }
    let cursor_query = if select.iter().any(|s| s.ends_with("::text")) {
        let aliases: Vec<String> = (0..columns.len()).map(|i| format!("c{i}")).collect();
        format!(
            "SELECT {} FROM ({sql}\n) AS q({})",
            select.join(", "),
            aliases.join(", ")
        )
    } else {
        sql.to_owned()
    };

    // DECLARE accepts only SELECT and VALUES: another server-side check.
    sqlx::query(AssertSqlSafe(format!(
        "DECLARE sandboxrun_cursor NO SCROLL CURSOR FOR {cursor_query}"
    )))
    .persistent(false)
    .execute(&mut *conn)
    .await?;

    let mut collector = Collector::new(limits);
    // One more row than the cap, to know whether the result was truncated.
    let mut wanted = limits.max_rows.saturating_add(1);
    'fetch: while wanted > 0 {
        let n = wanted.min(BATCH);
        let mut stream = sqlx::query(AssertSqlSafe(format!(
            "FETCH FORWARD {n} FROM sandboxrun_cursor"
        )))
        .persistent(false)
        .fetch(&mut *conn);
        let mut got = 0;
        while let Some(row) = stream.try_next().await? {
            got += 1;
            if !collector.push(row_to_json(&row, &types)?) {
                // Drain the rest of this batch (at most BATCH rows) so the connection is idle.
                while stream.try_next().await?.is_some() {}
                break 'fetch;
            }
        }
        if got < n {
            break;
        }
        wanted -= n;
    }
    Ok(collector.finish(columns))
}

/// Sets `temp_file_limit` for the transaction. Only superusers and roles granted
/// `SET ON PARAMETER temp_file_limit` (PostgreSQL 15+) may; for any other role the attempt is
/// undone (savepoint) and the role's own setting applies, which an administrator sets with
/// `ALTER ROLE … SET temp_file_limit`.
async fn limit_temp_files(conn: &mut sqlx::PgConnection, kb: u64) -> Result<(), sqlx::Error> {
    // One round trip: the value is a number rendered here, never text from elsewhere.
    let set = sqlx::raw_sql(AssertSqlSafe(format!(
        "SAVEPOINT sandboxrun_limits; \
         SELECT set_config('temp_file_limit', '{kb}kB', true); \
         RELEASE SAVEPOINT sandboxrun_limits"
    )))
    .execute(&mut *conn)
    .await;
    match set {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42501") => {
            sqlx::raw_sql(
                "ROLLBACK TO SAVEPOINT sandboxrun_limits; RELEASE SAVEPOINT sandboxrun_limits",
            )
            .execute(&mut *conn)
            .await?;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn row_to_json(row: &PgRow, types: &[u32]) -> Result<Vec<serde_json::Value>, sqlx::Error> {
    let mut out = Vec::with_capacity(types.len());
    for (i, type_oid) in types.iter().enumerate() {
        let raw = row.try_get_raw(i)?;
        if raw.is_null() {
            out.push(serde_json::Value::Null);
            continue;
        }
        // The cursor's row description is authoritative for the wire type.
        let wire = raw.type_info().oid().map(|o| o.0).unwrap_or(*type_oid);
        let bytes = raw.as_bytes().map_err(sqlx::Error::Decode)?;
        let value = pg_binary_to_json(wire, bytes).map_err(|e| {
            sqlx::Error::Decode(
                format!(
                    "column {} ({}): {e}",
                    row.columns()[i].name(),
                    raw.type_info().name()
                )
                .into(),
            )
        })?;
        out.push(value);
    }
    Ok(out)
}

/// Map a driver error to an actionable [`QueryError`] by SQLSTATE.
fn classify(error: sqlx::Error, timeout: Duration, resources: ResourceLimits) -> QueryError {
    match &error {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned());
            let message = db.message().to_owned();
            match code.as_deref() {
                // query_canceled: statement_timeout (we never cancel otherwise).
                Some("57014") => QueryError::Timeout { timeout },
                // idle_in_transaction_session_timeout
                Some("25P03") => QueryError::Timeout { timeout },
                // read_only_sql_transaction
                Some("25006") => QueryError::ReadOnly { message },
                // active_sql_transaction: e.g. switching the transaction to read-write.
                Some("25001")
                    if message.contains("read-write") || message.contains("read-only") =>
                {
                    QueryError::ReadOnly { message }
                }
                // insufficient_privilege
                Some("42501") => QueryError::PermissionDenied { message },
                // configuration_limit_exceeded: temp_file_limit.
                Some("53400") => QueryError::ResourceLimit {
                    resource: format!(
                        "temporary disk space (at most {} kB)",
                        resources.temp_file_limit_kb
                    ),
                    message,
                },
                // disk_full: temporary files filled the server's disk first.
                Some("53100") => QueryError::ResourceLimit {
                    resource: "temporary disk space".to_owned(),
                    message,
                },
                // out_of_memory, and program_limit_exceeded (a value larger than 1 GB, too
                // many columns, …)
                Some("53200") | Some("54000") => QueryError::ResourceLimit {
                    resource: "memory".to_owned(),
                    message,
                },
                _ => QueryError::Database { code, message },
            }
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::Tls(_) => {
            QueryError::Database {
                code: None,
                message: format!("connection problem: {error}"),
            }
        }
        _ => QueryError::Database {
            code: None,
            message: error.to_string(),
        },
    }
}

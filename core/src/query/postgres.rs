//! PostgreSQL: read-only transaction, `SET LOCAL` timeouts, a server-side cursor fetched in
//! batches under the caps, `ROLLBACK`.
//!
//! Two things hold on every connection, whatever the server, database or role defaults say:
//!
//! * The session reads SQL text the way the guard does ([`FORCED_SETTINGS`]): sent as startup
//!   options and checked right after connecting, so a connection where they did not take
//!   (a pooler that drops startup options, say) is refused instead of used.
//! * A call that is still running [`GRACE`] after its statement timeout has its backend
//!   terminated from a separate connection and its own connection discarded: a backend that
//!   ignores the cancel never keeps running unnoticed, and is never returned to the pool.

use std::str::FromStr;
use std::time::Duration;

use futures::TryStreamExt;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{
    AssertSqlSafe, Column, Connection, Executor, Row, SqlSafeStr, Statement, TypeInfo, ValueRef,
};

use super::value::{oid, pg_binary_to_json};
use super::{Collector, QueryError, QueryLimits, QueryResult, ResourceLimits};

/// Rows per `FETCH`.
const BATCH: u64 = 500;
/// Extra wall-clock time allowed on top of the statement timeout (round trips) before the call
/// is abandoned, its backend terminated and its connection closed.
const GRACE: Duration = Duration::from_millis(500);
/// How long terminating a stuck backend may take (connecting, the call, waiting for it to go).
const TERMINATE_WITHIN: Duration = Duration::from_secs(3);

/// Session settings the SQL guard's reading of a query depends on, forced on every connection
/// (startup options outrank server, database and role defaults) and verified after connecting.
///
/// * `standard_conforming_strings = on`: a backslash in `'…'` is an ordinary character, as the
///   guard's tokenizer reads it. Off, `'\'` does not end the literal for PostgreSQL, so text the
///   guard saw as a string would run as SQL (a `UNION` over a forbidden column).
/// * `search_path = public`: an unqualified table name is the `public` table the guard judged,
///   not a same-named table of a schema a role or database default puts first.
///
/// * `client_encoding = UTF8` (sqlx asks for it too): in client encodings whose multi-byte
///   characters can contain the bytes of `\` or `'` (SJIS, BIG5, GBK) the server would split
///   the text into tokens differently from the guard.
///
/// Settings that only change how values are printed (`DateStyle`, `IntervalStyle`) or warn
/// (`escape_string_warning`) do not change what a query reads, and `backslash_quote` matters only
/// when `standard_conforming_strings` is off.
pub const FORCED_SETTINGS: &[(&str, &str)] = &[
    ("standard_conforming_strings", "on"),
    ("search_path", "public"),
    ("client_encoding", "UTF8"),
];

pub(crate) struct PgDatabase {
    name: String,
    pool: PgPool,
    /// For the separate connection that terminates a stuck backend.
    options: Box<PgConnectOptions>,
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
            .options([("default_transaction_read_only", "on")])
            .options(FORCED_SETTINGS.iter().copied());
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .idle_timeout(Duration::from_secs(300))
            .after_connect(|conn, _| Box::pin(verify_session(conn)))
            .connect_lazy_with(options.clone());
        Ok(Self {
            name: name.to_owned(),
            pool,
            options: Box::new(options),
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
        let mut backend = None;
        let outcome =
            tokio::time::timeout(wall, run(&mut conn, sql, limits, resources, &mut backend)).await;
        match outcome {
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
                // Mid-protocol: the connection cannot be reused, and its backend may still be
                // working (a function that does not check for interrupts ignores the
                // statement timeout). Terminate the backend, then drop the connection without
                // returning it to the pool.
                if let Some(pid) = backend {
                    self.terminate(pid).await;
                }
                conn.close_on_drop();
                drop(conn);
                Err(QueryError::Timeout {
                    timeout: limits.statement_timeout,
                })
            }
        }
    }
}

impl PgDatabase {
    /// Ends the backend `pid` (one of ours, running past its deadline) from a separate
    /// connection and waits until it is gone. `pg_terminate_backend` needs no grant for a
    /// backend of the same role. Best effort within [`TERMINATE_WITHIN`]: a failure is logged,
    /// the stuck connection is discarded anyway.
    async fn terminate(&self, pid: i32) {
        let attempt = async {
            let mut admin = sqlx::PgConnection::connect_with(&self.options).await?;
            // The one-argument form exists in every supported version; then wait for the
            // backend to be gone.
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&mut admin)
                .await?;
            let mut gone = false;
            for _ in 0..20 {
                let alive: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)",
                )
                .bind(pid)
                .fetch_one(&mut admin)
                .await?;
                if !alive {
                    gone = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = admin.close().await;
            Ok::<bool, sqlx::Error>(gone)
        };
        match tokio::time::timeout(TERMINATE_WITHIN, attempt).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => tracing::warn!(
                database = %self.name,
                pid,
                "a PostgreSQL backend past its statement timeout did not exit when terminated"
            ),
            Ok(Err(e)) => tracing::warn!(
                database = %self.name,
                pid,
                error = %e,
                "could not terminate a PostgreSQL backend past its statement timeout"
            ),
            Err(_) => tracing::warn!(
                database = %self.name,
                pid,
                "terminating a PostgreSQL backend past its statement timeout timed out"
            ),
        }
    }
}

/// Checks on a new connection that [`FORCED_SETTINGS`] took effect; a connection where they did
/// not is refused (the pool reports the error), never used.
async fn verify_session(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    let names: Vec<&str> = FORCED_SETTINGS.iter().map(|(name, _)| *name).collect();
    let actual: Vec<String> =
        sqlx::query_scalar("SELECT current_setting(name) FROM unnest($1::text[]) AS name")
            .bind(&names)
            .fetch_all(&mut *conn)
            .await?;
    for ((name, expected), actual) in FORCED_SETTINGS.iter().zip(&actual) {
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(sqlx::Error::Configuration(
                format!(
                    "the session setting {name} is {actual:?}, not {expected:?}, although \
                     sandboxrun sent it as a startup option: the SQL guard reads queries with \
                     {name} = {expected}. Connect directly, or through a pooler that passes \
                     startup options on"
                )
                .into(),
            ));
        }
    }
    if actual.len() != FORCED_SETTINGS.len() {
        return Err(sqlx::Error::Protocol(
            "the session settings could not be read back".into(),
        ));
    }
    Ok(())
}

async fn run(
    conn: &mut sqlx::PgConnection,
    sql: &str,
    limits: QueryLimits,
    resources: ResourceLimits,
    backend: &mut Option<i32>,
) -> Result<QueryResult, sqlx::Error> {
    sqlx::raw_sql("BEGIN TRANSACTION READ ONLY")
        .execute(&mut *conn)
        .await?;
    let timeout_ms = limits.statement_timeout.as_millis().max(1).to_string();
    // set_config(..., true) is SET LOCAL with a bound parameter. Memory: one sort or hash gets
    // work_mem (hashes no more: hash_mem_multiplier 1) before spilling to temporary files, and
    // no parallel workers, each of which would get as much again.
    // The backend's pid comes along: it is what gets terminated if the call overruns.
    let settings = sqlx::query(
        "SELECT pg_backend_pid(), \
                set_config('statement_timeout', $1, true), \
                set_config('idle_in_transaction_session_timeout', $1, true), \
                set_config('work_mem', $2, true), \
                set_config('hash_mem_multiplier', '1', true), \
                set_config('max_parallel_workers_per_gather', '0', true)",
    )
    .bind(&timeout_ms)
    .bind(format!("{}kB", resources.work_mem_kb))
    .fetch_one(&mut *conn)
    .await?;
    let pid: i32 = settings.try_get(0)?;
    *backend = Some(pid);
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

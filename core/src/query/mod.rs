//! The execution side of `execute_sql`: run a query the SQL guard ([`crate::sql::guard`]) accepted
//! against a configured database, read-only, with a statement timeout and row and byte caps.
//!
//! The guard is the first gate; this module is the second and does not trust the text it runs:
//!
//! * PostgreSQL: every query runs in its own `BEGIN READ ONLY` transaction with
//!   `SET LOCAL statement_timeout` and `SET LOCAL idle_in_transaction_session_timeout`, and ends
//!   in `ROLLBACK` (so even session-level `set_config` calls are undone). Connections also start
//!   with `default_transaction_read_only=on`. The query becomes a server-side cursor
//!   (`DECLARE … NO SCROLL CURSOR FOR <query>`, which PostgreSQL accepts only for `SELECT`/`VALUES`)
//!   and rows are fetched in batches until the row or byte cap is reached, so a million-row result
//!   is never transferred. Deployments connect as a role with only `CONNECT`, `USAGE` and `SELECT`
//!   grants (see `e2e/postgres/start.sh`, role `sandboxrun_reader`).
//!   Memory and disk: `SET LOCAL work_mem` (default 4 MiB), `hash_mem_multiplier = 1` and
//!   `max_parallel_workers_per_gather = 0` bound what one sort or hash may hold before it spills,
//!   and `temp_file_limit` (default 256 MiB) what it may spill. `temp_file_limit` is a superuser
//!   setting: a non-superuser role may set it only after `GRANT SET ON PARAMETER temp_file_limit
//!   TO <role>` (PostgreSQL 15+); without the grant the attempt is undone and the role's own
//!   setting applies (`ALTER ROLE <role> SET temp_file_limit = '256MB'`, by an administrator).
//!   A query over a limit fails with [`QueryError::ResourceLimit`].
//!   Sessions: every connection is opened with the settings the guard reads queries under
//!   ([`POSTGRES_SESSION_SETTINGS`]: `standard_conforming_strings=on`, `search_path=public`) as
//!   startup options and checked after connecting. A call still running half a second after its
//!   statement timeout has its backend terminated (`pg_terminate_backend` from a separate
//!   connection, allowed for the same role) and its connection discarded, never pooled. PostgreSQL has no per-query
//!   memory cap for single values (`repeat('x', 10^9)`), which is why the guard allows only
//!   functions whose results are bounded by their arguments.
//! * SQLite: the file is opened read-only (`mode=ro`) with `PRAGMA query_only = ON`; the timeout is
//!   a progress handler that interrupts the statement at the deadline, and rows are streamed and
//!   the statement abandoned at the cap. SQLite runs in this process: `PRAGMA hard_heap_limit`
//!   (process-wide, default 256 MiB) makes an allocation above it fail the statement
//!   (`randomblob(999999999)`), and `temp_store = MEMORY` keeps sorts and temporary tables under
//!   that limit instead of in the temporary directory.
//!
//! Database URLs carry credentials: they are never logged, and every error and `Debug` output has
//! the password replaced by `***`.

pub mod catalog;
pub mod demo;
mod postgres;
mod sqlite;
mod value;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sql::{GuardedQuery, SqlDialect};

/// The PostgreSQL session settings every connection is forced to (startup options, verified
/// after connecting) because the SQL guard reads queries under them: `standard_conforming_strings
/// = on`, `search_path = public` and `client_encoding = UTF8`. Tests that plan queries outside the executor use them too.
pub use postgres::FORCED_SETTINGS as POSTGRES_SESSION_SETTINGS;

/// How one database is named in configuration. Exactly one of `url`, `url_env` and `url_file`
/// gives the connection URL (`postgres://user:password@host:port/db` or `sqlite:///path/file.db`);
/// in clusters it is a file mounted from a Secret.
#[derive(Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DatabaseConfig {
    /// The SQL dialect, which also selects the engine.
    #[serde(default)]
    pub dialect: SqlDialect,
    /// The URL itself (fine for SQLite files; for PostgreSQL prefer `url_env` or `url_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The environment variable holding the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_env: Option<String>,
    /// A file holding the URL (surrounding whitespace is ignored), e.g. a mounted Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_file: Option<PathBuf>,
    /// The environment this database belongs to (`sandbox`, `staging`, `production`; absent:
    /// `production`, the most sensitive, so a database nobody bound is never reachable under a
    /// laxer rule). A query against it is judged in this environment, or in the call's when that
    /// is more sensitive, whatever the call says: the
    /// target decides, so a production database cannot be reached as "sandbox".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<crate::model::Environment>,
    /// PostgreSQL only: the most connections kept open to this database (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// PostgreSQL: `work_mem` of every query, in kB (default [`DEFAULT_WORK_MEM_KB`]): the
    /// memory one sort or hash may use before it spills to temporary files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_mem_kb: Option<u64>,
    /// PostgreSQL: `temp_file_limit` of every query, in kB (default
    /// [`DEFAULT_TEMP_FILE_LIMIT_KB`]): the temporary disk space one query may use. Setting it
    /// needs `GRANT SET ON PARAMETER temp_file_limit TO <role>` (PostgreSQL 15+) or a superuser;
    /// without either, the role's own setting applies (`ALTER ROLE <role> SET temp_file_limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_file_limit_kb: Option<u64>,
    /// SQLite: the most heap memory SQLite may allocate in this process, in bytes (default
    /// [`DEFAULT_SQLITE_HEAP_LIMIT`]; `PRAGMA hard_heap_limit`, which is process-wide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqlite_heap_limit: Option<u64>,
}

/// Default `work_mem` of a PostgreSQL query, in kB (4 MiB, PostgreSQL's own default).
pub const DEFAULT_WORK_MEM_KB: u64 = 4 * 1024;
/// Default `temp_file_limit` of a PostgreSQL query, in kB (256 MiB).
pub const DEFAULT_TEMP_FILE_LIMIT_KB: u64 = 256 * 1024;
/// Default SQLite heap limit of the process, in bytes (256 MiB).
pub const DEFAULT_SQLITE_HEAP_LIMIT: u64 = 256 * 1024 * 1024;

/// The memory and disk bounds the executors apply to every query of one database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ResourceLimits {
    pub(crate) work_mem_kb: u64,
    pub(crate) temp_file_limit_kb: u64,
    pub(crate) sqlite_heap_limit: u64,
}

impl ResourceLimits {
    fn of(config: &DatabaseConfig) -> Self {
        Self {
            work_mem_kb: config.work_mem_kb.unwrap_or(DEFAULT_WORK_MEM_KB).max(64),
            temp_file_limit_kb: config
                .temp_file_limit_kb
                .unwrap_or(DEFAULT_TEMP_FILE_LIMIT_KB),
            sqlite_heap_limit: config
                .sqlite_heap_limit
                .unwrap_or(DEFAULT_SQLITE_HEAP_LIMIT)
                .max(1024 * 1024),
        }
    }
}

/// A databases file that could not be read or is not a valid map of database configurations.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DatabasesFileError(String);

/// Reads a databases file: a YAML map of name → `{dialect, url | urlEnv | urlFile}`. Shared by the
/// frontend (embedded mode) and the operator (cluster mode), which read the same format.
pub fn load_databases_file(
    path: &Path,
) -> Result<BTreeMap<String, DatabaseConfig>, DatabasesFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        DatabasesFileError(format!(
            "cannot read the databases file {}: {e}",
            path.display()
        ))
    })?;
    serde_saphyr::from_str(&text).map_err(|e| {
        DatabasesFileError(format!(
            "the databases file {} is malformed: {e}; write a map of name to \
             {{dialect: postgres|sqlite, url|urlEnv|urlFile: ...}}",
            path.display()
        ))
    })
}

impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("dialect", &self.dialect)
            .field("url", &self.url.as_deref().map(redact_url))
            .field("url_env", &self.url_env)
            .field("url_file", &self.url_file)
            .field("environment", &self.environment)
            .field("max_connections", &self.max_connections)
            .field("work_mem_kb", &self.work_mem_kb)
            .field("temp_file_limit_kb", &self.temp_file_limit_kb)
            .field("sqlite_heap_limit", &self.sqlite_heap_limit)
            .finish()
    }
}

impl DatabaseConfig {
    /// A configuration with the URL given directly.
    pub fn with_url(dialect: SqlDialect, url: impl Into<String>) -> Self {
        Self {
            dialect,
            url: Some(url.into()),
            ..Self::default()
        }
    }

    fn resolve_url(&self, name: &str) -> Result<String, QueryError> {
        let config = |message: String| QueryError::Config {
            database: name.to_owned(),
            message,
        };
        match (&self.url, &self.url_env, &self.url_file) {
            (Some(url), None, None) => Ok(url.clone()),
            (None, Some(var), None) => std::env::var(var).map_err(|_| {
                config(format!(
                    "the environment variable {var} holding its URL is not set"
                ))
            }),
            (None, None, Some(path)) => std::fs::read_to_string(path)
                .map(|s| s.trim().to_owned())
                .map_err(|e| config(format!("cannot read its URL from {}: {e}", path.display()))),
            _ => Err(config(
                "give exactly one of url, urlEnv and urlFile".to_owned(),
            )),
        }
    }
}

/// The caps for one query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryLimits {
    /// How long the query may run; it is cancelled at this point.
    pub statement_timeout: Duration,
    /// The most rows returned; more are not fetched and the result is flagged truncated.
    pub max_rows: u64,
    /// The most bytes of JSON-encoded row values returned; the row that would cross it and all
    /// later rows are dropped and the result is flagged truncated.
    pub max_bytes: u64,
}

impl Default for QueryLimits {
    fn default() -> Self {
        Self {
            statement_timeout: Duration::from_secs(30),
            max_rows: 1000,
            max_bytes: 1024 * 1024,
        }
    }
}

/// A query's rows, ready for `structuredContent`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueryResult {
    /// Column names, in order.
    pub columns: Vec<String>,
    /// One array per row, values in column order. Integers and floats are numbers (non-finite
    /// floats are strings), `numeric` is a string (exact), booleans, text, JSON as JSON,
    /// timestamps with a zone as RFC 3339 (UTC), timestamps without a zone, dates and times as
    /// ISO 8601, bytes as base64, NULL as null, anything else as PostgreSQL's text form.
    pub rows: Vec<Vec<serde_json::Value>>,
    /// True when rows were left out because of `max_rows` or `max_bytes`.
    pub truncated: bool,
    /// `rows.len()`.
    pub row_count: u64,
    /// Wall-clock time of the whole execution, connection included.
    pub duration_ms: u64,
}

/// Why a query did not return rows. Messages are written for the agent (and person) reading them
/// and never contain a database password.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The database name is not configured.
    #[error("unknown database {name:?}; configured databases: {}", list(.configured))]
    UnknownDatabase {
        /// The name asked for.
        name: String,
        /// The names that are configured.
        configured: Vec<String>,
    },
    /// The database's configuration is unusable (URL missing or invalid).
    #[error("database {database:?} is misconfigured: {message}")]
    Config {
        /// The database.
        database: String,
        /// What is wrong.
        message: String,
    },
    /// No connection could be made.
    #[error("cannot connect to database {database:?}: {message}")]
    Connect {
        /// The database.
        database: String,
        /// Why (without credentials).
        message: String,
    },
    /// The statement timeout fired.
    #[error(
        "the query ran longer than {}s and was cancelled; narrow it (fewer rows, a WHERE on an indexed column) or ask for a longer timeout",
        secs(.timeout)
    )]
    Timeout {
        /// The statement timeout.
        timeout: Duration,
    },
    /// The database refused a write (read-only transaction or read-only file).
    #[error("the database refused a write: {message}; execute_sql only runs read-only queries")]
    ReadOnly {
        /// The database's words.
        message: String,
    },
    /// The query needed more memory or temporary disk space than the executor allows.
    #[error(
        "the query was stopped because it needed more {resource} than execute_sql allows ({message}); narrow it: fewer rows (WHERE), fewer or smaller joins, aggregate before joining, no huge strings"
    )]
    ResourceLimit {
        /// What ran out: memory or temporary disk space.
        resource: String,
        /// The database's words.
        message: String,
    },
    /// The connecting role lacks a privilege.
    #[error(
        "the database refused access: {message}; the sandboxrun database role may only read the tables it was granted"
    )]
    PermissionDenied {
        /// The database's words.
        message: String,
    },
    /// Any other error reported by the database (syntax, unknown column, division by zero, …).
    #[error("the database reported an error{}: {message}", code.as_deref().map(|c| format!(" (SQLSTATE {c})")).unwrap_or_default())]
    Database {
        /// The SQLSTATE, when the database gave one.
        code: Option<String>,
        /// The database's words.
        message: String,
    },
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "(none)".to_owned()
    } else {
        names.join(", ")
    }
}

fn secs(d: &Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{}", s as u64)
    } else {
        format!("{s:.1}")
    }
}

/// Replace the password in a URL (`scheme://user:password@host…`) with `***`.
pub fn redact_url(url: &str) -> String {
    match url_password(url) {
        Some((start, end)) => format!("{}***{}", &url[..start], &url[end..]),
        None => url.to_owned(),
    }
}

/// The byte range of the password in `scheme://user:password@…`, if there is one.
fn url_password(url: &str) -> Option<(usize, usize)> {
    let after_scheme = url.find("://")? + 3;
    let rest = &url[after_scheme..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let at = rest[..authority_end].rfind('@')?;
    let colon = rest[..at].find(':')?;
    Some((after_scheme + colon + 1, after_scheme + at))
}

/// Removes a known secret (the password, raw and percent-decoded) from messages.
#[derive(Clone, Default)]
pub(crate) struct Scrubber {
    secrets: Vec<String>,
}

impl Scrubber {
    fn for_url(url: &str) -> Self {
        let mut secrets = Vec::new();
        if let Some((s, e)) = url_password(url) {
            let raw = &url[s..e];
            if !raw.is_empty() {
                secrets.push(raw.to_owned());
                let decoded = percent_decode(raw);
                if decoded != raw {
                    secrets.push(decoded);
                }
            }
        }
        Self { secrets }
    }

    pub(crate) fn scrub(&self, message: impl Into<String>) -> String {
        let mut message = message.into();
        for secret in &self.secrets {
            message = message.replace(secret.as_str(), "***");
        }
        message
    }

    fn scrub_error(&self, error: QueryError) -> QueryError {
        use QueryError::*;
        match error {
            Config { database, message } => Config {
                database,
                message: self.scrub(message),
            },
            Connect { database, message } => Connect {
                database,
                message: self.scrub(message),
            },
            ReadOnly { message } => ReadOnly {
                message: self.scrub(message),
            },
            PermissionDenied { message } => PermissionDenied {
                message: self.scrub(message),
            },
            ResourceLimit { resource, message } => ResourceLimit {
                resource,
                message: self.scrub(message),
            },
            Database { code, message } => Database {
                code,
                message: self.scrub(message),
            },
            other => other,
        }
    }
}

fn percent_decode(s: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

enum Engine {
    Postgres(postgres::PgDatabase),
    Sqlite(Box<sqlite::SqliteDatabase>),
}

struct Entry {
    engine: Engine,
    scrubber: Scrubber,
    /// The environment the database belongs to ([`DatabaseConfig::environment`]).
    environment: crate::model::Environment,
}

/// The configured databases, by name. Cheap to clone (shared connection pools).
#[derive(Clone, Default)]
pub struct Databases {
    entries: Arc<BTreeMap<String, Entry>>,
}

impl fmt::Debug for Databases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (name, entry) in self.entries.iter() {
            let kind = match entry.engine {
                Engine::Postgres(_) => "postgres",
                Engine::Sqlite(_) => "sqlite",
            };
            map.entry(name, &kind);
        }
        map.finish()
    }
}

impl Databases {
    /// Build the registry from configuration. URLs are resolved now (environment, files); no
    /// connection is opened until the first query. Must be called inside a Tokio runtime when a
    /// PostgreSQL database is configured.
    pub fn from_config(config: &BTreeMap<String, DatabaseConfig>) -> Result<Self, QueryError> {
        let mut entries = BTreeMap::new();
        for (name, db) in config {
            let url = db.resolve_url(name)?;
            let scrubber = Scrubber::for_url(&url);
            let engine = match db.dialect {
                SqlDialect::Postgres => postgres::PgDatabase::new(
                    name,
                    &url,
                    db.max_connections.unwrap_or(4),
                    ResourceLimits::of(db),
                )
                .map(Engine::Postgres),
                SqlDialect::Sqlite => {
                    sqlite::SqliteDatabase::new(name, &url, ResourceLimits::of(db))
                        .map(|d| Engine::Sqlite(Box::new(d)))
                }
            }
            .map_err(|e| scrubber.scrub_error(e))?;
            entries.insert(
                name.clone(),
                Entry {
                    engine,
                    scrubber,
                    environment: db
                        .environment
                        .unwrap_or(crate::model::Environment::Production),
                },
            );
        }
        Ok(Self {
            entries: Arc::new(entries),
        })
    }

    /// The configured names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    /// The environment a configured database belongs to (`None`: no such database).
    pub fn environment(&self, database: &str) -> Option<crate::model::Environment> {
        self.entries.get(database).map(|e| e.environment)
    }

    /// The dialect of a configured database (what to pass to the guard).
    pub fn dialect(&self, database: &str) -> Option<SqlDialect> {
        self.entries.get(database).map(|e| match e.engine {
            Engine::Postgres(_) => SqlDialect::Postgres,
            Engine::Sqlite(_) => SqlDialect::Sqlite,
        })
    }

    /// Run a guarded query against `database`, read-only, within `limits`.
    pub async fn execute(
        &self,
        database: &str,
        guarded: &GuardedQuery,
        limits: QueryLimits,
    ) -> Result<QueryResult, QueryError> {
        let entry = self
            .entries
            .get(database)
            .ok_or_else(|| QueryError::UnknownDatabase {
                name: database.to_owned(),
                configured: self.names(),
            })?;
        let started = std::time::Instant::now();
        let sql = guarded.sql.trim().trim_end_matches(';').trim_end();
        let result = match &entry.engine {
            Engine::Postgres(db) => db.execute(sql, limits).await,
            Engine::Sqlite(db) => db.execute(sql, limits).await,
        };
        result
            .map(|mut r| {
                r.duration_ms = started.elapsed().as_millis() as u64;
                r
            })
            .map_err(|e| entry.scrubber.scrub_error(e))
    }

    /// The catalog of `database`: every column of its tables and views the connection may see,
    /// read within `statement_timeout` and [`catalog::MAX_CATALOG_COLUMNS`].
    pub async fn catalog(
        &self,
        database: &str,
        statement_timeout: Duration,
    ) -> Result<catalog::Catalog, QueryError> {
        let dialect = self
            .dialect(database)
            .ok_or_else(|| QueryError::UnknownDatabase {
                name: database.to_owned(),
                configured: self.names(),
            })?;
        let read = GuardedQuery {
            sql: catalog::query(dialect),
            tables: Vec::new(),
            columns: Vec::new(),
            limit: catalog::MAX_CATALOG_COLUMNS,
        };
        let result = self
            .execute(database, &read, catalog::limits(statement_timeout))
            .await?;
        Ok(catalog::of(result))
    }
}

/// Rows collected under the caps.
pub(crate) struct Collector {
    limits: QueryLimits,
    pub(crate) rows: Vec<Vec<serde_json::Value>>,
    bytes: u64,
    pub(crate) truncated: bool,
}

impl Collector {
    pub(crate) fn new(limits: QueryLimits) -> Self {
        Self {
            limits,
            rows: Vec::new(),
            bytes: 0,
            truncated: false,
        }
    }

    /// Add a row; false when the caps are reached and fetching must stop.
    pub(crate) fn push(&mut self, row: Vec<serde_json::Value>) -> bool {
        if self.rows.len() as u64 >= self.limits.max_rows {
            self.truncated = true;
            return false;
        }
        let size = serde_json::to_string(&row).map_or(0, |s| s.len() as u64);
        if self.bytes + size > self.limits.max_bytes {
            self.truncated = true;
            return false;
        }
        self.bytes += size;
        self.rows.push(row);
        true
    }

    pub(crate) fn finish(self, columns: Vec<String>) -> QueryResult {
        QueryResult {
            columns,
            row_count: self.rows.len() as u64,
            rows: self.rows,
            truncated: self.truncated,
            duration_ms: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://reader:s3cr%40t@db:5432/x?sslmode=disable"),
            "postgres://reader:***@db:5432/x?sslmode=disable"
        );
        assert_eq!(
            redact_url("postgres://reader@db/x"),
            "postgres://reader@db/x"
        );
        assert_eq!(redact_url("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        let s = Scrubber::for_url("postgres://u:p%40ss@h/d");
        assert_eq!(s.scrub("bad p%40ss and p@ss"), "bad *** and ***");
    }

    #[test]
    fn config_debug_hides_password() {
        let c = DatabaseConfig::with_url(SqlDialect::Postgres, "postgres://u:hunter2@h/d");
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn timeout_message() {
        let e = QueryError::Timeout {
            timeout: Duration::from_secs(1),
        };
        assert!(
            e.to_string()
                .starts_with("the query ran longer than 1s and was cancelled")
        );
    }
}

//! The demo database of the embedded quick start: `config/demo/demo.sql` (tables `ledger` and
//! `audit_log`), materialised as a SQLite file without any external tool.

use std::path::{Path, PathBuf};

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};

use super::DatabaseConfig;
use crate::sql::SqlDialect;

/// The demo schema and data (portable SQL: also loaded into the test PostgreSQL).
pub const DEMO_SQL: &str = include_str!("../../../config/demo/demo.sql");

/// Why the demo database could not be created.
#[derive(Debug, thiserror::Error)]
#[error("cannot create the demo database {}: {message}", path.display())]
pub struct DemoError {
    /// The file that could not be created.
    pub path: PathBuf,
    /// Why.
    pub message: String,
}

/// Create the SQLite demo database at `path` from [`DEMO_SQL`] unless the file exists. Returns
/// whether it was created. The file is built under a temporary name and renamed into place, so a
/// crash never leaves a half-filled database behind.
pub async fn ensure_sqlite(path: &Path) -> Result<bool, DemoError> {
    let fail = |message: String| DemoError {
        path: path.to_owned(),
        message,
    };
    if path.exists() {
        return Ok(false);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let build = async {
        let mut conn = SqliteConnectOptions::new()
            .filename(&tmp)
            .create_if_missing(true)
            .connect()
            .await?;
        (&mut conn).execute(sqlx::raw_sql(DEMO_SQL)).await?;
        conn.close().await
    };
    if let Err(e) = build.await {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e.to_string()));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        fail(e.to_string())
    })?;
    Ok(true)
}

/// The configuration naming the demo database at `path`.
pub fn database_config(path: &Path) -> DatabaseConfig {
    DatabaseConfig {
        // Made-up data, made on this machine: the sandbox's.
        environment: Some(crate::model::Environment::Sandbox),
        ..DatabaseConfig::with_url(SqlDialect::Sqlite, format!("sqlite://{}", path.display()))
    }
}

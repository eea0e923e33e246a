//! The catalog of a configured database: the columns of its tables and views with their types,
//! read by a fixed query of the engine's own catalog (never an agent's text) through the same
//! read-only executor as every query, within its timeout and caps. The schema resource
//! (`tools::sql_schema`) filters it down to what one agent's queries may read.

use super::{QueryLimits, QueryResult};
use crate::sql::SqlDialect;

/// The most catalog columns read; a larger catalog is cut off and the read flagged truncated.
pub const MAX_CATALOG_COLUMNS: u64 = 20_000;
/// The most bytes of catalog rows read.
pub const MAX_CATALOG_BYTES: u64 = 4 * 1024 * 1024;

/// One column of one table as the catalog names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogColumn {
    /// The table's schema (`main` in SQLite).
    pub schema: String,
    /// The table or view.
    pub table: String,
    /// The column.
    pub column: String,
    /// Its declared type, as the database writes it (empty when SQLite has none).
    pub data_type: String,
}

/// The columns of a database, in table order and each table's column order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalog {
    /// The columns.
    pub columns: Vec<CatalogColumn>,
    /// Whether columns were left out at [`MAX_CATALOG_COLUMNS`] or [`MAX_CATALOG_BYTES`].
    pub truncated: bool,
}

/// The catalog query of `dialect`. PostgreSQL: `information_schema.columns` shows only what the
/// connecting role may use, user schemas before the system ones, so a cut-off catalog loses
/// system tables first.
pub(super) fn query(dialect: SqlDialect) -> String {
    let rows = MAX_CATALOG_COLUMNS + 1;
    match dialect {
        SqlDialect::Postgres => format!(
            "SELECT table_schema::text, table_name::text, column_name::text, data_type::text \
             FROM information_schema.columns \
             ORDER BY table_schema IN ('pg_catalog', 'information_schema'), table_schema, \
             table_name, ordinal_position LIMIT {rows}"
        ),
        SqlDialect::Sqlite => format!(
            "SELECT 'main', m.name, p.name, p.type \
             FROM sqlite_master AS m JOIN pragma_table_info(m.name) AS p \
             WHERE m.type IN ('table', 'view') ORDER BY m.name, p.cid LIMIT {rows}"
        ),
    }
}

/// The caps of a catalog read that may take `statement_timeout`.
pub(super) fn limits(statement_timeout: std::time::Duration) -> QueryLimits {
    QueryLimits {
        statement_timeout,
        max_rows: MAX_CATALOG_COLUMNS,
        max_bytes: MAX_CATALOG_BYTES,
    }
}

/// The catalog of the rows of [`query`].
pub(super) fn of(result: QueryResult) -> Catalog {
    let text = |v: Option<&serde_json::Value>| {
        v.and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    Catalog {
        columns: result
            .rows
            .iter()
            .map(|row| CatalogColumn {
                schema: text(row.first()),
                table: text(row.get(1)),
                column: text(row.get(2)),
                data_type: text(row.get(3)),
            })
            .collect(),
        truncated: result.truncated,
    }
}

//! Names the SQL guard refuses whatever the policy says: functions with side effects, file or
//! network access, dynamic SQL or access to server settings, and the system catalogs.

/// One denied function name or `prefix*` pattern (lowercase) and why it is denied.
struct Denied {
    /// The lowercase name, or a prefix when it ends with `*`.
    pattern: &'static str,
    /// Why calling it is refused, phrased to follow "X is denied: ".
    why: &'static str,
}

const fn d(pattern: &'static str, why: &'static str) -> Denied {
    Denied { pattern, why }
}

/// Functions no rule can allow. Matching is case-insensitive on the last part of the name, so
/// `PG_CATALOG.PG_SLEEP` is caught like `pg_sleep`.
const DENIED_FUNCTIONS: &[Denied] = &[
    // PostgreSQL: every pg_* function. This covers pg_sleep*, pg_read_file, pg_read_binary_file,
    // pg_ls_dir, pg_stat_file, pg_terminate_backend, pg_cancel_backend, pg_reload_conf,
    // pg_rotate_logfile, pg_advisory_lock*, pg_notify, pg_current_xact_id, pg_switch_wal, ...
    d(
        "pg_*",
        "server administration, file access, locking and introspection functions (pg_*) are not available to queries",
    ),
    d("lo_*", "large-object functions read and write server files"),
    d("loread", "large-object functions read server data"),
    d("lowrite", "large-object functions write server data"),
    d("dblink*", "dblink opens connections to other databases"),
    d("set_config", "it changes server settings"),
    d(
        "current_setting",
        "it reads server settings, which may hold secrets",
    ),
    d("query_to_xml*", "it executes SQL text, bypassing the guard"),
    d(
        "table_to_xml*",
        "it reads whole tables by name, bypassing the table rules",
    ),
    d(
        "cursor_to_xml*",
        "it reads from cursors, bypassing the guard",
    ),
    d(
        "schema_to_xml*",
        "it reads whole schemas, bypassing the table rules",
    ),
    d(
        "database_to_xml*",
        "it reads the whole database, bypassing the table rules",
    ),
    d("ts_stat", "it executes SQL text, bypassing the guard"),
    d(
        "ts_rewrite",
        "it executes SQL text (its query form), bypassing the guard",
    ),
    d("crosstab*", "it executes SQL text, bypassing the guard"),
    d("connectby", "it executes SQL text, bypassing the guard"),
    d(
        "txid_*",
        "transaction-id functions can assign a transaction id (a write)",
    ),
    d("nextval", "it modifies a sequence"),
    d("setval", "it modifies a sequence"),
    d("currval", "it reads session state of sequences"),
    d("lastval", "it reads session state of sequences"),
    d("to_reg*", "catalog lookups are not available to queries"),
    // Casts written as calls (`regclass('pg_authid')`) look objects up in the catalogs.
    d("regclass", "catalog lookups are not available to queries"),
    d("regproc", "catalog lookups are not available to queries"),
    d(
        "regprocedure",
        "catalog lookups are not available to queries",
    ),
    d("regoper", "catalog lookups are not available to queries"),
    d(
        "regoperator",
        "catalog lookups are not available to queries",
    ),
    d("regtype", "catalog lookups are not available to queries"),
    d(
        "regnamespace",
        "catalog lookups are not available to queries",
    ),
    d("regrole", "catalog lookups are not available to queries"),
    d("regconfig", "catalog lookups are not available to queries"),
    d(
        "regdictionary",
        "catalog lookups are not available to queries",
    ),
    d(
        "regcollation",
        "catalog lookups are not available to queries",
    ),
    d("http*", "it makes network requests"),
    d("sys_exec", "it runs operating-system commands"),
    d("sys_eval", "it runs operating-system commands"),
    // SQLite.
    d(
        "load_extension",
        "it loads native code into the database server",
    ),
    d("readfile", "it reads files on the database host"),
    d("writefile", "it writes files on the database host"),
    d("edit", "it starts an editor on the database host"),
    d(
        "fts3_tokenizer",
        "it can load native code into the database server",
    ),
    d(
        "sqlite_*",
        "SQLite introspection functions are not available to queries",
    ),
];

/// Why `name` (any case, possibly schema-qualified: pass the last part) may not be called, or
/// `None` when it may.
pub(crate) fn denied_function(name: &str) -> Option<&'static str> {
    let name = name.to_lowercase();
    DENIED_FUNCTIONS.iter().find_map(|entry| {
        let hit = match entry.pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == entry.pattern,
        };
        hit.then_some(entry.why)
    })
}

/// Whether a (canonical, lowercase) table name points into the system catalogs: `pg_catalog.*`,
/// `information_schema.*`, any `pg_*` table or schema, `sqlite_master` and the other `sqlite_*`
/// tables, and SQLite's `pragma_*` table-valued functions.
pub(crate) fn is_system_catalog(canonical: &str) -> bool {
    let lower = canonical.to_lowercase();
    let (schema, table) = match lower.rsplit_once('.') {
        Some((schema, table)) => (Some(schema), table),
        None => (None, lower.as_str()),
    };
    let schema_is_system =
        schema.is_some_and(|s| s == "information_schema" || s.starts_with("pg_"));
    schema_is_system
        || table.starts_with("pg_")
        || table.starts_with("sqlite_")
        || table.starts_with("pragma_")
}

/// SQLite's eponymous virtual tables and table-valued functions: names that can be read as
/// tables without being created, and are not data of the database. `dbstat` lists every table
/// and index with its size, `sqlite_dbpage` returns raw pages (every table's content),
/// `sqlite_stmt` the statements of the connection, `bytecode`/`tables_used` compile SQL text,
/// `fsdir`/`zipfile`/`sqlar` read files, `json_each`/`json_tree`/`generate_series`/`carray`
/// produce rows from their arguments (governed by `tableFunctions` when called with them).
/// Whether one is compiled in depends on the build; all are treated as catalogs in SQLite: a
/// `"*"` tables rule never covers them, only a rule that lists one by name.
const SQLITE_VIRTUAL_TABLES: &[&str] = &[
    "dbstat",
    "json_each",
    "json_tree",
    "jsonb_each",
    "jsonb_tree",
    "generate_series",
    "carray",
    "completion",
    "bytecode",
    "tables_used",
    "fsdir",
    "zipfile",
    "sqlar",
    "fts3tokenize",
    "fts4aux",
    "fts5vocab",
    "btreeinfo",
    "memstat",
    "stmt",
    "explain",
    "unionvtab",
    "swarmvtab",
    "csv",
    "series",
    "spellfix1",
    "closure",
    "vfsstat",
    "rtree",
    "rtree_i32",
    "geopoly",
];

/// Whether a (canonical) table name is one of SQLite's virtual tables that exist without being
/// created ([`SQLITE_VIRTUAL_TABLES`], and every `sqlite_*` and `pragma_*` name), in any schema
/// (`main.dbstat`, `temp.dbstat`).
pub(crate) fn is_sqlite_virtual_table(canonical: &str) -> bool {
    let lower = canonical.to_lowercase();
    let table = lower.rsplit_once('.').map_or(lower.as_str(), |(_, t)| t);
    SQLITE_VIRTUAL_TABLES.contains(&table)
        || table.starts_with("sqlite_")
        || table.starts_with("pragma_")
}

/// The names the denied-function list covers, for documentation and tests.
pub fn denied_function_patterns() -> impl Iterator<Item = &'static str> {
    DENIED_FUNCTIONS.iter().map(|entry| entry.pattern)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denied_names_match_case_insensitively_and_by_prefix() {
        for name in [
            "pg_sleep",
            "PG_SLEEP_FOR",
            "Pg_Read_File",
            "lo_import",
            "dblink_exec",
            "set_config",
            "CURRENT_SETTING",
            "query_to_xml_and_xmlschema",
            "load_extension",
            "readfile",
            "txid_current",
            "ts_rewrite",
        ] {
            assert!(denied_function(name).is_some(), "{name} should be denied");
        }
        for name in [
            "count",
            "sum",
            "lower",
            "coalesce",
            "date_trunc",
            "now",
            "lo",
            "edits",
        ] {
            assert!(denied_function(name).is_none(), "{name} should be allowed");
        }
    }

    #[test]
    fn catalogs_are_recognised() {
        for name in [
            "pg_catalog.pg_class",
            "pg_user",
            "information_schema.tables",
            "sqlite_master",
            "pg_temp.x",
            "pragma_table_info",
        ] {
            assert!(is_system_catalog(name), "{name}");
        }
        assert!(!is_system_catalog("ledger"));
        for name in [
            "dbstat",
            "DBSTAT",
            "main.dbstat",
            "temp.json_each",
            "sqlite_dbpage",
        ] {
            assert!(is_sqlite_virtual_table(name), "{name}");
        }
        assert!(!is_sqlite_virtual_table("ledger"));
        assert!(!is_system_catalog("reporting.ledger"));
    }
}

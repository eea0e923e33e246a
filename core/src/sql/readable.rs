//! What a rule lets queries read, table by table and column by column, as the guard itself
//! resolves names: the schema resource (`tools::sql_schema`) shows an agent exactly the part of a
//! database's catalog that its queries may name, so this view and the guard cannot disagree.

use super::check::Compiled;
use super::{SqlDialect, SqlRules};

/// The readable part of a database under one rule's `sql` settings.
pub struct Readable {
    compiled: Compiled,
    dialect: SqlDialect,
}

impl Readable {
    /// The view of `rules` for a database of `dialect`.
    pub fn new(rules: &SqlRules, dialect: SqlDialect) -> Self {
        Self {
            compiled: Compiled::new(rules, dialect),
            dialect,
        }
    }

    /// The name a query uses for the catalog's table `schema.table` (the default schema left
    /// out), and the columns of `columns` a query may read from it, in their order; `None` when
    /// the table is not readable at all. A name as the catalog stores it is what a quoted
    /// identifier names, so a PostgreSQL column `Amount` is readable only where the rule allows
    /// every column (its lists name unquoted, lowercase columns), exactly as the guard judges
    /// `"Amount"`.
    pub fn table<'c>(
        &self,
        schema: &str,
        table: &str,
        columns: impl IntoIterator<Item = &'c str>,
    ) -> Option<(String, Vec<&'c str>)> {
        let fold = |name: &str| match self.dialect {
            SqlDialect::Sqlite => name.to_lowercase(),
            SqlDialect::Postgres => name.to_owned(),
        };
        let canonical = self.compiled.canonical(&[fold(schema), fold(table)]).ok()?;
        let allowed = self.compiled.table_rule(&canonical).ok()?;
        let columns = columns
            .into_iter()
            .filter(|column| {
                allowed
                    .as_ref()
                    .is_none_or(|list| list.iter().any(|c| *c == fold(column)))
            })
            .collect();
        Some((canonical, columns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(yaml: &str) -> SqlRules {
        serde_saphyr::from_str(yaml).expect("valid sql rules")
    }

    #[test]
    fn listed_tables_show_their_listed_columns_in_catalog_order() {
        let view = Readable::new(
            &rules("databases: [demo]\ntables:\n  ledger: {columns: [amount, id]}\n"),
            SqlDialect::Postgres,
        );
        assert_eq!(
            view.table("public", "ledger", ["id", "account", "amount"]),
            Some(("ledger".to_owned(), vec!["id", "amount"]))
        );
        assert_eq!(view.table("public", "accounts", ["id"]), None);
        // Another schema's table of the same name is another table.
        assert_eq!(view.table("audit", "ledger", ["id"]), None);
    }

    #[test]
    fn a_star_table_covers_other_tables_but_never_catalogs() {
        let view = Readable::new(
            &rules(
                "databases: ['*']\ntables:\n  '*': {columns: '*'}\n  secrets: {columns: [id]}\n",
            ),
            SqlDialect::Postgres,
        );
        assert_eq!(
            view.table("public", "orders", ["id", "total"]),
            Some(("orders".to_owned(), vec!["id", "total"]))
        );
        assert_eq!(
            view.table("sales", "orders", ["id"]),
            Some(("sales.orders".to_owned(), vec!["id"]))
        );
        assert_eq!(
            view.table("public", "secrets", ["id", "token"]),
            Some(("secrets".to_owned(), vec!["id"]))
        );
        assert_eq!(view.table("pg_catalog", "pg_authid", ["rolname"]), None);
        assert_eq!(
            view.table("information_schema", "tables", ["table_name"]),
            None
        );
        assert_eq!(view.table("public", "pg_stat_activity", ["pid"]), None);
    }

    #[test]
    fn a_catalog_listed_by_name_is_readable() {
        let view = Readable::new(
            &rules("databases: ['*']\ntables:\n  pg_catalog.pg_stat_activity: {columns: [pid]}\n"),
            SqlDialect::Postgres,
        );
        assert_eq!(
            view.table("pg_catalog", "pg_stat_activity", ["pid", "query"]),
            Some(("pg_catalog.pg_stat_activity".to_owned(), vec!["pid"]))
        );
    }

    #[test]
    fn names_fold_as_each_database_folds_them() {
        let listed = rules("databases: ['*']\ntables:\n  Ledger: {columns: [Amount]}\n");
        // PostgreSQL keeps a quoted name's case: "Ledger" is not ledger, "Amount" not amount.
        let pg = Readable::new(&listed, SqlDialect::Postgres);
        assert_eq!(
            pg.table("public", "ledger", ["amount", "Amount"]),
            Some(("ledger".to_owned(), vec!["amount"]))
        );
        assert_eq!(pg.table("public", "Ledger", ["amount"]), None);
        // SQLite ignores case.
        let lite = Readable::new(&listed, SqlDialect::Sqlite);
        assert_eq!(
            lite.table("main", "LEDGER", ["AMOUNT", "id"]),
            Some(("ledger".to_owned(), vec!["AMOUNT"]))
        );
    }
}

//! The SQL guard: decides whether a query an agent sent to `execute_sql` may run, judging its
//! parsed structure, never keywords.
//!
//! A query is accepted only when it is exactly one read-only query statement (`SELECT`,
//! `WITH … SELECT`, set operations of those, `VALUES`) that
//!
//! - has no `SELECT … INTO`, no data-modifying CTE and no locking clause (`FOR UPDATE/SHARE`);
//! - calls only allowed functions: the dialect's default allowlist ([`default_functions`]) and
//!   the rule's `functions`, never a hard-denied one (see [`denied_function_patterns`]), and no
//!   table-valued function in `FROM` unless the rules list it in `tableFunctions`; syntax that
//!   is a function call in another form (`EXTRACT`, `SUBSTRING … FROM`, `POSITION`, `TRIM`,
//!   `OVERLAY`, `AT TIME ZONE`, …) goes through the same allowlist, operators are limited to the
//!   built-in ones, and syntax the guard does not know is refused;
//! - casts only to allowed types (numbers, text, dates and times, booleans, UUIDs, JSON, and
//!   arrays of those), comparing the unquoted, unqualified, lowercase type name;
//! - reads only tables the rules allow (system catalogs, and SQLite's eponymous virtual tables
//!   such as `dbstat`, only when listed by name), and only their
//!   allowed columns, after resolving table aliases, CTE names and subqueries with PostgreSQL's
//!   rules: every column reference (`c`, `t.c`, `s.t.c`, `t.c[1]`, `(t).c`, `(t.*).c`, a
//!   whole-row `t`) is resolved against the relation it really names; an unqualified column that
//!   could belong to more than one table in scope must be qualified, and a reference that cannot
//!   be resolved unambiguously is refused;
//! - has no `WITH RECURSIVE` unless `allowRecursive`, at most `maxJoins` joins per `SELECT` and
//!   at most `maxCrossJoins` joins without a join condition in the whole query;
//! - cannot build values more than [`MAX_VALUE_GROWTH`] times larger than the values it reads by
//!   combining (`||`, `concat`, `ROW`, `ARRAY`) values that its subqueries or CTEs already
//!   combined, and stays below 50,000 terms once PostgreSQL substitutes its CTEs and subqueries
//!   (a CTE chain that refers to the previous level twice doubles with every level, and
//!   PostgreSQL does not interrupt planning for the statement timeout);
//! - does bounded work in every single call (`cost.rs`): superlinear functions and operators
//!   (`btrim(x, set)`, `translate`, `strpos`, regular expressions, SQLite's `ltrim(x, set)`,
//!   `instr`, `LIKE`) take their cost-multiplying operands as short literals, and paddings
//!   (`char(n)`, `lpad`, numeric scales) stay within [`MAX_PADDED_WIDTH`] each and
//!   [`MAX_PADDING_TOTAL`] in all, because databases do not interrupt one call for the timeout;
//! - uses `*` / `t.*` only when `allowWildcard` is set and every table it expands over allows all
//!   columns.
//!
//! The accepted query gets a `LIMIT` of at most `maxLimit` (added, or lowered), an `OFFSET` of at
//! most `maxOffset`, and is returned re-rendered from the checked syntax tree. The rendered text
//! is parsed and checked a second time, so what runs is exactly what was judged.

mod allow;
mod check;
mod cost;
mod deny;
mod readable;
mod scan;

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use allow::{POSTGRES_FUNCTIONS, SQLITE_FUNCTIONS};
pub use cost::{MAX_OPERAND_CHARS, MAX_PADDED_WIDTH, MAX_PADDING_TOTAL, MAX_PATTERN_CHARS};
pub use deny::denied_function_patterns;
pub use readable::Readable;

/// The functions every rule allows for `dialect` (lowercase names), before its `functions`.
pub fn default_functions(dialect: SqlDialect) -> &'static [&'static str] {
    allow::default_functions(dialect)
}

/// Default cap on the `LIMIT` of a query when the rules give none.
pub const DEFAULT_MAX_LIMIT: u64 = 1_000;
/// Largest `maxLimit` a policy may configure.
pub const MAX_LIMIT: u64 = 1_000_000;
/// Default cap on the `OFFSET` of a query when the rules give none.
pub const DEFAULT_MAX_OFFSET: u64 = 100_000;
/// Longest query text the guard looks at, in bytes; longer queries are refused unread.
pub const MAX_QUERY_BYTES: usize = 16 * 1024;
/// How many times larger than the largest value it reads a value of a query may become by
/// combining values (`||`, `concat`, `ROW`, `ARRAY`) that subqueries or CTEs already combined.
/// Within one expression, growth is bounded by the token count; across nested queries it
/// multiplies, so `WITH a AS (SELECT x || x AS x …), b AS (SELECT x || x AS x FROM a) …` doubles
/// with every level.
pub const MAX_VALUE_GROWTH: u64 = 256;
/// Most tokens (words, literals, operators; not whitespace) a query may have. Bounds the depth
/// of the syntax tree, so checking and rendering never exhaust the stack.
pub const MAX_QUERY_TOKENS: usize = 2_000;

/// The SQL dialect of the target database, which decides how a query is parsed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SqlDialect {
    /// PostgreSQL (cluster databases).
    #[default]
    Postgres,
    /// SQLite (the embedded demo database).
    Sqlite,
}

/// The SQL part of a policy rule: which databases, tables, columns and functions a query may
/// touch, how it may join, and how many rows it may ask for. In the policy file (see
/// `config/policy/policy.yaml`):
///
/// ```yaml
/// sql:
///   databases: [demo]
///   tables:
///     ledger: {columns: [id, account, amount, booked_at]}
///   allowWildcard: false
///   maxLimit: 1000
///   maxOffset: 100000
///   tableFunctions: []      # in FROM
///   functions: []           # in expressions, on top of the dialect's default allowlist
///   allowRecursive: false   # WITH RECURSIVE
///   maxJoins: 8             # per SELECT
///   maxCrossJoins: 1        # joins without a condition, whole query
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SqlRules {
    /// Database names (as configured for `execute_sql`) the rule covers; `*` for any.
    pub databases: Vec<String>,
    /// Tables that may be read, by name (`ledger`, or `schema.table`; `public.`/`main.` may be
    /// left out), each with its allowed columns. The key `*` stands for every other table that
    /// is not a system catalog. System catalogs are readable only when listed by exact name.
    #[serde(default)]
    pub tables: BTreeMap<String, TableRule>,
    /// Whether `SELECT *` and `t.*` are allowed (only over tables whose columns are `*`).
    #[serde(default)]
    pub allow_wildcard: bool,
    /// The largest `LIMIT` a query gets; a missing or larger `LIMIT` is set to this.
    #[serde(default = "default_max_limit")]
    pub max_limit: u64,
    /// The largest `OFFSET` a query may use.
    #[serde(default = "default_max_offset")]
    pub max_offset: u64,
    /// Table-valued functions allowed in `FROM` (e.g. `generate_series`, `unnest`); none by
    /// default. A plain name allows the built-in function (unqualified or `pg_catalog.`);
    /// `schema.name` allows a function of another schema. Denied functions stay denied whatever
    /// is listed here (the policy does not load).
    #[serde(default)]
    pub table_functions: Vec<String>,
    /// Functions a query may call in expressions on top of the dialect's default allowlist
    /// ([`default_functions`]: plain scalar, aggregate and window functions such as `count`,
    /// `sum`, `round`, `lower`, `coalesce`, `date_trunc`/`strftime`). A function that is on
    /// neither list cannot run. Names are matched case-insensitively; `schema.name` allows a
    /// function of another schema. The hard-denied functions ([`denied_function_patterns`]) are
    /// refused even when listed (the policy does not load).
    #[serde(default)]
    pub functions: Vec<String>,
    /// Whether `WITH RECURSIVE` is allowed; refused by default, because a recursive CTE without
    /// a working stop condition runs until the statement timeout and can fill memory and
    /// temporary files on the way.
    #[serde(default)]
    pub allow_recursive: bool,
    /// The most relations (tables, CTEs, subqueries, table functions) one `SELECT` may join in
    /// its `FROM` clause, minus one (default 8).
    #[serde(default = "default_max_joins")]
    pub max_joins: u32,
    /// The most joins without a join condition (`FROM a, b`, `CROSS JOIN`, `JOIN … ON true`)
    /// the whole query may contain (default 1). Each one multiplies the rows the database has
    /// to produce: three 10,000-row tables joined this way are 10^12 rows.
    #[serde(default = "default_max_cross_joins")]
    pub max_cross_joins: u32,
}

/// Default of [`SqlRules::max_joins`].
pub const DEFAULT_MAX_JOINS: u32 = 8;
/// Largest `maxJoins` a policy may configure.
pub const MAX_JOINS: u32 = 32;
/// Default of [`SqlRules::max_cross_joins`].
pub const DEFAULT_MAX_CROSS_JOINS: u32 = 1;

fn default_max_joins() -> u32 {
    DEFAULT_MAX_JOINS
}

fn default_max_cross_joins() -> u32 {
    DEFAULT_MAX_CROSS_JOINS
}

fn default_max_limit() -> u64 {
    DEFAULT_MAX_LIMIT
}

fn default_max_offset() -> u64 {
    DEFAULT_MAX_OFFSET
}

impl Default for SqlRules {
    fn default() -> Self {
        Self {
            databases: vec!["*".to_owned()],
            tables: BTreeMap::new(),
            allow_wildcard: false,
            max_limit: DEFAULT_MAX_LIMIT,
            max_offset: DEFAULT_MAX_OFFSET,
            table_functions: Vec::new(),
            functions: Vec::new(),
            allow_recursive: false,
            max_joins: DEFAULT_MAX_JOINS,
            max_cross_joins: DEFAULT_MAX_CROSS_JOINS,
        }
    }
}

impl SqlRules {
    /// Checks the rules themselves (used when a policy is loaded); the error says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.databases.is_empty() {
            return Err(
                "sql.databases is empty: list the databases the rule covers, or \"*\"".into(),
            );
        }
        if self.max_limit == 0 || self.max_limit > MAX_LIMIT {
            return Err(format!(
                "sql.maxLimit is {}: it must be between 1 and {MAX_LIMIT}",
                self.max_limit
            ));
        }
        if self.max_offset > MAX_LIMIT * 10 {
            return Err(format!(
                "sql.maxOffset is {}: it must be at most {}",
                self.max_offset,
                MAX_LIMIT * 10
            ));
        }
        if self.max_joins > MAX_JOINS {
            return Err(format!(
                "sql.maxJoins is {}: it must be at most {MAX_JOINS}",
                self.max_joins
            ));
        }
        if self.max_cross_joins > self.max_joins {
            return Err(format!(
                "sql.maxCrossJoins is {}: it must be at most sql.maxJoins ({})",
                self.max_cross_joins, self.max_joins
            ));
        }
        for (field, names) in [
            ("functions", &self.functions),
            ("tableFunctions", &self.table_functions),
        ] {
            for name in names {
                let parts: Vec<&str> = name.split('.').collect();
                if parts.len() > 2
                    || parts
                        .iter()
                        .any(|p| p.trim().is_empty() || p.contains(['(', ')', ' ', '*', '"']))
                {
                    return Err(format!(
                        "sql.{field} contains {name:?}: write a function name, or schema.name"
                    ));
                }
                let last = parts.last().copied().unwrap_or_default();
                if let Some(why) = deny::denied_function(last) {
                    return Err(format!(
                        "sql.{field} contains {name}, which no policy can allow: {why}"
                    ));
                }
            }
        }
        for (name, table) in &self.tables {
            let parts: Vec<&str> = name.split('.').collect();
            if name.is_empty() || parts.len() > 2 || parts.iter().any(|p| p.trim().is_empty()) {
                return Err(format!(
                    "sql.tables has the key {name:?}: use `table` or `schema.table`, or `*`"
                ));
            }
            if let Columns::List(cols) = &table.columns {
                if cols.is_empty() {
                    return Err(format!(
                        "sql.tables.{name}.columns is empty: list the allowed columns, or \"*\""
                    ));
                }
                if let Some(bad) = cols.iter().find(|c| c.trim().is_empty() || c.contains('*')) {
                    return Err(format!(
                        "sql.tables.{name}.columns contains {bad:?}: use plain column names, or \"*\" alone instead of a list"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether the rules cover `database`.
    pub fn allows_database(&self, database: &str) -> bool {
        self.databases.iter().any(|d| d == "*" || d == database)
    }
}

/// What may be read from one table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TableRule {
    /// The columns that may appear anywhere in a query (select list, `WHERE`, joins, ordering):
    /// a list, or `"*"` for all.
    pub columns: Columns,
}

/// The allowed columns of a table.
#[derive(Clone, Debug, PartialEq, Eq, JsonSchema)]
#[schemars(untagged)]
pub enum Columns {
    /// Every column (`"*"`).
    Any,
    /// Only these columns.
    List(Vec<String>),
}

impl Serialize for Columns {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Columns::Any => s.serialize_str("*"),
            Columns::List(cols) => cols.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Columns {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ColumnsVisitor;
        impl<'de> serde::de::Visitor<'de> for ColumnsVisitor {
            type Value = Columns;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of column names, or \"*\" for all columns")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Columns, E> {
                if v == "*" {
                    Ok(Columns::Any)
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(v), &self))
                }
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Columns, A::Error> {
                let mut cols = Vec::new();
                while let Some(c) = seq.next_element::<String>()? {
                    cols.push(c);
                }
                if cols.len() == 1 && cols[0] == "*" {
                    return Ok(Columns::Any);
                }
                Ok(Columns::List(cols))
            }
        }
        d.deserialize_any(ColumnsVisitor)
    }
}

/// A query the guard accepted, ready to execute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardedQuery {
    /// The query to execute: re-rendered from the checked syntax tree, with its `LIMIT`.
    pub sql: String,
    /// The base tables it reads, canonical names, sorted.
    pub tables: Vec<String>,
    /// The columns it references, as `table.column`, sorted.
    pub columns: Vec<String>,
    /// The `LIMIT` the query now carries.
    pub limit: u64,
}

/// Which check refused a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ViolationKind {
    /// Empty, too long or too many tokens.
    Size,
    /// The text is not valid SQL for the dialect.
    Parse,
    /// More than one statement.
    MultipleStatements,
    /// A statement other than a query (DDL, DML, `SET`, `COPY`, ...).
    NotAQuery,
    /// `SELECT … INTO`.
    SelectInto,
    /// A `WITH` containing `INSERT`/`UPDATE`/`DELETE`/`MERGE`.
    DataModifyingCte,
    /// `FOR UPDATE` / `FOR SHARE` and friends.
    LockingClause,
    /// A call to a hard-denied function (no rule can allow it), or a cast to a catalog lookup
    /// type (`regclass`, ...).
    DeniedFunction,
    /// A call to a function that is neither on the dialect's default allowlist nor in the
    /// rule's `functions`, or an operator or syntax that is a function call in disguise and is
    /// not allowed.
    FunctionNotAllowed,
    /// A cast (`::t`, `CAST(x AS t)`, `t 'literal'`) to a type outside the cast allowlist.
    CastNotAllowed,
    /// `WITH RECURSIVE` without `allowRecursive`.
    Recursive,
    /// More joined relations, or joins without a condition, than the rule allows.
    TooManyJoins,
    /// Values combined again and again across subqueries or CTEs (`WITH a AS (SELECT x || x …),
    /// b AS (SELECT a.x || a.x …)`): their size could grow exponentially.
    ValueGrowth,
    /// Work one function call could do without bound, which the database cannot interrupt: a
    /// superlinear function (`btrim(x, set)`, `translate`, a regular expression) with a
    /// cost-multiplying operand that is not a short literal, or a value padded (`char(n)`,
    /// `lpad`) wider than allowed.
    UnboundedWork,
    /// A table-valued function in `FROM` the rules do not list.
    TableFunction,
    /// A system catalog not listed by the rules.
    SystemCatalog,
    /// A table the rules do not allow.
    TableNotAllowed,
    /// A column the rules do not allow.
    ColumnNotAllowed,
    /// An unqualified column that could belong to several tables.
    AmbiguousColumn,
    /// A column or table alias that is not in scope.
    UnknownColumn,
    /// `*` or `t.*` where wildcards are not allowed.
    Wildcard,
    /// A `LIMIT`/`FETCH` form that cannot be capped.
    Limit,
    /// An `OFFSET` that is not a number literal or too large.
    Offset,
    /// Syntax the guard does not support (dialect extensions and the like).
    Unsupported,
}

/// Why the guard refused a query: the problem and what to do instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardViolation {
    /// Which check refused it.
    pub kind: ViolationKind,
    /// What is wrong, e.g. "SELECT * is not allowed".
    pub problem: String,
    /// What to do instead, e.g. "list the columns you need, e.g. SELECT id, amount FROM ledger".
    pub hint: String,
}

impl GuardViolation {
    pub(crate) fn new(
        kind: ViolationKind,
        problem: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            problem: problem.into(),
            hint: hint.into(),
        }
    }

    /// The whole message: "problem: hint".
    pub fn message(&self) -> String {
        self.to_string()
    }

    /// The message naming the policy rule that imposed the check: "problem by rule R: hint".
    pub fn message_for_rule(&self, rule: &str) -> String {
        format!("{} by rule {rule}: {}", self.problem, self.hint)
    }
}

impl fmt::Display for GuardViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.problem, self.hint)
    }
}

impl std::error::Error for GuardViolation {}

/// Checks `query` for `dialect` against `rules` and returns the query to execute, or why it is
/// refused. Never panics, whatever the input.
pub fn guard(
    query: &str,
    dialect: SqlDialect,
    rules: &SqlRules,
) -> Result<GuardedQuery, GuardViolation> {
    check::guard(query, dialect, rules)
}

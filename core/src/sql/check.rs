//! The guard's passes: token pre-checks, parsing, a scan of the whole tree that decides every
//! kind of expression (`scan.rs`: functions, operators, casts), scope-aware table/column
//! resolution with the bounds on joins and value growth, and the LIMIT rewrite.

use std::collections::{BTreeSet, HashMap};
use std::ops::{ControlFlow, Range};

use sqlparser::ast::{
    AccessExpr, BinaryOperator, Distinct, Expr, FunctionArg, FunctionArgExpr, FunctionArguments,
    GroupByExpr, Ident, JoinConstraint, JoinOperator, LimitClause, ObjectName, ObjectNamePart,
    Offset, OffsetRows, OrderByKind, Query, Select, SelectFlavor, SelectItem,
    SelectItemQualifiedWildcardKind, SetExpr, Statement, TableAlias, TableFactor, TableWithJoins,
    Value, Visit, Visitor, WildcardAdditionalOptions,
};
use sqlparser::dialect::{Dialect, PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Token, Tokenizer};

use super::allow::default_functions;
use super::deny::{denied_function, is_sqlite_virtual_table, is_system_catalog};
use super::scan::{FunctionPolicy, Scan, check_denied_name, denied, value_function};
use super::{
    Columns, GuardViolation, GuardedQuery, MAX_QUERY_BYTES, MAX_QUERY_TOKENS, MAX_VALUE_GROWTH,
    SqlDialect, SqlRules, ViolationKind as K,
};

type R<T> = Result<T, GuardViolation>;

/// How deep the parser may recurse (sqlparser's default is 50).
const PARSER_RECURSION_LIMIT: usize = 50;

const READ_ONLY_HINT: &str =
    "execute_sql runs exactly one read-only query: SELECT … or WITH … SELECT";

fn violation(kind: K, problem: impl Into<String>, hint: impl Into<String>) -> GuardViolation {
    GuardViolation::new(kind, problem, hint)
}

fn unsupported(what: impl std::fmt::Display) -> GuardViolation {
    violation(
        K::Unsupported,
        format!("{what} is not supported by the SQL guard"),
        "rewrite the query as a plain SELECT over allowed tables and columns",
    )
}

pub(crate) fn guard(query: &str, dialect: SqlDialect, rules: &SqlRules) -> R<GuardedQuery> {
    let compiled = Compiled::new(rules, dialect);
    let first = analyze(query, &compiled)?;
    let rendered = first.query.to_string();
    // Judge what will run: the rendered text goes through every check again and must render
    // to itself, so a rendering quirk can never smuggle in something the first pass did not see.
    let second = analyze(&rendered, &compiled)?;
    let again = second.query.to_string();
    if again != rendered {
        return Err(unsupported(
            "a query whose rendering is not stable (it changes when parsed again)",
        ));
    }
    Ok(GuardedQuery {
        sql: again,
        tables: second.tables.into_iter().collect(),
        columns: second.columns.into_iter().collect(),
        limit: second.limit,
    })
}

struct Analysis {
    query: Query,
    tables: BTreeSet<String>,
    columns: BTreeSet<String>,
    limit: u64,
}

fn dialect_impl(dialect: SqlDialect) -> Box<dyn Dialect> {
    match dialect {
        SqlDialect::Postgres => Box::new(PostgreSqlDialect {}),
        SqlDialect::Sqlite => Box::new(SQLiteDialect {}),
    }
}

fn dialect_name(dialect: SqlDialect) -> &'static str {
    match dialect {
        SqlDialect::Postgres => "PostgreSQL",
        SqlDialect::Sqlite => "SQLite",
    }
}

fn analyze(query: &str, rules: &Compiled) -> R<Analysis> {
    let dialect = dialect_impl(rules.dialect);
    precheck(query, dialect.as_ref(), rules.dialect)?;
    let statements = Parser::new(dialect.as_ref())
        .with_recursion_limit(PARSER_RECURSION_LIMIT)
        .try_with_sql(query)
        .and_then(|mut p| p.parse_statements())
        .map_err(|e| {
            violation(
                K::Parse,
                format!(
                    "the query is not valid {} SQL ({e})",
                    dialect_name(rules.dialect)
                ),
                "fix the syntax and send exactly one SELECT statement; quote string literals with single quotes",
            )
        })?;
    let mut statements = statements.into_iter();
    let statement = match (statements.next(), statements.next()) {
        (Some(s), None) => s,
        (None, _) => {
            return Err(violation(
                K::Size,
                "the query is empty",
                "send one SELECT statement",
            ));
        }
        (Some(_), Some(_)) => {
            return Err(violation(
                K::MultipleStatements,
                "the query contains more than one statement",
                "send exactly one SELECT; a ';' ends a statement, so it cannot be part of a table or column name",
            ));
        }
    };
    if let ControlFlow::Break(v) = statement.visit(&mut Scan::new(&rules.functions)) {
        return Err(v);
    }
    let mut query = match statement {
        Statement::Query(q) => *q,
        other => {
            let word = other
                .to_string()
                .split_whitespace()
                .next()
                .unwrap_or("this")
                .to_uppercase();
            return Err(violation(
                K::NotAQuery,
                format!("{word} statements are not allowed"),
                READ_ONLY_HINT,
            ));
        }
    };
    let mut checker = Checker {
        rules,
        ctes: Vec::new(),
        tables: BTreeSet::new(),
        columns: BTreeSet::new(),
        cte_depth: 0,
        cross_joins: 0,
        leaf_growth: Vec::new(),
        expanded_terms: 0,
        last_growth: Size::ONE,
    };
    checker.check_query(&query, &[])?;
    let limit = cap_limit(&mut query, rules)?;
    Ok(Analysis {
        query,
        tables: checker.tables,
        columns: checker.columns,
        limit,
    })
}

/// Checks that need only the tokens: size, the first keyword, statement count, and calls of
/// denied functions (a word followed by `(`), which catches them wherever they hide.
fn precheck(query: &str, dialect: &dyn Dialect, which: SqlDialect) -> R<()> {
    if query.trim().is_empty() {
        return Err(violation(
            K::Size,
            "the query is empty",
            "send one SELECT statement",
        ));
    }
    if query.len() > MAX_QUERY_BYTES {
        return Err(violation(
            K::Size,
            format!(
                "the query is {} bytes long, more than the {MAX_QUERY_BYTES} allowed",
                query.len()
            ),
            "send a shorter query",
        ));
    }
    let tokens = Tokenizer::new(dialect, query).tokenize().map_err(|e| {
        violation(
            K::Parse,
            format!("the query is not valid {} SQL ({e})", dialect_name(which)),
            "fix the syntax (check quotes and comments) and send exactly one SELECT statement",
        )
    })?;
    // PostgreSQL reads U&"\0073ecret" as the name secret; the tokenizer sees `U & "\0073ecret"`.
    for triple in tokens.windows(3) {
        if let [Token::Word(u), Token::Ampersand, Token::Word(quoted)] = triple
            && u.quote_style.is_none()
            && u.value.eq_ignore_ascii_case("u")
            && quoted.quote_style == Some('"')
        {
            return Err(violation(
                K::Unsupported,
                "Unicode-escaped names (U&\"…\") are not supported by the SQL guard",
                "write the table or column name plainly, e.g. \"name\"",
            ));
        }
    }
    let tokens: Vec<&Token> = tokens
        .iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    if tokens.len() > MAX_QUERY_TOKENS {
        return Err(violation(
            K::Size,
            format!(
                "the query has {} tokens, more than the {MAX_QUERY_TOKENS} allowed",
                tokens.len()
            ),
            "send a simpler query",
        ));
    }
    let Some(first) = tokens.iter().find(|t| !matches!(t, Token::SemiColon)) else {
        return Err(violation(
            K::Size,
            "the query is empty",
            "send one SELECT statement",
        ));
    };
    match first {
        Token::LParen => {}
        Token::Word(w)
            if w.quote_style.is_none()
                && ["SELECT", "WITH", "VALUES", "TABLE"]
                    .contains(&w.value.to_uppercase().as_str()) => {}
        Token::Word(w) if w.quote_style.is_none() => {
            return Err(violation(
                K::NotAQuery,
                format!("{} statements are not allowed", w.value.to_uppercase()),
                READ_ONLY_HINT,
            ));
        }
        other => {
            return Err(violation(
                K::NotAQuery,
                format!("the query starts with `{other}`, not SELECT or WITH"),
                READ_ONLY_HINT,
            ));
        }
    }
    // Statements are separated by top-level semicolons (semicolons in strings, quoted names and
    // comments are inside other tokens).
    let mut statements: Vec<&Token> = Vec::new();
    let mut in_statement = false;
    for token in &tokens {
        match token {
            Token::SemiColon => in_statement = false,
            t if !in_statement => {
                in_statement = true;
                statements.push(t);
            }
            _ => {}
        }
    }
    if statements.len() > 1 {
        return Err(violation(
            K::MultipleStatements,
            format!(
                "the query contains {} statements: a ';' ends the first one and starts another beginning with `{}`",
                statements.len(),
                statements[1]
            ),
            "send exactly one SELECT; a ';' cannot be part of a table or column name",
        ));
    }
    for pair in tokens.windows(2) {
        if let (Token::Word(w), Token::LParen) = (pair[0], pair[1])
            && let Some(why) = denied_function(&w.value)
        {
            return Err(denied(&w.value, why));
        }
    }
    Ok(())
}

fn last_name_part(name: &ObjectName) -> Option<&Ident> {
    match name.0.last() {
        Some(ObjectNamePart::Identifier(i)) => Some(i),
        _ => None,
    }
}

/// The rules in the form the checker looks things up in: names lowercased, table keys canonical.
pub(super) struct Compiled {
    dialect: SqlDialect,
    tables: HashMap<String, Option<Vec<String>>>,
    any_table: Option<Option<Vec<String>>>,
    allow_wildcard: bool,
    max_limit: u64,
    max_offset: u64,
    table_functions: Vec<String>,
    functions: FunctionPolicy,
    allow_recursive: bool,
    max_joins: u32,
    max_cross_joins: u32,
}

fn compile_columns(columns: &Columns) -> Option<Vec<String>> {
    match columns {
        Columns::Any => None,
        Columns::List(cols) => Some(cols.iter().map(|c| c.to_lowercase()).collect()),
    }
}

impl Compiled {
    pub(super) fn new(rules: &SqlRules, dialect: SqlDialect) -> Self {
        let default_schema = default_schema(dialect);
        let mut tables = HashMap::new();
        let mut any_table = None;
        for (name, rule) in &rules.tables {
            let cols = compile_columns(&rule.columns);
            if name == "*" {
                any_table = Some(cols);
                continue;
            }
            let lower = name.to_lowercase();
            let key = match lower.split_once('.') {
                Some((schema, table)) if schema == default_schema => table.to_owned(),
                _ => lower,
            };
            tables.insert(key, cols);
        }
        Self {
            dialect,
            tables,
            any_table,
            allow_wildcard: rules.allow_wildcard,
            max_limit: rules.max_limit,
            max_offset: rules.max_offset,
            table_functions: rules
                .table_functions
                .iter()
                .map(|f| f.to_lowercase())
                .collect(),
            functions: FunctionPolicy::new(dialect, &rules.functions),
            allow_recursive: rules.allow_recursive,
            max_joins: rules.max_joins,
            max_cross_joins: rules.max_cross_joins,
        }
    }

    /// An identifier as the database sees it: unquoted names fold to lowercase (SQLite ignores
    /// case even when quoted).
    fn norm(&self, ident: &Ident) -> String {
        if ident.quote_style.is_none() || self.dialect == SqlDialect::Sqlite {
            ident.value.to_lowercase()
        } else {
            ident.value.clone()
        }
    }

    fn name_parts(&self, name: &ObjectName) -> R<Vec<String>> {
        name.0
            .iter()
            .map(|part| match part {
                ObjectNamePart::Identifier(i) => Ok(self.norm(i)),
                ObjectNamePart::Function(_) => Err(unsupported("a computed name")),
            })
            .collect()
    }

    /// `table` or `schema.table`, with the default schema left out.
    pub(super) fn canonical(&self, parts: &[String]) -> R<String> {
        match parts {
            [table] => Ok(table.clone()),
            [schema, table] if schema == default_schema(self.dialect) => Ok(table.clone()),
            [schema, table] => Ok(format!("{schema}.{table}")),
            _ => Err(violation(
                K::Unsupported,
                format!("the name {} has too many parts", parts.join(".")),
                "name tables as `table` or `schema.table`",
            )),
        }
    }

    /// The allowed columns of a table (`None`: all), or why it may not be read.
    pub(super) fn table_rule(&self, canonical: &str) -> R<Option<Vec<String>>> {
        if let Some(cols) = self.tables.get(canonical) {
            return Ok(cols.clone());
        }
        if is_system_catalog(canonical)
            || (self.dialect == SqlDialect::Sqlite && is_sqlite_virtual_table(canonical))
        {
            return Err(violation(
                K::SystemCatalog,
                format!("the system catalog {canonical} is not allowed"),
                format!(
                    "query only the allowed tables ({}); catalogs are readable only when the policy lists them by name",
                    self.allowed_tables()
                ),
            ));
        }
        if let Some(cols) = &self.any_table {
            return Ok(cols.clone());
        }
        Err(violation(
            K::TableNotAllowed,
            format!("the table {canonical} is not allowed"),
            format!("query only the allowed tables: {}", self.allowed_tables()),
        ))
    }

    fn allowed_tables(&self) -> String {
        let mut names: Vec<&str> = self.tables.keys().map(String::as_str).collect();
        names.sort_unstable();
        if names.is_empty() {
            "none are allowed by this rule".to_owned()
        } else {
            names.join(", ")
        }
    }
}

fn default_schema(dialect: SqlDialect) -> &'static str {
    match dialect {
        SqlDialect::Postgres => "public",
        SqlDialect::Sqlite => "main",
    }
}

/// Where the rows of a FROM item come from.
#[derive(Clone, Debug)]
enum Origin {
    /// A real table, with its allowed columns (`None`: all).
    Base {
        table: String,
        columns: Option<Vec<String>>,
    },
    /// A CTE, derived table or table function, with its output columns when known. Its inner
    /// query was checked against the base tables already.
    Virtual { columns: Option<Vec<String>> },
}

/// One FROM item visible in a scope.
#[derive(Clone, Debug)]
struct Source {
    /// The name it is referred to by: its alias, or the table name.
    binding: String,
    /// The canonical table name when it is an unaliased base table (so `schema.table.col` works).
    full: Option<String>,
    origin: Origin,
    /// How large its values and their expressions can be (one for a table; more for a subquery
    /// or CTE that combines values).
    growth: Size,
}

impl Source {
    fn known_columns(&self) -> Option<&Vec<String>> {
        match &self.origin {
            Origin::Base { columns, .. } | Origin::Virtual { columns } => columns.as_ref(),
        }
    }

    fn label(&self) -> String {
        match &self.origin {
            Origin::Base { table, .. } if *table != self.binding => {
                format!("{} ({table})", self.binding)
            }
            _ if self.binding.is_empty() => "a subquery".to_owned(),
            _ => self.binding.clone(),
        }
    }
}

/// The FROM items of one SELECT.
#[derive(Clone, Debug, Default)]
struct Scope {
    sources: Vec<Source>,
}

struct Checker<'r> {
    rules: &'r Compiled,
    /// CTE names visible at each WITH level, innermost last, with their output columns and
    /// value growth.
    ctes: Vec<HashMap<String, CteShape>>,
    tables: BTreeSet<String>,
    columns: BTreeSet<String>,
    /// Greater than zero while a CTE body is checked.
    cte_depth: usize,
    /// Joins without a join condition seen so far, in the whole query.
    cross_joins: u32,
    /// The size of each column reference resolved by the current `check_expr`.
    leaf_growth: Vec<Size>,
    /// The size of the outputs of the query checked last.
    last_growth: Size,
    /// Expression terms of the whole query once PostgreSQL has inlined its CTEs and subqueries.
    expanded_terms: u64,
}

fn rename(
    columns: Option<Vec<String>>,
    alias: Option<&TableAlias>,
    norm: impl Fn(&Ident) -> String,
) -> Option<Vec<String>> {
    let Some(alias) = alias.filter(|a| !a.columns.is_empty()) else {
        return columns;
    };
    let renamed: Vec<String> = alias.columns.iter().map(|c| norm(&c.name)).collect();
    match columns {
        Some(mut cols) => {
            for (slot, name) in cols.iter_mut().zip(renamed) {
                *slot = name;
            }
            Some(cols)
        }
        None => None,
    }
}

fn literal_u64(expr: &Expr) -> Option<u64> {
    match expr {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

fn wildcard_options_are_plain(options: &WildcardAdditionalOptions) -> bool {
    options.opt_ilike.is_none()
        && options.opt_exclude.is_none()
        && options.opt_except.is_none()
        && options.opt_replace.is_none()
        && options.opt_rename.is_none()
}

impl Checker<'_> {
    fn norm(&self, ident: &Ident) -> String {
        self.rules.norm(ident)
    }

    fn lookup_cte(&self, name: &str) -> Option<CteShape> {
        self.ctes
            .iter()
            .rev()
            .find_map(|frame| frame.get(name).cloned())
    }

    fn record(&mut self, table: &str, column: &str) {
        self.columns.insert(format!("{table}.{column}"));
    }

    /// Checks a query in the scope `outer` (innermost last) and returns its output columns
    /// when they are known.
    fn check_query(&mut self, query: &Query, outer: &[&Scope]) -> R<Option<Vec<String>>> {
        let Query {
            with,
            body,
            order_by,
            limit_clause,
            fetch,
            locks,
            for_clause,
            settings,
            format_clause,
            pipe_operators,
        } = query;
        if !locks.is_empty() {
            return Err(violation(
                K::LockingClause,
                "a locking clause (FOR UPDATE / FOR SHARE) is not allowed",
                "remove it; execute_sql only reads and never locks rows",
            ));
        }
        if for_clause.is_some() {
            return Err(unsupported("FOR XML / FOR JSON"));
        }
        if settings.is_some() || format_clause.is_some() {
            return Err(unsupported("SETTINGS / FORMAT"));
        }
        if !pipe_operators.is_empty() {
            return Err(unsupported("the pipe syntax (|>)"));
        }
        if let Some(with) = with {
            if with.recursive && !self.rules.allow_recursive {
                return Err(violation(
                    K::Recursive,
                    "WITH RECURSIVE is not allowed by policy: a recursive query runs until its stop condition holds, and without one until the statement timeout, filling memory and temporary files on the way",
                    "write the query without RECURSIVE (for a range of numbers or dates, GROUP BY date_trunc(...) over the table itself); if it really needs recursion, ask an operator to set sql.allowRecursive on the rule",
                ));
            }
            self.ctes.push(HashMap::new());
            for cte in &with.cte_tables {
                if cte.from.is_some() {
                    return Err(unsupported("CTE ... FROM"));
                }
                let name = self.norm(&cte.alias.name);
                if with.recursive {
                    let declared = (!cte.alias.columns.is_empty()).then(|| {
                        cte.alias
                            .columns
                            .iter()
                            .map(|c| self.norm(&c.name))
                            .collect()
                    });
                    if let Some(frame) = self.ctes.last_mut() {
                        frame.insert(name.clone(), (declared, Size::ONE));
                    }
                }
                self.cte_depth += 1;
                let out = self.check_query(&cte.query, outer);
                self.cte_depth -= 1;
                let out = rename(out?, Some(&cte.alias), |i| self.norm(i));
                let growth = self.last_growth;
                if let Some(frame) = self.ctes.last_mut() {
                    frame.insert(name, (out, growth));
                }
            }
        }
        let (out, body_scope) = self.check_set_expr(body, outer)?;
        let growth = self.last_growth;
        if let Some(order_by) = order_by {
            if order_by.interpolate.is_some() {
                return Err(unsupported("ORDER BY ... INTERPOLATE"));
            }
            let items = match &order_by.kind {
                OrderByKind::Expressions(items) => items,
                OrderByKind::All(_) => return Err(unsupported("ORDER BY ALL")),
            };
            let mut chain: Vec<&Scope> = outer.to_vec();
            if let Some(scope) = &body_scope {
                chain.push(scope);
            }
            for item in items {
                if item.with_fill.is_some() {
                    return Err(unsupported("ORDER BY ... WITH FILL"));
                }
                // A bare name in ORDER BY refers to an output column first.
                if let Expr::Identifier(ident) = &item.expr
                    && out
                        .as_ref()
                        .is_some_and(|cols| cols.contains(&self.norm(ident)))
                {
                    continue;
                }
                self.check_expr(&item.expr, &chain)?;
            }
        }
        if let Some(limit) = limit_clause {
            self.check_expr(limit, outer)?;
        }
        if let Some(fetch) = fetch {
            self.check_expr(fetch, outer)?;
        }
        if with.is_some() {
            self.ctes.pop();
        }
        self.last_growth = growth;
        Ok(out)
    }

    fn check_set_expr(
        &mut self,
        expr: &SetExpr,
        outer: &[&Scope],
    ) -> R<(Option<Vec<String>>, Option<Scope>)> {
        match expr {
            SetExpr::Select(select) => {
                let (out, scope) = self.check_select(select, outer)?;
                Ok((out, Some(scope)))
            }
            SetExpr::Query(query) => Ok((self.check_query(query, outer)?, None)),
            SetExpr::SetOperation { left, right, .. } => {
                let (out, _) = self.check_set_expr(left, outer)?;
                let growth = self.last_growth;
                self.check_set_expr(right, outer)?;
                self.last_growth = self.last_growth.max(growth);
                Ok((out, None))
            }
            SetExpr::Values(values) => {
                let mut width = 0;
                let mut growth = Size::ONE;
                for row in &values.rows {
                    width = width.max(row.len());
                    for expr in row {
                        growth = growth.max(self.check_expr(expr, outer)?);
                    }
                }
                self.last_growth = growth;
                Ok((
                    Some((1..=width).map(|i| format!("column{i}")).collect()),
                    None,
                ))
            }
            SetExpr::Insert(s) | SetExpr::Update(s) | SetExpr::Delete(s) | SetExpr::Merge(s) => {
                let word = s
                    .to_string()
                    .split_whitespace()
                    .next()
                    .unwrap_or("a data-modifying statement")
                    .to_uppercase();
                let (kind, problem) = if self.cte_depth > 0 {
                    (
                        K::DataModifyingCte,
                        format!("a data-modifying CTE ({word} inside WITH) is not allowed"),
                    )
                } else {
                    (K::NotAQuery, format!("{word} statements are not allowed"))
                };
                Err(violation(
                    kind,
                    problem,
                    "CTEs and subqueries must be SELECTs; execute_sql is read-only",
                ))
            }
            SetExpr::Table(table) => Err(violation(
                K::Wildcard,
                format!(
                    "TABLE {} reads every column",
                    table.table_name.as_deref().unwrap_or("…")
                ),
                "use SELECT with the columns you need instead",
            )),
        }
    }

    fn check_select(
        &mut self,
        select: &Select,
        outer: &[&Scope],
    ) -> R<(Option<Vec<String>>, Scope)> {
        let Select {
            select_token: _,
            optimizer_hint,
            distinct,
            select_modifiers,
            top,
            top_before_distinct: _,
            projection,
            exclude,
            into,
            from,
            lateral_views,
            prewhere,
            selection,
            connect_by,
            group_by,
            cluster_by,
            distribute_by,
            sort_by,
            having,
            named_window,
            qualify,
            window_before_qualify: _,
            value_table_mode,
            flavor,
        } = select;
        if let Some(into) = into {
            return Err(violation(
                K::SelectInto,
                format!("SELECT … INTO {} creates a table", into.name),
                "remove INTO; execute_sql only reads and returns the rows to you",
            ));
        }
        if optimizer_hint.is_some()
            || select_modifiers.is_some()
            || top.is_some()
            || exclude.is_some()
            || !lateral_views.is_empty()
            || prewhere.is_some()
            || !connect_by.is_empty()
            || !cluster_by.is_empty()
            || !distribute_by.is_empty()
            || !sort_by.is_empty()
            || qualify.is_some()
            || value_table_mode.is_some()
            || !matches!(flavor, SelectFlavor::Standard)
        {
            return Err(unsupported(
                "this SELECT extension (TOP, QUALIFY, PREWHERE, …)",
            ));
        }
        let mut scope = Scope::default();
        let mut conditions: Vec<(&Expr, Range<usize>)> = Vec::new();
        for (i, item) in from.iter().enumerate() {
            if i > 0 {
                // `FROM a, b`: every row of a with every row of b.
                self.count_cross_join(&format!("FROM …, {}", item.relation))?;
            }
            self.add_table_with_joins(item, &mut scope, outer, &mut conditions)?;
        }
        let joins = scope.sources.len().saturating_sub(1);
        if joins > self.rules.max_joins as usize {
            return Err(violation(
                K::TooManyJoins,
                format!(
                    "the query joins {} relations in one FROM clause, more than the {} the policy allows",
                    joins + 1,
                    self.rules.max_joins + 1
                ),
                "split it into smaller queries, or aggregate in a subquery before joining; an operator can raise the rule's sql.maxJoins",
            ));
        }
        for (condition, visible) in conditions {
            let sides = Scope {
                sources: scope.sources[visible].to_vec(),
            };
            let mut chain: Vec<&Scope> = outer.to_vec();
            chain.push(&sides);
            self.check_expr(condition, &chain)?;
        }
        let mut chain: Vec<&Scope> = outer.to_vec();
        chain.push(&scope);
        let mut out = Some(Vec::new());
        let mut growth = Size::ONE;
        for item in projection {
            match item {
                SelectItem::UnnamedExpr(expr) => {
                    growth = growth.max(self.check_expr(expr, &chain)?);
                    if let Some(cols) = out.as_mut() {
                        cols.push(self.output_name(expr));
                    }
                }
                SelectItem::ExprWithAlias { expr, alias } => {
                    growth = growth.max(self.check_expr(expr, &chain)?);
                    if let Some(cols) = out.as_mut() {
                        cols.push(self.norm(alias));
                    }
                }
                SelectItem::Wildcard(options) => {
                    if !wildcard_options_are_plain(options) {
                        return Err(unsupported("* EXCLUDE / EXCEPT / REPLACE / RENAME"));
                    }
                    let saved = std::mem::take(&mut self.leaf_growth);
                    let expanded = self.check_wildcard(None, &chain);
                    let leaves = std::mem::replace(&mut self.leaf_growth, saved);
                    let expanded = expanded?;
                    growth = leaves.into_iter().fold(growth, Size::max);
                    out = out.zip(expanded).map(|(mut a, b)| {
                        a.extend(b);
                        a
                    });
                }
                SelectItem::QualifiedWildcard(kind, options) => {
                    if !wildcard_options_are_plain(options) {
                        return Err(unsupported("* EXCLUDE / EXCEPT / REPLACE / RENAME"));
                    }
                    let SelectItemQualifiedWildcardKind::ObjectName(name) = kind else {
                        return Err(unsupported("expression.*"));
                    };
                    let saved = std::mem::take(&mut self.leaf_growth);
                    let expanded = self.check_wildcard(Some(name), &chain);
                    let leaves = std::mem::replace(&mut self.leaf_growth, saved);
                    let expanded = expanded?;
                    growth = leaves.into_iter().fold(growth, Size::max);
                    out = out.zip(expanded).map(|(mut a, b)| {
                        a.extend(b);
                        a
                    });
                }
            }
        }
        if let Some(selection) = selection {
            self.check_expr(selection, &chain)?;
        }
        match group_by {
            GroupByExpr::Expressions(exprs, modifiers) => {
                if !modifiers.is_empty() {
                    return Err(unsupported("GROUP BY … WITH ROLLUP/CUBE/TOTALS"));
                }
                for expr in exprs {
                    self.check_expr(expr, &chain)?;
                }
            }
            GroupByExpr::All(_) => return Err(unsupported("GROUP BY ALL")),
        }
        if let Some(having) = having {
            self.check_expr(having, &chain)?;
        }
        if let Some(Distinct::On(exprs)) = distinct {
            for expr in exprs {
                self.check_expr(expr, &chain)?;
            }
        }
        for window in named_window {
            self.check_expr(window, &chain)?;
        }
        drop(chain);
        self.last_growth = growth;
        Ok((out, scope))
    }

    fn output_name(&self, expr: &Expr) -> String {
        match expr {
            Expr::Identifier(i) => self.norm(i),
            Expr::CompoundIdentifier(parts) => parts
                .last()
                .map_or_else(|| "?column?".to_owned(), |i| self.norm(i)),
            Expr::Function(f) => {
                last_name_part(&f.name).map_or_else(|| "?column?".to_owned(), |i| self.norm(i))
            }
            Expr::Cast { expr, .. } | Expr::Nested(expr) => self.output_name(expr),
            _ => "?column?".to_owned(),
        }
    }

    fn add_table_with_joins<'a>(
        &mut self,
        item: &'a TableWithJoins,
        scope: &mut Scope,
        outer: &[&Scope],
        conditions: &mut Vec<(&'a Expr, Range<usize>)>,
    ) -> R<()> {
        let start = scope.sources.len();
        self.add_factor(&item.relation, scope, outer, conditions)?;
        for join in &item.joins {
            let left_end = scope.sources.len();
            self.add_factor(&join.relation, scope, outer, conditions)?;
            let constraint = match &join.join_operator {
                JoinOperator::Join(c)
                | JoinOperator::Inner(c)
                | JoinOperator::Left(c)
                | JoinOperator::LeftOuter(c)
                | JoinOperator::Right(c)
                | JoinOperator::RightOuter(c)
                | JoinOperator::FullOuter(c)
                | JoinOperator::CrossJoin(c) => c,
                other => {
                    return Err(unsupported(
                        format!("the join `{other:?}`").replace('\n', " "),
                    ));
                }
            };
            match constraint {
                // An ON condition sees only the two sides of its join (and enclosing queries),
                // not the FROM items joined after it or listed before it with a comma.
                JoinConstraint::On(expr) if !refers_to_columns(expr, self.rules.dialect) => {
                    self.count_cross_join(&format!("JOIN {} ON {expr}", join.relation))?;
                    conditions.push((expr, start..scope.sources.len()));
                }
                JoinConstraint::On(expr) => conditions.push((expr, start..scope.sources.len())),
                JoinConstraint::Using(names) => {
                    let left = Scope {
                        sources: scope.sources[start..left_end].to_vec(),
                    };
                    let right = Scope {
                        sources: scope.sources[left_end..].to_vec(),
                    };
                    for name in names {
                        let parts = self.rules.name_parts(name)?;
                        let [column] = parts.as_slice() else {
                            return Err(unsupported("a qualified name in USING"));
                        };
                        self.resolve_unqualified(column, &[&left])?;
                        self.resolve_unqualified(column, &[&right])?;
                    }
                }
                JoinConstraint::Natural => {
                    return Err(violation(
                        K::Unsupported,
                        "NATURAL JOIN is not allowed: it compares columns implicitly, including ones the policy may not allow",
                        "join with JOIN … ON and name the allowed columns",
                    ));
                }
                JoinConstraint::None => {
                    self.count_cross_join(&format!("CROSS JOIN {}", join.relation))?;
                }
            }
        }
        Ok(())
    }

    /// Counts one join without a join condition (`what`, for the message) against the rule.
    fn count_cross_join(&mut self, what: &str) -> R<()> {
        self.cross_joins += 1;
        if self.cross_joins > self.rules.max_cross_joins {
            return Err(violation(
                K::TooManyJoins,
                format!(
                    "the query has {} joins without a join condition (the last: {}), more than the {} the policy allows: each one multiplies the rows the database must produce",
                    self.cross_joins,
                    what.chars().take(80).collect::<String>(),
                    self.rules.max_cross_joins
                ),
                "join with JOIN … ON a condition that relates the tables (e.g. JOIN accounts a ON a.id = l.account) instead of FROM a, b or CROSS JOIN; an operator can raise the rule's sql.maxCrossJoins",
            ));
        }
        Ok(())
    }

    fn table_function(&self, name: &ObjectName) -> R<String> {
        check_denied_name(name)?;
        let fname = last_name_part(name)
            .map(|i| i.value.to_lowercase())
            .unwrap_or_default();
        let parts = self.rules.name_parts(name)?;
        // Unqualified (or pg_catalog.) names match a listed name; a function of another schema
        // only when listed as schema.name.
        let listed = match parts.as_slice() {
            [_] => self.rules.table_functions.contains(&fname),
            [schema, _] if schema == "pg_catalog" && self.rules.dialect == SqlDialect::Postgres => {
                self.rules.table_functions.contains(&fname)
            }
            _ => self
                .rules
                .table_functions
                .contains(&parts.join(".").to_lowercase()),
        };
        if listed {
            Ok(fname)
        } else {
            Err(violation(
                K::TableFunction,
                format!("the table function {fname}() in FROM is not allowed"),
                format!(
                    "read from an allowed table instead ({})",
                    self.rules.allowed_tables()
                ),
            ))
        }
    }

    fn add_virtual(
        &self,
        scope: &mut Scope,
        binding: String,
        alias: Option<&TableAlias>,
        columns: Option<Vec<String>>,
        growth: Size,
    ) {
        let binding = alias.map_or(binding, |a| self.norm(&a.name));
        let columns = rename(columns, alias, |i| self.norm(i));
        scope.sources.push(Source {
            binding,
            full: None,
            origin: Origin::Virtual { columns },
            growth,
        });
    }

    fn add_factor<'a>(
        &mut self,
        factor: &'a TableFactor,
        scope: &mut Scope,
        outer: &[&Scope],
        conditions: &mut Vec<(&'a Expr, Range<usize>)>,
    ) -> R<()> {
        // Functions in FROM and LATERAL subqueries see the FROM items before them.
        let snapshot = scope.clone();
        let mut lateral: Vec<&Scope> = outer.to_vec();
        lateral.push(&snapshot);
        match factor {
            TableFactor::Table {
                name,
                alias,
                args,
                with_hints,
                version,
                with_ordinality,
                partitions,
                json_path,
                sample,
                index_hints,
            } => {
                if !with_hints.is_empty()
                    || version.is_some()
                    || !partitions.is_empty()
                    || json_path.is_some()
                    || sample.is_some()
                    || !index_hints.is_empty()
                {
                    return Err(unsupported(format!("this form of FROM item ({factor})")));
                }
                if let Some(args) = args {
                    let fname = self.table_function(name)?;
                    self.check_expr(args, &lateral)?;
                    self.add_virtual(scope, fname, alias.as_ref(), None, Size::ONE);
                    return Ok(());
                }
                if *with_ordinality {
                    return Err(unsupported("WITH ORDINALITY on a table"));
                }
                // `FROM ONLY ledger` reads ledger (without inheritance children), but parses as
                // a table named `only` aliased `ledger`.
                if let [ObjectNamePart::Identifier(first)] = name.0.as_slice()
                    && first.quote_style.is_none()
                    && first.value.eq_ignore_ascii_case("only")
                {
                    return Err(unsupported("FROM ONLY"));
                }
                let parts = self.rules.name_parts(name)?;
                if let [single] = parts.as_slice()
                    && let Some((columns, growth)) = self.lookup_cte(single)
                {
                    self.add_virtual(scope, single.clone(), alias.as_ref(), columns, growth);
                    return Ok(());
                }
                let canonical = self.rules.canonical(&parts)?;
                let columns = self.rules.table_rule(&canonical)?;
                if alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
                    return Err(violation(
                        K::Unsupported,
                        format!(
                            "column aliases on the table {canonical} rename its columns by position"
                        ),
                        "alias columns in the select list instead, e.g. SELECT t.id AS a",
                    ));
                }
                self.tables.insert(canonical.clone());
                let (binding, full) = match alias {
                    Some(a) => (self.norm(&a.name), None),
                    None => (
                        parts.last().cloned().unwrap_or_default(),
                        Some(canonical.clone()),
                    ),
                };
                scope.sources.push(Source {
                    binding,
                    full,
                    origin: Origin::Base {
                        table: canonical,
                        columns,
                    },
                    growth: Size::ONE,
                });
            }
            TableFactor::Derived {
                lateral: is_lateral,
                subquery,
                alias,
                sample,
            } => {
                if sample.is_some() {
                    return Err(unsupported("TABLESAMPLE"));
                }
                let out = if *is_lateral {
                    self.check_query(subquery, &lateral)?
                } else {
                    self.check_query(subquery, outer)?
                };
                let growth = self.last_growth;
                self.add_virtual(scope, String::new(), alias.as_ref(), out, growth);
            }
            TableFactor::TableFunction { expr, alias } => {
                let Expr::Function(f) = expr else {
                    return Err(unsupported("TABLE(expression)"));
                };
                let fname = self.table_function(&f.name)?;
                self.check_expr(expr, &lateral)?;
                self.add_virtual(scope, fname, alias.as_ref(), None, Size::ONE);
            }
            TableFactor::Function {
                lateral: _,
                name,
                args,
                alias,
            } => {
                let fname = self.table_function(name)?;
                self.check_expr(args, &lateral)?;
                self.add_virtual(scope, fname, alias.as_ref(), None, Size::ONE);
            }
            TableFactor::UNNEST {
                alias,
                array_exprs,
                with_offset,
                with_offset_alias,
                with_ordinality: _,
            } => {
                if *with_offset || with_offset_alias.is_some() {
                    return Err(unsupported("UNNEST … WITH OFFSET"));
                }
                if !self.rules.table_functions.iter().any(|f| f == "unnest") {
                    return Err(violation(
                        K::TableFunction,
                        "the table function unnest() in FROM is not allowed",
                        format!(
                            "read from an allowed table instead ({})",
                            self.rules.allowed_tables()
                        ),
                    ));
                }
                self.check_expr(array_exprs, &lateral)?;
                self.add_virtual(scope, "unnest".to_owned(), alias.as_ref(), None, Size::ONE);
            }
            TableFactor::NestedJoin {
                table_with_joins,
                alias,
            } => {
                if alias.is_some() {
                    return Err(unsupported("an alias on a parenthesized join"));
                }
                drop(lateral);
                self.add_table_with_joins(table_with_joins, scope, outer, conditions)?;
            }
            other => {
                return Err(unsupported(format!(
                    "the FROM item `{}`",
                    other.to_string().chars().take(40).collect::<String>()
                )));
            }
        }
        Ok(())
    }

    /// Checks every column reference, wildcard and subquery in `node` against the scopes in
    /// `chain` (innermost last), and returns how many times larger than the largest value it
    /// reads its value can be ([`MAX_VALUE_GROWTH`] at most).
    fn check_expr<N: Visit>(&mut self, node: &N, chain: &[&Scope]) -> R<Size> {
        let saved = std::mem::take(&mut self.leaf_growth);
        let checked = self.check_expr_refs(node, chain);
        let leaves = std::mem::replace(&mut self.leaf_growth, saved);
        let collector = checked?;
        let growth = if collector.combines {
            leaves
                .iter()
                .fold(collector.literals, |a, b| a.saturating_add(b.growth))
        } else {
            leaves.iter().map(|l| l.growth).max().unwrap_or(1)
        }
        .max(1);
        let terms = leaves
            .iter()
            .fold(collector.literals.saturating_add(1), |a, b| {
                a.saturating_add(b.terms)
            });
        self.expanded_terms = self.expanded_terms.saturating_add(terms);
        if self.expanded_terms > MAX_EXPANDED_TERMS {
            return Err(violation(
                K::ValueGrowth,
                format!(
                    "the query refers to the results of its subqueries or CTEs so often that, once the database substitutes them, it has more than {MAX_EXPANDED_TERMS} terms"
                ),
                "refer to each column of a subquery or CTE once or twice, not in every level again (e.g. not SELECT greatest(x, x) FROM a level that already did the same)",
            ));
        }
        if growth > MAX_VALUE_GROWTH {
            return Err(violation(
                K::ValueGrowth,
                format!(
                    "the query can build values up to {growth} times larger than the largest value it reads, more than the {MAX_VALUE_GROWTH} allowed: it combines (||, concat, ROW, ARRAY) values that subqueries or CTEs already combined"
                ),
                "combine columns once, over the tables themselves, instead of concatenating the results of subqueries or CTEs again",
            ));
        }
        Ok(Size { growth, terms })
    }

    fn check_expr_refs<N: Visit>(&mut self, node: &N, chain: &[&Scope]) -> R<Collector> {
        let mut collector = Collector {
            dialect: self.rules.dialect,
            ..Collector::default()
        };
        if let ControlFlow::Break(v) = node.visit(&mut collector) {
            return Err(v);
        }
        for reference in &collector.refs {
            match reference {
                Reference::Path(path) => self.resolve(path, chain)?,
                Reference::Field { root, field } => self.resolve_field(root, field, chain)?,
                Reference::WildcardField { table, field } => {
                    let parts = self.rules.name_parts(table)?;
                    let source = self.find_source(&parts, chain)?.clone();
                    self.known_field(&source, field)?;
                }
            }
        }
        for wildcard in &collector.wildcards {
            self.check_wildcard(wildcard.as_ref(), chain)?;
        }
        for query in &collector.subqueries {
            self.check_query(query, chain)?;
            self.leaf_growth.push(self.last_growth);
        }
        Ok(collector)
    }

    fn find_source<'s>(&self, qualifier: &[String], chain: &[&'s Scope]) -> R<&'s Source> {
        let found = match qualifier {
            [binding] => chain
                .iter()
                .rev()
                .find_map(|s| s.sources.iter().find(|src| src.binding == *binding)),
            [_, _] => {
                let canonical = self.rules.canonical(qualifier)?;
                chain.iter().rev().find_map(|s| {
                    s.sources
                        .iter()
                        .find(|src| src.full.as_deref() == Some(canonical.as_str()))
                })
            }
            _ => {
                return Err(unsupported(format!(
                    "the reference {}",
                    qualifier.join(".")
                )));
            }
        };
        found.ok_or_else(|| {
            violation(
                K::UnknownColumn,
                format!(
                    "{} is not a table or alias in the FROM clause",
                    qualifier.join(".")
                ),
                format!("tables in scope: {}", in_scope(chain)),
            )
        })
    }

    /// Whether some FROM item in scope with known columns has `column` (then PostgreSQL reads
    /// a bare name as that column, never as a whole row).
    fn listed_anywhere(column: &str, chain: &[&Scope]) -> bool {
        chain.iter().any(|scope| {
            scope.sources.iter().any(|s| {
                s.known_columns()
                    .is_some_and(|cols| cols.iter().any(|c| c == column))
            })
        })
    }

    /// A FROM item in scope named `binding`, innermost first.
    fn binding<'s>(binding: &str, chain: &[&'s Scope]) -> Option<&'s Source> {
        chain
            .iter()
            .rev()
            .find_map(|s| s.sources.iter().find(|src| src.binding == binding))
    }

    /// A bare name that is no column in scope but the name of a FROM item: PostgreSQL reads
    /// it as the whole row of that item, every column of it.
    fn whole_row(&mut self, name: &str, source: &Source, chain: &[&Scope]) -> R<()> {
        let restricted = |s: &Source| {
            matches!(
                s.origin,
                Origin::Base {
                    columns: Some(_),
                    ..
                }
            )
        };
        if let Origin::Base {
            table,
            columns: Some(cols),
        } = &source.origin
        {
            return Err(violation(
                K::ColumnNotAllowed,
                format!(
                    "{name} names the table {table} as a whole row, which reads every column of it, including ones that are not allowed"
                ),
                format!(
                    "select the allowed columns by name, e.g. {}",
                    cols.iter()
                        .take(4)
                        .map(|c| format!("{name}.{c}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        // A column of a table whose columns are restricted takes precedence over the whole
        // row, and may be any name: it must be qualified.
        if let Some(risk) = chain
            .iter()
            .flat_map(|s| s.sources.iter())
            .find(|s| restricted(s))
        {
            return Err(violation(
                K::AmbiguousColumn,
                format!(
                    "{name} is ambiguous: it could be a column of {} or the whole row of {}",
                    risk.label(),
                    source.label()
                ),
                format!("name the columns you need, e.g. {}.column", source.binding),
            ));
        }
        if let Origin::Base { table, .. } = &source.origin {
            let table = table.clone();
            self.record(&table, "*");
        }
        let width = source.known_columns().map_or(1, |c| c.len().max(1)) as u64;
        self.leaf_growth.push(source.growth.scaled(width));
        Ok(())
    }

    /// `(root).field`.
    /// `(t).c`: the column c of the FROM item t, when t is no column in scope and its columns
    /// are known and include c. Anything else is refused: a field selection on a value is a
    /// function call in PostgreSQL unless the value is a row.
    fn resolve_field(&mut self, root: &[Ident], field: &Ident, chain: &[&Scope]) -> R<()> {
        let parts: Vec<String> = root.iter().map(|i| self.norm(i)).collect();
        let [name] = parts.as_slice() else {
            return Err(field_call(field));
        };
        if Self::listed_anywhere(name, chain) {
            return Err(field_call(field));
        }
        let Some(source) = Self::binding(name, chain).cloned() else {
            return Err(field_call(field));
        };
        // Some table with restricted columns could have a column named t.
        if let Some(risk) = chain.iter().flat_map(|s| s.sources.iter()).find(|s| {
            matches!(
                s.origin,
                Origin::Base {
                    columns: Some(_),
                    ..
                }
            )
        }) {
            return Err(violation(
                K::AmbiguousColumn,
                format!(
                    "({name}).{} is ambiguous: {name} could be a column of {} or the whole row of {}",
                    field.value,
                    risk.label(),
                    source.label()
                ),
                format!("write {name}.{} instead", field.value),
            ));
        }
        self.known_field(&source, field)
    }

    /// The column `field` of `source`, which must be one of its known columns.
    fn known_field(&mut self, source: &Source, field: &Ident) -> R<()> {
        let column = self.norm(field);
        match source.known_columns() {
            Some(cols) if cols.contains(&column) => self.check_column(source, &column),
            // A restricted table: the usual message about its allowed columns.
            Some(_) if matches!(source.origin, Origin::Base { .. }) => {
                self.check_column(source, &column)
            }
            _ => Err(field_call(field)),
        }
    }

    fn resolve(&mut self, reference: &[Ident], chain: &[&Scope]) -> R<()> {
        let parts: Vec<String> = reference.iter().map(|i| self.norm(i)).collect();
        match parts.as_slice() {
            [] => Ok(()),
            [column] => {
                if !Self::listed_anywhere(column, chain)
                    && let Some(source) = Self::binding(column, chain).cloned()
                {
                    return self.whole_row(column, &source, chain);
                }
                self.resolve_unqualified(column, chain)
            }
            [qualifier @ .., column] => {
                let source = self.find_source(qualifier, chain)?.clone();
                self.check_column(&source, column)
            }
        }
    }

    fn check_column(&mut self, source: &Source, column: &str) -> R<()> {
        self.leaf_growth.push(source.growth);
        match &source.origin {
            Origin::Base {
                table,
                columns: None,
            } => {
                // `t.f` where t has no column f calls f(t) in PostgreSQL (attribute notation):
                // never a hard-denied function.
                if let Some(why) = denied_function(column) {
                    return Err(denied(column, why));
                }
                self.record(table, column);
                Ok(())
            }
            Origin::Base {
                table,
                columns: Some(allowed),
            } => {
                if allowed.iter().any(|c| c == column) {
                    self.record(table, column);
                    Ok(())
                } else {
                    Err(violation(
                        K::ColumnNotAllowed,
                        format!("the column {column} of table {table} is not allowed"),
                        format!(
                            "use only the allowed columns of {table}: {}",
                            allowed.join(", ")
                        ),
                    ))
                }
            }
            Origin::Virtual {
                columns: Some(cols),
            } => {
                if cols.iter().any(|c| c == column) {
                    Ok(())
                } else {
                    Err(violation(
                        K::UnknownColumn,
                        format!("{} has no column {column}", source.label()),
                        format!("its columns are: {}", cols.join(", ")),
                    ))
                }
            }
            Origin::Virtual { columns: None } => {
                // As for tables: `f.x` may be the call x(f) (attribute notation).
                if let Some(why) = denied_function(column) {
                    return Err(denied(column, why));
                }
                Ok(())
            }
        }
    }

    /// Resolves an unqualified column like the database would, refusing whenever it could land
    /// on a column the policy does not allow.
    fn resolve_unqualified(&mut self, column: &str, chain: &[&Scope]) -> R<()> {
        for (level, scope) in chain.iter().enumerate().rev() {
            let listing: Vec<&Source> = scope
                .sources
                .iter()
                .filter(|s| {
                    s.known_columns()
                        .is_some_and(|c| c.iter().any(|c| c == column))
                })
                .collect();
            match listing.as_slice() {
                [one] => {
                    let one = (*one).clone();
                    return self.check_column(&one, column);
                }
                [a, b, ..] => {
                    return Err(violation(
                        K::AmbiguousColumn,
                        format!(
                            "the column {column} is ambiguous: it may belong to {} or {}",
                            a.label(),
                            b.label()
                        ),
                        format!("qualify it, e.g. {}.{column}", a.binding),
                    ));
                }
                [] => {}
            }
            let hidden: Vec<&Source> = scope
                .sources
                .iter()
                .filter(|s| {
                    matches!(
                        s.origin,
                        Origin::Base {
                            columns: Some(_),
                            ..
                        }
                    )
                })
                .collect();
            let open: Vec<&Source> = scope
                .sources
                .iter()
                .filter(|s| s.known_columns().is_none())
                .collect();
            if let Some(first) = hidden.first() {
                if open.is_empty() && hidden.len() == 1 {
                    let first = (*first).clone();
                    return self.check_column(&first, column);
                }
                if let Some(candidate) = open.first() {
                    return Err(violation(
                        K::AmbiguousColumn,
                        format!(
                            "the column {column} is not allowed on {} and could resolve to it",
                            first.label()
                        ),
                        format!(
                            "qualify it with the table it belongs to, e.g. {}.{column}",
                            candidate.binding
                        ),
                    ));
                }
                let allowed: Vec<String> = hidden
                    .iter()
                    .map(|s| {
                        format!(
                            "{}: {}",
                            s.label(),
                            s.known_columns().map(|c| c.join(", ")).unwrap_or_default()
                        )
                    })
                    .collect();
                return Err(violation(
                    K::ColumnNotAllowed,
                    format!("the column {column} is not allowed on any table in scope"),
                    format!("use only the allowed columns ({})", allowed.join("; ")),
                ));
            }
            if let Some(candidate) = open.first() {
                // It resolves here if that source has it, otherwise in an enclosing query: make
                // sure no enclosing table could expose a column the policy does not allow.
                for outer in &chain[..level] {
                    if let Some(risk) = outer.sources.iter().find(|s| {
                        matches!(&s.origin, Origin::Base { columns: Some(c), .. } if !c.iter().any(|c| c == column))
                    }) {
                        return Err(violation(
                            K::AmbiguousColumn,
                            format!(
                                "the column {column} could resolve to {} of the enclosing query, where it is not allowed",
                                risk.label()
                            ),
                            format!("qualify it, e.g. {}.{column}", candidate.binding),
                        ));
                    }
                }
                let growth = open.iter().map(|s| s.growth).fold(Size::ONE, Size::max);
                self.leaf_growth.push(growth);
                if open.len() == 1
                    && let Origin::Base { table, .. } = &candidate.origin
                {
                    let table = table.clone();
                    self.record(&table, column);
                }
                return Ok(());
            }
        }
        Err(violation(
            K::UnknownColumn,
            format!("{column} is not a column of any table in scope"),
            if chain.iter().all(|s| s.sources.is_empty()) {
                "select from an allowed table; write string literals in single quotes".to_owned()
            } else {
                format!("tables in scope: {}", in_scope(chain))
            },
        ))
    }

    /// Checks `*` (qualifier `None`) or `t.*` and returns the columns it expands to, when known.
    fn check_wildcard(
        &mut self,
        qualifier: Option<&ObjectName>,
        chain: &[&Scope],
    ) -> R<Option<Vec<String>>> {
        let targets: Vec<Source> = match qualifier {
            None => chain.last().map(|s| s.sources.clone()).unwrap_or_default(),
            Some(name) => {
                let parts = self.rules.name_parts(name)?;
                vec![self.find_source(&parts, chain)?.clone()]
            }
        };
        let star = qualifier.map_or_else(|| "*".to_owned(), |q| format!("{q}.*"));
        let example = targets.iter().find_map(|s| match &s.origin {
            Origin::Base {
                table,
                columns: Some(cols),
            } => Some(format!(
                "SELECT {} FROM {table}",
                cols.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
            )),
            _ => None,
        });
        if !self.rules.allow_wildcard {
            return Err(violation(
                K::Wildcard,
                format!("SELECT {star} is not allowed"),
                match example {
                    Some(e) => format!("list the columns you need, e.g. {e}"),
                    None => "list the columns you need instead of *".to_owned(),
                },
            ));
        }
        let mut expanded = Some(Vec::new());
        for target in &targets {
            let width = target.known_columns().map_or(1, |c| c.len().max(1)) as u64;
            self.leaf_growth.push(target.growth.scaled(width));
            match &target.origin {
                Origin::Base {
                    table,
                    columns: Some(cols),
                } => {
                    return Err(violation(
                        K::Wildcard,
                        format!("SELECT {star} would read columns of {table} that are not allowed"),
                        format!("list the allowed columns instead: {}", cols.join(", ")),
                    ));
                }
                Origin::Base {
                    table,
                    columns: None,
                } => {
                    let table = table.clone();
                    self.record(&table, "*");
                    expanded = None;
                }
                Origin::Virtual { columns } => {
                    expanded = expanded.zip(columns.clone()).map(|(mut a, b)| {
                        a.extend(b);
                        a
                    });
                }
            }
        }
        Ok(expanded)
    }
}

/// Whether an expression refers to any column (a join condition that does not is no condition).
fn refers_to_columns(expr: &Expr, dialect: SqlDialect) -> bool {
    struct Finder(SqlDialect);
    impl Visitor for Finder {
        type Break = ();
        fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
            match expr {
                Expr::Identifier(i) if value_function(i, self.0).is_none() => {
                    ControlFlow::Break(())
                }
                Expr::CompoundIdentifier(_) | Expr::CompoundFieldAccess { .. } => {
                    ControlFlow::Break(())
                }
                _ => ControlFlow::Continue(()),
            }
        }
    }
    expr.visit(&mut Finder(dialect)).is_break()
}

fn in_scope(chain: &[&Scope]) -> String {
    let names: Vec<String> = chain
        .iter()
        .rev()
        .flat_map(|s| s.sources.iter().map(Source::label))
        .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// How large the values of an expression or a FROM item can be, and how large the expression
/// becomes once the database substitutes the subqueries and CTEs it refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Size {
    /// How many times larger than the largest value read (see [`MAX_VALUE_GROWTH`]).
    growth: u64,
    /// Terms (column references and literals) after substitution.
    terms: u64,
}

impl Size {
    const ONE: Size = Size {
        growth: 1,
        terms: 1,
    };

    fn max(self, other: Size) -> Size {
        Size {
            growth: self.growth.max(other.growth),
            terms: self.terms.max(other.terms),
        }
    }

    fn scaled(self, n: u64) -> Size {
        Size {
            growth: self.growth.saturating_mul(n),
            terms: self.terms.saturating_mul(n),
        }
    }
}

/// A CTE's output columns (when known) and the size of its values.
type CteShape = (Option<Vec<String>>, Size);

/// Most terms a query may have once the database has substituted its subqueries and CTEs:
/// referring to a column of a CTE twice at every level doubles the planner's work with every
/// level, and PostgreSQL does not interrupt planning for the statement timeout.
const MAX_EXPANDED_TERMS: u64 = 50_000;

/// Default-allowlisted functions whose result holds all their arguments (the others return at
/// most about as much as their largest argument).
const COMBINING_FUNCTIONS: &[&str] = &["concat", "concat_ws", "overlay", "row", "char"];

/// One column reference, as PostgreSQL reads it.
enum Reference {
    /// `c`, `t.c`, `s.t.c`, also when followed by subscripts or field selections
    /// (`t.c[1]`, `t.c[1].f`): the name resolves first, what follows works on its value.
    Path(Vec<Ident>),
    /// `(root).field`: a field of the value `root` names, a column or a whole row.
    Field { root: Vec<Ident>, field: Ident },
    /// `(t.*).field`: the column `field` of `t`.
    WildcardField { table: ObjectName, field: Ident },
}

impl Collector {
    /// `root` followed by `.field` and `[subscript]` accesses. The names that belong to the
    /// reference (`u.secret` in `u.secret[1]`) are taken out of the walk, so they are never
    /// resolved on their own as unrelated columns; subscript expressions are walked as usual.
    fn field_access(&mut self, root: &Expr, chain: &[AccessExpr]) -> ControlFlow<GuardViolation> {
        let mut rest = chain;
        match root {
            Expr::Identifier(_) | Expr::CompoundIdentifier(_) => {
                let mut path = match root {
                    Expr::Identifier(i) => vec![i.clone()],
                    Expr::CompoundIdentifier(parts) => parts.clone(),
                    _ => Vec::new(),
                };
                while let Some((AccessExpr::Dot(dot @ Expr::Identifier(field)), tail)) =
                    rest.split_first()
                {
                    path.push(field.clone());
                    self.skip.push(dot as *const Expr);
                    rest = tail;
                }
                self.skip.push(root as *const Expr);
                self.refs.push(Reference::Path(path));
            }
            Expr::Nested(inner) => {
                if let Some((AccessExpr::Dot(dot @ Expr::Identifier(field)), tail)) =
                    rest.split_first()
                {
                    match inner.as_ref() {
                        Expr::Identifier(i) => {
                            self.refs.push(Reference::Field {
                                root: vec![i.clone()],
                                field: field.clone(),
                            });
                        }
                        Expr::QualifiedWildcard(table, _) => {
                            self.refs.push(Reference::WildcardField {
                                table: table.clone(),
                                field: field.clone(),
                            });
                        }
                        _ => return ControlFlow::Break(field_call(field)),
                    }
                    self.skip.push(inner.as_ref() as *const Expr);
                    self.skip.push(dot as *const Expr);
                    rest = tail;
                }
            }
            _ => {}
        }
        // After the column: subscripts only. A field selection `.f` on a value is a call of
        // f(value) in PostgreSQL whenever the value is not of a composite type (attribute
        // notation: `(x).current_setting`, `('SELECT …'::text).ts_stat`).
        for access in rest {
            match access {
                AccessExpr::Subscript(_) => {}
                AccessExpr::Dot(Expr::Identifier(field)) => {
                    return ControlFlow::Break(field_call(field));
                }
                AccessExpr::Dot(other) => {
                    return ControlFlow::Break(unsupported(format!("the field access .{other}")));
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// A field selection the guard cannot tell from a function call.
fn field_call(field: &Ident) -> GuardViolation {
    violation(
        K::Unsupported,
        format!(
            "the field selection .{0} is not allowed: PostgreSQL reads (value).{0} as the call {0}(value) unless the value is a row",
            field.value
        ),
        format!(
            "select columns as table.column (e.g. t.{}), and call functions as name(argument)",
            field.value
        ),
    )
}

/// Collects what an expression refers to at its own level: column references, wildcards, and
/// the subqueries (checked separately, in their own scope).
#[derive(Default)]
struct Collector {
    /// How names are read (`user` is a function in PostgreSQL, a name in SQLite).
    dialect: SqlDialect,
    depth: usize,
    refs: Vec<Reference>,
    wildcards: Vec<Option<ObjectName>>,
    subqueries: Vec<Query>,
    /// Expressions that name a function argument, not a column.
    skip: Vec<*const Expr>,
    /// Whether the expression puts several values into one (`||`, `concat`, `ROW`, `ARRAY`,
    /// a function the default allowlist does not know): its size is then the sum of theirs.
    combines: bool,
    /// Literals at this level (each as large as the query allows).
    literals: u64,
}

impl Visitor for Collector {
    type Break = GuardViolation;

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<GuardViolation> {
        if self.depth == 0 {
            self.subqueries.push(query.clone());
        }
        self.depth += 1;
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _: &Query) -> ControlFlow<GuardViolation> {
        self.depth -= 1;
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<GuardViolation> {
        if self.depth > 0 || self.skip.iter().any(|p| std::ptr::eq(*p, expr)) {
            return ControlFlow::Continue(());
        }
        match expr {
            // `current_user` and friends are calls, checked by the scan.
            Expr::Identifier(ident) if value_function(ident, self.dialect).is_some() => {}
            Expr::Identifier(ident) => self.refs.push(Reference::Path(vec![ident.clone()])),
            Expr::CompoundIdentifier(parts) => self.refs.push(Reference::Path(parts.clone())),
            Expr::CompoundFieldAccess { root, access_chain } => {
                self.field_access(root, access_chain)?;
            }
            Expr::Wildcard(_) => self.wildcards.push(None),
            Expr::QualifiedWildcard(name, _) => self.wildcards.push(Some(name.clone())),
            Expr::Value(_) => self.literals += 1,
            Expr::BinaryOp {
                op: BinaryOperator::StringConcat,
                ..
            }
            | Expr::Array(_)
            | Expr::Tuple(_)
            | Expr::Overlay { .. } => self.combines = true,
            Expr::Function(f) => {
                let name = last_name_part(&f.name)
                    .map(|n| n.value.to_lowercase())
                    .unwrap_or_default();
                if COMBINING_FUNCTIONS.contains(&name.as_str())
                    || ![SqlDialect::Postgres, SqlDialect::Sqlite]
                        .iter()
                        .any(|d| default_functions(*d).contains(&name.as_str()))
                {
                    self.combines = true;
                }
                let is_count = name == "count";
                if let FunctionArguments::List(list) = &f.args {
                    for arg in &list.args {
                        let value = match arg {
                            FunctionArg::Unnamed(value) | FunctionArg::Named { arg: value, .. } => {
                                value
                            }
                            FunctionArg::ExprNamed {
                                name, arg: value, ..
                            } => {
                                self.skip.push(name as *const Expr);
                                value
                            }
                        };
                        match value {
                            FunctionArgExpr::QualifiedWildcard(name) => {
                                self.wildcards.push(Some(name.clone()));
                            }
                            FunctionArgExpr::Wildcard if !is_count => self.wildcards.push(None),
                            _ => {}
                        }
                    }
                }
            }
            Expr::Lambda(_) => {
                return ControlFlow::Break(unsupported("a lambda expression"));
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// Adds or lowers the LIMIT of the top-level query and checks its OFFSET; returns the LIMIT.
fn cap_limit(query: &mut Query, rules: &Compiled) -> R<u64> {
    let cap = rules.max_limit;
    let mut requested: Option<u64> = None;
    let mut asked = |value: Option<u64>| {
        if let Some(v) = value {
            requested = Some(requested.map_or(v, |r| r.min(v)));
        }
    };
    if let Some(fetch) = query.fetch.take() {
        if fetch.with_ties || fetch.percent {
            return Err(violation(
                K::Limit,
                "FETCH … PERCENT / WITH TIES cannot be capped",
                format!("use LIMIT n (at most {cap}) instead"),
            ));
        }
        asked(fetch.quantity.as_ref().and_then(literal_u64));
    }
    let mut offset = None;
    match query.limit_clause.take() {
        None => {}
        Some(LimitClause::LimitOffset {
            limit,
            offset: o,
            limit_by,
        }) => {
            if !limit_by.is_empty() {
                return Err(unsupported("LIMIT … BY"));
            }
            asked(limit.as_ref().and_then(literal_u64));
            offset = o;
        }
        Some(LimitClause::OffsetCommaLimit { offset: o, limit }) => {
            asked(literal_u64(&limit));
            offset = Some(Offset {
                value: o,
                rows: OffsetRows::None,
            });
        }
    }
    let limit = requested.map_or(cap, |r| r.min(cap));
    if let Some(o) = &offset {
        match literal_u64(&o.value) {
            Some(n) if n <= rules.max_offset => {}
            Some(n) => {
                return Err(violation(
                    K::Offset,
                    format!("OFFSET {n} is larger than the {} allowed", rules.max_offset),
                    "narrow the query with WHERE instead of paging this deep",
                ));
            }
            None => {
                return Err(violation(
                    K::Offset,
                    format!("OFFSET {} is not a whole-number literal", o.value),
                    "write the offset as a number, e.g. OFFSET 100",
                ));
            }
        }
    }
    query.limit_clause = Some(LimitClause::LimitOffset {
        limit: Some(Expr::Value(
            Value::Number(limit.to_string(), false).with_empty_span(),
        )),
        offset,
        limit_by: Vec::new(),
    });
    Ok(limit)
}

//! The pass over the whole statement that decides which expressions may be evaluated at all:
//! every kind of expression the parser knows is either allowed, checked against the function
//! and cast allowlists, or refused. There is no default case, so a new kind of expression in a
//! parser upgrade does not compile until someone decides about it.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use sqlparser::ast::{
    BinaryOperator, CastKind, CeilFloorKind, DataType, DateTimeField, Expr, Function, FunctionArg,
    FunctionArgExpr, FunctionArgumentClause, FunctionArguments, Ident, ObjectName, ObjectNamePart,
    Query, Statement, TableFactor, UnaryOperator, Value, Visitor,
};

use super::allow::{cast_types_for_message, check_cast_type, default_functions};
use super::cost::{
    self, MAX_OPERAND_CHARS, MAX_PADDED_WIDTH, MAX_PATTERN_CHARS, Padding, padded_width,
};
use super::deny::denied_function;
use super::{GuardViolation, SqlDialect, ViolationKind as K};

type R<T> = Result<T, GuardViolation>;

/// Keywords PostgreSQL (and SQLite, for the first three) evaluate as functions when written
/// without parentheses: `SELECT current_user` calls a function, it does not read a column.
const VALUE_FUNCTIONS: &[&str] = &[
    "current_date",
    "current_time",
    "current_timestamp",
    "current_catalog",
    "current_role",
    "current_schema",
    "current_user",
    "localtime",
    "localtimestamp",
    "session_user",
    "system_user",
    "user",
];

/// Whether an identifier is a function in disguise (an unquoted SQL value-function keyword;
/// SQLite knows only the first three).
pub(super) fn value_function(ident: &Ident, dialect: SqlDialect) -> Option<String> {
    let lower = ident.value.to_lowercase();
    let known = match dialect {
        SqlDialect::Postgres => VALUE_FUNCTIONS,
        SqlDialect::Sqlite => &VALUE_FUNCTIONS[..3],
    };
    (ident.quote_style.is_none() && known.contains(&lower.as_str())).then_some(lower)
}

/// Which functions the rule allows: the dialect's defaults and the rule's `functions`.
#[derive(Clone, Debug)]
pub(super) struct FunctionPolicy {
    pub(super) dialect: SqlDialect,
    /// The rule's `functions`, lowercased (`name` or `schema.name`).
    pub(super) extra: BTreeSet<String>,
}

impl FunctionPolicy {
    pub(super) fn new(dialect: SqlDialect, extra: &[String]) -> Self {
        Self {
            dialect,
            extra: extra.iter().map(|f| f.trim().to_lowercase()).collect(),
        }
    }

    /// Whether the function named by `parts` (as the database folds them) may be called.
    fn allows(&self, parts: &[String]) -> bool {
        let listed = |name: &str| {
            default_functions(self.dialect).contains(&name) || self.extra.contains(name)
        };
        match parts {
            [name] => listed(name),
            [schema, name] => {
                (self.dialect == SqlDialect::Postgres && schema == "pg_catalog" && listed(name))
                    || self.extra.contains(&format!("{schema}.{name}"))
            }
            _ => false,
        }
    }

    /// Every allowed function, sorted, for messages.
    fn listing(&self) -> String {
        let mut all: BTreeSet<&str> = default_functions(self.dialect).iter().copied().collect();
        all.extend(self.extra.iter().map(String::as_str));
        all.into_iter().collect::<Vec<_>>().join(", ")
    }

    fn not_allowed(&self, what: &str, why: Option<&str>) -> GuardViolation {
        GuardViolation::new(
            K::FunctionNotAllowed,
            format!(
                "the function {what} is not allowed by policy{}",
                why.map(|w| format!(" ({w})")).unwrap_or_default()
            ),
            format!(
                "use only the allowed functions ({}); if the query really needs {what}, ask an operator to add it to the rule's sql.functions",
                self.listing()
            ),
        )
    }

    /// The function `name` written as a call or as special syntax (`display`).
    fn check_named(&self, name: &str, display: &str) -> R<()> {
        if self.allows(&[name.to_owned()]) {
            Ok(())
        } else {
            Err(self.not_allowed(display, None))
        }
    }

    /// An identifier of a function name as the database folds it: unquoted names to lowercase;
    /// SQLite ignores case even when quoted.
    fn fold(&self, ident: &Ident) -> String {
        if ident.quote_style.is_none() || self.dialect == SqlDialect::Sqlite {
            ident.value.to_lowercase()
        } else {
            ident.value.clone()
        }
    }
}

fn unsupported(what: impl std::fmt::Display) -> GuardViolation {
    GuardViolation::new(
        K::Unsupported,
        format!("{what} is not supported by the SQL guard"),
        "rewrite the query as a plain SELECT over allowed tables and columns",
    )
}

pub(super) fn denied(name: &str, why: &str) -> GuardViolation {
    GuardViolation::new(
        K::DeniedFunction,
        format!("the function {} is denied: {why}", name.to_lowercase()),
        "remove the call; execute_sql only reads allowed tables and columns",
    )
}

/// Refuses a hard-denied function name (`name` is the last part, any case).
pub(super) fn check_denied_name(name: &ObjectName) -> R<()> {
    if name
        .0
        .iter()
        .any(|part| matches!(part, ObjectNamePart::Function(_)))
    {
        return Err(unsupported("a computed function name"));
    }
    if let Some(ObjectNamePart::Identifier(last)) = name.0.last()
        && let Some(why) = denied_function(&last.value)
    {
        return Err(denied(&last.value, why));
    }
    Ok(())
}

/// Refuses a cast to a type outside the allowlist (catalog lookup types are hard-denied).
pub(super) fn check_cast(data_type: &DataType, dialect: SqlDialect) -> R<()> {
    match check_cast_type(data_type, dialect) {
        Ok(()) => Ok(()),
        Err(name) => {
            let base = name.trim_end_matches("[]");
            if base.starts_with("reg") {
                return Err(GuardViolation::new(
                    K::DeniedFunction,
                    format!(
                        "casting to {name} is denied: it looks objects up in the system catalogs"
                    ),
                    "compare names as text instead, or remove the cast",
                ));
            }
            Err(GuardViolation::new(
                K::CastNotAllowed,
                format!("casting to {name} is not allowed by policy"),
                format!(
                    "cast only to {}; or remove the cast",
                    cast_types_for_message()
                ),
            ))
        }
    }
}

/// The widest `lpad`/`rpad` result a query may ask for without the rule listing them.
pub(super) const MAX_PAD_WIDTH: u64 = MAX_PADDED_WIDTH;

/// The width (second argument) of an `lpad`/`rpad` call when it is a whole-number literal.
fn padding_width(args: &FunctionArguments) -> Option<u64> {
    let FunctionArguments::List(list) = args else {
        return None;
    };
    match list.args.get(1)? {
        FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v))) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

fn binary_operator_allowed(op: &BinaryOperator) -> bool {
    use BinaryOperator as B;
    matches!(
        op,
        B::Plus
            | B::Minus
            | B::Multiply
            | B::Divide
            | B::Modulo
            | B::StringConcat
            | B::Gt
            | B::Lt
            | B::GtEq
            | B::LtEq
            | B::Eq
            | B::NotEq
            | B::And
            | B::Or
            | B::BitwiseOr
            | B::BitwiseAnd
            | B::BitwiseXor
            | B::PGBitwiseXor
            | B::PGBitwiseShiftLeft
            | B::PGBitwiseShiftRight
            | B::PGExp
            | B::PGOverlap
            | B::PGRegexMatch
            | B::PGRegexIMatch
            | B::PGRegexNotMatch
            | B::PGRegexNotIMatch
            | B::PGLikeMatch
            | B::PGILikeMatch
            | B::PGNotLikeMatch
            | B::PGNotILikeMatch
            | B::PGStartsWith
            | B::Arrow
            | B::LongArrow
            | B::HashArrow
            | B::HashLongArrow
            | B::AtArrow
            | B::ArrowAt
            | B::Question
            | B::QuestionAnd
            | B::QuestionPipe
            | B::Overlaps
    )
}

/// The regular-expression match operators (`~`, `~*`, `!~`, `!~*`).
fn is_regex_operator(op: &BinaryOperator) -> bool {
    use BinaryOperator as B;
    matches!(
        op,
        B::PGRegexMatch | B::PGRegexIMatch | B::PGRegexNotMatch | B::PGRegexNotIMatch
    )
}

fn unary_operator_allowed(op: &UnaryOperator) -> bool {
    use UnaryOperator as U;
    matches!(
        op,
        U::Plus | U::Minus | U::Not | U::BitwiseNot | U::PGAbs | U::PGSquareRoot | U::PGCubeRoot
    )
}

fn operator_not_allowed(op: &dyn std::fmt::Display) -> GuardViolation {
    GuardViolation::new(
        K::FunctionNotAllowed,
        format!("the operator {op} is not allowed by policy"),
        "use arithmetic, comparison, string concatenation (||), pattern matching (LIKE, ~) and the JSON operators (->, ->>, #>, #>>, @>, <@, ?); every operator is a function, and only the built-in ones for these are allowed",
    )
}

/// Scans the whole statement, subqueries included, for expressions that may not be evaluated
/// and for constructs refused wherever they appear.
pub(super) struct Scan<'a> {
    pub(super) functions: &'a FunctionPolicy,
    statement_depth: usize,
    /// What the query's paddings add up to (see [`super::cost`]).
    padding: Padding,
}

impl<'a> Scan<'a> {
    pub(super) fn new(functions: &'a FunctionPolicy) -> Self {
        Self {
            functions,
            statement_depth: 0,
            padding: Padding::default(),
        }
    }

    /// Bounds the work of one call (see [`super::cost`]): superlinear functions and operators
    /// take their cost-multiplying operands as short literals, and paddings stay within the
    /// query's budget.
    fn bound_work(&mut self, expr: &Expr) -> R<()> {
        let dialect = self.dialect();
        match expr {
            Expr::Cast { data_type, .. } if dialect == SqlDialect::Postgres => {
                self.pad_cast(data_type)
            }
            Expr::TypedString(t) if dialect == SqlDialect::Postgres => {
                cost::check_literal(&t.value.value)?;
                self.pad_cast(&t.data_type)
            }
            Expr::Value(v) if dialect == SqlDialect::Postgres => cost::check_literal(&v.value),
            Expr::BinaryOp {
                left,
                op: BinaryOperator::PGExp,
                right,
            } => cost::check_exponentiation("the operator ^", Some(left), Some(right)),
            Expr::Function(f) => {
                let mut parts = Vec::new();
                for part in &f.name.0 {
                    if let ObjectNamePart::Identifier(i) = part {
                        parts.push(self.functions.fold(i));
                    }
                }
                let name = match parts.as_slice() {
                    [name] => name.as_str(),
                    [schema, name] if schema == "pg_catalog" && dialect == SqlDialect::Postgres => {
                        name.as_str()
                    }
                    // A function of another schema is not the built-in one.
                    _ => return Ok(()),
                };
                let args: Vec<Option<&Expr>> = match &f.args {
                    FunctionArguments::List(list) => list
                        .args
                        .iter()
                        .map(|a| match a {
                            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                cost::check_call(dialect, name, &args)?;
                cost::check_output_width(dialect, name, &args, &mut self.padding)?;
                if dialect == SqlDialect::Postgres {
                    let arg = |i: usize| args.get(i).copied().flatten();
                    match name {
                        "power" | "pow" => cost::check_exponentiation(name, arg(0), arg(1))?,
                        "exp" => cost::check_exponentiation(name, None, arg(0))?,
                        _ => {}
                    }
                }
                if dialect == SqlDialect::Postgres && matches!(name, "lpad" | "rpad") {
                    // The scan refuses other widths unless the rule lists the function.
                    if let Some(width) = padding_width(&f.args) {
                        self.padding.add(name, width)?;
                    }
                }
                Ok(())
            }
            Expr::Trim {
                trim_what,
                trim_characters,
                ..
            } => {
                for set in trim_what
                    .iter()
                    .map(|w| w.as_ref())
                    .chain(trim_characters.iter().flatten())
                {
                    cost::check_syntax_operand(
                        "TRIM",
                        "the set of characters to trim",
                        MAX_OPERAND_CHARS,
                        set,
                    )?;
                }
                Ok(())
            }
            Expr::Position { expr: needle, .. } => cost::check_syntax_operand(
                "POSITION",
                "the substring to look for",
                MAX_OPERAND_CHARS,
                needle,
            ),
            Expr::BinaryOp { op, right, .. } if is_regex_operator(op) => {
                cost::check_syntax_operand(
                    &format!("the operator {op}"),
                    "the regular expression",
                    MAX_PATTERN_CHARS,
                    right,
                )
            }
            Expr::AnyOp {
                compare_op, right, ..
            }
            | Expr::AllOp {
                compare_op, right, ..
            } if is_regex_operator(compare_op) => match right.as_ref() {
                Expr::Array(array) => {
                    for pattern in &array.elem {
                        cost::check_syntax_operand(
                            &format!("the operator {compare_op}"),
                            "the regular expression",
                            MAX_PATTERN_CHARS,
                            pattern,
                        )?;
                    }
                    Ok(())
                }
                other => cost::check_syntax_operand(
                    &format!("the operator {compare_op}"),
                    "the regular expression",
                    MAX_PATTERN_CHARS,
                    other,
                ),
            },
            // SIMILAR TO is a regular expression in PostgreSQL.
            Expr::SimilarTo {
                pattern,
                escape_char: _,
                ..
            } => {
                cost::check_syntax_operand("SIMILAR TO", "the pattern", MAX_PATTERN_CHARS, pattern)
            }
            // SQLite matches LIKE patterns inside one VM instruction.
            Expr::Like { pattern, .. } | Expr::ILike { pattern, .. }
                if dialect == SqlDialect::Sqlite =>
            {
                cost::check_syntax_operand("LIKE", "the pattern", MAX_PATTERN_CHARS, pattern)
            }
            _ => Ok(()),
        }
    }

    fn pad_cast(&mut self, data_type: &DataType) -> R<()> {
        match padded_width(data_type) {
            Some(width) => self.padding.add(&format!("the cast to {data_type}"), width),
            None => Ok(()),
        }
    }

    fn dialect(&self) -> SqlDialect {
        self.functions.dialect
    }

    fn function(&self, f: &Function) -> R<()> {
        let Function {
            name,
            uses_odbc_syntax,
            parameters,
            args,
            filter: _,
            null_treatment,
            over: _,
            within_group: _,
        } = f;
        check_denied_name(name)?;
        if *uses_odbc_syntax || !matches!(parameters, FunctionArguments::None) {
            return Err(unsupported(format!("the call syntax of {name}")));
        }
        if null_treatment.is_some() {
            return Err(unsupported("IGNORE NULLS / RESPECT NULLS"));
        }
        let mut parts = Vec::new();
        for part in &name.0 {
            match part {
                ObjectNamePart::Identifier(i) => parts.push(self.functions.fold(i)),
                ObjectNamePart::Function(_) => return Err(unsupported("a computed function name")),
            }
        }
        let display = parts.join(".");
        match args {
            FunctionArguments::None => {}
            FunctionArguments::Subquery(_) => {
                if parts.len() == 1 && parts[0] == "array" {
                    // ARRAY(SELECT …) collects every row into one value, like array_agg.
                    return if self.functions.allows(&["array_agg".to_owned()]) {
                        Ok(())
                    } else {
                        Err(self.functions.not_allowed(
                            "ARRAY(subquery)",
                            Some("it collects every row into one value, like array_agg"),
                        ))
                    };
                }
                return Err(unsupported(format!("{display}(subquery)")));
            }
            FunctionArguments::List(list) => {
                for clause in &list.clauses {
                    match clause {
                        FunctionArgumentClause::OrderBy(_) => {}
                        other => {
                            return Err(unsupported(format!("the argument clause `{other}`")));
                        }
                    }
                }
                // ROW(a, b) is a row constructor, not a function.
                if parts.len() == 1 && parts[0] == "row" {
                    return Ok(());
                }
            }
        }
        if self.functions.allows(&parts) {
            return Ok(());
        }
        // lpad/rpad return exactly `width` characters: safe with a small literal width.
        let builtin = match parts.as_slice() {
            [name] => Some(name.as_str()),
            [schema, name] if schema == "pg_catalog" => Some(name.as_str()),
            _ => None,
        };
        if self.dialect() == SqlDialect::Postgres
            && let Some(name @ ("lpad" | "rpad")) = builtin
        {
            return if padding_width(args).is_some_and(|w| w <= MAX_PAD_WIDTH) {
                Ok(())
            } else {
                Err(self.functions.not_allowed(
                    name,
                    Some(&format!(
                        "it is allowed with a number literal as the width, at most {MAX_PAD_WIDTH}, e.g. {name}(x, 10, '0')"
                    )),
                ))
            };
        }
        Err(self.functions.not_allowed(&display, None))
    }

    /// Every kind of expression, decided.
    fn expr(&self, expr: &Expr) -> R<()> {
        use Expr as E;
        let builtin = |name: &str, display: &str| self.functions.check_named(name, display);
        match expr {
            E::Identifier(ident) => match value_function(ident, self.dialect()) {
                Some(name) => builtin(&name, &name),
                None => Ok(()),
            },
            // Column references and field access; the checker resolves them, and the
            // expressions inside (subscripts) are visited on their own.
            E::CompoundIdentifier(_) | E::CompoundFieldAccess { .. } => Ok(()),
            E::IsFalse(_)
            | E::IsNotFalse(_)
            | E::IsTrue(_)
            | E::IsNotTrue(_)
            | E::IsNull(_)
            | E::IsNotNull(_)
            | E::IsUnknown(_)
            | E::IsNotUnknown(_)
            | E::IsDistinctFrom(..)
            | E::IsNotDistinctFrom(..)
            | E::InList { .. }
            | E::InSubquery { .. }
            | E::Between { .. }
            | E::Like { .. }
            | E::ILike { .. }
            | E::SimilarTo { .. }
            | E::Nested(_)
            | E::Value(_)
            | E::Case { .. }
            | E::Exists { .. }
            | E::Subquery(_)
            | E::GroupingSets(_)
            | E::Cube(_)
            | E::Rollup(_)
            | E::Tuple(_)
            | E::Array(_)
            | E::Interval(_)
            | E::Wildcard(_)
            | E::QualifiedWildcard(..)
            | E::Collate { .. } => Ok(()),
            E::IsNormalized { .. } => builtin("normalize", "IS NORMALIZED"),
            E::BinaryOp { op, .. } => {
                if binary_operator_allowed(op) {
                    Ok(())
                } else {
                    Err(operator_not_allowed(op))
                }
            }
            E::AnyOp { compare_op, .. } | E::AllOp { compare_op, .. } => {
                if binary_operator_allowed(compare_op) {
                    Ok(())
                } else {
                    Err(operator_not_allowed(compare_op))
                }
            }
            E::UnaryOp { op, .. } => {
                if unary_operator_allowed(op) {
                    Ok(())
                } else {
                    Err(operator_not_allowed(op))
                }
            }
            E::Cast {
                kind,
                data_type,
                format,
                ..
            } => {
                if !matches!(kind, CastKind::Cast | CastKind::DoubleColon) || format.is_some() {
                    return Err(unsupported("TRY_CAST / SAFE_CAST / CAST … FORMAT"));
                }
                check_cast(data_type, self.dialect())
            }
            E::TypedString(t) => check_cast(&t.data_type, self.dialect()),
            E::AtTimeZone { .. } => builtin("timezone", "AT TIME ZONE (timezone)"),
            E::Extract { .. } => builtin("extract", "EXTRACT"),
            E::Ceil { field, .. } | E::Floor { field, .. } => {
                if !matches!(
                    field,
                    CeilFloorKind::DateTimeField(DateTimeField::NoDateTime)
                ) {
                    return Err(unsupported("CEIL/FLOOR … TO / with a scale"));
                }
                let name = if matches!(expr, E::Ceil { .. }) {
                    "ceil"
                } else {
                    "floor"
                };
                builtin(name, name)
            }
            E::Position { .. } => builtin("position", "POSITION"),
            E::Substring { .. } => builtin("substring", "SUBSTRING"),
            E::Trim { .. } => builtin("trim", "TRIM"),
            E::Overlay { .. } => builtin("overlay", "OVERLAY"),
            E::Function(f) => self.function(f),
            E::Convert { .. } => Err(self.functions.not_allowed("CONVERT", None)),
            E::InUnnest { .. } => Err(unsupported("IN UNNEST")),
            E::RLike { .. } => Err(unsupported("REGEXP / RLIKE")),
            E::JsonAccess { .. } => Err(unsupported("the `:` JSON path syntax")),
            E::Prefixed { .. } => Err(unsupported("a character set introducer")),
            E::Struct { .. } | E::Named { .. } => Err(unsupported("STRUCT")),
            E::Dictionary(_) | E::Map(_) => Err(unsupported("a dictionary or map literal")),
            E::MatchAgainst { .. } => Err(unsupported("MATCH … AGAINST")),
            E::OuterJoin(_) => Err(unsupported("the (+) outer join syntax")),
            E::Prior(_) => Err(unsupported("PRIOR")),
            E::Lambda(_) => Err(unsupported("a lambda expression")),
            E::MemberOf(_) => Err(unsupported("MEMBER OF")),
        }
    }
}

impl Visitor for Scan<'_> {
    type Break = GuardViolation;

    fn pre_visit_statement(&mut self, statement: &Statement) -> ControlFlow<GuardViolation> {
        self.statement_depth += 1;
        if self.statement_depth > 1 {
            let word = statement
                .to_string()
                .split_whitespace()
                .next()
                .unwrap_or("a statement")
                .to_uppercase();
            return ControlFlow::Break(GuardViolation::new(
                K::DataModifyingCte,
                format!("the query contains a data-modifying {word} inside it"),
                "CTEs and subqueries must be SELECTs; execute_sql is read-only",
            ));
        }
        ControlFlow::Continue(())
    }

    fn post_visit_statement(&mut self, _: &Statement) -> ControlFlow<GuardViolation> {
        self.statement_depth -= 1;
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<GuardViolation> {
        if let Some(lock) = query.locks.first() {
            return ControlFlow::Break(GuardViolation::new(
                K::LockingClause,
                format!("the locking clause `{lock}` is not allowed"),
                "remove FOR UPDATE / FOR SHARE; execute_sql only reads and never locks rows",
            ));
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<GuardViolation> {
        match self.expr(expr).and_then(|()| self.bound_work(expr)) {
            Ok(()) => ControlFlow::Continue(()),
            Err(v) => ControlFlow::Break(v),
        }
    }

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<GuardViolation> {
        let result = match factor {
            TableFactor::Table {
                name,
                args: Some(_),
                ..
            }
            | TableFactor::Function { name, .. } => check_denied_name(name),
            _ => Ok(()),
        };
        match result {
            Ok(()) => ControlFlow::Continue(()),
            Err(v) => ControlFlow::Break(v),
        }
    }
}

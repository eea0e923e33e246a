//! Bounded work inside one function call.
//!
//! Databases check for cancellation between rows and inside their own loops, but not inside
//! most built-in functions: PostgreSQL's `btrim(x, set)` or `translate(x, from, to)`, SQLite's
//! `ltrim(x, set)` run to the end once called, ignoring the statement timeout, a cancel and even
//! `pg_terminate_backend` (SQLite's progress handler is never reached: the call is one VM
//! instruction). The statement timeout bounds a query only if every single call is cheap, so the
//! guard bounds the work of one call before the query runs, with two rules:
//!
//! 1. **Superlinear functions take their second operand from the query text.** A function whose
//!    cost grows with the product of its operands (the trim family with a character set,
//!    `translate`, substring search in `strpos`/`position`/`split_part`/`instr`, the pattern of
//!    the regular-expression functions and operators, `replace` when a rule adds it) is allowed
//!    only when every operand but the subject is a literal of at most [`MAX_OPERAND_CHARS`]
//!    characters. Its cost is then linear in the subject, whose size the value-growth bound
//!    already limits.
//! 2. **No operand is padded beyond the query's own size.** Fixed-length casts (`char(n)`,
//!    `bpchar(n)`), numeric scales (`numeric(p, s)` prints `s` digits) and `lpad`/`rpad` widths
//!    make large values out of one-byte literals (`''::char(n)` is n bytes). Each is at most
//!    [`MAX_PADDED_WIDTH`], and all of them together at most [`MAX_PADDING_TOTAL`], so values built
//!    from literals stay as small as the query text allows (the value-growth check assumes so).
//!
//! Both are checked on the syntax tree, wherever the expression is (select list, `WHERE`,
//! subqueries, CTEs), in both dialects.

use sqlparser::ast::{CharacterLength, DataType, ExactNumberInfo, Expr, ObjectNamePart, Value};

use super::{GuardViolation, MAX_QUERY_BYTES, SqlDialect, ViolationKind as K};

/// Longest literal a superlinear function may take as its second operand (a character set,
/// a needle, a pattern), in characters.
pub const MAX_OPERAND_CHARS: usize = 64;
/// Longest literal pattern (regular expression, `SIMILAR TO`, SQLite `LIKE`), in characters.
pub const MAX_PATTERN_CHARS: usize = 256;
/// The widest one padding may make a value: `char(n)`, `lpad`/`rpad` widths, numeric scales.
pub const MAX_PADDED_WIDTH: u64 = 1_000;
/// The most all paddings of one query may add up to: no more than the query's own size.
pub const MAX_PADDING_TOTAL: u64 = MAX_QUERY_BYTES as u64;

/// One built-in function whose cost grows with the product of its operands: its name, the
/// (zero-based) positions of the operands that must be short literals, and what they are.
struct Superlinear {
    name: &'static str,
    operands: &'static [usize],
    what: &'static str,
    /// The longest literal allowed for those operands.
    max: usize,
}

const fn s(name: &'static str, operands: &'static [usize], what: &'static str) -> Superlinear {
    Superlinear {
        name,
        operands,
        what,
        max: MAX_OPERAND_CHARS,
    }
}

/// A regular expression: compiling it costs more than linear in its length.
const fn re(name: &'static str, operands: &'static [usize], what: &'static str) -> Superlinear {
    Superlinear {
        name,
        operands,
        what,
        max: MAX_PATTERN_CHARS,
    }
}

/// PostgreSQL: the defaults of the allowlist, and the ones a rule may add.
const POSTGRES_SUPERLINEAR: &[Superlinear] = &[
    s("btrim", &[1], "the set of characters to trim"),
    s("ltrim", &[1], "the set of characters to trim"),
    s("rtrim", &[1], "the set of characters to trim"),
    s(
        "translate",
        &[1, 2],
        "the characters to replace and their replacements",
    ),
    s("strpos", &[1], "the substring to look for"),
    s("split_part", &[1], "the delimiter"),
    re("regexp_match", &[1, 2], "the pattern and its flags"),
    re("regexp_matches", &[1, 2], "the pattern and its flags"),
    re("regexp_like", &[1, 2], "the pattern and its flags"),
    re("regexp_count", &[1, 3], "the pattern and its flags"),
    re("regexp_substr", &[1, 4], "the pattern and its flags"),
    re("regexp_instr", &[1, 5], "the pattern and its flags"),
    re("regexp_replace", &[1, 2], "the pattern and the replacement"),
    re(
        "regexp_split_to_array",
        &[1, 2],
        "the pattern and its flags",
    ),
    re(
        "regexp_split_to_table",
        &[1, 2],
        "the pattern and its flags",
    ),
    s("replace", &[1, 2], "the substring and its replacement"),
];

/// SQLite: each call is one VM instruction, which the progress handler cannot interrupt.
const SQLITE_SUPERLINEAR: &[Superlinear] = &[
    s("trim", &[1], "the set of characters to trim"),
    s("ltrim", &[1], "the set of characters to trim"),
    s("rtrim", &[1], "the set of characters to trim"),
    s("instr", &[1], "the substring to look for"),
    s("replace", &[1, 2], "the substring and its replacement"),
];

fn superlinear(dialect: SqlDialect, name: &str) -> Option<&'static Superlinear> {
    let table = match dialect {
        SqlDialect::Postgres => POSTGRES_SUPERLINEAR,
        SqlDialect::Sqlite => SQLITE_SUPERLINEAR,
    };
    table.iter().find(|f| f.name == name)
}

/// The length of `expr` when it is a literal written in the query (possibly parenthesised or
/// cast to a type that does not pad it), in characters; `None` for anything computed.
fn literal_chars(expr: &Expr) -> Option<usize> {
    match expr {
        Expr::Nested(inner) => literal_chars(inner),
        Expr::Cast {
            expr, data_type, ..
        } if padded_width(data_type).is_none() => literal_chars(expr),
        Expr::Value(v) => match &v.value {
            Value::Null | Value::Boolean(_) => Some(0),
            Value::Number(n, _) => Some(n.chars().count()),
            other => other.clone().into_string().map(|t| t.chars().count()),
        },
        _ => None,
    }
}

fn unbounded(problem: String, hint: String) -> GuardViolation {
    GuardViolation::new(K::UnboundedWork, problem, hint)
}

/// Checks the operands of a call to the built-in function `name` (lowercase, unqualified or
/// `pg_catalog.`): the operands that multiply its cost must be short literals.
pub(super) fn check_call(
    dialect: SqlDialect,
    name: &str,
    args: &[Option<&Expr>],
) -> Result<(), GuardViolation> {
    let Some(f) = superlinear(dialect, name) else {
        return Ok(());
    };
    for &i in f.operands {
        let Some(arg) = args.get(i) else { continue };
        check_operand(name, f.what, f.max, arg)?;
    }
    Ok(())
}

/// Checks one operand that multiplies the cost of `function` (`None`: not a plain expression).
fn check_operand(
    function: &str,
    what: &str,
    max: usize,
    operand: &Option<&Expr>,
) -> Result<(), GuardViolation> {
    match operand.map(literal_chars) {
        Some(Some(n)) if n <= max => Ok(()),
        Some(Some(n)) => Err(unbounded(
            format!(
                "{function} is called with {what} {n} characters long, more than the {max} allowed: its work grows with the product of its operands and cannot be interrupted"
            ),
            format!("write {what} as a string literal of at most {max} characters"),
        )),
        _ => Err(unbounded(
            format!(
                "{function} is called with {what} computed by the query: its work grows with the product of its operands and the database cannot interrupt one call"
            ),
            format!(
                "write {what} as a string literal of at most {max} characters, e.g. {function}(column, 'abc')"
            ),
        )),
    }
}

/// An operand of syntax that is a superlinear call (`TRIM(set FROM x)`, `POSITION(needle IN
/// x)`, `x ~ pattern`, `x SIMILAR TO pattern`): a literal of at most `max` characters.
pub(super) fn check_syntax_operand(
    function: &str,
    what: &str,
    max: usize,
    operand: &Expr,
) -> Result<(), GuardViolation> {
    check_operand(function, what, max, &Some(operand))
}

/// How wide a cast to `data_type` pads its value (`char(n)` pads to n characters, `numeric(p,
/// s)` prints s decimals), or `None` when it does not pad.
pub(super) fn padded_width(data_type: &DataType) -> Option<u64> {
    let exact = |info: &ExactNumberInfo| match info {
        ExactNumberInfo::PrecisionAndScale(_, scale) => Some(scale.unsigned_abs()),
        _ => None,
    };
    match data_type {
        DataType::Char(len) | DataType::Character(len) => match len {
            Some(CharacterLength::IntegerLength { length, .. }) => Some(*length),
            Some(CharacterLength::Max) => Some(u64::MAX),
            None => None,
        },
        DataType::Numeric(info) | DataType::Decimal(info) | DataType::Dec(info) => exact(info),
        DataType::Array(elem) => match elem {
            sqlparser::ast::ArrayElemTypeDef::SquareBracket(inner, _)
            | sqlparser::ast::ArrayElemTypeDef::AngleBracket(inner)
            | sqlparser::ast::ArrayElemTypeDef::Parenthesis(inner) => padded_width(inner),
            sqlparser::ast::ArrayElemTypeDef::None => None,
        },
        DataType::Custom(name, modifiers) => {
            let last = match name.0.last() {
                Some(ObjectNamePart::Identifier(i)) => i.value.to_lowercase(),
                _ => return None,
            };
            let number = |i: usize| {
                modifiers
                    .get(i)
                    .map(|m| m.parse::<u64>().unwrap_or(u64::MAX))
            };
            match last.as_str() {
                "bpchar" | "char" | "character" | "nchar" => number(0),
                "numeric" | "decimal" => number(1),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The padding budget of one query: every padding at most [`MAX_PADDED_WIDTH`], all together
/// at most [`MAX_PADDING_TOTAL`].
#[derive(Debug, Default)]
pub(super) struct Padding {
    total: u64,
}

impl Padding {
    /// Adds one padding of `width` made by `what` (`char(5000)`, `lpad`).
    pub(super) fn add(&mut self, what: &str, width: u64) -> Result<(), GuardViolation> {
        if width > MAX_PADDED_WIDTH {
            return Err(unbounded(
                format!(
                    "{what} pads values to {width} characters, more than the {MAX_PADDED_WIDTH} allowed"
                ),
                format!(
                    "use a width of at most {MAX_PADDED_WIDTH}, or cast to text or varchar, which do not pad"
                ),
            ));
        }
        self.total = self.total.saturating_add(width);
        if self.total > MAX_PADDING_TOTAL {
            return Err(unbounded(
                format!(
                    "the query pads values (char(n), numeric scales, lpad/rpad) to {} characters in all, more than the {MAX_PADDING_TOTAL} allowed",
                    self.total
                ),
                "pad fewer values, or cast to text or varchar, which do not pad".to_owned(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_is_budgeted() {
        let mut p = Padding::default();
        assert!(p.add("char(1000)", 1000).is_ok());
        assert!(p.add("char(1001)", 1001).is_err());
        let mut p = Padding::default();
        let mut refused = false;
        for _ in 0..20 {
            refused |= p.add("char(1000)", 1000).is_err();
        }
        assert!(refused);
    }
}

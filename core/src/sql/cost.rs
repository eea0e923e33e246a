//! Bounded work inside one function call.
//!
//! Databases check for cancellation between rows and inside their own loops, but not inside
//! most built-in functions: PostgreSQL's `btrim(x, set)` or `translate(x, from, to)`, SQLite's
//! `ltrim(x, set)` run to the end once called, ignoring the statement timeout, a cancel and even
//! `pg_terminate_backend` (SQLite's progress handler is never reached: the call is one VM
//! instruction). The statement timeout bounds a query only if every single call is cheap, so the
//! guard bounds the work of one call before the query runs, with three rules:
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
//!    Functions a rule may add that are told how wide to be (`format`/`printf` widths,
//!    `repeat`, `zeroblob`) take literal widths that count the same way.
//! 3. **No numeric value is made huge from a small literal.** PostgreSQL's `numeric` holds up
//!    to 131,072 digits, and one operation on such values takes a tenth of a second without an
//!    interrupt check: `power(7::numeric, 100000)`, `7::numeric ^ 100000`, `exp(200000::numeric)`
//!    and the literal `1e100000` (or `'1e100000'`, which PostgreSQL may read as a number) make
//!    them out of a few bytes. Number literals have a decimal exponent of at most
//!    [`MAX_NUMBER_EXPONENT`], and `power`/`pow`/`^`/`exp` take a number literal of at most that
//!    size as their exponent, unless an operand is cast to a floating-point type (`x::float8`),
//!    which makes the call a bounded floating-point one.
//!
//! All are checked on the syntax tree, wherever the expression is (select list, `WHERE`,
//! subqueries, CTEs), in both dialects.

use sqlparser::ast::{CharacterLength, DataType, ExactNumberInfo, Expr, ObjectNamePart, Value};

use super::{GuardViolation, MAX_QUERY_BYTES, SqlDialect, ViolationKind as K};

/// Longest literal a superlinear function may take as its second operand (a character set,
/// a needle, a pattern), in characters.
pub const MAX_OPERAND_CHARS: usize = 64;
/// Longest literal pattern (regular expression, `SIMILAR TO`, SQLite `LIKE`), in characters.
pub const MAX_PATTERN_CHARS: usize = 256;
/// Functions whose result is as wide as a number argument says (`repeat(x, n)`, `zeroblob(n)`),
/// by dialect, name and the position of that argument. None is on the default allowlist; a rule
/// may add them, and their widths then count like paddings: a literal within the budget.
const WIDTH_ARGUMENTS: &[(SqlDialect, &str, usize)] = &[
    (SqlDialect::Postgres, "repeat", 1),
    (SqlDialect::Sqlite, "zeroblob", 0),
    (SqlDialect::Sqlite, "randomblob", 0),
];

/// The widths a `format`/`printf` format string asks for (`%5000s`, `%.9999f`): each width and
/// precision counts as a padding; `*` (a width from an argument) is `None`.
fn format_widths(format: &str) -> Option<Vec<u64>> {
    let mut widths = Vec::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            continue;
        }
        let mut number = String::new();
        // Flags, argument positions (`1$`), width, `.precision`, up to the conversion letter.
        while let Some(&n) = chars.peek() {
            if n == '*' {
                return None;
            }
            if n.is_ascii_digit() {
                number.push(n);
            } else {
                if !number.is_empty() && n != '$' {
                    widths.push(number.parse().unwrap_or(u64::MAX));
                }
                number.clear();
                if n.is_ascii_alphabetic() && !matches!(n, 'l' | 'h' | 'q') {
                    chars.next();
                    break;
                }
            }
            chars.next();
        }
        if !number.is_empty() {
            widths.push(number.parse().unwrap_or(u64::MAX));
        }
    }
    Some(widths)
}

/// The largest decimal exponent of a number literal, and the largest literal exponent of
/// `power`/`pow`/`^`/`exp` over `numeric`.
pub const MAX_NUMBER_EXPONENT: u64 = 1_000;
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

/// Checks the functions whose result is as wide as they are told (when a rule allows them):
/// `format`/`printf` take a literal format whose widths count as paddings, `repeat`,
/// `zeroblob`, `randomblob` a literal width that does.
pub(super) fn check_output_width(
    dialect: SqlDialect,
    name: &str,
    args: &[Option<&Expr>],
    padding: &mut Padding,
) -> Result<(), GuardViolation> {
    let literal_number = |e: Option<&Expr>| match e.map(strip_nested) {
        Some(Expr::Value(v)) => match &v.value {
            Value::Number(n, _) => Some(n.parse::<u64>().unwrap_or(u64::MAX)),
            _ => None,
        },
        _ => None,
    };
    let is_format = match dialect {
        SqlDialect::Postgres => name == "format",
        SqlDialect::Sqlite => matches!(name, "format" | "printf"),
    };
    if is_format {
        let format = args.first().copied().flatten().map(strip_nested);
        let text = match format {
            Some(Expr::Value(v)) => v.value.clone().into_string(),
            _ => None,
        };
        let widths = text.as_deref().and_then(format_widths).ok_or_else(|| {
            unbounded(
                format!("{name} is called with a computed format or a `*` width: its result can be any size"),
                format!("write the format as a string literal with number widths of at most {MAX_PADDED_WIDTH}, e.g. {name}('%s: %10s', a, b)"),
            )
        })?;
        for width in widths {
            padding.add(&format!("{name}'s format"), width)?;
        }
        return Ok(());
    }
    if let Some((_, _, i)) = WIDTH_ARGUMENTS
        .iter()
        .find(|(d, n, _)| *d == dialect && *n == name)
    {
        let width = literal_number(args.get(*i).copied().flatten()).ok_or_else(|| {
            unbounded(
                format!("{name} is called with a computed size: its result can be any size"),
                format!("give the size as a number literal of at most {MAX_PADDED_WIDTH}"),
            )
        })?;
        padding.add(name, width)?;
    }
    Ok(())
}

fn strip_nested(expr: &Expr) -> &Expr {
    match expr {
        Expr::Nested(inner) => strip_nested(inner),
        other => other,
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

/// The decimal magnitude of a number written as text (`1e100000` → 100000, `123.4` → 3), or
/// `None` when the text is not a number.
fn decimal_magnitude(text: &str) -> Option<u64> {
    let t = text.trim();
    let t = t.strip_prefix(['+', '-']).unwrap_or(t);
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit() || c == '_');
    if (int.is_empty() && frac.is_empty()) || !digits(int) || !digits(frac) {
        return None;
    }
    let exp: u64 = match exponent {
        None => 0,
        Some(e) => {
            let e = e.strip_prefix(['+', '-']).unwrap_or(e);
            if e.is_empty() || !digits(e) {
                return None;
            }
            let significant = e.replace('_', "");
            let significant = significant.trim_start_matches('0');
            if significant.len() > 19 {
                u64::MAX
            } else {
                significant.parse().unwrap_or(0)
            }
        }
    };
    Some(exp.saturating_add(int.len() as u64))
}

/// A number literal (or a string literal PostgreSQL may read as one) whose value or precision
/// needs more than [`MAX_NUMBER_EXPONENT`] digits.
pub(super) fn check_literal(value: &Value) -> Result<(), GuardViolation> {
    let text = match value {
        Value::Number(n, _) => n.clone(),
        other => match other.clone().into_string() {
            Some(s) if s.len() <= 64 * 1024 => s,
            _ => return Ok(()),
        },
    };
    match decimal_magnitude(&text) {
        Some(m) if m > MAX_NUMBER_EXPONENT => Err(unbounded(
            format!(
                "the number {} has about {m} digits, more than the {MAX_NUMBER_EXPONENT} allowed: arithmetic on such values cannot be interrupted",
                abbreviate(&text)
            ),
            format!(
                "write numbers with at most {MAX_NUMBER_EXPONENT} digits (or an exponent of at most {MAX_NUMBER_EXPONENT})"
            ),
        )),
        _ => Ok(()),
    }
}

fn abbreviate(text: &str) -> String {
    if text.chars().count() <= 24 {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(24).collect::<String>())
    }
}

/// Whether `expr` is cast to a floating-point type, which makes an arithmetic call over it a
/// floating-point one (bounded) rather than a `numeric` one.
fn is_float(expr: &Expr) -> bool {
    match expr {
        Expr::Nested(inner) => is_float(inner),
        Expr::Cast { data_type, .. } => match data_type {
            DataType::Float(_)
            | DataType::Float4
            | DataType::Float8
            | DataType::Float32
            | DataType::Float64
            | DataType::Real
            | DataType::Double(_)
            | DataType::DoublePrecision => true,
            // `pg_catalog.float8`, `"float4"`: the cast allowlist admits no other schema.
            DataType::Custom(name, _) => matches!(
                name.0.last(),
                Some(ObjectNamePart::Identifier(i))
                    if matches!(i.value.to_lowercase().as_str(), "float4" | "float8")
            ),
            _ => false,
        },
        _ => false,
    }
}

/// `power(base, exponent)`, `base ^ exponent`, `exp(exponent)` (`base` `None`): over
/// `numeric`, the exponent must be a number literal of at most [`MAX_NUMBER_EXPONENT`];
/// a floating-point operand makes the call a bounded one.
pub(super) fn check_exponentiation(
    what: &str,
    base: Option<&Expr>,
    exponent: Option<&Expr>,
) -> Result<(), GuardViolation> {
    let Some(exponent) = exponent else {
        return Ok(());
    };
    if is_float(exponent) || base.is_some_and(is_float) {
        return Ok(());
    }
    let literal = match strip_sign(exponent) {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => decimal_magnitude(n).map(|_| {
                n.trim_start_matches(['+', '-'])
                    .parse::<f64>()
                    .unwrap_or(f64::INFINITY)
            }),
            _ => None,
        },
        _ => None,
    };
    match literal {
        Some(v) if v.abs() <= MAX_NUMBER_EXPONENT as f64 => Ok(()),
        _ => Err(unbounded(
            format!(
                "{what} with an exponent that is not a number literal of at most {MAX_NUMBER_EXPONENT}: over numeric it can build a value of 100,000 digits whose arithmetic cannot be interrupted"
            ),
            "use a literal exponent of at most 1000, or cast an operand to double precision (e.g. power(x::float8, y))".to_owned(),
        )),
    }
}

fn strip_sign(expr: &Expr) -> &Expr {
    match expr {
        Expr::Nested(inner) => strip_sign(inner),
        Expr::UnaryOp { expr, .. } => strip_sign(expr),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magnitudes_of_numbers() {
        assert_eq!(decimal_magnitude("1e100000"), Some(100_001));
        assert_eq!(decimal_magnitude(" -1.5E+3 "), Some(4));
        assert_eq!(decimal_magnitude("1.5e-1003"), Some(1004));
        assert_eq!(decimal_magnitude("123.45"), Some(3));
        assert_eq!(decimal_magnitude(".5"), Some(0));
        assert_eq!(
            decimal_magnitude("1e99999999999999999999999"),
            Some(u64::MAX)
        );
        assert_eq!(decimal_magnitude("abc"), None);
        assert_eq!(decimal_magnitude("1e"), None);
        assert_eq!(decimal_magnitude(""), None);
    }

    #[test]
    fn format_widths_are_read() {
        assert_eq!(format_widths("%s and %10s, %-5s %%"), Some(vec![10, 5]));
        assert_eq!(format_widths("%1$s %2$5000s"), Some(vec![5000]));
        assert_eq!(format_widths("%.9999f"), Some(vec![9999]));
        assert_eq!(format_widths("%*s"), None);
        assert_eq!(format_widths("%1$*2$s"), None);
        assert_eq!(format_widths("plain"), Some(vec![]));
    }

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

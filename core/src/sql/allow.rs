//! What a query may call without the policy naming it: the default function allowlist of each
//! dialect and the cast target types.
//!
//! A function not on these lists and not in the rule's `sql.functions` cannot run. The defaults
//! are plain scalar, aggregate and window functions whose result size is bounded by the size of
//! their arguments and whose only input is their arguments. They leave out, on purpose:
//!
//! - anything that evaluates SQL text (`ts_rewrite`, `ts_stat`, `query_to_xml`, `crosstab`, …),
//!   reads files, settings, sessions or the catalogs (`current_setting`, `current_user`,
//!   `version`, `has_*_privilege`, `to_regclass`, `format_type`, `obj_description`, …), has side
//!   effects (`nextval`, `set_config`, `setseed`, `lo_*`, …) or waits (`pg_sleep`);
//! - functions whose result can be far larger than their arguments, which one query could use to
//!   exhaust the server's memory: `repeat`, `lpad`/`rpad` with a computed or large width (with a
//!   number literal up to 1,000 they are allowed: their result is exactly that wide),
//!   `format`/`printf` (a width),
//!   `replace`/`regexp_replace` (each match becomes a literal of any length), escaping and
//!   encoding functions that can double their input at every nesting level (`to_json`, `quote`,
//!   `quote_literal`, `encode`, `hex`, …), `randomblob`/`zeroblob`, and the aggregates that build
//!   one value out of every row (`string_agg`, `array_agg`, `json_agg`, `group_concat`, `xmlagg`,
//!   …);
//! - set-returning functions in the select list (`generate_series`, `unnest`,
//!   `regexp_matches`, …), which multiply rows; in `FROM` they are governed by `tableFunctions`;
//! - XML, text-search and full-text functions (type input functions that parse documents or
//!   queries), and every function in a schema other than the built-in one.
//!
//! A rule may add any of these (except the hard-denied ones in [`super::deny`]) to its
//! `sql.functions` after considering what it exposes.

use sqlparser::ast::{ArrayElemTypeDef, DataType, ObjectNamePart};

use super::SqlDialect;

/// PostgreSQL functions callable without being listed in the rule (lowercase, unqualified or
/// qualified with `pg_catalog`).
pub const POSTGRES_FUNCTIONS: &[&str] = &[
    // Aggregates with a fixed-size result.
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "bool_and",
    "bool_or",
    "every",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "variance",
    "var_pop",
    "var_samp",
    "corr",
    "covar_pop",
    "covar_samp",
    "regr_slope",
    "regr_intercept",
    "regr_r2",
    "regr_count",
    "percentile_cont",
    "percentile_disc",
    "mode",
    // Window functions.
    "row_number",
    "rank",
    "dense_rank",
    "percent_rank",
    "cume_dist",
    "ntile",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "nth_value",
    // Conditionals (parsed as calls).
    "coalesce",
    "nullif",
    "greatest",
    "least",
    "num_nulls",
    "num_nonnulls",
    // Arithmetic.
    "abs",
    "ceil",
    "ceiling",
    "floor",
    "round",
    "trunc",
    "sign",
    "sqrt",
    "cbrt",
    "exp",
    "ln",
    "log",
    "log10",
    "power",
    "pow",
    "mod",
    "div",
    "pi",
    "degrees",
    "radians",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "atan2",
    "width_bucket",
    "scale",
    "random",
    // Strings (results no longer than the arguments put together).
    "lower",
    "upper",
    "initcap",
    "length",
    "char_length",
    "character_length",
    "octet_length",
    "bit_length",
    "substr",
    "substring",
    "left",
    "right",
    "strpos",
    "position",
    "trim",
    "btrim",
    "ltrim",
    "rtrim",
    "overlay",
    "concat",
    "concat_ws",
    "split_part",
    "starts_with",
    "reverse",
    "translate",
    "md5",
    "ascii",
    "chr",
    "to_hex",
    "regexp_match",
    "regexp_like",
    "regexp_count",
    "regexp_substr",
    "regexp_instr",
    // Dates and times.
    "now",
    "current_date",
    "current_time",
    "current_timestamp",
    "localtime",
    "localtimestamp",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "date_trunc",
    "date_part",
    "date_bin",
    "extract",
    "age",
    "make_date",
    "make_time",
    "make_timestamp",
    "make_timestamptz",
    "make_interval",
    "justify_days",
    "justify_hours",
    "justify_interval",
    "isfinite",
    "timezone",
    "to_char",
    "to_date",
    "to_timestamp",
    "to_number",
    // JSON access (extraction only).
    "json_extract_path",
    "json_extract_path_text",
    "jsonb_extract_path",
    "jsonb_extract_path_text",
    "json_typeof",
    "jsonb_typeof",
    "json_array_length",
    "jsonb_array_length",
    // Arrays (size and search only).
    "array_length",
    "cardinality",
    "array_position",
];

/// SQLite functions callable without being listed in the rule (lowercase).
pub const SQLITE_FUNCTIONS: &[&str] = &[
    // Aggregates with a fixed-size result.
    "count",
    "sum",
    "total",
    "avg",
    "min",
    "max",
    // Window functions.
    "row_number",
    "rank",
    "dense_rank",
    "percent_rank",
    "cume_dist",
    "ntile",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "nth_value",
    // Conditionals.
    "coalesce",
    "ifnull",
    "iif",
    "nullif",
    "likely",
    "unlikely",
    "likelihood",
    // Arithmetic (the math functions exist when SQLite was built with them).
    "abs",
    "round",
    "sign",
    "ceil",
    "ceiling",
    "floor",
    "trunc",
    "sqrt",
    "exp",
    "ln",
    "log",
    "log10",
    "log2",
    "pow",
    "power",
    "mod",
    "pi",
    "degrees",
    "radians",
    "sin",
    "cos",
    "tan",
    "random",
    // Strings (results no longer than the arguments put together).
    "lower",
    "upper",
    "length",
    "octet_length",
    "substr",
    "substring",
    "trim",
    "ltrim",
    "rtrim",
    "instr",
    "unicode",
    "char",
    "concat",
    "concat_ws",
    "typeof",
    // Dates and times.
    "date",
    "time",
    "datetime",
    "julianday",
    "unixepoch",
    "strftime",
    "timediff",
    // JSON access (extraction only).
    "json_extract",
    "json_type",
    "json_valid",
    "json_array_length",
];

/// The default function allowlist of a dialect.
pub(crate) fn default_functions(dialect: SqlDialect) -> &'static [&'static str] {
    match dialect {
        SqlDialect::Postgres => POSTGRES_FUNCTIONS,
        SqlDialect::Sqlite => SQLITE_FUNCTIONS,
    }
}

/// Type names (lowercase, unquoted, unqualified) a value may be cast to: numbers, text, dates
/// and times, booleans, UUIDs, JSON, and arrays of these. Never the catalog lookup types
/// (`regclass`, …), whose input functions read the catalogs, nor types whose input function
/// parses a document or a query (`xml`, `tsquery`, `jsonpath`, …).
const CAST_TYPES: &[&str] = &[
    "smallint",
    "int",
    "integer",
    "bigint",
    "int2",
    "int4",
    "int8",
    "real",
    "float",
    "float4",
    "float8",
    "double",
    "double precision",
    "numeric",
    "decimal",
    "dec",
    "text",
    "varchar",
    "character varying",
    "char",
    "character",
    "bpchar",
    "string",
    "date",
    "time",
    "timetz",
    "time with time zone",
    "time without time zone",
    "timestamp",
    "timestamptz",
    "timestamp with time zone",
    "timestamp without time zone",
    "interval",
    "boolean",
    "bool",
    "uuid",
    "json",
    "jsonb",
];

/// SQLite's storage classes, also valid cast targets there.
const SQLITE_CAST_TYPES: &[&str] = &["blob", "none"];

/// The type's name as the allowlist compares it, or `None` when it is not a plain type name.
/// Built-in types are rendered by the parser from keywords (`DOUBLE PRECISION`), so their
/// rendering without modifiers is their name; other names (`"regclass"`, `pg_catalog.int4`) are
/// unquoted, lowercased and stripped of the `pg_catalog` qualifier.
fn type_name(data_type: &DataType, dialect: SqlDialect) -> Result<String, String> {
    match data_type {
        DataType::Custom(name, modifiers) => {
            let parts: Vec<String> = name
                .0
                .iter()
                .map(|p| match p {
                    ObjectNamePart::Identifier(i) => i.value.to_lowercase(),
                    ObjectNamePart::Function(f) => f.to_string().to_lowercase(),
                })
                .collect();
            let last = parts.last().cloned().unwrap_or_default();
            let qualifier_ok = match parts.as_slice() {
                [_] => true,
                [schema, _] => dialect == SqlDialect::Postgres && schema == "pg_catalog",
                _ => false,
            };
            if !qualifier_ok {
                return Err(format!("{} (a type outside the built-in schema)", name));
            }
            if modifiers.iter().any(|m| m.parse::<u64>().is_err()) {
                return Err(format!(
                    "{last} with the modifiers ({})",
                    modifiers.join(", ")
                ));
            }
            Ok(last)
        }
        other => {
            let text = other.to_string().to_lowercase();
            let base = match text.find('(') {
                Some(open) => {
                    let close = text.rfind(')').unwrap_or(text.len());
                    let after = text.get(close + 1..).unwrap_or("").trim();
                    let before = text[..open].trim();
                    if after.is_empty() {
                        before.to_owned()
                    } else {
                        format!("{before} {after}")
                    }
                }
                None => text,
            };
            Ok(base.split_whitespace().collect::<Vec<_>>().join(" "))
        }
    }
}

/// Whether a cast to `data_type` is allowed; `Err` names the type for the message.
pub(crate) fn check_cast_type(data_type: &DataType, dialect: SqlDialect) -> Result<(), String> {
    if let DataType::Array(elem) = data_type {
        return match elem {
            ArrayElemTypeDef::SquareBracket(inner, _)
            | ArrayElemTypeDef::AngleBracket(inner)
            | ArrayElemTypeDef::Parenthesis(inner) => check_cast_type(inner, dialect),
            ArrayElemTypeDef::None => Err("ARRAY".to_owned()),
        };
    }
    let name = type_name(data_type, dialect)?;
    let allowed = CAST_TYPES.contains(&name.as_str())
        || (dialect == SqlDialect::Sqlite && SQLITE_CAST_TYPES.contains(&name.as_str()));
    if allowed { Ok(()) } else { Err(name) }
}

/// The cast target types, for messages.
pub(crate) fn cast_types_for_message() -> &'static str {
    "numeric, decimal, integer, bigint, smallint, real, double precision, text, varchar, char, \
     date, time, timestamp, timestamptz, interval, boolean, uuid, json, jsonb, and arrays of these"
}

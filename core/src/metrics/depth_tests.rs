//! The depth bound: it holds for every tree the parser builds, it is exact for the usual shapes,
//! and every way of nesting is refused before parsing, quickly, with a message that says what to
//! change; the deepest accepted queries run their whole life on a small stack.

use std::time::{Duration, Instant};

use promql_parser::parser::parse;
use proptest::prelude::*;

use super::*;
use crate::metrics::scope::{MetricsRules, Scope};
use crate::metrics::store::{CallRecord, CallStore};
use crate::metrics::{
    CALLS_METRIC, MAX_QUERY_BYTES, MetricsQuery, QueryTime, check_query, check_syntax, stack,
};
use crate::model::{Environment, Phase, Tool, Verdict};

/// `n` copies of `open`, `inner`, then `n` copies of `close`.
fn nest(open: &str, inner: &str, close: &str, n: usize) -> String {
    format!("{}{inner}{}", open.repeat(n), close.repeat(n))
}

/// Every way an expression nests, `n` levels of it (about `n` + 1 levels deep in all).
fn shapes(n: usize) -> Vec<(&'static str, String)> {
    shapes_of(n, "x")
}

/// [`shapes`] over the selector `selector`.
fn shapes_of(n: usize, selector: &str) -> Vec<(&'static str, String)> {
    let shapes = vec![
        ("signs with spaces", format!("{}X", "- ".repeat(n))),
        ("signs without spaces", format!("{}X", "-".repeat(n))),
        ("signs on a number", format!("{}1", "-".repeat(n))),
        ("plus signs", format!("{}X", "+".repeat(n))),
        ("alternating signs", format!("{}X", "+-".repeat(n / 2))),
        (
            "signs between comments",
            format!("{}X", "- # a comment\n".repeat(n)),
        ),
        ("signs in parentheses", nest("-(", "X", ")", n / 2)),
        ("parentheses", nest("(", "X", ")", n)),
        ("left-deep sum", format!("1{}", "+1".repeat(n))),
        ("right-deep power", format!("{}X", "X^".repeat(n))),
        ("mixed chain", format!("1{}", " + -1 * -1".repeat(n / 4))),
        (
            "set operators",
            format!("X{}", " and X or X unless X".repeat(n / 3)),
        ),
        ("comparisons", format!("X{}", " > bool 1".repeat(n))),
        ("atan2", format!("X{}", " atan2 X".repeat(n))),
        ("@ modifiers", format!("X{}", " @ 100".repeat(n))),
        ("function calls", nest("abs(", "X", ")", n)),
        ("aggregations", nest("sum(", "X", ")", n)),
        ("grouped aggregations", nest("sum by (a) (", "X", ")", n)),
        ("topk", nest("topk(1, ", "X", ")", n)),
        (
            "label_replace",
            nest("label_replace(", "X", r#", "a", "$1", "b", "(.*)")"#, n),
        ),
        ("subqueries", format!("X{}", "[5m:1m]".repeat(n))),
        // Two levels each: the call and the subquery.
        (
            "subqueries over calls",
            nest("max_over_time(", "X", "[5m:1m])", n / 2),
        ),
        (
            "offsets on subqueries",
            nest("rate(", "X", "[5m:1m] offset 1m)", n / 2),
        ),
        (
            "vector matching",
            format!("X{}", " + on (a) group_left (b) X".repeat(n)),
        ),
    ];
    shapes
        .into_iter()
        .map(|(name, q)| (name, q.replace('X', selector)))
        .collect()
}

/// Each shape with as many levels as fit in [`MAX_QUERY_BYTES`].
fn largest_shapes() -> Vec<(&'static str, String)> {
    let at = |n: usize| shapes(n);
    let (small, large) = (at(1000), at(2000));
    small
        .into_iter()
        .zip(large)
        .map(|((name, a), (_, b))| {
            let per_level = (b.len() - a.len()) as f64 / 1000.0;
            let mut n = ((MAX_QUERY_BYTES - a.len()) as f64 / per_level) as usize + 1000;
            loop {
                let (_, q) = at(n).into_iter().find(|(s, _)| *s == name).expect("shape");
                if q.len() <= MAX_QUERY_BYTES {
                    return (name, q);
                }
                n -= 1;
            }
        })
        .collect()
}

#[test]
fn the_bound_is_exact_for_the_usual_shapes() {
    for (q, depth) in [
        ("up", 1),
        ("a + b + c", 3),
        ("abs(abs(x))", 3),
        ("sum(rate(x[5m]))", 3),
        ("sum by (job) (rate(x[5m]))", 3),
        ("x[5m:1m]", 2),
        ("max_over_time(x[5m:1m])[10m:1m]", 4),
        ("topk(3, sum(x))", 3),
        (r#"x{a="1" or b=~"2", c!="3"}"#, 1),
        ("-x", 2),
        ("x offset 5m", 1),
        ("sum(x) / on (a) group_left (b) sum(y)", 3),
    ] {
        let expr = parse(q).expect(q);
        assert_eq!(expr_depth(&expr), depth, "{q}: its tree");
        assert_eq!(bound(q), depth, "{q}: its bound");
    }
}

#[test]
fn every_way_of_nesting_is_bounded_at_the_limit() {
    // One level below the limit of each shape is accepted (or is invalid PromQL for another
    // reason); far past it each is refused by the bound, not by the parser.
    for (name, q) in shapes(MAX_EXPR_DEPTH - 2) {
        let b = bound(&q);
        assert!(b <= MAX_EXPR_DEPTH, "{name}: bound {b} for {q}");
        if let Ok(expr) = parse(&q) {
            assert!(expr_depth(&expr) <= b, "{name}: {q}");
        }
        if let Err(e) = check_syntax(&q) {
            assert!(!e.to_string().contains("too deeply"), "{name}: {e}");
        }
    }
    for (name, q) in shapes(MAX_EXPR_DEPTH + 2) {
        assert!(matches!(check(&q), Err(Refusal::TooDeep(_))), "{name}: {q}");
    }
}

#[test]
fn hostile_queries_are_refused_quickly_with_what_to_change() {
    let mut slowest = Duration::ZERO;
    // As many levels as fit in the size limit.
    for (name, q) in largest_shapes() {
        let started = Instant::now();
        let err = check_syntax(&q).unwrap_err().to_string();
        let took = started.elapsed();
        slowest = slowest.max(took);
        println!("{name}: {} bytes refused in {took:?}", q.len());
        assert!(err.contains("nests too deeply"), "{name}: {err}");
        assert!(
            err.contains("passes 64 levels, the most accepted"),
            "{name}: {err}"
        );
        assert!(
            err.contains("line 1, column") || err.contains("line "),
            "{name}: {err}"
        );
        assert!(err.contains("split a long chain"), "{name}: {err}");
    }
    // The issue's query: 100,000 operators. Over the size limit it is refused by size; the
    // depth bound alone refuses it too, reading it once.
    let chain = format!("{}x", "- ".repeat(100_000));
    let started = Instant::now();
    let err = check_syntax(&chain).unwrap_err().to_string();
    println!("100,000 signs: refused in {:?}: {err}", started.elapsed());
    assert!(err.contains("at most 65536"), "{err}");
    let started = Instant::now();
    let refusal = check(&chain).unwrap_err();
    let took = started.elapsed();
    println!("100,000 signs, depth bound alone: {took:?}: {refusal:?}");
    assert!(
        matches!(refusal, Refusal::TooDeep(ref at) if at.column == 127),
        "{refusal:?}"
    );
    // Generous upper bounds (a debug build on a busy machine): the work is one linear pass, and
    // the bound only guards against it becoming quadratic again.
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
}

#[test]
fn the_message_points_at_where_the_limit_is_passed() {
    let q = format!("sum(rate(x[5m])) +\n  {}x", "-".repeat(100));
    let err = check_syntax(&q).unwrap_err().to_string();
    // sum(rate(x[5m])) is 3 levels, `+` 1: the 61st sign passes 64.
    assert!(err.contains("at line 2, column 63 (at `-`)"), "{err}");
}

#[test]
fn width_is_bounded_too() {
    // Wide, not deep: a call with many short arguments.
    let wide = format!("vector(sum(x){})", ", sum(x)".repeat(MAX_TOKENS / 5));
    match check(&wide) {
        Err(Refusal::TooLong(n)) => assert!(n > MAX_TOKENS),
        other => panic!("{other:?}"),
    }
    let err = check_syntax(&wide).unwrap_err().to_string();
    assert!(err.contains("at most 1000 are accepted"), "{err}");
}

#[test]
fn lexical_errors_keep_the_parser_message() {
    let err = check_syntax(&format!("{}x $", "-".repeat(10))).unwrap_err();
    assert!(err.to_string().contains("unexpected character"), "{err}");
    let err = check_syntax(&"(".repeat(50_000)).unwrap_err();
    assert!(
        err.to_string().contains("unclosed left parenthesis"),
        "{err}"
    );
}

/// The deepest accepted query of each shape: parsed, scoped, rendered, evaluated and dropped
/// on a thread whose stack is 512 KiB, a 16th of a PromQL thread's and a quarter of an async
/// worker's. The bound keeps every recursion (the parser's type checks, `Display`, `Drop`, the
/// scope walk, the evaluator) within 64 levels, and 64 levels fit there in a debug build (the
/// evaluator is the hungriest, about 5 KiB a level: 64 levels of it overflow 256 KiB).
#[test]
fn the_deepest_accepted_queries_fit_a_small_stack() {
    const SMALL_STACK: usize = 512 * 1024;
    let store = CallStore::new();
    store.record(&CallRecord::new(
        Tool::Python,
        "a",
        Environment::Sandbox,
        Some(Verdict::Allow),
        Phase::Succeeded.as_str(),
    ));
    let rules = MetricsRules::default();
    let scope = Scope::of(&rules, Some("a"));
    let worst: Vec<(&str, String)> = shapes_of(MAX_EXPR_DEPTH + 8, CALLS_METRIC)
        .into_iter()
        .map(|(name, _)| {
            // The longest prefix of the shape the bound accepts, closed.
            let mut n = MAX_EXPR_DEPTH + 8;
            loop {
                let (_, q) = shapes_of(n, CALLS_METRIC)
                    .into_iter()
                    .find(|(s, _)| *s == name)
                    .expect("shape");
                if check(&q).is_ok() {
                    return (name, q);
                }
                n -= 1;
            }
        })
        .collect();
    std::thread::Builder::new()
        .stack_size(SMALL_STACK)
        .spawn(move || {
            stack::pretend_query_thread();
            for (name, q) in &worst {
                let depth = parse(q).map(|e| expr_depth(&e)).unwrap_or(0);
                let time = QueryTime::Instant(jiff::Timestamp::now());
                let query = MetricsQuery {
                    query: q.clone(),
                    time,
                };
                let evaluated = store.query(&query);
                let scoped = scope.apply(q);
                let checked = check_query(q);
                println!(
                    "{name}: depth {depth}, evaluated: {:?}, scoped: {:?}, checked: {:?}",
                    evaluated.map(|r| r.result.len()),
                    scoped.map(|s| s.len()),
                    checked
                );
            }
            // Syntax errors at the deepest level are located by parsing prefixes: as deep.
            let q = format!("{}x )", "-".repeat(MAX_EXPR_DEPTH - 1));
            let err = check_syntax(&q).unwrap_err().to_string();
            assert!(err.contains("line 1"), "{err}");
        })
        .expect("thread")
        .join()
        .expect("the deepest accepted queries fit a 256 KiB stack");
}

/// PromQL-like text from the pieces of every nesting mechanism, valid or not.
fn promql() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("x".to_owned()),
        Just("1".to_owned()),
        Just("x[5m]".to_owned()),
        Just(r#"x{a="b"}"#.to_owned()),
        Just(r#""s""#.to_owned()),
    ];
    leaf.prop_recursive(8, 64, 3, |inner| {
        let op = prop_oneof![
            Just("+"),
            Just("-"),
            Just("*"),
            Just("/"),
            Just("^"),
            Just(" and "),
            Just(" or "),
            Just(" > bool "),
            Just(" atan2 "),
            Just(" + on (a) "),
        ];
        prop_oneof![
            (op, inner.clone(), inner.clone()).prop_map(|(o, a, b)| format!("{a}{o}{b}")),
            inner.clone().prop_map(|a| format!("-{a}")),
            inner.clone().prop_map(|a| format!("+ {a}")),
            inner.clone().prop_map(|a| format!("({a})")),
            inner.clone().prop_map(|a| format!("abs({a})")),
            inner.clone().prop_map(|a| format!("sum by (a) ({a})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("topk({a}, {b})")),
            inner.clone().prop_map(|a| format!("{a}[5m:1m]")),
            inner.clone().prop_map(|a| format!("{a} offset 5m")),
            inner.clone().prop_map(|a| format!("{a} @ 10")),
            inner.prop_map(|a| format!("max_over_time({a}[5m:])")),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn no_tree_is_deeper_than_its_bound(q in promql()) {
        if let Ok(expr) = parse(&q) {
            prop_assert!(expr_depth(&expr) <= bound(&q), "{q}");
        }
    }
}

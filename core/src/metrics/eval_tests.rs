use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::metrics::{
    CallRecord, CallStore, MetricsError, MetricsQuery, MetricsResult, QueryTime, ResultType,
};
use crate::model::{Environment, Phase, Tool, Verdict};

/// A fixed "now" so every test is reproducible.
fn now() -> Timestamp {
    Timestamp::from_second(1_764_410_400).unwrap()
}

fn ago(secs: i64) -> Timestamp {
    now().checked_sub(SignedDuration::from_secs(secs)).unwrap()
}

fn call(tool: Tool, agent: &str, verdict: Verdict, phase: Phase) -> CallRecord {
    CallRecord::new(
        tool,
        agent,
        Environment::Sandbox,
        Some(verdict),
        phase.as_str(),
    )
}

fn python(agent: &str) -> CallRecord {
    call(Tool::Python, agent, Verdict::Allow, Phase::Succeeded)
}

fn instant(store: &CallStore, q: &str) -> Result<MetricsResult, MetricsError> {
    store.query(&MetricsQuery {
        query: q.into(),
        time: QueryTime::Instant(now()),
    })
}

/// The single value of an instant query, as a number.
fn value(store: &CallStore, q: &str) -> f64 {
    let r = instant(store, q).unwrap_or_else(|e| panic!("{q}: {e}"));
    assert_eq!(r.result.len(), 1, "{q}: {r:?}");
    r.result[0].value.as_ref().unwrap().1.parse().unwrap()
}

/// A store with 7 python calls in the last hour, 3 older ones, and some sql calls.
fn store() -> CallStore {
    let s = CallStore::new();
    for secs in [7200, 5000, 3700] {
        s.record_at(&python("old"), ago(secs));
    }
    for (i, secs) in [3500, 3000, 2000, 1000, 600, 60, 1].into_iter().enumerate() {
        let agent = if i % 2 == 0 {
            "analyst-01"
        } else {
            "analyst-02"
        };
        s.record_at(&python(agent), ago(secs));
    }
    s.record_at(
        &call(Tool::Sql, "analyst-01", Verdict::Block, Phase::Rejected),
        ago(100),
    );
    s.record_at(
        &call(Tool::Sql, "analyst-01", Verdict::Allow, Phase::Succeeded),
        ago(50),
    );
    s
}

#[test]
fn python_calls_in_the_last_hour_are_counted_exactly() {
    let s = store();
    let q = r#"sum(increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))"#;
    assert_eq!(value(&s, q), 7.0);
    // Nothing else leaks in: all calls ever, and per agent.
    assert_eq!(
        value(&s, r#"sum(sandboxrun_tool_calls_total{tool="run_python"})"#),
        10.0
    );
    let r = instant(
        &s,
        r#"sum by (agent) (increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))"#,
    )
    .unwrap();
    let per_agent: Vec<(String, String)> = r
        .result
        .iter()
        .map(|s| (s.metric["agent"].clone(), s.value.clone().unwrap().1))
        .collect();
    assert_eq!(
        per_agent,
        [
            ("analyst-01".into(), "4".into()),
            ("analyst-02".into(), "3".into()),
            ("old".into(), "0".into())
        ]
    );
    assert_eq!(r.result_type, ResultType::Vector);
    assert_eq!(r.result[0].value.as_ref().unwrap().0, 1_764_410_400.0);
}

#[test]
fn n_calls_give_n() {
    for n in [0u32, 1, 5, 40] {
        let s = CallStore::new();
        s.record_at(&python("x"), ago(4000)); // outside the window
        for i in 0..n {
            s.record_at(&python("x"), ago(3599 - i64::from(i)));
        }
        let q = r#"sum(increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))"#;
        assert_eq!(value(&s, q), f64::from(n), "n = {n}");
    }
}

#[test]
fn matchers_select_series() {
    let s = store();
    let count = |q: &str| value(&s, &format!("sum(increase({q}[1h]))"));
    assert_eq!(
        count(r#"sandboxrun_tool_calls_total{tool!="run_python"}"#),
        2.0
    );
    assert_eq!(
        count(r#"sandboxrun_tool_calls_total{agent=~"analyst-.*"}"#),
        9.0
    );
    assert_eq!(
        count(r#"sandboxrun_tool_calls_total{agent!~"analyst-0[12]"}"#),
        0.0
    );
    assert_eq!(
        count(r#"sandboxrun_tool_calls_total{verdict="Block",phase="Rejected"}"#),
        1.0
    );
    assert_eq!(
        count(r#"{__name__="sandboxrun_tool_calls_total",tool="execute_sql"}"#),
        2.0
    );
    // Regexes are anchored, as in Prometheus.
    assert!(
        instant(&s, r#"sandboxrun_tool_calls_total{agent=~"analyst"}"#)
            .unwrap()
            .result
            .is_empty()
    );
}

#[test]
fn range_functions() {
    let s = store();
    let base = r#"sandboxrun_tool_calls_total{tool="run_python",agent="analyst-01"}"#;
    assert_eq!(value(&s, &format!("increase({base}[1h])")), 4.0);
    assert_eq!(value(&s, &format!("delta({base}[1h])")), 4.0);
    assert_eq!(value(&s, &format!("rate({base}[1h])")), 4.0 / 3600.0);
    assert_eq!(value(&s, &format!("count_over_time({base}[11m])")), 2.0);
    // Windows are open on the left, as in Prometheus 3: the call exactly 10 minutes ago is out.
    assert_eq!(value(&s, &format!("count_over_time({base}[10m])")), 1.0);
    // count_over_time leaves out series without calls in the window; increase reports 0.
    let old = r#"sandboxrun_tool_calls_total{agent="old"}"#;
    assert!(
        instant(&s, &format!("count_over_time({old}[1h])"))
            .unwrap()
            .result
            .is_empty()
    );
    assert_eq!(value(&s, &format!("increase({old}[1h])")), 0.0);
    assert_eq!(value(&s, &format!("increase({old}[1h] offset 1h)")), 2.0);
    // Functions drop the metric name; a raw selector keeps it.
    let r = instant(&s, &format!("increase({base}[1h])")).unwrap();
    assert!(!r.result[0].metric.contains_key("__name__"));
    let r = instant(&s, base).unwrap();
    assert_eq!(
        r.result[0].metric["__name__"],
        "sandboxrun_tool_calls_total"
    );
    assert_eq!(r.result[0].metric["environment"], "sandbox");
    assert_eq!(r.result[0].value.as_ref().unwrap().1, "4");
}

#[test]
fn a_raw_range_selector_returns_one_sample_per_call() {
    let s = store();
    let r = instant(&s, r#"sandboxrun_tool_calls_total{agent="analyst-02"}[1h]"#).unwrap();
    assert_eq!(r.result_type, ResultType::Matrix);
    let values = r.result[0].values.as_ref().unwrap();
    let counts: Vec<&str> = values.iter().map(|(_, v)| v.as_str()).collect();
    assert_eq!(counts, ["1", "2", "3"]);
    assert_eq!(values[0].0, 1_764_410_400.0 - 3000.0);
}

#[test]
fn aggregations_by_and_without() {
    let s = store();
    let inc = r#"increase(sandboxrun_tool_calls_total[1h])"#;
    assert_eq!(value(&s, &format!("count({inc})")), 5.0);
    assert_eq!(value(&s, &format!("max({inc})")), 4.0);
    assert_eq!(value(&s, &format!("min({inc})")), 0.0);
    assert_eq!(value(&s, &format!("avg({inc})")), 9.0 / 5.0);
    let r = instant(&s, &format!("sum without (agent, verdict, phase) ({inc})")).unwrap();
    let tools: Vec<(&str, &str)> = r
        .result
        .iter()
        .map(|x| {
            (
                x.metric["tool"].as_str(),
                x.value.as_ref().unwrap().1.as_str(),
            )
        })
        .collect();
    assert_eq!(tools, [("execute_sql", "2"), ("run_python", "7")]);
    assert_eq!(r.result[0].metric.len(), 2, "{:?}", r.result[0].metric);
    let r = instant(&s, &format!("sum by (tool, verdict) ({inc})")).unwrap();
    assert_eq!(r.result.len(), 3);
}

#[test]
fn arithmetic_and_comparisons() {
    let s = store();
    assert_eq!(value(&s, "1 + 2 * 3"), 7.0);
    assert_eq!(value(&s, "2 ^ 10 / 4"), 256.0);
    assert_eq!(value(&s, "-(3 % 2)"), -1.0);
    assert_eq!(value(&s, "5 > bool 3"), 1.0);
    let py = r#"sum(increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))"#;
    assert_eq!(value(&s, &format!("{py} * 60")), 420.0);
    assert_eq!(value(&s, &format!("100 / {py}")), 100.0 / 7.0);
    assert_eq!(value(&s, &format!("{py} > bool 10")), 0.0);
    assert!(
        instant(&s, &format!("{py} > 10"))
            .unwrap()
            .result
            .is_empty()
    );
    assert_eq!(value(&s, &format!("{py} >= 7")), 7.0);
    // One-to-one between vectors: blocked share of sql calls.
    let blocked = r#"sum by (tool) (increase(sandboxrun_tool_calls_total{verdict="Block"}[1h]))"#;
    let all = r#"sum by (tool) (increase(sandboxrun_tool_calls_total[1h]))"#;
    let r = instant(&s, &format!("{blocked} / {all}")).unwrap();
    assert_eq!(r.result.len(), 1);
    assert_eq!(r.result[0].metric["tool"], "execute_sql");
    assert_eq!(r.result[0].value.as_ref().unwrap().1, "0.5");
    let r = instant(&s, &format!("{blocked} / on () sum({all})")).unwrap();
    assert_eq!(
        r.result[0].value.as_ref().unwrap().1,
        (1.0f64 / 9.0).to_string()
    );
    assert!(r.result[0].metric.is_empty());
    assert_eq!(value(&s, "scalar(vector(3)) + time() - time()"), 3.0);
}

#[test]
fn range_queries_step_through_time() {
    let s = store();
    let r = s
        .query(&MetricsQuery {
            query: r#"sum(increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))"#.into(),
            time: QueryTime::range(ago(3600), now(), Duration::from_secs(1800)).unwrap(),
        })
        .unwrap();
    assert_eq!(r.result_type, ResultType::Matrix);
    let values = r.result[0].values.as_ref().unwrap();
    let got: Vec<(f64, &str)> = values.iter().map(|(t, v)| (*t, v.as_str())).collect();
    let t = 1_764_410_400.0;
    // At -1h: calls in (-2h, -1h] = the old ones at -5000 s and -3700 s.
    assert_eq!(got, [(t - 3600.0, "2"), (t - 1800.0, "5"), (t, "7")]);
    let err = s
        .query(&MetricsQuery {
            query: "sandboxrun_tool_calls_total[5m]".into(),
            time: QueryTime::range(ago(60), now(), Duration::from_secs(30)).unwrap(),
        })
        .unwrap_err();
    assert!(err.to_string().contains("range query needs"), "{err}");
}

#[test]
fn unsupported_queries_say_what_is_supported() {
    let s = store();
    let err = |q: &str| instant(&s, q).unwrap_err();
    let e = err("up");
    assert!(matches!(e, MetricsError::Unsupported(_)), "{e:?}");
    assert!(e.to_string().contains("no metric up"), "{e}");
    assert!(e.to_string().contains("cluster mode"), "{e}");
    for q in [
        "histogram_quantile(0.9, sandboxrun_tool_calls_total)",
        "topk(3, sandboxrun_tool_calls_total)",
        "sandboxrun_tool_calls_total and sandboxrun_tool_calls_total",
        "max_over_time(sandboxrun_tool_calls_total[5m:1m])",
        "sandboxrun_tool_calls_total @ 100",
    ] {
        let e = err(q);
        assert!(matches!(e, MetricsError::Unsupported(_)), "{q}: {e:?}");
        assert!(e.to_string().contains("increase, rate"), "{q}: {e}");
    }
    let e = err("sum(rate(x[5m]) by (");
    assert!(matches!(e, MetricsError::Parse(_)), "{e:?}");
    assert!(e.is_query_error());
    let e = err("  ");
    assert!(e.to_string().contains("empty"), "{e}");
    // Type errors are caught by the parser already.
    let e = err("sum(sandboxrun_tool_calls_total[5m])");
    assert!(matches!(e, MetricsError::Parse(_)), "{e:?}");
    assert!(e.to_string().contains("expected type vector"), "{e}");
}

#[test]
fn no_calls_no_series() {
    let s = CallStore::new();
    let r = instant(&s, "sum(increase(sandboxrun_tool_calls_total[1h]))").unwrap();
    assert!(r.result.is_empty());
    assert!(!r.truncated);
}

// Hostile shapes: nothing recurses over a query deeper than the bounds, and evaluation stops at
// its deadline. Before the bounds, aggregations nested a few thousand deep as a range query
// overflowed the stack of the async worker and aborted the whole embedded server.

fn range(q: &str) -> MetricsQuery {
    MetricsQuery {
        query: q.into(),
        time: QueryTime::Range {
            start: ago(3600),
            end: now(),
            step: Duration::from_secs(1),
        },
    }
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    let store = CallStore::new();
    store.record_at(&python("a"), ago(10));
    // Past the depth limit, or past the size limit (which is checked first).
    for depth in [65, 3_000, 20_000] {
        for (open, close) in [("sum(", ")"), ("(", ")"), ("abs(", ")"), ("-(", ")")] {
            let q = format!(
                "{}sandboxrun_tool_calls_total{}",
                open.repeat(depth),
                close.repeat(depth)
            );
            let err = store.query(&range(&q)).unwrap_err();
            assert!(
                matches!(err, MetricsError::BadRequest(_)),
                "{open} x{depth}: {err}"
            );
        }
    }
    let err = store
        .query(&range(&format!("{}1{}", "(".repeat(70), ")".repeat(70))))
        .unwrap_err();
    assert!(err.to_string().contains("passes 64 levels"), "{err}");
    // Brackets inside strings and comments do not count.
    let quoted = format!(
        "count(sandboxrun_tool_calls_total{{agent=\"{}\"}})",
        "(".repeat(100)
    );
    assert!(store.query(&range(&quoted)).is_ok());
}

#[test]
fn long_operator_chains_are_refused() {
    let store = CallStore::new();
    store.record_at(&python("a"), ago(10));
    for n in [200, 5_000] {
        let chain = vec!["sandboxrun_tool_calls_total"; n].join(" + ");
        let chain = &chain[..chain.len().min(crate::metrics::MAX_QUERY_BYTES)];
        let err = store.query(&range(chain)).unwrap_err();
        assert!(matches!(err, MetricsError::BadRequest(_)), "{n}: {err}");
    }
    let chain = vec!["1"; 300].join(" - ");
    let err = store.query(&range(&chain)).unwrap_err();
    assert!(err.to_string().contains("nests too deeply"), "{err}");
    // Within the bounds a chain works.
    let ok = vec!["1"; 20].join(" + ");
    assert_eq!(
        store.query(&range(&ok)).unwrap().result[0]
            .values
            .as_ref()
            .unwrap()[0]
            .1,
        "20"
    );
}

#[test]
fn evaluation_stops_at_its_deadline() {
    let store = CallStore::new();
    for i in 0..2_000 {
        store.record_at(&python(&format!("agent-{i}")), ago(i % 3000));
    }
    let q = MetricsQuery {
        query: "sum by (agent) (increase(sandboxrun_tool_calls_total[1h]))".into(),
        time: QueryTime::Range {
            start: ago(10_000),
            end: now(),
            step: Duration::from_secs(1),
        },
    };
    let err = store
        .query_within(&q, Duration::from_millis(20))
        .unwrap_err();
    assert_eq!(err, MetricsError::Timeout(Duration::from_millis(20)));
}

#[tokio::test]
async fn async_evaluation_runs_off_the_workers_and_keeps_the_deadline() {
    let store = CallStore::new();
    store.record_at(&python("a"), ago(10));
    let r = store
        .evaluate(
            &range("sum(sandboxrun_tool_calls_total)"),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(r.result_type, ResultType::Matrix);
}

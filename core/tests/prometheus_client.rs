//! `sandboxrun_core::metrics::PrometheusClient` against a real Prometheus started by
//! `e2e/prometheus/start.sh` (the Debian package, scraping itself).
//!
//! The tests read `SANDBOXRUN_TEST_PROMETHEUS_URL` (printed by start.sh). Without it they are
//! skipped with a note, unless `SANDBOXRUN_REQUIRE_PROMETHEUS=1` (CI), where they fail.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use sandboxrun_core::metrics::{
    MetricsError, MetricsQuery, PrometheusClient, QueryTime, ResultType,
};

fn prometheus_url() -> Option<String> {
    match std::env::var("SANDBOXRUN_TEST_PROMETHEUS_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url.trim().to_owned()),
        _ => {
            if std::env::var("SANDBOXRUN_REQUIRE_PROMETHEUS").as_deref() == Ok("1") {
                panic!(
                    "SANDBOXRUN_REQUIRE_PROMETHEUS=1 but SANDBOXRUN_TEST_PROMETHEUS_URL is not \
                     set: run e2e/prometheus/start.sh and export \
                     SANDBOXRUN_TEST_PROMETHEUS_URL=<the URL on its last line>"
                );
            }
            eprintln!(
                "note: skipping Prometheus test: SANDBOXRUN_TEST_PROMETHEUS_URL is not set (run \
                 e2e/prometheus/start.sh and export the URL it prints)"
            );
            None
        }
    }
}

fn client(url: &str) -> PrometheusClient {
    PrometheusClient::new(url, Duration::from_secs(20)).expect("a usable URL")
}

fn instant(query: &str) -> MetricsQuery {
    MetricsQuery {
        query: query.to_owned(),
        time: QueryTime::Instant(Timestamp::now()),
    }
}

#[tokio::test]
async fn instant_query_of_up_returns_the_self_scrape() {
    let Some(url) = prometheus_url() else { return };
    let r = client(&url).query(&instant("up")).await.expect("up");
    assert_eq!(r.result_type, ResultType::Vector);
    let own = r
        .result
        .iter()
        .find(|s| s.metric.get("job").map(String::as_str) == Some("prometheus"))
        .unwrap_or_else(|| panic!("no up{{job=\"prometheus\"}} in {r:?}"));
    assert_eq!(own.metric["__name__"], "up");
    let (t, v) = own.value.as_ref().expect("a vector sample has a value");
    assert_eq!(v, "1", "Prometheus scrapes itself successfully");
    let now = Timestamp::now().as_second() as f64;
    assert!((now - t).abs() < 60.0, "sample time {t} is now ({now})");
    assert!(!r.truncated);
}

#[tokio::test]
async fn range_query_returns_samples_every_step() {
    let Some(url) = prometheus_url() else { return };
    let end = Timestamp::now();
    let start = end.checked_sub(SignedDuration::from_secs(10)).unwrap();
    let q = MetricsQuery {
        query: r#"up{job="prometheus"}"#.to_owned(),
        time: QueryTime::range(start, end, Duration::from_secs(2)).unwrap(),
    };
    let r = client(&url).query(&q).await.expect("range query");
    assert_eq!(r.result_type, ResultType::Matrix);
    assert_eq!(r.result.len(), 1, "{r:?}");
    let values = r.result[0]
        .values
        .as_ref()
        .expect("matrix series have values");
    assert!(!values.is_empty(), "{r:?}");
    assert!(values.iter().all(|(_, v)| v == "1"), "{values:?}");
    let numbers = r.result[0].numbers();
    assert_eq!(numbers.len(), values.len());
    assert!(numbers.iter().all(|&(_, v)| v == 1.0), "{numbers:?}");
    assert!(
        values.windows(2).all(|w| w[1].0 - w[0].0 == 2.0),
        "{values:?}"
    );
}

#[tokio::test]
async fn scalar_and_aggregation_results_are_typed() {
    let Some(url) = prometheus_url() else { return };
    let c = client(&url);
    let r = c.query(&instant("1 + 2")).await.expect("scalar");
    assert_eq!(r.result_type, ResultType::Scalar);
    assert_eq!(r.result[0].value.as_ref().unwrap().1, "3");
    let r = c
        .query(&instant("count(up) by (job)"))
        .await
        .expect("aggregation");
    assert_eq!(r.result_type, ResultType::Vector);
    assert!(
        r.result
            .iter()
            .any(|s| s.metric.get("job").map(String::as_str) == Some("prometheus"))
    );
    assert!(r.result.iter().all(|s| !s.metric.contains_key("__name__")));
}

#[tokio::test]
async fn a_bad_query_is_a_query_error_with_prometheus_message() {
    let Some(url) = prometheus_url() else { return };
    let e = client(&url)
        .query(&instant("sum(rate(up[5m]) by ("))
        .await
        .unwrap_err();
    assert!(e.is_query_error(), "{e:?}");
    let MetricsError::Prometheus { error_type, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(error_type, "bad_data");
    assert!(e.to_string().contains("parse error"), "{e}");
    assert!(e.to_string().contains("fix the PromQL"), "{e}");
}

#[tokio::test]
async fn a_wrong_path_says_to_use_the_base_url() {
    let Some(url) = prometheus_url() else { return };
    // A path prefix that Prometheus does not serve: its 404 page is not the API.
    let e = client(&format!("{url}/not-prometheus"))
        .query(&instant("up"))
        .await
        .unwrap_err();
    assert!(matches!(e, MetricsError::Unavailable(_)), "{e:?}");
    assert!(e.to_string().contains("base URL"), "{e}");
}

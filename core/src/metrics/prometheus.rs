//! A client of the Prometheus HTTP API: `POST /api/v1/query` and `/api/v1/query_range` with a
//! form body, a deadline on the whole exchange, and a cap on the response size.
//!
//! Built on hyper with hyper-rustls (ring, the platform's root certificates), which kube already
//! brings into the tree. A `user:password@` in the URL becomes HTTP basic authentication and is
//! never logged or echoed ([`PrometheusClient::url`] is redacted).

use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use hyper::{Request, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use super::{MetricsError, MetricsQuery, MetricsResult, QueryTime, ResultType, Series};

/// Largest response body read from Prometheus; larger answers are refused with a hint.
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;
/// Deadline of one query when none is configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How requests leave: plain HTTP, or TLS with the platform's roots.
#[derive(Clone, Debug)]
enum Transport {
    Plain(Client<HttpConnector, Full<Bytes>>),
    Tls(Client<HttpsConnector<HttpConnector>, Full<Bytes>>),
}

/// Queries one Prometheus server.
#[derive(Clone, Debug)]
pub struct PrometheusClient {
    /// `scheme://host[:port][/prefix]`, without credentials and trailing slash.
    base: String,
    authorization: Option<HeaderValue>,
    transport: Transport,
    timeout: Duration,
}

impl PrometheusClient {
    /// A client of the Prometheus at `url` (its base URL: `http://prometheus:9090`, or with a
    /// path prefix such as `https://host/prometheus`); each query must finish within `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, MetricsError> {
        let bad = |why: &str| {
            MetricsError::BadRequest(format!(
                "the Prometheus URL {:?} is unusable: {why}; write its base URL, for example \
                 http://prometheus:9090",
                redact(url)
            ))
        };
        let uri: Uri = url.trim().parse().map_err(|_| bad("it is not a URL"))?;
        let scheme = uri
            .scheme_str()
            .ok_or_else(|| bad("it has no http:// or https://"))?;
        let authority = uri.authority().ok_or_else(|| bad("it has no host"))?;
        if uri.query().is_some() {
            return Err(bad("it has a query string"));
        }
        let (credentials, host) = match authority.as_str().rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo.to_owned()), host.to_owned()),
            None => (None, authority.as_str().to_owned()),
        };
        let path = uri.path().trim_end_matches('/');
        if path.ends_with("/api/v1") || path.contains("/api/v1/") {
            return Err(bad("give the base URL, without /api/v1"));
        }
        let authorization = credentials
            .map(|c| {
                let token = base64::engine::general_purpose::STANDARD.encode(c.as_bytes());
                HeaderValue::from_str(&format!("Basic {token}")).map(|mut v| {
                    v.set_sensitive(true);
                    v
                })
            })
            .transpose()
            .map_err(|_| bad("its credentials cannot be sent in a header"))?;
        let transport = match scheme {
            "http" => Transport::Plain(Client::builder(TokioExecutor::new()).build_http()),
            "https" => {
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_native_roots()
                    .map_err(|e| {
                        MetricsError::Unavailable(format!(
                            "cannot load the system's root certificates for {}: {e}",
                            redact(url)
                        ))
                    })?
                    .https_only()
                    .enable_http1()
                    .build();
                Transport::Tls(Client::builder(TokioExecutor::new()).build(connector))
            }
            other => return Err(bad(&format!("the scheme {other} is not http or https"))),
        };
        Ok(Self {
            base: format!("{scheme}://{host}{path}"),
            authorization,
            transport,
            timeout,
        })
    }

    /// The same client with another deadline per query (for example a run's timeout).
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self {
            timeout,
            ..self.clone()
        }
    }

    /// The deadline of one query.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The base URL, without credentials (for logs and messages).
    pub fn url(&self) -> &str {
        &self.base
    }

    /// Runs `q`: `/api/v1/query` for an instant, `/api/v1/query_range` for a range.
    pub async fn query(&self, q: &MetricsQuery) -> Result<MetricsResult, MetricsError> {
        if q.query.trim().is_empty() {
            return Err(MetricsError::BadRequest(
                "the query is empty: write a PromQL expression, for example up".to_owned(),
            ));
        }
        // The serializer is not Send: finish the body before anything awaits.
        let (endpoint, body) = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("query", &q.query);
            let endpoint = match q.time {
                QueryTime::Instant(t) => {
                    form.append_pair("time", &super::unix_seconds(t).to_string());
                    "query"
                }
                QueryTime::Range { start, end, step } => {
                    form.append_pair("start", &super::unix_seconds(start).to_string());
                    form.append_pair("end", &super::unix_seconds(end).to_string());
                    form.append_pair("step", &step.as_secs_f64().to_string());
                    "query_range"
                }
            };
            // Prometheus stops its own evaluation a little before we give up on the exchange.
            let server_timeout = self.timeout.saturating_sub(Duration::from_millis(500));
            form.append_pair(
                "timeout",
                &format!("{}ms", server_timeout.as_millis().max(1)),
            );
            (endpoint, form.finish())
        };
        let url = format!("{}/api/v1/{endpoint}", self.base);
        let mut request = Request::post(url.as_str())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| MetricsError::BadRequest(format!("cannot build the request: {e}")))?;
        if let Some(auth) = &self.authorization {
            request.headers_mut().insert(AUTHORIZATION, auth.clone());
        }
        let exchange = async {
            let response = match &self.transport {
                Transport::Plain(c) => c.request(request).await,
                Transport::Tls(c) => c.request(request).await,
            }
            .map_err(|e| {
                MetricsError::Unavailable(format!(
                    "cannot reach Prometheus at {}: {}; check the URL and that Prometheus is up",
                    self.base,
                    error_chain(&e)
                ))
            })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        MetricsError::BadRequest(format!(
                            "Prometheus's answer is larger than {} MiB: select fewer series \
                             (more label matchers, or aggregate with sum by (...)), a shorter \
                             range or a larger step",
                            MAX_RESPONSE_BYTES / (1024 * 1024)
                        ))
                    } else {
                        MetricsError::Unavailable(format!(
                            "reading Prometheus's answer from {} failed: {e}",
                            self.base
                        ))
                    }
                })?
                .to_bytes();
            Ok::<_, MetricsError>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| MetricsError::Timeout(self.timeout))??;
        parse_response(status.as_u16(), &body, &self.base)
    }
}

/// Prometheus's answer envelope.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: ResultType,
    result: serde_json::Value,
}

/// Turns an HTTP status and body from Prometheus into a result or an actionable error.
pub fn parse_response(status: u16, body: &[u8], base: &str) -> Result<MetricsResult, MetricsError> {
    let envelope: Envelope = serde_json::from_slice(body).map_err(|_| {
        let snippet: String = String::from_utf8_lossy(body).chars().take(200).collect();
        MetricsError::Unavailable(format!(
            "{base} answered HTTP {status} with something that is not the Prometheus API \
             ({snippet:?}); check that the URL is Prometheus's base URL (without /api/v1)"
        ))
    })?;
    if envelope.status != "success" {
        let error_type = envelope.error_type.unwrap_or_else(|| "error".to_owned());
        let hint = match error_type.as_str() {
            "bad_data" => "; fix the PromQL expression or the time arguments",
            "timeout" => "; narrow the time range, use a larger step or select fewer series",
            "execution" => {
                "; the query is valid but failed while running (often too many series or \
                 samples): narrow it"
            }
            "unavailable" => "; Prometheus is not ready, retry later",
            _ => "",
        }
        .to_owned();
        return Err(MetricsError::Prometheus {
            error_type,
            message: envelope
                .error
                .unwrap_or_else(|| format!("HTTP {status} without an error message")),
            hint,
        });
    }
    let data = envelope.data.ok_or_else(|| {
        MetricsError::Unavailable(format!("{base} answered success without data"))
    })?;
    let result = match data.result_type {
        ResultType::Vector | ResultType::Matrix => {
            serde_json::from_value::<Vec<Series>>(data.result).map_err(|e| {
                MetricsError::Unavailable(format!(
                    "{base} answered a {:?} result this client cannot read: {e}",
                    data.result_type
                ))
            })?
        }
        ResultType::Scalar | ResultType::String => {
            let sample = parse_sample(&data.result).ok_or_else(|| {
                MetricsError::Unavailable(format!(
                    "{base} answered a scalar that is not [time, \"value\"]"
                ))
            })?;
            vec![Series {
                metric: Default::default(),
                value: Some(sample),
                values: None,
            }]
        }
    };
    let series_total = result.len() as u64;
    Ok(MetricsResult {
        result_type: data.result_type,
        result,
        truncated: false,
        series_total,
        warnings: envelope.warnings,
    }
    .capped())
}

fn parse_sample(v: &serde_json::Value) -> Option<(f64, String)> {
    let pair = v.as_array()?;
    Some((pair.first()?.as_f64()?, pair.get(1)?.as_str()?.to_owned()))
}

/// `scheme://user:password@host/...` with the credentials replaced by `***`.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_owned(),
    }
}

/// An error and its sources, joined (hyper's top-level messages say little on their own).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_credentials_redacted() {
        let c =
            PrometheusClient::new("http://user:secret@127.0.0.1:9090/", DEFAULT_TIMEOUT).unwrap();
        assert_eq!(c.url(), "http://127.0.0.1:9090");
        assert!(c.authorization.is_some());
        let c = PrometheusClient::new("http://prom/prefix", DEFAULT_TIMEOUT).unwrap();
        assert_eq!(c.url(), "http://prom/prefix");
        for bad in [
            "prometheus:9090",
            "ftp://x",
            "http://x/api/v1",
            "http://x/api/v1/query",
            "http://x?a=b",
            "",
        ] {
            assert!(
                PrometheusClient::new(bad, DEFAULT_TIMEOUT).is_err(),
                "{bad}"
            );
        }
        let e = PrometheusClient::new("ftp://u:pw@x", DEFAULT_TIMEOUT).unwrap_err();
        assert!(!e.to_string().contains("pw"), "{e}");
        assert_eq!(redact("http://u:pw@h:1/p"), "http://***@h:1/p");
        assert_eq!(redact("http://h:1"), "http://h:1");
    }

    #[test]
    fn responses_map_to_results() {
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"up","job":"prometheus"},"value":[1764410400.5,"1"]}]}}"#;
        let r = parse_response(200, vector, "b").unwrap();
        assert_eq!(r.result_type, ResultType::Vector);
        assert_eq!(r.result[0].metric["job"], "prometheus");
        assert_eq!(r.result[0].value, Some((1_764_410_400.5, "1".to_owned())));
        let matrix = br#"{"status":"success","warnings":["w"],"data":{"resultType":"matrix",
            "result":[{"metric":{},"values":[[1,"1"],[2,"2"]]}]}}"#;
        let r = parse_response(200, matrix, "b").unwrap();
        assert_eq!(r.result[0].values.as_ref().unwrap().len(), 2);
        assert_eq!(r.warnings, ["w"]);
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[3,"42"]}}"#;
        let r = parse_response(200, scalar, "b").unwrap();
        assert_eq!(r.result_type, ResultType::Scalar);
        assert_eq!(r.result[0].value, Some((3.0, "42".to_owned())));
    }

    #[test]
    fn errors_say_what_to_change() {
        let bad = br#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected <EOF>"}"#;
        let e = parse_response(400, bad, "b").unwrap_err();
        assert!(e.is_query_error());
        let text = e.to_string();
        assert!(
            text.starts_with("Prometheus answered bad_data: 1:5: parse error"),
            "{text}"
        );
        assert!(text.contains("fix the PromQL"), "{text}");
        let e = parse_response(404, b"404 page not found", "http://x").unwrap_err();
        assert!(matches!(e, MetricsError::Unavailable(_)));
        assert!(e.to_string().contains("without /api/v1"), "{e}");
    }

    #[tokio::test]
    async fn an_unreachable_server_is_unavailable() {
        // Port 9 (discard) on localhost: nothing listens there in the test environment.
        let c = PrometheusClient::new("http://127.0.0.1:9", Duration::from_secs(5)).unwrap();
        let q = MetricsQuery {
            query: "up".into(),
            time: QueryTime::Instant(jiff::Timestamp::now()),
        };
        let e = c.query(&q).await.unwrap_err();
        assert!(matches!(e, MetricsError::Unavailable(_)), "{e:?}");
        assert!(
            e.to_string()
                .contains("cannot reach Prometheus at http://127.0.0.1:9"),
            "{e}"
        );
    }
}

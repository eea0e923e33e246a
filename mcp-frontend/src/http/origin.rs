//! Origin and Host validation, the defence against DNS rebinding and cross-site requests from
//! a browser: a web page can make a browser send requests to this server, but it cannot forge
//! the `Origin` header, and a rebound DNS name still shows up in `Host`. Requests without an
//! `Origin` (every non-browser client) pass, and so do pages of the server's own origin: an
//! `Origin` that is `http://` or `https://` followed by exactly the request's `Host`, which the
//! Host check then requires to be an allowed one (a rebound name is same-origin with its own page
//! too, and fails there).

use axum::http::HeaderMap;
use axum::http::header::{HOST, ORIGIN};

/// Allowed `Origin` and `Host` values.
#[derive(Clone, Debug)]
pub struct OriginPolicy {
    /// Normalized origins (`scheme://host[:port]`, lowercase, no trailing slash).
    origins: Vec<String>,
    /// Lowercase `host` (any port) or `host:port` entries; empty means any host.
    hosts: Vec<String>,
}

/// Why a request was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The `Origin` is not in the allowed list.
    Origin(String),
    /// The `Host` is missing or not in the allowed list.
    Host(String),
}

/// Hosts allowed when none are configured: loopback only, like rmcp's default.
pub const DEFAULT_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

fn normalize_origin(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// Splits `host[:port]`, including `[v6]:port`, into a lowercase host and an optional port.
fn split_host(authority: &str) -> (String, Option<&str>) {
    let authority = authority.trim();
    if let Some(rest) = authority.strip_prefix('[')
        && let Some((host, tail)) = rest.split_once(']')
    {
        return (host.to_ascii_lowercase(), tail.strip_prefix(':'));
    }
    match authority.rsplit_once(':') {
        // A bare IPv6 address has several colons and no port.
        Some((host, port)) if !host.contains(':') => (host.to_ascii_lowercase(), Some(port)),
        _ => (authority.to_ascii_lowercase(), None),
    }
}

/// Whether a normalized `Origin` names exactly the authority of the request's `Host`, with the
/// scheme http or https (behind a TLS-terminating proxy the server cannot tell which one the page
/// used). Exact text: another port, a trailing dot, another spelling of an address or a missing
/// port is another origin (browsers send both headers as they serialize them, so a page of this
/// server matches); `null` and schemeless values never match.
fn same_origin(origin: &str, host: &str) -> bool {
    let host = host.trim().to_ascii_lowercase();
    !host.is_empty()
        && ["http://", "https://"]
            .iter()
            .any(|scheme| origin.strip_prefix(scheme) == Some(host.as_str()))
}

impl OriginPolicy {
    /// `hosts` containing `*` allows any host; an empty `hosts` list means [`DEFAULT_HOSTS`].
    pub fn new(origins: &[String], hosts: &[String]) -> Self {
        let hosts: Vec<String> = if hosts.is_empty() {
            DEFAULT_HOSTS.iter().map(|h| (*h).to_owned()).collect()
        } else if hosts.iter().any(|h| h.trim() == "*") {
            Vec::new()
        } else {
            hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect()
        };
        Self {
            origins: origins.iter().map(|o| normalize_origin(o)).collect(),
            hosts,
        }
    }

    /// The allowed hosts in rmcp's format, or `None` for any host.
    pub fn rmcp_allowed_hosts(&self) -> Option<Vec<String>> {
        (!self.hosts.is_empty()).then(|| self.hosts.clone())
    }

    fn host_allowed(&self, authority: &str) -> bool {
        if self.hosts.is_empty() {
            return true;
        }
        let (host, port) = split_host(authority);
        self.hosts.iter().any(|entry| {
            let (e_host, e_port) = split_host(entry);
            e_host == host && (e_port.is_none() || e_port == port)
        })
    }

    /// Checks the headers of a request for `/metrics`: like [`OriginPolicy::check`], except
    /// that a `Host` that is an IP address passes (scrapers address Pods by IP; a rebound DNS
    /// name, the attack the Host check defends against, is never an IP literal).
    pub fn check_scrape(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let host = headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if headers.get(ORIGIN).is_none() && split_host(host).0.parse::<std::net::IpAddr>().is_ok() {
            return Ok(());
        }
        self.check(headers)
    }

    /// Checks a request's headers. An `Origin` passes when it is listed, or when it is the
    /// request's own origin (see [`same_origin`]); the `Host` must be allowed either way.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let host = headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if let Some(origin) = headers.get(ORIGIN) {
            let origin = origin.to_str().unwrap_or("<not text>");
            let normalized = normalize_origin(origin);
            if !self.origins.contains(&normalized) && !same_origin(&normalized, host) {
                return Err(Refusal::Origin(origin.to_owned()));
            }
        }
        if !self.host_allowed(host) {
            return Err(Refusal::Host(host.to_owned()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrapes_pass_by_ip_but_not_by_a_rebound_name() {
        let p = OriginPolicy::new(&[], &["sandboxrun-mcp.example".into()]);
        for host in ["10.244.0.7:8000", "[fd00::7]:8000", "127.0.0.1"] {
            assert_eq!(
                p.check_scrape(&headers(&[("host", host)])),
                Ok(()),
                "{host}"
            );
        }
        assert_eq!(
            p.check_scrape(&headers(&[("host", "sandboxrun-mcp.example")])),
            Ok(())
        );
        assert_eq!(
            p.check_scrape(&headers(&[("host", "attacker.example:8000")])),
            Err(Refusal::Host("attacker.example:8000".into()))
        );
        // A browser page (it sends an Origin) gets no exception for IP hosts.
        assert!(
            p.check_scrape(&headers(&[
                ("host", "10.244.0.7:8000"),
                ("origin", "http://attacker.example")
            ]))
            .is_err()
        );
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn absent_origin_passes_listed_origin_passes_others_fail() {
        let p = OriginPolicy::new(&["http://localhost:6274/".into()], &[]);
        assert_eq!(p.check(&headers(&[("host", "localhost:8000")])), Ok(()));
        assert_eq!(
            p.check(&headers(&[
                ("host", "localhost"),
                ("origin", "HTTP://LOCALHOST:6274")
            ])),
            Ok(())
        );
        assert_eq!(
            p.check(&headers(&[
                ("host", "localhost"),
                ("origin", "https://evil.example")
            ])),
            Err(Refusal::Origin("https://evil.example".into()))
        );
        assert_eq!(
            p.check(&headers(&[
                ("host", "localhost"),
                ("origin", "http://localhost:6275")
            ])),
            Err(Refusal::Origin("http://localhost:6275".into()))
        );
    }

    #[test]
    fn the_requests_own_origin_passes_at_an_allowed_host() {
        let p = OriginPolicy::new(&[], &[]);
        for (host, origin) in [
            ("localhost:8123", "http://localhost:8123"),
            ("localhost:8123", "https://localhost:8123"),
            ("127.0.0.1:8123", "http://127.0.0.1:8123/"),
            ("[::1]:8123", "http://[::1]:8123"),
            ("localhost", "http://localhost"),
            // Host names are case-insensitive; browsers send them lowercase.
            ("LOCALHOST:8123", "http://localhost:8123"),
            ("localhost:8123", "HTTP://LocalHost:8123"),
        ] {
            assert_eq!(
                p.check(&headers(&[("host", host), ("origin", origin)])),
                Ok(()),
                "{host} {origin}"
            );
        }
    }

    #[test]
    fn a_rebound_name_is_same_origin_with_its_page_and_refused_by_host() {
        let p = OriginPolicy::new(&[], &[]);
        for host in [
            "evil.example.com",
            "evil.example.com:8123",
            "localhost.evil.example:8123",
            "localhost.:8123",
            "127.0.0.2:8123",
            "[::2]:8123",
            "[::ffff:127.0.0.1]:8123",
        ] {
            assert_eq!(
                p.check(&headers(&[
                    ("host", host),
                    ("origin", &format!("http://{host}"))
                ])),
                Err(Refusal::Host(host.into())),
                "{host}"
            );
        }
    }

    #[test]
    fn any_other_origin_is_refused_even_at_a_loopback_host() {
        let p = OriginPolicy::new(&[], &[]);
        for (host, origin) in [
            // Other ports, other hosts: other origins.
            ("localhost:8123", "http://localhost:8124"),
            ("localhost:8123", "http://localhost"),
            ("localhost", "http://localhost:80"),
            ("localhost:8123", "http://127.0.0.1:8123"),
            ("127.0.0.1:8123", "http://localhost:8123"),
            ("localhost:8123", "http://evil.example.com"),
            ("localhost:8123", "http://evil.example.com:8123"),
            ("localhost:8123", "http://localhost:8123.evil.example"),
            ("localhost:8123", "http://localhost.:8123"),
            ("localhost.:8123", "http://localhost:8123"),
            ("localhost:8123", "http://user@localhost:8123"),
            ("localhost:8123", "http://localhost:8123/path"),
            // IPv6 loopback and its look-alikes.
            ("[::1]:8123", "http://[::2]:8123"),
            ("[::1]:8123", "http://[0:0:0:0:0:0:0:1]:8123"),
            ("[::1]:8123", "http://::1:8123"),
            ("[::1]:8123", "http://[::1]:8124"),
            // Opaque, schemeless and non-web origins.
            ("localhost:8123", "null"),
            ("localhost:8123", "localhost:8123"),
            ("localhost:8123", "//localhost:8123"),
            ("localhost:8123", "ftp://localhost:8123"),
            ("localhost:8123", "ws://localhost:8123"),
            ("localhost:8123", "file://localhost:8123"),
            ("localhost:8123", ""),
        ] {
            assert_eq!(
                p.check(&headers(&[("host", host), ("origin", origin)])),
                Err(Refusal::Origin(origin.into())),
                "{host} {origin}"
            );
        }
        // No Host: nothing is same-origin with it.
        for origin in ["http://", "http://localhost", "null"] {
            assert_eq!(
                p.check(&headers(&[("origin", origin)])),
                Err(Refusal::Origin(origin.into())),
                "{origin}"
            );
        }
    }

    #[test]
    fn same_origin_holds_for_configured_hosts_too() {
        let p = OriginPolicy::new(&[], &["mcp.example.com".into()]);
        assert_eq!(
            p.check(&headers(&[
                ("host", "mcp.example.com"),
                ("origin", "https://mcp.example.com")
            ])),
            Ok(())
        );
        assert_eq!(
            p.check(&headers(&[
                ("host", "mcp.example.com"),
                ("origin", "https://app.example.com")
            ])),
            Err(Refusal::Origin("https://app.example.com".into()))
        );
    }

    #[test]
    fn default_hosts_are_loopback_with_any_port() {
        let p = OriginPolicy::new(&[], &[]);
        for ok in [
            "localhost",
            "localhost:8000",
            "127.0.0.1:1",
            "[::1]:8000",
            "::1",
        ] {
            assert_eq!(p.check(&headers(&[("host", ok)])), Ok(()), "{ok}");
        }
        for bad in ["evil.example", "evil.example:8000", "10.0.0.1:8000", ""] {
            assert!(p.check(&headers(&[("host", bad)])).is_err(), "{bad}");
        }
        assert!(p.check(&HeaderMap::new()).is_err());
        assert_eq!(p.rmcp_allowed_hosts().unwrap().len(), 3);
    }

    #[test]
    fn configured_hosts_and_ports() {
        let p = OriginPolicy::new(&[], &["mcp.example.com".into(), "node:30080".into()]);
        assert!(
            p.check(&headers(&[("host", "MCP.example.com:443")]))
                .is_ok()
        );
        assert!(p.check(&headers(&[("host", "node:30080")])).is_ok());
        assert!(p.check(&headers(&[("host", "node:30081")])).is_err());
        assert!(p.check(&headers(&[("host", "localhost")])).is_err());
        let any = OriginPolicy::new(&[], &["*".into()]);
        assert!(any.check(&headers(&[("host", "whatever:1")])).is_ok());
        assert_eq!(any.rmcp_allowed_hosts(), None);
    }
}

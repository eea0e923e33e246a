//! Origin and Host validation, the defence against DNS rebinding and cross-site requests from
//! a browser: a web page can make a browser send requests to this server, but it cannot forge
//! the `Origin` header, and a rebound DNS name still shows up in `Host`. Requests without an
//! `Origin` (every non-browser client) pass.

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

    /// Checks a request's headers.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if let Some(origin) = headers.get(ORIGIN) {
            let origin = origin.to_str().unwrap_or("<not text>");
            if !self.origins.contains(&normalize_origin(origin)) {
                return Err(Refusal::Origin(origin.to_owned()));
            }
        }
        let host = headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
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

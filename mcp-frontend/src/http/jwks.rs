//! The authorization server's signing keys: found through its metadata (RFC 8414, else OpenID
//! Connect discovery), fetched over HTTP(S), and fetched again when a token names a key the set
//! does not hold (the server rotated its keys), at most once per [`MIN_REFETCH`] so that tokens
//! with made-up key ids cannot turn this server into a flood against the authorization server.
//! The set is also re-read every [`MAX_AGE`], so a key the server removed stops being trusted
//! even if no token ever names an unknown one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::{Request, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use tokio::sync::{Mutex, RwLock};

/// Shortest time between two fetches of the key set.
pub const MIN_REFETCH: Duration = Duration::from_secs(5);
/// Longest time a fetched key set is used without being read again.
pub const MAX_AGE: Duration = Duration::from_secs(300);
/// Longest time a key set is used when it cannot be fetched again.
pub const STALE_LIMIT: Duration = Duration::from_secs(3600);
/// Deadline of one metadata or key set request.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest metadata or key set document read.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// One usable verification key.
#[derive(Clone)]
pub struct Key {
    /// What the key may verify: its own `alg`, or every algorithm of its type.
    pub algorithms: Vec<Algorithm>,
    /// The key itself.
    pub key: DecodingKey,
}

/// Fetches and caches the key set of one issuer.
pub struct KeySource {
    issuer: String,
    /// From configuration, else discovered from the issuer's metadata on first use.
    jwks_uri: RwLock<Option<String>>,
    http: Http,
    keys: RwLock<Fetched>,
    /// When a fetch was last tried; held while fetching, so concurrent misses fetch once.
    fetching: Mutex<Option<Instant>>,
    /// [`MIN_REFETCH`], shorter in tests.
    min_refetch: Duration,
}

#[derive(Default)]
struct Fetched {
    by_kid: HashMap<String, Key>,
    /// Keys without a `kid`, usable by tokens without one.
    anonymous: Vec<Key>,
    at: Option<Instant>,
}

impl KeySource {
    /// A source for `issuer`; `jwks_uri` skips discovery when given.
    pub fn new(issuer: &str, jwks_uri: Option<String>) -> Result<Self, String> {
        Ok(Self {
            issuer: issuer.to_owned(),
            jwks_uri: RwLock::new(jwks_uri),
            http: Http::new()?,
            keys: RwLock::new(Fetched::default()),
            fetching: Mutex::new(None),
            min_refetch: MIN_REFETCH,
        })
    }

    /// The same source with another shortest time between fetches.
    #[cfg(test)]
    pub fn with_min_refetch(mut self, d: Duration) -> Self {
        self.min_refetch = d;
        self
    }

    /// The keys a token with this `kid` (or none) may be verified with. Fetches the set when
    /// it is missing, older than [`MAX_AGE`], or does not hold `kid`. When a fetch fails, a set
    /// fetched within [`STALE_LIMIT`] is still used, so a short outage of the authorization
    /// server does not lock every token out.
    pub async fn keys_for(&self, kid: Option<&str>) -> Result<Vec<Key>, String> {
        if let Some(found) = self.cached(kid, MAX_AGE).await {
            return Ok(found);
        }
        let mut last_attempt = self.fetching.lock().await;
        // Another request may have fetched while this one waited.
        if let Some(found) = self.cached(kid, MAX_AGE).await {
            return Ok(found);
        }
        let recent = last_attempt.is_some_and(|at: Instant| at.elapsed() < self.min_refetch);
        let mut failure = None;
        if !recent {
            *last_attempt = Some(Instant::now());
            if let Err(e) = self.refresh().await {
                tracing::warn!(error = %e, "cannot fetch the authorization server's keys");
                failure = Some(e);
            }
        }
        drop(last_attempt);
        if let Some(found) = self.cached(kid, STALE_LIMIT).await {
            return Ok(found);
        }
        let have_set = self
            .keys
            .read()
            .await
            .at
            .is_some_and(|at| at.elapsed() < STALE_LIMIT);
        match failure {
            // The set is known and does not hold this key.
            _ if have_set => Ok(Vec::new()),
            Some(e) => Err(e),
            None => Err("no key set yet: the last attempt to fetch it failed".to_owned()),
        }
    }

    /// Fetches the set now (at start-up, to report a misconfiguration early).
    pub async fn refresh(&self) -> Result<usize, String> {
        let uri = self.jwks_uri().await?;
        let body = self.http.get(&uri).await?;
        let fetched = parse_key_set(&body).map_err(|e| format!("the key set at {uri}: {e}"))?;
        let count = fetched.by_kid.len() + fetched.anonymous.len();
        tracing::info!(jwks_uri = %uri, keys = count, "fetched the authorization server's keys");
        *self.keys.write().await = fetched;
        Ok(count)
    }

    async fn cached(&self, kid: Option<&str>, max_age: Duration) -> Option<Vec<Key>> {
        let keys = self.keys.read().await;
        let fresh = keys.at.is_some_and(|at| at.elapsed() < max_age);
        if !fresh {
            return None;
        }
        match kid {
            Some(kid) => keys.by_kid.get(kid).map(|k| vec![k.clone()]),
            // No kid: any key of the set may have signed it (a set of one, usually).
            None => Some(
                keys.anonymous
                    .iter()
                    .chain(keys.by_kid.values())
                    .cloned()
                    .collect(),
            )
            .filter(|v: &Vec<Key>| !v.is_empty()),
        }
    }

    async fn jwks_uri(&self) -> Result<String, String> {
        if let Some(uri) = self.jwks_uri.read().await.clone() {
            return Ok(uri);
        }
        let uri = self.discover().await?;
        *self.jwks_uri.write().await = Some(uri.clone());
        Ok(uri)
    }

    /// `jwks_uri` from the issuer's metadata: RFC 8414's well-known URL (inserted before the
    /// issuer's path), then OpenID Connect's (appended to it). The metadata must name this issuer
    /// (RFC 8414 section 3.3), so a document served for another one is not trusted.
    async fn discover(&self) -> Result<String, String> {
        #[derive(Deserialize)]
        struct Metadata {
            issuer: String,
            jwks_uri: Option<String>,
        }
        let mut tried = Vec::new();
        for url in metadata_urls(&self.issuer)? {
            match self.http.get(&url).await {
                Ok(body) => {
                    let meta: Metadata = serde_json::from_slice(&body)
                        .map_err(|e| format!("the metadata at {url} is not valid JSON: {e}"))?;
                    if meta.issuer != self.issuer {
                        return Err(format!(
                            "the metadata at {url} names the issuer {:?}, not {:?}",
                            meta.issuer, self.issuer
                        ));
                    }
                    return meta
                        .jwks_uri
                        .ok_or_else(|| format!("the metadata at {url} has no jwks_uri"));
                }
                Err(e) => tried.push(e),
            }
        }
        Err(format!(
            "no authorization server metadata found for {}: {}",
            self.issuer,
            tried.join("; ")
        ))
    }
}

/// The two places an issuer's metadata may be.
fn metadata_urls(issuer: &str) -> Result<Vec<String>, String> {
    let uri: Uri = issuer
        .parse()
        .map_err(|_| format!("the issuer {issuer:?} is not a URL"))?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(format!("the issuer {issuer:?} is not an absolute URL"));
    };
    let path = uri.path().trim_end_matches('/');
    Ok(vec![
        format!("{scheme}://{authority}/.well-known/oauth-authorization-server{path}"),
        format!("{scheme}://{authority}{path}/.well-known/openid-configuration"),
    ])
}

/// The usable keys of a JWK set. A key this server cannot use (a symmetric key, an encryption
/// key, an unknown type or algorithm) is skipped rather than failing the whole set: servers
/// publish such keys next to their signing keys.
fn parse_key_set(body: &[u8]) -> Result<Fetched, String> {
    #[derive(Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set = serde_json::from_slice(body).map_err(|e| format!("not a JWK set: {e}"))?;
    let mut fetched = Fetched {
        at: Some(Instant::now()),
        ..Fetched::default()
    };
    for value in set.keys {
        if value
            .get("use")
            .and_then(|u| u.as_str())
            .is_some_and(|u| u != "sig")
        {
            continue;
        }
        let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
            continue;
        };
        let Some(key) = usable(&jwk) else { continue };
        match jwk.common.key_id {
            Some(kid) => {
                fetched.by_kid.insert(kid, key);
            }
            None => fetched.anonymous.push(key),
        }
    }
    if fetched.by_kid.is_empty() && fetched.anonymous.is_empty() {
        return Err("it holds no signing key this server can use (RSA, EC or Ed25519)".to_owned());
    }
    Ok(fetched)
}

/// A public signing key and the algorithms it may verify; `None` for anything else.
fn usable(jwk: &Jwk) -> Option<Key> {
    use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve};
    let family: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
            vec![Algorithm::EdDSA]
        }
        // Symmetric (`oct`) keys are shared secrets: never a verification key of someone else's
        // tokens.
        _ => return None,
    };
    let algorithms = match jwk.common.key_algorithm {
        None => family,
        Some(declared) => {
            let declared: Algorithm = declared.to_string().parse().ok()?;
            if !family.contains(&declared) {
                return None;
            }
            vec![declared]
        }
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key { algorithms, key })
}

/// A GET client with a deadline and a size cap, plain HTTP or TLS with the platform's roots
/// (hyper-rustls on ring, the one crypto provider of this tree).
struct Http {
    plain: Client<HttpConnector, Empty<Bytes>>,
    tls: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl Http {
    fn new() -> Result<Self, String> {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| format!("cannot load the system's root certificates: {e}"))?
            .https_only()
            .enable_http1()
            .build();
        Ok(Self {
            plain: Client::builder(TokioExecutor::new()).build_http(),
            tls: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    async fn get(&self, url: &str) -> Result<Vec<u8>, String> {
        let uri: Uri = url.parse().map_err(|_| format!("{url:?} is not a URL"))?;
        let request = Request::get(uri.clone())
            .header(hyper::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("{url}: {e}"))?;
        let exchange = async {
            let response = match uri.scheme_str() {
                Some("https") => self.tls.request(request).await,
                Some("http") => self.plain.request(request).await,
                _ => return Err(format!("{url} is not an http or https URL")),
            }
            .map_err(|e| format!("{url}: {e}"))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_DOCUMENT_BYTES)
                .collect()
                .await
                .map_err(|e| format!("{url}: reading the answer: {e}"))?
                .to_bytes();
            if !status.is_success() {
                return Err(format!("{url} answered {status}"));
            }
            Ok(body.to_vec())
        };
        tokio::time::timeout(FETCH_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("{url} did not answer within {FETCH_TIMEOUT:?}"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_looked_for_where_both_standards_put_it() {
        assert_eq!(
            metadata_urls("https://as.example.com").unwrap(),
            [
                "https://as.example.com/.well-known/oauth-authorization-server",
                "https://as.example.com/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("https://as.example.com/tenant/a/").unwrap(),
            [
                "https://as.example.com/.well-known/oauth-authorization-server/tenant/a",
                "https://as.example.com/tenant/a/.well-known/openid-configuration"
            ]
        );
        assert!(metadata_urls("as.example.com").is_err());
    }

    #[test]
    fn only_public_signing_keys_are_kept() {
        let set = serde_json::json!({"keys": [
            // A symmetric key: never trusted to verify.
            {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
            // An encryption key.
            {"kty": "EC", "crv": "P-256", "use": "enc", "kid": "enc",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
             "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            // An unknown key type.
            {"kty": "XYZ", "kid": "odd"},
            // An EC key that claims an RSA algorithm.
            {"kty": "EC", "crv": "P-256", "alg": "RS256", "kid": "mismatch",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
             "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty": "EC", "crv": "P-256", "alg": "ES256", "kid": "good",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
             "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
        ]});
        let fetched = parse_key_set(set.to_string().as_bytes()).unwrap();
        assert_eq!(fetched.by_kid.keys().collect::<Vec<_>>(), ["good"]);
        assert_eq!(fetched.by_kid["good"].algorithms, [Algorithm::ES256]);
        let none = serde_json::json!({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]});
        assert!(parse_key_set(none.to_string().as_bytes()).is_err());
        assert!(parse_key_set(b"[]").is_err());
    }
}

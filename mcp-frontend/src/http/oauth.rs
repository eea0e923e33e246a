//! OAuth 2.1 resource server, as the MCP authorization specification asks of a remote server:
//! protected resource metadata (RFC 9728) naming the authorization server, a `401` whose
//! `WWW-Authenticate` points at it, and bearer JWT access tokens (RFC 9068) validated here:
//! signature against the issuer's published keys ([`super::jwks`]), its type (`at+jwt`, so that
//! no other JWT of the issuer, an ID token or a logout token, passes for an access token), no
//! critical header extension (RFC 7515 section 4.1.11: none is understood here), issuer,
//! audience bound to this server's resource URL (RFC 8707), expiry and not-before. The agent
//! identity comes from a configured claim, exactly as the token says it (never trimmed or
//! folded: two subjects are two agents), behind a prefix so that a token can never take the name
//! (and so the policy) of an API key's agent, and must be a valid agent name
//! ([`sandboxrun_core::validate_agent_name`]); the token's scopes become a [`Grant`].

use std::sync::Arc;

use axum::http::HeaderValue;
use axum::http::Uri;
use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Header, Validation};
use sandboxrun_core::{AGENT_NAME_PATTERN, validate_agent_name};
use serde_json::{Map, Value};

use super::jwks::KeySource;
use crate::grant::{Grant, ScopeMap};

/// Largest token looked at: a JWT access token is a few hundred bytes to a few kilobytes; a
/// larger credential is refused before anything in it is decoded.
const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Clock difference tolerated on `exp` and `nbf`.
const LEEWAY_SECONDS: u64 = 30;
/// Only asymmetric signatures: a shared-secret (HS*) token could be minted by anyone holding
/// the secret, and `none` by anyone at all.
const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Settings of the resource server.
#[derive(Clone, Debug)]
pub struct OAuthConfig {
    /// The authorization server's issuer identifier, exactly as its tokens' `iss` say it.
    pub issuer: String,
    /// This server's resource URL as clients reach it (`https://host/mcp`).
    pub resource: String,
    /// The `aud` tokens must carry; the resource URL when not set.
    pub audience: Option<String>,
    /// The claim whose value is the agent identity.
    pub agent_claim: String,
    /// Put before the claim's value to make the agent identity.
    pub agent_prefix: String,
    /// Scope name to tools and environments.
    pub scopes: ScopeMap,
    /// The key set's URL, when the issuer publishes no metadata.
    pub jwks_uri: Option<String>,
}

/// Why a presented token was not accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Not a valid token for this server: `401 invalid_token`.
    Invalid(String),
    /// Valid, but granting none of this server's tools: `403 insufficient_scope`.
    InsufficientScope(String),
    /// The authorization server's keys could not be had: `503`, retry later.
    Unavailable(String),
}

/// A verified token's caller.
#[derive(Debug)]
pub struct TokenCaller {
    /// Agent identity: the prefix and the claim's value.
    pub agent: String,
    /// What its scopes allow.
    pub grant: Grant,
}

/// Verifies access tokens and describes this resource.
pub struct ResourceServer {
    config: OAuthConfig,
    scopes: Arc<ScopeMap>,
    keys: KeySource,
    metadata_path: String,
    metadata_url: String,
}

impl ResourceServer {
    /// Checks the configuration; fetches nothing yet (see [`ResourceServer::prefetch`]).
    pub fn new(config: OAuthConfig) -> Result<Self, String> {
        let issuer_uri: Uri = config
            .issuer
            .parse()
            .map_err(|_| format!("--oauth-issuer {:?} is not a URL", config.issuer))?;
        if !matches!(issuer_uri.scheme_str(), Some("https" | "http"))
            || issuer_uri.authority().is_none()
            || issuer_uri.query().is_some()
        {
            return Err(format!(
                "--oauth-issuer {:?} must be an http(s) URL without a query (OAuth 2.1 wants \
                 https; http is for a server on this machine)",
                config.issuer
            ));
        }
        let resource: Uri = config
            .resource
            .parse()
            .map_err(|_| format!("--oauth-resource {:?} is not a URL", config.resource))?;
        let (Some(scheme @ ("https" | "http")), Some(authority)) =
            (resource.scheme_str(), resource.authority())
        else {
            return Err(format!(
                "--oauth-resource {:?} must be this server's absolute http(s) URL as clients \
                 reach it, for example https://sandboxrun.example.com/mcp",
                config.resource
            ));
        };
        if resource.query().is_some() || config.resource.contains('#') {
            return Err(format!(
                "--oauth-resource {:?} must have no query or fragment (RFC 8707)",
                config.resource
            ));
        }
        if config.agent_claim.trim().is_empty() {
            return Err("--oauth-agent-claim is empty".to_owned());
        }
        // Every agent name is the prefix and a claim's value: a prefix that no name can start
        // with would refuse every token.
        if !config.agent_prefix.is_empty() {
            validate_agent_name(&format!("{}a", config.agent_prefix)).map_err(|e| {
                format!(
                    "--oauth-agent-prefix {:?} cannot start an agent name ({AGENT_NAME_PATTERN}): {e}",
                    config.agent_prefix
                )
            })?;
        }
        // RFC 9728 section 3.1: the well-known segment goes between the host and the path.
        let path = resource.path().trim_end_matches('/');
        let metadata_path = format!("/.well-known/oauth-protected-resource{path}");
        let metadata_url = format!("{scheme}://{authority}{metadata_path}");
        let keys = KeySource::new(&config.issuer, config.jwks_uri.clone())?;
        Ok(Self {
            scopes: Arc::new(config.scopes.clone()),
            config,
            keys,
            metadata_path,
            metadata_url,
        })
    }

    /// Fetches the keys once at start-up so that a wrong issuer shows in the first log lines; a
    /// failure is only logged (API keys keep working, and tokens are verified once the
    /// authorization server answers).
    pub async fn prefetch(&self) {
        match self.keys.refresh().await {
            Ok(_) => {}
            Err(e) => tracing::warn!(
                error = %e,
                issuer = %self.config.issuer,
                "cannot fetch the authorization server's keys yet; tokens are refused until it answers"
            ),
        }
    }

    /// The path this server's protected resource metadata is served at.
    pub fn metadata_path(&self) -> &str {
        &self.metadata_path
    }

    /// The prefix of every token agent's identity.
    pub fn agent_prefix(&self) -> &str {
        &self.config.agent_prefix
    }

    /// The protected resource metadata document (RFC 9728 section 2).
    pub fn metadata(&self) -> Value {
        serde_json::json!({
            "resource": self.config.resource,
            "authorization_servers": [self.config.issuer],
            "scopes_supported": self.scopes.scopes(),
            "bearer_methods_supported": ["header"],
            "resource_name": "sandboxrun",
        })
    }

    /// The `WWW-Authenticate` value of a refusal: where the metadata is, which scopes to ask
    /// for, and for a presented token what was wrong with it (RFC 6750 section 3).
    pub fn challenge(&self, error: Option<(&str, &str)>) -> HeaderValue {
        let mut value = format!(
            "Bearer resource_metadata=\"{}\", scope=\"{}\"",
            self.metadata_url,
            self.scopes.tool_scopes().join(" ")
        );
        if let Some((code, description)) = error {
            // A quoted-string may not hold quotes or backslashes, and a header no control
            // characters.
            let description: String = description
                .chars()
                .map(|c| match c {
                    '"' | '\\' => '\'',
                    c if c.is_control() || !c.is_ascii() => ' ',
                    c => c,
                })
                .collect();
            value.push_str(&format!(
                ", error=\"{code}\", error_description=\"{description}\""
            ));
        }
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
    }

    /// Verifies `token` and returns its caller.
    pub async fn verify(&self, token: &str) -> Result<TokenCaller, TokenRefusal> {
        let invalid = |m: &str| TokenRefusal::Invalid(m.to_owned());
        if !looks_like_jwt(token) {
            return Err(invalid(
                "the credential is neither a known API key nor a JWT access token",
            ));
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenRefusal::Invalid(format!(
                "the token has {} bytes; access tokens of more than {MAX_TOKEN_BYTES} bytes are \
                 not accepted",
                token.len()
            )));
        }
        let header = access_token_header(token).map_err(TokenRefusal::Invalid)?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(TokenRefusal::Invalid(format!(
                "tokens signed with {:?} are not accepted; this server verifies asymmetric \
                 signatures only (RS*, PS*, ES256, ES384, EdDSA)",
                header.alg
            )));
        }
        let keys = self
            .keys
            .keys_for(header.kid.as_deref())
            .await
            .map_err(|e| {
                TokenRefusal::Unavailable(format!(
                    "the authorization server's keys cannot be fetched, so no token can be \
                     checked: {e}"
                ))
            })?;
        let candidates: Vec<_> = keys
            .iter()
            .filter(|k| k.algorithms.contains(&header.alg))
            .collect();
        if candidates.is_empty() {
            return Err(TokenRefusal::Invalid(match &header.kid {
                Some(kid) if keys.is_empty() => format!(
                    "the token is signed with the key {kid:?}, which {} does not publish",
                    self.config.issuer
                ),
                _ => format!(
                    "no key of {} verifies {:?} signatures",
                    self.config.issuer, header.alg
                ),
            }));
        }
        let validation = self.validation(header.alg);
        let mut last = None;
        let mut claims = None;
        for key in candidates {
            match jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let claims = match (claims, last) {
            (Some(c), _) => c,
            (None, Some(e)) => return Err(TokenRefusal::Invalid(self.explain(e.kind()))),
            (None, None) => return Err(invalid("the token could not be verified")),
        };
        self.caller(&claims)
    }

    fn validation(&self, alg: Algorithm) -> Validation {
        let mut v = Validation::new(alg);
        v.leeway = LEEWAY_SECONDS;
        v.validate_exp = true;
        v.validate_nbf = true;
        v.set_issuer(&[&self.config.issuer]);
        v.set_audience(&[self.audience()]);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        v
    }

    fn audience(&self) -> &str {
        self.config
            .audience
            .as_deref()
            .unwrap_or(&self.config.resource)
    }

    fn explain(&self, kind: &ErrorKind) -> String {
        match kind {
            ErrorKind::ExpiredSignature => {
                "the token has expired: get a new one from the authorization server".to_owned()
            }
            ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".to_owned(),
            ErrorKind::InvalidAudience => format!(
                "the token is not for this server: its audience must include {} (ask for it \
                 with the resource parameter)",
                self.audience()
            ),
            ErrorKind::InvalidIssuer => {
                format!("the token was not issued by {}", self.config.issuer)
            }
            ErrorKind::InvalidSignature => "the token's signature does not verify".to_owned(),
            ErrorKind::MissingRequiredClaim(c) => format!("the token has no {c} claim"),
            ErrorKind::InvalidAlgorithm => {
                "the token's algorithm does not match its key".to_owned()
            }
            _ => "the token is malformed".to_owned(),
        }
    }

    fn caller(&self, claims: &Map<String, Value>) -> Result<TokenCaller, TokenRefusal> {
        let claim = &self.config.agent_claim;
        let Some(Value::String(value)) = claims.get(claim) else {
            return Err(TokenRefusal::Invalid(format!(
                "the token has no string {claim} claim, which names the agent"
            )));
        };
        // Exactly as given: trimming or folding would make distinct subjects one agent. The
        // value is a name on its own (an empty one would make the prefix alone an agent), and
        // with the prefix.
        let agent = format!("{}{value}", self.config.agent_prefix);
        if let Err(e) = validate_agent_name(value).and_then(|()| validate_agent_name(&agent)) {
            return Err(TokenRefusal::Invalid(format!(
                "the token's {claim} claim does not make a usable agent name ({} followed by the \
                 claim): {e}",
                if self.config.agent_prefix.is_empty() {
                    "nothing".to_owned()
                } else {
                    format!("the prefix {:?}", self.config.agent_prefix)
                }
            )));
        }
        let grant = self.scopes.grant(token_scopes(claims));
        if grant.is_empty() {
            return Err(TokenRefusal::InsufficientScope(format!(
                "the token grants none of this server's tools; ask for one of: {}",
                self.scopes.tool_scopes().join(" ")
            )));
        }
        Ok(TokenCaller { agent, grant })
    }
}

/// The JOSE header of a compact JWS, checked for what makes it an access token of this server:
/// `typ` is `at+jwt` (RFC 9068 section 2.1, also as `application/at+jwt`; media types compare
/// case-insensitively, RFC 7515 section 4.1.9), so that other JWTs of the issuer with a matching
/// audience (ID tokens, logout tokens, tokens of other profiles) are not taken for one; and no
/// `crit`: RFC 7515 section 4.1.11 requires refusing a token whose critical extensions are not
/// understood, and this server understands none (an empty or malformed `crit` is invalid too).
fn access_token_header(token: &str) -> Result<Header, String> {
    let segment = token.split('.').next().unwrap_or_default();
    let fields: Map<String, Value> = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(segment)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or("the token's header is not a valid JWT header")?;
    match fields.get("typ") {
        Some(Value::String(t)) if is_access_token_type(t) => {}
        Some(Value::String(t)) => {
            return Err(format!(
                "the token's type (typ) is {}, not at+jwt: only OAuth access tokens (RFC 9068) \
                 are accepted, not ID tokens or other JWTs of the issuer; ask the \
                 authorization server for an access token for this resource",
                shown(t)
            ));
        }
        Some(_) => return Err("the token's type (typ) is not a string".to_owned()),
        None => {
            return Err(
                "the token has no type (typ): only OAuth access tokens, typ at+jwt (RFC 9068), \
                 are accepted; ask the authorization server for a JWT access token"
                    .to_owned(),
            );
        }
    }
    if let Some(crit) = fields.get("crit") {
        let names: Vec<String> = match crit {
            Value::Array(names) => names
                .iter()
                .take(5)
                .map(|n| n.as_str().map_or_else(|| n.to_string(), shown))
                .collect(),
            other => vec![shown(&other.to_string())],
        };
        return Err(format!(
            "the token's header marks extensions as critical (crit: [{}]), which this server \
             does not understand, so it must refuse the token (RFC 7515 section 4.1.11)",
            names.join(", ")
        ));
    }
    serde_json::from_value(Value::Object(fields))
        .map_err(|_| "the token's header is not a valid JWT header".to_owned())
}

/// Whether `typ` names a JWT access token: `at+jwt`, or the full media type
/// `application/at+jwt`, in any case.
fn is_access_token_type(typ: &str) -> bool {
    typ.eq_ignore_ascii_case("at+jwt") || typ.eq_ignore_ascii_case("application/at+jwt")
}

/// A header value as an error shows it: quoted, escaped, at most 40 characters.
fn shown(value: &str) -> String {
    let cut: String = value.chars().take(40).collect();
    format!("{:?}", cut)
}

/// A token's scopes: RFC 9068's space-separated `scope`, or the `scp` list some servers send.
fn token_scopes(claims: &Map<String, Value>) -> Vec<&str> {
    match (claims.get("scope"), claims.get("scp")) {
        (Some(Value::String(s)), _) => s.split_whitespace().collect(),
        (_, Some(Value::Array(a))) => a.iter().filter_map(Value::as_str).collect(),
        (_, Some(Value::String(s))) => s.split_whitespace().collect(),
        _ => Vec::new(),
    }
}

/// Three base64url segments: what a JWS in compact form is. Anything else is not a token.
pub fn looks_like_jwt(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() == 3
        && parts[..2].iter().all(|p| !p.is_empty())
        && parts.iter().all(|p| {
            p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
#[path = "oauth_tests.rs"]
mod tests;

//! The resource server against an issuer served over real HTTP on a loopback port (its metadata
//! and key set, which a test can swap to rotate keys), with tokens signed by that issuer's keys
//! and every way a token can be wrong. The end-to-end test against a real authorization server
//! and the SDK's OAuth client is `mcp-frontend/tests/clients/test_oauth.py`.

use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use jsonwebtoken::{EncodingKey, Header};
use sandboxrun_core::{Environment, Tool};

use super::*;

const KEY_A: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQglwWsdD6r8U4jarVt
LzNknssZEUmTKLrDvOXDJ/Mp/A+hRANCAAStrQWHiM8+BDOHTQfkHpO8qjgrGR1M
Oajn87n/hsVPHBFRNSuk7KqXpMN4+x67seQXqD87HSvCakvp0cVo9yi4
-----END PRIVATE KEY-----
";
const KEY_A_XY: (&str, &str) = (
    "ra0Fh4jPPgQzh00H5B6TvKo4KxkdTDmo5_O5_4bFTxw",
    "EVE1K6Tsqpekw3j7Hrux5BeoPzsdK8JqS-nRxWj3KLg",
);
const KEY_B: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg4KvtiCVvDOp5VyH0
bWEa63X7FFAXafoPCrtzvavTG36hRANCAAQwmBjTUBoUklbTtPRcaH1EPxlj6dqH
DXPd2kXF0LnGL+HTh5URkTZ4bMxTi3kI795QxQswBLWR1SzLgDNJc3fj
-----END PRIVATE KEY-----
";
const KEY_B_XY: (&str, &str) = (
    "MJgY01AaFJJW07T0XGh9RD8ZY-nahw1z3dpFxdC5xi8",
    "4dOHlRGRNnhszFOLeQjv3lDFCzAEtZHVLMuAM0lzd-M",
);
const RESOURCE: &str = "https://sandboxrun.example.com/mcp";

fn jwk(kid: &str, (x, y): (&str, &str)) -> Value {
    serde_json::json!({"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid, "x": x, "y": y})
}

/// An issuer on a loopback port: metadata, key set, and a count of key set fetches.
struct Issuer {
    url: String,
    keys: Arc<StdMutex<Value>>,
    fetches: Arc<AtomicUsize>,
}

async fn issuer() -> Issuer {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let keys = Arc::new(StdMutex::new(
        serde_json::json!({"keys": [jwk("a", KEY_A_XY)]}),
    ));
    let fetches = Arc::new(AtomicUsize::new(0));
    let metadata = serde_json::json!({"issuer": url, "jwks_uri": format!("{url}/jwks")});
    let (k, f) = (keys.clone(), fetches.clone());
    let app = axum::Router::new()
        .route(
            "/.well-known/oauth-authorization-server",
            get(move || async move { axum::Json(metadata) }),
        )
        .route(
            "/jwks",
            get(move || async move {
                f.fetch_add(1, Ordering::SeqCst);
                axum::Json(k.lock().unwrap().clone())
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Issuer { url, keys, fetches }
}

/// The default settings for `issuer` and `resource`, agents prefixed with `prefix`.
fn config(
    issuer: impl Into<String>,
    resource: impl Into<String>,
    prefix: impl Into<String>,
) -> OAuthConfig {
    OAuthConfig {
        issuer: issuer.into(),
        resource: resource.into(),
        audience: None,
        agent_claim: "sub".to_owned(),
        agent_prefix: prefix.into(),
        scopes: ScopeMap::default(),
        jwks_uri: None,
    }
}

fn server(issuer: &Issuer) -> ResourceServer {
    let mut rs = ResourceServer::new(config(
        issuer.url.clone(),
        RESOURCE.to_owned(),
        "oauth:".to_owned(),
    ))
    .unwrap();
    rs.keys = KeySource::new(&issuer.url, None)
        .unwrap()
        .with_min_refetch(Duration::from_millis(200));
    rs
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Claims that are right in every respect for `issuer`.
fn claims(issuer: &Issuer) -> Value {
    serde_json::json!({
        "iss": issuer.url, "aud": RESOURCE, "sub": "alice", "exp": now() + 300, "iat": now(),
        "scope": "openid sandboxrun:run_python",
    })
}

/// An access token (`typ: at+jwt`) with `claims`, signed with `pem` (ES256).
fn sign(claims: &Value, kid: Option<&str>, pem: &str) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = kid.map(str::to_owned);
    header.typ = Some("at+jwt".to_owned());
    jsonwebtoken::encode(
        &header,
        claims,
        &EncodingKey::from_ec_pem(pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// A token with exactly `header` (raw JSON, so any field can be set) and `claims`, really
/// signed with key A (ES256).
fn sign_raw(header: &Value, claims: &Value) -> String {
    let message = format!("{}.{}", b64(header), b64(claims));
    let key = EncodingKey::from_ec_pem(KEY_A.as_bytes()).unwrap();
    let signature = jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::ES256).unwrap();
    format!("{message}.{signature}")
}

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

fn invalid(r: Result<TokenCaller, TokenRefusal>) -> String {
    match r {
        Err(TokenRefusal::Invalid(m)) => m,
        other => panic!("expected invalid_token, got {other:?}"),
    }
}

#[tokio::test]
async fn a_token_right_in_every_respect_names_its_agent_and_grants_its_scopes() {
    let issuer = issuer().await;
    let rs = server(&issuer);
    let caller = rs
        .verify(&sign(&claims(&issuer), Some("a"), KEY_A))
        .await
        .unwrap();
    assert_eq!(caller.agent, "oauth:alice");
    assert_eq!(caller.grant.tool_refusal("x", Tool::Python), None);
    assert_eq!(
        caller.grant.environment_refusal("x", Environment::Sandbox),
        None
    );
    assert!(caller.grant.tool_refusal("x", Tool::Sql).is_some());
    // The `scp` list some servers send instead of `scope`, and an audience list.
    let mut c = claims(&issuer);
    c.as_object_mut().unwrap().remove("scope");
    c["scp"] = serde_json::json!(["sandboxrun:execute_sql"]);
    c["aud"] = serde_json::json!(["other", RESOURCE]);
    let caller = rs.verify(&sign(&c, Some("a"), KEY_A)).await.unwrap();
    assert_eq!(caller.grant.tool_refusal("x", Tool::Sql), None);
    // A token without a kid, verified by the set's only key.
    assert!(
        rs.verify(&sign(&claims(&issuer), None, KEY_A))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn every_way_a_token_can_be_wrong_is_refused_with_its_reason() {
    let issuer = issuer().await;
    let rs = server(&issuer);
    let good = claims(&issuer);
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        sign(&c, Some("a"), KEY_A)
    };
    let without = |k: &str| {
        let mut c = good.clone();
        c.as_object_mut().unwrap().remove(k);
        sign(&c, Some("a"), KEY_A)
    };
    let cases: Vec<(&str, String, &str)> = vec![
        ("expired", with("exp", (now() - 120).into()), "expired"),
        ("no exp", without("exp"), "no exp claim"),
        (
            "not yet valid",
            with("nbf", (now() + 600).into()),
            "not valid yet",
        ),
        (
            "another audience",
            with("aud", "https://other.example.com/mcp".into()),
            "audience",
        ),
        (
            "the issuer's own URL as audience",
            with("aud", issuer.url.clone().into()),
            "audience",
        ),
        ("no audience", without("aud"), "no aud claim"),
        (
            "another issuer",
            with("iss", "https://evil.example.com".into()),
            "not issued by",
        ),
        (
            "issuer with a trailing slash",
            with("iss", format!("{}/", issuer.url).into()),
            "not issued by",
        ),
        ("no sub", without("sub"), "no string sub claim"),
        ("numeric sub", with("sub", 7.into()), "no string sub claim"),
        (
            "empty sub",
            with("sub", "".into()),
            "not make a usable agent name",
        ),
        (
            "control character in sub",
            with("sub", "al\nice".into()),
            "not make a usable agent name",
        ),
        (
            "another key under this kid",
            sign(&good, Some("a"), KEY_B),
            "signature does not verify",
        ),
        (
            "a kid the issuer does not publish",
            sign(&good, Some("zz"), KEY_A),
            "does not publish",
        ),
        (
            "garbage",
            "not-a-token".to_owned(),
            "neither a known API key nor a JWT",
        ),
        (
            "four segments",
            format!("{}.x", sign(&good, Some("a"), KEY_A)),
            "neither",
        ),
    ];
    for (what, token, why) in cases {
        let m = invalid(rs.verify(&token).await);
        assert!(m.contains(why), "{what}: {m}");
    }

    // A real token with its payload changed: the signature no longer matches.
    let real = sign(&good, Some("a"), KEY_A);
    let parts: Vec<&str> = real.split('.').collect();
    let mut elevated = good.clone();
    elevated["scope"] = "sandboxrun:run_python sandboxrun:production".into();
    let tampered = format!("{}.{}.{}", parts[0], b64(&elevated), parts[2]);
    assert!(invalid(rs.verify(&tampered).await).contains("signature"));
    // The same payload with no signature at all.
    let header = serde_json::json!({"alg": "none", "typ": "JWT", "kid": "a"});
    for signature in ["", "AAAA"] {
        let unsigned = format!("{}.{}.{signature}", b64(&header), b64(&elevated));
        invalid(rs.verify(&unsigned).await);
    }
    // Algorithm confusion: HS256 keyed with the issuer's public key (which anyone can read).
    let public = jwk("a", KEY_A_XY).to_string();
    for secret in [public.as_bytes(), KEY_A_XY.0.as_bytes()] {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("a".to_owned());
        h.typ = Some("at+jwt".to_owned());
        let token = jsonwebtoken::encode(&h, &elevated, &EncodingKey::from_secret(secret)).unwrap();
        assert!(invalid(rs.verify(&token).await).contains("not accepted"));
    }
    // A key of the right kid but declared for another algorithm family.
    let mut h = Header::new(Algorithm::ES384);
    h.kid = Some("a".to_owned());
    h.typ = Some("at+jwt".to_owned());
    let token = format!(
        "{}.{}.{}",
        b64(&serde_json::to_value(&h).unwrap()),
        b64(&good),
        parts[2]
    );
    assert!(
        invalid(rs.verify(&token).await).contains("verifies"),
        "ES384 header on an ES256 key"
    );
}

#[tokio::test]
async fn only_access_tokens_are_accepted_by_their_type() {
    let issuer = issuer().await;
    let rs = server(&issuer);
    let good = claims(&issuer);
    let with_typ = |typ: Value| {
        sign_raw(
            &serde_json::json!({"alg": "ES256", "kid": "a", "typ": typ}),
            &good,
        )
    };
    // RFC 9068 section 2.1: at+jwt or application/at+jwt; media types compare case-insensitively.
    for typ in [
        "at+jwt",
        "AT+JWT",
        "At+Jwt",
        "application/at+jwt",
        "Application/AT+JWT",
    ] {
        let caller = rs.verify(&with_typ(typ.into())).await.unwrap();
        assert_eq!(caller.agent, "oauth:alice", "{typ}");
    }
    // Other JWTs of the same issuer with the same audience: an ID token (typ JWT), one without
    // a type, logout and other profiles' tokens, near misses.
    for typ in [
        "JWT",
        "jwt",
        "",
        "at+jwt ",
        " at+jwt",
        "at+jwt\u{0}",
        "at+jwt\u{202e}",
        "at",
        "jwt+at",
        "application/jwt",
        "logout+jwt",
        "secevent+jwt",
        "dpop+jwt",
        "application/at+jwt;q=1",
        "text/at+jwt",
    ] {
        let m = invalid(rs.verify(&with_typ(typ.into())).await);
        assert!(m.contains("not at+jwt"), "{typ:?}: {m}");
    }
    for typ in [Value::Null, 1.into(), serde_json::json!(["at+jwt"])] {
        let m = invalid(rs.verify(&with_typ(typ.clone())).await);
        assert!(m.contains("typ"), "{typ}: {m}");
    }
    let no_typ = sign_raw(&serde_json::json!({"alg": "ES256", "kid": "a"}), &good);
    assert!(invalid(rs.verify(&no_typ).await).contains("has no type (typ)"));
    // jsonwebtoken's own default header says JWT.
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some("a".to_owned());
    let default = jsonwebtoken::encode(
        &h,
        &good,
        &EncodingKey::from_ec_pem(KEY_A.as_bytes()).unwrap(),
    )
    .unwrap();
    assert!(invalid(rs.verify(&default).await).contains("not at+jwt"));
}

#[tokio::test]
async fn a_critical_header_extension_is_refused() {
    let issuer = issuer().await;
    let rs = server(&issuer);
    let good = claims(&issuer);
    // This server understands no extension: any crit, well-formed or not, is refused (RFC 7515
    // section 4.1.11), even naming a claim it does check or a registered header parameter.
    for crit in [
        serde_json::json!(["exp"]),
        serde_json::json!(["b64"]),
        serde_json::json!(["http://example.com/ext"]),
        serde_json::json!(["exp", "nbf", "x", "y", "z", "more", "and more"]),
        serde_json::json!([]),
        serde_json::json!("exp"),
        serde_json::json!([1]),
        Value::Null,
    ] {
        let header = serde_json::json!({"alg": "ES256", "kid": "a", "typ": "at+jwt", "crit": crit, "exp": 1});
        let m = invalid(rs.verify(&sign_raw(&header, &good)).await);
        assert!(m.contains("critical (crit"), "{crit}: {m}");
    }
    // The control: the same header without crit.
    let header = serde_json::json!({"alg": "ES256", "kid": "a", "typ": "at+jwt", "exp": 1});
    rs.verify(&sign_raw(&header, &good)).await.unwrap();
}

#[tokio::test]
async fn subjects_are_agents_exactly_as_given_and_only_safe_ones() {
    let issuer = issuer().await;
    let rs = server(&issuer);
    let with_sub = |sub: &str| {
        let mut c = claims(&issuer);
        c["sub"] = sub.into();
        sign(&c, Some("a"), KEY_A)
    };
    for sub in [
        "alice@example.com",
        "auth0|5f7c8ec7c33c6c004bbafe82",
        "248289761001",
        "3f2a1b9c-0d4e-4f5a-8b6c-7d8e9f0a1b2c",
    ] {
        let caller = rs.verify(&with_sub(sub)).await.unwrap();
        assert_eq!(caller.agent, format!("oauth:{sub}"));
    }
    // The longest that fits with the prefix, and one more.
    let longest = "a".repeat(253 - "oauth:".len());
    assert_eq!(
        rs.verify(&with_sub(&longest)).await.unwrap().agent.len(),
        253
    );
    let m = invalid(rs.verify(&with_sub(&format!("{longest}a"))).await);
    assert!(m.contains("254 characters"), "{m}");
    // Never trimmed: " alice" is not alice, and not an agent at all.
    for (sub, why) in [
        (" alice", "a space"),
        ("alice ", "a space"),
        ("alice\t", "U+0009"),
        ("\nalice", "U+000A"),
        ("al\u{202e}ecila", "U+202E"),
        ("al\u{2067}ice", "U+2067"),
        ("ali\u{200b}ce", "U+200B"),
        ("\u{feff}alice", "U+FEFF"),
        ("al\u{1b}]0;pwned\u{7}ice", "U+001B"),
        ("ali\u{9b}ce", "U+009B"),
        ("alic\u{0435}", "U+0435"),
        ("alice\u{0}", "U+0000"),
        ("", "empty"),
        ("-alice", "U+002D at position 1"),
        ("*", "U+002A"),
        ("a b", "a space"),
        (&"x".repeat(10_000), "characters"),
    ] {
        let m = invalid(rs.verify(&with_sub(sub)).await);
        assert!(
            m.contains("sub claim does not make a usable agent name") && m.contains(why),
            "{sub:?}: {m}"
        );
        // The reason reaches the client in WWW-Authenticate: ASCII, escaped.
        let header = rs.challenge(Some(("invalid_token", &m)));
        assert!(header.to_str().is_ok(), "{header:?}");
    }
    // Without a prefix the claim alone is the name.
    let mut cfg = config(issuer.url.clone(), RESOURCE.to_owned(), "");
    cfg.jwks_uri = None;
    let bare = ResourceServer::new(cfg).unwrap();
    assert_eq!(
        bare.verify(&with_sub("alice")).await.unwrap().agent,
        "alice"
    );
    assert!(invalid(bare.verify(&with_sub("-alice")).await).contains("U+002D at position 1"));
}

#[tokio::test]
async fn an_oversized_token_is_refused_before_it_is_decoded() {
    let issuer = issuer().await;
    let rs = server(&issuer);
    let mut c = claims(&issuer);
    c["padding"] = "x".repeat(20_000).into();
    let m = invalid(rs.verify(&sign(&c, Some("a"), KEY_A)).await);
    assert!(m.contains("not accepted") && m.contains("16384"), "{m}");
    assert_eq!(
        issuer.fetches.load(Ordering::SeqCst),
        0,
        "nothing was fetched for it"
    );
}

#[tokio::test]
async fn a_token_without_this_servers_tool_scopes_is_insufficient_scope() {
    let issuer = issuer().await;
    let rs = server(&issuer);
    for scope in ["openid profile", "sandboxrun:production", ""] {
        let mut c = claims(&issuer);
        c["scope"] = scope.into();
        match rs.verify(&sign(&c, Some("a"), KEY_A)).await {
            Err(TokenRefusal::InsufficientScope(m)) => {
                assert!(m.contains("sandboxrun:run_python"), "{m}")
            }
            other => panic!("{scope:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn rotated_keys_are_fetched_once_and_the_removed_key_is_no_longer_trusted() {
    let issuer = issuer().await;
    let rs = server(&issuer);
    let old = sign(&claims(&issuer), Some("a"), KEY_A);
    rs.verify(&old).await.unwrap();
    assert_eq!(issuer.fetches.load(Ordering::SeqCst), 1);
    // The issuer rotates: key b replaces key a.
    *issuer.keys.lock().unwrap() = serde_json::json!({"keys": [jwk("b", KEY_B_XY)]});
    tokio::time::sleep(Duration::from_millis(250)).await;
    let new = sign(&claims(&issuer), Some("b"), KEY_B);
    let caller = rs.verify(&new).await.unwrap();
    assert_eq!(caller.agent, "oauth:alice");
    assert_eq!(issuer.fetches.load(Ordering::SeqCst), 2);
    assert!(invalid(rs.verify(&old).await).contains("does not publish"));

    // Made-up key ids do not make a server hammer the issuer: one fetch per interval. A minute
    // here: with the 200 ms above, a machine slow enough to take longer over the forty checks
    // saw a second fetch (a CI dry run, 2026-12-07), and a limiter that fetched for every
    // unknown key would still show forty.
    let mut patient = server(&issuer);
    patient.keys = KeySource::new(&issuer.url, None)
        .unwrap()
        .with_min_refetch(Duration::from_secs(60));
    patient.verify(&new).await.unwrap();
    let before = issuer.fetches.load(Ordering::SeqCst);
    for i in 0..40 {
        let forged = sign(&claims(&issuer), Some(&format!("made-up-{i}")), KEY_A);
        invalid(patient.verify(&forged).await);
    }
    assert!(issuer.fetches.load(Ordering::SeqCst) - before <= 1);
}

#[tokio::test]
async fn an_unreachable_issuer_makes_tokens_unverifiable_not_valid() {
    let rs = ResourceServer::new(config(
        "http://127.0.0.1:9".to_owned(),
        RESOURCE.to_owned(),
        "oauth:".to_owned(),
    ))
    .unwrap();
    let token = sign(
        &serde_json::json!({"iss": "http://127.0.0.1:9", "aud": RESOURCE, "sub": "a", "exp": now() + 60, "scope": "sandboxrun:run_python"}),
        Some("a"),
        KEY_A,
    );
    assert!(matches!(
        rs.verify(&token).await,
        Err(TokenRefusal::Unavailable(_))
    ));
}

#[test]
fn the_metadata_and_the_challenge_point_at_each_other() {
    let rs = ResourceServer::new(config(
        "https://as.example.com".to_owned(),
        RESOURCE.to_owned(),
        "oauth:".to_owned(),
    ))
    .unwrap();
    assert_eq!(
        rs.metadata_path(),
        "/.well-known/oauth-protected-resource/mcp"
    );
    let m = rs.metadata();
    assert_eq!(m["resource"], RESOURCE);
    assert_eq!(m["authorization_servers"][0], "https://as.example.com");
    assert_eq!(m["scopes_supported"].as_array().unwrap().len(), 5);
    let c = rs.challenge(None);
    assert_eq!(
        c.to_str().unwrap(),
        "Bearer resource_metadata=\"https://sandboxrun.example.com/.well-known/oauth-protected-resource/mcp\", \
         scope=\"sandboxrun:run_python sandboxrun:execute_sql sandboxrun:fetch_metrics\""
    );
    let c = rs.challenge(Some(("invalid_token", "bad \"quote\" \\ and\nnewline é")));
    assert!(
        c.to_str().unwrap().ends_with(
            "error=\"invalid_token\", error_description=\"bad 'quote' ' and newline  \""
        ),
        "{c:?}"
    );
    // A prefix no agent name can start with would refuse every token.
    for prefix in ["oauth: ", "-oauth:", "oauth\u{202e}:", "*"] {
        let err = ResourceServer::new(config(
            "https://as.example.com".to_owned(),
            RESOURCE.to_owned(),
            prefix.to_owned(),
        ))
        .err()
        .unwrap();
        assert!(err.contains("--oauth-agent-prefix"), "{prefix:?}: {err}");
    }
    for (issuer, resource) in [
        ("as.example.com", RESOURCE),
        ("ftp://as.example.com", RESOURCE),
        ("https://as.example.com", "/mcp"),
        ("https://as.example.com", "https://h/mcp?x=1"),
        ("https://as.example.com", "https://h/mcp#f"),
    ] {
        assert!(
            ResourceServer::new(config(
                issuer.to_owned(),
                resource.to_owned(),
                String::new()
            ))
            .is_err(),
            "{issuer} {resource}"
        );
    }
}

//! What each protocol revision gets from the whole HTTP stack (the router, its layers and rmcp's
//! Streamable HTTP service, as `fuzz_tests` builds it): `logging/setLevel` in a 2025-11-25
//! session and "method not found" (404) in the stateless 2026-07-28 revision; empty prompt and
//! resource lists, with caching hints for 2026-07-28; the capability error (-32021, 400); the
//! resource-not-found error naming the URI; a page of the server's own origin let through.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};

use super::fuzz_tests::{Harness, KEY_A, clean_post, read_all, sse_data, with_harness};

const STATELESS: &str = "2026-07-28";
const SESSION: &str = "2025-11-25";

/// The `_meta` every 2026-07-28 request carries, with `capabilities`.
fn meta(capabilities: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": STATELESS,
        "io.modelcontextprotocol/clientInfo": {"name": "revision-tests", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    })
}

/// The JSON-RPC answer to request `id` in a JSON or event-stream body.
fn answer(body: &[u8], id: i64) -> Value {
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        return value;
    }
    sse_data(body)
        .into_iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no answer to {id} in {}", String::from_utf8_lossy(body)))
}

/// Sends `method` with `params` as request 7 of the stateless revision, with the `Mcp-Method` and
/// `Mcp-Name` headers the revision requires (SEP-2243); the HTTP status and the answer.
async fn stateless(h: &Harness, method: &str, params: Value) -> (StatusCode, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    let name = ["name", "uri", "taskId"]
        .iter()
        .find_map(|field| body["params"][field].as_str())
        .map(str::to_owned);
    let resp = h
        .send(|| {
            let mut req = clean_post(KEY_A, None, Some(STATELESS), &body);
            let headers = req.headers_mut();
            headers.insert("mcp-method", method.parse().unwrap());
            if let Some(name) = &name {
                headers.insert("mcp-name", name.parse().unwrap());
            }
            req
        })
        .await;
    let status = resp.status();
    let bytes = read_all(resp.into_body()).await.expect("body");
    (status, answer(&bytes, 7))
}

/// Sends `method` with `params` as request 7 of `session`.
async fn in_session(h: &Harness, session: &str, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    let resp = h
        .send(|| clean_post(KEY_A, Some(session), Some(SESSION), &body))
        .await;
    assert_eq!(resp.status(), StatusCode::OK, "{method}");
    let bytes = read_all(resp.into_body()).await.expect("body");
    answer(&bytes, 7)
}

#[test]
fn set_level_is_a_session_method_and_gone_from_the_stateless_revision() {
    with_harness("set-level", async |h| {
        let session = h.open_session(KEY_A, SESSION).await;
        let ok = in_session(h, &session, "logging/setLevel", json!({"level": "info"})).await;
        assert_eq!(ok["result"], json!({}), "{ok}");
        // A level that is none of the eight: the session is told which exist.
        let bad = in_session(h, &session, "logging/setLevel", json!({"level": "loud"})).await;
        assert_eq!(bad["error"]["code"], -32602, "{bad}");
        let message = bad["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("warning") && message.contains("\"loud\""),
            "{bad}"
        );
        // Any other method rmcp does not know is still one this server does not have.
        let unknown = in_session(h, &session, "sandboxrun/nothing", json!({})).await;
        assert_eq!(unknown["error"]["code"], -32601, "{unknown}");

        let (status, gone) = stateless(
            h,
            "logging/setLevel",
            json!({"level": "info", "_meta": meta(json!({}))}),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{gone}");
        assert_eq!(gone["error"]["code"], -32601, "{gone}");
        assert_eq!(gone["id"], 7, "{gone}");
    });
}

#[test]
fn the_server_declares_logging_prompts_and_resources() {
    with_harness("capabilities", async |h| {
        let (status, discovered) =
            stateless(h, "server/discover", json!({"_meta": meta(json!({}))})).await;
        assert_eq!(status, StatusCode::OK, "{discovered}");
        let caps = &discovered["result"]["capabilities"];
        for capability in ["logging", "prompts", "resources", "tools"] {
            assert!(caps[capability].is_object(), "{capability} in {caps}");
        }
        // Nothing this server offers changes while it runs, and it completes nothing.
        assert!(caps.get("completions").is_none(), "{caps}");
        assert_eq!(caps["resources"].get("subscribe"), None, "{caps}");
    });
}

#[test]
fn the_lists_carry_caching_hints_for_2026_07_28() {
    with_harness("lists", async |h| {
        let session = h.open_session(KEY_A, SESSION).await;
        // No prompts; the demo database's schema (this server offers execute_sql; no run of
        // the caller returned a file yet); both templates. Resources depend on the caller:
        // private; the rest is the same for every caller.
        for (method, field, scope) in [
            ("prompts/list", "prompts", "public"),
            ("resources/list", "resources", "private"),
            ("resources/templates/list", "resourceTemplates", "public"),
        ] {
            let listed = in_session(h, &session, method, json!({})).await;
            let items = listed["result"][field]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let names: Vec<&str> = items
                .iter()
                .filter_map(|t| t["uriTemplate"].as_str().or(t["uri"].as_str()))
                .collect();
            let expected: &[&str] = match field {
                "prompts" => &[],
                "resources" => &["sandboxrun://databases/demo/schema"],
                _ => &[
                    crate::resources::SCHEMA_TEMPLATE,
                    crate::resources::FILE_TEMPLATE,
                ],
            };
            assert_eq!(names, expected, "{method}: {listed}");
            // 2025-11-25 has no caching hints.
            assert_eq!(listed["result"].get("ttlMs"), None, "{method}: {listed}");

            let (status, stateless_listed) =
                stateless(h, method, json!({"_meta": meta(json!({}))})).await;
            assert_eq!(status, StatusCode::OK, "{method}: {stateless_listed}");
            assert_eq!(
                stateless_listed["result"][field], listed["result"][field],
                "{method}: {stateless_listed}"
            );
            assert_eq!(
                stateless_listed["result"]["ttlMs"], 0,
                "{method}: {stateless_listed}"
            );
            assert_eq!(
                stateless_listed["result"]["cacheScope"], scope,
                "{method}: {stateless_listed}"
            );
        }
    });
}

#[test]
fn an_unknown_resource_is_invalid_params_naming_its_uri() {
    with_harness("resource-not-found", async |h| {
        let uri = "sandboxrun://nothing/here";
        let (status, read) = stateless(
            h,
            "resources/read",
            json!({"uri": uri, "_meta": meta(json!({}))}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{read}");
        assert_eq!(read["error"]["code"], -32602, "{read}");
        assert_eq!(read["error"]["data"]["uri"], uri, "{read}");
    });
}

#[test]
fn a_request_needing_an_undeclared_client_capability_gets_32021_and_400() {
    with_harness("capability", async |h| {
        // tasks/get needs the tasks extension, which this client did not declare.
        let (status, refused) = stateless(
            h,
            "tasks/get",
            json!({"taskId": "whatever", "_meta": meta(json!({}))}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
        assert_eq!(refused["error"]["code"], -32021, "{refused}");
        assert!(
            refused["error"]["data"]["requiredCapabilities"]["extensions"]
                ["io.modelcontextprotocol/tasks"]
                .is_object(),
            "{refused}"
        );
        assert_eq!(refused["id"], 7, "{refused}");
    });
}

#[test]
fn a_page_of_the_servers_own_origin_is_served_and_a_foreign_one_refused() {
    with_harness("same-origin", async |h| {
        let discover = json!({"jsonrpc": "2.0", "id": 7, "method": "server/discover",
            "params": {"_meta": meta(json!({}))}});
        let post = |host: &str, origin: &str| {
            let (host, origin) = (host.to_owned(), origin.to_owned());
            let body = discover.to_string();
            move || {
                Request::post("/mcp")
                    .header("host", &host)
                    .header("origin", &origin)
                    .header("authorization", format!("Bearer {KEY_A}"))
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-protocol-version", STATELESS)
                    .header("mcp-method", "server/discover")
                    .body(Body::from(body.clone()))
                    .expect("request")
            }
        };
        for (host, origin) in [
            ("localhost:8000", "http://localhost:8000"),
            ("127.0.0.1:8000", "http://127.0.0.1:8000"),
            ("[::1]:8000", "http://[::1]:8000"),
        ] {
            let resp = h.send(post(host, origin)).await;
            assert_eq!(resp.status(), StatusCode::OK, "{host} {origin}");
        }
        for (host, origin) in [
            ("evil.example.com", "http://evil.example.com"),
            ("localhost:8000", "http://evil.example.com"),
            ("localhost:8000", "http://localhost:8001"),
            ("localhost:8000", "null"),
        ] {
            let resp = h.send(post(host, origin)).await;
            assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{host} {origin}");
        }
    });
}

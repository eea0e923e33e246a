//! The MCP side: connect to sandboxrun (a `sandboxrun-mcp stdio` child process, or a server
//! over Streamable HTTP with an API key), list its tools, call them.
//!
//! A tool that fails is not an error here: `isError` results and JSON-RPC errors for a call
//! become text for the model. Only a connection that is gone ends the run.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    Implementation, JsonObject, ResourceContents, Tool,
};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::cli::API_KEY_ENV;
use crate::error::{AgentError, causes};
use crate::files::ReturnedImage;

/// Largest tool result handed to the model, in characters: the sandbox already caps its output,
/// this keeps a chatty tool from filling the model's context.
const MAX_RESULT_CHARS: usize = 100_000;

/// Largest part of one returned text file (an embedded text resource) handed to the model, in
/// characters.
const MAX_RESOURCE_CHARS: usize = 20_000;

/// Lines of the embedded server's stderr kept to explain a failed start.
const STDERR_TAIL_LINES: usize = 20;

/// The embedded server's name: next to this binary, else on PATH.
const SERVER_BINARY: &str = "sandboxrun-mcp";

/// Where the MCP server is.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// Start `program stdio args...` and speak MCP on its stdin/stdout.
    Stdio {
        /// The server binary.
        program: PathBuf,
        /// Arguments after `stdio`.
        args: Vec<String>,
    },
    /// A server at a Streamable HTTP URL.
    Http {
        /// The endpoint, e.g. `http://127.0.0.1:8000/mcp`.
        url: String,
        /// Sent as `Authorization: Bearer KEY`.
        api_key: Option<String>,
    },
}

impl Endpoint {
    /// The default embedded server: `sandboxrun-mcp` next to the running binary (how releases
    /// and `cargo build` lay them out), else whatever PATH finds.
    pub fn default_server() -> PathBuf {
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join(SERVER_BINARY)))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from(SERVER_BINARY))
    }

    /// How the endpoint is named in messages.
    pub fn describe(&self) -> String {
        match self {
            Endpoint::Stdio { program, .. } => format!("`{} stdio`", program.display()),
            Endpoint::Http { url, .. } => url.clone(),
        }
    }
}

/// The result of one tool call, as the model will see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutcome {
    /// The text for the tool message.
    pub text: String,
    /// Whether the tool reported an error (`isError`) or the server refused the call.
    pub is_error: bool,
    /// The images it returned, to be saved on this machine (the model cannot see them).
    pub images: Vec<ReturnedImage>,
}

impl ToolOutcome {
    /// An outcome of text only.
    pub fn text(text: String, is_error: bool) -> Self {
        Self {
            text,
            is_error,
            images: Vec::new(),
        }
    }
}

/// A live connection to an MCP server.
pub struct Session {
    service: RunningService<RoleClient, ClientConfig>,
    endpoint: Endpoint,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

impl Session {
    /// Connects and initializes.
    pub async fn connect(endpoint: Endpoint) -> Result<Self, AgentError> {
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("sandboxrun-agent", env!("CARGO_PKG_VERSION")),
        );
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let started = match &endpoint {
            Endpoint::Stdio { program, args } => {
                let mut command = tokio::process::Command::new(program);
                command.arg("stdio").args(args);
                // However the agent ends (Ctrl-C included), the server and its sandbox go too.
                command.kill_on_drop(true);
                // The server logs to stderr; keep it quiet unless the user asks for logs.
                if std::env::var_os("RUST_LOG").is_none() {
                    command.env("RUST_LOG", "warn");
                }
                let (transport, stderr) = TokioChildProcess::builder(command)
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|e| spawn_error(program, &e))?;
                if let Some(stderr) = stderr {
                    let tail = stderr_tail.clone();
                    tokio::spawn(async move {
                        let mut lines = BufReader::new(stderr).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            let mut tail = tail.lock().expect("stderr tail lock");
                            if tail.len() == STDERR_TAIL_LINES {
                                tail.pop_front();
                            }
                            tail.push_back(line);
                        }
                    });
                }
                info.serve(transport).await.map_err(|e| causes(&e))
            }
            Endpoint::Http { url, api_key } => {
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone());
                if let Some(key) = api_key {
                    config = config.auth_header(key.clone());
                }
                let transport = StreamableHttpClientTransport::from_config(config);
                info.serve(transport).await.map_err(|e| {
                    let mut text = tidy_transport_error(causes(&e));
                    // Connection first: nothing was answered, so no status can be in the text
                    // (its URL's port may still hold the digits 401).
                    if is_connect_error(&e) || text.contains("error sending request") {
                        // rmcp keeps only the text of reqwest's error, not its source chain.
                        text.push_str("; check --url and that the server is up");
                    } else if e.auth_challenge().is_some() || names_status_401(&text) {
                        text.push_str(&format!(
                            "; the server wants an API key it accepts in ${API_KEY_ENV}"
                        ));
                    }
                    text
                })
            }
        };
        match started {
            Ok(service) => Ok(Self {
                service,
                endpoint,
                stderr_tail,
            }),
            Err(reason) => {
                // The child may still be writing its last words.
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                let session_less = StderrTail(stderr_tail);
                Err(AgentError::Mcp(format!(
                    "cannot start an MCP session with {}: {reason}{}",
                    endpoint.describe(),
                    session_less.explain()
                )))
            }
        }
    }

    /// The server's instructions for the model, from initialization.
    pub fn instructions(&self) -> Option<String> {
        self.service
            .peer_info()
            .and_then(|info| info.instructions.clone())
            .filter(|i| !i.trim().is_empty())
    }

    /// Every tool the server offers.
    pub async fn tools(&self) -> Result<Vec<Tool>, AgentError> {
        self.service
            .list_all_tools()
            .await
            .map_err(|e| self.lost(&e, "listing its tools"))
    }

    /// Calls a tool. Tool failures come back as an error outcome for the model; only a lost
    /// connection is an `Err`.
    pub async fn call(&self, tool: &str, arguments: JsonObject) -> Result<ToolOutcome, AgentError> {
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        match self.service.call_tool(params).await {
            Ok(result) => Ok(outcome(&result)),
            Err(ServiceError::McpError(e)) => Ok(ToolOutcome::text(
                format!("error: the server refused the call: {}", e.message),
                true,
            )),
            Err(ServiceError::Timeout { timeout }) => Ok(ToolOutcome::text(
                format!(
                    "error: the call got no answer within {}s; nothing is known about its result",
                    timeout.as_secs()
                ),
                true,
            )),
            Err(e) => Err(self.lost(&e, &format!("calling {tool}"))),
        }
    }

    /// Ends the session (and stops an embedded server).
    pub async fn close(self) {
        let _ = self.service.cancel().await;
    }

    fn lost(&self, e: &ServiceError, doing: &str) -> AgentError {
        AgentError::Mcp(format!(
            "the MCP server {} failed while {doing}: {}{}",
            self.endpoint.describe(),
            causes(e),
            StderrTail(self.stderr_tail.clone()).explain()
        ))
    }
}

/// The last lines an embedded server wrote to stderr.
struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    /// `; the server said: ...` with its last meaningful line, or nothing.
    fn explain(&self) -> String {
        let tail = self.0.lock().expect("stderr tail lock");
        tail.iter()
            .rev()
            .map(|l| l.trim())
            .find(|l| !l.is_empty())
            .map(|l| {
                format!(
                    "; the server said: {}",
                    l.chars().take(500).collect::<String>()
                )
            })
            .unwrap_or_default()
    }
}

/// rmcp's transport errors name the transport's full Rust type; keep what a user can act on.
fn tidy_transport_error(mut text: String) -> String {
    if let (Some(start), Some(end)) = (text.find("Transport ["), text.find("] error: "))
        && start < end
    {
        text.replace_range(start..end + "] error: ".len(), "");
    }
    text.replace("Send message error ", "")
        .replace(", when send initialize request", " (initialize request)")
}

/// Whether the connection itself failed (nothing listening, DNS, unreachable network).
fn is_connect_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(e);
    while let Some(err) = current {
        if err
            .downcast_ref::<reqwest::Error>()
            .is_some_and(reqwest::Error::is_connect)
        {
            return true;
        }
        current = err.source();
    }
    false
}

fn spawn_error(program: &Path, e: &std::io::Error) -> AgentError {
    let hint = if e.kind() == std::io::ErrorKind::NotFound {
        "; build it (cargo build -p sandboxrun-mcp), put it on PATH or pass --server PATH, or use \
         --url for a running server"
    } else {
        ""
    };
    AgentError::Mcp(format!(
        "cannot start the MCP server `{} stdio`: {e}{hint}",
        program.display()
    ))
}

/// Whether an error's text names HTTP status 401 as a number of its own (not as digits of a
/// port or an id): rmcp keeps an unchallenged 401 only as text.
fn names_status_401(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_digit())
        .any(|number| number == "401")
}

/// The text of a tool result: its text blocks (the sandboxrun tools put a sentence for the model
/// first, then the structured result as JSON), returned text files with their name (each cut at
/// [`MAX_RESOURCE_CHARS`]), other blocks described, `error: ` in front of a failure. Images are
/// described by name and kept in [`ToolOutcome::images`] to be saved; their names come from the
/// structured result's `files` list (sandboxrun returns one image block per image file, in that
/// order), else they have none.
pub fn outcome(result: &CallToolResult) -> ToolOutcome {
    let is_error = result.is_error.unwrap_or(false);
    let mut image_names = image_file_names(result.structured_content.as_ref()).into_iter();
    let mut images = Vec::new();
    let mut parts: Vec<String> = Vec::with_capacity(result.content.len());
    for block in &result.content {
        let ContentBlock::Image(image) = block else {
            parts.push(describe_block(block));
            continue;
        };
        let name = image_names.next().unwrap_or_default();
        let shown = if name.is_empty() {
            "an image".to_owned()
        } else {
            format!(
                "the image {}",
                sandboxrun_core::files::printable_name(&name)
            )
        };
        // The server's word for the type is not taken: only a raster image, by its bytes, is
        // saved (an SVG or HTML file saved as an image would run its scripts when opened).
        let declared = sandboxrun_core::files::printable_name(&image.mime_type);
        match decode_base64(&image.data) {
            Ok(data) => match sandboxrun_core::files::raster_image_type(&data) {
                Some(kind) => {
                    parts.push(format!(
                        "[{shown} ({kind}, {} bytes), not shown]",
                        data.len()
                    ));
                    images.push(ReturnedImage {
                        name,
                        mime_type: kind.to_owned(),
                        data,
                    });
                }
                None => parts.push(format!(
                    "[{shown} (declared {declared}, {} bytes) is not a PNG, JPEG, GIF or WebP \
                     image by its bytes: not shown and not saved]",
                    data.len()
                )),
            },
            Err(_) => parts.push(format!(
                "[{shown} ({declared}) that is not valid base64, not shown]"
            )),
        }
    }
    if parts.iter().all(|p| p.trim().is_empty()) {
        parts = match &result.structured_content {
            Some(value) => vec![value.to_string()],
            None => vec!["(the tool returned no content)".to_owned()],
        };
    }
    let mut text = parts.join("\n");
    if is_error && !text.to_ascii_lowercase().starts_with("error") {
        text.insert_str(0, "error: ");
    }
    if text.chars().count() > MAX_RESULT_CHARS {
        text = text.chars().take(MAX_RESULT_CHARS).collect();
        text.push_str(&format!(
            "\n[cut at {MAX_RESULT_CHARS} characters: print less, or summarise inside the tool]"
        ));
    }
    ToolOutcome {
        text,
        is_error,
        images,
    }
}

/// The names of the image files a structured result lists (`files: [{name, mimeType}]`), in
/// order.
fn image_file_names(structured: Option<&serde_json::Value>) -> Vec<String> {
    let Some(files) = structured
        .and_then(|s| s.get("files"))
        .and_then(serde_json::Value::as_array)
    else {
        return Vec::new();
    };
    files
        .iter()
        .filter(|f| {
            f.get("mimeType")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|m| m.starts_with("image/"))
        })
        .map(|f| {
            f.get("name")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// Standard base64 to bytes.
fn decode_base64(text: &str) -> Result<Vec<u8>, serde_json::Error> {
    sandboxrun_core::files::base64_bytes::deserialize(serde_json::Value::String(text.to_owned()))
}

/// The last path component of a resource URI, for naming a returned file.
fn uri_name(uri: &str) -> &str {
    uri.rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or(uri)
}

fn describe_block(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(t) => t.text.clone(),
        ContentBlock::Image(i) => format!("[{} image, not shown]", i.mime_type),
        ContentBlock::Audio(a) => format!("[{} audio, not shown]", a.mime_type),
        ContentBlock::Resource(r) => match &r.resource {
            ResourceContents::TextResourceContents {
                uri,
                mime_type,
                text,
                ..
            } => {
                let total = text.chars().count();
                let mut shown: String = text.chars().take(MAX_RESOURCE_CHARS).collect();
                if total > MAX_RESOURCE_CHARS {
                    shown.push_str(&format!(
                        "\n[cut at {MAX_RESOURCE_CHARS} of {total} characters: write a smaller \
                         file, or print a summary instead]"
                    ));
                }
                format!(
                    "[file {} ({}, {uri}):]\n{shown}",
                    sandboxrun_core::files::printable_name(uri_name(uri)),
                    mime_type.as_deref().unwrap_or("text/plain"),
                )
            }
            ResourceContents::BlobResourceContents {
                uri,
                mime_type,
                blob,
                ..
            } => {
                let size = decode_base64(blob)
                    .map(|b| format!("{} bytes", b.len()))
                    .unwrap_or_else(|_| "not valid base64".to_owned());
                format!(
                    "[binary file {} ({}, {size}, {uri}), not shown]",
                    sandboxrun_core::files::printable_name(uri_name(uri)),
                    mime_type.as_deref().unwrap_or("application/octet-stream"),
                )
            }
            _ => "[a resource of a kind this agent does not know, not shown]".to_owned(),
        },
        ContentBlock::ResourceLink(link) => format!("[resource {}]", link.uri),
        _ => "[content of a kind this agent does not know, not shown]".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_401_is_a_number_of_its_own_not_digits_of_a_port() {
        assert!(names_status_401("Unexpected status 401 Unauthorized"));
        assert!(names_status_401("(401)"));
        assert!(!names_status_401(
            "error sending request for url (http://127.0.0.1:40141/mcp)"
        ));
        assert!(!names_status_401("http://127.0.0.1:14010/mcp: status 500"));
    }

    #[test]
    fn success_text_is_the_content() {
        let r = CallToolResult::structured(json!({"stdout": "42\n", "phase": "Succeeded"}));
        let o = outcome(&r);
        assert!(!o.is_error);
        let v: serde_json::Value = serde_json::from_str(&o.text).unwrap();
        assert_eq!(v["stdout"], "42\n");
    }

    #[test]
    fn errors_are_marked_for_the_model() {
        let r = CallToolResult::error(vec![ContentBlock::text("the code exited with status 1")]);
        let o = outcome(&r);
        assert!(o.is_error);
        assert_eq!(o.text, "error: the code exited with status 1");
        let empty = CallToolResult::error(vec![]);
        assert_eq!(
            outcome(&empty).text,
            "error: (the tool returned no content)"
        );
    }

    #[test]
    fn transport_type_names_are_left_out() {
        assert_eq!(
            tidy_transport_error(
                "Send message error Transport [rmcp::transport::worker::WorkerTransport<X<Y>>] \
                 error: Client error: error sending request for url (http://h/mcp), when send \
                 initialize request"
                    .to_owned()
            ),
            "Client error: error sending request for url (http://h/mcp) (initialize request)"
        );
    }

    #[test]
    fn huge_results_are_cut_with_a_note() {
        let r =
            CallToolResult::success(vec![ContentBlock::text("x".repeat(MAX_RESULT_CHARS + 10))]);
        let o = outcome(&r);
        assert!(o.text.starts_with(&"x".repeat(MAX_RESULT_CHARS)));
        assert!(o.text.ends_with("summarise inside the tool]"));
    }

    /// A result as sandboxrun-mcp returns a run that wrote files: the structured JSON as text,
    /// then one block per file in the order of `files`, then a note.
    fn result_with_files() -> CallToolResult {
        let structured = json!({
            "stdout": "total 42\n",
            "files": [
                {"name": "totals.csv", "mimeType": "text/csv", "size": 12},
                {"name": "chart.png", "mimeType": "image/png", "size": 8},
                {"name": "model.bin", "mimeType": "application/octet-stream", "size": 3},
                {"name": "logo.svg", "mimeType": "image/svg+xml", "size": 11},
            ],
        });
        let mut r = CallToolResult::structured(structured);
        r.content.extend([
            ContentBlock::resource(
                ResourceContents::text("region,n\nx,1\n", "file:///tmp/outputs/totals.csv")
                    .with_mime_type("text/csv"),
            ),
            ContentBlock::image("iVBORw0KGgo=", "image/png"),
            ContentBlock::resource(
                ResourceContents::blob("AQID", "file:///tmp/outputs/model.bin")
                    .with_mime_type("application/octet-stream"),
            ),
            // A server that sends an SVG as an image (sandboxrun-mcp does not).
            ContentBlock::image("PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+PC9zdmc+", "image/svg+xml"),
            ContentBlock::text(
                "1 file(s) in /tmp/outputs were not returned: link (notARegularFile)",
            ),
        ]);
        r
    }

    #[test]
    fn files_become_text_for_the_model_and_images_to_save() {
        let o = outcome(&result_with_files());
        assert!(!o.is_error);
        assert_eq!(
            o.images,
            [ReturnedImage {
                name: "chart.png".into(),
                mime_type: "image/png".into(),
                data: b"\x89PNG\r\n\x1a\n".to_vec(),
            }]
        );
        let lines: Vec<&str> = o.text.lines().collect();
        assert!(lines[0].starts_with("{\"files\""), "{}", o.text);
        assert_eq!(
            &lines[1..],
            [
                "[file totals.csv (text/csv, file:///tmp/outputs/totals.csv):]",
                "region,n",
                "x,1",
                "",
                "[the image chart.png (image/png, 8 bytes), not shown]",
                "[binary file model.bin (application/octet-stream, 3 bytes, \
                 file:///tmp/outputs/model.bin), not shown]",
                "[the image logo.svg (declared image/svg+xml, 27 bytes) is not a PNG, JPEG, GIF or \
                 WebP image by its bytes: not shown and not saved]",
                "1 file(s) in /tmp/outputs were not returned: link (notARegularFile)",
            ]
        );
    }

    #[test]
    fn images_without_a_listed_name_or_valid_data() {
        let r = CallToolResult::success(vec![
            ContentBlock::image("iVBORw0KGgo=", "image/png"),
            ContentBlock::image("not base64!", "image/png"),
            // Declared PNG, but GIF bytes: the bytes say what it is.
            ContentBlock::image("R0lGODlh", "image/png"),
            // Declared PNG, HTML bytes; a declared type with a terminal escape in it.
            ContentBlock::image("PGh0bWw+", "image/png\u{1b}]0;x\u{7}"),
        ]);
        let o = outcome(&r);
        assert_eq!(o.images.len(), 2);
        assert_eq!(o.images[0].name, "");
        assert_eq!(o.images[1].mime_type, "image/gif");
        assert_eq!(
            o.text,
            "[an image (image/png, 8 bytes), not shown]\n\
             [an image (image/png) that is not valid base64, not shown]\n\
             [an image (image/gif, 6 bytes), not shown]\n\
             [an image (declared image/png\\u{1b}]0;x\\u{7}, 6 bytes) is not a PNG, JPEG, GIF \
             or WebP image by its bytes: not shown and not saved]"
        );
    }

    #[test]
    fn long_text_files_are_cut_for_the_model() {
        let text = "y".repeat(MAX_RESOURCE_CHARS + 5);
        let r = CallToolResult::success(vec![ContentBlock::resource(ResourceContents::text(
            text,
            "file:///tmp/outputs/big.txt",
        ))]);
        let o = outcome(&r);
        assert!(
            o.text
                .starts_with("[file big.txt (text/plain, file:///tmp/outputs/big.txt):]\n")
        );
        assert!(o.text.contains(&"y".repeat(MAX_RESOURCE_CHARS)));
        assert!(!o.text.contains(&"y".repeat(MAX_RESOURCE_CHARS + 1)));
        assert!(
            o.text
                .ends_with(&format!("[cut at {MAX_RESOURCE_CHARS} of {} characters: write a smaller file, or print a summary instead]", MAX_RESOURCE_CHARS + 5)),
            "{}",
            &o.text[o.text.len() - 200..]
        );
    }
}

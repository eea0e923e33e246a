//! Files in and out of a sandbox run, and the sandbox profile (which image a run gets).
//!
//! A `run_python` call may pass a few small input files; the runner places them read-only under
//! [`INPUT_DIR`] before the code starts. What the code writes under [`OUTPUT_DIR`] comes back with
//! the result, within [`FileCaps`]: the runner collects regular files only (never a symlink, a
//! directory, a device or a FIFO; nothing outside the directory), and [`collect`] checks every
//! bound again on this side of the sandbox, so a runner from another image cannot exceed them.
//! Whatever is left out is reported by name with its reason ([`OmittedFile`]), never dropped
//! silently. Files travel with the program (stdin) and in the result envelope (the runner's
//! stdout), the same channels as the code and its output: never a command line or a Pod field.
//!
//! A file's name is one path component from a small alphabet ([`check_name`]): that closes
//! traversal (`..`, `/`), hidden and control-character names, and names that mean something to a
//! shell or a terminal, for input and output alike.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Where input files are placed in the sandbox (read-only; the code's working directory is /tmp).
pub const INPUT_DIR: &str = "/tmp/inputs";
/// Where the code writes the files it wants returned.
pub const OUTPUT_DIR: &str = "/tmp/outputs";
/// Longest file name, in bytes.
pub const MAX_NAME_BYTES: usize = 100;
/// Most input files a call may pass (a policy rule may allow fewer).
pub const MAX_INPUT_FILES: u32 = 20;
/// Most input bytes a call may pass, all files together (256 KiB; a policy rule may allow fewer).
/// They are stored in the SandboxRun's spec, base64-encoded, next to at most 256 KiB of code.
pub const MAX_INPUT_BYTES: u64 = 256 * 1024;
/// Most output files a run returns (a policy rule may allow fewer).
pub const MAX_OUTPUT_FILES: u32 = 20;
/// Most output bytes a run returns, all files together (384 KiB; a policy rule may allow fewer).
/// In a cluster they are stored base64-encoded in the run's status: with the largest code, input
/// files and output the object stays under etcd's 1.5 MiB limit.
pub const MAX_OUTPUT_BYTES: u64 = 384 * 1024;

/// Most bytes the returned files add to the runner's envelope: their base64, each file's and
/// each omitted file's framing.
pub const ENVELOPE_FILES_MAX_BYTES: u64 =
    MAX_OUTPUT_BYTES.div_ceil(3) * 4 + (MAX_OUTPUT_FILES as u64 + MAX_OMITTED as u64) * 256;

/// The image a sandbox runs: the standard library only, or the data stack.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// `sandbox-python`: Debian's python3, the standard library only.
    #[default]
    Minimal,
    /// `sandbox-python-data`: python3 with numpy, pandas, scipy and matplotlib (Agg).
    Data,
}

impl Profile {
    /// Every profile.
    pub const ALL: [Profile; 2] = [Profile::Minimal, Profile::Data];

    /// The one string form, as in arguments, the resource, policy and pool specs.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Minimal => "minimal",
            Profile::Data => "data",
        }
    }

    /// The profile named `s`, if any.
    pub fn parse(s: &str) -> Option<Profile> {
        Profile::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The image (and unpacked root file system) name `images/build.sh` gives this profile.
    pub fn image_name(self) -> &'static str {
        match self {
            Profile::Minimal => "sandbox-python",
            Profile::Data => "sandbox-python-data",
        }
    }

    /// The modules a sandbox of this profile imports before its program arrives (the runner's
    /// PRELOAD, core/src/runner.py): a warm sandbox pays for them while it idles, and the code
    /// finds them loaded. `import pandas, matplotlib.pyplot` costs about 1 s natively and 2 to 3 s
    /// under gVisor, which every call of the data profile paid before.
    pub fn preloaded_modules(self) -> &'static [&'static str] {
        match self {
            Profile::Minimal => &[],
            Profile::Data => &[
                "numpy",
                "pandas",
                "matplotlib",
                "matplotlib.pyplot",
                "scipy",
            ],
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Checks that `name` is a plain file name: 1 to [`MAX_NAME_BYTES`] bytes of ASCII letters,
/// digits, `.`, `_` and `-`, starting with a letter or digit. Returns what is wrong otherwise.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".to_owned());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "the name is {} bytes long; at most {MAX_NAME_BYTES} are allowed",
            name.len()
        ));
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Err("a name must start with a letter or a digit".to_owned());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "the character {c:?} is not allowed: use letters, digits, '.', '_' and '-' only \
             (one file name, no directories)"
        ));
    }
    Ok(())
}

/// One input file: its name in [`INPUT_DIR`] and its bytes.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InputFile {
    /// The file's name (see [`check_name`]).
    pub name: String,
    /// The file's content, base64 in JSON.
    #[serde(with = "base64_bytes")]
    #[schemars(with = "String")]
    pub content: Vec<u8>,
}

impl fmt::Debug for InputFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InputFile")
            .field("name", &self.name)
            .field("bytes", &self.content.len())
            .finish()
    }
}

/// Checks a set of input files against the global bounds (a policy rule may set lower ones):
/// valid, distinct names, at most [`MAX_INPUT_FILES`] files and [`MAX_INPUT_BYTES`] in all.
pub fn check_inputs(files: &[InputFile]) -> Result<(), String> {
    check_inputs_within(files, MAX_INPUT_FILES, MAX_INPUT_BYTES)
}

/// [`check_inputs`] with the given bounds.
pub fn check_inputs_within(
    files: &[InputFile],
    max_files: u32,
    max_bytes: u64,
) -> Result<(), String> {
    if files.len() > max_files as usize {
        return Err(format!(
            "{} input files were passed; at most {max_files} are allowed",
            files.len()
        ));
    }
    let total = input_bytes(files);
    if total > max_bytes {
        return Err(format!(
            "the input files hold {total} bytes together; at most {max_bytes} are allowed"
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for f in files {
        check_name(&f.name).map_err(|e| format!("input file name {:?}: {e}", f.name))?;
        if !seen.insert(f.name.as_str()) {
            return Err(format!("the input file name {:?} is given twice", f.name));
        }
    }
    Ok(())
}

/// The bytes of all input files together.
pub fn input_bytes(files: &[InputFile]) -> u64 {
    files.iter().map(|f| f.content.len() as u64).sum()
}

/// The bounds on what a run returns as files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileCaps {
    /// Most files returned.
    pub max_files: u32,
    /// Most bytes returned, all files together.
    pub max_bytes: u64,
}

impl Default for FileCaps {
    fn default() -> Self {
        Self {
            max_files: MAX_OUTPUT_FILES,
            max_bytes: MAX_OUTPUT_BYTES,
        }
    }
}

impl FileCaps {
    /// The same caps forced within the global maxima.
    pub fn clamped(self) -> Self {
        Self {
            max_files: self.max_files.min(MAX_OUTPUT_FILES),
            max_bytes: self.max_bytes.min(MAX_OUTPUT_BYTES),
        }
    }
}

/// A file the runner returned, as its envelope carries it (content in base64).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerFile {
    /// Its name in [`OUTPUT_DIR`].
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its content, base64.
    pub data: String,
}

/// Why a file the code wrote was not returned.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum OmitReason {
    /// More files than the cap allows: the first ones by name were returned.
    FileCount,
    /// Returning it would have passed the byte cap.
    ByteCount,
    /// Not a regular file (a symlink, a directory, a FIFO, a device, a socket): never followed.
    NotARegularFile,
    /// Its name is not a plain file name (see [`check_name`]).
    BadName,
    /// It could not be read.
    Unreadable,
}

impl OmitReason {
    /// The one string form, as the envelope and the structured output carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            OmitReason::FileCount => "fileCount",
            OmitReason::ByteCount => "byteCount",
            OmitReason::NotARegularFile => "notARegularFile",
            OmitReason::BadName => "badName",
            OmitReason::Unreadable => "unreadable",
        }
    }
}

/// A file the code wrote that did not come back, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::portable)]
pub struct OmittedFile {
    /// Its name as the directory listed it (control characters escaped, at most
    /// [`MAX_NAME_BYTES`] bytes kept).
    pub name: String,
    /// Its size, when known.
    // Optional rather than nullable, for schema dialects with one `type` per property.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u64")]
    pub size: Option<u64>,
    /// Why it was left out.
    pub reason: OmitReason,
}

/// A file the code wrote, returned with the result.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::portable)]
pub struct OutputFile {
    /// Its name in [`OUTPUT_DIR`].
    pub name: String,
    /// Its MIME type, from its name and checked against its content ([`mime_type`]).
    pub mime_type: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its content: returned as MCP content (an image, an embedded resource), not in the
    /// structured output, which lists the files.
    #[serde(skip)]
    #[schemars(skip)]
    pub data: Vec<u8>,
}

impl fmt::Debug for OutputFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutputFile")
            .field("name", &self.name)
            .field("mime_type", &self.mime_type)
            .field("size", &self.size)
            .finish()
    }
}

impl OutputFile {
    /// A returned file named `name` with `data`, its MIME type derived.
    pub fn new(name: String, data: Vec<u8>) -> Self {
        Self {
            mime_type: mime_type(&name, &data).to_owned(),
            size: data.len() as u64,
            name,
            data,
        }
    }

    /// The content as base64.
    pub fn base64(&self) -> String {
        BASE64.encode(&self.data)
    }

    /// What kind of MCP content this file becomes, decided again from its name and bytes (not
    /// from [`OutputFile::mime_type`], which a status or a test may have set): an image only
    /// when the bytes are the raster image the type says.
    pub fn kind(&self) -> FileKind {
        let mime = self.content_type();
        match raster_image_type(&self.data) {
            Some(image) if image == mime => FileKind::Image,
            _ => kind_of(mime),
        }
    }

    /// The MIME type to declare to a client: [`mime_type`] of the name and bytes.
    pub fn content_type(&self) -> &'static str {
        mime_type(&self.name, &self.data)
    }
}

/// How a returned file is shown to a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A raster image a client can show (PNG, JPEG, GIF, WebP): its bytes carry the format's
    /// signature. Nothing else is ever an image: a client renders an image, and formats with
    /// active content (SVG, HTML) must never be rendered.
    Image,
    /// Text (UTF-8), returned as an embedded text resource.
    Text,
    /// Anything else, returned as an embedded base64 resource.
    Binary,
}

/// The raster image format the bytes are, by their signature; `None` for anything else. These
/// are the only formats that go out as image content: they carry no scripts, links or
/// references a client could act on when it renders them.
pub fn raster_image_type(data: &[u8]) -> Option<&'static str> {
    if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if data.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if data.len() >= 12 && data.starts_with(b"RIFF") && &data[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// Extensions of formats a client may render as active content (scripts, forms, links that
/// load things): whatever their content, such a file is never declared as its format. PDF is
/// among them (it can carry JavaScript and forms); it is binary, so it goes out as
/// `application/octet-stream`.
const ACTIVE_EXTENSIONS: [&str; 18] = [
    "svg", "svgz", "html", "htm", "xhtml", "xht", "shtml", "xml", "xsl", "xslt", "js", "mjs",
    "cjs", "hta", "mht", "mhtml", "pdf", "swf",
];

/// Whether text is markup a client could render: its first character, past a byte order mark
/// and white space, opens a tag, a declaration, a processing instruction or a comment (`<svg`,
/// `<?xml`, `<!DOCTYPE html`, `<html`, `<script`, `<!--`). Browsers sniff the same way.
pub fn looks_like_markup(data: &[u8]) -> bool {
    let data = data.strip_prefix(b"\xef\xbb\xbf").unwrap_or(data);
    data.iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'<')
}

/// Whether text holds an HTML tag anywhere (`<` then a letter, `/`, `!` or `?`): Markdown with
/// one is rendered with it by some clients.
fn holds_tags(text: &[u8]) -> bool {
    text.windows(2)
        .any(|w| w[0] == b'<' && (w[1].is_ascii_alphabetic() || b"/!?".contains(&w[1])))
}

/// The MIME type of a returned file, decided so that a client never renders active content.
/// The name's extension proposes, the content disposes:
/// - an image type only for a raster image (PNG, JPEG, GIF, WebP) named as one, whose bytes
///   carry that format's signature ([`raster_image_type`]);
/// - anything that is not UTF-8 (nor such an image) is `application/octet-stream`;
/// - text that is markup ([`looks_like_markup`]: an SVG, HTML or XML document, whatever its
///   name), or named as an active format ([`ACTIVE_EXTENSIONS`]), is `text/plain`: the model
///   reads the source, no client renders it;
/// - other text by its extension (CSV, TSV, plain text, JSON, Python; Markdown only without
///   HTML tags in it), else `application/octet-stream`.
pub fn mime_type(name: &str, data: &[u8]) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    if matches!(ext.as_str(), "png" | "jpg" | "jpeg" | "gif" | "webp")
        && let Some(image) = raster_image_type(data)
    {
        return image;
    }
    if std::str::from_utf8(data).is_err() {
        return "application/octet-stream";
    }
    if looks_like_markup(data) || ACTIVE_EXTENSIONS.contains(&ext.as_str()) {
        return "text/plain";
    }
    match ext.as_str() {
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "txt" | "log" | "" => "text/plain",
        "md" if holds_tags(data) => "text/plain",
        "md" => "text/markdown",
        "json" => "application/json",
        "py" => "text/x-python",
        _ => "application/octet-stream",
    }
}

/// The type to tell a client for text declared as `mime`: `mime` when it is one of the text
/// types [`mime_type`] gives (none of which a client renders as active content), else
/// `text/plain`. For content built elsewhere than from a file's name and bytes.
pub fn inert_text_type(mime: &str) -> &str {
    if kind_of(mime) == FileKind::Text {
        mime
    } else {
        "text/plain"
    }
}

/// The kind a MIME type from [`mime_type`] gives; a raster image needs its bytes as well (see
/// [`OutputFile::kind`]).
fn kind_of(mime: &str) -> FileKind {
    match mime {
        "text/plain"
        | "text/csv"
        | "text/tab-separated-values"
        | "text/markdown"
        | "text/x-python"
        | "application/json" => FileKind::Text,
        _ => FileKind::Binary,
    }
}

/// The files of a runner's envelope, checked again against `caps` on this side of the sandbox:
/// names, count, bytes and the base64 itself. What does not pass is reported in the omitted list
/// with the runner's own omissions; a file is never cut, it comes whole or not at all.
pub fn collect(
    files: &[RunnerFile],
    runner_omitted: &[OmittedFile],
    caps: FileCaps,
) -> (Vec<OutputFile>, Vec<OmittedFile>) {
    let caps = caps.clamped();
    let mut kept: Vec<OutputFile> = Vec::new();
    let mut omitted: Vec<OmittedFile> = Vec::new();
    let mut bytes = 0u64;
    let omit = |name: &str, size: Option<u64>, reason| OmittedFile {
        name: printable_name(name),
        size,
        reason,
    };
    for f in files {
        if check_name(&f.name).is_err() || kept.iter().any(|k| k.name == f.name) {
            omitted.push(omit(&f.name, Some(f.size), OmitReason::BadName));
            continue;
        }
        let Ok(data) = BASE64.decode(f.data.as_bytes()) else {
            omitted.push(omit(&f.name, Some(f.size), OmitReason::Unreadable));
            continue;
        };
        let size = data.len() as u64;
        if kept.len() >= caps.max_files as usize {
            omitted.push(omit(&f.name, Some(size), OmitReason::FileCount));
            continue;
        }
        if bytes + size > caps.max_bytes {
            omitted.push(omit(&f.name, Some(size), OmitReason::ByteCount));
            continue;
        }
        bytes += size;
        kept.push(OutputFile::new(f.name.clone(), data));
    }
    // The runner's own list is bounded too: a runner cannot grow the status through it.
    for o in runner_omitted.iter().take(MAX_OMITTED) {
        omitted.push(omit(&o.name, o.size, o.reason));
    }
    omitted.truncate(MAX_OMITTED);
    (kept, omitted)
}

/// Most omitted files reported (the rest are counted in the last entry's absence: a run that
/// writes thousands of files is told about the first ones).
pub const MAX_OMITTED: usize = 50;

/// A name as it may be shown: control characters escaped, at most [`MAX_NAME_BYTES`] kept.
pub fn printable_name(name: &str) -> String {
    let escaped: String = name.chars().flat_map(char::escape_debug).collect();
    let mut end = escaped.len().min(MAX_NAME_BYTES);
    while !escaped.is_char_boundary(end) {
        end -= 1;
    }
    escaped[..end].to_owned()
}

/// What a model reads about the files that were left out; `None` when none were.
pub fn omitted_note(omitted: &[OmittedFile]) -> Option<String> {
    if omitted.is_empty() {
        return None;
    }
    let list: Vec<String> = omitted
        .iter()
        .take(10)
        .map(|o| format!("{} ({})", o.name, o.reason.as_str()))
        .collect();
    let more = omitted.len().saturating_sub(10);
    Some(format!(
        "{} file(s) in {OUTPUT_DIR} were not returned: {}{}; only regular files with plain \
         names (letters, digits, '.', '_', '-') come back, within the server's caps on count \
         (fileCount) and bytes (byteCount)",
        omitted.len(),
        list.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        },
    ))
}

/// Serde for bytes as standard base64 text.
pub mod base64_bytes {
    use super::BASE64;
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes bytes as base64.
    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&BASE64.encode(bytes))
    }

    /// Reads base64 into bytes.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        BASE64
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
#[path = "files_tests.rs"]
mod tests;

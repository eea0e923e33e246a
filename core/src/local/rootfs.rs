//! The sandbox's root file system: the `sandbox-python` image unpacked into a directory by
//! `images/build.sh rootfs sandbox-python DIR`, which writes [`MARKER`] last. Both engines use it
//! read-only and shared by every run, so it is checked once, when the driver is set up.

use std::path::{Path, PathBuf};

use super::LocalSandboxError;

/// Written by `images/build.sh rootfs` after a complete unpack: `image REF layer DIGEST`.
pub const MARKER: &str = ".sandboxrun-rootfs";

/// Where the frontend looks by default: `$SANDBOXRUN_CACHE/rootfs/sandbox-python`, with
/// `SANDBOXRUN_CACHE` defaulting to `~/.cache/sandboxrun` as in `images/build.sh`.
pub fn default_rootfs() -> PathBuf {
    cache_dir().join("rootfs").join("sandbox-python")
}

/// `$SANDBOXRUN_CACHE`, else `$HOME/.cache/sandboxrun` (`/root` when HOME is unset).
pub(super) fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SANDBOXRUN_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache").join("sandboxrun")
}

/// Checks that `dir` holds a complete unpacked image with a Python, and returns it absolute
/// (runsc wants an absolute `root.path`; bwrap resolves relative paths against its own cwd).
pub(super) fn check(dir: &Path) -> Result<PathBuf, LocalSandboxError> {
    let missing = |detail: &str| LocalSandboxError::RootfsMissing {
        path: dir.to_path_buf(),
        detail: detail.to_owned(),
    };
    let abs = std::fs::canonicalize(dir).map_err(|e| missing(&format!("cannot open it: {e}")))?;
    if !abs.join(MARKER).is_file() {
        return Err(missing(&format!(
            "no {MARKER} marker, so it was not (completely) unpacked by images/build.sh"
        )));
    }
    // /usr/bin/python3 is a symlink to python3.11 inside the image: resolve it there, not on
    // the host.
    let python = abs.join("usr/bin/python3");
    let target = std::fs::read_link(&python)
        .map(|t| {
            if t.is_absolute() {
                abs.join(t.strip_prefix("/").unwrap_or(&t))
            } else {
                abs.join("usr/bin").join(t)
            }
        })
        .unwrap_or(python);
    if !target.is_file() {
        return Err(missing("it has no /usr/bin/python3"));
    }
    Ok(abs)
}

//! The driver's state directory (runsc's `--root` and the per-run OCI bundles), created and
//! checked so that nobody else can read or replace what is in it.
//!
//! Whoever can write the state directory, or any directory on the way to it, can swap a run's
//! `config.json` between the moment the driver writes it and the moment runsc reads it (a
//! different root file system, capabilities, host mounts), or runsc's own state. The default
//! `$TMPDIR/sandboxrun-<uid>` lives in a world-writable directory, so another user may have
//! created it first. Hence, for every directory the driver uses:
//! - a missing one is made with `mkdir(2)` and mode 0700 (atomic: it either creates a new,
//!   private directory or fails because something is already there), then checked like an
//!   existing one;
//! - an existing one must be a real directory (`lstat`, a symlink is refused, never followed),
//!   owned by the effective uid, with no group or other permission bits;
//! - every existing directory above it must be owned by root or the effective uid and not
//!   writable by group or others unless it has the sticky bit (like `/tmp`), both on the path
//!   as given and on its canonical form, and a symlink on the way must be owned by root or the
//!   effective uid (as OpenSSH's `StrictModes` checks a home directory).
//!
//! The driver never chmods, chowns or removes a directory it finds: it refuses with what is
//! wrong and what to do. The one exception is its own subdirectory (`runsc/`, `bundles/`)
//! inside a state directory that passed the checks, which it tightens to 0700
//! ([`ensure_private_inside`]).

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// runsc's `--root`, under the state directory.
pub(super) const RUNSC_ROOT: &str = "runsc";
/// The per-run OCI bundles, under the state directory.
pub(super) const BUNDLES: &str = "bundles";

/// [`ensure_private`] (for `state_dir` itself) or
/// [`ensure_private_inside`] (for a directory in it), with the error of this module.
pub(super) fn private_dir(
    state_dir: &Path,
    dir: &Path,
) -> Result<PathBuf, super::LocalSandboxError> {
    let result = if dir == state_dir {
        ensure_private(dir)
    } else {
        ensure_private_inside(dir)
    };
    result.map_err(|e| super::LocalSandboxError::UnsafeStateDir {
        state_dir: state_dir.to_path_buf(),
        path: e.path,
        detail: e.detail,
    })
}

/// Why a state directory was refused.
#[derive(Debug)]
pub(super) struct Unsafe {
    /// The directory (or the directory on the way to it) that is wrong.
    pub path: PathBuf,
    /// What is wrong with it.
    pub detail: String,
}

/// Creates `dir` (and its missing parents) private to the effective uid, or checks that an
/// existing one is; see the module documentation. Returns the directory as an absolute path.
pub(super) fn ensure_private(dir: &Path) -> Result<PathBuf, Unsafe> {
    ensure(dir, false)
}

/// [`ensure_private`] for a directory inside a state directory that was just checked: one of
/// ours with group or other bits (earlier versions made `bundles/` 0711) is tightened to 0700
/// instead of refused. Nobody else can have made or changed it since the state directory is
/// ours and private; someone else's, or a symlink, is still refused.
pub(super) fn ensure_private_inside(dir: &Path) -> Result<PathBuf, Unsafe> {
    ensure(dir, true)
}

fn ensure(dir: &Path, tighten_own: bool) -> Result<PathBuf, Unsafe> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let dir = absolute(dir)?;
    // The lexical path, component by component: the existing prefix is checked, the rest made.
    let mut prefix = PathBuf::new();
    let mut components = dir.components().peekable();
    while let Some(component) = components.next() {
        prefix.push(component);
        let last = components.peek().is_none();
        match std::fs::symlink_metadata(&prefix) {
            Ok(meta) if last && tighten_own && is_own_dir(&meta, uid) => {
                if meta.mode() & 0o077 != 0 {
                    std::fs::set_permissions(&prefix, PermissionsExt::from_mode(0o700))
                        .map_err(|e| unsafe_at(&prefix, format!("cannot make it 0700: {e}")))?;
                }
            }
            Ok(meta) if last => check_own(&prefix, &meta, uid)?,
            Ok(meta) => check_ancestor(&prefix, &meta, uid)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Everything from here down is ours to create.
                make(&prefix, uid)?;
                for rest in components.by_ref() {
                    prefix.push(rest);
                    make(&prefix, uid)?;
                }
                break;
            }
            Err(e) => return Err(unsafe_at(&prefix, format!("cannot inspect it: {e}"))),
        }
    }
    // Symlinks on the way (owned by root or us) were followed by the kernel: the directories
    // they lead to must pass the same test.
    let canonical = std::fs::canonicalize(&dir)
        .map_err(|e| unsafe_at(&dir, format!("cannot resolve it: {e}")))?;
    if canonical != dir {
        let mut prefix = PathBuf::new();
        for component in canonical.parent().into_iter().flat_map(Path::components) {
            prefix.push(component);
            let meta = std::fs::symlink_metadata(&prefix)
                .map_err(|e| unsafe_at(&prefix, format!("cannot inspect it: {e}")))?;
            check_ancestor(&prefix, &meta, uid)?;
        }
    }
    Ok(dir)
}

/// `mkdir(dir, 0700)`; when something got there first, it is checked like any existing
/// directory (a racing attacker's directory or symlink is refused, not used).
fn make(dir: &Path, uid: u32) -> Result<(), Unsafe> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(unsafe_at(dir, format!("cannot create it: {e}"))),
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| unsafe_at(dir, format!("cannot inspect it: {e}")))?;
    check_own(dir, &meta, uid)
}

fn is_own_dir(meta: &std::fs::Metadata, uid: u32) -> bool {
    meta.file_type().is_dir() && meta.uid() == uid
}

/// The state directory itself: a real directory, ours, private.
fn check_own(dir: &Path, meta: &std::fs::Metadata, uid: u32) -> Result<(), Unsafe> {
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        return Err(unsafe_at(
            dir,
            "it is a symbolic link (it is never followed: whoever made it chooses where the \
             driver's files go)"
                .to_owned(),
        ));
    }
    if !file_type.is_dir() {
        return Err(unsafe_at(dir, "it is not a directory".to_owned()));
    }
    if meta.uid() != uid {
        return Err(unsafe_at(
            dir,
            format!(
                "it is owned by uid {}, not by this process's uid {uid} (another user could \
                 replace the runsc state and OCI bundles in it)",
                meta.uid()
            ),
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(unsafe_at(
            dir,
            format!(
                "its mode is {mode:04o}: group and others must have no access (it must be \
                 0700; the driver does not change a directory it did not create)"
            ),
        ));
    }
    Ok(())
}

/// A directory on the way to the state directory: only root and we may change what is in it
/// (a sticky, world-writable directory like `/tmp` protects entries from other users).
fn check_ancestor(dir: &Path, meta: &std::fs::Metadata, uid: u32) -> Result<(), Unsafe> {
    let owner = meta.uid();
    if owner != 0 && owner != uid {
        return Err(unsafe_at(
            dir,
            format!(
                "this directory on the way to the state directory is owned by uid {owner}, \
                 neither root nor this process's uid {uid}"
            ),
        ));
    }
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    if !meta.file_type().is_dir() {
        return Err(unsafe_at(dir, "it is not a directory".to_owned()));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(unsafe_at(
            dir,
            format!(
                "this directory on the way to the state directory has mode {mode:04o}: \
                 writable by group or others without the sticky bit, so they could replace \
                 the state directory"
            ),
        ));
    }
    Ok(())
}

/// `dir` made absolute against the current directory, with `..` refused (it would make the
/// lexical walk check other directories than the kernel uses).
fn absolute(dir: &Path) -> Result<PathBuf, Unsafe> {
    if dir.components().any(|c| c == Component::ParentDir) {
        return Err(unsafe_at(
            dir,
            "it contains `..`: give a plain absolute path".to_owned(),
        ));
    }
    std::path::absolute(dir).map_err(|e| unsafe_at(dir, format!("cannot make it absolute: {e}")))
}

fn unsafe_at(path: &Path, detail: String) -> Unsafe {
    Unsafe {
        path: path.to_path_buf(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A fresh private scratch directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sandboxrun-statedir-test-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        dir
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn fresh_directories_are_created_private() {
        let base = scratch("fresh");
        let dir = base.join("a/b/state");
        assert_eq!(ensure_private(&dir).unwrap(), dir);
        for created in [base.join("a"), base.join("a/b"), dir.clone()] {
            assert_eq!(mode(&created), 0o700, "{}", created.display());
        }
        // Idempotent.
        ensure_private(&dir).unwrap();
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_symlink_is_refused_and_not_followed() {
        let base = scratch("symlink");
        let target = base.join("elsewhere");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&target)
            .unwrap();
        let link = base.join("state");
        symlink(&target, &link).unwrap();
        let err = ensure_private(&link).unwrap_err();
        assert_eq!(err.path, link);
        assert!(err.detail.contains("symbolic link"), "{}", err.detail);
        // A dangling symlink is not "missing": it is refused too, and nothing is created.
        let dangling = base.join("dangling");
        symlink(base.join("nowhere"), &dangling).unwrap();
        let err = ensure_private(&dangling).unwrap_err();
        assert!(err.detail.contains("symbolic link"), "{}", err.detail);
        assert!(!base.join("nowhere").exists());
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn open_permissions_are_refused_and_left_alone() {
        let base = scratch("mode");
        let dir = base.join("state");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o777)).unwrap();
        let err = ensure_private(&dir).unwrap_err();
        assert!(err.detail.contains("0777"), "{}", err.detail);
        assert_eq!(mode(&dir), 0o777, "the driver changed the directory's mode");
        std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o750)).unwrap();
        assert!(ensure_private(&dir).is_err());
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_group_writable_parent_is_refused() {
        let base = scratch("parent");
        let parent = base.join("shared");
        std::fs::create_dir(&parent).unwrap();
        std::fs::set_permissions(&parent, PermissionsExt::from_mode(0o777)).unwrap();
        let err = ensure_private(&parent.join("state")).unwrap_err();
        assert_eq!(err.path, parent);
        assert!(!parent.join("state").exists());
        // With the sticky bit (like /tmp) it is fine.
        std::fs::set_permissions(&parent, PermissionsExt::from_mode(0o1777)).unwrap();
        ensure_private(&parent.join("state")).unwrap();
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn our_open_subdirectory_is_tightened_but_a_symlink_is_not_followed() {
        let base = scratch("inside");
        let sub = base.join("bundles");
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, PermissionsExt::from_mode(0o711)).unwrap();
        assert!(ensure_private(&sub).is_err());
        ensure_private_inside(&sub).unwrap();
        assert_eq!(mode(&sub), 0o700);
        let link = base.join("runsc");
        symlink(&sub, &link).unwrap();
        assert!(ensure_private_inside(&link).is_err());
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_file_is_not_a_directory() {
        let base = scratch("file");
        let file = base.join("state");
        std::fs::write(&file, "").unwrap();
        let err = ensure_private(&file).unwrap_err();
        assert!(err.detail.contains("not a directory"), "{}", err.detail);
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn dot_dot_is_refused() {
        assert!(ensure_private(Path::new("/tmp/../tmp/x")).is_err());
    }
}

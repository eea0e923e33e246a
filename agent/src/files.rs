//! Files a tool returns, on this side: a chat-completions tool message carries text only, so
//! the model cannot see an image. Each image a tool returns is saved on this machine (in
//! `--files-dir`, by default `./sandboxrun-files/<thread or start time>/`), the user is told
//! where on stderr, and the model is told the path in the tool message so it can refer the user
//! to the file.
//!
//! A name comes from the server, which may not be trusted: only a plain file name (letters,
//! digits, '.', '_', '-', as the sandbox itself allows) is used, else a generic one; a file is
//! created new, never overwritten (a taken name gets `-2`, `-3`, ... before its extension) and
//! never through a symlink.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;

/// Names tried for one file before giving up (`chart.png`, `chart-2.png`, ...).
const MAX_NAME_ATTEMPTS: u32 = 1000;

/// An image a tool returned, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReturnedImage {
    /// Its file name as the server named it (possibly not a usable one; see [`FileSaver::save`]).
    pub name: String,
    /// Its MIME type.
    pub mime_type: String,
    /// Its bytes.
    pub data: Vec<u8>,
}

/// A file saved on this machine, for the transcript.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedFile {
    /// Its name as the tool returned it.
    pub name: String,
    /// Where it was saved.
    pub path: PathBuf,
    /// Its MIME type.
    pub mime_type: String,
    /// Its size in bytes.
    pub size: u64,
}

/// Where returned images go: one directory, created when the first image arrives.
#[derive(Clone, Debug)]
pub struct FileSaver {
    dir: PathBuf,
}

impl FileSaver {
    /// Saves into `dir`.
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// `./sandboxrun-files/<thread>` for a run that keeps a thread (its name made a plain
    /// directory name), else `./sandboxrun-files/<local start time>`.
    pub fn default_dir(thread: Option<&str>) -> PathBuf {
        let leaf = match thread {
            Some(thread) => plain_name(thread),
            None => jiff::Zoned::now().strftime("%Y%m%d-%H%M%S").to_string(),
        };
        PathBuf::from("sandboxrun-files").join(leaf)
    }

    /// Saves `image` under its name (a generic `image-N.EXT` when the name is not a plain file
    /// name, `N` being `index` + 1; the type's extension added when the name has another), a
    /// new file never overwriting another. Only a raster image whose bytes are the type it
    /// claims is saved, and always with that type's extension: a file opened from here must
    /// not be taken for HTML or SVG (a `report.html` holding a PNG would be opened as a page).
    pub fn save(&self, image: &ReturnedImage, index: usize) -> Result<SavedFile, String> {
        let Some(kind) = sandboxrun_core::files::raster_image_type(&image.data)
            .filter(|kind| *kind == image.mime_type)
        else {
            return Err(format!(
                "its bytes are not a {} image (only PNG, JPEG, GIF and WebP images are saved)",
                sandboxrun_core::files::printable_name(&image.mime_type)
            ));
        };
        let ext = extension(kind);
        let name = if sandboxrun_core::files::check_name(&image.name).is_err() {
            format!("image-{}.{ext}", index + 1)
        } else if has_extension(&image.name, kind) {
            image.name.clone()
        } else {
            format!("{}.{ext}", image.name)
        };
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let (stem, ext) = match name.rsplit_once('.') {
            Some((stem, ext)) if !stem.is_empty() => (stem.to_owned(), format!(".{ext}")),
            _ => (name.clone(), String::new()),
        };
        for n in 1..=MAX_NAME_ATTEMPTS {
            let candidate = if n == 1 {
                name.clone()
            } else {
                format!("{stem}-{n}{ext}")
            };
            let path = self.dir.join(&candidate);
            // create_new: an existing file (or a symlink planted there) is never written through.
            let mut file = match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
            };
            file.write_all(&image.data)
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            return Ok(SavedFile {
                name: image.name.clone(),
                path: std::path::absolute(&path).unwrap_or(path),
                mime_type: image.mime_type.clone(),
                size: image.data.len() as u64,
            });
        }
        Err(format!(
            "{} already holds {MAX_NAME_ATTEMPTS} files named like {name}",
            self.dir.display()
        ))
    }
}

/// What the model reads about an image once it was saved, or why it could not be.
pub fn saved_note(image: &ReturnedImage, saved: &Result<SavedFile, String>) -> String {
    match saved {
        Ok(file) => format!(
            "[the image {} ({}, {} bytes) was saved on the user's machine at {}; you cannot see \
             it: tell the user where it is, and describe it from the code and numbers that made \
             it]",
            file.name,
            file.mime_type,
            file.size,
            file.path.display()
        ),
        Err(e) => format!(
            "[the image {} ({}, {} bytes) could not be saved: {e}]",
            sandboxrun_core::files::printable_name(&image.name),
            image.mime_type,
            image.data.len()
        ),
    }
}

/// `name` as one plain directory name: characters other than letters, digits, '.', '_' and '-'
/// become '_', a leading '.' too (no hidden or `..` directory).
fn plain_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .take(100)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with('.') || out.is_empty() {
        out.insert(0, '_');
    }
    out
}

/// The file extension for a raster image type.
fn extension(mime_type: &str) -> &'static str {
    match mime_type {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        _ => "bin",
    }
}

/// Whether `name` ends with an extension of the raster image type `mime_type`.
fn has_extension(name: &str, mime_type: &str) -> bool {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match mime_type {
        "image/jpeg" => ext == "jpg" || ext == "jpeg",
        other => ext == extension(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sandboxrun-agent-files-{name}-{}-{}",
            std::process::id(),
            jiff::Timestamp::now().as_nanosecond()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn image(name: &str) -> ReturnedImage {
        ReturnedImage {
            name: name.to_owned(),
            mime_type: "image/png".to_owned(),
            data: b"\x89PNG\r\n\x1a\nrest".to_vec(),
        }
    }

    #[test]
    fn images_are_saved_under_their_name_never_overwriting() {
        let dir = temp_dir("save");
        let saver = FileSaver::new(dir.join("run"));
        let first = saver.save(&image("chart.png"), 0).unwrap();
        assert_eq!(first.path, dir.join("run").join("chart.png"));
        assert_eq!(std::fs::read(&first.path).unwrap(), image("x").data);
        assert_eq!(first.size, 12);
        let second = saver.save(&image("chart.png"), 0).unwrap();
        assert_eq!(second.path, dir.join("run").join("chart-2.png"));
        assert_eq!(second.name, "chart.png");
        let note = saved_note(&image("chart.png"), &Ok(second.clone()));
        assert!(note.contains(&second.path.display().to_string()), "{note}");
        assert!(note.contains("you cannot see it"), "{note}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn hostile_names_are_replaced_and_symlinks_not_followed() {
        let dir = temp_dir("hostile");
        let saver = FileSaver::new(dir.clone());
        for (i, bad) in ["../escape.png", "/etc/passwd", ".hidden", "a\nb.png", ""]
            .into_iter()
            .enumerate()
        {
            let saved = saver.save(&image(bad), i).unwrap();
            assert_eq!(
                saved.path,
                dir.join(format!("image-{}.png", i + 1)),
                "{bad:?}"
            );
        }
        assert!(!dir.parent().unwrap().join("escape.png").exists());
        // A symlink already in the directory is left alone: the image goes to a new name.
        let target = dir.join("target.txt");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.join("plot.png")).unwrap();
        let saved = saver.save(&image("plot.png"), 0).unwrap();
        assert_eq!(saved.path, dir.join("plot-2.png"));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn only_raster_images_are_saved_and_always_with_their_extension() {
        let dir = temp_dir("types");
        let saver = FileSaver::new(dir.clone());
        // Named for something a browser or viewer would run: the image's extension is added.
        for (name, saved_as) in [
            ("report.html", "report.html.png"),
            ("plot.svg", "plot.svg.png"),
            ("noext", "noext.png"),
            ("chart.PNG", "chart.PNG"),
        ] {
            let saved = saver.save(&image(name), 0).unwrap();
            assert_eq!(saved.path, dir.join(saved_as), "{name}");
        }
        let jpeg = ReturnedImage {
            name: "photo.jpeg".into(),
            mime_type: "image/jpeg".into(),
            data: b"\xff\xd8\xff\xe0rest".to_vec(),
        };
        assert_eq!(saver.save(&jpeg, 0).unwrap().path, dir.join("photo.jpeg"));
        // Bytes that are not the raster image they claim to be: not saved at all.
        for (mime, data) in [
            ("image/svg+xml", b"<svg onload='alert(1)'/>".to_vec()),
            ("image/png", b"<svg onload='alert(1)'/>".to_vec()),
            ("image/png", b"<!DOCTYPE html><script>".to_vec()),
            ("image/png", b"\xff\xd8\xff\xe0".to_vec()),
            ("text/html", b"\x89PNG\r\n\x1a\n".to_vec()),
        ] {
            let bad = ReturnedImage {
                name: "x.png".into(),
                mime_type: mime.into(),
                data,
            };
            let err = saver.save(&bad, 0).unwrap_err();
            assert!(
                err.contains("only PNG, JPEG, GIF and WebP"),
                "{mime}: {err}"
            );
        }
        assert!(!dir.join("x.png").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn default_directories_are_plain() {
        assert_eq!(
            FileSaver::default_dir(Some("q3 report/../x")),
            PathBuf::from("sandboxrun-files/q3_report_.._x")
        );
        assert_eq!(
            FileSaver::default_dir(Some("..")),
            PathBuf::from("sandboxrun-files/_..")
        );
        let stamped = FileSaver::default_dir(None);
        let leaf = stamped.file_name().unwrap().to_str().unwrap();
        assert_eq!(leaf.len(), "20260101-120000".len(), "{leaf}");
    }

    #[test]
    fn an_unsaved_image_is_explained() {
        let note = saved_note(&image("a\nb.png"), &Err("disk full".to_owned()));
        assert_eq!(
            note,
            "[the image a\\nb.png (image/png, 12 bytes) could not be saved: disk full]"
        );
    }
}

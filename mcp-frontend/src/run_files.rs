//! The files embedded runs returned, kept for their agent to read again as resources
//! (`sandboxrun://runs/{run}/files/{name}`, `resources.rs`) for as long as a cluster keeps a
//! finished run (`ttlSecondsAfterFinished`, default one hour), within a byte budget: the oldest
//! runs' files go first. In a cluster the run's status holds them and this store is not used.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandboxrun_core::tools::Attachment;

/// The most bytes of files kept, all runs together.
pub const MAX_KEPT_BYTES: usize = 64 * 1024 * 1024;

/// One run's files.
struct Kept {
    run: String,
    agent: String,
    until: Instant,
    files: Vec<Attachment>,
    bytes: usize,
}

/// The files of recent embedded runs.
pub struct RunFiles {
    runs: Mutex<VecDeque<Kept>>,
    keep_for: Duration,
    max_bytes: usize,
}

impl Default for RunFiles {
    fn default() -> Self {
        Self::new(
            Duration::from_secs(u64::from(
                sandboxrun_core::limits::DEFAULT_TTL_SECONDS_AFTER_FINISHED,
            )),
            MAX_KEPT_BYTES,
        )
    }
}

fn size(file: &Attachment) -> usize {
    match file {
        Attachment::Image { data, .. } | Attachment::Binary { data, .. } => data.len(),
        Attachment::Text { text, .. } => text.len(),
        Attachment::Note(_) => 0,
    }
}

fn name(file: &Attachment) -> Option<&str> {
    match file {
        Attachment::Image { name, .. }
        | Attachment::Binary { name, .. }
        | Attachment::Text { name, .. } => Some(name),
        Attachment::Note(_) => None,
    }
}

impl RunFiles {
    /// A store keeping files for `keep_for`, at most `max_bytes` of them.
    pub fn new(keep_for: Duration, max_bytes: usize) -> Self {
        Self {
            runs: Mutex::new(VecDeque::new()),
            keep_for,
            max_bytes,
        }
    }

    /// Keeps the files among `attachments` of `agent`'s run `run` (nothing when it has none).
    pub fn keep(&self, agent: &str, run: &str, attachments: &[Attachment]) {
        let files: Vec<Attachment> = attachments
            .iter()
            .filter(|a| name(a).is_some())
            .cloned()
            .collect();
        let bytes: usize = files.iter().map(size).sum();
        if files.is_empty() || bytes > self.max_bytes {
            return;
        }
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        runs.retain(|k| k.until > now);
        let mut total: usize = runs.iter().map(|k| k.bytes).sum::<usize>() + bytes;
        while total > self.max_bytes {
            let Some(oldest) = runs.pop_front() else {
                break;
            };
            total -= oldest.bytes;
        }
        runs.push_back(Kept {
            run: run.to_owned(),
            agent: agent.to_owned(),
            until: now + self.keep_for,
            files,
            bytes,
        });
    }

    /// The file `name` of run `run`, when `agent` made that run and it is still kept.
    pub fn get(&self, agent: &str, run: &str, name: &str) -> Option<Attachment> {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        runs.iter()
            .find(|k| k.run == run && k.agent == agent && k.until > now)?
            .files
            .iter()
            .find(|f| self::name(f) == Some(name))
            .cloned()
    }

    /// `(run, file name)` of every kept file of `agent`, oldest run first.
    pub fn list(&self, agent: &str) -> Vec<(String, String)> {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        runs.iter()
            .filter(|k| k.agent == agent && k.until > now)
            .flat_map(|k| {
                k.files
                    .iter()
                    .filter_map(|f| Some((k.run.clone(), name(f)?.to_owned())))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(name: &str, text: &str) -> Attachment {
        Attachment::Text {
            name: name.to_owned(),
            mime_type: "text/plain".to_owned(),
            text: text.to_owned(),
        }
    }

    #[test]
    fn only_the_runs_agent_reads_its_files() {
        let store = RunFiles::default();
        store.keep(
            "alice",
            "local-1",
            &[text("a.txt", "x"), Attachment::Note("left out".into())],
        );
        assert_eq!(
            store.get("alice", "local-1", "a.txt"),
            Some(text("a.txt", "x"))
        );
        assert_eq!(store.get("bob", "local-1", "a.txt"), None);
        assert_eq!(store.get("alice", "local-2", "a.txt"), None);
        assert_eq!(
            store.list("alice"),
            vec![("local-1".into(), "a.txt".into())]
        );
        assert!(store.list("bob").is_empty());
    }

    #[test]
    fn the_oldest_runs_go_first_past_the_budget_and_all_go_past_their_time() {
        let store = RunFiles::new(Duration::from_secs(3600), 10);
        store.keep("a", "r1", &[text("f", "123456")]);
        store.keep("a", "r2", &[text("f", "123456")]);
        assert_eq!(store.get("a", "r1", "f"), None);
        assert!(store.get("a", "r2", "f").is_some());
        let gone = RunFiles::new(Duration::ZERO, 10);
        gone.keep("a", "r1", &[text("f", "1")]);
        assert_eq!(gone.get("a", "r1", "f"), None);
    }
}

//! What the user sees while a run is under way: on a terminal, a status line on stderr saying
//! what the agent is waiting for (the model, or which tool, for how long), redrawn in place and
//! cleared before any answer text is printed. Off a terminal, nothing: stderr stays clean for
//! logs and the single-line errors.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
const TICK: Duration = Duration::from_millis(100);

#[derive(Default)]
struct State {
    /// What is being waited for, and since when; `None` when the line is clear.
    activity: Option<(String, Instant)>,
    /// Whether a status line is on screen.
    drawn: bool,
}

/// The status line. Cheap to call when disabled.
pub struct Progress {
    state: Option<Arc<Mutex<State>>>,
    ticker: Option<JoinHandle<()>>,
}

impl Progress {
    /// A status line on stderr when `enabled` and stderr is a terminal; otherwise inert.
    pub fn new(enabled: bool) -> Self {
        if !enabled || !std::io::stderr().is_terminal() {
            return Self {
                state: None,
                ticker: None,
            };
        }
        let state = Arc::new(Mutex::new(State::default()));
        let ticking = state.clone();
        let ticker = tokio::spawn(async move {
            let mut frame = 0usize;
            loop {
                tokio::time::sleep(TICK).await;
                frame = (frame + 1) % FRAMES.len();
                let mut s = ticking.lock().expect("progress lock");
                if let Some((what, since)) = &s.activity {
                    let line = format!(
                        "\r\x1b[2K{} {what} ({:.1}s)",
                        FRAMES[frame],
                        since.elapsed().as_secs_f64()
                    );
                    let _ = std::io::stderr().write_all(line.as_bytes());
                    s.drawn = true;
                }
            }
        });
        Self {
            state: Some(state),
            ticker: Some(ticker),
        }
    }

    /// Starts waiting for something (`asking the model`, `run_python`).
    pub fn start(&self, what: impl Into<String>) {
        if let Some(state) = &self.state {
            state.lock().expect("progress lock").activity = Some((what.into(), Instant::now()));
        }
    }

    /// Clears the line; call before writing anything else to the terminal.
    pub fn clear(&self) {
        if let Some(state) = &self.state {
            let mut s = state.lock().expect("progress lock");
            s.activity = None;
            if s.drawn {
                let _ = std::io::stderr().write_all(b"\r\x1b[2K");
                s.drawn = false;
            }
        }
    }

    /// Ends a tool's line with a permanent one: `✓ run_python 1.2s` or `✗ run_python 0.3s
    /// (error)`.
    pub fn finish_tool(&self, name: &str, elapsed: Duration, is_error: bool) {
        if self.state.is_some() {
            self.clear();
            let mark = if is_error { "✗" } else { "✓" };
            let note = if is_error {
                " (error, sent back to the model)"
            } else {
                ""
            };
            let _ = writeln!(
                std::io::stderr(),
                "{mark} {name} {:.1}s{note}",
                elapsed.as_secs_f64()
            );
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
        if let Some(ticker) = self.ticker.take() {
            ticker.abort();
        }
    }
}

//! PromQL work runs on a thread whose stack size is chosen here, never on the caller's.
//!
//! Parsing, the scope rewrite, evaluation and dropping a tree all recurse once per level of the
//! expression. The depth bound (`depth.rs`) bounds the levels before anything is parsed; this module makes
//! the stack those levels run on a known quantity rather than whatever the caller had (a tokio
//! worker has 2 MiB, a blocking-pool thread whatever the runtime was built with, a test thread
//! 2 MiB). [`run`] is for synchronous callers (argument parsing, the scope rewrite), and
//! [`run_async`] for evaluation, which may take up to its time budget and must not hold an async
//! worker. Work already on a PromQL thread runs in place, so nesting them costs nothing.
//!
//! A panic in the parser or the evaluator becomes an error of this one call, never of the
//! process or of the async task that asked.

use std::any::Any;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::MetricsError;

/// Stack of every PromQL thread. The depth bound keeps the need far below it (`depth.rs`: 64
/// levels at most, and the deepest accepted query of every shape runs its whole life on half
/// a MiB in a debug build, which a test checks; the evaluator, the hungriest, takes about 5 KiB
/// a level there). The rest is margin, 16 times over, and costs address space only (pages are
/// touched as the stack grows).
pub const QUERY_STACK_BYTES: usize = 8 * 1024 * 1024;

thread_local! {
    /// Whether this thread is a PromQL thread (its stack is [`QUERY_STACK_BYTES`]).
    static ON_QUERY_STACK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `work` on a PromQL thread and waits for it; in place when already on one.
pub fn run<R: Send>(work: impl FnOnce() -> R + Send) -> Result<R, MetricsError> {
    if ON_QUERY_STACK.get() {
        return catch_unwind(AssertUnwindSafe(work)).map_err(failed);
    }
    std::thread::scope(|scope| {
        let thread = builder()
            .spawn_scoped(scope, || {
                ON_QUERY_STACK.set(true);
                work()
            })
            .map_err(no_thread)?;
        thread.join().map_err(failed)
    })
}

/// Runs `work` on a PromQL thread without holding the async worker that awaits it. When the
/// caller stops waiting, the work still runs to its end (evaluation stops at its own budget).
pub async fn run_async<R: Send + 'static>(
    work: impl FnOnce() -> R + Send + 'static,
) -> Result<R, MetricsError> {
    let (answer, answered) = tokio::sync::oneshot::channel();
    builder()
        .spawn(move || {
            ON_QUERY_STACK.set(true);
            let _ = answer.send(catch_unwind(AssertUnwindSafe(work)));
        })
        .map_err(no_thread)?;
    match answered.await {
        Ok(result) => result.map_err(failed),
        Err(_) => Err(MetricsError::Unavailable(
            "the PromQL thread ended without an answer; retry the query".to_owned(),
        )),
    }
}

/// Makes the current thread count as a PromQL thread, so that a test can run the work in place
/// on a stack it chose.
#[cfg(test)]
pub(crate) fn pretend_query_thread() {
    ON_QUERY_STACK.set(true);
}

fn builder() -> std::thread::Builder {
    std::thread::Builder::new()
        .name("promql".to_owned())
        .stack_size(QUERY_STACK_BYTES)
}

fn no_thread(e: std::io::Error) -> MetricsError {
    MetricsError::Unavailable(format!(
        "no thread could be started for the query ({e}); retry later"
    ))
}

fn failed(panic: Box<dyn Any + Send>) -> MetricsError {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    MetricsError::Unavailable(format!(
        "processing the query failed inside the server ({what}); a simpler query may avoid it"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_on_a_query_thread_and_nests_in_place() {
        let outer = std::thread::current().id();
        let (first, second) = run(|| {
            let here = std::thread::current().id();
            let nested = run(|| std::thread::current().id()).expect("runs");
            (here, nested)
        })
        .expect("runs");
        assert_ne!(first, outer);
        assert_eq!(first, second, "a nested call runs in place");
    }

    #[test]
    fn a_panic_is_an_error_of_the_call() {
        let err = run(|| -> usize { panic!("boom") }).unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
        let err = run(|| run(|| -> usize { panic!("inner") }).unwrap_err()).expect("runs");
        assert!(err.to_string().contains("inner"), "{err}");
    }

    #[tokio::test]
    async fn async_work_answers_and_panics_become_errors() {
        assert_eq!(run_async(|| 6 * 7).await.expect("runs"), 42);
        let err = run_async(|| -> usize { panic!("late") }).await.unwrap_err();
        assert!(err.to_string().contains("late"), "{err}");
    }
}

//! `sandboxrun-agent`: ask a question in plain language; a model answers it by calling
//! sandboxrun's MCP tools through any OpenAI-compatible chat-completions endpoint.

mod agent;
mod cli;
mod error;
mod files;
mod mcp;
mod model;
mod progress;
mod store;
mod tools;
mod transcript;

use std::process::ExitCode;
use std::time::Duration;

use crate::agent::{Conversation, RunOptions, StopReason};
use crate::cli::{API_KEY_ENV, Cli};
use crate::error::AgentError;
use crate::mcp::{Endpoint, Session};
use crate::model::Model;
use crate::progress::Progress;
use crate::store::ThreadStore;
use crate::tools::Toolbox;

/// Exit status when the step limit ended the run before an answer.
const EXIT_MAX_STEPS: u8 = 3;
/// Exit status after Ctrl-C (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: u8 = 130;

fn main() -> ExitCode {
    // One rustls crypto provider for the whole tree (ring); reqwest is built without one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse_settled();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandboxrun-agent: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async {
        tokio::select! {
            result = run(cli) => match result {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("sandboxrun-agent: {e}");
                    ExitCode::FAILURE
                }
            },
            _ = tokio::signal::ctrl_c() => {
                // Every message is stored as it is made: nothing already answered is lost.
                eprintln!("\nsandboxrun-agent: interrupted");
                ExitCode::from(EXIT_INTERRUPTED)
            }
        }
    });
    // Do not wait for blocked reads (the embedded server's pipes) on the way out.
    runtime.shutdown_timeout(Duration::from_secs(2));
    code
}

async fn run(cli: Cli) -> Result<ExitCode, AgentError> {
    let question = cli.question();
    if question.trim().is_empty() {
        return Err(AgentError::Config("the question is empty".to_owned()));
    }
    // The model's settings first: a missing key fails before anything starts.
    let model = Model::from_env(&cli.model, Duration::from_secs(cli.connect_timeout_seconds))?;
    let endpoint = match &cli.url {
        Some(url) => Endpoint::Http {
            url: url.clone(),
            api_key: std::env::var(API_KEY_ENV)
                .ok()
                .map(|k| k.trim().to_owned())
                .filter(|k| !k.is_empty()),
        },
        None => Endpoint::Stdio {
            program: cli.server.clone().unwrap_or_else(Endpoint::default_server),
            args: cli.server_args.clone(),
        },
    };
    let (store, history) = match &cli.thread {
        Some(thread) => {
            let (store, history) = ThreadStore::open(cli.state_url.as_deref(), thread).await?;
            (Some(store), history)
        }
        None => (None, Vec::new()),
    };
    let progress = Progress::new(!cli.json);
    progress.start(format!("connecting to {}", endpoint.describe()));
    let session = Session::connect(endpoint).await;
    progress.clear();
    let session = session?;
    let toolbox = Toolbox::from_mcp(&session.tools().await?);
    let mut conversation = Conversation::new(history, store);
    let options = RunOptions {
        max_steps: cli.max_steps,
        stream_to_stdout: !cli.json,
        files: files::FileSaver::new(
            cli.files_dir
                .clone()
                .unwrap_or_else(|| files::FileSaver::default_dir(cli.thread.as_deref())),
        ),
    };
    let report = agent::run(
        &model,
        &session,
        &toolbox,
        &mut conversation,
        &question,
        &options,
        &progress,
    )
    .await;
    drop(progress);
    session.close().await;
    let report = report?;
    if cli.json {
        let transcript = transcript::Transcript::new(&cli, &question, &report, &conversation);
        println!(
            "{}",
            serde_json::to_string_pretty(&transcript).expect("transcripts serialize")
        );
    }
    Ok(match report.stop {
        StopReason::Answered => ExitCode::SUCCESS,
        StopReason::MaxSteps => {
            eprintln!(
                "sandboxrun-agent: the model had not answered after {} steps (--max-steps); it \
                 was still calling tools{}",
                report.steps,
                cli.thread
                    .as_deref()
                    .map(|t| format!(
                        ". The thread `{t}` keeps everything so far: ask again with --thread {t}"
                    ))
                    .unwrap_or_default()
            );
            ExitCode::from(EXIT_MAX_STEPS)
        }
    })
}

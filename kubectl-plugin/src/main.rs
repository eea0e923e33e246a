//! `kubectl sandboxrun`: a kubectl plugin for SandboxRuns. With `kubectl-sandboxrun` on PATH,
//! kubectl runs it for `kubectl sandboxrun ...`:
//!
//! - `approve RUN` and `deny RUN --reason TEXT`: decide a run that policy escalated, as yourself
//!   (`spec.approval.by` is your user name, from the SelfSubjectReview API);
//! - `logs RUN [-f]`: a run's stdout and stderr, and its exit code as the plugin's;
//! - `run FILE.py`: the file as a run of your own, followed to its end (Ctrl-C cancels it);
//! - `sessions [-A]` and `sessions close NAME`: the SandboxSessions (an agent's state kept between
//!   python calls), and closing one;
//! - `top agents`: each agent's runs by phase and their execution time.
//!
//! Whatever came from a run or an agent is printed with its control characters escaped
//! ([`term`]); `logs --raw` and `run --raw` write a run's output as it is.

mod cli;
mod cluster;
mod decide;
mod follow;
mod run;
mod sessions;
mod term;
mod top;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command, SessionAction, Sessions, Top};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            term::note!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(cli)) {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            // Errors quote names, reasons and API server messages: escaped as the rest.
            term::note!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command; the exit status it asks for.
async fn execute(cli: Cli) -> anyhow::Result<u8> {
    let client = cluster::connect(&cli).await?;
    let ns = cli.namespace.as_str();
    match &cli.command {
        Command::Approve(args) => {
            decide::decide(&client, ns, &args.run, true, args.reason.as_deref()).await?;
            Ok(0)
        }
        Command::Deny(args) => {
            decide::decide(&client, ns, &args.run, false, Some(&args.reason)).await?;
            Ok(0)
        }
        Command::Logs(args) => follow::logs(&client, ns, &args.run, args.follow, args.raw).await,
        Command::Run(args) => run::run(&client, ns, args).await,
        Command::Sessions(Sessions {
            all_namespaces,
            action: None,
        }) => {
            sessions::show(&client, (!all_namespaces).then_some(ns)).await?;
            Ok(0)
        }
        Command::Sessions(Sessions {
            action: Some(SessionAction::Close { session }),
            ..
        }) => {
            sessions::close(&client, ns, session).await?;
            Ok(0)
        }
        Command::Top {
            what: Top::Agents { all_namespaces },
        } => {
            top::agents(&client, (!all_namespaces).then_some(ns)).await?;
            Ok(0)
        }
    }
}

//! The command line: `kubectl sandboxrun <command>`. kubectl hands a plugin every argument after
//! its name and keeps none of its own flags, so the ones that matter here (`-n`, `--context`,
//! `--kubeconfig`) are the plugin's, with kubectl's meaning.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use sandboxrun_core::Environment;
use sandboxrun_core::limits as lim;

/// The namespace the chart runs sandboxes in (`sandboxNamespace.name`).
pub const DEFAULT_NAMESPACE: &str = "sandboxrun-runs";

/// Most characters a reason may have (the CRD's `spec.approval.reason` maxLength).
pub const MAX_REASON_CHARS: usize = 1024;

/// Approve, deny, run and follow SandboxRuns, see which agents run what, and list or close
/// SandboxSessions.
#[derive(Parser, Debug, PartialEq)]
#[command(
    name = "kubectl-sandboxrun",
    bin_name = "kubectl sandboxrun",
    version,
    about,
    after_help = "Exit status: approve, deny, sessions and top agents 0 when done; logs and run the exit code \
                  of the run's code (1 when it has none: rejected, cancelled, timed out before a \
                  result; 130 after Ctrl-C cancelled it); 1 on an error, 2 on a usage error."
)]
pub struct Cli {
    /// Namespace of the SandboxRuns.
    #[arg(
        short = 'n',
        long,
        global = true,
        env = "SANDBOXRUN_NAMESPACE",
        default_value = DEFAULT_NAMESPACE
    )]
    pub namespace: String,

    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    pub context: Option<String>,

    /// Path of the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand, Debug, PartialEq)]
pub enum Command {
    /// Approve a run that policy escalated (it must be AwaitingApproval): it proceeds.
    Approve(Decide),
    /// Deny a run that policy escalated (it must be AwaitingApproval): it ends Rejected.
    Deny(Deny),
    /// Print a run's stdout and stderr and exit with its exit code.
    Logs(Logs),
    /// Run a Python file as a SandboxRun of your own, print its output, exit with its exit code.
    Run(Run),
    /// List the SandboxSessions (an agent's state kept between python calls), or close one.
    #[command(args_conflicts_with_subcommands = true)]
    Sessions(Sessions),
    /// Summaries of the stored SandboxRuns.
    Top {
        /// What to summarize.
        #[command(subcommand)]
        what: Top,
    },
}

/// `approve RUN [--reason TEXT]`.
#[derive(Args, Debug, PartialEq)]
pub struct Decide {
    /// Name of the SandboxRun.
    pub run: String,
    /// Why (optional; recorded in spec.approval.reason, the Approved condition, Event and audit line).
    #[arg(long, value_parser = parse_reason)]
    pub reason: Option<String>,
}

/// `deny RUN --reason TEXT`.
#[derive(Args, Debug, PartialEq)]
pub struct Deny {
    /// Name of the SandboxRun.
    pub run: String,
    /// Why it is denied (at most 1024 characters): the run's status, its Event and the audit
    /// line carry it.
    #[arg(long, value_parser = parse_reason)]
    pub reason: String,
}

/// `logs RUN [-f]`.
#[derive(Args, Debug, PartialEq)]
pub struct Logs {
    /// Name of the SandboxRun.
    pub run: String,
    /// Wait for the run to finish, printing its phase changes on stderr.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Write the run's stdout and stderr exactly as it printed them. By default control
    /// characters (escape sequences, carriage returns, bidirectional controls) are shown escaped
    /// (`\x1b`, `\r`, `\u{202e}`), so that a run cannot retitle the terminal, write the
    /// clipboard, move the cursor or overwrite lines; use --raw only for output you trust, or to
    /// pipe it into a file.
    #[arg(long)]
    pub raw: bool,
}

/// `run FILE [--timeout S] [--environment E]`.
#[derive(Args, Debug, PartialEq)]
pub struct Run {
    /// The Python file to run (`-`: standard input).
    pub file: PathBuf,
    /// Wall-clock limit of the code in seconds (1 to 600; default 30).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(i64::from(lim::MIN_TIMEOUT_SECONDS)..=i64::from(lim::MAX_TIMEOUT_SECONDS)))]
    pub timeout: Option<u32>,
    /// Environment the run targets: sandbox, staging or production (policy decides what runs
    /// where; runs created directly may target only the chart's identity.directEnvironments).
    #[arg(long, value_parser = parse_environment, default_value = "sandbox")]
    pub environment: Environment,
    /// Write the run's stdout and stderr exactly as it printed them (see `logs --raw`); by
    /// default control characters are shown escaped.
    #[arg(long)]
    pub raw: bool,
}

/// `sessions [-A]` and `sessions close NAME`.
#[derive(Args, Debug, PartialEq)]
pub struct Sessions {
    /// Every namespace, not only -n.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// What to do instead of listing them.
    #[command(subcommand)]
    pub action: Option<SessionAction>,
}

/// `sessions close NAME`.
#[derive(Subcommand, Debug, PartialEq)]
pub enum SessionAction {
    /// Close a session: delete its SandboxSession, and with it its sandbox and the state kept
    /// there.
    Close {
        /// Name of the SandboxSession.
        session: String,
    },
}

/// `top ...`.
#[derive(Subcommand, Debug, PartialEq)]
pub enum Top {
    /// Agents by number of runs: runs by phase, total and average execution time.
    Agents {
        /// Every namespace, not only -n.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
}

fn parse_environment(s: &str) -> Result<Environment, String> {
    Environment::ALL
        .into_iter()
        .find(|e| e.as_str() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = Environment::ALL.iter().map(|e| e.as_str()).collect();
            format!("one of {} expected", names.join(", "))
        })
}

fn parse_reason(s: &str) -> Result<String, String> {
    let reason = s.trim();
    if reason.is_empty() {
        return Err("a reason must say something".to_owned());
    }
    let chars = reason.chars().count();
    if chars > MAX_REASON_CHARS {
        return Err(format!(
            "{chars} characters; at most {MAX_REASON_CHARS} fit in spec.approval.reason"
        ));
    }
    Ok(reason.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kubectl-sandboxrun").chain(args.iter().copied()))
    }

    #[test]
    fn the_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn approve_takes_a_run_and_the_namespace_anywhere() {
        let cli = parse(&["approve", "run-1", "-n", "team-a"]).unwrap();
        assert_eq!(cli.namespace, "team-a");
        assert_eq!(
            cli.command,
            Command::Approve(Decide {
                run: "run-1".into(),
                reason: None
            })
        );
        let cli = parse(&["-n", "team-b", "approve", "run-1"]).unwrap();
        assert_eq!(cli.namespace, "team-b");
    }

    #[test]
    fn the_namespace_defaults_to_the_charts() {
        // Only where the environment does not choose one itself.
        if std::env::var_os("SANDBOXRUN_NAMESPACE").is_none() {
            let cli = parse(&["logs", "r"]).unwrap();
            assert_eq!(cli.namespace, DEFAULT_NAMESPACE);
        }
    }

    #[test]
    fn deny_needs_a_reason_of_at_most_1024_characters() {
        let err = parse(&["deny", "run-1"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        let cli = parse(&["deny", "run-1", "--reason", "  not on a Friday "]).unwrap();
        assert_eq!(
            cli.command,
            Command::Deny(Deny {
                run: "run-1".into(),
                reason: "not on a Friday".into()
            })
        );
        assert!(parse(&["deny", "run-1", "--reason", "   "]).is_err());
        let long = "é".repeat(MAX_REASON_CHARS);
        assert!(parse(&["deny", "run-1", "--reason", &long]).is_ok());
        let longer = "x".repeat(MAX_REASON_CHARS + 1);
        let err = parse(&["deny", "run-1", "--reason", &longer]).unwrap_err();
        assert!(err.to_string().contains("at most 1024"), "{err}");
    }

    #[test]
    fn logs_follow() {
        let cli = parse(&["logs", "r", "-f"]).unwrap();
        assert_eq!(
            cli.command,
            Command::Logs(Logs {
                run: "r".into(),
                follow: true,
                raw: false
            })
        );
        let cli = parse(&["logs", "r"]).unwrap();
        assert_eq!(
            cli.command,
            Command::Logs(Logs {
                run: "r".into(),
                follow: false,
                raw: false
            })
        );
        let cli = parse(&["logs", "r", "--raw"]).unwrap();
        assert_eq!(
            cli.command,
            Command::Logs(Logs {
                run: "r".into(),
                follow: false,
                raw: true
            })
        );
        // The help says what --raw gives up.
        use clap::CommandFactory;
        let help = Cli::command()
            .find_subcommand_mut("logs")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(
            help.contains("--raw") && help.contains("escape sequences"),
            "{help}"
        );
    }

    #[test]
    fn run_checks_timeout_and_environment() {
        let cli = parse(&[
            "run",
            "job.py",
            "--timeout",
            "600",
            "--environment",
            "staging",
        ])
        .unwrap();
        assert_eq!(
            cli.command,
            Command::Run(Run {
                file: "job.py".into(),
                timeout: Some(600),
                environment: Environment::Staging,
                raw: false
            })
        );
        let cli = parse(&["run", "job.py"]).unwrap();
        assert_eq!(
            cli.command,
            Command::Run(Run {
                file: "job.py".into(),
                timeout: None,
                environment: Environment::Sandbox,
                raw: false
            })
        );
        for bad in ["0", "601", "-1", "ten"] {
            assert!(
                parse(&["run", "job.py", "--timeout", bad]).is_err(),
                "--timeout {bad}"
            );
        }
        let err = parse(&["run", "job.py", "--environment", "prod"]).unwrap_err();
        assert!(
            err.to_string()
                .contains("one of sandbox, staging, production"),
            "{err}"
        );
        assert!(parse(&["run"]).is_err(), "a file is required");
    }

    #[test]
    fn top_agents() {
        let cli = parse(&["top", "agents", "-A"]).unwrap();
        assert_eq!(
            cli.command,
            Command::Top {
                what: Top::Agents {
                    all_namespaces: true
                }
            }
        );
        assert!(parse(&["top"]).is_err(), "top needs what to show");
        assert!(parse(&["top", "pods"]).is_err());
    }

    #[test]
    fn sessions_list_or_close_one() {
        let cli = parse(&["sessions"]).unwrap();
        assert_eq!(
            cli.command,
            Command::Sessions(Sessions {
                all_namespaces: false,
                action: None
            })
        );
        let cli = parse(&["sessions", "-A"]).unwrap();
        assert_eq!(
            cli.command,
            Command::Sessions(Sessions {
                all_namespaces: true,
                action: None
            })
        );
        let cli = parse(&["sessions", "close", "s-1", "-n", "team-a"]).unwrap();
        assert_eq!(cli.namespace, "team-a");
        assert_eq!(
            cli.command,
            Command::Sessions(Sessions {
                all_namespaces: false,
                action: Some(SessionAction::Close {
                    session: "s-1".into()
                })
            })
        );
        assert!(parse(&["sessions", "close"]).is_err(), "close needs a name");
        assert!(
            parse(&["sessions", "-A", "close", "s-1"]).is_err(),
            "one namespace only"
        );
        assert!(parse(&["sessions", "open"]).is_err());
    }

    #[test]
    fn kubeconfig_and_context() {
        let cli = parse(&["logs", "r", "--context", "prod", "--kubeconfig", "/tmp/k"]).unwrap();
        assert_eq!(cli.context.as_deref(), Some("prod"));
        assert_eq!(cli.kubeconfig, Some(PathBuf::from("/tmp/k")));
    }
}

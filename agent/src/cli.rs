//! Command line of `sandboxrun-agent`.

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};

/// Environment variable holding the API key sent to a remote MCP server (`--url`).
pub const API_KEY_ENV: &str = "SANDBOXRUN_API_KEY";

/// Ask a question in plain language; a model answers it by calling sandboxrun's MCP tools
/// (run_python, execute_sql, ...) through an OpenAI-compatible chat-completions endpoint.
///
/// By default the agent starts `sandboxrun-mcp stdio` itself (embedded mode: code runs in a
/// local gVisor or bubblewrap sandbox); with `--url` it talks to a running server over
/// Streamable HTTP, sending the key in $SANDBOXRUN_API_KEY.
///
/// Exit status: 0 answered, 1 error, 2 usage error, 3 the step limit was reached first.
#[derive(Debug, Parser)]
#[command(name = "sandboxrun-agent", version, about, long_about)]
pub struct Cli {
    /// The question (several words are joined with spaces).
    #[arg(required = true, value_name = "QUESTION")]
    pub question: Vec<String>,

    /// Streamable HTTP endpoint of a remote MCP server, e.g. http://127.0.0.1:8000/mcp. The key
    /// in $SANDBOXRUN_API_KEY is sent as `Authorization: Bearer KEY`.
    #[arg(long, env = "SANDBOXRUN_MCP_URL", value_name = "URL")]
    pub url: Option<String>,

    /// The MCP server to start for embedded mode (run as `SERVER stdio [SERVER_ARG...]`).
    /// Default: `sandboxrun-mcp` next to this binary, else on PATH.
    #[arg(long, env = "SANDBOXRUN_MCP_BIN", value_name = "PATH")]
    pub server: Option<PathBuf>,

    /// An extra argument for the embedded server, after `stdio` (repeatable), e.g.
    /// `--server-arg=--enable-sql`.
    #[arg(long = "server-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub server_args: Vec<String>,

    /// Chat model to use.
    #[arg(long, env = "OPENAI_MODEL", default_value = "gpt-4.1-mini")]
    pub model: String,

    /// Most model calls in one run; the run stops with exit status 3 when the model has not
    /// answered by then.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_steps: u32,

    /// Keep the conversation under this name: an existing thread is resumed, and every message
    /// is stored as soon as it exists.
    #[arg(long, value_name = "NAME")]
    pub thread: Option<String>,

    /// Where threads are stored: `postgres://...` or `sqlite://PATH`. Default: a SQLite file in
    /// the user's data directory ($XDG_DATA_HOME/sandboxrun/agent-threads.sqlite).
    #[arg(long, env = "SANDBOXRUN_AGENT_STATE_URL", value_name = "URL")]
    pub state_url: Option<String>,

    /// Print a machine-readable JSON transcript of the run on stdout instead of streaming the
    /// answer.
    #[arg(long)]
    pub json: bool,

    /// Where images that tools return (charts, plots) are saved: the model cannot see them, so
    /// it is told their path. Default: ./sandboxrun-files/THREAD with --thread, else
    /// ./sandboxrun-files/YYYYMMDD-HHMMSS (created when the first image arrives).
    #[arg(long, env = "SANDBOXRUN_AGENT_FILES_DIR", value_name = "DIR")]
    pub files_dir: Option<PathBuf>,

    /// Seconds to wait for a connection to the model endpoint.
    #[arg(long, default_value_t = 15)]
    pub connect_timeout_seconds: u64,
}

impl Cli {
    /// Parses the command line and settles remote against embedded mode. Clap's own
    /// `conflicts_with` would also count values from the environment, so a
    /// `SANDBOXRUN_MCP_BIN` in a profile would forbid `--url`: here the command line wins over
    /// the environment, and only flags given together on the command line conflict.
    pub fn parse_settled() -> Self {
        Self::try_parse_settled(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// [`Cli::parse_settled`] on the given arguments.
    pub fn try_parse_settled<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut command = Self::command();
        let matches = command.try_get_matches_from_mut(args)?;
        let mut cli = Self::from_arg_matches(&matches)?;
        let on_command_line = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
        let url_given = on_command_line("url");
        let embedded_given = on_command_line("server") || !cli.server_args.is_empty();
        if url_given && embedded_given {
            return Err(command.error(
                clap::error::ErrorKind::ArgumentConflict,
                "--url connects to a running server; --server and --server-arg are for the \
                 embedded one: use one or the other",
            ));
        }
        if url_given {
            cli.server = None;
        } else if embedded_given {
            // $SANDBOXRUN_MCP_URL gives way to an embedded server asked for explicitly.
            cli.url = None;
        }
        Ok(cli)
    }

    /// The question as one string.
    pub fn question(&self) -> String {
        self.question.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn question_words_are_joined_and_server_args_keep_hyphens() {
        // clap's own consistency checks of the definition first.
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "sandboxrun-agent",
            "--server-arg",
            "--enable-sql",
            "--max-steps",
            "4",
            "how",
            "many?",
        ])
        .unwrap();
        assert_eq!(cli.question(), "how many?");
        assert_eq!(cli.server_args, ["--enable-sql"]);
        assert_eq!(cli.max_steps, 4);
        assert!(!cli.json);
        assert_eq!(cli.files_dir, None);
        let cli = Cli::try_parse_from(["sandboxrun-agent", "--files-dir", "out", "q"]).unwrap();
        assert_eq!(cli.files_dir, Some(PathBuf::from("out")));
    }

    #[test]
    fn url_excludes_the_embedded_server() {
        assert!(
            Cli::try_parse_settled([
                "sandboxrun-agent",
                "--url",
                "http://x/mcp",
                "--server",
                "y",
                "q"
            ])
            .is_err()
        );
        assert!(
            Cli::try_parse_settled([
                "sandboxrun-agent",
                "--url",
                "http://x/mcp",
                "--server-arg=--enable-sql",
                "q"
            ])
            .is_err()
        );
        let cli = Cli::try_parse_settled(["sandboxrun-agent", "--url", "http://x/mcp", "q"]);
        assert_eq!(cli.unwrap().url.as_deref(), Some("http://x/mcp"));
        assert!(Cli::try_parse_from(["sandboxrun-agent", "--max-steps", "0", "q"]).is_err());
    }
}

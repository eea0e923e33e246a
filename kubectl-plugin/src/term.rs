//! Terminal-safe text. What this plugin prints mostly comes from a run or an agent: the code's
//! stdout and stderr, a query's result, status messages and reasons, decision reasons, agent
//! names, user names, API server messages that quote them. Written raw, such text drives the
//! operator's terminal: escape sequences retitle it, write the clipboard (OSC 52), move the
//! cursor or clear the screen; a carriage return or backspaces overwrite a failure with a
//! success; bidirectional controls reorder what is shown. So every line goes out through
//! [`say!`] and [`note!`] (no other printing in this crate: see the test at the end), and a
//! run's output through [`write_output`], all of which escape:
//!
//! - C0 controls (but newline and tab in multi-line bodies), DEL and C1 controls, as `\x1b`,
//!   `\r`, `\u{9b}`: ESC starts every escape sequence, and in a terminal that reads 8-bit
//!   controls so does CSI (U+009B) and OSC (U+009D);
//! - Unicode bidirectional controls and invisible format characters (U+061C, U+200B-U+200F,
//!   U+202A-U+202E, U+2060-U+2069, U+FEFF) and line/paragraph separators, as `\u{202e}`.
//!
//! A backslash is written as it is: the escapes are for a person to read, not to decode.
//! `logs --raw` and `run --raw` write a run's output byte for byte, for piping it elsewhere.

use std::io::Write;

/// Whether `c` could act on a terminal or hide or reorder what is shown. Newline and tab are
/// the caller's choice (see [`escape`]).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{061C}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}'
            | '\u{FEFF}'
        )
}

/// `text` with every unsafe character escaped; with `multiline`, newlines and tabs are kept
/// (a body of output), else escaped too (one line: a message, a name, a table cell).
pub fn escape(text: &str, multiline: bool) -> String {
    if !text
        .chars()
        .any(|c| is_unsafe(c) && !(multiline && matches!(c, '\n' | '\t')))
    {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' | '\t' if multiline => out.push(c),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_ascii_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c if is_unsafe(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// Prints one line on stdout, escaped as one line ([`escape`]). Takes `format!` arguments.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::term::line(&mut std::io::stdout().lock(), &format!($($arg)*))
    };
}

/// Prints one line on stderr, escaped as one line ([`escape`]). Takes `format!` arguments.
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::term::line(&mut std::io::stderr().lock(), &format!($($arg)*))
    };
}

pub(crate) use {note, say};

/// Writes `text` and a newline, escaped as one line; a write error (a closed pipe) is ignored,
/// as `println!` would not be.
pub fn line(out: &mut impl Write, text: &str) {
    let _ = writeln!(out, "{}", escape(text, false));
}

/// Writes a body of output (several lines): escaped, newlines and tabs kept, unless `raw`.
pub fn write_output(out: &mut impl Write, text: &str, raw: bool) -> std::io::Result<()> {
    if raw {
        out.write_all(text.as_bytes())
    } else {
        out.write_all(escape(text, true).as_bytes())
    }
}

/// Writes a body of output on stdout ([`write_output`]).
pub fn stdout_body(text: &str, raw: bool) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    write_output(&mut out, text, raw)?;
    out.flush()
}

/// Writes a body of output on stderr ([`write_output`]).
pub fn stderr_body(text: &str, raw: bool) -> std::io::Result<()> {
    let mut err = std::io::stderr().lock();
    write_output(&mut err, text, raw)?;
    err.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What runs could print to take over an operator's terminal.
    const ATTACKS: [&str; 14] = [
        "\u{1b}]0;owned\u{7}",
        "\u{1b}]52;c;ZWNobyBoaQ==\u{7}",
        "\u{1b}]52;c;ZWNobyBoaQ==\u{1b}\\",
        "\u{1b}[2J\u{1b}[H",
        "\u{1b}[1A\u{1b}[2K",
        "FAILED\rOK    ",
        "FAILED\u{8}\u{8}\u{8}\u{8}\u{8}\u{8}OK",
        "\u{9b}2J",
        "\u{9d}52;c;eA==\u{9c}",
        "\u{1b}P+q\u{1b}\\",
        "user\u{202e}gnp.exe",
        "a\u{2066}b\u{2069}c\u{200e}d\u{200f}e\u{61c}",
        "zero\u{200b}width\u{feff}",
        "line\u{2028}separator\u{0}nul\u{7f}",
    ];

    #[test]
    fn nothing_that_acts_on_a_terminal_gets_through() {
        for attack in ATTACKS {
            for multiline in [false, true] {
                let shown = escape(attack, multiline);
                assert!(
                    shown
                        .chars()
                        .all(|c| !is_unsafe(c) || (multiline && c == '\n')),
                    "{attack:?} -> {shown:?}"
                );
                assert!(
                    !shown.contains('\u{1b}') && !shown.contains('\r'),
                    "{shown:?}"
                );
            }
        }
        assert_eq!(escape("FAILED\rOK", true), "FAILED\\rOK");
        assert_eq!(escape("\u{1b}]0;x\u{7}", false), "\\x1b]0;x\\x07");
        assert_eq!(escape("a\u{202e}b", false), "a\\u{202e}b");
        assert_eq!(escape("a\u{9b}b", false), "a\\u{9b}b");
    }

    #[test]
    fn bodies_keep_their_lines_and_tabs_single_lines_do_not() {
        let body = "col1\tcol2\nline 2\n";
        assert_eq!(escape(body, true), body);
        assert_eq!(escape(body, false), "col1\\tcol2\\nline 2\\n");
        // Ordinary text, accents and emoji are untouched.
        for plain in ["héllo wörld", "日本語", "naïve 🎉", "C:\\path", ""] {
            assert_eq!(escape(plain, false), plain);
        }
    }

    #[test]
    fn raw_output_is_byte_for_byte_and_escaped_output_is_not() {
        let text = "ok\n\u{1b}]52;c;eA==\u{7}\rdone\n";
        let mut raw = Vec::new();
        write_output(&mut raw, text, true).unwrap();
        assert_eq!(raw, text.as_bytes());
        let mut safe = Vec::new();
        write_output(&mut safe, text, false).unwrap();
        assert_eq!(
            String::from_utf8(safe).unwrap(),
            "ok\n\\x1b]52;c;eA==\\x07\\rdone\n"
        );
        let mut one = Vec::new();
        line(
            &mut one,
            "run-1: Failed (Error): \u{1b}[2K\rSucceeded\nrun-1: Succeeded",
        );
        assert_eq!(
            String::from_utf8(one).unwrap(),
            "run-1: Failed (Error): \\x1b[2K\\rSucceeded\\nrun-1: Succeeded\n"
        );
    }

    /// Every text this crate prints goes through this module: no module prints on its own.
    #[test]
    fn no_module_prints_around_the_escaping() {
        let sources = [
            ("main.rs", include_str!("main.rs")),
            ("cli.rs", include_str!("cli.rs")),
            ("cluster.rs", include_str!("cluster.rs")),
            ("decide.rs", include_str!("decide.rs")),
            ("follow.rs", include_str!("follow.rs")),
            ("run.rs", include_str!("run.rs")),
            ("sessions.rs", include_str!("sessions.rs")),
            ("top.rs", include_str!("top.rs")),
        ];
        for (file, source) in sources {
            for forbidden in [
                "println!",
                "print!",
                "eprint!",
                "eprintln!",
                "stdout()",
                "stderr()",
                "dbg!",
            ] {
                assert!(
                    !source.contains(forbidden),
                    "{file} uses {forbidden}: print through crate::term (say!, note!, \
                     write_output) so that what a run wrote cannot drive the terminal"
                );
            }
        }
        // Every module is in the list above.
        let listed: Vec<&str> = sources.iter().map(|(f, _)| *f).collect();
        for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src")).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            assert!(
                name == "term.rs" || listed.contains(&name.as_str()),
                "{name} is not checked by this test: add it"
            );
        }
    }
}

//! Where a PromQL syntax error is. promql-parser says what is wrong ("unclosed left
//! parenthesis", "invalid promql query") but not where, and a model fixes a query faster when it
//! is told the place. [`locate`] finds it from the outside, with the parser itself as the judge:
//!
//! - an unclosed quote or bracket: where it opens;
//! - another lexical error (an unexpected character, a bad escape, ...): the shortest prefix of
//!   the query with the same error ends at the offending character;
//! - a grammar error: the first token after which no completion makes the query valid. A prefix
//!   is *viable* when it parses after appending one of a few typical continuations (an operand,
//!   a range, a label matcher, more arguments, ...) and the closers of its open brackets; the
//!   first token whose prefix is not viable is where the parser gives up.
//!
//! The grammar search is a heuristic (a continuation it does not try can make it point too
//! early), so messages say "near". Queries longer than [`MAX_LOCATE_BYTES`] are not searched.

use promql_parser::parser::{lexer, parse};

/// Longest query whose error position is searched (each token costs a few parses).
pub const MAX_LOCATE_BYTES: usize = 2048;

/// promql-parser's message for every grammar error.
const GRAMMAR_ERROR: &str = "invalid promql query";

/// Continuations tried after a prefix (before the closers of its open brackets), most common
/// first; together they cover operands, ranges, matchers, `by`/`on` lists and extra arguments.
const CONTINUATIONS: &[&str] = &[
    "",
    " 1",
    " x",
    "x",
    "1",
    "x[1m]",
    "[1m]",
    "1m",
    " 5m",
    "=\"v\"",
    "\"v\"",
    "x=\"v\"",
    ", x",
    ", 1",
    " 1, x",
    " 1, x[1m]",
    ", x[1m]",
    " (x) (x)",
    " (x)",
    // The string arguments of label_replace and label_join, whichever are still missing.
    " x, \"a\", \"b\", \"c\", \"d\"",
    " \"a\"",
    " \"a\", \"b\"",
    " \"a\", \"b\", \"c\"",
    " \"a\", \"b\", \"c\", \"d\"",
    ", \"a\"",
    ", \"a\", \"b\"",
    ", \"a\", \"b\", \"c\"",
    ", \"a\", \"b\", \"c\", \"d\"",
];
/// What may follow a closer (a `by (...)` list closes before its operand).
const TAILS: &[&str] = &["", " (x)", " x"];

/// A place in the query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// The text there (a token, or a bracket), at most 20 characters; empty at the end.
    pub near: String,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)?;
        if !self.near.is_empty() {
            write!(f, " (at `{}`)", self.near)?;
        }
        Ok(())
    }
}

/// The parser's `message` for `query`, with where the error is when it can be found.
pub fn describe(query: &str, message: &str) -> String {
    if query.len() > MAX_LOCATE_BYTES {
        return message.to_owned();
    }
    if message == GRAMMAR_ERROR {
        return match grammar_error(query) {
            Some(at) => format!("{message}: the parser gives up near {at}"),
            None => format!(
                "{message}: the query ends too early (it is incomplete at {})",
                location(query, query.len(), 0)
            ),
        };
    }
    let scan = Scan::of(query);
    if message.starts_with("unterminated quoted string")
        && let Some((_, at)) = scan.quote
    {
        return format!(
            "{message}: the quote at {} is not closed",
            location(query, at, 1)
        );
    }
    if message.contains("unclosed left parenthesis")
        || message.contains("unexpected end of input inside")
    {
        let unclosed: Vec<String> = scan
            .open
            .iter()
            .map(|&(_, at)| location(query, at, 1).to_string())
            .collect();
        if !unclosed.is_empty() {
            return format!(
                "{message}: not closed: the bracket at {}",
                unclosed.join(", and the one at ")
            );
        }
    }
    match lexical_error(query, message) {
        Some(at) => format!("{message} at {at}"),
        None => message.to_owned(),
    }
}

/// The first token after which the query cannot become valid, or `None` when every prefix can
/// (the query is merely incomplete). A prefix of a prefix that cannot become valid cannot either,
/// so the search halves the candidates each step.
fn grammar_error(query: &str) -> Option<Location> {
    let boundaries = token_boundaries(query);
    if viable(query) {
        return None;
    }
    // Prefixes ending at boundaries[..lo] are viable; the one ending at boundaries[hi] is not.
    let (mut lo, mut hi) = (0, boundaries.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if viable(&query[..boundaries[mid]]) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let last_viable = if hi == 0 { 0 } else { boundaries[hi - 1] };
    // The offending token starts at the first non-blank after the last viable prefix.
    let start = query[last_viable..]
        .char_indices()
        .find(|(_, c)| !c.is_whitespace())
        .map_or(query.len(), |(i, _)| last_viable + i);
    let end = boundaries
        .iter()
        .find(|&&b| b > start)
        .map_or(query.len(), |&b| b);
    Some(location(query, start, (end - start).max(1)))
}

/// The shortest prefix that fails lexing with `message` ends at the offending character.
fn lexical_error(query: &str, message: &str) -> Option<Location> {
    let ends = query
        .char_indices()
        .map(|(i, c)| i + c.len_utf8())
        .collect::<Vec<_>>();
    for end in ends {
        if let Err(m) = lexer(&query[..end])
            && m == message
        {
            let start = query[..end].char_indices().last().map_or(0, |(i, _)| i);
            return Some(location(query, start, 1));
        }
    }
    None
}

/// Whether some continuation (and the closers of the open brackets) makes `prefix` valid.
fn viable(prefix: &str) -> bool {
    if prefix.trim().is_empty() {
        return true;
    }
    let scan = Scan::of(prefix);
    let mut closers = String::new();
    if scan.comment {
        closers.push('\n');
    }
    if let Some((q, _)) = scan.quote {
        closers.push(q);
    }
    let inner = closers.len();
    closers.extend(scan.open.iter().rev().map(|&(c, _)| closer(c)));
    // A tail goes after all closers, or after the innermost bracket (`sum by (le` needs its
    // operand right after the `)` of the label list, inside the outer brackets).
    let mut splits = vec![closers.len()];
    if inner + 1 < closers.len() {
        splits.push(inner + 1);
    }
    CONTINUATIONS.iter().any(|c| {
        TAILS.iter().any(|t| {
            splits.iter().any(|&at| {
                let (head, rest) = closers.split_at(at);
                parse(&format!("{prefix}{c}{head}{t}{rest}")).is_ok()
            })
        })
    })
}

/// Byte offsets where a token may end: before blanks, brackets, operators and quotes, after
/// them, and the end; never inside a string or a comment.
fn token_boundaries(query: &str) -> Vec<usize> {
    let is_punct = |c: char| "(){}[],=!~<>+-*/^%@:\"'`".contains(c);
    let mut out = Vec::new();
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut comment = false;
    let mut prev: Option<char> = None;
    for (i, c) in query.char_indices() {
        if comment {
            comment = c != '\n';
            prev = Some(c);
            continue;
        }
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' && q != '`' {
                escaped = true;
            } else if c == q {
                quote = None;
                // After the closing quote: the string token ends here.
                out.push(i + c.len_utf8());
            }
            prev = Some(c);
            continue;
        }
        let after_punct = prev.is_some_and(|p| is_punct(p) || p.is_whitespace());
        if i > 0 && (c.is_whitespace() || is_punct(c) || after_punct) {
            out.push(i);
        }
        match c {
            '#' => comment = true,
            '"' | '\'' | '`' => quote = Some(c),
            _ => {}
        }
        prev = Some(c);
    }
    out.push(query.len());
    out.dedup();
    out
}

/// Open brackets and an open quote at the end of a text.
#[derive(Debug, Default)]
struct Scan {
    /// Unclosed `(`, `[`, `{` with their byte offsets, outermost first.
    open: Vec<(char, usize)>,
    /// An unclosed quote and its offset.
    quote: Option<(char, usize)>,
    /// Whether the text ends inside a `#` comment.
    comment: bool,
}

impl Scan {
    fn of(text: &str) -> Self {
        let mut s = Self::default();
        let mut escaped = false;
        for (i, c) in text.char_indices() {
            if s.comment {
                s.comment = c != '\n';
                continue;
            }
            if let Some((q, _)) = s.quote {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q != '`' {
                    escaped = true;
                } else if c == q {
                    s.quote = None;
                }
                continue;
            }
            match c {
                '#' => s.comment = true,
                '"' | '\'' | '`' => s.quote = Some((c, i)),
                '(' | '[' | '{' => s.open.push((c, i)),
                ')' | ']' | '}' if s.open.last().is_some_and(|&(o, _)| closer(o) == c) => {
                    s.open.pop();
                }
                _ => {}
            }
        }
        s
    }
}

fn closer(open: char) -> char {
    match open {
        '(' => ')',
        '[' => ']',
        _ => '}',
    }
}

/// Line, column and the text of `len` bytes at byte offset `at`.
pub(super) fn location(query: &str, at: usize, len: usize) -> Location {
    let before = &query[..at];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit_once('\n')
        .map_or(before, |(_, rest)| rest)
        .chars()
        .count()
        + 1;
    let end = (at + len).min(query.len());
    let end = (end..=query.len())
        .find(|&e| query.is_char_boundary(e))
        .unwrap_or(query.len());
    let near: String = query[at..end].trim().chars().take(20).collect();
    Location { line, column, near }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(q: &str) -> String {
        let message = parse(q).expect_err(q);
        describe(q, &message)
    }

    #[test]
    fn grammar_errors_point_at_the_token() {
        for (q, at) in [
            ("foo bar", "line 1, column 5 (at `bar`)"),
            ("up{job=}", "line 1, column 8 (at `}`)"),
            ("sum(rate(x[5m]) by (job))", "line 1, column 17 (at `by`)"),
            ("up + * 1", "line 1, column 6 (at `*`)"),
            ("sum(up) by job", "line 1, column 12 (at `job`)"),
            ("1 +\nfoo bar", "line 2, column 5 (at `bar`)"),
        ] {
            let d = described(q);
            assert!(d.contains(at), "{q}: {d}");
        }
    }

    #[test]
    fn valid_prefixes_are_viable() {
        for q in [
            "sum by (job) (rate(up[5m]))",
            "histogram_quantile(0.9, sum by (le) (rate(x_bucket[5m])))",
            r#"label_replace(up, "a", "$1", "job", "(.*)")"#,
            r#"up{job="a",instance=~"b.*"} offset 5m"#,
            "topk(3, up) and on (job) up",
            "up > bool 1",
            "quantile_over_time(0.9, up[5m:1m])",
            "-up # comment\n+ 1",
        ] {
            assert!(parse(q).is_ok(), "{q}");
            for end in token_boundaries(q) {
                assert!(
                    viable(&q[..end]),
                    "{q}: prefix {:?} is not viable",
                    &q[..end]
                );
            }
        }
    }

    #[test]
    fn incomplete_queries_say_so() {
        let d = described("sum(up) + ");
        assert!(d.contains("ends too early"), "{d}");
        assert!(d.contains("line 1, column 11"), "{d}");
    }

    #[test]
    fn lexical_errors_point_at_the_character_or_the_opener() {
        let d = described("sum(rate(x[5m]) by (");
        assert!(d.contains("unclosed left parenthesis"), "{d}");
        assert!(d.contains("line 1, column 4 (at `(`)"), "{d}");
        assert!(d.contains("line 1, column 20"), "{d}");
        let d = described(r#"up{job="a}"#);
        assert!(d.contains("the quote at line 1, column 8"), "{d}");
        let d = described("up{job~\"a\"}");
        assert!(d.contains("line 1, column 7 (at `~`)"), "{d}");
        let d = described("up $ 1");
        assert!(d.contains("line 1, column 4 (at `$`)"), "{d}");
    }

    #[test]
    fn the_search_is_fast_enough_at_the_size_limit() {
        // An error at the very end of the longest searched query: every prefix is tried.
        let body = "sum(rate(x[5m])) + ".repeat(MAX_LOCATE_BYTES / 20);
        let q = format!("{body}foo bar");
        assert!(q.len() <= MAX_LOCATE_BYTES);
        let started = std::time::Instant::now();
        let d = described(&q);
        assert!(d.contains("(at `bar`)"), "{d}");
        let d = described(&format!("{body}up $ 1"));
        assert!(d.contains("(at `$`)"), "{d}");
        // Generous for debug builds on a busy machine; release builds take a fraction.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn long_queries_are_not_searched() {
        let q = format!("{} +", "up + ".repeat(MAX_LOCATE_BYTES / 5 + 1));
        assert_eq!(describe(&q, GRAMMAR_ERROR), GRAMMAR_ERROR);
    }
}

//! How deep a PromQL expression can nest, read from its tokens before anything parses it.
//!
//! promql-parser builds its tree bottom-up with an explicit stack, but everything done with the
//! tree afterwards recurses over it: its own type checks (`value_type` on every node built, so
//! quadratic in the depth), `Display`, `Drop`, the evaluator (`eval.rs`) and the scope
//! rewrite (`scope.rs`). A tree tens of thousands of levels deep overflows any thread's
//! stack, and nesting does not need brackets: `- - - x` nests one level per sign, `a + b + c`
//! one per operator, `x[5m:1m][5m:1m]` one per subquery. So the depth is bounded on the token
//! stream, without recursion, before the parser runs: [`check`] refuses a query whose tree
//! *could* be deeper than [`MAX_EXPR_DEPTH`], whatever the parser then makes of it.
//!
//! # The bound
//!
//! Tokens are read with promql-parser's own lexer (the same tokens its parser reads). Brackets
//! split them into groups: `( )` (a parenthesis, a call's or an aggregation's arguments), label
//! lists after `by`, `without`, `on`, `ignoring`, `group_left`, `group_right` (and the `( )` of
//! `fill*(v)`, `start()`, `end()`), and `[ ]` (a range or a subquery); label matchers `{ }` hold no expression. Commas split a group
//! into segments (the arguments of a call). For a segment, every tree the parser can build from
//! its tokens is at most
//!
//! > (operators in the segment, outside inner groups) + max(1, deepest inner group)
//!
//! levels deep, where an operator is anything that makes a node wrapping an operand: each binary
//! operator (arithmetic, comparison, `and`/`or`/`unless`, `atan2`), each sign (`-x`; `+x` makes
//! no node but counts too), each `@`, and each subquery `[d:s]` (the node around the expression
//! before it; a range `[d]` makes a matrix selector, which only takes a selector's place). A
//! `( )` group counts one level for its node (parenthesis, call, aggregation) above its deepest
//! segment; a label list one level for nothing in particular (it holds no expression, and
//! counting it keeps every open group worth a level); a `[ ]` group nothing of its own. Why it
//! holds: along any path from the root to a leaf, each node is either made by a distinct
//! operator token of the segment, or is the one bracket group the path enters (the rest of the
//! path is inside it), or is the leaf. Offsets, `bool` and the other modifiers change a node and
//! make none.
//!
//! The bound is exact for the usual shapes (`a + b + c` is 3 levels, `abs(abs(x))` 3,
//! `x[5m:1m][5m:1m]` 3) and over-counts a little elsewhere (`-1` folds into a number, a label
//! list counts one, the longest operator chain and the deepest group of a segment are added
//! even when they are side by side), which only matters near the limit.

use lrpar::{Lexeme, Lexer};
use promql_parser::parser::Expr;
use promql_parser::parser::token::{
    T_ANCHORED, T_BY, T_COLON, T_COMMA, T_END, T_FILL, T_FILL_LEFT, T_FILL_RIGHT, T_GROUP_LEFT,
    T_GROUP_RIGHT, T_IGNORING, T_LEFT_BRACE, T_LEFT_BRACKET, T_LEFT_PAREN, T_ON, T_RIGHT_BRACE,
    T_RIGHT_BRACKET, T_RIGHT_PAREN, T_SMOOTHED, T_START, T_WITHOUT, TokenType,
};

use super::MetricsError;
use super::syntax::{Location, location};

/// Deepest expression tree a query may build (levels: a selector alone is 1, `sum(x)` 2).
///
/// Everything that walks a tree recurses once per level, and each level costs at most a few
/// kilobytes of stack in a debug build (the evaluator's frames are the largest): 64 levels stay
/// far below the 8 MiB every PromQL thread gets (`stack.rs`), and below an async worker's
/// 2 MiB as well. Real queries rarely nest more than 10 levels; a long chain of binary
/// operators is the one shape that gets near, and splitting it is the fix the message gives.
pub const MAX_EXPR_DEPTH: usize = 64;

/// Most tokens a query may have (counted by the lexer, before parsing); bounds the work of
/// every later step in the query's width, as [`MAX_EXPR_DEPTH`] bounds it in depth.
pub const MAX_TOKENS: usize = 1_000;

/// What a bracket group is, for the depth it adds (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    /// The whole query.
    Root,
    /// `( )` of a parenthesis, a call or an aggregation: one node above its arguments.
    Node,
    /// `( )` of a label list (`by`, `on`, ...) or of `fill(...)`, `start()`, `end()`.
    Labels,
    /// `[ ]` of a range or subquery (its node is counted as an operator before it).
    Range,
}

/// An open bracket group while the tokens are read.
#[derive(Clone, Copy, Debug)]
struct Frame {
    group: Group,
    /// Operators in the current segment, outside inner groups.
    ops: usize,
    /// The deepest inner group of the current segment.
    inner: usize,
    /// The deepest earlier segment (before a comma).
    best: usize,
    /// A range group with a colon: a subquery (a node around the expression before it), not a
    /// matrix selector (which only ever takes the place of a selector).
    subquery: bool,
}

impl Frame {
    fn new(group: Group) -> Self {
        Self {
            group,
            ops: 0,
            inner: 0,
            best: 0,
            subquery: false,
        }
    }

    /// The bound of the current segment, with `below` as an inner group's depth.
    fn segment(&self, below: usize) -> usize {
        let inner = self.inner.max(below);
        match self.group {
            // Operands are leaves (one level) or inner groups.
            Group::Root | Group::Node => self.ops + inner.max(1),
            // No expression of their own: only what is in them counts.
            Group::Labels | Group::Range => self.ops + inner,
        }
    }

    /// The depth this group adds to its segment once closed, with `below` as an inner group's.
    fn depth(&self, below: usize) -> usize {
        let deepest = self.best.max(self.segment(below));
        match self.group {
            Group::Node | Group::Labels => deepest + 1,
            Group::Root | Group::Range => deepest,
        }
    }
}

/// Why a query is refused before it is parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The lexer refused the text (its message; the parser would refuse it the same way).
    Lex(String),
    /// The tree could be deeper than [`MAX_EXPR_DEPTH`]; where the limit is first passed.
    TooDeep(Location),
    /// More than [`MAX_TOKENS`] tokens (how many).
    TooLong(usize),
}

impl Refusal {
    /// The error a caller gets, saying what is allowed and what to change.
    pub fn into_error(self) -> MetricsError {
        match self {
            Self::Lex(message) => MetricsError::Parse(message),
            Self::TooDeep(at) => MetricsError::BadRequest(format!(
                "the query nests too deeply: at {at} its expression passes {MAX_EXPR_DEPTH} \
                 levels, the most accepted (every binary operator, sign, @, function call, \
                 aggregation, pair of parentheses and range or subquery [...] adds a level). \
                 Remove repeated signs (- -x is x), split a long chain of operators \
                 (a + b + c + ...) into several queries or group its terms with sum(), and nest \
                 fewer calls and subqueries"
            )),
            Self::TooLong(count) => MetricsError::BadRequest(format!(
                "the query has {count} tokens; at most {MAX_TOKENS} are accepted: write a shorter \
                 query (fewer terms, selectors and label matchers)"
            )),
        }
    }
}

/// Checks, before `query` is parsed, that no tree the parser could build from it is deeper than
/// [`MAX_EXPR_DEPTH`] and that it has at most [`MAX_TOKENS`] tokens. Linear in the query: the
/// lexer is a state machine, and the bound is kept on an explicit stack of open groups that
/// stays within [`MAX_EXPR_DEPTH`] + 2 (each open group adds a level, but a range's, which the
/// lexer never nests), so updating it costs at most that much per token.
pub fn check(query: &str) -> Result<(), Refusal> {
    let lexer = promql_parser::parser::lexer(query).map_err(Refusal::Lex)?;
    let mut nesting = Nesting::new();
    let mut count = 0;
    // The lexer has already refused the text when a lexeme is faulty: none are left out here.
    for lexeme in lexer.iter().flatten() {
        count += 1;
        nesting.read(lexeme.tok_id());
        if nesting.bound() > MAX_EXPR_DEPTH || nesting.open_groups() > MAX_EXPR_DEPTH + 2 {
            let span = lexeme.span();
            let at = location(query, span.start(), span.len().max(1));
            return Err(Refusal::TooDeep(at));
        }
    }
    if count > MAX_TOKENS {
        return Err(Refusal::TooLong(count));
    }
    Ok(())
}

/// The nesting bound of the tokens read so far.
struct Nesting {
    /// The open groups, the whole query first.
    stack: Vec<Frame>,
    /// Inside label matchers `{ }`.
    in_braces: bool,
    /// The token before, which says what a `(` opens.
    previous: Option<u16>,
}

impl Nesting {
    fn new() -> Self {
        Self {
            stack: vec![Frame::new(Group::Root)],
            in_braces: false,
            previous: None,
        }
    }

    /// Takes the next token into account.
    fn read(&mut self, id: u16) {
        let top = self.stack.len() - 1;
        match id {
            // Label matchers (`=`, `!=`, `=~`, `!~`, `or` between groups) build no expression.
            T_LEFT_BRACE => self.in_braces = true,
            T_RIGHT_BRACE => self.in_braces = false,
            _ if self.in_braces => {}
            T_LEFT_PAREN => {
                let group = match self.previous {
                    Some(
                        T_BY | T_WITHOUT | T_ON | T_IGNORING | T_GROUP_LEFT | T_GROUP_RIGHT
                        | T_FILL | T_FILL_LEFT | T_FILL_RIGHT | T_START | T_END | T_SMOOTHED
                        | T_ANCHORED,
                    ) => Group::Labels,
                    _ => Group::Node,
                };
                self.stack.push(Frame::new(group));
            }
            T_LEFT_BRACKET => self.stack.push(Frame::new(Group::Range)),
            T_COLON => self.stack[top].subquery = true,
            // A closer without an opener is the lexer's error; the root stays.
            T_RIGHT_PAREN | T_RIGHT_BRACKET if top > 0 => {
                let closed = self.stack.pop().expect("top > 0");
                let parent = &mut self.stack[top - 1];
                parent.inner = parent.inner.max(closed.depth(0));
                if closed.subquery {
                    // The subquery node around the expression before it.
                    parent.ops += 1;
                }
            }
            T_COMMA => {
                let frame = &mut self.stack[top];
                frame.best = frame.best.max(frame.segment(0));
                frame.ops = 0;
                frame.inner = 0;
            }
            _ if TokenType::new(id).is_operator() => self.stack[top].ops += 1,
            _ => {}
        }
        self.previous = Some(id);
    }

    /// The bound of the whole query if every open group closed now (it never decreases as
    /// tokens are read).
    fn bound(&self) -> usize {
        self.stack
            .iter()
            .rev()
            .fold(0, |below, frame| frame.depth(below))
    }

    /// Open groups, the whole query included.
    fn open_groups(&self) -> usize {
        self.stack.len()
    }
}

/// The depth of an expression tree (a selector alone is 1), measured without recursion: what
/// [`check`] bounds, for tests and assertions.
pub fn expr_depth(expr: &Expr) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Expr, usize)> = vec![(expr, 1)];
    while let Some((e, d)) = stack.pop() {
        deepest = deepest.max(d);
        let children: Vec<&Expr> = match e {
            Expr::Aggregate(a) => std::iter::once(a.expr.as_ref())
                .chain(a.param.as_deref())
                .collect(),
            Expr::Unary(u) => vec![u.expr.as_ref()],
            Expr::Binary(b) => vec![b.lhs.as_ref(), b.rhs.as_ref()],
            Expr::Paren(p) => vec![p.expr.as_ref()],
            Expr::Subquery(s) => vec![s.expr.as_ref()],
            Expr::Call(c) => c.args.args.iter().map(AsRef::as_ref).collect(),
            Expr::NumberLiteral(_)
            | Expr::StringLiteral(_)
            | Expr::VectorSelector(_)
            | Expr::MatrixSelector(_)
            | Expr::Extension(_) => Vec::new(),
        };
        stack.extend(children.into_iter().map(|c| (c, d + 1)));
    }
    deepest
}

/// The bound [`check`] computes for a query that lexes.
#[cfg(test)]
pub(super) fn bound(query: &str) -> usize {
    let lexer = promql_parser::parser::lexer(query).expect("lexes");
    let mut nesting = Nesting::new();
    for lexeme in lexer.iter().flatten() {
        nesting.read(lexeme.tok_id());
    }
    nesting.bound()
}

#[cfg(test)]
#[path = "depth_tests.rs"]
mod tests;

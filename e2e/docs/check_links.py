#!/usr/bin/env python3
"""Checks the relative links of the repository's Markdown files, offline.

For every tracked Markdown file (`git ls-files '*.md'` in the repository root, found from this
script's location), every inline link and image (`[text](target)`, `![alt](target)`) and every
reference definition (`[label]: target`) whose target is not `http(s)://` or `mailto:` must name a
file or directory that exists inside the repository (after normalising `..`; a link that climbs
out of it is broken even when the file exists), and a `#anchor` into a Markdown file (or into the
file itself) must be a heading's anchor there, by GitHub's rules: the heading's text, lower case,
punctuation other than `-` and `_` dropped, each space a `-`, and `-1`, `-2`, ... for repeats.
Links and headings inside fenced code blocks, inline code and HTML comments do not count.

Prints each broken link as `file:line: target: reason` and exits 1, else prints one summary line
and exits 0. Standard library only.

    python3 e2e/docs/check_links.py               # the tracked Markdown files
    python3 e2e/docs/check_links.py --untracked   # and untracked ones git does not ignore
    python3 e2e/docs/check_links.py docs/*.md     # only these files (targets: the whole tree)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

REPO_ROOT = Path(__file__).resolve().parents[2]

# Schemes that leave the repository on purpose and are not checked.
EXTERNAL = re.compile(r"^(https?:|mailto:)", re.IGNORECASE)
# Any other scheme (`file:`, `ftp:`, ...): a link out of the repository, reported.
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")

FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# `[label]: target "title"` at the start of a line.
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[((?:[^\[\]\\]|\\.)+)\]:[ \t]*(<[^>\n]*>|\S+)")
# `[text](target "title")` and `![alt](target)`; the text may hold one level of brackets.
INLINE_LINK = re.compile(
    r"(!?)\[((?:[^\[\]\\]|\\.|\[(?:[^\[\]\\]|\\.)*\])*)\]"
    r"\(\s*(<[^>\n]*>|(?:[^\s()\\]|\\.|\((?:[^\s()\\]|\\.)*\))*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
# Explicit anchors in HTML: `<a name="x">`, `id="x"`.
HTML_ANCHOR = re.compile(r"<[a-zA-Z][^>]*\s(?:name|id)\s*=\s*[\"']([^\"']+)[\"']")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
HTML_TAG = re.compile(r"</?[a-zA-Z][^>]*>")


@dataclass
class Link:
    line: int
    target: str


@dataclass
class Parsed:
    links: list[Link]
    anchors: set[str]


def mask(text: str, start: int, end: int) -> str:
    """`text` with [start, end) blanked out, newlines kept (so offsets and lines stay put)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def mask_code_spans(text: str) -> str:
    """Blanks out inline code: a run of N backticks up to the next run of exactly N."""
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] != "`":
            i += 1
            continue
        n = 1
        while i + n < len(text) and text[i + n] == "`":
            n += 1
        j = i + n
        close = -1
        while j < len(text):
            if text[j] == "`":
                m = 1
                while j + m < len(text) and text[j + m] == "`":
                    m += 1
                if m == n:
                    close = j
                    break
                j += m
            else:
                j += 1
        if close < 0:
            # No closing run: the backticks are literal.
            i += n
            continue
        text = mask(text, i, close + n)
        i = close + n
    return text


def heading_text(raw: str) -> str:
    """The text GitHub makes an anchor of: inline markup removed, code and link texts kept."""
    text = re.sub(r"(`+)(.+?)\1", lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!\[([^\]]*)\]\([^)]*\)", "", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", text)
    text = HTML_TAG.sub("", text)
    text = re.sub(r"\\(.)", r"\1", text)
    return text.strip()


def slug_base(text: str) -> str:
    """GitHub's slug of a heading text (github-slugger): lower case, letters, digits, marks,
    `_` and `-` kept, every other character dropped, each space a `-`."""
    kept = []
    for ch in text.lower():
        category = unicodedata.category(ch)
        if ch in " -_" or ch.isalnum() or category.startswith("M") or category == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


class Slugger:
    """Repeated slugs get `-1`, `-2`, ... as GitHub numbers them."""

    def __init__(self) -> None:
        self.occurrences: dict[str, int] = {}

    def slug(self, text: str) -> str:
        base = slug_base(text)
        result = base
        while result in self.occurrences:
            self.occurrences[base] += 1
            result = f"{base}-{self.occurrences[base]}"
        self.occurrences[result] = 0
        return result


def parse(text: str) -> Parsed:
    """The links (with their line numbers) and the anchors of one Markdown file."""
    text = HTML_COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    lines = text.split("\n")
    slugger = Slugger()
    anchors: set[str] = set()
    links: list[Link] = []
    # Blocks of consecutive lines outside fences, each with the number of its first line; a
    # code span or a link may run over several lines of one block, never past a blank line.
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] = []
    current_start = 0
    fence: tuple[str, int] | None = None

    def flush() -> None:
        nonlocal current
        if current:
            blocks.append((current_start, current))
        current = []

    previous_text: str | None = None  # the previous line, when it may be a setext heading's
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        opening = FENCE.match(line.lstrip())
        if fence is not None:
            char, length = fence
            if opening and opening.group(1)[0] == char and len(opening.group(1)) >= length \
                    and not opening.group(2).strip():
                fence = None
            continue
        if opening and not (opening.group(1)[0] == "`" and "`" in opening.group(2)):
            flush()
            fence = (opening.group(1)[0], len(opening.group(1)))
            previous_text = None
            continue
        if not stripped:
            flush()
            previous_text = None
            continue
        atx = ATX_HEADING.match(line)
        if atx:
            flush()
            anchors.add(slugger.slug(heading_text(atx.group(2) or "")))
            blocks.append((number, [line]))
            previous_text = None
            continue
        if SETEXT_UNDERLINE.match(line) and previous_text is not None:
            anchors.add(slugger.slug(heading_text(previous_text)))
            previous_text = None
            continue
        for anchor in HTML_ANCHOR.findall(line):
            anchors.add(anchor)
        if not current:
            current_start = number
        current.append(line)
        # A setext heading's text is a single plain paragraph line (not a list item, quote or
        # table row, whose `---` or `===` would be something else).
        paragraph_start = len(current) == 1 and not re.match(r"^\s*([-*+>|]|\d+[.)])", line)
        previous_text = line if paragraph_start else None
    flush()

    for start, block in blocks:
        joined = mask_code_spans("\n".join(block))
        for match in INLINE_LINK.finditer(joined):
            line = start + joined.count("\n", 0, match.start())
            links.append(Link(line, match.group(3)))
        for offset, line_text in enumerate(joined.split("\n")):
            ref = REFERENCE_DEFINITION.match(line_text)
            # `[^1]: ...` is a footnote, not a link.
            if ref and not ref.group(1).startswith("^"):
                links.append(Link(start + offset, ref.group(2)))
    return Parsed(links, anchors)


class Checker:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.cache: dict[Path, Parsed] = {}

    def parsed(self, path: Path) -> Parsed:
        if path not in self.cache:
            self.cache[path] = parse(path.read_text(encoding="utf-8", errors="replace"))
        return self.cache[path]

    def inside(self, path: Path) -> bool:
        try:
            path.relative_to(self.root)
            return True
        except ValueError:
            return False

    def problem(self, source: Path, target: str) -> str | None:
        """Why the link `target` of `source` is broken, or None."""
        if target.startswith("<") and target.endswith(">"):
            target = target[1:-1]
        if EXTERNAL.match(target):
            return None
        if SCHEME.match(target):
            return "a link with a scheme other than http(s) or mailto leaves the repository"
        path_part, _, anchor = target.partition("#")
        path_part = path_part.split("?", 1)[0]
        path_part = unquote(path_part)
        anchor = unquote(anchor)
        if not path_part:
            if not anchor:
                return "empty link target"
            resolved = source
        else:
            base = self.root if path_part.startswith("/") else source.parent
            resolved = Path(os.path.normpath(base / path_part.lstrip("/")))
            if not self.inside(resolved):
                return f"resolves outside the repository ({os.path.relpath(resolved, self.root)})"
            if not resolved.exists():
                return "no such file or directory"
            if not self.inside(resolved.resolve()):
                return "a link (symlink) that leads outside the repository"
        if anchor and resolved.is_file() and resolved.suffix.lower() == ".md":
            if anchor not in self.parsed(resolved).anchors:
                where = "this file" if resolved == source else resolved.relative_to(self.root)
                return f"no heading with the anchor #{anchor} in {where}"
        return None


def markdown_files(root: Path, untracked: bool) -> list[str]:
    args = ["git", "ls-files", "-z", "--", "*.md"]
    try:
        files = subprocess.run(args, cwd=root, check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        # Not a git checkout (an unpacked source tarball): every Markdown file but build output.
        return sorted(
            str(path.relative_to(root)) for path in root.rglob("*.md")
            if not any(part.startswith(".") or part in ("target", "dist", "node_modules")
                       for part in path.relative_to(root).parts[:-1])
        )
    names = [n.decode() for n in files.split(b"\0") if n]
    if untracked:
        args = ["git", "ls-files", "-z", "--others", "--exclude-standard", "--", "*.md"]
        others = subprocess.run(args, cwd=root, check=True, capture_output=True).stdout
        names += [n.decode() for n in others.split(b"\0") if n]
    # A tracked file deleted in the work tree has nothing to check.
    return sorted({n for n in names if (root / n).is_file()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="Markdown files to check (default: every tracked one)")
    parser.add_argument("--untracked", action="store_true",
                        help="also check untracked Markdown files that git does not ignore")
    args = parser.parse_args()

    checker = Checker(REPO_ROOT)
    if args.files:
        names = [os.path.relpath(Path(f).resolve(), checker.root) for f in args.files]
    else:
        names = markdown_files(checker.root, args.untracked)
    broken = checked = external = 0
    for name in names:
        source = checker.root / name
        for link in checker.parsed(source).links:
            if EXTERNAL.match(link.target.lstrip("<")):
                external += 1
                continue
            checked += 1
            why = checker.problem(source, link.target)
            if why:
                broken += 1
                print(f"{name}:{link.line}: {link.target}: {why}")
    if broken:
        print(f"check_links: {broken} of {checked} links broken in {len(names)} Markdown files",
              file=sys.stderr)
        return 1
    print(f"check_links: {len(names)} Markdown files, {checked} links checked, none broken "
          f"({external} http(s)/mailto links not followed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The commands and configurations the README and the docs show, as the tests that run them
take them: a fenced code block preceded by `<!-- snippet: NAME -->` is snippet NAME.

    snippets.py NAME [--file FILE]   print snippet NAME (searched in README.md and docs/*.md)
    snippets.py --check              README.md is at most 150 lines, every fenced block of it is a
                                     named snippet, names are unique, and each is run by a test:
                                     it appears, as
                                     `snippets.py NAME` or `snippet("NAME")`, in a test or script
                                     under e2e/, mcp-frontend/tests/ or .ci/

From Python: `from snippets import snippet` (e2e/docs on sys.path), `snippet("laptop")`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^\s*<!-- snippet: ([a-z0-9-]+) -->\s*$")
FENCE = re.compile(r"^(\s*)(```|~~~)")


def blocks(path: Path) -> list[tuple[str | None, int, str]]:
    """(name or None, line, body) of each fenced code block of a markdown file."""
    lines = path.read_text().splitlines()
    out, i, name = [], 0, None
    while i < len(lines):
        line = lines[i]
        marker = MARKER.match(line)
        if marker:
            name = marker.group(1)
        elif FENCE.match(line):
            # A block may be indented (inside a list item): its lines lose that indentation.
            indent, fence = FENCE.match(line).groups()
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
                i += 1
            out.append((name, start, "\n".join(body) + "\n"))
            name = None
        elif line.strip():
            name = None   # a marker names the block right after it only
        i += 1
    return out


def sources() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def snippet(name: str, file: str | None = None) -> str:
    """The body of snippet NAME."""
    for path in [ROOT / file] if file else sources():
        for found, _, body in blocks(path):
            if found == name:
                return body
    raise KeyError(f"no snippet {name!r} in {file or 'README.md or docs/'}")


def check() -> int:
    errors, names = [], {}
    for path in sources():
        for name, line, _ in blocks(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if name is None:
                if path.name == "README.md" and path.parent == ROOT:
                    errors.append(f"{where}: a code block without `<!-- snippet: NAME -->`: "
                                  "every snippet the README shows is run by a test")
                continue
            if name in names:
                errors.append(f"{where}: snippet {name!r} also at {names[name]}")
            names[name] = where
    tracked = subprocess.run(["git", "ls-files", "e2e", "mcp-frontend/tests", ".ci"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    users = {}
    for rel in tracked:
        if rel == "e2e/docs/snippets.py":
            continue
        text = (ROOT / rel).read_text(errors="replace")
        for name in re.findall(r"""snippets\.py\s+([a-z0-9-]+)|snippet\(\s*["']([a-z0-9-]+)["']""", text):
            users.setdefault(name[0] or name[1], rel)
    readme_lines = len((ROOT / "README.md").read_text().splitlines())
    if readme_lines > 150:
        errors.append(f"README.md: {readme_lines} lines; it must fit on a screen (150 at most): "
                      "move the details to docs/")
    for name, where in names.items():
        if name not in users:
            errors.append(f"{where}: snippet {name!r} is run by no test")
    for error in errors:
        print(error)
    print(f"snippets.py: {len(names)} named snippets, {len(errors)} problems")
    return 1 if errors else 0


def main() -> int:
    args = sys.argv[1:]
    if args == ["--check"]:
        return check()
    if len(args) in (1, 3) and (len(args) == 1 or args[1] == "--file"):
        try:
            sys.stdout.write(snippet(args[0], args[2] if len(args) == 3 else None))
        except KeyError as e:
            print(f"snippets.py: {e.args[0]}", file=sys.stderr)
            return 1
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

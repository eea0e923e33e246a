"""Files in and out of run_python through the official Python MCP SDK: input files placed
read-only in /tmp/inputs, files the code writes in /tmp/outputs returned as MCP content (an image
as image content, text as an embedded text resource, anything else as a blob resource), and what
hostile code and hostile arguments get: nothing outside /tmp/outputs, only regular files with
plain names within the caps, every refusal explained, nothing run for bad arguments.

One server for the module (Streamable HTTP); the data-profile test also runs over stdio. The data
profile needs its root file system (images/build.sh rootfs sandbox-python-data DIR): without it
that test is skipped, unless SANDBOXRUN_REQUIRE_DATA_PROFILE=1 (CI), where it fails.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import struct

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import Server, auth

# The caps of the embedded default policy (core/src/files.rs).
MAX_OUTPUT_FILES = 20
MAX_OUTPUT_BYTES = 384 * 1024
MAX_INPUT_FILES = 20
MAX_INPUT_BYTES = 256 * 1024

SALES = "region,month,amount\nnorth,jan,120.5\nsouth,jan,80\nnorth,feb,99.5\nsouth,feb,100\n"
# Four rows: sum 400.0, mean 100.0, north 220.0.
CHART = """\
import pandas as pd
import matplotlib
import matplotlib.pyplot as plt
df = pd.read_csv('/tmp/inputs/sales.csv')
print(f"total={df['amount'].sum():.1f}")
print(f"mean={df['amount'].mean():.1f}")
print(f"north={df[df.region == 'north']['amount'].sum():.1f}")
print('backend=' + matplotlib.get_backend())
fig = plt.figure(figsize=(6.4, 4.8), dpi=100)
ax = fig.add_subplot()
df.groupby('month')['amount'].sum().plot.bar(ax=ax)
fig.savefig('/tmp/outputs/chart.png')
"""
# The sandbox image's /etc/passwd starts so; it must never come back as a file.
PASSWD_MARK = "root:x:0:0"


@pytest.fixture(scope="module")
def files_server(binary, key_file, tmp_path_factory):
    """One HTTP server for the module, with a rate limit no test here comes near."""
    server = Server(binary, key_file, tmp_path_factory.mktemp("logs") / "files.log",
                    "--rate-limit-per-minute", "100000", "--rate-limit-burst", "10000")
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def connect(server: Server | None, binary: str):
    """An initialized session: over Streamable HTTP to `server`, or over stdio when None."""
    async with contextlib.AsyncExitStack() as stack:
        if server is None:
            # The whole environment, as the HTTP server gets it (SANDBOXRUN_CACHE, ..._ROOTFS).
            params = StdioServerParameters(command=binary, args=["stdio", "--backend", "local"],
                                           env=dict(os.environ))
            read, write = await stack.enter_async_context(stdio_client(params))
        else:
            client = await stack.enter_async_context(httpx2.AsyncClient(headers=auth(), timeout=180))
            streams = await stack.enter_async_context(
                streamable_http_client(f"{server.base}/mcp", http_client=client))
            read, write = streams[0], streams[1]
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        yield session


def blocks(result) -> list[dict]:
    """The content blocks as their wire JSON."""
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in result.content]


def wire(result) -> str:
    """The whole result as it travelled, for 'appears nowhere' checks."""
    return json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True))


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    assert data[12:16] == b"IHDR", data[:32]
    return struct.unpack(">II", data[16:24])


def omitted(result) -> dict[str, dict]:
    return {o["name"]: o for o in result.structured_content.get("filesOmitted", [])}


# --- the data profile: a CSV in, numbers and a chart out ------------------------------------


@pytest.mark.parametrize("transport", ["streamable-http", "stdio"])
def test_data_profile_reads_a_csv_and_returns_a_chart(transport, binary, request):
    server = request.getfixturevalue("files_server") if transport != "stdio" else None

    async def main():
        async with connect(server, binary) as session:
            r = await session.call_tool("run_python", {
                "code": CHART, "profile": "data", "timeoutSeconds": 120,
                "files": [{"name": "sales.csv", "text": SALES}],
            })
            sc = r.structured_content
            if sc and sc.get("reason") == "ProfileUnavailable":
                return r.content[0].text
            assert r.is_error is False, blocks(r)
            out = sc["stdout"]
            assert "total=400.0\n" in out and "mean=100.0\n" in out and "north=220.0\n" in out, sc
            assert "backend=agg" in out.lower(), sc
            # structuredContent lists the file, without its bytes.
            assert [(f["name"], f["mimeType"]) for f in sc["files"]] == [("chart.png", "image/png")], sc
            assert set(sc["files"][0]) == {"name", "mimeType", "size"}, sc
            assert "filesOmitted" not in sc, sc
            images = [b for b in blocks(r) if b["type"] == "image"]
            assert len(images) == 1, blocks(r)
            assert images[0]["mimeType"] == "image/png"
            data = base64.b64decode(images[0]["data"], validate=True)
            assert len(data) == sc["files"][0]["size"]
            assert png_size(data) == (640, 480)
            # The structured result first (as text), then the image.
            assert [b["type"] for b in blocks(r)] == ["text", "image"], blocks(r)
            return None

    # Skipped or failed outside the session: an exception inside it reaches pytest wrapped.
    unavailable = anyio.run(main)
    if unavailable is not None:
        if os.environ.get("SANDBOXRUN_REQUIRE_DATA_PROFILE") == "1":
            pytest.fail(f"SANDBOXRUN_REQUIRE_DATA_PROFILE=1 but the data profile is not available: {unavailable}")
        pytest.skip(f"the data profile is not available here: {unavailable}")


def test_without_the_data_root_file_system_the_server_starts_and_says_so(binary, tmp_path):
    """A missing data root file system does not keep the server from starting: minimal runs
    work, data runs are refused with how to build it, and nothing runs."""
    missing = tmp_path / "no-such-rootfs"

    async def main():
        params = StdioServerParameters(
            command=binary, args=["stdio", "--backend", "local", "--data-rootfs", str(missing)])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            r = await session.call_tool("run_python", {"code": "print('ran')", "profile": "data"})
            assert r.is_error is True, blocks(r)
            sc = r.structured_content
            assert (sc["phase"], sc["reason"]) == ("Rejected", "ProfileUnavailable"), sc
            assert sc["stdout"] == "" and "exitCode" not in sc, sc
            text = r.content[0].text
            assert str(missing) in text and "images/build.sh rootfs sandbox-python-data" in text, text
            assert "without `profile`" in text, text
            r = await session.call_tool("run_python", {"code": "print('ran')"})
            assert r.is_error is False and r.structured_content["stdout"] == "ran\n", blocks(r)

    anyio.run(main)


# --- text and binary outputs -----------------------------------------------------------------


def test_text_outputs_are_text_resources_and_binary_ones_blobs(files_server, binary):
    code = (
        "open('/tmp/outputs/totals.csv', 'w').write('region,total\\nnorth,220\\n')\n"
        "open('/tmp/outputs/notes.txt', 'w', encoding='utf-8').write('caf\\u00e9 ok\\n')\n"
        "open('/tmp/outputs/summary.json', 'w').write('{\"n\": 4}')\n"
        "open('/tmp/outputs/model.bin', 'wb').write(bytes(range(256)))\n"
        # A name that claims an image, with content that is not one: never called an image.
        "open('/tmp/outputs/fake.png', 'wb').write(b'not a png')\n"
        "print('wrote')\n"
    )

    async def main():
        async with connect(files_server, binary) as session:
            r = await session.call_tool("run_python", {"code": code})
            assert r.is_error is False, blocks(r)
            sc = r.structured_content
            listed = {f["name"]: (f["mimeType"], f["size"]) for f in sc["files"]}
            assert listed == {
                "fake.png": ("application/octet-stream", 9),
                "model.bin": ("application/octet-stream", 256),
                "notes.txt": ("text/plain", len("café ok\n".encode())),
                "summary.json": ("application/json", 8),
                "totals.csv": ("text/csv", 23),
            }, sc
            resources = {b["resource"]["uri"]: b["resource"] for b in blocks(r) if b["type"] == "resource"}
            assert set(resources) == {f"file:///tmp/outputs/{n}" for n in listed}, resources
            csv = resources["file:///tmp/outputs/totals.csv"]
            assert (csv["mimeType"], csv["text"]) == ("text/csv", "region,total\nnorth,220\n")
            assert resources["file:///tmp/outputs/notes.txt"]["text"] == "café ok\n"
            assert resources["file:///tmp/outputs/summary.json"]["mimeType"] == "application/json"
            blob = resources["file:///tmp/outputs/model.bin"]
            assert blob["mimeType"] == "application/octet-stream" and "text" not in blob
            assert base64.b64decode(blob["blob"]) == bytes(range(256))
            assert base64.b64decode(resources["file:///tmp/outputs/fake.png"]["blob"]) == b"not a png"
            assert not [b for b in blocks(r) if b["type"] == "image"], blocks(r)

    anyio.run(main)


def test_active_content_comes_back_as_plain_text_never_as_an_image(files_server, binary):
    """SVG, HTML and XML can carry scripts a client would run if it rendered them: whatever their
    name, they come back as text/plain resources, and only real raster images as image content."""
    code = (
        "svg = \"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>\"\n"
        "open('/tmp/outputs/plot.svg', 'w').write(svg)\n"
        "open('/tmp/outputs/chart.png', 'w').write('\\ufeff  ' + svg)\n"
        "open('/tmp/outputs/page.html', 'w').write('<!DOCTYPE html><body onload=alert(1)>')\n"
        "open('/tmp/outputs/notes.txt', 'w').write('<?xml version=\"1.0\"?><x/>')\n"
        "print('wrote')\n"
    )

    async def main():
        async with connect(files_server, binary) as session:
            r = await session.call_tool("run_python", {"code": code})
            assert r.is_error is False, blocks(r)
            listed = {f["name"]: f["mimeType"] for f in r.structured_content["files"]}
            assert listed == {n: "text/plain" for n in ["chart.png", "notes.txt", "page.html", "plot.svg"]}, listed
            assert not [b for b in blocks(r) if b["type"] == "image"], blocks(r)
            resources = {b["resource"]["uri"]: b["resource"] for b in blocks(r) if b["type"] == "resource"}
            assert len(resources) == 4, resources
            for uri, res in resources.items():
                assert res["mimeType"] == "text/plain" and "text" in res, (uri, res)
            assert "<script>" in resources["file:///tmp/outputs/plot.svg"]["text"]

    anyio.run(main)


# --- hostile outputs -------------------------------------------------------------------------


def test_links_and_special_files_in_outputs_are_not_followed(files_server, binary):
    code = (
        "import os\n"
        "os.symlink('/etc/passwd', '/tmp/outputs/passwd')\n"
        "os.symlink('/proc/self/environ', '/tmp/outputs/environ')\n"
        "os.symlink('/tmp', '/tmp/outputs/tmpdir')\n"
        "os.mkfifo('/tmp/outputs/fifo')\n"
        "os.mkdir('/tmp/outputs/sub')\n"
        "open('/tmp/outputs/sub/inner.txt', 'w').write('inner')\n"
        "open('/tmp/outputs/a\\nb.txt', 'w').write('newline')\n"
        "open('/tmp/outputs/.hidden', 'w').write('hidden')\n"
        "open('/tmp/mine.txt', 'w').write('my own bytes')\n"
        "os.link('/tmp/mine.txt', '/tmp/outputs/hardlink.txt')\n"
        "try:\n"
        "    os.link('/etc/passwd', '/tmp/outputs/passwd-hard')\n"
        "    print('hard link to /etc/passwd: made')\n"
        "except OSError as e:\n"
        "    print('hard link to /etc/passwd: refused', e.errno)\n"
        "open('/tmp/outputs/ok.txt', 'w').write('fine')\n"
    )

    async def main():
        async with connect(files_server, binary) as session:
            with anyio.fail_after(60):  # a FIFO must not block the runner
                r = await session.call_tool("run_python", {"code": code})
            assert r.is_error is False, blocks(r)
            sc = r.structured_content
            names = [f["name"] for f in sc["files"]]
            om = omitted(r)
            for name in ["passwd", "environ", "tmpdir", "fifo", "sub"]:
                assert om[name]["reason"] == "notARegularFile", (name, om)
            assert om["a\\nb.txt"]["reason"] == "badName", om
            assert om[".hidden"]["reason"] == "badName", om
            assert "inner.txt" not in names and "inner.txt" not in om
            # A hard link to a file the code wrote is that file: its own bytes come back.
            resources = {b["resource"]["uri"]: b["resource"] for b in blocks(r) if b["type"] == "resource"}
            assert resources["file:///tmp/outputs/hardlink.txt"]["text"] == "my own bytes"
            assert resources["file:///tmp/outputs/ok.txt"]["text"] == "fine"
            if "made" in sc["stdout"]:
                # Only possible on one file system; then it is a file the code can read anyway.
                assert "passwd-hard" in names, sc
            else:
                assert "passwd-hard" not in names and "passwd-hard" not in om, sc
                everything = wire(r)
                assert PASSWD_MARK not in everything, everything
            assert "passwd" not in names and "environ" not in names
            # The environment of whoever read /proc/self/environ never shows up.
            assert "PATH=" not in wire(r)
            # The model is told, in a text block after the files.
            note = blocks(r)[-1]
            assert note["type"] == "text" and "were not returned" in note["text"], note
            assert "passwd (notARegularFile)" in note["text"], note

    anyio.run(main)


def test_outputs_replaced_by_a_link_return_nothing(files_server, binary):
    code = (
        "import os\n"
        "os.rmdir('/tmp/outputs')\n"
        "os.symlink('/etc', '/tmp/outputs')\n"
        "print(len(os.listdir('/tmp/outputs')) > 0)\n"
    )

    async def main():
        async with connect(files_server, binary) as session:
            r = await session.call_tool("run_python", {"code": code})
            assert r.is_error is False, blocks(r)
            sc = r.structured_content
            assert sc["stdout"] == "True\n", sc
            assert "files" not in sc and "filesOmitted" not in sc, \
                f"the runner followed /tmp/outputs -> /etc: {sc.get('files', [])[:3]}"
            # (gVisor follows a symlink opened with O_DIRECTORY | O_NOFOLLOW: the runner must not
            # rely on that flag alone.)
            assert [b["type"] for b in blocks(r)] == ["text"], blocks(r)
            assert PASSWD_MARK not in wire(r)

    anyio.run(main)


def test_caps_on_returned_files(files_server, binary):
    big = MAX_OUTPUT_BYTES + 1
    code_big = (
        f"open('/tmp/outputs/big.bin', 'wb').write(b'x' * {big})\n"
        "open('/tmp/outputs/small.txt', 'w').write('small')\n"
    )
    count = MAX_OUTPUT_FILES + 5
    code_many = f"for i in range({count}):\n    open(f'/tmp/outputs/f{{i:02d}}.txt', 'w').write(str(i))\n"

    async def main():
        async with connect(files_server, binary) as session:
            r = await session.call_tool("run_python", {"code": code_big})
            assert r.is_error is False, blocks(r)
            sc = r.structured_content
            assert [f["name"] for f in sc["files"]] == ["small.txt"], sc
            assert omitted(r)["big.bin"] == {"name": "big.bin", "size": big, "reason": "byteCount"}, sc
            assert "big.bin (byteCount)" in blocks(r)[-1]["text"]

            r = await session.call_tool("run_python", {"code": code_many})
            assert r.is_error is False, blocks(r)
            sc = r.structured_content
            kept = [f["name"] for f in sc["files"]]
            # The first ones by name, whole; the rest named with the reason.
            assert kept == [f"f{i:02d}.txt" for i in range(MAX_OUTPUT_FILES)], sc
            om = omitted(r)
            assert sorted(om) == [f"f{i:02d}.txt" for i in range(MAX_OUTPUT_FILES, count)], sc
            assert {o["reason"] for o in om.values()} == {"fileCount"}, sc
            assert len([b for b in blocks(r) if b["type"] == "resource"]) == MAX_OUTPUT_FILES

    anyio.run(main)


# --- inputs ----------------------------------------------------------------------------------


def test_inputs_are_placed_read_only(files_server, binary):
    binary_bytes = bytes(range(256)) * 4
    code = (
        "import hashlib, os\n"
        "print(open('/tmp/inputs/notes.txt', encoding='utf-8').read(), end='')\n"
        "print(hashlib.sha256(open('/tmp/inputs/blob.bin', 'rb').read()).hexdigest())\n"
        "print(sorted(os.listdir('/tmp/inputs')))\n"
        "for path in ['/tmp/inputs/notes.txt', '/tmp/inputs/new.txt']:\n"
        "    try:\n"
        "        open(path, 'a').write('x')\n"
        "        print('writable', path)\n"
        "    except OSError as e:\n"
        "        print('not writable', path, type(e).__name__)\n"
        "try:\n"
        "    os.remove('/tmp/inputs/notes.txt')\n"
        "    print('removable')\n"
        "except OSError as e:\n"
        "    print('not removable', type(e).__name__)\n"
    )

    async def main():
        import hashlib
        async with connect(files_server, binary) as session:
            r = await session.call_tool("run_python", {"code": code, "files": [
                {"name": "notes.txt", "text": "grüße\nline 2\n"},
                {"name": "blob.bin", "base64": base64.b64encode(binary_bytes).decode()},
            ]})
            assert r.is_error is False, blocks(r)
            lines = r.structured_content["stdout"].splitlines()
            assert lines[:2] == ["grüße", "line 2"], lines
            assert lines[2] == hashlib.sha256(binary_bytes).hexdigest(), lines
            assert lines[3] == "['blob.bin', 'notes.txt']", lines
            assert lines[4].startswith("not writable /tmp/inputs/notes.txt PermissionError"), lines
            assert lines[5].startswith("not writable /tmp/inputs/new.txt PermissionError"), lines
            assert lines[6].startswith("not removable PermissionError"), lines

    anyio.run(main)


BAD_INPUTS = [
    # (files argument, what the error must mention)
    ([{"name": "../x", "text": "a"}], "../x"),
    ([{"name": "/etc/x", "text": "a"}], "/etc/x"),
    ([{"name": ".hidden", "text": "a"}], "must start with a letter or a digit"),
    ([{"name": "a/b", "text": "a"}], "'/'"),
    ([{"name": "a\x00b", "text": "a"}], "not allowed"),
    ([{"name": "n" * 101, "text": "a"}], "at most 100"),
    ([{"name": "a.txt", "text": "1"}, {"name": "a.txt", "text": "2"}], "twice"),
    ([{"name": "a.bin", "base64": "not base64!"}], "not valid base64"),
    ([{"name": "a.txt", "text": "a", "base64": "YQ=="}], "both `text` and `base64`"),
    ([{"name": "a.txt"}], "`text` or `base64`"),
    ([{"name": f"f{i}.txt", "text": "x"} for i in range(MAX_INPUT_FILES + 1)], f"at most {MAX_INPUT_FILES}"),
    ([{"name": "a.txt", "text": "x" * (MAX_INPUT_BYTES // 2)},
      {"name": "b.txt", "text": "x" * (MAX_INPUT_BYTES // 2 + 1)}], f"at most {MAX_INPUT_BYTES}"),
]


@pytest.mark.parametrize("files, mentions", BAD_INPUTS, ids=[
    "dotdot", "absolute", "hidden", "slash", "nul", "too-long", "duplicate", "bad-base64",
    "text-and-base64", "no-content", "too-many", "too-large"])
def test_bad_input_files_are_refused_and_nothing_runs(files_server, binary, files, mentions):
    async def main():
        async with connect(files_server, binary) as session:
            r = await session.call_tool("run_python", {"code": "print('ran')", "files": files})
            assert r.is_error is True, blocks(r)
            # Refused before any run: no run, so no structured result and no output.
            assert r.structured_content is None, r.structured_content
            text = r.content[0].text
            assert len(r.content) == 1, blocks(r)
            assert "files" in text and mentions in text, text

    anyio.run(main)

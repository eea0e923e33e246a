"""Files in and out, and the data profile, on the cluster: the official Python MCP SDK calls
run_python through the frontend's NodePort; the sandbox Pod runs the sandbox-python-data image,
reads an input CSV with pandas and returns a matplotlib chart as MCP image content. Files travel
with the program (the Pod's attach stream) and in the result envelope (its log), and the run's
status holds them within a bound; hostile outputs (links, special files) never come back; input
names that could escape their directory are refused by the frontend and by the CRD.

Named to run after test_cluster_frontend.py (pytest takes files in name order): the data runs here
make both pools start new sandboxes, and that test's streamed-output timing wants a quiet node.

Environment (set by e2e/run-tests.sh): MCP_URL, MCP_API_KEY, KUBECTL."""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

URL = os.environ["MCP_URL"]
KEY = os.environ["MCP_API_KEY"]
KUBECTL = os.environ.get("KUBECTL", "kubectl")
NAMESPACE = "sandboxrun-runs"

CSV = "month,amount\n1,10\n2,15\n3,12\n4,20\n"
CHART = """import pandas as pd, numpy as np, matplotlib.pyplot as plt
df = pd.read_csv('/tmp/inputs/sales.csv')
print(int(df.amount.sum()), float(np.mean(df.amount)))
fig = plt.figure(figsize=(6.4, 4.8), dpi=100)
plt.bar(df.month, df.amount)
plt.title('Sales by month')
fig.savefig('/tmp/outputs/chart.png')
df.describe().to_csv('/tmp/outputs/summary.csv')
"""


async def call(args: dict):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=240) as client, \
            streamable_http_client(URL, http_client=client) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        return await session.call_tool("run_python", args, read_timeout_seconds=230)


def kubectl_json(*args: str) -> dict:
    return json.loads(subprocess.run([KUBECTL, *args, "-o", "json"], check=True,
                                     capture_output=True, text=True).stdout)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    return struct.unpack(">II", data[16:24])


def test_a_data_call_finds_numpy_pandas_matplotlib_and_scipy_loaded_at_its_first_line():
    # The runner imports them before it reads the program (core/src/runner.py, PRELOAD), warm
    # Pod of the chart's data pool or cold alike; the code's process inherits them with the fork.
    code = ("import sys, os\n"
            "print(sorted(m for m in ('numpy', 'pandas', 'matplotlib.pyplot', 'scipy')"
            " if m in sys.modules))\n"
            "import matplotlib\n"
            "print(matplotlib.get_backend().lower(), len(os.listdir('/proc/self/task')))\n")
    result = anyio.run(call, {"code": code, "profile": "data"})
    assert result.is_error is False, result
    sc = result.structured_content
    assert sc["stdout"] == "['matplotlib.pyplot', 'numpy', 'pandas', 'scipy']\nagg 1\n", sc
    run = kubectl_json("-n", NAMESPACE, "get", "sandboxrun", sc["runName"])
    assert run["spec"]["python"]["profile"] == "data"
    assert run["status"]["phase"] == "Succeeded", run["status"]


def test_the_data_profile_turns_an_input_csv_into_a_chart_image():
    result = anyio.run(call, {
        "code": CHART, "profile": "data", "timeoutSeconds": 120,
        "files": [{"name": "sales.csv", "text": CSV}],
    })
    assert result.is_error is False, result
    sc = result.structured_content
    assert sc["stdout"] == "57 14.25\n", sc
    listed = {f["name"]: f for f in sc["files"]}
    assert listed["chart.png"]["mimeType"] == "image/png"
    images = [c for c in result.content if c.type == "image"]
    assert len(images) == 1, result.content
    png = base64.b64decode(images[0].data)
    assert images[0].mime_type == "image/png"
    assert png_size(png) == (640, 480)
    assert listed["chart.png"]["size"] == len(png)
    resources = [c for c in result.content if c.type == "resource"]
    assert [str(r.resource.uri) for r in resources] == ["file:///tmp/outputs/summary.csv"], resources
    assert "amount" in resources[0].resource.text

    run = kubectl_json("-n", NAMESPACE, "get", "sandboxrun", sc["runName"])
    assert run["spec"]["python"]["profile"] == "data"
    assert run["status"]["phase"] == "Succeeded"
    stored = {f["name"]: f for f in run["status"]["files"]}
    assert base64.b64decode(stored["chart.png"]["data"]) == png
    # The sandbox Pod ran the data image (its Event names the Pod; the Pod itself is gone).
    events = kubectl_json("-n", NAMESPACE, "get", "events",
                          "--field-selector", f"involvedObject.name={run['status']['podName']}")
    pulled = [e["message"] for e in events["items"] if e["reason"] == "Pulled"]
    assert any("sandbox-python-data" in m for m in pulled), pulled


def test_hostile_outputs_never_leave_the_sandbox_pod_and_caps_hold():
    code = """import os
os.symlink('/etc/passwd', '/tmp/outputs/passwd')
os.symlink('/proc/self/environ', '/tmp/outputs/environ')
os.mkfifo('/tmp/outputs/fifo')
os.mkdir('/tmp/outputs/dir')
open('/tmp/outputs/big.bin', 'wb').write(os.urandom(1 << 20))
for i in range(25):
    open(f'/tmp/outputs/f{i:02}.txt', 'w').write('x' * 100)
print('done')
"""
    result = anyio.run(call, {"code": code})
    assert result.is_error is False, result
    sc = result.structured_content
    names = [f["name"] for f in sc["files"]]
    assert names == [f"f{i:02}.txt" for i in range(20)], names
    reasons = {o["name"]: o["reason"] for o in sc["filesOmitted"]}
    assert reasons["passwd"] == reasons["environ"] == reasons["fifo"] == reasons["dir"] == "notARegularFile"
    assert reasons["big.bin"] == "byteCount"
    assert {reasons[f"f{i}.txt"] for i in range(20, 25)} == {"fileCount"}
    everything = json.dumps([c.model_dump() for c in result.content]) + json.dumps(sc)
    assert "root:x:0:0" not in everything
    notes = [c.text for c in result.content if c.type == "text" and "were not returned" in c.text]
    assert notes and "big.bin (byteCount)" in notes[0], result.content
    # The stored run stays far below etcd's object limit.
    raw = subprocess.run([KUBECTL, "-n", NAMESPACE, "get", "sandboxrun", sc["runName"], "-o", "json"],
                         check=True, capture_output=True).stdout
    assert len(raw) < 512 * 1024, len(raw)


def test_input_names_that_could_escape_are_refused_by_the_frontend_and_the_crd():
    result = anyio.run(call, {"code": "print(1)", "files": [{"name": "../escape", "text": "x"}]})
    assert result.is_error is True
    assert "files[0] has the name" in result.content[0].text
    # Written directly, past the frontend: the API server refuses the resource.
    manifest = {
        "apiVersion": "sandboxrun.dev/v1alpha1", "kind": "SandboxRun",
        "metadata": {"generateName": "files-escape-", "namespace": NAMESPACE},
        "spec": {"agent": "e2e-direct", "python": {
            "code": "print(open('/tmp/inputs/../x').read())",
            "files": [{"name": "../x", "content": base64.b64encode(b"x").decode()}]}},
    }
    created = subprocess.run([KUBECTL, "create", "-f", "-"], input=json.dumps(manifest),
                             capture_output=True, text=True)
    assert created.returncode != 0, created.stdout
    assert "files" in created.stderr, created.stderr

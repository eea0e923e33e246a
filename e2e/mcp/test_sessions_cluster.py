"""run_python sessions on the cluster, through the official Python MCP SDK and the frontend's
NodePort: each session is a SandboxSession with one gVisor Pod of its own, each call a SandboxRun
that the operator sends to that Pod's runner. State and files kept between calls; a session only
its agent can use (another agent naming it is told what an unknown id is told); two calls at
once run one after the other; two sessions in two sandboxes (two boot ids); hostile and forging code inside a session, a thread left writing;
close_session and the policy's idle timeout take the session and its Pod away; the operator
killed during a call: the call ends once, with its result, and the session goes on.

Environment (set by e2e/run-tests.sh): MCP_URL, MCP_API_KEY, KUBECTL."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

import faults
import stress
from operator_audit import SYSTEM_NS, the_audit_line

URL = os.environ["MCP_URL"]
KEY = os.environ["MCP_API_KEY"]
KUBECTL = os.environ.get("KUBECTL", "kubectl")
NAMESPACE = "sandboxrun-runs"
UNKNOWN = "sbs-00000000000000000000000000000000"


def kubectl(*args: str) -> str:
    return subprocess.run([KUBECTL, *args], check=True, capture_output=True, text=True).stdout


def kubectl_json(*args: str):
    return json.loads(kubectl(*args, "-o", "json"))


def session_object(sid: str) -> dict | None:
    found = subprocess.run([KUBECTL, "-n", NAMESPACE, "get", "sandboxsession", sid, "-o", "json"],
                           capture_output=True, text=True)
    return json.loads(found.stdout) if found.returncode == 0 else None


def pod_exists(name: str) -> bool:
    found = subprocess.run([KUBECTL, "-n", NAMESPACE, "get", "pod", name, "-o", "json"],
                           capture_output=True, text=True)
    return found.returncode == 0 and not json.loads(found.stdout)["metadata"].get("deletionTimestamp")


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.5)


@contextlib.asynccontextmanager
async def mcp(key: str = KEY):
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=240))
        read, write, *_ = await stack.enter_async_context(streamable_http_client(URL, http_client=client))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        yield session


async def run(session, code: str, sid: str | None = None):
    args = {"code": code}
    if sid is not None:
        args["session"] = sid
    return await session.call_tool("run_python", args, read_timeout_seconds=230)


def ok(r) -> dict:
    assert r.is_error is False, r.content
    return r.structured_content


def test_state_files_and_pods_of_sessions_and_only_their_agent_reaches_them():
    other_key = stress.agent_key(7)

    async def main():
        async with mcp() as s, mcp(other_key) as other:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert "close_session" in tools, sorted(tools)

            first = ok(await run(s, "x = 41\nopen('notes.txt', 'w').write('kept')\n"
                                    "print(open('/proc/sys/kernel/random/boot_id').read().strip())",
                                 "new"))
            sid = first["session"]
            assert sid.startswith("sbs-"), first
            got = ok(await run(s, "print(x + 1, open('notes.txt').read())", sid))
            assert got["stdout"] == "42 kept\n", got
            assert got["session"] == sid and "sessionEnded" not in got, got

            # The session and its own sandbox Pod, in gVisor, with a run's isolation.
            # Given back (Ready, the call counted) once the call's end is recorded.
            obj = wait_for(lambda: (o := session_object(sid)) and o["status"].get("calls") == 2 and o,
                           30, "the session given back after 2 calls")
            assert obj["status"]["phase"] == "Ready", obj["status"]
            pod = kubectl_json("-n", NAMESPACE, "get", "pod", obj["status"]["podName"])
            spec = pod["spec"]
            assert spec["runtimeClassName"] == "gvisor", spec.get("runtimeClassName")
            assert spec["automountServiceAccountToken"] is False
            container = spec["containers"][0]
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "SandboxSession"

            # A second session: another sandbox, nothing shared.
            second = ok(await run(s, "print(open('/proc/sys/kernel/random/boot_id').read().strip(),"
                                     " 'x' in globals())", "new"))
            boot, seen = second["stdout"].split()
            assert second["session"] != sid
            assert boot != first["stdout"].strip(), "two sessions in one sandbox"
            assert seen == "False", second

            # Another agent naming the id, and an id nobody has: the same answer.
            theirs = await run(other, "print(x)", sid)
            unknown = await run(other, "print(x)", UNKNOWN)
            for r in (theirs, unknown):
                assert r.is_error is True
                assert (r.structured_content["phase"], r.structured_content["reason"]) == (
                    "Rejected", "SessionNotFound"), r.structured_content
                assert r.structured_content["stdout"] == ""
            assert theirs.content[0].text.replace(sid, "ID") == unknown.content[0].text.replace(UNKNOWN, "ID")
            r = await other.call_tool("close_session", {"session": sid})
            assert r.is_error is True, r.content
            assert session_object(sid) is not None, "another agent closed the session"

            # A call without `session` does not see it; its owner still does.
            assert ok(await run(s, "print('x' in globals())"))["stdout"] == "False\n"
            assert ok(await run(s, "print(x)", sid))["stdout"] == "41\n"

            # Closing takes the session and its Pod away.
            pod_name = obj["status"]["podName"]
            for closing in (sid, second["session"]):
                r = await s.call_tool("close_session", {"session": closing})
                assert r.is_error is False, r.content
            r = await run(s, "print(x)", sid)
            assert r.structured_content["reason"] == "SessionNotFound", r.structured_content
            wait_for(lambda: not pod_exists(pod_name), 60, f"session Pod {pod_name} deleted")

    anyio.run(main)


def test_two_calls_at_once_in_one_session_run_one_after_the_other():
    call = ("import time\nt0 = time.monotonic()\ntime.sleep(1)\n"
            "runs.append((t0, time.monotonic()))\nprint(len(runs))")

    async def main():
        async with mcp() as s, mcp() as t:
            sid = ok(await run(s, "runs = []", "new"))["session"]
            try:
                both = []

                async def one(session):
                    both.append(ok(await run(session, call, sid))["stdout"])

                async with anyio.create_task_group() as tg:
                    tg.start_soon(one, s)
                    tg.start_soon(one, t)
                assert sorted(both) == ["1\n", "2\n"], both
                # One interpreter's clock: the second began after the first had ended.
                got = ok(await run(s, "print(runs[0][1] <= runs[1][0])", sid))
                assert got["stdout"] == "True\n", got
                # Given back after each call's end is recorded: counted a moment later.
                wait_for(lambda: session_object(sid)["status"].get("calls") == 4, 30, "4 calls counted")
            finally:
                await s.call_tool("close_session", {"session": sid})

    anyio.run(main)


def test_closing_a_session_stops_the_call_running_in_it():
    async def main():
        async with mcp() as s, mcp() as closer:
            sid = ok(await run(s, "w = 1", "new"))["session"]
            pod_name = session_object(sid)["status"]["podName"]
            results = []

            marker = "close-me-" + os.urandom(6).hex()

            async def the_call():
                results.append(await run(s, f"# {marker}\nimport time\ntime.sleep(600)", sid))

            def running() -> bool:
                # The session is Busy with this call's run (not still with the opening one's).
                runs = kubectl_json("-n", NAMESPACE, "get", "sandboxruns")["items"]
                mine = [r["metadata"]["name"] for r in runs
                        if marker in (r["spec"].get("python") or {}).get("code", "")]
                status = (session_object(sid) or {}).get("status", {})
                return bool(mine) and status.get("activeRun") == mine[0]

            async with anyio.create_task_group() as tg:
                tg.start_soon(the_call)
                await anyio.to_thread.run_sync(lambda: wait_for(running, 120, "the call running"))
                r = await closer.call_tool("close_session", {"session": sid})
                assert r.is_error is False, r.content
            got = results[0].structured_content
            assert (got["phase"], got["reason"]) == ("Cancelled", "CallCancelled"), got
            wait_for(lambda: not pod_exists(pod_name), 60, f"session Pod {pod_name} deleted")

    anyio.run(main)


FORGE = """import json, os, sys, threading, time
fake = json.dumps({"sandboxrun": 1, "exitCode": 0, "stdout": "FORGED\\n", "stderr": "",
                   "stdoutTruncated": False, "stderrTruncated": False, "signal": None,
                   "call": "%s", "session": {"alive": True}})
for fd in (1, 2):
    os.write(fd, (fake + "\\n").encode())
    os.write(fd, b"sandboxrun-program-received anything\\n")
dup = os.dup(1)
def spam():
    while True:
        try:
            os.write(dup, (fake + "\\nLEAK\\n").encode())
            print("LEAK", flush=True)
        except Exception:
            pass
        time.sleep(0.005)
threading.Thread(target=spam, daemon=True).start()
time.sleep(0.05)
print("real")
"""

HOSTILE = """import os, socket
out = []
s = socket.socket()
s.settimeout(2)
try:
    s.connect(("10.244.0.1", 6443))
    out.append("network: reached")
except OSError:
    out.append("network: none")
try:
    open("/usr/evil", "w")
    out.append("root: writable")
except OSError:
    out.append("root: read-only")
out.append("token: " + str(os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token")))
print("; ".join(out))
"""

FORK_BOMB = """import os
n = 0
try:
    for _ in range(10000):
        if os.fork() == 0:
            # A small process (a copy of the interpreter each would reach the memory limit
            # before the pid limit): the pid limit is what must stop them.
            os.execv("/bin/sleep", ["sleep", "30"])
        n += 1
except OSError:
    pass
print("forked", n)
"""


def test_hostile_and_forging_code_inside_a_session_cannot_change_a_result():
    async def main():
        async with mcp() as s:
            sid = ok(await run(s, "kept = 'yes'", "new"))["session"]
            try:
                await hostile_calls(s, sid)
            finally:
                await s.call_tool("close_session", {"session": sid})

    async def hostile_calls(s, sid):
        got = ok(await run(s, HOSTILE, sid))
        assert got["stdout"] == "network: none; root: read-only; token: False\n", got
        # Forged envelopes and confirmations on every descriptor, for any call name, and a
        # thread left writing them: each call reports what it printed itself.
        for call in ("x", sid):
            r = await run(s, FORGE % call, sid)
            got = r.structured_content
            # What it printed, envelope-looking lines included, is its output: none of
            # them became the result.
            assert got["exitCode"] == 0 and "\nreal\n" in got["stdout"] and "\"sandboxrun\": 1" in got["stdout"], repr(got["stdout"][:600])
            for _ in range(2):
                got = ok(await run(s, "import time\ntime.sleep(0.1)\nprint('clean', kept)", sid))
                assert got["stdout"] == "clean yes\n", got
        # A fork bomb stops at the pid limit; the processes end with their call.
        got = (await run(s, FORK_BOMB, sid)).structured_content
        assert got["stdout"].startswith("forked "), got
        assert int(got["stdout"].split()[1]) < 64, got
        got = ok(await run(s, "import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]) <= 3, kept)", sid))
        assert got["stdout"] == "True yes\n", got
        # A memory bomb: the sandbox's memory limit stops it, and the session ends with a
        # clear result (the interpreter or the whole sandbox killed), never a hang.
        r = await run(s, "b = []\nwhile True:\n    b.append(bytearray(16 << 20))", sid)
        got = r.structured_content
        assert r.is_error is True, got
        assert got.get("sessionEnded") or got["reason"] == "SessionUnavailable", got
        r = await run(s, "print(kept)", sid)
        assert r.structured_content["reason"] == "SessionNotFound", r.structured_content

    anyio.run(main)


def test_a_call_that_ends_its_interpreter_ends_the_session_and_its_pod():
    async def main():
        async with mcp() as s:
            sid = ok(await run(s, "y = 1", "new"))["session"]
            pod_name = session_object(sid)["status"]["podName"]
            r = await run(s, "import os\nos._exit(3)", sid)
            assert r.is_error is True
            assert r.structured_content["exitCode"] == 3, r.structured_content
            assert "sessionEnded" in r.structured_content, r.structured_content
            r = await run(s, "print(y)", sid)
            assert r.structured_content["reason"] == "SessionNotFound", r.structured_content
            status = session_object(sid)["status"]
            assert (status["phase"], status["endReason"]) == ("Ended", "InterpreterExited"), status
            wait_for(lambda: not pod_exists(pod_name), 60, f"session Pod {pod_name} deleted")

    anyio.run(main)


@pytest.mark.waits
def test_a_session_idle_past_its_timeout_is_gone_with_its_pod():
    # e2e/values-governance.yaml: this agent's sessions end after 10 s without a call.
    async def main():
        async with mcp(stress.sessions_key()) as s:
            sid = ok(await run(s, "z = 1", "new"))["session"]
            obj = session_object(sid)
            assert obj["spec"]["idleTimeoutSeconds"] == 10, obj["spec"]
            pod_name = obj["status"]["podName"]
            status = wait_for(lambda: (session_object(sid) or {}).get("status", {}).get("phase") == "Ended"
                              and session_object(sid)["status"], 90, "the idle session ended")
            assert status["endReason"] == "IdleTimeout", status
            wait_for(lambda: not pod_exists(pod_name), 60, f"session Pod {pod_name} deleted")
            r = await run(s, "print(z)", sid)
            assert r.structured_content["reason"] == "SessionNotFound", r.structured_content

    anyio.run(main)


def audit_lines_before_restart(run_name: str) -> list[dict]:
    """The audit lines about the run on the log of the operator containers before their restart."""
    pods = kubectl_json("-n", SYSTEM_NS, "get", "pods", "-l", "app.kubernetes.io/component=operator")
    lines = []
    for pod in pods["items"]:
        log = subprocess.run([KUBECTL, "-n", SYSTEM_NS, "logs", "--previous", pod["metadata"]["name"],
                              "--tail=-1"], capture_output=True, text=True).stdout
        for line in log.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("target") == "audit" and entry.get("fields", {}).get("run") == run_name:
                lines.append(entry["fields"])
    return lines


@pytest.mark.quiet_cluster
def test_the_operator_killed_during_a_call_the_call_ends_once_and_the_session_goes_on():
    # Quiet: the other tests read audit lines from the operator's current log, which a restart
    # starts anew.
    marker = "restart-" + os.urandom(6).hex()
    slow = f"# {marker}\nimport time\nprint('started', flush=True)\ntime.sleep(20)\nn += 1\nprint('n', n)"

    def the_run() -> dict | None:
        runs = kubectl_json("-n", NAMESPACE, "get", "sandboxruns")["items"]
        found = [r for r in runs if marker in (r["spec"].get("python") or {}).get("code", "")]
        assert len(found) <= 1, [r["metadata"]["name"] for r in found]
        return found[0] if found else None

    async def main():
        async with mcp() as s:
            sid = ok(await run(s, "n = 0", "new"))["session"]
            results = []

            async def the_call():
                results.append(await run(s, slow, sid))

            async with anyio.create_task_group() as tg:
                tg.start_soon(the_call)
                # The call runs in the session: then the operator dies.
                run_obj = await anyio.to_thread.run_sync(lambda: wait_for(
                    lambda: (r := the_run()) and r.get("status", {}).get("phase") == "Running" and r,
                    120, "the call running"))
                killed = faults.kill_operator(faults.pod_of(faults.leader()))
                status = the_run()["status"]
                # The fault took effect: the call had not ended when its operator died.
                assert status["phase"] == "Running", f"the call ended before {killed} was killed: {status}"
                await anyio.to_thread.run_sync(lambda: wait_for(faults.killed_and_replaced, 120,
                                                                "the operator replaced"))
            got = ok(results[0])
            assert got["stdout"] == "started\nn 1\n", got
            assert got["session"] == sid and "sessionEnded" not in got, got
            # Once: one audit line (by the operator that restarted), the code ran once.
            name = run_obj["metadata"]["name"]
            line = the_audit_line(name)
            assert line["phase"] == "Succeeded", line
            assert not audit_lines_before_restart(name), "the killed operator wrote its audit line too"
            assert ok(await run(s, "print('n', n)", sid))["stdout"] == "n 1\n"
            wait_for(lambda: session_object(sid)["status"].get("calls") == 3, 30, "3 calls counted")
            assert session_object(sid)["status"]["phase"] == "Ready"
            await s.call_tool("close_session", {"session": sid})

    anyio.run(main)

"""Many agents calling at once through the frontend in the cluster, and the checks that every call
ended exactly once: shared by the load suite (load.py) and the fault suite (faults.py).

Each agent has its own API key (derived from MCP_API_KEY, see `agent_key`; e2e/run-tests.sh
installs them with `stress.py keys N`) and its own Streamable HTTP session, and makes its calls
one after another. Every call carries a token of its own (in the code, the query's comment, a
PromQL matcher), so afterwards each answer can be matched to exactly one SandboxRun and each run
to exactly one audit line:

- lost: a call that got no answer (a transport error, a protocol error, no run named);
- duplicated: a token found in two runs, an answer naming another call's run, a run with two
  audit lines or two sandbox Pods;
- every run in a terminal phase, no sandbox Pod left behind;
- a floor of successes (`floors`): a suite whose calls all fail, or are all refused, has
  nothing lost or duplicated, and must still fail. Each kind of call has an outcome it should
  have (`succeeded`), and each kind must reach it for a share of its calls.

Environment: MCP_URL, MCP_API_KEY, KUBECTL (with KUBECONFIG), as for the e2e/mcp suite.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import glob
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

URL = os.environ.get("MCP_URL", "")
KEY = os.environ.get("MCP_API_KEY", "")
KUBECTL = os.environ.get("KUBECTL", "kubectl")
RUNS_NS = "sandboxrun-runs"
TERMINAL = ("Succeeded", "Failed", "TimedOut", "Rejected", "Cancelled")
SYSTEM_NS = "sandboxrun-system"
# Where the kubelet of the local cluster (e2e/cluster/up.sh) keeps container logs.
POD_LOGS = "/var/log/pods"

# The mix of calls, by weight: warm-path Python (default limits, so the pool fits), Python that
# asks for a longer timeout (same path choice, a different program), a governed query, a metrics
# query, and a query the policy blocks (SELECT * in the sandbox).
MIX = [("python", 45), ("python_slow", 10), ("sql", 20), ("metrics", 15), ("blocked", 10)]


def agent_name(i: int) -> str:
    return f"load-{i:03d}"


def agent_key(i: int) -> str:
    """The API key of load agent i: derived from MCP_API_KEY, so only its holder knows them."""
    return hashlib.sha256(f"{KEY}:{agent_name(i)}".encode()).hexdigest()


# The agent of the suites' self-test against a frontend that refuses every call: its key may
# target production only, and every call of the mix targets the sandbox.
REFUSED_AGENT = "load-refused"


def refused_key() -> str:
    return hashlib.sha256(f"{KEY}:{REFUSED_AGENT}".encode()).hexdigest()


# An agent with a rule narrower than everyone's (e2e/values-governance.yaml, e2e-sql-narrow):
# the schema resource shows it less (e2e/mcp/test_resources_cluster.py).
NARROW_AGENT = "e2e-narrow"


def narrow_key() -> str:
    return hashlib.sha256(f"{KEY}:{NARROW_AGENT}".encode()).hexdigest()


# An agent whose sessions end after 10 s without a call (e2e/values-governance.yaml,
# e2e-sessions-short): e2e/mcp/test_sessions_cluster.py.
SESSIONS_AGENT = "e2e-sessions"


def sessions_key() -> str:
    return hashlib.sha256(f"{KEY}:{SESSIONS_AGENT}".encode()).hexdigest()


def keys_values(n: int, base_agent: str) -> str:
    """Helm values (JSON is YAML) with the base key, n load agents' keys, the refused agent's,
    the narrow agent's and the short sessions agent's keys, hashed."""
    sha = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    keys = [{"agent": base_agent, "sha256": sha(KEY),
             "environments": ["sandbox", "staging", "production"]}]
    keys += [{"agent": agent_name(i), "sha256": sha(agent_key(i)), "environments": ["sandbox"]}
             for i in range(n)]
    keys.append({"agent": REFUSED_AGENT, "sha256": sha(refused_key()),
                 "environments": ["production"]})
    keys.append({"agent": NARROW_AGENT, "sha256": sha(narrow_key()), "environments": ["sandbox"]})
    keys.append({"agent": SESSIONS_AGENT, "sha256": sha(sessions_key()), "environments": ["sandbox"]})
    return json.dumps({"frontend": {"apiKeys": keys}})


def kubectl(*args: str) -> str:
    done = subprocess.run([KUBECTL, *args], capture_output=True, text=True)
    if done.returncode != 0:
        # Say what kubectl said: a bare CalledProcessError hides why a suite stopped.
        raise RuntimeError(f"kubectl {' '.join(args)} failed ({done.returncode}): "
                           f"{done.stderr.strip()[:2000]}")
    return done.stdout


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclasses.dataclass
class Call:
    agent: str
    kind: str
    token: str
    started: float = 0.0
    ms: float = 0.0
    answers: int = 0
    error: str | None = None      # no answer: what happened instead
    is_error: bool | None = None  # the tool's own isError
    run: str | None = None
    phase: str | None = None
    text: str = ""
    reason: str | None = None
    retry_after: int | None = None  # a refusal for capacity: the hint, in seconds

    @property
    def refused_for_capacity(self) -> bool:
        """No sandbox could start it in time: refused at once with a hint, and tried again."""
        return self.phase == "Rejected" and self.reason == "NoCapacity"


def arguments(kind: str, token: str) -> tuple[str, dict]:
    if kind == "python":
        return "run_python", {"code": f"print({token!r})"}
    if kind == "python_slow":
        return "run_python", {"code": f"import time\ntime.sleep(0.5)\nprint({token!r})",
                              "timeoutSeconds": 60}
    if kind == "sql":
        return "execute_sql", {"database": "analytics", "environment": "sandbox",
                               "query": f"/* {token} */ SELECT id, amount FROM ledger ORDER BY id LIMIT 3"}
    if kind == "metrics":
        return "fetch_metrics", {"query": f'up{{job="prometheus", call!="{token}"}}'}
    if kind == "blocked":
        return "execute_sql", {"database": "analytics", "environment": "sandbox",
                               "query": f"/* {token} */ SELECT * FROM ledger"}
    raise ValueError(kind)


def succeeded(call: Call) -> bool:
    """Whether the call had the outcome its kind should have on a working system: its code or
    query ran and succeeded, or (the blocked kind) the policy blocked it, and the answer was the
    call's own."""
    if not call.answers or call.error:
        return False
    if call.kind == "blocked":
        return bool(call.phase) and "blocked by policy" in call.text
    return not call.is_error and call.phase == "Succeeded"


def floors(calls: list[Call], share: float) -> list[str]:
    """The floor of successes: every kind of call that was made reached its outcome for at least
    `share` of its calls, and at least once (share 0: at least once)."""
    if not calls:
        return ["floor: no call was made at all"]
    problems = []
    for kind, _ in MIX:
        # A call refused for capacity was made again after its hint: the retry counts.
        cs = [c for c in calls if c.kind == kind and not c.refused_for_capacity]
        if not cs:
            continue
        ok = sum(1 for c in cs if succeeded(c))
        if ok == 0 or ok < share * len(cs):
            why = collections.Counter((c.error or c.text)[:100] for c in cs if not succeeded(c))
            problems.append(f"floor: {kind}: {ok} of {len(cs)} calls succeeded (at least "
                            f"{max(share, 1 / len(cs)):.0%} required); the others: "
                            f"{dict(why.most_common(3))}")
    return problems


def expected(call: Call, structured: dict) -> str | None:
    """What is wrong with an answer, or None."""
    if call.kind in ("python", "python_slow"):
        if structured.get("phase") == "Succeeded" and structured.get("stdout") != f"{call.token}\n":
            return f"stdout {structured.get('stdout')!r} is not the call's own"
    if call.kind == "blocked" and call.phase and "blocked by policy" not in call.text:
        return "a SELECT * was not blocked"
    return None


# How often one call refused for capacity is made again (after each refusal's hint) before the
# agent moves on to its next call.
MAX_CAPACITY_RETRIES = 5

# How long a call may go unanswered before it counts as lost (--call-timeout); the default is the
# HTTP client's own limit.
CALL_TIMEOUT = 300.0


async def pause(seconds: float, stop: asyncio.Event | None) -> None:
    """Sleeps `seconds`, or until `stop` is set."""
    if stop is None:
        await asyncio.sleep(seconds)
        return
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


async def agent_loop(index: int, calls: int, out: list[Call], stop: asyncio.Event | None,
                     key: str | None = None, pace: float = 0.0,
                     mix: list[tuple[str, int]] | None = None) -> None:
    """One agent: one session, `calls` calls one after another (or until `stop` is set). A
    session that cannot be opened costs the call it was opened for (recorded as lost), so an
    agent whose every session is refused still ends."""
    name = agent_name(index)
    headers = {"Authorization": f"Bearer {key or agent_key(index)}"}
    weights = [w for _, w in mix or MIX]
    kinds = [k for k, _ in mix or MIX]
    rng = __import__("random").Random(index)
    n = refusals = 0
    while n < calls and not (stop and stop.is_set()):
        made = len(out)
        try:
            async with httpx2.AsyncClient(headers=headers, timeout=300) as client:
                async with streamable_http_client(URL, http_client=client) as streams:
                    async with ClientSession(streams[0], streams[1]) as session:
                        await session.initialize()
                        while n < calls and not (stop and stop.is_set()):
                            kind = rng.choices(kinds, weights)[0]
                            call = Call(agent=name, kind=kind, token=f"tok-{uuid.uuid4().hex[:16]}")
                            out.append(call)
                            await one_call(session, call)
                            if call.refused_for_capacity and refusals < MAX_CAPACITY_RETRIES:
                                # What a well-behaved agent does: the same call, after the hint.
                                refusals += 1
                                await pause(call.retry_after or 1, stop)
                                continue
                            n += 1
                            refusals = 0
                            if call.error and ("session" in call.error.lower()
                                               or call.error.startswith("no answer")):
                                break  # a new session for the next call
                            if pace:
                                await asyncio.sleep(pace)
        except Exception as e:  # noqa: BLE001 - a session that broke; the call in it is recorded
            mine = [c for c in out[made:] if c.agent == name]
            if mine and mine[-1].answers == 0 and mine[-1].error is None:
                mine[-1].error = f"session: {type(e).__name__}: {e}"
            elif not mine:
                kind = rng.choices(kinds, weights)[0]
                out.append(Call(agent=name, kind=kind, token=f"tok-{uuid.uuid4().hex[:16]}",
                                started=time.time(),
                                error=f"session: {type(e).__name__}: {e}"))
                n += 1
            await asyncio.sleep(1)


async def one_call(session: ClientSession, call: Call) -> None:
    tool, args = arguments(call.kind, call.token)
    call.started = time.time()
    t0 = time.perf_counter()
    try:
        r = await asyncio.wait_for(session.call_tool(tool, args), CALL_TIMEOUT)
    except TimeoutError:
        call.error = f"no answer within {CALL_TIMEOUT:.0f} s"
        call.ms = (time.perf_counter() - t0) * 1000
        return
    except Exception as e:  # noqa: BLE001 - recorded as a call without an answer
        call.error = f"{type(e).__name__}: {e}"
        call.ms = (time.perf_counter() - t0) * 1000
        return
    call.ms = (time.perf_counter() - t0) * 1000
    call.answers += 1
    call.is_error = bool(r.is_error)
    call.text = " ".join(getattr(c, "text", "") for c in r.content)
    sc = r.structured_content or {}
    call.run = sc.get("runName")
    call.phase = sc.get("phase")
    call.reason = sc.get("reason")
    call.retry_after = sc.get("retryAfterSeconds")
    wrong = expected(call, sc)
    if wrong:
        call.error = f"wrong answer: {wrong}"


def runs_by_token() -> tuple[dict[str, list[dict]], list[dict]]:
    items = json.loads(kubectl("-n", RUNS_NS, "get", "sandboxruns", "-o", "json"))["items"]
    found: dict[str, list[dict]] = collections.defaultdict(list)
    for run in items:
        spec = run["spec"]
        text = (spec.get("python") or {}).get("code", "") + (spec.get("sql") or {}).get("query", "") \
            + (spec.get("metrics") or {}).get("query", "")
        start = text.find("tok-")
        if start >= 0:
            found[text[start:start + 20]].append(run)
    return found, items


class Poller:
    """Reads something (`poll`) every fraction of a second on a thread of its own, from `start`
    until `stop`, and once more at each: the node's log files, which go with their Pods, are read
    while they are there."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self.poll()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self.poll()

    def poll(self) -> None:
        raise NotImplementedError


class AuditTail(Poller):
    """Reads the operator's audit lines straight from the node's container log files, every
    fraction of a second, so lines of operator containers that were killed, restarted or
    deleted meanwhile are kept (`kubectl logs` shows only the current and the previous one).
    Every other line that names a run is kept too, by run (`trail`): what a problem's run went
    through, from every operator that touched it, for the report to show."""

    def __init__(self) -> None:
        super().__init__()
        self.offsets: dict[str, int] = {}
        self.lines: list[dict] = []
        self.by_run: dict[str, list[str]] = collections.defaultdict(list)

    def poll(self) -> None:
        for path in glob.glob(f"{POD_LOGS}/{SYSTEM_NS}_*operator*/operator/*.log*"):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            for raw in data[:end].splitlines():
                # CRI log format: <time> <stream> <P|F> <content>
                parts = raw.split(b" ", 3)
                if len(parts) < 4:
                    continue
                try:
                    entry = json.loads(parts[3])
                except ValueError:
                    continue
                fields = entry.get("fields") or {}
                if entry.get("target") == "audit":
                    self.lines.append(fields)
                elif isinstance(fields.get("run"), str):
                    # The Pod's directory names the operator Pod: which replica said it.
                    replica = path.split("/")[-3].split("_")[1] if path.count("/") >= 3 else "?"
                    rest = {k: v for k, v in fields.items() if k not in ("message", "run")}
                    self.by_run[fields["run"]].append(
                        f"{entry.get('timestamp', '?')} {replica} {entry.get('level', '?')} "
                        f"{fields.get('message', '')} {json.dumps(rest)[:400]}")

    def trail(self, run: str) -> list[str]:
        """The operator's log lines that name `run`, in the order they were read."""
        return self.by_run.get(run, [])


def check(calls: list[Call], audit: list[dict] | None, since: float,
          operator_killed: bool = False) -> list[str]:
    """Every exactly-once check; returns the problems found (empty: all held).

    A run's audit line is owed until the operator records it written (its `Audited` condition):
    an operator killed between the line and that record leaves it owed, and the next one writes
    it again. So with `operator_killed` a run may have more than one line, all identical; never
    none, and never two that differ."""
    problems: list[str] = []
    lost = [c for c in calls if c.answers == 0]
    for c in lost[:10]:
        problems.append(f"lost: {c.agent} {c.kind} {c.token}: {c.error}")
    if len(lost) > 10:
        problems.append(f"... and {len(lost) - 10} more lost calls")
    wrong = [c for c in calls if c.answers and c.error]
    for c in wrong[:10]:
        problems.append(f"wrong: {c.agent} {c.kind} {c.token}: {c.error}")
    by_token, items = runs_by_token()
    by_name = {r["metadata"]["name"]: r for r in items}
    for c in calls:
        # An error answer that names no run says the call did not happen ("could not create",
        # "did not finish"): then there must be no run, or the frontend cancelled the run it
        # gave up on. A run that went on to a result nobody received is a lost answer.
        if c.answers and c.is_error and not c.phase and by_token.get(c.token) and \
                (by_token[c.token][0].get("status") or {}).get("phase") != "Cancelled":
            run = by_token[c.token][0]
            problems.append(f"answered without its run: {c.token} got {c.text[:160]!r} but "
                            f"{run['metadata']['name']} exists "
                            f"({(run.get('status') or {}).get('phase')})")
    for c in calls:
        runs = by_token.get(c.token, [])
        if len(runs) > 1:
            problems.append(f"duplicated: {c.token} has {len(runs)} runs: "
                            f"{[r['metadata']['name'] for r in runs]}")
        if c.answers and c.run and runs and c.run != runs[0]["metadata"]["name"]:
            problems.append(f"duplicated: {c.token} answered with {c.run}, its run is "
                            f"{runs[0]['metadata']['name']}")
        if c.answers and c.run and c.run in by_name and c.run not in [r["metadata"]["name"] for r in runs]:
            problems.append(f"crossed: {c.token} answered with another call's run {c.run}")
    for c in calls:
        for run in by_token.get(c.token, []):
            phase = (run.get("status") or {}).get("phase")
            if phase not in TERMINAL:
                problems.append(f"not ended: {run['metadata']['name']} ({c.kind}) is {phase}")
            elif audited(run) != "True":
                # Written through the API server by its own field manager: the record that the
                # line is out, which an operator that restarts relies on.
                problems.append(f"audit owed: {run['metadata']['name']} ({c.kind}) has its "
                                f"Audited condition {audited(run)}")
    if audit is not None:
        per_run: dict[str, list[dict]] = collections.defaultdict(list)
        for line in audit:
            per_run[line.get("run")].append(line)
        for c in calls:
            for run in by_token.get(c.token, []):
                name = run["metadata"]["name"]
                lines = per_run.get(name, [])
                # A line written again is the same line; only its duration may differ (to the
                # second: the API server keeps the completion time in whole seconds).
                bare = [{k: v for k, v in line.items() if k != "duration_ms"} for line in lines]
                same = all(b == bare[0] for b in bare)
                if len(lines) == 1 or (lines and operator_killed and same):
                    if len(lines) > 1:
                        print(f"note: {name} has {len(lines)} identical audit lines (written "
                              "again after an operator was killed before recording it)")
                    continue
                problems.append(f"audit: {name} ({c.kind}, {c.token}) has {len(lines)} audit "
                                f"lines{'' if same else ', not identical'}")
    left = json.loads(kubectl("-n", RUNS_NS, "get", "pods", "-l", "sandboxrun.dev/run", "-o", "json"))
    for pod in left["items"]:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        problems.append(f"left behind: Pod {pod['metadata']['name']} ({pod['status'].get('phase')})")
    return problems


def audited(run: dict) -> str | None:
    """The status of a run's `Audited` condition (None: it has none)."""
    for c in (run.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Audited":
            return c.get("status")
    return None


def wait_ended(calls: list[Call], timeout: float = 180) -> None:
    """Waits until every run of these calls is terminal with its audit line recorded and no
    run's Pod is left (or times out: the checks then name what did not end)."""
    tokens = {c.token for c in calls}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        by_token, _ = runs_by_token()
        open_runs = [r for t in tokens for r in by_token.get(t, [])
                     if (r.get("status") or {}).get("phase") not in TERMINAL
                     or audited(r) != "True"]
        pods = json.loads(kubectl("-n", RUNS_NS, "get", "pods", "-l", "sandboxrun.dev/run", "-o",
                                  "json"))["items"]
        if not open_runs and not [p for p in pods if not p["metadata"].get("deletionTimestamp")]:
            return
        time.sleep(2)


def report(calls: list[Call], wall: float) -> str:
    """Markdown: answers and p50/p99 per tool, outcomes, throughput."""
    lines = ["| kind | calls | answered | tool errors | p50 ms | p99 ms | outcomes |",
             "|---|---|---|---|---|---|---|"]
    for kind, _ in MIX:
        cs = [c for c in calls if c.kind == kind]
        if not cs:
            continue
        answered = [c for c in cs if c.answers]
        outcomes = collections.Counter(c.phase or ("error" if c.is_error else "?") for c in answered)
        lines.append(f"| {kind} | {len(cs)} | {len(answered)} | "
                     f"{sum(1 for c in answered if c.is_error)} | "
                     f"{pct([c.ms for c in answered], 50):.0f} | {pct([c.ms for c in answered], 99):.0f} | "
                     f"{', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))} |")
    errors = collections.Counter(c.text[:120] for c in calls if c.answers and c.is_error and not c.phase)
    if errors:
        lines.append("\nError answers without a phase (the call did not run):")
        lines += [f"- {n} × {text}" for text, n in errors.most_common()]
    refused = [c for c in calls if c.refused_for_capacity]
    if refused:
        ms = [c.ms for c in refused]
        hints = [c.retry_after or 0 for c in refused]
        lines.append(f"\nRefused for capacity (each made again after its hint): {len(refused)}, "
                     f"answered in p50 {pct(ms, 50):.0f} ms / max {max(ms):.0f} ms, "
                     f"{sum(1 for m in ms if m > 2000)} after more than 2 s; hints p50 "
                     f"{pct(hints, 50):.0f} s, max {max(hints)} s")
    done = sum(1 for c in calls if c.answers)
    lines.append(f"\n{len(calls)} calls, {done} answered in {wall:.0f} s: {done / wall:.1f} calls/s")
    return "\n".join(lines)


def verdict(problems: list[str], most: int = 60) -> int:
    """Prints the problems (or that all checks held); the exit status."""
    for p in problems[:most]:
        print(f"PROBLEM {p}")
    print("all checks held" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "keys":
        print(keys_values(int(sys.argv[2]), sys.argv[3]))
    else:
        raise SystemExit("usage: stress.py keys N BASE_AGENT  (helm values with the agents' keys)")

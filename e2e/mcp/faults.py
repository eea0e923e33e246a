"""The fault suite: agents keep calling through the frontend in the cluster while the components
under them fail, then every call must have ended exactly once (stress.check):

- the operator SIGKILLed, twice (its container restarts in place);
- sandbox Pods deleted under their runs, running ones and idle warm ones;
- the API server restarted (stopped, started again with the same command line);
- the kubelet stopped (SIGSTOP) and resumed (SIGCONT) after a while;
- a failover: the operator scaled to two replicas, the leader SIGKILLed, the standby takes over;
- an API server that answers errors and hangs: the operator is pointed at a fault-injecting
  proxy (api_proxy.py) that answers 30 % of its requests with 500, 503, 429 or 504 for a while,
  then holds 20 % of them for 8 s before passing them on.

Afterwards: every call got exactly one answer, every run reached one terminal phase, no run's
program reached two sandbox Pods (every Pod event in the runs namespace is watched during the
suite, and the sandboxes' own log files read for the runner's line that a program arrived: a
run may own a second Pod by design, a warm sandbox claimed and never sent its program), exactly
one audit line per run (read from the node's container log files, so the lines of killed
operator containers count too), no Pod left behind.

And the suite can fail for an outage, not only for a miscount: each fault is checked to have
taken effect (the killed processes died and others took their place, running sandboxes were
deleted, the kubelet was stopped, the proxy saw requests and failed or held some), each kind of
call still succeeded at least once, every call that failed overlapped a fault's window (the fault
and RECOVERY seconds after it), the Pod watch saw the sandbox of every Python run that
succeeded (but for runs in flight while the watch was reconnecting), and the sandboxes' logs
showed the program of most of them.

This drives the local cluster of e2e/cluster/up.sh on this machine: it signals the cluster's
processes (their pid files under the cluster's state directory) and reads /var/log/pods, so it
runs as root on the node. Usage (MCP_URL, MCP_API_KEY, KUBECTL as for the e2e/mcp suite):
    faults.py [--agents 6] [--rounds 1] [--pace 1.0] [--kills 2] [--faults kill,pods,...]
              [--call-timeout S] [--settle S] [--refused]

--rounds repeats the whole schedule (the full suite: e2e/BENCHMARKS.md); --pace scales its
pauses and --kills sets the operator SIGKILLs a round (CI: --pace 0.5 --kills 1); --faults picks
faults of the schedule (kill, pods, apiserver, kubelet, failover, proxy). Exit status 1 when a
check fails. Not collected by pytest.

Its self-tests (e2e/run-tests.sh), as the load suite's: --refused makes every agent call with the
key of an agent the frontend refuses everything, and with the operator scaled to 0 --call-timeout
counts a call unanswered for S seconds as lost and --settle bounds the wait for the runs to end;
both must fail the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import glob
import json
import os
import random
import re
import signal
import subprocess
import threading
import time
import urllib.request
import ssl

import stress
from api_proxy import FaultProxy

STATE = os.environ.get("SANDBOXRUN_CLUSTER_STATE", "/var/lib/sandboxrun-cluster")
OPERATOR = "sandboxrun-operator"
# Seconds after a fault ends in which a call may still fail because of it (a call whose run's
# Pod was deleted ends a little later; a run the frontend gave up on ends at its grace).
RECOVERY = 30.0

# (start, end, what) of every fault, in wall-clock seconds (time.time(), as stress.Call.started).
WINDOWS: list[tuple[float, float, str]] = []
# What did not take effect: a fault that did nothing proves nothing.
INEFFECTIVE: list[str] = []


@contextlib.contextmanager
def window(what: str):
    """Marks the fault's time: a call that fails while it lasts is explained by it."""
    start = time.time()
    try:
        yield
    finally:
        WINDOWS.append((start, time.time(), what))


def took_effect(ok: bool, what: str) -> None:
    if not ok:
        INEFFECTIVE.append(what)
        log(f"NOT IN EFFECT: {what}")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- the cluster's own processes ---------------------------------------------------------------

def component_pid(name: str) -> int:
    with open(f"{STATE}/pids/{name}.pid") as f:
        return int(f.read().strip())


def alive(pid: int) -> bool:
    """Whether process `pid` still runs. An exited process whose parent has not reaped it yet
    (a zombie: the cluster's processes are reparented to whichever ancestor reaps orphans, and
    that may be slow) still answers signal 0, so its state decides: measured in a CI dry run,
    where a replaced API server's old pid still answered 17 s after it exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The state follows the command's closing parenthesis (the command may hold spaces).
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def api_ready() -> bool:
    ctx = ssl.create_default_context(cafile=f"{STATE}/pki/ca.crt")
    try:
        with urllib.request.urlopen("https://10.244.0.1:6443/readyz", context=ctx, timeout=2) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - not ready yet
        return False


def restart_component(name: str, ready, timeout: float = 120) -> float:
    """Stops a cluster process (SIGTERM, SIGKILL after 15 s) and starts it again with the same
    command line, as e2e/cluster/up.sh did; returns the seconds until `ready()`."""
    pid = component_pid(name)
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    # The binary itself: up.sh found it on a PATH this process may not have.
    argv[0] = os.readlink(f"/proc/{pid}/exe")
    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    env = dict(kv.decode().split("=", 1) for kv in env if b"=" in kv)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    while alive(pid) and time.monotonic() - t0 < 15:
        time.sleep(0.1)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    logf = open(f"{STATE}/logs/{name}.log", "ab")
    proc = subprocess.Popen(argv, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL,
                            start_new_session=True, env=env)
    with open(f"{STATE}/pids/{name}.pid", "w") as f:
        f.write(str(proc.pid))
    while not ready():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"{name} not ready {timeout}s after its restart")
        time.sleep(0.2)
    return time.monotonic() - t0


def operator_processes() -> dict[int, str]:
    """pid → Pod name of every operator process on this node."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() != "operator":  # the image's /usr/local/bin/operator
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        pod = env.get(b"POD_NAME", b"").decode()
        if pod.startswith(OPERATOR):
            found[int(entry)] = pod
    return found


def leader() -> str:
    """The Lease's holder: `<Pod name>_<per-process id>` (operator/src/leader.rs), so a
    container restarted in the same Pod is a different holder."""
    return stress.kubectl("-n", stress.SYSTEM_NS, "get", "lease", OPERATOR, "-o",
                          "jsonpath={.spec.holderIdentity}").strip()


def pod_of(holder: str) -> str:
    """The Pod part of a Lease holder identity (Pod names have no '_')."""
    return holder.partition("_")[0]


KILLED: list[int] = []  # the operator processes SIGKILLed so far


def kill_operator(which: str | None = None) -> str:
    """SIGKILLs the operator process of Pod `which` (default: the only one)."""
    procs = operator_processes()
    targets = [pid for pid, pod in procs.items() if which in (None, pod)]
    if not targets:
        raise SystemExit(f"no operator process to kill ({which=}, found {procs})")
    for pid in targets:
        os.kill(pid, signal.SIGKILL)
    KILLED.extend(targets)
    return ", ".join(f"{procs[p]} pid {p}" for p in targets)


def killed_and_replaced() -> bool:
    """Every killed operator process is gone, and the operators running now are others."""
    return not any(alive(p) for p in KILLED) and not set(operator_processes()) & set(KILLED)


def operators_ready(n: int) -> bool:
    d = json.loads(stress.kubectl("-n", stress.SYSTEM_NS, "get", "deployment", OPERATOR, "-o", "json"))
    st = d.get("status", {})
    return st.get("readyReplicas", 0) == n and st.get("updatedReplicas", 0) == n \
        and st.get("replicas", 0) == n


def wait(pred, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)
    return time.monotonic() - t0


def delete_sandboxes(n: int, selector: str) -> list[str]:
    pods = json.loads(stress.kubectl("-n", stress.RUNS_NS, "get", "pods", "-l", selector, "-o",
                                     "json"))["items"]
    live = [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")]
    chosen = random.sample(live, min(n, len(live)))
    if not chosen:
        return []
    # A chosen Pod may be gone by now (its run ended, its pool replaced it): that one was not
    # deleted by the fault, and is not an error. Only the Pods kubectl deleted are reported.
    out = stress.kubectl("-n", stress.RUNS_NS, "delete", "pod", "--wait=false",
                         "--ignore-not-found", "-o", "name", *chosen)
    return [line.removeprefix("pod/") for line in out.split()]


# --- what happened to sandbox Pods --------------------------------------------------------------

class PodWatch:
    """Every Pod event in the runs namespace during the suite: which Pods each run owned. The
    watch is restarted whenever it breaks (the API server restart breaks it)."""

    def __init__(self) -> None:
        self.owners: dict[str, set[str]] = collections.defaultdict(set)
        # (from, until): when no watch was established (a Pod that lived only then is unseen).
        self.gaps: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "PodWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._proc:
            self._proc.kill()
        self._thread.join(timeout=10)

    def _record(self, pod: dict) -> None:
        # By uid (a Pod made again under the same name is another sandbox), named for the
        # reader: the schedule's log names the Pods its faults deleted.
        meta = pod["metadata"]
        for ref in meta.get("ownerReferences", []):
            if ref.get("kind") == "SandboxRun":
                self.owners[ref["name"]].add(f"{meta['name']} (uid {meta['uid']})")

    def _loop(self) -> None:
        decoder = json.JSONDecoder()
        # Until the first watch has listed, nothing is seen either.
        lost_at: float | None = time.time()
        while not self._stop.is_set():
            self._proc = subprocess.Popen(
                [stress.KUBECTL, "-n", stress.RUNS_NS, "get", "pods", "--watch", "-o", "json"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            buf = ""
            assert self._proc.stdout
            for chunk in iter(lambda: self._proc.stdout.readline(), ""):
                buf += chunk
                while True:
                    stripped = buf.lstrip()
                    if not stripped:
                        buf = ""
                        break
                    try:
                        obj, end = decoder.raw_decode(stripped)
                    except ValueError:
                        break
                    buf = stripped[end:]
                    if lost_at is not None:
                        # The first object of a new watch: it listed what exists (a generous
                        # gap end: the list came before this object was read).
                        self.gaps.append((lost_at, time.time()))
                        lost_at = None
                    items = obj.get("items", [obj]) if obj.get("kind") == "List" else [obj]
                    for pod in items:
                        self._record(pod)
            self._proc.wait()
            if lost_at is None:
                lost_at = time.time()
            self._stop.wait(0.5)


class ProgramsReceived(stress.Poller):
    """The sandbox Pods that received a program, read off their own log files on the node every
    fraction of a second (the runner writes its confirmation line to stdout as the program has
    arrived; a Pod's files go with the Pod, so they are read while it lives). Named as the Pod
    watch names them."""

    def __init__(self) -> None:
        super().__init__()
        self.pods: set[str] = set()

    def poll(self) -> None:
        for path in glob.glob(f"{stress.POD_LOGS}/{stress.RUNS_NS}_*/*/*.log*"):
            # <namespace>_<pod>_<uid>: neither a Pod's name nor its uid has an underscore.
            _, name, uid = os.path.basename(os.path.dirname(os.path.dirname(path))).split("_", 2)
            pod = f"{name} (uid {uid})"
            if pod in self.pods:
                continue
            try:
                with open(path, "rb") as f:
                    if PROGRAM_RECEIVED in f.read():
                        self.pods.add(pod)
            except OSError:
                continue


# The runner's line on its stdout once the whole program has arrived (core/src/runner.py).
PROGRAM_RECEIVED = b"sandboxrun-program-received"


def two_sandboxes(pods: PodWatch, programs: ProgramsReceived) -> list[str]:
    """Runs whose program reached two sandboxes. A run may own two by design, the first never
    sent its program: a warm sandbox claimed by an operator killed before it recorded the claim
    (the claim is recorded before the program is sent), then deleted before the next operator
    took it up, or taken up on other limits, and the run went cold. The sandbox's own log says
    which received a program."""
    problems = []
    for run, owned in pods.owners.items():
        received = sorted(owned & programs.pods)
        if len(received) > 1:
            problems.append(f"two sandboxes: run {run}'s program reached Pods {received}")
        elif len(owned) > 1:
            print(f"note: run {run} owned Pods {sorted(owned)}; only {received or 'none'} "
                  "received its program")
    return problems


# --- the schedule ---------------------------------------------------------------------------------

def schedule(stop_calls: threading.Event, rounds: int) -> list[str]:
    """Runs the faults one after another while the agents call; returns what was done."""
    done = []

    def step(what: str) -> None:
        log(what)
        done.append(what)

    try:
        run_faults(step, rounds)
    finally:
        stop_calls.set()
    return done


def operator_env(*assignments: str) -> None:
    """Sets (NAME=value) or removes (NAME-) environment variables of the operator's Deployment
    and waits for the rollout."""
    stress.kubectl("-n", stress.SYSTEM_NS, "set", "env", f"deployment/{OPERATOR}", *assignments)
    stress.kubectl("-n", stress.SYSTEM_NS, "rollout", "status", f"deployment/{OPERATOR}",
                   "--timeout=180s")
    # The new Pod acts only once it holds the Lease (the old one may keep it until it expires):
    # a fault phase started before would mostly meet an operator that waits.
    wait(lambda: len(procs := operator_processes()) == 1 and pod_of(leader()) in procs.values(), 120,
         "the new operator to lead")


PACE = 1.0  # --pace: the schedule's pauses are multiplied by it (CI runs a shorter schedule)
KILLS = 2   # --kills: SIGKILLs of the operator a round (the second meets the restart back-off)


def pause(seconds: float) -> None:
    time.sleep(seconds * PACE)


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (T: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def fault_kill(step, r: int, proxy: FaultProxy) -> None:
    for _ in range(KILLS):
        with window("operator SIGKILL"):
            step(f"round {r + 1}: SIGKILL the operator ({kill_operator()})")
            t = wait(lambda: operators_ready(1) and len(operator_processes()) == 1, 180,
                     "the operator to come back")
        took_effect(killed_and_replaced(), f"round {r + 1}: the killed operator was replaced")
        step(f"  the operator is back after {t:.0f} s")
        pause(8)


def fault_pods(step, r: int, proxy: FaultProxy) -> None:
    running_deleted = 0
    with window("sandbox Pods deleted"):
        for _ in range(3):
            running = delete_sandboxes(2, "sandboxrun.dev/run")
            running_deleted += len(running)
            step(f"round {r + 1}: deleted running sandboxes {running}, idle warm ones "
                 f"{delete_sandboxes(1, 'sandboxrun.dev/pool')}")
            pause(4)
        # None was running at those moments: wait for one (the agents keep calling), so the
        # fault is not skipped by chance.
        deadline = time.monotonic() + 60
        while not running_deleted and time.monotonic() < deadline:
            running = delete_sandboxes(1, "sandboxrun.dev/run")
            running_deleted += len(running)
            if running:
                step(f"round {r + 1}: deleted running sandbox {running}")
            time.sleep(0.2)
    took_effect(running_deleted > 0, f"round {r + 1}: a running sandbox was deleted")


def fault_apiserver(step, r: int, proxy: FaultProxy) -> None:
    with window("API server restart"):
        old = component_pid("kube-apiserver")
        t = restart_component("kube-apiserver", api_ready)
    took_effect(not alive(old) and component_pid("kube-apiserver") != old,
                f"round {r + 1}: the API server process was replaced")
    step(f"round {r + 1}: restarted the API server (ready again after {t:.0f} s)")
    pause(10)


def fault_kubelet(step, r: int, proxy: FaultProxy) -> None:
    kubelet = component_pid("kubelet")
    with window("kubelet stopped"):
        os.kill(kubelet, signal.SIGSTOP)
        try:
            stopped = time.monotonic() + 10
            while process_state(kubelet) != "T" and time.monotonic() < stopped:
                time.sleep(0.05)
            took_effect(process_state(kubelet) == "T", f"round {r + 1}: the kubelet stopped")
            step(f"round {r + 1}: stopped the kubelet (SIGSTOP)")
            pause(15)
        finally:
            os.kill(kubelet, signal.SIGCONT)
    step(f"  resumed the kubelet (SIGCONT) after {15 * PACE:.0f} s")
    pause(10)


def fault_failover(step, r: int, proxy: FaultProxy) -> None:
    stress.kubectl("-n", stress.SYSTEM_NS, "scale", "deployment", OPERATOR, "--replicas=2")
    try:
        wait(lambda: operators_ready(2) and len(operator_processes()) == 2, 180, "two operators")
        was = leader()
        with window("failover"):
            step(f"round {r + 1}: two operator replicas; SIGKILL the leader {was} "
                 f"({kill_operator(pod_of(was))})")
            t = wait(lambda: leader() not in ("", was), 120, "a new leader")
        step(f"  {leader()} leads after {t:.0f} s")
        pause(10)
    finally:
        stress.kubectl("-n", stress.SYSTEM_NS, "scale", "deployment", OPERATOR, "--replicas=1")
    wait(lambda: operators_ready(1), 180, "one operator again")
    pause(5)


def fault_proxy(step, r: int, proxy: FaultProxy) -> None:
    with window("API errors and hangs"):
        try:
            operator_env("KUBERNETES_SERVICE_HOST=10.244.0.1", "KUBERNETES_SERVICE_PORT=6444")
            step(f"round {r + 1}: the operator talks to the API server through the fault proxy")
            before = dict(proxy.counts)
            proxy.set(errors=0.3)
            pause(20)
            took_effect(proxy.counts["errors"] > before["errors"]
                        and proxy.counts["passed"] > before["passed"],
                        f"round {r + 1}: the proxy passed requests and failed some")
            step(f"  30 % of its requests answered with errors for {20 * PACE:.0f} s ({proxy.counts})")
            held = proxy.counts["held"]
            proxy.set(hangs=0.2, hang_seconds=8)
            pause(20)
            took_effect(proxy.counts["held"] > held, f"round {r + 1}: the proxy held requests")
            step(f"  20 % of its requests held 8 s for {20 * PACE:.0f} s ({proxy.counts})")
        finally:
            # Whatever happened, the cluster goes on without the proxy (later suites use it).
            proxy.set()
            operator_env("KUBERNETES_SERVICE_HOST-", "KUBERNETES_SERVICE_PORT-")
    step(f"  the operator talks to the API server directly again ({proxy.counts})")
    pause(5)


# The schedule of a round, in order (--faults picks some of them; the self-tests pick one).
FAULTS = {"kill": fault_kill, "pods": fault_pods, "apiserver": fault_apiserver,
          "kubelet": fault_kubelet, "failover": fault_failover, "proxy": fault_proxy}
CHOSEN = list(FAULTS)


def run_faults(step, rounds: int) -> None:
    proxy = FaultProxy(("10.244.0.1", 6444), ("10.244.0.1", 6443)).start()
    pause(10)
    for r in range(rounds):
        for name in CHOSEN:
            FAULTS[name](step, r, proxy)


def unexplained(calls: list[stress.Call]) -> list[str]:
    """Calls that failed outside every fault's window (and its RECOVERY): not the faults' doing."""
    problems = []
    for c in calls:
        if stress.succeeded(c):
            continue
        end = c.started + c.ms / 1000
        if not any(start <= end and c.started <= stop + RECOVERY for start, stop, _ in WINDOWS):
            problems.append(f"failed outside every fault: {c.agent} {c.kind} {c.token} at "
                            f"{time.strftime('%H:%M:%S', time.localtime(c.started))}: "
                            f"{(c.error or c.text)[:160]}")
    return problems


def unwatched(calls: list[stress.Call], pods: "PodWatch") -> list[str]:
    """Python runs that succeeded but whose sandbox the Pod watch never saw (except those in
    flight while the watch was reconnecting): a blind watch would make the two-sandboxes check
    vacuous."""
    problems = []
    for c in calls:
        if not (c.kind.startswith("python") and stress.succeeded(c) and c.run):
            continue
        end = c.started + c.ms / 1000
        if any(start <= end and c.started <= stop for start, stop in pods.gaps):
            continue
        if c.run not in pods.owners:
            problems.append(f"the Pod watch saw no sandbox of {c.run} ({c.token})")
    return problems


def unread(calls: list[stress.Call], pods: PodWatch, programs: ProgramsReceived) -> list[str]:
    """The sandboxes' logs must show the program of most Python runs that succeeded (a Pod
    deleted between two reads of the files goes unseen): a blind reader would make the
    two-sandboxes check vacuous."""
    runs = [c.run for c in calls
            if c.kind.startswith("python") and stress.succeeded(c) and c.run in pods.owners]
    read = [r for r in runs if pods.owners[r] & programs.pods]
    print(f"the sandboxes' logs showed the program of {len(read)} of {len(runs)} Python runs "
          "that succeeded")
    if runs and len(read) * 2 < len(runs):
        return [f"the sandboxes' logs showed the program of only {len(read)} of {len(runs)} "
                "Python runs that succeeded"]
    return []


async def main(a: argparse.Namespace) -> int:
    audit = stress.AuditTail().start()
    pods = PodWatch().start()
    programs = ProgramsReceived().start()
    calls: list[stress.Call] = []
    since = time.time()
    stop_flag = threading.Event()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    faults = loop.run_in_executor(None, schedule, stop_flag, a.rounds)

    async def relay() -> None:
        while not stop_flag.is_set():
            await asyncio.sleep(0.5)
        stop.set()

    t0 = time.perf_counter()
    key = stress.refused_key() if a.refused else None
    agents = asyncio.gather(*(stress.agent_loop(i, 10**6, calls, stop, key=key, pace=0.5)
                              for i in range(a.agents)))
    await asyncio.gather(relay(), agents)
    done = await faults
    wall = time.perf_counter() - t0
    log(f"faults done; {len(calls)} calls; waiting for every run to end")
    await loop.run_in_executor(None, stress.wait_ended, calls, a.settle)
    time.sleep(3)
    pods.stop()
    programs.stop()
    audit.stop()
    print("\n## Faults\n")
    print("\n".join(f"- {d}" for d in done))
    print()
    print(stress.report(calls, wall))
    # The operator is killed by "kill" and "failover" (its leader): an audit line it wrote but did
    # not record may be written again, identical (stress.check).
    killed = bool({"kill", "failover"} & set(CHOSEN))
    problems = stress.check(calls, audit.lines, since, operator_killed=killed)
    problems += two_sandboxes(pods, programs)
    # Under faults, each kind of call still succeeds, and every failure is the faults' doing.
    problems += stress.floors(calls, 0.0)
    problems += unexplained(calls)
    problems += unwatched(calls, pods)
    problems += unread(calls, pods, programs)
    problems += [f"fault not in effect: {what}" for what in INEFFECTIVE]
    if not WINDOWS:
        problems.append("no fault was injected")
    explain(problems, audit, pods, programs)
    return stress.verdict(problems)


def explain(problems: list[str], audit: stress.AuditTail, pods: "PodWatch",
            programs: "ProgramsReceived", most: int = 5) -> None:
    """For the runs a problem names (the first `most`): their status as it ended, the sandboxes
    the Pod watch saw them own, and every operator log line that names them, so that a red run
    can be read without the cluster (it is torn down after the suite)."""
    runs = list(dict.fromkeys(re.findall(r"run-[0-9a-f]{20}", "\n".join(problems))))[:most]
    for run in runs:
        print(f"\n### {run}\n")
        try:
            status = json.loads(stress.kubectl("-n", stress.RUNS_NS, "get", "sandboxrun", run,
                                               "-o", "json")).get("status") or {}
            keep = ("phase", "reason", "message", "path", "pool", "podName", "startedAt",
                    "finishedAt")
            print("status:", json.dumps({k: status.get(k) for k in keep if k in status}))
            for c in status.get("conditions") or []:
                print(f"  condition {c.get('type')}={c.get('status')} {c.get('reason')}: "
                      f"{c.get('message', '')[:200]}")
        except RuntimeError as e:
            print(f"status: not read ({e})")
        print("sandboxes seen:", sorted(pods.owners.get(run, set())),
              "of which received a program:", sorted(pods.owners.get(run, set()) & programs.pods))
        for line in audit.trail(run)[-80:]:
            print(" ", line)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=6)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--pace", type=float, default=1.0)
    p.add_argument("--kills", type=int, default=2)
    p.add_argument("--faults", default=",".join(FAULTS),
                   help=f"which faults a round injects, in this order: {','.join(FAULTS)}")
    p.add_argument("--call-timeout", type=float, default=stress.CALL_TIMEOUT)
    p.add_argument("--settle", type=float, default=240)
    p.add_argument("--refused", action="store_true")
    args = p.parse_args()
    PACE, KILLS = args.pace, args.kills
    CHOSEN = [f for f in FAULTS if f in args.faults.split(",")]
    if unknown := set(args.faults.split(",")) - set(FAULTS):
        p.error(f"unknown faults {sorted(unknown)}; known: {','.join(FAULTS)}")
    stress.CALL_TIMEOUT = args.call_timeout
    raise SystemExit(asyncio.run(main(args)))

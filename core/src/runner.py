# sandboxrun runner: the only program the sandbox container starts.
#
# Invoked without any shell as
#     python3 -I -S -c <this file> OUTPUT_BYTES MAX_PROCS TIMEOUT_SECONDS CODE
# It runs CODE in a child `python3 -I -c CODE` (argv only, never a shell) with a minimal
# environment, cwd /tmp and stdin /dev/null; reads the child's stdout and stderr concurrently,
# keeping at most OUTPUT_BYTES of each (cut on a UTF-8 boundary) while draining the rest so the
# child never blocks on a full pipe; then prints exactly one envelope line to its own stdout:
#     {"sandboxrun":1,"exitCode":N,"stdout":"...","stderr":"...","stdoutTruncated":b,
#      "stderrTruncated":b,"signal":n|null,"oomKill":b|null,
#      "timedOut":b,"durationMillis":n}
# and exits with the child's exit code (128+signal when the child was killed by a signal).
# TIMEOUT_SECONDS is enforced here, from the moment the child starts, so the code gets exactly its
# budget whatever the sandbox start-up cost, and the output printed before the kill is kept; the
# Pod's activeDeadlineSeconds is only the backstop should the runner itself hang.
#
# The operator parses the LAST line of the container log that is an envelope. The child runs as
# the same uid and could write a forged envelope into our stdout through /proc/<pid>/fd/1, so
# before printing we kill every process that is left (the child's process group and, when we are
# the container's init, everything else in the PID namespace) and start the envelope on a fresh
# line: nothing can write after it, and a half-written forged line cannot swallow it.
#
# Only the standard library is used, and only modules that Debian's python3-minimal ships
# (os, resource, signal, subprocess, sys, threading, time): the sandbox image is that small, which is
# also why the envelope is encoded by hand instead of with the json package.

import os
import resource
import signal
import subprocess
import sys
import threading
import time

ENVELOPE_VERSION = 1


# JSON string escapes: quote, backslash and every control character (RFC 8259, section 7).
_ESCAPES = {i: "\\u%04x" % i for i in range(0x20)}
_ESCAPES.update({0x22: '\\"', 0x5C: "\\\\", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"})


def json_value(value):
    """Encodes None, bool, int or str as JSON."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    return '"' + value.translate(_ESCAPES) + '"'


def json_object(pairs):
    """Encodes (key, value) pairs as one compact JSON object."""
    return "{" + ",".join(json_value(k) + ":" + json_value(v) for k, v in pairs) + "}"


def utf8_boundary(data, cut):
    """Largest index <= cut that does not split a UTF-8 sequence in data."""
    if cut >= len(data):
        return len(data)
    # Step back over continuation bytes (0b10xxxxxx); a sequence is at most 4 bytes long.
    back = 0
    while cut > 0 and back < 3 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
        back += 1
    return cut


class Capture(threading.Thread):
    """Reads a pipe to EOF, keeping the first `cap` bytes (plus one byte of lookahead)."""

    def __init__(self, pipe, cap):
        super().__init__(daemon=True)
        self.pipe = pipe
        self.cap = cap
        # One byte past the cap tells both whether anything was cut and whether the cut
        # falls inside a multi-byte character.
        self.kept = bytearray()

    def run(self):
        fd = self.pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            room = self.cap + 1 - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]
            # Everything past the lookahead byte is read and dropped: the child must never
            # block on a full pipe, or it would hang until the deadline.

    def text(self):
        """The kept bytes as text, and whether the stream was longer than the cap."""
        data = bytes(self.kept)
        if len(data) <= self.cap:
            return data.decode("utf-8", errors="replace"), False
        # Cut on a character boundary instead of leaving half a character to be replaced.
        return data[: utf8_boundary(data, self.cap)].decode("utf-8", errors="replace"), True


def limit_child(max_procs):
    """Runs in the child between fork and exec: resource limits that only the child gets."""

    def apply():
        # The kernel refuses fork() once the uid owns max_procs processes: this is what stops a
        # fork bomb inside the sandbox. The node's kubelet podPidsLimit is the hard cap behind it.
        resource.setrlimit(resource.RLIMIT_NPROC, (max_procs, max_procs))
        # No core dumps: they would fill the small /tmp and leak memory contents.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def oom_kill_seen():
    """Whether the memory cgroup recorded an OOM kill: True/False, or None when unknowable."""
    candidates = (
        ("/sys/fs/cgroup/memory.events", "oom_kill"),  # cgroup v2
        ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),  # cgroup v1
    )
    for path, key in candidates:
        try:
            with open(path, "r", encoding="ascii") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == key:
                        return int(parts[1]) > 0
        except (OSError, ValueError):
            continue
    return None


def kill_leftovers(child_pid):
    """Kills whatever the child left running so that nothing can write after the envelope."""
    try:
        os.killpg(child_pid, signal.SIGKILL)
    except OSError:
        pass
    if os.getpid() == 1:
        # As the container's init, -1 means every other process in this PID namespace,
        # including grandchildren that escaped the process group with setsid().
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass


def main(argv):
    if len(argv) != 5:
        sys.stderr.write("usage: runner OUTPUT_BYTES MAX_PROCS TIMEOUT_SECONDS CODE\n")
        return 2
    cap = int(argv[1])
    max_procs = int(argv[2])
    timeout = float(argv[3])
    code = argv[4]

    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable or "python3", "-I", "-c", code],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd="/tmp",
        close_fds=True,
        # Own process group, so that leftovers can be killed as a group.
        start_new_session=True,
        preexec_fn=limit_child(max_procs),
    )
    out = Capture(child.stdout, cap)
    err = Capture(child.stderr, cap)
    out.start()
    err.start()
    timed_out = False
    try:
        returncode = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        returncode = child.wait()
    # Kubernetes timestamps have whole seconds: the runner's clock gives the real run time.
    duration_millis = int((time.monotonic() - started) * 1000)
    # Grandchildren may still hold the pipes open; killing them lets the readers reach EOF.
    kill_leftovers(child.pid)
    out.join()
    err.join()

    stdout, stdout_truncated = out.text()
    stderr, stderr_truncated = err.text()
    sig = -returncode if returncode < 0 else None
    exit_code = 128 + sig if sig is not None else returncode
    line = json_object(
        [
            ("sandboxrun", ENVELOPE_VERSION),
            ("exitCode", exit_code),
            ("stdout", stdout),
            ("stderr", stderr),
            ("stdoutTruncated", stdout_truncated),
            ("stderrTruncated", stderr_truncated),
            ("signal", sig),
            ("oomKill", oom_kill_seen() if sig == signal.SIGKILL and not timed_out else None),
            ("timedOut", timed_out),
            ("durationMillis", duration_millis),
        ]
    )
    # Leading newline: a forged partial line written earlier cannot merge with the envelope.
    sys.stdout.buffer.write(b"\n" + line.encode("utf-8", errors="replace") + b"\n")
    sys.stdout.buffer.flush()
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv))

# sandboxrun runner: the only program the sandbox container starts.
#
# Invoked without any shell as
#     python3 -I -S -c <this file> OUTPUT_BYTES MAX_PROCS TIMEOUT_SECONDS [PRELOAD]
# with the program on stdin, framed as
#     `<code bytes> <timeout> <output bytes> <input bytes> <output files> <output file bytes>\n`
#     `<CODE as UTF-8><input section>`
# (the run's timeout and output cap; the lower of these and the argv's apply, so a sandbox
# started before its run was known keeps its ceilings; the input section holds the input files,
# `<name bytes> <content bytes>\n<name><content>` each, which are written read-only into
# /tmp/inputs before the code starts; core/src/runner.rs: program_frame): the code never travels in
# a command line or a Pod spec (one argv string is capped at 128 KiB: execve fails with E2BIG),
# and a program cut short (the sender died mid-write) is refused, never run truncated (exit 126,
# no envelope). The runner reads exactly the announced bytes, then closes stdin and prints
# `sandboxrun-program-received <bytes>` (the sender's cue to hang up).
# It forks a child that sets itself up as `python3 -I -c CODE` would (never a shell), with a
# minimal environment, cwd /tmp and stdin /dev/null, and executes CODE as `__main__` (the child is
# forked and set up before the program is read, and waits for its code on a pipe: a warm sandbox
# pays for the fork while it idles; see Prepared); reads the
# child's stdout and stderr concurrently, keeping at most OUTPUT_BYTES of each (cut on a UTF-8
# boundary) while draining the rest so the child never blocks on a full pipe; then prints
# exactly one envelope line to its own stdout:
#     {"sandboxrun":1,"exitCode":N,"stdout":"...","stderr":"...","stdoutTruncated":b,
#      "stderrTruncated":b,"signal":n|null,"oomKill":b|null,
#      "timedOut":b,"durationMillis":n,"files":[{"name","size","data"(base64)}],
#      "filesOmitted":[{"name","size","reason"}]}
# where files are the regular files the code left directly in /tmp/outputs, whole, within the
# frame's count and byte caps (never a symlink, FIFO, device or directory, never anything outside
# it: see collect_outputs), and filesOmitted names what was left out and why,
# and exits with the child's exit code (128+signal when the child was killed by a signal).
# While the code runs, what it prints also reaches the runner's stdout as it comes, in output
# lines the result readers skip (they look for the envelope) and live readers forward:
#     {"sandboxrunOutput":1,"stream":"stdout"|"stderr","data":"..."}
# batched (one line per stream every LIVE_INTERVAL seconds at most), within each stream's
# OUTPUT_BYTES, and LIVE_MAX_LINES lines in all, so the log stays bounded whatever the code does;
# the envelope stays the complete result. The code's stdout is line-buffered (stderr already is,
# as in `python3 -c`), so a program that prints a line per second is seen a line per second.
# TIMEOUT_SECONDS is enforced here, from the moment the child has its code, so the code gets exactly its
# budget whatever the sandbox start-up cost, and the output printed before the kill is kept; the
# Pod's activeDeadlineSeconds is only the backstop should the runner itself hang.
#
# The result is the runner's own, whatever the code does. The code runs as the same uid, so
# three doors are closed before it starts:
# - our file descriptors and memory: the runner makes itself non-dumpable (prctl
#   PR_SET_DUMPABLE 0) before it forks, so /proc/<runner>/fd, /proc/<runner>/mem and ptrace are
#   refused to the code (they need the dumpable flag, or CAP_SYS_PTRACE, which the sandbox drops);
#   the child closes every descriptor it inherited but its two pipes. If the flag cannot be set
#   the runner refuses to run the code (exit 125, no envelope: the run ends NoResult);
# - signals: the runner ignores every signal it can (the code cannot interrupt it into a crash,
#   or stop it), and as the container's init it cannot be killed or stopped from inside at all;
# - the log: before printing we kill every process that is left (the child's process group and,
#   when we are the container's init, everything else in the PID namespace) and start the
#   envelope on a fresh line, so nothing can write after it.
# The operator parses the LAST line of the container log that is an envelope; with the doors
# closed, the only writer of that log is the runner.
#
# Preloading. PRELOAD (a profile's libraries, comma-separated module names: core/src/files.rs,
# Profile::preloaded_modules) is imported by the runner before it reads its program, so a warm
# sandbox pays the imports while it idles (`import pandas` is about 1 s natively, 2 s under gVisor)
# and the code's own imports find the modules loaded: the child inherits them with the fork. Three
# conditions keep that safe and make the child a faithful `python3 -I -c`:
# - no thread but the runner's own may exist at the fork (a fork keeps only the forking thread,
#   so a thread pool would be lost and its locks left held): BLAS and OpenMP get one thread each
#   (more than the sandbox's CPU quota would serve anyway), and the runner counts its threads
#   after the imports;
# - no shared writable mapping may exist (the child could write into memory the runner reads):
#   the runner reads its own memory map after the imports;
# - nothing the imports print reaches the runner's stdout, the result channel: descriptor 1
#   points at stderr while they run. (Descriptors they open are closed in the child with the
#   rest; the runner's memory is out of reach: it is not dumpable.)
# If a condition fails, the runner refuses to run the code (exit 125, no envelope). A module that
# fails to import is reported on stderr and left to the code, whose own import then fails the way
# it would have anyway.
#
# The network barrier. Under a runtime with a network stack (runc, Kata: the Pod has a real
# interface), the Pod's deny-all NetworkPolicy is the only thing between the code and the network,
# and a policy agent enforces it only once it has learned the Pod: code that connects in the Pod's
# first moments got through (issue 24, item 11). So before it reads its program (a warm sandbox:
# before it waits for one) the runner proves the barrier holds: with any route out of the sandbox
# (/proc/net/route, /proc/net/ipv6_route, a device other than `lo`), it connects to the canary
# named in SANDBOXRUN_CANARY (`<ip>:<port>`, `[<ipv6>]:<port>`: a listener of the operator's that
# answers anyone), and reads the program only once a connection attempt goes unanswered (timed out,
# unreachable, refused by the local stack). A connection that is accepted, or refused by the far
# end (a reset: some host answered), means the path is open: it tries again, up to BARRIER_WAIT
# seconds, and then prints an envelope with `"notRun":{"reason":"isolationNotInForce",...}` and
# exits without reading its program (so the code never runs). A sandbox with routes out but no
# canary is refused the same way (nothing proves the barrier); one with no route (gVisor with
# `network = "none"`, the embedded sandboxes: `lo` only) skips the probe. SANDBOXRUN_CANARY=none
# skips it too: only the runner's own tests set it, on a host (the operator never does).
#
# Only the standard library is used, and besides ctypes (for prctl) and socket (for the canary,
# imported only when the sandbox has a route out) only modules that Debian's python3-minimal ships (codecs, os, resource, signal, site, sys, threading, time), which is also
# why the envelope is encoded by hand instead of with the json package.

import codecs
import os
import resource
import signal
import sys
import threading
import time

ENVELOPE_VERSION = 1
OUTPUT_LINE_VERSION = 1
# Live output: how often each stream's new output is written out, and how many lines at most.
LIVE_INTERVAL = 0.1
LIVE_MAX_LINES = 2000


# JSON string escapes: quote, backslash and every control character (RFC 8259, section 7).
_ESCAPES = {i: "\\u%04x" % i for i in range(0x20)}
_ESCAPES.update({0x22: '\\"', 0x5C: "\\\\", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"})


def json_value(value):
    """Encodes None, bool, int, str, a list of values, or an Obj of (key, value) pairs as JSON."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Obj):
        return json_object(value.pairs)
    if isinstance(value, list):
        return "[" + ",".join(json_value(v) for v in value) + "]"
    return '"' + value.translate(_ESCAPES) + '"'


class Obj:
    """A JSON object nested in another (json_object takes the outermost's pairs directly)."""

    def __init__(self, pairs):
        self.pairs = pairs


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


class Live:
    """Writes the code's output to the runner's stdout while it runs, as output lines."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lines = 0
        self.done = threading.Event()

    def write(self, stream, text):
        if not text:
            return
        with self.lock:
            if self.lines >= LIVE_MAX_LINES:
                return
            self.lines += 1
            line = json_object([("sandboxrunOutput", OUTPUT_LINE_VERSION), ("stream", stream),
                                ("data", text)])
            try:
                sys.stdout.buffer.write(line.encode("utf-8", errors="replace") + b"\n")
                sys.stdout.buffer.flush()
            except OSError:
                pass

    def pump(self, captures):
        """Flushes the captures' new output every LIVE_INTERVAL until `done` is set, then once
        more (a thread of its own: the readers never wait on the log)."""
        while not self.done.wait(LIVE_INTERVAL):
            for c in captures:
                c.flush_live(self)
        for c in captures:
            c.flush_live(self, final=True)


class Capture(threading.Thread):
    """Reads a pipe to EOF, keeping the first `cap` bytes (plus one byte of lookahead)."""

    def __init__(self, fd, cap, name):
        super().__init__(daemon=True)
        self.fd = fd
        self.cap = cap
        self.name = name
        # One byte past the cap tells both whether anything was cut and whether the cut
        # falls inside a multi-byte character.
        self.kept = bytearray()
        self.lock = threading.Lock()
        # How much of `kept` went out as live output, and its decoder (a character may be split
        # between two reads).
        self.sent = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def run(self):
        fd = self.fd
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            room = self.cap + 1 - len(self.kept)
            if room > 0:
                with self.lock:
                    self.kept += chunk[:room]
            # Everything past the lookahead byte is read and dropped: the child must never
            # block on a full pipe, or it would hang until the deadline.

    def flush_live(self, live, final=False):
        with self.lock:
            end = min(len(self.kept), self.cap)
            data = bytes(self.kept[self.sent:end])
            self.sent = end
        live.write(self.name, self.decoder.decode(data, final))

    def text(self):
        """The kept bytes as text, and whether the stream was longer than the cap."""
        data = bytes(self.kept)
        if len(data) <= self.cap:
            return data.decode("utf-8", errors="replace"), False
        # Cut on a character boundary instead of leaving half a character to be replaced.
        return data[: utf8_boundary(data, self.cap)].decode("utf-8", errors="replace"), True


def exit_status(exc):
    """The process exit status `python3 -c` gives for a SystemExit."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    # sys.exit("message"): the message goes to stderr and the status is 1.
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:
        pass
    return 1


def finish_like_the_interpreter(status):
    """What an interpreter does at exit: join non-daemon threads, run atexit, flush."""
    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        import atexit

        atexit._run_exitfuncs()
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            # Python reports a failed flush at exit (e.g. a closed pipe) with status 120.
            status = 120
    return status


def become_user_program(max_procs, env, out_w, err_w, code_r):
    """The forked child: sets itself up exactly like `python3 -I -c CODE`, then waits for CODE on
    `code_r` and runs it.

    Forking the runner's interpreter instead of starting a second one saves a full interpreter
    start per run (about 15 ms natively, about 100 ms under gVisor); forking it before the program
    arrives (see Prepared) takes the fork itself off the call's path (under gVisor it copies every
    mapping in the sandbox's kernel: 60 ms for the minimal runner, 190 ms for a preloaded one).
    Never returns.
    """
    status = 1
    try:
        # Own session and process group, so that leftovers can be killed as a group.
        os.setsid()
        # The kernel refuses fork() once the uid owns max_procs processes: this is what stops a
        # fork bomb inside the sandbox. The node's kubelet podPidsLimit is the hard cap behind it.
        resource.setrlimit(resource.RLIMIT_NPROC, (max_procs, max_procs))
        # No core dumps: they would fill the small /tmp and leak memory contents.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        # The code's pipe at 3 (the pipes were made after 0-2, so it is at 3 or above, and 1 and
        # 2 were copied first); nothing else of the runner's stays open: not the pipes' read ends,
        # not the log, not the runner's stdin.
        os.dup2(code_r, CODE_FD)
        os.closerange(CODE_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        os.chdir(TMP)
        os.environ.clear()
        os.environ.update(env)
        sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", closefd=False)
        # Line-buffered, unlike `python3 -c` into a pipe: the output is streamed as it comes.
        sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
        sys.stderr = sys.__stderr__ = open(
            2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
        )
        sys.argv = ["-c"]
        # `python3 -I` imports site (system site-packages only); the runner itself runs with -S.
        import site

        site.main()
        code = receive_code()
        if code is None:
            # The runner had no program for us (it kills us too): nothing ran.
            os._exit(0)
        main = type(sys)("__main__")
        main.__builtins__ = __builtins__
        sys.modules["__main__"] = main
        try:
            exec(compile(code, "<string>", "exec"), main.__dict__)
            status = 0
        except SystemExit as exc:
            status = exit_status(exc)
        except BaseException:
            kind, value, tb = sys.exc_info()
            # The traceback starts at the user's code, as `python3 -c` prints it: drop this frame.
            tb = tb.tb_next if tb is not None else None
            sys.excepthook(kind, value.with_traceback(tb), tb)
            status = 1
        status = finish_like_the_interpreter(status)
    except BaseException:
        try:
            sys.excepthook(*sys.exc_info())
        except BaseException:
            pass
        status = 1
    finally:
        os._exit(status)


def receive_code():
    """The code, as the runner hands it over on CODE_FD (a marker byte, then the code's bytes, then
    end of file), or None when the runner closed the pipe without a program."""
    chunks = []
    while True:
        chunk = os.read(CODE_FD, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(CODE_FD)
    data = b"".join(chunks)
    if not data.startswith(CODE_MARKER):
        return None
    return data[len(CODE_MARKER):].decode("utf-8", errors="surrogateescape")


class Prepared:
    """The code's process, forked and set up before the program arrives, waiting for its code.

    The fork is what a sandbox's call would otherwise wait for after its program arrives, so a warm
    or armed sandbox makes it while it idles. Until the code is handed over, the child runs only
    the runner's own code (become_user_program's set-up, then a read of its pipe); it already has
    everything the code gets (its descriptors, environment, limits, signal dispositions), and
    nothing of the runner's: the runner's stdin, where the program arrives, is closed in it before
    the program is read."""

    def __init__(self, replaced, max_procs, env):
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        code_r, self.code_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            restore_signals(replaced)
            become_user_program(max_procs, env, out_w, err_w, code_r)
        for fd in (out_w, err_w, code_r):
            os.close(fd)

    def hand_over(self, code):
        """Sends the code; the child starts it as soon as the pipe is closed. A child that died
        meanwhile is reported by its exit status (the write's error is not the result)."""
        data = CODE_MARKER + code.encode("utf-8", errors="surrogateescape")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.code_w, view):]
        except OSError:
            pass
        finally:
            os.close(self.code_w)

    def discard(self):
        """Ends the child without running anything (no program, or one the runner refused)."""
        os.close(self.code_w)
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass


class Waiter(threading.Thread):
    """Waits for the child in the background, so the main thread can wait with a timeout."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.returncode = None

    def run(self):
        _, status = os.waitpid(self.pid, 0)
        # Negative for death by a signal, like subprocess's returncode.
        self.returncode = os.waitstatus_to_exitcode(status)


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


# prctl(2) option: whether the process may be traced, and its /proc entries read, by its uid.
PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
# Exit status when the result channel cannot be protected: the code never runs.
UNPROTECTED = 125
# Exit code when stdin did not carry one complete framed program.
NO_PROGRAM = 126
# Largest program accepted on stdin (the SandboxRun schema allows 256 KiB of code).
MAX_PROGRAM_BYTES = 1 << 20
# Largest input section accepted on stdin (the tool allows 256 KiB of files, plus their framing).
MAX_INPUT_SECTION_BYTES = 1 << 20
# Bounds on returned files no frame can raise (core/src/files.rs: MAX_OUTPUT_FILES, _BYTES).
MAX_OUTPUT_FILES = 20
MAX_OUTPUT_FILE_BYTES = 384 * 1024
# The sandbox's private, writable directory: the code's working directory, where input files are
# placed (inputs/) and returned files are taken from (outputs/) (core/src/files.rs). Only the
# runner's own tests, which run it on a host, move it (SANDBOXRUN_RUNNER_TMP): a sandbox's
# environment is set by the operator or the local driver, never by the code.
TMP = "/tmp"
# The runner's stdout, the result channel (the container log), as a descriptor of its own.
RESULT_FD = 1
# Where the prepared child reads its code (Prepared), and what precedes the code there (an empty
# pipe means the runner had no program; empty code is a program).
CODE_FD = 3
CODE_MARKER = b"C"
# What the runner prints once it has a whole program (core/src/runner.rs: PROGRAM_RECEIVED).
PROGRAM_RECEIVED_LINE = b"sandboxrun-program-received"
# Most names of left-out files reported (core/src/files.rs: MAX_OMITTED).
MAX_OMITTED = 50
# Bounds on listing outputs/ (code may leave any number of entries there, and under gVisor every
# stat is a trip through the sandbox's kernel): at most MAX_LISTED names are read and looked at,
# those beyond are only counted, at most MAX_COUNTED of them, and the whole listing stops after
# LISTING_BUDGET seconds; what was not looked at is reported as one omission.
MAX_LISTED = 1000
MAX_COUNTED = 1000000
LISTING_BUDGET = 2.0
# The network barrier (see the top of this file). Exit status when it never held: the code never
# runs, the envelope says why.
ISOLATION_NOT_IN_FORCE = 123
CANARY_ENV = "SANDBOXRUN_CANARY"
# How long the runner waits for the barrier: within the Pod's start-up grace
# (operator/src/python/pod.rs: ACTIVE_DEADLINE_GRACE_SECONDS, 10 s), so that the envelope saying
# it never held is printed before the kubelet's deadline.
BARRIER_WAIT = 7.0
# One attempt's connect timeout: past the kernel's first SYN retransmission (1 s), so a single
# lost packet, or a policy agent slow to give its verdict, is not taken for a barrier.
CANARY_CONNECT_TIMEOUT = 1.5
# Between attempts while the canary still answers.
CANARY_RETRY = 0.2
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def plain_name(name):
    """Whether `name` is one plain file name (core/src/files.rs: check_name): 1 to 100 ASCII
    letters, digits, '.', '_' or '-', starting with a letter or digit. Nothing else is ever
    created or returned: no '/', no '..', no hidden or control-character names."""
    return (0 < len(name) <= 100 and name[0] not in "._-"
            and all(c in NAME_CHARS for c in name))


def read_exactly(size, buf):
    """`size` bytes: what `buf` holds first, then from stdin. Returns (data, rest of buf), or
    (None, got) when stdin ended first."""
    chunks = [buf[:size]]
    got = len(chunks[0])
    while got < size:
        chunk = os.read(0, min(size - got, 65536))
        if not chunk:
            return None, got
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks), buf[size:]


def parse_inputs(section):
    """The input files of an input section as [(name, bytes)], or None (with the reason on stderr)
    when it is malformed or names a file that is not a plain name."""
    files = []
    pos = 0
    while pos < len(section):
        nl = section.find(b"\n", pos, pos + 64)
        fields = section[pos:nl].split() if nl >= 0 else []
        name_len, data_len = -1, -1
        if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
            name_len, data_len = int(fields[0]), int(fields[1])
        start = nl + 1
        if name_len <= 0 or data_len < 0 or start + name_len + data_len > len(section):
            sys.stderr.write("runner: malformed input file section on stdin; not running the code\n")
            return None
        name = section[start:start + name_len].decode("ascii", errors="replace")
        if not plain_name(name) or any(n == name for n, _ in files):
            sys.stderr.write("runner: refusing input file name %r; not running the code\n" % name[:100])
            return None
        files.append((name, section[start + name_len:start + name_len + data_len]))
        pos = start + name_len + data_len
    return files


def parse_header(header):
    """The fields of a program header (see read_program) as (code bytes, timeout, cap, input bytes,
    output files, output file bytes), or None (with the reason on stderr) when it is malformed or
    over a bound."""
    fields = header.split()
    size, timeout, cap, input_size, max_files, max_file_bytes = -1, None, None, 0, 0, 0
    try:
        size = int(fields[0]) if len(fields) in (1, 3, 6) else -1
        timeout = float(fields[1]) if len(fields) >= 3 else None
        cap = int(fields[2]) if len(fields) >= 3 else None
        if len(fields) == 6:
            input_size, max_files, max_file_bytes = (int(f) for f in fields[3:6])
    except ValueError:
        size = -1
    if (size < 0 or size > MAX_PROGRAM_BYTES or (timeout is not None and (timeout <= 0 or cap < 0))
            or not 0 <= input_size <= MAX_INPUT_SECTION_BYTES or max_files < 0 or max_file_bytes < 0):
        sys.stderr.write("runner: bad program header: %r\n" % header[:128])
        return None
    return size, timeout, cap, input_size, max_files, max_file_bytes


def read_program():
    """The framed program from stdin as (code, timeout, cap, inputs, max_files, max_file_bytes),
    or None (with the reason on stderr) when it is incomplete. The header is
    `<code bytes> <timeout> <output bytes> <input bytes> <output files> <output file bytes>`
    (core/src/runner.rs: program_frame); the 3-field and bare `<code bytes>` headers of older
    senders are accepted (no per-run limits, no files then). Read in chunks, not a byte at a
    time: under gVisor every read is a trip through the sandbox's kernel."""
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(0, 65536)
        if not chunk or len(buf) > 128:
            sys.stderr.write("runner: no program on stdin (expected '<byte count>\\n<code>')\n")
            return None
        buf += chunk
    header, _, rest = buf.partition(b"\n")
    if len(header) > 128:
        sys.stderr.write("runner: no program on stdin (expected '<byte count>\\n<code>')\n")
        return None
    parsed = parse_header(header)
    if parsed is None:
        return None
    size, timeout, cap, input_size, max_files, max_file_bytes = parsed
    code, rest = read_exactly(size, rest)
    if code is None:
        sys.stderr.write("runner: the program ended after %d of %d bytes; not running it\n"
                         % (rest, size))
        return None
    section, rest = read_exactly(input_size, rest)
    if section is None:
        sys.stderr.write("runner: the input files ended after %d of %d bytes; not running the code\n"
                         % (rest, input_size))
        return None
    inputs = parse_inputs(section)
    if inputs is None:
        return None
    # Nothing more is read: whatever follows the program is not part of it.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return (code.decode("utf-8", errors="surrogateescape"), timeout, cap, inputs,
            min(max_files, MAX_OUTPUT_FILES), min(max_file_bytes, MAX_OUTPUT_FILE_BYTES))


def input_dir():
    return os.path.join(TMP, "inputs")


def output_dir():
    return os.path.join(TMP, "outputs")


def place_inputs(inputs):
    """Writes the input files into inputs/, read-only, and makes outputs/; returns why not, or
    None. Each name was checked (plain_name) and each file is created new, never through a link."""
    try:
        if inputs:
            os.mkdir(input_dir(), 0o755)
            dfd = os.open(input_dir(), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                write_inputs(dfd, inputs)
                os.fchmod(dfd, 0o555)
            finally:
                os.close(dfd)
        os.mkdir(output_dir(), 0o755)
    except OSError as exc:
        return "cannot prepare %s and %s: %s" % (input_dir(), output_dir(), exc)
    return None


def write_inputs(dfd, inputs):
    """Creates each input file in the directory `dfd`, new (never through a link), read-only."""
    for name, data in inputs:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)


def list_outputs(dfd, deadline):
    """The names in outputs/ to look at, as (names, rest, counted_all): at most MAX_LISTED names
    in name order (of those the directory gave first, when it holds more), how many entries
    follow them, and whether that count is complete (it stops at MAX_COUNTED, or at `deadline`).
    Only names are read here (getdents), nothing is looked at."""
    names, rest = [], 0
    with os.scandir(dfd) as entries:
        for entry in entries:
            if len(names) < MAX_LISTED:
                names.append(entry.name)
            elif rest >= MAX_COUNTED:
                return sorted(names), rest, False
            else:
                rest += 1
            if (len(names) + rest) % 256 == 0 and time.monotonic() > deadline:
                return sorted(names), rest, False
    return sorted(names), rest, True


def collect_outputs(max_files, max_bytes, seen=None):
    """The files in outputs/ to return, as (files, omitted): files a list of Obj (name, size,
    base64 data), omitted a list of Obj (name, size, reason). Called once every process of the
    code is dead, so nothing changes under it. Only regular files directly in outputs/ with
    plain names are read: the directory is opened without following a link (code that replaced it
    with a symlink gets nothing back), each entry is looked at without following links and opened
    with O_NOFOLLOW | O_NONBLOCK (a FIFO cannot block the runner), and checked again on the open
    descriptor. Whole files only, by name order, while the caps allow; the rest is reported.
    Bounded whatever the code left there: at most MAX_LISTED entries are looked at, within
    LISTING_BUDGET seconds (list_outputs); the entries that were not are reported as one omission
    (`<n> more entries not examined`, fileCount).

    `seen` (a session's: {name: signature} of the files the earlier calls left there) leaves out
    the files no later call made or changed, and is updated with what this call left."""
    import binascii
    import stat

    files, omitted = [], []
    deadline = time.monotonic() + LISTING_BUDGET
    previously, now_seen = dict(seen or {}), {}
    if seen is not None:
        # What this call leaves is what the next compares with (a file it removed is forgotten).
        seen.clear()

    def omit(name, size, reason):
        # The last place is kept for the entries that were not examined.
        if len(omitted) < MAX_OMITTED - 1:
            omitted.append(Obj([("name", name[:100]), ("size", size), ("reason", reason)]))

    # Not O_DIRECTORY: gVisor follows a final symlink when O_DIRECTORY and O_NOFOLLOW come
    # together (Linux refuses it). O_NOFOLLOW alone refuses a link everywhere; fstat then says
    # whether what was opened is a directory, and the same one lstat saw.
    try:
        before = os.lstat(output_dir())
        dfd = os.open(output_dir(), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        # Gone, or replaced by a link: nothing to return.
        return files, omitted
    opened = os.fstat(dfd)
    if (not stat.S_ISDIR(before.st_mode) or not stat.S_ISDIR(opened.st_mode)
            or (before.st_dev, before.st_ino) != (opened.st_dev, opened.st_ino)):
        os.close(dfd)
        return files, omitted
    try:
        try:
            names, rest, counted_all = list_outputs(dfd, deadline)
        except OSError:
            return files, omitted
        total = 0
        for index, name in enumerate(names):
            if time.monotonic() > deadline:
                rest += len(names) - index
                break
            shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            if not plain_name(name):
                omit(shown, None, "badName")
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                omit(shown, None, "unreadable")
                continue
            if not stat.S_ISREG(st.st_mode):
                omit(shown, None, "notARegularFile")
                continue
            if seen is not None:
                signature = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                now_seen[name] = signature
                if previously.get(name) == signature:
                    continue
            if len(files) >= max_files:
                omit(shown, st.st_size, "fileCount")
                continue
            if total + st.st_size > max_bytes:
                omit(shown, st.st_size, "byteCount")
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except OSError:
                omit(shown, st.st_size, "unreadable")
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    omit(shown, None, "notARegularFile")
                    continue
                # One byte more than the room left tells a file that grew since its stat.
                room = max_bytes - total
                data = b""
                while len(data) <= room:
                    chunk = os.read(fd, min(65536, room + 1 - len(data)))
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                omit(shown, st.st_size, "unreadable")
                continue
            finally:
                os.close(fd)
            if len(data) > room:
                omit(shown, len(data), "byteCount")
                continue
            total += len(data)
            files.append(Obj([("name", name), ("size", len(data)),
                              ("data", binascii.b2a_base64(data, newline=False).decode("ascii"))]))
        if rest > 0 or not counted_all:
            omitted.append(Obj([
                ("name", "%s%d more entries not examined" % ("" if counted_all else "over ", rest)),
                ("size", None), ("reason", "fileCount")]))
    finally:
        os.close(dfd)
        if seen is not None:
            seen.update(now_seen)
    return files, omitted


def routes_out():
    """Whether a packet could leave the sandbox: a route through a device other than `lo`
    (/proc/net/route, /proc/net/ipv6_route). A table that cannot be read counts as a route (the
    canary then decides); only a missing IPv6 table (no IPv6) counts as none."""
    for path, device in (("/proc/net/route", 0), ("/proc/net/ipv6_route", -1)):
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 20)
        except FileNotFoundError:
            if path.endswith("ipv6_route"):
                continue
            return True
        except OSError:
            return True
        for line in data.decode("ascii", "replace").splitlines():
            fields = line.split()
            # /proc/net/route starts with a header (`Iface ...`) when it lists any route.
            if fields and fields[0] != "Iface" and fields[device] != "lo":
                return True
    return False


def parse_canary(socket, value):
    """(family, address) of a canary given as `<ipv4>:<port>` or `[<ipv6>]:<port>`, or None.
    A literal address only: a sandbox has no name service."""
    host, sep, port = value.rpartition(":")
    family = socket.AF_INET
    if host.startswith("[") and host.endswith("]"):
        host, family = host[1:-1], socket.AF_INET6
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    try:
        socket.inet_pton(family, host)
    except (OSError, ValueError):
        return None
    return family, (host, int(port))


def probe_canary(socket, family, address):
    """One attempt to reach the canary: ("blocked", why) when nothing answered (timed out,
    unreachable, refused by the local stack), ("open", why) when something did (accepted, or
    reset by the far end), ("unknown", why) otherwise (tried again)."""
    import errno

    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.settimeout(CANARY_CONNECT_TIMEOUT)
        s.connect(address)
        return "open", "it accepted a connection"
    except socket.timeout:
        return "blocked", "no answer within %gs" % CANARY_CONNECT_TIMEOUT
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno in (errno.ECONNREFUSED, errno.ECONNRESET):
            return "open", "a host answered: " + why
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EACCES, errno.EPERM):
            return "blocked", why
        return "unknown", why
    finally:
        s.close()


def hold_the_barrier():
    """None once the network barrier is proven to hold, or when there is no network to hold
    off; else why the code must not run (see the top of this file)."""
    canary = os.environ.get(CANARY_ENV, "")
    if canary == "none" or not routes_out():
        return None
    if not canary:
        return ("this sandbox has a network interface and no canary (%s) to prove its network "
                "isolation with, so nothing was run; the operator sets one from its Pod IP "
                "(POD_IP)" % CANARY_ENV)
    import socket

    target = parse_canary(socket, canary)
    if target is None:
        return "the canary address %r is not <ip>:<port>, so nothing was run" % canary[:100]
    deadline = time.monotonic() + BARRIER_WAIT
    while True:
        state, detail = probe_canary(socket, *target)
        if state == "blocked":
            return None
        if time.monotonic() >= deadline:
            return ("the sandbox's network isolation did not come into force within %gs of its "
                    "start (the operator's canary at %s was still reachable: %s), so nothing was "
                    "run; try again, and if it persists ask the cluster's operator to check that "
                    "NetworkPolicy is enforced for sandbox Pods" % (BARRIER_WAIT, canary, detail))
        time.sleep(CANARY_RETRY)


def not_run_pairs(reason, message):
    """The envelope's fields for code that was never started, and why."""
    return result_pairs(ISOLATION_NOT_IN_FORCE if reason == "isolationNotInForce" else NO_PROGRAM,
                        "", "", False, False, None, None, False, 0, None, None) + [
        ("notRun", Obj([("reason", reason), ("message", message)]))]


def result_pairs(exit_code, stdout, stderr, stdout_truncated, stderr_truncated, sig, oom_kill,
                 timed_out, duration_millis, files, files_omitted):
    """The envelope's fields (files None: code that never ran, which returns none)."""
    pairs = [
        ("sandboxrun", ENVELOPE_VERSION),
        ("exitCode", exit_code),
        ("stdout", stdout),
        ("stderr", stderr),
        ("stdoutTruncated", stdout_truncated),
        ("stderrTruncated", stderr_truncated),
        ("signal", sig),
        ("oomKill", oom_kill),
        ("timedOut", timed_out),
        ("durationMillis", duration_millis),
    ]
    if files is not None:
        pairs += [("files", files), ("filesOmitted", files_omitted)]
    return pairs


def print_envelope(pairs):
    """Prints one envelope line. The leading newline: a forged partial line written earlier cannot
    merge with it."""
    line = json_object(pairs)
    sys.stdout.buffer.write(b"\n" + line.encode("utf-8", errors="replace") + b"\n")
    sys.stdout.buffer.flush()


def print_not_run(reason, message):
    """The envelope of a run whose code was never started, and why."""
    print_envelope(not_run_pairs(reason, message))


def receive_program():
    """read_program, then the confirmation: it tells whoever sent the program (the operator, over
    the Pod's attach stream) that all of it arrived, so it can hang up; it is not an envelope, so
    result readers skip it. Written to the descriptor directly: while a preload runs, the stdout
    object points elsewhere."""
    program = read_program()
    if program is not None:
        size = len(program[0].encode("utf-8", "surrogateescape"))
        os.write(RESULT_FD, b"%s %d\n" % (PROGRAM_RECEIVED_LINE, size))
    return program


class ProgramReader(threading.Thread):
    """receive_program beside a preload, unless stopped before any of the program came (a warm
    sandbox idles past its imports: the program is then the main thread's to read, after it forked
    the code's process, which it may not do while this thread lives)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.program = None
        self.reading = False
        self.stop_r, self.stop_w = os.pipe()

    def run(self):
        import select

        ready, _, _ = select.select([0, self.stop_r], [], [])
        if 0 in ready:
            self.reading = True
            self.program = receive_program()

    def stop(self):
        """Waits for the thread: at once if nothing of the program had come, else until all of it
        has. Afterwards `reading` says whether it took the program."""
        os.write(self.stop_w, b"x")
        self.join()
        os.close(self.stop_r)
        os.close(self.stop_w)


def preload(modules, reader):
    """Imports `modules` (PRELOAD) for the code to inherit, then waits for `reader` (if any: a
    session reads its calls only afterwards); returns why
    the code may not run in this process's child, or None."""
    for name in modules:
        if not name or not all(part.isidentifier() for part in name.split(".")):
            if reader is not None:
                reader.stop()
            return "PRELOAD names a module that is not a dotted name: %r" % (name,)
    # Before the imports, which read them: one BLAS/OpenMP thread (none besides the caller's), the
    # matplotlib backend for files, its cache in the sandbox's /tmp.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    os.environ["MPLBACKEND"] = "Agg"
    os.environ["MPLCONFIGDIR"] = os.path.join(TMP, ".matplotlib")
    import site

    # The system site-packages, where `python3 -I` finds the image's libraries (-S skipped it).
    site.main()
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        for name in modules:
            try:
                __import__(name)
            except BaseException as exc:
                sys.stderr.write("runner: preloading %s failed: %r\n" % (name, exc))
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    if reader is not None:
        reader.stop()
    try:
        # The reader's thread ends a moment after join() returns.
        for _ in range(1000):
            threads = os.listdir("/proc/self/task")
            if len(threads) == 1:
                break
            time.sleep(0.001)
        with open("/proc/self/maps") as maps:
            shared = [line.strip() for line in maps if line.split()[1][1:4:2] == "ws"]
    except OSError as exc:
        return "cannot check the process after preloading: %r" % (exc,)
    if len(threads) != 1:
        return "preloading left %d threads running (a fork keeps one)" % len(threads)
    if shared:
        return "preloading left a shared writable mapping: " + shared[0]
    return None


def mark_idle():
    """Creates the empty file TMP/.sandboxrun-idle (core/src/runner.rs, IDLE_MARK: the startup
    probe of a pool's preloading sandbox waits for it). It stays: the code may see it, as it sees
    the .matplotlib directory of the preload. If it cannot be made, such a sandbox is never counted
    ready (the pool replaces it after maxIdleSeconds); a run that took it still runs."""
    try:
        fd = os.open(os.path.join(TMP, ".sandboxrun-idle"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.close(fd)
    except OSError as exc:
        sys.stderr.write("runner: cannot mark the sandbox idle: %r\n" % (exc,))


def make_unreachable():
    """Makes this process non-dumpable; returns why not, or None on success."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            return "prctl(PR_SET_DUMPABLE) failed: " + os.strerror(ctypes.get_errno())
        if libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
            return "prctl(PR_SET_DUMPABLE) did not take effect"
    except Exception as exc:  # no ctypes in the image, no libc symbol, ...
        return "cannot call prctl: %r" % (exc,)
    return None


def ignore_signals():
    """Ignores every catchable signal but SIGCHLD (the runner waits for its child); returns the
    dispositions it replaced, which the child restores."""
    replaced = {}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            continue
        try:
            replaced[sig] = signal.signal(sig, signal.SIG_IGN)
        except (OSError, ValueError):
            pass
    return replaced


def restore_signals(replaced):
    """The child's first step: the interpreter's own signal handling, as `python3 -c` has it."""
    for sig, handler in replaced.items():
        try:
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        except (OSError, ValueError, TypeError):
            pass


def before_the_program(what):
    """Everything a runner does before it reads `what` (its program, or a session's calls): a
    warm sandbox waits after this for its program, so these costs are paid while it idles, not by
    its call. Returns why results could be forged (None: they cannot), the signal handlers
    replaced, and the exit status when the network barrier does not hold (None: it does)."""
    why = make_unreachable()
    # Before the fork, so there is no moment in which the code runs and the runner listens.
    replaced = ignore_signals()
    # The child's `site.main()` then finds the module loaded (-S: importing it runs nothing).
    import site  # noqa: F401
    # The network barrier holds before the program is read: the code cannot run, and a warm
    # sandbox cannot take a program, while the sandbox could still reach the network.
    barrier = hold_the_barrier()
    if barrier is not None:
        sys.stderr.write("runner: not reading " + what + ": " + barrier + "\n")
        sys.stderr.flush()
        print_not_run("isolationNotInForce", barrier)
        return why, replaced, ISOLATION_NOT_IN_FORCE
    return why, replaced, None


def main(argv):
    if len(argv) not in (4, 5):
        sys.stderr.write("usage: runner OUTPUT_BYTES MAX_PROCS TIMEOUT_SECONDS [PRELOAD] < framed program\n")
        return 2
    global TMP
    cap = int(argv[1])
    max_procs = int(argv[2])
    timeout = float(argv[3])
    TMP = os.environ.get("SANDBOXRUN_RUNNER_TMP") or TMP
    why, replaced, status = before_the_program("the program")
    if status is not None:
        return status
    modules = argv[4].split(",") if len(argv) == 5 and argv[4] else []
    unsafe = None
    received, program = False, None
    if modules:
        global RESULT_FD
        # The preload points descriptor 1 at stderr for a while; the child closes this copy.
        RESULT_FD = os.dup(1)
        # A program that comes while the imports run is received (and confirmed) meanwhile: a
        # sandbox started for its run gets its program as soon as it starts, and the sender should
        # not wait seconds for imports to hear that all of it arrived. The reader is gone before
        # the fork.
        reader = ProgramReader()
        reader.start()
        unsafe = preload(modules, reader)
        received, program = reader.reading, reader.program
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    # The code's process is forked now, while a warm or armed sandbox waits for its program
    # (Prepared), unless the code may not run at all.
    prepared = Prepared(replaced, max_procs, env) if why is None and unsafe is None else None
    if modules and prepared is not None:
        # The imports are done and the code's process forked: a pool's sandbox of a profile with
        # a PRELOAD counts as ready from here (its startup probe tests for this file), not from
        # its start, or a run given it would wait for the imports. Made even if the program
        # came meanwhile (a run took the sandbox while it imported), so the probe stops; never
        # made by a runner that will refuse to run code (such a sandbox is never ready).
        mark_idle()
    if not received:
        program = receive_program()
    if program is None:
        if prepared is not None:
            prepared.discard()
        return NO_PROGRAM
    code, run_timeout, run_cap, inputs, max_files, max_file_bytes = program
    # The run's own limits may only tighten the sandbox's (a warm sandbox's argv holds its
    # pool's ceilings).
    if run_timeout is not None:
        timeout = min(timeout, run_timeout)
        cap = min(cap, run_cap)

    if why is not None:
        sys.stderr.write("runner: refusing to run the code: its result could be forged: " + why + "\n")
        return UNPROTECTED
    if unsafe is not None:
        sys.stderr.write("runner: refusing to run the code: " + unsafe + "\n")
        return UNPROTECTED
    why = place_inputs(inputs)
    if why is not None:
        prepared.discard()
        sys.stderr.write("runner: refusing to run the code: " + why + "\n")
        return NO_PROGRAM
    pid = prepared.pid
    out = Capture(prepared.out_r, cap, "stdout")
    err = Capture(prepared.err_r, cap, "stderr")
    out.start()
    err.start()
    live = Live()
    pump = threading.Thread(target=live.pump, args=([out, err],), daemon=True)
    pump.start()
    # The code's budget starts when it has its code.
    started = time.monotonic()
    prepared.hand_over(code)
    waiter = Waiter(pid)
    waiter.start()
    waiter.join(timeout)
    timed_out = waiter.is_alive()
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            # Not yet its own group leader: kill the child alone (it may also have just exited).
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        waiter.join()
    returncode = waiter.returncode
    # Kubernetes timestamps have whole seconds: the runner's clock gives the real run time.
    duration_millis = int((time.monotonic() - started) * 1000)
    # Grandchildren may still hold the pipes open; killing them lets the readers reach EOF.
    kill_leftovers(pid)
    out.join()
    err.join()
    live.done.set()
    pump.join()

    files, files_omitted = collect_outputs(max_files, max_file_bytes)
    stdout, stdout_truncated = out.text()
    stderr, stderr_truncated = err.text()
    sig = -returncode if returncode < 0 else None
    exit_code = 128 + sig if sig is not None else returncode
    print_envelope(result_pairs(
        exit_code, stdout, stderr, stdout_truncated, stderr_truncated, sig,
        oom_kill_seen() if sig == signal.SIGKILL and not timed_out else None,
        timed_out, duration_millis, files, files_omitted))
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv))

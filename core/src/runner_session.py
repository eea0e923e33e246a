# sandboxrun runner, session mode: appended to runner.py (without its closing `if __name__` block)
# to make the program a session's sandbox starts (core/src/runner.rs: session_script), so that a
# single run's sandbox does not carry, nor compile, what only sessions need. What runner.py
# defines is used here as if it were in this file.

# Sessions: one interpreter kept between calls.
#
# Invoked as
#     python3 -I -S -c <runner.py and this file> --session OUTPUT_BYTES MAX_PROCS TIMEOUT_SECONDS [PRELOAD]
# the runner does what it does before any program (it makes itself unreachable, ignores signals,
# holds the network barrier, preloads), forks the session's interpreter, and then serves calls one
# at a time until its stdin ends or says `sandboxrun-close`. A session's stdin (in a Pod, the
# attach stream, opened again for every call, and perhaps cut by a sender that died) carries each
# call as lines:
#     sandboxrun-call <CALL> <payload bytes>
#     <the payload in base64, in lines of at most MAX_FRAME_LINE bytes>
#     sandboxrun-end <CALL>
# CALL names the call (1 to 128 of [A-Za-z0-9._-]); the payload is a program frame as a
# single-use runner reads it (core/src/runner.rs: session_frame). A call is taken only whole: a
# header inside a frame starts over with the new frame, a line that is not base64 drops the frame,
# and so does a payload of another size than announced. A sender starts every write with a
# newline, so the rest of a line it left cut short never joins its next header.
# A call whose name an earlier call had is dropped: each runs at most once.
# For each call the runner prints `sandboxrun-program-received <CALL>`, the live output lines,
# then one envelope as for a single program with two more fields, `"call": CALL` and
# `"session": {"alive": b, "ended": reason|null, "message": text|null}`; once `alive` is false
# the session is over and the runner exits after the envelope.
#
# The interpreter (SessionInterpreter) runs each call's code in one `__main__` namespace, so
# variables, imported modules and the files under /tmp stay from call to call. What a call starts
# ends with it: once its code returns, every other process of the sandbox is killed, and an
# interpreter left with threads is replaced by a fork of itself (a fork keeps only the forking
# thread), so nothing of an earlier call can write into a later call's output. What the runner
# reports about a call stays its own:
# - the output is what was written, while the call ran, to two FIFOs made for that call alone
#   under a directory of random names; the interpreter opens them when the call starts and closes
#   every descriptor on them when it ends, and the runner reads them to their end, which comes
#   only once every writer is gone;
# - the end, the duration and the timeout are the runner's: the interpreter's `done` or its death
#   (the kernel's word: the runner is PID 1, or else a subreaper); a call past its timeout has the
#   interpreter killed, and the session ends with it;
# - the exit code is the interpreter's `done N` (0, 1 for an uncaught exception, a SystemExit's
#   code), or the status of its death. The code can write on the interpreter's descriptors too:
#   a `done` of its own ends its call early, as `os._exit` would end a program, and any message
#   out of turn ends the session;
# - every call starts from the interpreter's machinery as it was when the session began: the
#   builtins (names a call added or replaced are undone), sys.stdin/stdout/stderr and the
#   exception hook, the signal handlers, the trace and profile hooks, the working directory.
# An interpreter that breaks this protocol (a message out of turn, a fork it does not report,
# output it does not close) ends the session: it is never trusted further.

SESSION_FLAG = "--session"
FRAME_CALL = b"sandboxrun-call "
FRAME_END = b"sandboxrun-end "
FRAME_CLOSE = b"sandboxrun-close"
FRAME_PREFIX = b"sandboxrun-"
# Longest line of a session's stdin (a header, or one line of base64).
MAX_FRAME_LINE = 1 << 16
# Largest payload of a call: a program frame's header, code and input section.
MAX_FRAME_PAYLOAD = 256 + MAX_PROGRAM_BYTES + MAX_INPUT_SECTION_BYTES
CALL_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
# The interpreter's descriptors: its orders from the runner, and its messages to it.
ORDERS_FD = 3
MESSAGES_FD = 4
# After `done`, how long the call's output may take to end (every writer was closed or killed:
# only an interpreter that kept a writer makes it wait), and how long a fork of the interpreter
# may take (under gVisor, about 200 ms for one with the data stack loaded).
OUTPUT_GRACE = 5.0
FORK_WAIT = 30.0
# PR_SET_CHILD_SUBREAPER: orphans of the sandbox are reparented to the runner, which reaps them.
PR_SET_CHILD_SUBREAPER = 36


def valid_call(call):
    return 0 < len(call) <= 128 and all(c in CALL_CHARS for c in call)


class CallReader:
    """Reads a session's calls from stdin (see above)."""

    OVERLONG = object()

    def __init__(self):
        self.buf = b""
        self.skipping = False

    def line(self):
        """The next line without its newline, OVERLONG for one past MAX_FRAME_LINE (skipped), or
        None once stdin ended."""
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line, self.buf = self.buf[:nl], self.buf[nl + 1:]
                if self.skipping:
                    self.skipping = False
                    return self.OVERLONG
                return line
            if len(self.buf) > MAX_FRAME_LINE:
                self.buf, self.skipping = b"", True
            chunk = os.read(0, 65536)
            if not chunk:
                return None
            self.buf += chunk

    def next_call(self):
        """(CALL, payload) of the next whole call, or None at the end of stdin or a close."""
        import binascii

        line = self.line()
        while True:
            if line is None or line == FRAME_CLOSE:
                return None
            if line is self.OVERLONG or not line.startswith(FRAME_CALL):
                if line:
                    sys.stderr.write("runner: ignoring a line outside any call on stdin\n")
                line = self.line()
                continue
            fields = line[len(FRAME_CALL):].split(b" ")
            if (len(fields) != 2 or not valid_call(fields[0]) or not fields[1].isdigit()
                    or int(fields[1]) > MAX_FRAME_PAYLOAD):
                sys.stderr.write("runner: bad call header on stdin: %r\n" % line[:200])
                line = self.line()
                continue
            call, size = fields[0], int(fields[1])
            parts, got, why = [], 0, None
            while True:
                line = self.line()
                if line is None:
                    return None
                if line is self.OVERLONG:
                    why = "a line was too long"
                elif line.startswith(FRAME_PREFIX):
                    break
                elif line and why is None:
                    try:
                        chunk = binascii.a2b_base64(line, strict_mode=True)
                    except (binascii.Error, ValueError):
                        chunk, why = b"", "a line was not base64"
                    got += len(chunk)
                    if got > size:
                        why = "it is longer than announced"
                    else:
                        parts.append(chunk)
            # `line` starts with FRAME_PREFIX: this call's end, or the next header (or a close)
            # after a frame that was cut short.
            if line != FRAME_END + call:
                sys.stderr.write("runner: call %s was cut short on stdin; dropped\n"
                                 % call.decode("ascii"))
                continue
            line = None
            if why is None and got != size:
                why = "it holds %d of %d bytes" % (got, size)
            if why is not None:
                sys.stderr.write("runner: dropping call %s: %s\n" % (call.decode("ascii"), why))
                line = self.line()
                continue
            return call, b"".join(parts)


def parse_program(payload):
    """A program frame held in memory (a session's call), as read_program returns one, or None
    (with the reason on stderr)."""
    header, nl, rest = payload.partition(b"\n")
    if not nl or len(header) > 128:
        sys.stderr.write("runner: the call's program has no header\n")
        return None
    parsed = parse_header(header)
    if parsed is None:
        return None
    size, timeout, cap, input_size, max_files, max_file_bytes = parsed
    if size + input_size != len(rest):
        sys.stderr.write("runner: the call's program holds %d bytes, its header says %d\n"
                         % (len(rest), size + input_size))
        return None
    inputs = parse_inputs(rest[size:])
    if inputs is None:
        return None
    return (rest[:size].decode("utf-8", errors="surrogateescape"), timeout, cap, inputs,
            min(max_files, MAX_OUTPUT_FILES), min(max_file_bytes, MAX_OUTPUT_FILE_BYTES))


def place_session_inputs(inputs):
    """place_inputs for a session's call: inputs/ and outputs/ may exist from earlier calls; a
    file of an earlier call is replaced by one of the same name, the others stay."""
    import stat

    try:
        for path in (input_dir(), output_dir()):
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                pass
        if not inputs:
            return None
        # As collect_outputs opens outputs/: never through a link (the code may have made one).
        before = os.lstat(input_dir())
        dfd = os.open(input_dir(), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            opened = os.fstat(dfd)
            if (not stat.S_ISDIR(before.st_mode) or not stat.S_ISDIR(opened.st_mode)
                    or (before.st_dev, before.st_ino) != (opened.st_dev, opened.st_ino)):
                return "%s is not a directory" % input_dir()
            os.fchmod(dfd, 0o755)
            for name, _ in inputs:
                try:
                    os.unlink(name, dir_fd=dfd)
                except FileNotFoundError:
                    pass
            write_inputs(dfd, inputs)
            os.fchmod(dfd, 0o555)
        finally:
            os.close(dfd)
    except OSError as exc:
        return "cannot prepare %s and %s: %s" % (input_dir(), output_dir(), exc)
    return None


def proc_table():
    """{pid: (ppid, state)} of every process /proc shows."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                # `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
                fields = f.read().rpartition(b")")[2].split()
            table[int(name)] = (int(fields[1]), fields[0])
        except (OSError, IndexError, ValueError):
            continue
    return table


def kill_descendants(keep):
    """Kills every live descendant of the runner but `keep` (None: all of them), until none is
    left; returns whether none is. The runner is PID 1 in a sandbox or a subreaper, so every
    process of the sandbox descends from it (an orphan is reparented to it); on a host (the
    runner's own tests) only its descendants are touched."""
    me = os.getpid()
    for attempt in range(200):
        table = proc_table()
        doomed = []
        for pid, (ppid, state) in table.items():
            if pid in (me, keep) or state == b"Z":
                continue
            seen, up = 0, ppid
            while up not in (me, 0, 1) and up in table and seen < 64:
                up, seen = table[up][0], seen + 1
            if up == me or me == 1:
                doomed.append(pid)
        if not doomed:
            return True
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.001 if attempt < 20 else 0.01)
    return False


def thread_count(pid):
    try:
        return len(os.listdir("/proc/%d/task" % pid))
    except OSError:
        return 0


def parent_of(pid):
    return proc_table().get(pid, (None, None))[0]


def become_subreaper():
    """Makes orphans of the sandbox the runner's children when it is not PID 1; returns why not,
    or None."""
    if os.getpid() == 1:
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return "prctl(PR_SET_CHILD_SUBREAPER) failed: " + os.strerror(ctypes.get_errno())
    except Exception as exc:
        return "cannot call prctl: %r" % (exc,)
    return None


class Events:
    """What the runner waits for in a session: the interpreter's messages (lines on its pipe) and
    the deaths of the runner's children (it reaps every process of the sandbox), in order."""

    def __init__(self, messages_fd):
        self.cond = threading.Condition()
        self.items = []
        threading.Thread(target=self.read, args=(messages_fd,), daemon=True).start()
        threading.Thread(target=self.reap, daemon=True).start()

    def push(self, item):
        with self.cond:
            self.items.append(item)
            self.cond.notify()

    def read(self, fd):
        buf = b""
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                self.push(("message", line[:200]))
            if len(buf) > 200:
                self.push(("message", b"(an overlong message)"))
                buf = b""

    def reap(self):
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            self.push(("exit", pid, os.waitstatus_to_exitcode(status)))

    def stray_message(self, interpreter):
        """A message that came between calls (none is due then), or None. Drops the deaths of
        other processes reaped meanwhile; keeps that of `interpreter` (it died idle: the next
        call is told so at once)."""
        with self.cond:
            strays = [item for item in self.items if item[0] == "message"]
            self.items = [item for item in self.items
                          if item[0] == "exit" and item[1] == interpreter]
            return strays[0][1] if strays else None

    def next(self, deadline):
        """The next event, or None once `deadline` (monotonic) passed."""
        with self.cond:
            while not self.items:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            return self.items.pop(0)


def send_later(fd, data):
    """Writes `data` on a thread of its own: an interpreter that stopped reading cannot block the
    runner, whose deadline still runs."""

    def write():
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            pass

    threading.Thread(target=write, daemon=True).start()


class CallPipes:
    """The two FIFOs of one call's output, and the runner's readers on them. The runner holds a
    writer of each until the interpreter has opened its own (a FIFO with no writer reads as its
    end)."""

    def __init__(self, directory, cap):
        self.paths, self.holds, self.captures = [], [], []
        name = os.urandom(12).hex()
        for stream in ("stdout", "stderr"):
            path = os.path.join(directory, "%s.%s" % (name, stream))
            os.mkfifo(path, 0o600)
            read = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            self.holds.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            os.set_blocking(read, True)
            self.paths.append(path)
            self.captures.append(Capture(read, cap, stream))
        for capture in self.captures:
            capture.start()

    def release(self):
        """Once the interpreter opened them (or will not): only its writers keep them open."""
        for fd in self.holds:
            os.close(fd)
        self.holds = []
        for path in self.paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        self.paths = []

    def join(self, timeout):
        """Whether both reached their end within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        for capture in self.captures:
            capture.join(max(0.0, deadline - time.monotonic()))
        return not any(c.is_alive() for c in self.captures)

    def close(self):
        for capture in self.captures:
            try:
                os.close(capture.fd)
            except OSError:
                pass


class Session:
    """The runner's side of a session: its interpreter, and the calls it runs in it."""

    def __init__(self, replaced, max_procs, env):
        self.calls_dir = os.path.join(TMP, ".sandboxrun-calls-" + os.urandom(8).hex())
        os.mkdir(self.calls_dir, 0o700)
        orders_r, self.orders_w = os.pipe()
        messages_r, messages_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            restore_signals(replaced)
            SessionInterpreter(max_procs, env, orders_r, messages_w).serve()
        os.close(orders_r)
        os.close(messages_w)
        # Only after the fork: a fork keeps only the forking thread.
        self.events = Events(messages_r)
        # The outputs/ files each call saw, so the next returns only what it made or changed.
        self.seen = {}

    def run(self, call, payload, cap, timeout):
        """Runs one call and prints its envelope; returns whether the session goes on."""
        stray = self.events.stray_message(self.pid)
        if stray is not None:
            # Written after its call's `done` (code that wrote one of its own, or a process of an
            # earlier call): the interpreter's word can no longer be told from the code's.
            self.end()
            print_envelope(not_run_pairs("sessionBroken", "the session's interpreter sent %r "
                                         "after its call ended, so the session was ended and "
                                         "nothing was run; start a new session"
                                         % stray[:60].decode("ascii", "replace"))
                           + session_pairs(call, False, "protocolBroken", None))
            return False
        program = parse_program(payload)
        if program is None:
            print_envelope(not_run_pairs("badProgram", "the call's program was malformed (see "
                                         "the sandbox's log); nothing was run")
                           + session_pairs(call, True, None, None))
            return True
        code, run_timeout, run_cap, inputs, max_files, max_file_bytes = program
        if run_timeout is not None:
            timeout = min(timeout, run_timeout)
            cap = min(cap, run_cap)
        why = place_session_inputs(inputs)
        if why is not None:
            print_envelope(not_run_pairs("badProgram", why + "; nothing was run")
                           + session_pairs(call, True, None, None))
            return True
        try:
            os.mkdir(self.calls_dir, 0o700)
        except FileExistsError:
            pass
        pipes = CallPipes(self.calls_dir, cap)
        live = Live()
        pump = threading.Thread(target=live.pump, args=(pipes.captures,), daemon=True)
        pump.start()
        data = code.encode("utf-8", errors="surrogateescape")
        started = time.monotonic()
        send_later(self.orders_w, b"run %s %s %d\n" % (pipes.paths[0].encode(),
                                                      pipes.paths[1].encode(), len(data)) + data)
        ended, message, status, timed_out, returncode = self.wait_for_call(started + timeout,
                                                                           pipes)
        duration_millis = int((time.monotonic() - started) * 1000)
        if ended is None:
            ended, message = self.clean_up_after_call()
        pipes.release()
        if ended is None and not pipes.join(OUTPUT_GRACE):
            ended, message = ("protocolBroken", "the session's interpreter kept the call's "
                              "output open after the call ended")
        if ended is not None:
            self.end()
            pipes.join(OUTPUT_GRACE)
        pipes.close()
        live.done.set()
        pump.join()
        files, files_omitted = collect_outputs(max_files, max_file_bytes, self.seen)
        out, err = pipes.captures
        stdout, stdout_truncated = out.text()
        stderr, stderr_truncated = err.text()
        sig = -returncode if returncode is not None and returncode < 0 else None
        if returncode is not None:
            status = 128 + sig if sig is not None else returncode
        print_envelope(result_pairs(
            status, stdout, stderr, stdout_truncated, stderr_truncated, sig,
            oom_kill_seen() if sig == signal.SIGKILL and not timed_out else None,
            timed_out, duration_millis, files, files_omitted)
            + session_pairs(call, ended is None, ended, message))
        return ended is None

    def wait_for_call(self, deadline, pipes):
        """Waits for the call's `started` and `done`, the interpreter's death or the deadline:
        (ended, message, status, timed_out, returncode), `ended` None while the session goes on,
        `returncode` set when the interpreter died (a waitpid status)."""
        state = "sent"
        while True:
            event = self.events.next(deadline)
            if event is None:
                return ("timedOut", "the call ran past its timeout, so the session's interpreter "
                        "was stopped and the session ended with it", None, True,
                        self.kill_interpreter())
            if event[0] == "exit":
                if event[1] == self.pid:
                    return ("interpreterExited", "the session's interpreter exited during the "
                            "call (its code ended the process, or it was killed), so the session "
                            "ended", None, False, event[2])
                continue
            line = event[1]
            if state == "sent" and line == b"started":
                state = "running"
                pipes.release()
                continue
            if state == "running" and line.startswith(b"done ") and line[5:].lstrip(b"-").isdigit():
                return None, None, int(line[5:]) & 0xFF, False, None
            return ("protocolBroken", "the session's interpreter sent %r out of turn, so the "
                    "session ended" % line[:60].decode("ascii", "replace"), None, False,
                    self.kill_interpreter())

    def kill_interpreter(self):
        """Kills the interpreter; its waitpid status."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        deadline = time.monotonic() + FORK_WAIT
        while True:
            event = self.events.next(deadline)
            if event is None:
                return -signal.SIGKILL
            if event[0] == "exit" and event[1] == self.pid:
                return event[2]

    def clean_up_after_call(self):
        """After `done`: kills what the call left running and replaces an interpreter left with
        threads by a fork of itself. (ended, message): ended None while the session goes on."""
        if not kill_descendants(self.pid):
            return "protocolBroken", "the call left processes that could not be stopped"
        if thread_count(self.pid) <= 1:
            return None, None
        send_later(self.orders_w, b"fork\n")
        deadline = time.monotonic() + FORK_WAIT
        new, old_gone = None, False
        while new is None or not old_gone:
            event = self.events.next(deadline)
            if event is None:
                break
            if event[0] == "exit":
                old_gone = old_gone or event[1] == self.pid
                continue
            if event[1].startswith(b"forked ") and event[1][7:].isdigit() and new is None:
                new = int(event[1][7:])
                continue
            break
        if new is None or not old_gone:
            self.kill_interpreter()
            return ("protocolBroken", "the session's interpreter did not continue without the "
                    "threads the call left, so the session ended")
        self.pid = new
        if parent_of(new) != os.getpid() or thread_count(new) != 1:
            return ("protocolBroken", "the session's interpreter did not continue without the "
                    "threads the call left, so the session ended")
        if not kill_descendants(self.pid):
            return "protocolBroken", "the call left processes that could not be stopped"
        return None, None

    def end(self):
        """Stops the interpreter and everything else of the sandbox."""
        try:
            os.close(self.orders_w)
        except OSError:
            pass
        kill_descendants(None)


class SessionInterpreter:
    """The forked child that keeps a session's state: it sets itself up as `python3 -I -c` would
    (as become_user_program does) and runs each call's code in one `__main__`. Never returns.
    Everything its loop uses is bound before the first call, so code that replaces a module's
    function does not change how the next call is received or reported."""

    def __init__(self, max_procs, env, orders_r, messages_w):
        try:
            self.set_up(max_procs, env, orders_r, messages_w)
        except BaseException:
            os._exit(1)

    def set_up(self, max_procs, env, orders_r, messages_w):
        import fcntl

        os.setsid()
        resource.setrlimit(resource.RLIMIT_NPROC, (max_procs, max_procs))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # The two pipes to 3 and 4 (by way of high numbers, so neither overwrites the other), and
        # /dev/null for 0-2 between calls; nothing else of the runner's stays open.
        orders = fcntl.fcntl(orders_r, fcntl.F_DUPFD, 64)
        messages = fcntl.fcntl(messages_w, fcntl.F_DUPFD, 64)
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.dup2(orders, ORDERS_FD)
        os.dup2(messages, MESSAGES_FD)
        os.closerange(MESSAGES_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        os.chdir(TMP)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["-c"]
        self.streams()
        import site

        site.main()
        import builtins

        main = type(sys)("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        self.main = main
        self.builtins = builtins
        self.pristine = dict(builtins.__dict__)
        self.handlers = {}
        for sig in signal.valid_signals():
            try:
                self.handlers[sig] = signal.getsignal(sig)
            except (OSError, ValueError):
                pass
        self.excepthook = sys.excepthook
        self.buf = b""
        # Bound now: see the class documentation.
        self.read, self.write, self.open, self.dup2, self.close = (
            os.read, os.write, os.open, os.dup2, os.close)
        self.fork, self.exit, self.getpid, self.waitpid = os.fork, os._exit, os.getpid, os.waitpid
        self.fstat, self.listdir, self.chdir = os.fstat, os.listdir, os.chdir
        self.signal, self.getsignal, self.setitimer = signal.signal, signal.getsignal, signal.setitimer
        self.timers = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
        self.settrace, self.setprofile = sys.settrace, sys.setprofile
        self.compile, self.exec = compile, exec
        self.pid = os.getpid()

    def streams(self):
        """New sys.stdin/stdout/stderr on 0-2, as `python3 -c` has them (stdout line-buffered, as
        in a single run, so its output is seen as it comes)."""
        sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
        sys.stderr = sys.__stderr__ = open(
            2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
        )

    def say(self, message):
        try:
            self.write(MESSAGES_FD, message + b"\n")
        except OSError:
            self.exit(1)

    def receive(self, size=None):
        """A line of orders (size None), or exactly `size` bytes; the session ends (the runner
        closed the pipe) when they do not come."""
        while True:
            if size is None:
                nl = self.buf.find(b"\n")
                if nl >= 0:
                    line, self.buf = self.buf[:nl], self.buf[nl + 1:]
                    return line
                if len(self.buf) > 4096:
                    self.exit(1)
            elif len(self.buf) >= size:
                data, self.buf = self.buf[:size], self.buf[size:]
                return data
            chunk = self.read(ORDERS_FD, 1 << 16)
            if not chunk:
                self.exit(0)
            self.buf += chunk

    def serve(self):
        status = 1
        try:
            while True:
                order = self.receive().split(b" ")
                if order == [b"fork"]:
                    if self.fork() != 0:
                        self.exit(0)
                    self.pid = self.getpid()
                    self.say(b"forked %d" % self.pid)
                    continue
                if len(order) != 4 or order[0] != b"run" or not order[3].isdigit():
                    self.exit(1)
                code = self.receive(int(order[3]))
                self.say(b"done %d" % self.run_call(order[1], order[2], code))
        except BaseException:
            status = 1
        self.exit(status)

    def restore(self):
        """The interpreter's machinery as it was when the session began (see the class)."""
        names = self.builtins.__dict__
        for name in [n for n in names if n not in self.pristine]:
            del names[name]
        for name, value in self.pristine.items():
            if names.get(name, self) is not value:
                names[name] = value
        self.main.__dict__["__builtins__"] = self.builtins
        for sig, handler in self.handlers.items():
            try:
                if self.getsignal(sig) is not handler:
                    self.signal(sig, handler)
            except (OSError, ValueError, TypeError):
                pass
        self.settrace(None)
        self.setprofile(None)
        threading.settrace(None)
        threading.setprofile(None)
        sys.excepthook = self.excepthook
        sys.modules["__main__"] = self.main
        try:
            self.chdir(TMP)
        except OSError:
            pass
        # Processes of earlier calls were killed by the runner: reap them, so they do not count
        # against the process limit.
        try:
            while self.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass

    def run_call(self, out_path, err_path, code):
        self.restore()
        fifos = []
        for fd, path in ((1, out_path), (2, err_path)):
            opened = self.open(path, os.O_WRONLY)
            fifos.append(self.fstat(opened))
            self.dup2(opened, fd)
            self.close(opened)
        self.streams()
        self.say(b"started")
        status = 0
        try:
            self.exec(self.compile(code.decode("utf-8", "surrogateescape"), "<string>", "exec"),
                      self.main.__dict__)
        except SystemExit as exc:
            status = exit_status(exc)
        except BaseException:
            kind, value, tb = sys.exc_info()
            # The traceback starts at the user's code, as `python3 -c` prints it.
            tb = tb.tb_next if tb is not None else None
            try:
                sys.excepthook(kind, value.with_traceback(tb), tb)
            except BaseException:
                pass
            status = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                status = 120
        if self.getpid() != self.pid:
            # A process the code forked that returned instead of exiting: it ends here, as it
            # would have at the end of a program, and never joins the session's loop.
            self.exit(status)
        # A timer the code set would fire while the session idles (SIGALRM's default action ends
        # the interpreter): what a call starts ends with it.
        for timer in self.timers:
            try:
                self.setitimer(timer, 0)
            except (OSError, ValueError):
                pass
        # Every descriptor on the call's FIFOs (0-2, and copies the code made) now points at
        # /dev/null: the call's output ends here, whatever the code kept.
        null = self.open("/dev/null", os.O_RDWR)
        for name in self.listdir("/proc/self/fd"):
            try:
                fd = int(name)
                st = self.fstat(fd)
            except (OSError, ValueError):
                continue
            if fd != null and any((st.st_dev, st.st_ino) == (f.st_dev, f.st_ino) for f in fifos):
                self.dup2(null, fd)
        self.close(null)
        return status


def session_pairs(call, alive, ended, message):
    return [("call", call.decode("ascii")),
            ("session", Obj([("alive", alive), ("ended", ended), ("message", message)]))]


def session_main(argv):
    """`--session OUTPUT_BYTES MAX_PROCS TIMEOUT_SECONDS [PRELOAD]`: see the top of this part."""
    if len(argv) not in (4, 5) or argv[0] != SESSION_FLAG:
        sys.stderr.write("usage: runner --session OUTPUT_BYTES MAX_PROCS TIMEOUT_SECONDS [PRELOAD]"
                         " < calls\n")
        return 2
    global TMP, RESULT_FD
    cap, max_procs, timeout = int(argv[1]), int(argv[2]), float(argv[3])
    TMP = os.environ.get("SANDBOXRUN_RUNNER_TMP") or TMP
    why, replaced, status = before_the_program("any call")
    if status is not None:
        return status
    # On a host the runner is no PID 1: it must become the reaper of what the code leaves.
    why = why or become_subreaper()
    if why is not None:
        sys.stderr.write("runner: refusing to run a session: its results could be forged: "
                         + why + "\n")
        return UNPROTECTED
    modules = argv[4].split(",") if len(argv) == 5 and argv[4] else []
    if modules:
        RESULT_FD = os.dup(1)
        unsafe = preload(modules, None)
        if unsafe is not None:
            sys.stderr.write("runner: refusing to run a session: " + unsafe + "\n")
            return UNPROTECTED
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    session = Session(replaced, max_procs, env)
    if modules:
        mark_idle()
    calls = CallReader()
    # A call is run once: a sender that could not tell whether its frame arrived (an operator
    # that restarted before the confirmation reached the log) sends it again under its name.
    taken = set()
    while True:
        item = calls.next_call()
        if item is None:
            break
        call, payload = item
        if call in taken:
            continue
        taken.add(call)
        os.write(RESULT_FD, b"%s %s\n" % (PROGRAM_RECEIVED_LINE, call))
        if not session.run(call, payload, cap, timeout):
            return 0
    session.end()
    return 0



if __name__ == "__main__":
    sys.exit(session_main(sys.argv[1:]))

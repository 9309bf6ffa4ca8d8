"""pty_drive.py — drive a program through a pseudo-terminal (standard library only).

    s = Session([lutra], env={"LUTRA_HISTORY": path})
    s.expect(r"> $")            # waits for a regex in the output seen so far (ANSI stripped)
    s.send("1+1\\n")
    s.expect(r"\\b2\\b")
    s.eof(); s.wait()           # Ctrl-D, then the exit status

Also a tiny checker: check(name, cond, detail), check_reply(s, name, line, pattern, prompt)
(a line typed, its reply checked, the prompt awaited), check_completion (the same for a TAB
completion, the line then dropped with Ctrl-C) and summary() print "N passed, N failed".
"""
import os
import pty
import re
import select
import signal
import sys
import time

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\x1b[=>]|\r|\x07")


class Timeout(Exception):
    pass


class Session:
    def __init__(self, argv, env=None, cwd=None, timeout=8.0):
        self.timeout = timeout
        self.raw = b""
        self.pos = 0  # expect() searches from here: text consumed by earlier matches is skipped
        full_env = dict(os.environ)
        full_env.update({"TERM": "dumb", "COLUMNS": "200", "LINES": "50", "INPUTRC": "/dev/null"})
        full_env.update(env or {})
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            if cwd:
                os.chdir(cwd)
            try:
                os.execve(argv[0], argv, full_env)
            finally:
                os._exit(127)
        self.status = None

    def _read(self, wait):
        r, _, _ = select.select([self.fd], [], [], wait)
        if not r:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:
            data = b""
        if not data:
            raise EOFError
        self.raw += data
        return True

    @property
    def text(self):
        return ANSI.sub("", self.raw.decode("utf-8", "replace"))

    def expect(self, pattern, timeout=None):
        """Waits until pattern matches the output after the previous match; returns the match."""
        deadline = time.time() + (timeout or self.timeout)
        rx = re.compile(pattern, re.M)
        while True:
            m = rx.search(self.text, self.pos)
            if m:
                self.pos = m.end()
                return m
            left = deadline - time.time()
            if left <= 0:
                raise Timeout("timed out waiting for %r; output so far:\n%s" % (pattern, self.text))
            try:
                self._read(min(left, 0.2))
            except EOFError:
                m = rx.search(self.text, self.pos)
                if m:
                    self.pos = m.end()
                    return m
                raise Timeout("EOF waiting for %r; output:\n%s" % (pattern, self.text))

    def send(self, s):
        os.write(self.fd, s.encode())

    def line(self, s):
        self.send(s + "\n")

    def eof(self):
        self.send("\x04")

    def interrupt(self):
        self.send("\x03")

    def wait(self, timeout=None):
        """Reads until the program exits; returns its exit code (or -signal)."""
        deadline = time.time() + (timeout or self.timeout)
        while self.status is None and time.time() < deadline:
            try:
                self._read(0.05)
            except EOFError:
                time.sleep(0.02)
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = st
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            _, self.status = os.waitpid(self.pid, 0)
            raise Timeout("program did not exit; output:\n%s" % self.text)
        try:
            while self._read(0):
                pass
        except (EOFError, OSError):
            pass
        os.close(self.fd)
        return os.waitstatus_to_exitcode(self.status)

    def close(self):
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                _, self.status = os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            try:
                os.close(self.fd)
            except OSError:
                pass


passed = 0
failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s %s" % (name, detail))
        sys.stdout.flush()


def check_reply(s, name, line, pattern, prompt):
    """Types line into session s, checks the reply matches pattern, then waits for the prompt."""
    s.line(line)
    check(name, s.expect(pattern) is not None)
    s.expect(prompt)


def check_completion(s, name, typed, pattern, prompt):
    """Types typed (with its TABs) into session s, checks the line or the candidates listed
    match pattern, then drops the line (Ctrl-C) and waits for the prompt."""
    s.send(typed)
    check(name, s.expect(pattern) is not None)
    s.interrupt()
    s.expect(prompt)


def scenario(name, fn):
    """Runs fn(); a Timeout or exception counts as one failure with the output shown."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - any failure of a scenario is a test failure
        check(name, False, "\n%s: %s" % (type(e).__name__, e))


def summary():
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0

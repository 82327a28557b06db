"""The sandbox's agent: started by bubblewrap inside a lab's sandbox, it starts the learner's processes there.

Usage (by ``grading/sandbox/namespaces.py`` only)::

    python -I -S agent.py CONTROL_FD SETTINGS_JSON

It runs inside the sandbox's namespaces (PID, mount, IPC, network, UTS), sets
the resource limits every learner process inherits, drops to the sandbox's
user (when bubblewrap ran as root), tells the grader it is ready, then serves
*relays* (``grading/sandbox/relay.py``): each relay, a trusted process
outside, sends over the control socket one end of a fresh socket pair; over
that pair it sends what to run (argv, cwd, environment) with the descriptors
the process gets, and gets back the process's id and, later, its exit status.
Signals the relay receives are passed on; when the relay goes away, the
process's whole session is killed. When the control socket closes (the
grader's side is gone) the agent exits, and with it the sandbox's PID
namespace: every process in it dies.

Standard library only, and nothing is imported after start-up (it runs with
``-I -S``, outside the course's packages).
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import json
import os
import resource
import select
import signal
import socket
import sys

MAX_MESSAGE = 1 << 20  # bytes of one request (argv + environment)
MAX_FDS = 16  # descriptors one process may be handed
PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 38, 4, 24
FILTER: list = []  # [path, descriptor]: a seccomp program every process started here finds open at that number


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def set_limits(limits: dict) -> None:
    """Hard and soft limits that every process started here inherits (and cannot raise).

    ``limits``: {"RLIMIT_AS": [soft, hard], ...}. A hard limit already lower stays (only root
    could raise it).
    """
    for name, (soft, hard) in limits.items():
        which = getattr(resource, name)
        current = resource.getrlimit(which)[1]
        if current != resource.RLIM_INFINITY and os.geteuid() != 0:
            hard = min(hard, current)
            soft = min(soft, hard)
        resource.setrlimit(which, (soft, hard))


def drop_privileges(uid: int, gid: int) -> None:
    """Root inside the sandbox (bubblewrap ran as root): become the sandbox user, for good."""
    for cap in range(64):  # nothing this process starts can regain a capability
        _prctl(PR_CAPBSET_DROP, cap)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("could not drop to the sandbox user")


def _receive(conn: socket.socket):
    """One request with its descriptors: (dict, [fds]) or (None, []) at end of file."""
    size = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
    data, ancillary, _, _ = conn.recvmsg(MAX_MESSAGE, size)
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    try:
        return json.loads(data), list(fds)
    except ValueError:
        for fd in fds:
            os.close(fd)
        return {}, []


def _child(request: dict, fds: list) -> None:  # pragma: no cover - between fork and exec
    """In the forked child: the descriptors in place, a new session, then exec. Never returns."""
    try:
        targets = [int(t) for t in request["fds"]]
        if len(targets) != len(fds) or len(set(targets)) != len(targets):
            raise ValueError("descriptors do not match the request")
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in fds]  # out of the way of the targets
        for source, target in zip(high, targets):
            os.dup2(source, target, inheritable=True)
        start = 0
        for fd in [*sorted(targets), resource.getrlimit(resource.RLIMIT_NOFILE)[0]]:
            if fd > start:  # (os.closerange misbehaves on an empty range)
                os.closerange(start, fd)
            start = fd + 1
        if FILTER and int(FILTER[1]) not in targets:  # for a nested bubblewrap's --seccomp (read once, by it)
            opened = os.open(str(FILTER[0]), os.O_RDONLY)
            if opened != int(FILTER[1]):
                os.dup2(opened, int(FILTER[1]), inheritable=True)
                os.close(opened)
        os.setsid()
        os.umask(0o077)
        os.chdir(str(request["cwd"]))
        argv = [str(a) for a in request["argv"]]
        env = {str(k): str(v) for k, v in dict(request["env"]).items()}
        os.execve(argv[0], argv, env)
    except BaseException as exc:  # noqa: BLE001
        try:
            os.write(2, f"the sandbox could not start the process: {exc}\n".encode())
        finally:
            os._exit(127)


def _children(pid: int) -> list:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                out += [int(child) for child in f.read().split()]
    except (OSError, ValueError):
        pass
    return out


def _innermost(pid: int):
    """The process a signal for ``pid`` is meant for: ``pid`` itself, or, when ``pid`` is the bubblewrap
    of a nested sandbox (a process started in a sandbox of its own), the first process in it that is
    not bubblewrap (bubblewrap passes no signal on, and would die of SIGUSR1). None while there is none."""
    for _ in range(4):  # bwrap, its PID namespace's init (also bwrap), the process
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                if f.read().strip() != "bwrap":
                    return pid
        except OSError:
            return None
        children = _children(pid)
        if not children:
            return None
        pid = children[0]
    return None


def _send(conn: socket.socket, message: dict) -> None:
    """To a relay; one that is gone is no error (its end closing is handled where it is read)."""
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass


class Agent:
    def __init__(self, control: socket.socket):
        self.control = control
        self.by_conn: dict[int, list] = {}  # conn fd -> [conn, pid or None, still running]
        self.by_pid: dict[int, socket.socket] = {}
        self.wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: sys.exit(0))

    def serve(self) -> None:
        poller = select.poll()
        poller.register(self.control, select.POLLIN)
        poller.register(self.wakeup_r, select.POLLIN)
        while True:
            for fd, _events in poller.poll():
                if fd == self.control.fileno():
                    if not self._accept(poller):
                        return  # the grader's side is gone: the sandbox ends with us
                elif fd == self.wakeup_r:
                    os.read(self.wakeup_r, 4096)
                    self._reap()
                elif fd in self.by_conn:
                    try:
                        self._serve_conn(fd, poller)
                    except Exception as exc:  # noqa: BLE001 - one broken relay must not end the sandbox
                        os.write(2, f"agent: {type(exc).__name__}: {exc}\n".encode())

    def _accept(self, poller) -> bool:
        message, fds = _receive(self.control)
        if message is None:
            return False
        for fd in fds:
            try:
                conn = socket.socket(fileno=fd)
            except OSError:
                os.close(fd)
                continue
            self.by_conn[conn.fileno()] = [conn, None, False]
            poller.register(conn, select.POLLIN)
        return True

    def _serve_conn(self, fd: int, poller) -> None:
        conn, pid, running = self.by_conn[fd]
        try:
            request, fds = _receive(conn)
        except OSError:
            request, fds = None, []
        if request is None:  # the relay is gone: so is what it stood for (its whole session)
            poller.unregister(fd)
            del self.by_conn[fd]
            conn.close()
            if pid is not None:
                self._kill_session(pid, running)
            return
        if pid is None and "argv" in request:
            self._spawn(fd, request, fds)  # takes the descriptors
            return
        for extra in fds:
            os.close(extra)
        if running and str(request.get("signal", "")).isdigit():
            target = _innermost(pid)
            if target is None:
                return  # its nested sandbox is still starting: nothing of the learner's runs yet
            try:
                os.kill(target, int(request["signal"]))  # passed on as the relay got it: to the process alone
            except (OSError, ValueError, OverflowError):
                pass

    def _spawn(self, fd: int, request: dict, fds: list) -> None:
        conn = self.by_conn[fd][0]
        error = ""
        try:
            pid = os.fork()
        except OSError as exc:
            pid, error = None, str(exc)
        if pid == 0:
            _child(request, fds)
        for passed in fds:
            os.close(passed)
        if pid is None:
            _send(conn, {"error": error})
            return
        self.by_conn[fd] = [conn, pid, True]
        self.by_pid[pid] = fd
        _send(conn, {"pid": pid})

    @staticmethod
    def _kill_session(pid: int, running: bool) -> None:
        """SIGKILL the process's session (its process group) and, while it runs, the process."""
        for target in [os.killpg, os.kill] if running else [os.killpg]:
            try:
                target(pid, signal.SIGKILL)
            except OSError:
                pass

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = self.by_pid.pop(pid, None)
            if fd is not None and fd in self.by_conn:
                entry = self.by_conn[fd]
                entry[2] = False
                _send(entry[0], {"status": status})


def main(control_fd: int, settings: dict) -> None:
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    set_limits(settings.get("limits", {}))
    if settings.get("uid") is not None and os.getuid() == 0:
        drop_privileges(int(settings["uid"]), int(settings["gid"]))
    _prctl(PR_SET_DUMPABLE, 0)  # no process of the sandbox may read our memory or descriptors
    FILTER[:] = settings.get("filter") or []
    control = socket.socket(fileno=control_fd)
    control.send(json.dumps({"ready": os.getpid(), "uid": os.getuid()}).encode())
    try:
        Agent(control).serve()
    except BaseException:
        import traceback  # (the only late import: the agent is about to end, and the sandbox with it)

        traceback.print_exc()
        raise


if __name__ == "__main__":
    main(int(sys.argv[1]), json.loads(sys.argv[2]))

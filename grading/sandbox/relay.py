"""A relay: the local stand-in of one process that runs inside a lab's sandbox.

Usage (by :func:`commtax.learner_process.learner_popen` only)::

    python -I -S relay.py CONTROL_FD SPEC_JSON

``SPEC_JSON`` holds ``argv``, ``cwd`` and ``fds`` (the descriptors of this
process the one inside gets, at the same numbers: 0, 1, 2 and those the
caller passed). The relay hands all of it, with its own environment, to the
sandbox's agent (``grading/sandbox/agent.py``) through a fresh socket pair
sent over the control socket, then mirrors the process inside: it passes on
the signals it gets (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT) and
exits as that process exits (same code, or killed by the same signal). If the
relay is killed, its end of the pair closes and the agent kills the process's
whole session: killing the relay kills what it stands for.

Trusted code (it runs outside the sandbox, as the grader's user), standard
library only. It never reads descriptors the agent might send back.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys

FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT")
NOT_STARTED = 125  # the exit code when the sandbox could not start the process


def _die_like(status: int) -> None:
    """Exit as a process with wait status ``status`` did."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not kill (should not happen)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else NOT_STARTED)


def main(control_fd: int, spec: dict) -> None:
    control = socket.socket(fileno=control_fd)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    control.sendmsg([b"{}"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]))])
    theirs.close()
    control.close()
    fds = [int(fd) for fd in spec["fds"]]
    request = {"argv": spec["argv"], "cwd": spec["cwd"], "env": dict(os.environ), "fds": fds}
    mine.sendmsg([json.dumps(request).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    for fd in fds:  # ours no longer: the process inside holds them (a pipe must see EOF when it exits)
        if fd > 2:
            os.close(fd)

    def forward(sig, _frame):
        try:
            mine.send(json.dumps({"signal": int(sig)}).encode())
        except OSError:
            pass

    for name in FORWARDED:
        signal.signal(getattr(signal, name), forward)
    while True:
        try:
            data = mine.recv(1 << 16)
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue
        if not data:  # the sandbox is gone, and the process with it: report it killed
            os._exit(128 + signal.SIGKILL)
        try:
            reply = json.loads(data)
        except ValueError:
            continue
        if "error" in reply:
            os.write(2, f"the sandbox could not start {spec['argv'][:3]}: {reply['error']}\n".encode())
            os._exit(NOT_STARTED)
        if "status" in reply:
            _die_like(int(reply["status"]))


if __name__ == "__main__":
    main(int(sys.argv[1]), json.loads(sys.argv[2]))

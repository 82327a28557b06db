"""Who one sandbox runs as: a fresh user id (root mode) and a fresh session keyring (every sandbox).

Nothing else on the machine shares either, so learner code can signal, count against its limits, or read
the secrets of no process but its own lab run's.
"""

from __future__ import annotations

import os

SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
KEYCTL_JOIN_SESSION_KEYRING = 1


def fresh_session_keyring() -> bool:
    """Join a new, empty, anonymous session keyring (``keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)``): called
    in the child before bwrap execs, so no sandbox shares the grader's session keyring (otherwise a lab
    can read the teacher's keys, and carry a hidden test's inputs from one run to another through them). True if joined."""
    import ctypes

    number = SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        return (
            libc.syscall(ctypes.c_long(number), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_void_p(None)) >= 0
        )
    except (OSError, AttributeError):
        return False


FRESH_UIDS = (0x60000000, 0x6FFFFFFF)  # root mode: each sandbox's user is drawn from here (no passwd entry)


def fresh_uid() -> int:
    """A user id for one sandbox, that no account of this machine has (as systemd's DynamicUser does)."""
    import pwd
    import secrets

    while True:
        uid = FRESH_UIDS[0] + secrets.randbelow(FRESH_UIDS[1] - FRESH_UIDS[0])
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid

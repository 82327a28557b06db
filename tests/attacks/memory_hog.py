# Variant: many processes, each under the per-process memory limit, together more than the machine
# should give one lab run: 8 processes of 400 MB each (3.2 GB), all touched and held at once (each
# waits until all have theirs, so the load of the machine cannot spread them out). The worker fails
# its import as soon as one of them is killed; if all got their memory (no bound on the run's total),
# the reference functions below run and score.
import subprocess as _subprocess
import sys as _sys
import tempfile as _tempfile
import time as _time

_HOG = r"""
import os, sys, time
block = bytearray(400 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
end = time.monotonic() + 60
while len(os.listdir(sys.argv[1])) < 8 and time.monotonic() < end:
    time.sleep(0.05)
"""
_held = _tempfile.mkdtemp()
_hogs = [_subprocess.Popen([_sys.executable, "-c", _HOG, _held, "ATTACK_MARKER"]) for _ in range(8)]
while any(hog.poll() is None for hog in _hogs):
    if any(hog.returncode not in (None, 0) for hog in _hogs):
        for hog in _hogs:
            hog.kill()
        raise MemoryError(f"a hog was killed: {[hog.wait() for hog in _hogs]}")
    _time.sleep(0.05)
if any(hog.returncode != 0 for hog in _hogs):
    raise MemoryError(f"the hogs ended with {[hog.returncode for hog in _hogs]}")

# Variant: many processes, each under the per-process memory limit, together more than the machine
# should give one lab run: 8 processes of 400 MB each (3.2 GB), all touched and held at once. The
# worker waits for them and fails its import if any of them was killed; if all got their memory
# (no bound on the run's total), the reference functions below run and score.
import subprocess as _subprocess
import sys as _sys

_HOG = r'''
import sys, time
block = bytearray(400 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
time.sleep(3)
'''
_hogs = [_subprocess.Popen([_sys.executable, "-c", _HOG, "ATTACK_MARKER"]) for _ in range(8)]
_codes = [hog.wait() for hog in _hogs]
if any(code != 0 for code in _codes):
    raise MemoryError(f"the hogs ended with {_codes}")

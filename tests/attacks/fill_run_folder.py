# Disk, same-user mode: each rank fills its own rank folder, the only host folder learner code can
# write, with 1 MiB files until the file system refuses (ENOSPC) or ATTACK_LIMIT MiB are written, and holds
# them for a second. In same-user mode those folders sat on the host's disk, capped per file only: a class
# graded with grade-many --jobs 2 beside such a student lost points when the disk filled (the classmate's own
# writes met ENOSPC). The prelude of a starter: it runs at import, in each rank (argv: RUN_DIR RANK).
import os as _os
import sys as _sys
import time as _time


def _fill(limit_mib=int("ATTACK_LIMIT")):
    if len(_sys.argv) < 3 or not _sys.argv[2].isdigit():
        return  # not a rank (the lab's worker): nothing writable to fill
    folder = _os.path.join(_sys.argv[1], f"rank{_sys.argv[2]}")
    chunk = b"ATTACK_MARKER" * (2**20 // 13)
    for i in range(limit_mib):
        try:
            with open(_os.path.join(folder, f"ATTACK_MARKER-{i}"), "wb") as f:
                f.write(chunk)
        except OSError:
            break
    _time.sleep(1.0)


_fill()

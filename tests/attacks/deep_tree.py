# Clean-up: each rank makes a 3,000-deep chain of folders in its own rank folder (0.4 s),
# with a file at every level, and a link out at the bottom. shutil.rmtree(ignore_errors=True) raised
# RecursionError on it: the grading stopped, the submission's later labs were never graded and the files
# stayed on the disk. The prelude of a starter: it runs at import, in each rank (argv: RUN_DIR RANK).
import os as _os
import sys as _sys


def _deep_chain(levels=3000):
    if len(_sys.argv) < 3 or not _sys.argv[2].isdigit():
        return  # not a rank (the lab's worker): nothing writable to fill
    folder = _os.path.join(_sys.argv[1], f"rank{_sys.argv[2]}")
    try:
        fd = _os.open(folder, _os.O_RDONLY | _os.O_DIRECTORY)
    except OSError:
        return
    try:
        for _ in range(levels):
            _os.mkdir("d", dir_fd=fd)
            child = _os.open("d", _os.O_RDONLY | _os.O_DIRECTORY, dir_fd=fd)
            _os.close(fd)
            fd = child
            note = _os.open("f", _os.O_WRONLY | _os.O_CREAT, 0o644, dir_fd=fd)
            _os.write(note, b"ATTACK_MARKER")
            _os.close(note)
        _os.symlink("/", "out", dir_fd=fd)
    except OSError:
        pass
    finally:
        _os.close(fd)


_deep_chain()

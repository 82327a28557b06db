# Make the launcher quote files the learner must not read. Inside a rank, a lab
# function (1) swaps the rank's copy of its own file for a link to an answer module, then either
# (2) writes a forged faulthandler dump naming lines of the answers (commtax/formulas/, a solution,
# the grader's hidden tests, by relative and by absolute name) and exits, so that the launcher
# describes an "exited" rank from that dump (on 2 ranks), or (3) forges its heartbeat with the same
# frames under a torch.distributed wait and sleeps, so that the deadlock detector reports it (on 3
# ranks; the runner then remembers the hang). Outside a rank (the tests' worker) every function
# just fails. A launcher that resolved those names would quote lines of
# commtax/formulas/collectives.py into the report; it must not. Two functions are left as stubs so that the
# tests needing them fail without starting ranks: two runs are enough, and they cost the suite less.
import os as _os
import sys as _sys
import time as _time

_TARGETS = (
    "commtax/formulas/collectives.py",
    "commtax/formulas/network.py",
    "commtax/formulas/bill.py",
    "labs/lab-01-alpha-beta/solution.py",
    "labs/lab-02-ring-allreduce/solution.py",
    "labs/lab-01-alpha-beta/hidden/test_hidden_alpha_beta.py",
    "grading/hidden/lab-01-alpha-beta/test_hidden_alpha_beta.py",
)
_TORCH_WAIT = ["/x/site-packages/torch/distributed/distributed_c10d.py", 1, "recv"]


def _in_rank():
    return len(_sys.argv) > 2 and _sys.argv[0].endswith("_rank.py")


def _forged_frames(rank):
    frames = []
    for base in ("", _os.getcwd() + _os.sep, _os.path.dirname(_os.getcwd()) + _os.sep):
        for target in _TARGETS:
            frames.append([base + target, 5 + 7 * rank + len(frames) % 40, "leak"])
    return frames


def _swap_own_file():
    here = _os.path.abspath(__file__)
    answers = _os.path.join(_os.getcwd(), "commtax", "formulas", "collectives.py")
    try:
        link = here + ".swap"
        _os.symlink(answers, link)
        _os.replace(link, here)
    except OSError:
        pass


def _forge_dump_and_exit(run_dir, rank):
    lines = ["Current thread 0x0000000000000001 (most recent call first):"]
    for file, line, func in _forged_frames(rank):
        lines.append(f'  File "{file}", line {line} in {func}')
    lines.append(f'  File "{_os.path.join(_os.getcwd(), "commtax", "ranks", "_rank.py")}", line 1 in main')
    with open(_os.path.join(run_dir, f"rank{rank}", f"rank{rank}.stack"), "a") as f:
        f.write("\n".join(lines) + "\n")
    _os._exit(1)


def _forge_heartbeat_and_wait(rank):
    import commtax.ranks._heartbeat as beat

    frames = [_TORCH_WAIT] + _forged_frames(rank)
    beat._stack = lambda frame, limit=60: frames[:limit]
    _time.sleep(120)


def _forger(name):
    def forged(*args, **kwargs):
        if not _in_rank():
            raise RuntimeError("forged")
        _swap_own_file()
        rank = int(_sys.argv[2])
        if _os.environ.get("WORLD_SIZE") == "2":
            _forge_dump_and_exit(_sys.argv[1], rank)
        _forge_heartbeat_and_wait(rank)

    return forged


for _name in [n for n, v in list(globals().items()) if callable(v) and not n.startswith("_")]:
    globals()[_name] = _forger(_name)


def ring_all_gather(tensor, owned_chunk, group=None):
    """Left unwritten: the tests that need it fail at once."""
    raise NotImplementedError("ring_all_gather: not implemented yet")


def naive_all_reduce(tensor, root=0, group=None):
    """Left unwritten: the tests that need it fail at once."""
    raise NotImplementedError("naive_all_reduce: not implemented yet")

"""Worker functions for tests/test_grading.py's per-rank sandbox test (run on 2 ranks by run_ranks).

``drop_and_look``: rank 0 leaves a note in /tmp, /dev/shm and its own run folder and tries one in
the run folder the ranks share; after a barrier (over the network), rank 1 reports what of rank 0
it can see: the notes, any process in /proc. ``stuck_in_recv``: both ranks receive first (a
deadlock the launcher must report with each rank's line, after a stack dump by SIGUSR1).
"""

import os
import sys


def _own_folder(rank):
    return os.path.join(sys.argv[1], f"rank{rank}")


def drop_and_look(rank, world_size, marker):
    import torch.distributed as dist

    written = []
    if rank == 0:
        for folder in ("/tmp", "/dev/shm", _own_folder(0), sys.argv[1]):
            try:
                with open(os.path.join(folder, marker), "w") as f:
                    f.write(str(os.getpid()))
                written.append(folder)
            except OSError:
                pass
    dist.barrier()
    seen = []
    if rank == 1:
        for folder in ("/tmp", "/dev/shm", _own_folder(0), sys.argv[1]):
            if os.path.exists(os.path.join(folder, marker)):
                seen.append(folder)
    pids = [name for name in os.listdir("/proc") if name.isdigit()] if os.path.isdir("/proc") else []
    try:  # an abstract Unix socket would reach the other rank without crossing the counted loopback
        import socket
        socket.socket(socket.AF_UNIX).close()
        unix = "allowed"
    except OSError as exc:
        unix = exc.strerror
    dist.barrier()
    return {"written": written, "seen": seen, "pids": len(pids), "own_pid": os.getpid(), "unix_socket": unix}


def stuck_in_recv(rank, world_size):
    import torch
    import torch.distributed as dist

    dist.recv(torch.zeros(1), src=1 - rank)  # both receive first: the launcher reports this line
    return rank


def barrier_only(rank, world_size):
    """Nothing but joining and one barrier: the bytes of the rendezvous itself (a measurement)."""
    import torch.distributed as dist

    dist.barrier()
    return rank

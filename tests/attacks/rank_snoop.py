"""Worker functions for tests/test_grading.py's per-rank sandbox test (run on 2 ranks by run_ranks).

``drop_and_look``: rank 0 leaves a note in /tmp, /dev/shm and its own run folder and tries one in
the run folder the ranks share; after a barrier (over the network), rank 1 reports what of rank 0
it can see: the notes, any process in /proc, and an OFD lock rank 0 holds on this (read-only, shared)
file; each rank also tries the calls the nested sandboxes' seccomp program refuses (:func:`channels`:
each "allowed" or the error). ``stuck_in_recv``: both ranks receive first (a
deadlock the launcher must report with each rank's line, after a stack dump by SIGUSR1).
"""

import ctypes
import errno
import fcntl
import mmap
import os
import socket
import struct
import sys

F_OFD_GETLK, F_OFD_SETLK = 36, 37
LOCK_AT, LOCK_LENGTH = 1234, 8  # a lock's offset and length can carry 8 bytes between ranks
NR = {"socket": 41, "inotify_init1": 294, "keyctl": 250, "io_uring_setup": 425, "mincore": 27}  # x86_64 numbers
KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING = 0, -4


def _flock_struct(kind):
    return struct.pack("hhqqi", kind, os.SEEK_SET, LOCK_AT, LOCK_LENGTH, 0)


def _syscall(name, *args):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(NR[name]), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def _netlink_usersock():
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2).close()  # NETLINK_USERSOCK: process to process, not over lo


def _unix_socket_high_bits():
    # AF_UNIX with garbage in the register's upper half (the kernel reads an int): must fail all the same
    high = ctypes.c_long((1 << 32) | socket.AF_UNIX)
    os.close(_syscall("socket", high, ctypes.c_long(socket.SOCK_STREAM), ctypes.c_long(0)))


def _ofd_lock():
    fd = os.open(__file__, os.O_RDONLY)  # kept open: the lock lives as long as the descriptor
    fcntl.fcntl(fd, F_OFD_SETLK, _flock_struct(fcntl.F_RDLCK))
    _held.append(fd)


def _flock():
    fd = os.open(__file__, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def _inotify():
    os.close(_syscall("inotify_init1", ctypes.c_int(0)))


def _keyctl():
    _syscall("keyctl", ctypes.c_long(KEYCTL_GET_KEYRING_ID), ctypes.c_long(KEY_SPEC_USER_KEYRING), ctypes.c_long(0))


def _io_uring():
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    os.close(_syscall("io_uring_setup", ctypes.c_uint(1), params))


def _mincore():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(__file__, os.O_RDONLY)
    address = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)  # (a shared mapping is refused)
    os.close(fd)
    try:
        _syscall("mincore", ctypes.c_void_p(address), ctypes.c_size_t(4096), ctypes.create_string_buffer(1))
    finally:
        libc.munmap(address, 4096)


def _shared_file_mapping():
    # a futex in a MAP_SHARED mapping of a shared file is keyed by its inode: processes wake each other
    with open(__file__, "rb") as f:
        mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ).close()


_held = []
CHANNELS = {
    "netlink_usersock": _netlink_usersock,
    "unix_socket_high_bits": _unix_socket_high_bits,
    "ofd_lock": _ofd_lock,
    "flock": _flock,
    "inotify": _inotify,
    "keyctl": _keyctl,
    "io_uring_setup": _io_uring,
    "mincore": _mincore,
    "shared_file_mapping": _shared_file_mapping,
}


def channels():
    """Each refused channel tried once in this process: {name: "allowed" or the error's text}."""
    tried = {}
    for name, attempt in CHANNELS.items():
        try:
            attempt()
            tried[name] = "allowed"
        except OSError as exc:
            tried[name] = exc.strerror or errno.errorcode.get(exc.errno, str(exc))
    return tried


def _lock_seen():
    """Whether another process holds a lock on this file where rank 0 took one (F_OFD_GETLK)."""
    fd = os.open(__file__, os.O_RDONLY)
    try:
        reply = fcntl.fcntl(fd, F_OFD_GETLK, _flock_struct(fcntl.F_WRLCK))
    except OSError as exc:
        return exc.strerror
    finally:
        os.close(fd)
    return struct.unpack("hhqqi", reply)[0] != fcntl.F_UNLCK


def _own_folder(rank):
    return os.path.join(sys.argv[1], f"rank{rank}")


def drop_and_look(rank, world_size, marker):
    import torch.distributed as dist

    written = []
    tried = channels()  # rank 0's OFD lock is held from here on
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
    lock_seen = _lock_seen() if rank == 1 else None
    pids = [name for name in os.listdir("/proc") if name.isdigit()] if os.path.isdir("/proc") else []
    try:  # an abstract Unix socket would reach the other rank without crossing the counted loopback
        import socket

        socket.socket(socket.AF_UNIX).close()
        unix = "allowed"
    except OSError as exc:
        unix = exc.strerror
    dist.barrier()
    return {
        "written": written,
        "seen": seen,
        "pids": len(pids),
        "own_pid": os.getpid(),
        "unix_socket": unix,
        "channels": tried,
        "lock_seen": lock_seen,
    }


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

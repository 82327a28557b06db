"""The seccomp program of each learner process's nested sandbox, built with libseccomp.

Ranks of a lab may only exchange data over the loopback of the lab's network namespace, where the
kernel counts every byte (commtax.ranks.wire). Everything else two nested sandboxes share is the
kernel itself and the read-only files bound into both (the Python environment, the lab's tree):
this program refuses the system calls that turn those into a channel between processes (see
:data:`POLICY`, one line per refused call with its why). It is built here, in the grader, by
**libseccomp** (Debian's ``libseccomp2``, loaded through ctypes) and written, as classic BPF, to
the file bubblewrap's ``--seccomp`` reads.

libseccomp writes the architecture check itself: the filter holds only the native architecture,
so a call made as another one (i386's ``int 0x80``, x32 numbers on x86_64) meets its default
bad-architecture action, set here to kill the process (the learner's code has no reason to
switch). Arguments are compared on their low 32 bits where the kernel reads an ``int`` (the
upper half of the register is whatever the caller left there, so a full 64-bit comparison could
be dodged).

Without libseccomp (:func:`build` returns why), the grader falls back to :func:`no_unix_sockets_filter`,
the small hand-written program of before, which refuses only Unix sockets; the report says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct

# libseccomp's constants (seccomp.h, stable since 2.3)
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_FLTATR_ACT_BADARCH = 2
SCMP_CMP_NE, SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 1, 4, 7
LOW_32 = 0xFFFFFFFF


def errno_action(code: int) -> int:
    """SCMP_ACT_ERRNO(code): the call fails with ``code`` and does nothing."""
    return 0x00050000 | (code & 0xFFFF)


class ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp {unsigned int arg; enum scmp_compare op; scmp_datum_t datum_a, datum_b;}"""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def low32_is(arg: int, value: int) -> tuple:
    """Argument ``arg`` (an int for the kernel) equals ``value`` on its low 32 bits, whatever the upper half."""
    return (arg, SCMP_CMP_MASKED_EQ, LOW_32, value)


def bits_set(arg: int, bits: int) -> tuple:
    """Every bit of ``bits`` is set in argument ``arg``."""
    return (arg, SCMP_CMP_MASKED_EQ, bits, bits)


def not_zero(arg: int) -> tuple:
    """Argument ``arg`` is not 0 (on all 64 bits: if any is set, the kernel's int may still be 0, and the
    call is refused, which is the safe side)."""
    return (arg, SCMP_CMP_NE, 0, 0)


AF_INET, AF_INET6, AF_NETLINK = 2, 10, 16
FAMILIES = 64  # the kernel refuses families >= AF_MAX (46 in 6.x) itself; 64 leaves room for new ones
# fcntl commands that take, test or watch a lock or a file: POSIX record locks (5-7; the same numbers
# for the 64-bit forms on 64-bit machines), open-file-description locks (36-38), leases and dnotify
# (1024-1026)
F_LOCKS = {
    "F_GETLK": 5,
    "F_SETLK": 6,
    "F_SETLKW": 7,
    "F_OFD_GETLK": 36,
    "F_OFD_SETLK": 37,
    "F_OFD_SETLKW": 38,
    "F_SETLEASE": 1024,
    "F_GETLEASE": 1025,
    "F_NOTIFY": 1026,
}
POSIX_FADV_WILLNEED, POSIX_FADV_DONTNEED, RWF_NOWAIT = 3, 4, 0x8
MAP_SHARED, MAP_ANONYMOUS = 0x01, 0x20  # (MAP_SHARED_VALIDATE, 0x03, has the MAP_SHARED bit too)

# (system call, error it fails with, the argument tests of one rule (all must hold; no test: every
# call), why). Rules of the same call are alternatives. Everything not listed is allowed.
POLICY = [
    # Sockets: only the families whose traffic crosses the counted loopback (IPv4, IPv6), and netlink's
    # NETLINK_ROUTE, which glibc's getifaddrs opens for gloo to find the loopback device (strace of a
    # gloo rank: AF_INET, AF_NETLINK/NETLINK_ROUTE, nothing else). Unix sockets (abstract names belong
    # to the network namespace), NETLINK_USERSOCK and the other netlink protocols (unicast between
    # processes that never crosses lo, so two learner processes could talk past the byte counter), packet
    # sockets ... are refused.
    *[
        ("socket", errno.EPERM, [low32_is(0, family)], "a socket family whose bytes never cross the loopback")
        for family in range(FAMILIES)
        if family not in (AF_INET, AF_INET6, AF_NETLINK)
    ],
    (
        "socket",
        errno.EPERM,
        [low32_is(0, AF_NETLINK), not_zero(2)],
        "netlink other than NETLINK_ROUTE: messages the loopback never counts",
    ),
    # File locks: every process sees the same inodes of the read-only files bound into every sandbox
    # (torch's own .py files), and a lock taken on one is visible to all (the range of an OFD lock set by
    # one process and read back by another with F_OFD_GETLK carries 8 bytes per lock). Ranks meet through a TCP store, which takes no lock.
    ("flock", errno.ENOLCK, [], "a lock on a shared file is a message"),
    *[
        ("fcntl", errno.ENOLCK, [low32_is(1, cmd)], f"{name}: a lock, lease or watch on a shared file")
        for name, cmd in F_LOCKS.items()
    ],
    # Watches: an event on a shared file or folder, caused by one process, seen by another.
    ("inotify_init", errno.EPERM, [], "file events are seen by every watcher"),
    ("inotify_init1", errno.EPERM, [], "file events are seen by every watcher"),
    ("inotify_add_watch", errno.EPERM, [], "file events are seen by every watcher"),
    ("fanotify_init", errno.EPERM, [], "file events are seen by every watcher"),
    ("fanotify_mark", errno.EPERM, [], "file events are seen by every watcher"),
    # Keyrings: the user keyring belongs to the kernel's user, shared across namespaces.
    ("add_key", errno.EPERM, [], "keyrings outlive and cross sandboxes"),
    ("request_key", errno.EPERM, [], "keyrings outlive and cross sandboxes"),
    ("keyctl", errno.EPERM, [], "keyrings outlive and cross sandboxes"),
    # io_uring performs socket, open and lock operations without the system calls this filter checks.
    ("io_uring_setup", errno.EPERM, [], "its operations bypass this filter"),
    ("io_uring_enter", errno.EPERM, [], "its operations bypass this filter"),
    ("io_uring_register", errno.EPERM, [], "its operations bypass this filter"),
    # Kernel interfaces no rank needs, each a known way to observe or reach other processes.
    ("userfaultfd", errno.EPERM, [], "page-fault timing control"),
    ("perf_event_open", errno.EPERM, [], "machine-wide counters and timing"),
    ("bpf", errno.EPERM, [], "kernel maps shared by name"),
    ("process_vm_readv", errno.EPERM, [], "another process's memory"),
    ("process_vm_writev", errno.EPERM, [], "another process's memory"),
    ("ptrace", errno.EPERM, [], "another process's memory and registers"),
    ("pidfd_getfd", errno.EPERM, [], "another process's descriptors (ptrace's power by another name)"),
    # Shared mappings of files: a futex on a MAP_SHARED mapping is keyed by the file's inode and offset,
    # so two processes mapping the same read-only torch file wake each other (FUTEX_WAKE says how many
    # it woke: a message); pages written through one would be seen by the other. Shared anonymous
    # memory (fd -1, MAP_ANONYMOUS) and private mappings (every library the loader maps) stay.
    (
        "mmap",
        errno.EPERM,
        [(3, SCMP_CMP_MASKED_EQ, MAP_SHARED | MAP_ANONYMOUS, MAP_SHARED)],
        "a shared file mapping: futexes keyed by a shared inode",
    ),
    # Page-cache probes: whether a page of a shared read-only file is in memory is one bit that one
    # process sets (reads it, or drops it) and another reads without reading the file.
    ("mincore", errno.EPERM, [], "tells which pages of a file are cached"),
    ("cachestat", errno.EPERM, [], "tells which pages of a file are cached"),
    ("readahead", errno.EPERM, [], "loads pages of a shared file into the cache"),
    ("fadvise64", errno.EPERM, [low32_is(3, POSIX_FADV_DONTNEED)], "drops pages of a shared file from the cache"),
    ("fadvise64", errno.EPERM, [low32_is(3, POSIX_FADV_WILLNEED)], "loads pages of a shared file into the cache"),
    ("preadv2", errno.EPERM, [bits_set(5, RWF_NOWAIT)], "RWF_NOWAIT fails on pages not cached: a probe"),
    ("pwritev2", errno.EPERM, [bits_set(5, RWF_NOWAIT)], "RWF_NOWAIT: a probe"),
]


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def build(path: str, absent: list | None = None) -> str | None:
    """Write the program of :data:`POLICY` (classic BPF for this machine's architecture) to ``path``.
    None when done, else why not (libseccomp missing or refusing a rule); ``path`` is then not written.
    ``absent`` (if given) receives the names this architecture (or this libseccomp) does not have."""
    try:
        lib = _library()
    except (OSError, AttributeError) as exc:
        return f"libseccomp could not be loaded ({exc})"
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        return "libseccomp could not start a filter"
    try:
        # Another architecture's calls (i386 int 0x80, x32): kill, not libseccomp's default (kill the thread)
        if lib.seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) != 0:
            return "libseccomp refused the bad-architecture action"
        for name, code, tests, _why in POLICY:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # not on this architecture (or unknown to this libseccomp): nothing to refuse
                if absent is not None:
                    absent.append(name)
                continue
            args = (ArgCmp * max(1, len(tests)))(*[ArgCmp(*test) for test in tests])
            rc = lib.seccomp_rule_add_array(ctx, errno_action(code), number, len(tests), args)
            if rc != 0:
                return f"libseccomp refused the rule for {name} ({os.strerror(-rc)})"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            rc = lib.seccomp_export_bpf(ctx, fd)
        finally:
            os.close(fd)
        if rc != 0:
            os.unlink(path)
            return f"libseccomp could not write the program ({os.strerror(-rc)})"
        return None
    finally:
        lib.seccomp_release(ctx)


def describe() -> str:
    """What the program refuses, in a few words (for the report's isolation line)."""
    return (
        "no sockets but IPv4, IPv6 and netlink's route protocol, no file locks, file watches, shared file "
        "mappings, keyrings, io_uring, ptrace or page-cache probes (seccomp, libseccomp)"
    )


# The fallback: classic BPF over struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}
# (offsets 0, 4, 8, 16), written by hand. Jumps are relative: the next instruction is offset 0.
BPF_LD_W_ABS, BPF_JEQ, BPF_JSET, BPF_RET = 0x20, 0x15, 0x45, 0x06
AUDIT_ARCH_X86_64, AUDIT_ARCH_AARCH64 = 0xC000003E, 0xC00000B7
SYS_SOCKET = {AUDIT_ARCH_X86_64: 41, AUDIT_ARCH_AARCH64: 198}
X32_BIT = 0x40000000
SECCOMP_RET_ALLOW, SECCOMP_RET_EPERM = 0x7FFF0000, 0x00050000 | 1
AF_UNIX = 1
FALLBACK_DESCRIPTION = (
    "no Unix sockets, but other netlink protocols, file locks, watches, keyrings, io_uring and "
    "page-cache probes, shared file mappings NOT refused (a hand-written seccomp program"
)


def no_unix_sockets_filter() -> bytes:
    """The fallback program: ``socket(AF_UNIX, ...)`` fails with EPERM on x86_64 and aarch64; an x32
    call, and any call of another architecture, fails too. Everything else is allowed."""
    program = [
        (BPF_LD_W_ABS, 0, 0, 4),  # 0: the architecture
        (BPF_JEQ, 0, 3, AUDIT_ARCH_X86_64),  # 1: x86_64 -> 2, else -> 5
        (BPF_LD_W_ABS, 0, 0, 0),  # 2: the system call's number
        (BPF_JSET, 7, 0, X32_BIT),  # 3: x32 -> deny
        (BPF_JEQ, 3, 5, SYS_SOCKET[AUDIT_ARCH_X86_64]),  # 4: socket -> 8, else allow
        (BPF_JEQ, 0, 5, AUDIT_ARCH_AARCH64),  # 5: aarch64 -> 6, else deny
        (BPF_LD_W_ABS, 0, 0, 0),  # 6: the system call's number
        (BPF_JEQ, 0, 2, SYS_SOCKET[AUDIT_ARCH_AARCH64]),  # 7: socket -> 8, else allow
        (BPF_LD_W_ABS, 0, 0, 16),  # 8: its first argument (low half)
        (BPF_JEQ, 1, 0, AF_UNIX),  # 9: AF_UNIX -> deny, else allow
        (BPF_RET, 0, 0, SECCOMP_RET_ALLOW),  # 10
        (BPF_RET, 0, 0, SECCOMP_RET_EPERM),  # 11
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def write_program(path: str) -> str:
    """Write the nested sandboxes' program to ``path``: libseccomp's (:func:`build`), else the fallback.
    Returns what it refuses (for the report)."""
    why = build(path)
    if why is None:
        return describe()
    with open(path, "wb") as f:
        f.write(no_unix_sockets_filter())
    os.chmod(path, 0o644)
    return f"{FALLBACK_DESCRIPTION}: {why})"

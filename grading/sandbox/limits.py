"""Resource limits on the learner's processes (per process, inherited, never raised by them)."""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30
MiB = 2**20


@dataclass(frozen=True)
class Limits:
    """What one lab's learner processes may use. Bytes and seconds; counts of processes and files.

    ``address_space`` caps each process's virtual memory (RLIMIT_AS: torch alone maps about
    0.7 GiB); ``processes`` caps the processes of the sandbox's user (RLIMIT_NPROC: in a user
    namespace, those of that sandbox only); ``cpu_seconds`` each process's CPU time (it gets SIGXCPU,
    then SIGKILL 5 s later); ``file_size`` any file written; ``tmp_size`` each of the sandbox's
    private ``/tmp`` and ``/dev/shm`` (memory-backed). ``run_memory`` bounds the memory of all of a lab
    run's processes together (a cgroup per run, where one can be made: :mod:`grading.sandbox.cgroup`),
    whose process count is ``processes`` too.
    """

    address_space: int = 8 * GiB
    processes: int = 512
    cpu_seconds: int = 600
    file_size: int = 1 * GiB
    open_files: int = 4096
    tmp_size: int = 1 * GiB
    run_memory: int = 8 * GiB

    def rlimits(self, processes: bool = True) -> dict:
        """{resource name: (soft, hard)} as :func:`resource.setrlimit` takes them."""
        limits = {
            "RLIMIT_AS": (self.address_space, self.address_space),
            "RLIMIT_CPU": (self.cpu_seconds, self.cpu_seconds + 5),
            "RLIMIT_FSIZE": (self.file_size, self.file_size),
            "RLIMIT_NOFILE": (self.open_files, self.open_files),
            "RLIMIT_CORE": (0, 0),
        }
        if processes:
            limits["RLIMIT_NPROC"] = (self.processes, self.processes)
        return limits

    def describe(self) -> str:
        return (
            f"{self.address_space / GiB:g} GiB of memory and {self.cpu_seconds} s of CPU per process, "
            f"{self.processes} processes, files up to {self.file_size / GiB:g} GiB, "
            f"{self.tmp_size / GiB:g} GiB of /tmp"
        )


def apply(limits: dict) -> None:
    """Set ``limits`` (from :meth:`Limits.rlimits`) on this process; a limit the system refuses is kept as is."""
    import resource

    for name, (soft, hard) in limits.items():
        which = getattr(resource, name, None)
        if which is None:
            continue
        try:
            current_soft, current_hard = resource.getrlimit(which)
            if current_hard != resource.RLIM_INFINITY:  # we may only lower a hard limit
                hard = min(hard, current_hard)
                soft = min(soft, hard)
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass

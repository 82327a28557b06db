"""bubblewrap's own messages: read through a pipe and kept up to a cap, never a file on the host's disk.

bubblewrap is the first process of the sandbox's PID namespace, of the learner's user in same-user
mode, so learner code can open its standard output (``/proc/1/fd/1``) and write there. Were that a
file of the grader's (as it once was), those bytes would reach the host's disk past every tmpfs cap
of the run. Through a pipe they reach only :class:`BoundedLog`, which keeps the last :data:`KEEP`
bytes (the grader quotes the end of bubblewrap's messages when a sandbox fails to start).
"""

from __future__ import annotations

import threading
import time

KEEP = 64 * 1024  # bytes of bubblewrap's output kept (its last ones)
CHUNK = 65536  # bytes read at a time
PAUSE = 0.005  # seconds to wait after a short read: a writer of single bytes then fills the pipe first


class BoundedLog:
    """Drains ``stream`` (a pipe's read end, binary) in a thread of its own until its end, keeping the last
    :data:`KEEP` bytes; ``received``: the bytes read in all."""

    def __init__(self, stream, keep: int = KEEP):
        self.stream, self.keep = stream, keep
        self._kept, self.received = bytearray(), 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, name="bwrap-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while True:
                chunk = self.stream.read1(CHUNK) if hasattr(self.stream, "read1") else self.stream.read(CHUNK)
                if not chunk:
                    break
                with self._lock:
                    self._kept += chunk
                    if len(self._kept) > 2 * self.keep:  # trimmed now and then, not on every read
                        del self._kept[: -self.keep]
                    self.received += len(chunk)
                if len(chunk) < CHUNK:
                    # Learner code can write here one byte at a time: reading each would cost the grader
                    # (outside the sandbox's cgroup) as much CPU as the writer; waiting lets bytes gather.
                    time.sleep(PAUSE)
        except (OSError, ValueError):  # closed under us: what was read stays
            pass
        finally:
            try:
                self.stream.close()
            except OSError:
                pass

    def text(self, wait: float = 5.0) -> str:
        """What was kept, as text; waits up to ``wait`` seconds for the pipe's end (the sandbox gone)."""
        self._thread.join(wait)
        with self._lock:
            return bytes(self._kept[-self.keep :]).decode(errors="replace")

    @property
    def tail(self) -> bytes:
        """The last :data:`KEEP` bytes read so far."""
        with self._lock:
            return bytes(self._kept[-self.keep :])

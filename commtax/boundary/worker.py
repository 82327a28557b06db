"""The untrusted side of the boundary: the worker process that imports the learner's file.

Started by :class:`commtax.boundary.proxy.LabProxy` as
``python -m commtax.boundary.worker MODULE PATH RECV_FD SEND_FD`` (under the
grader, inside its sandbox): it imports ``PATH`` under ``MODULE``, sends the
module's listing, then answers calls. Requests and answers are length-prefixed
frames in the safe form of :mod:`commtax.boundary.codec`. Nothing here is
trusted: the proxy checks whatever comes back.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from pathlib import Path

from commtax.boundary.codec import BoundaryError, describe_exception, lower, plain_loads, rebuild


def _listing(module) -> dict:
    """Name -> ("callable",), ("value", plain data) or ("object",): what the proxy may ask for."""
    names = {}
    for name, value in vars(module).items():
        if name.startswith("__"):
            continue
        if callable(value) or isinstance(value, type(sys)):
            names[name] = ("callable",)
            continue
        try:
            names[name] = ("value", lower(value, 0))
        except BoundaryError:
            names[name] = ("object",)
    return names


def _worker_main(module_name: str, path: str, recv_fd: int, send_fd: int) -> None:  # pragma: no cover - a child
    from commtax.boundary.byfile import load_module_from_file

    def send(obj) -> None:
        try:
            data = pickle.dumps(obj, protocol=4)
        except Exception as exc:  # noqa: BLE001
            data = pickle.dumps(("error", describe_exception(BoundaryError(str(exc)))), protocol=4)
        frame = struct.pack("<Q", len(data)) + data
        view = memoryview(frame)
        while view:
            view = view[os.write(send_fd, view) :]

    def receive():
        header = b""
        while len(header) < 8:
            chunk = os.read(recv_fd, 8 - len(header))
            if not chunk:
                os._exit(0)
            header += chunk
        (size,) = struct.unpack("<Q", header)
        parts, got = [], 0
        while got < size:
            chunk = os.read(recv_fd, min(size - got, 1 << 20))
            if not chunk:
                os._exit(0)
            parts.append(chunk)
            got += len(chunk)
        return plain_loads(b"".join(parts))

    sys.path.insert(0, str(Path(path).parent))
    try:
        module = load_module_from_file(module_name, path)
    except BaseException as exc:  # noqa: BLE001 - SystemExit at import is the learner's error too
        send(("import-error", describe_exception(exc, skip_frames=1)))
        sys.stdout.flush()
        os._exit(0)
    send(("ready", _listing(module)))
    while True:
        request = receive()
        try:
            _, qualname, args, kwargs = request
            target = module
            for part in str(qualname).split("."):
                target = getattr(target, part)
            result = target(*rebuild(args, module, 0), **rebuild(kwargs, module, 0))
            reply = ("ok", lower(result, 0))
        except BaseException as exc:  # noqa: BLE001
            reply = ("error", describe_exception(exc, skip_frames=1))
        sys.stdout.flush()
        sys.stderr.flush()
        send(reply)


if __name__ == "__main__":  # pragma: no cover
    _worker_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))

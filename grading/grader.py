"""Grade a submission: run each lab's tests against the learner's starter.py, safely.

How a grade is made (see grading/README.md for the teacher's view):

1. The grader reads its **own copy** of the course into memory once (commtax,
   the lab tests, hidden tests from grading/hidden, the labs' helper
   scripts); solutions never. Of the submission only the ``starter.py``
   files are taken.
2. A trusted pass collects every test id with its points, with the shipped
   starters (no learner code).
3. Each lab gets fresh folders, written from that memory copy:

   * a **trusted tree** (the lab's tests, hidden tests, the whole of
     commtax, the collector) in a folder only the grader's user can open;
     the lab's ``pytest`` process runs there and never imports the
     learner's file: the ``lab`` fixture is a proxy
     (``commtax/boundary.py``) that calls it in another process;
   * a **sandbox**: the learner's ``starter.py``, the lab's public files and
     a commtax with only what a starter or a rank needs (argument checks,
     units, the rank runner, the byte counter); every module that holds lab
     answers is replaced by a stub that raises. Learner processes (the
     proxy's worker, the ranks) run there, with a private temporary folder,
     as the unprivileged user ``commtax-learner`` when the grader runs as
     root ("root mode"), as the grader's own user otherwise ("same-user
     mode"). Values come back only in a safe form (plain data).

4. The lab's pytest process has a new session, one thread, a deadline and
   capped output; at the end every process it started is killed (by an
   environment tag, and in root mode every process of the sandbox user), and
   in root mode files the sandbox user left in /tmp, /var/tmp and /dev/shm
   are removed.
5. The lab's process reports each test's outcome through a signed pipe
   (``grading/collector.py``). A test that did not report passing earns
   nothing; tests skipped because NCCL has no GPUs here are left out of both
   score and maximum; any other skip counts as a failure.
"""

from __future__ import annotations

import ast
import hmac
import json
import os
import secrets
import shutil
import stat
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from grading.collector import KEY_FD, OUTCOME_FD, sign

SOURCE_ROOT = Path(__file__).resolve().parent.parent
HIDDEN_DIR = Path(__file__).resolve().parent / "hidden"
RUN_TAG = "COMMTAX_GRADING_RUN"
OUTPUT_LIMIT = 64 * 2**20      # bytes a lab's process may write to its log (a hard file-size limit)
OUTPUT_SHOWN = 4000            # characters of that log a report may quote
NCCL_SKIP = "nccl skipped"     # the reason commtax.testing gives; only trusted nccl tests may use it
SANDBOX_USER = "commtax-learner"  # root mode: learner code runs as this user (created if missing)

# What of commtax the learner's processes get (paths under commtax/). Everything else (the
# formulas, the simulators, the benchmarks, the widgets: modules that hold lab answers,
# including any added later) is replaced in the sandbox by a stub whose every name raises.
LEARNER_COMMTAX = ("__init__.py", "checks.py", "units.py", "labs.py", "testing.py", "boundary.py",
                   "ranks/__init__.py", "ranks/launch.py", "ranks/traffic.py", "ranks/_*.py",
                   # link presets and Lab 03's calibration files (measure.py saves one): no answers
                   "formulas/__init__.py", "formulas/links.py")
# Helpers that public rank workers call but that live in a module with answers: the stub of
# that module carries these functions (and the module's imports), and nothing else.
# Each is readable by graded code: keep answers out of them (Lab 12's Megatron groups are given code
# in its starter, not an exercise).
SHARED_HELPERS = {"ranks/measure.py": ("memcpy_bandwidth",),
                  "ranks/wholebill.py": ("SIZES", "block", "make_model", "make_batch",  # Lab 12's starter uses these
                                          "megatron_groups", "_median_seconds", "calibrate")}


@dataclass
class TestResult:
    nodeid: str
    lab: str
    points: float
    outcome: str          # "passed", "failed", or "neutral" (NCCL skipped for lack of GPUs)
    score: float
    message: str = ""
    hidden: bool = False
    duration: float = 0.0

    @property
    def name(self) -> str:
        return self.nodeid.split("::", 1)[-1]


@dataclass
class LabResult:
    lab: str
    tests: list = field(default_factory=list)
    seconds: float = 0.0
    problem: str = ""     # why the process ended early, if it did

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.points for t in self.tests if t.outcome != "neutral")

    @property
    def passed(self) -> int:
        return sum(t.outcome == "passed" for t in self.tests)

    @property
    def counted(self) -> int:
        return sum(t.outcome != "neutral" for t in self.tests)

    def first_failure(self) -> str:
        for test in self.tests:
            if test.outcome == "failed":
                return f"{test.name}: {test.message}" if test.message else test.name
        return ""


@dataclass
class GradeResult:
    labs: list = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""
    mode: str = ""        # how learner code ran: root mode (a sandbox user) or same-user mode

    @property
    def score(self) -> float:
        return sum(lab.score for lab in self.labs)

    @property
    def max_score(self) -> float:
        return sum(lab.max_score for lab in self.labs)


# -- the work tree ----------------------------------------------------------------------------

def lab_names(source: Path = SOURCE_ROOT) -> list[str]:
    return sorted(p.name for p in (source / "labs").iterdir()
                  if p.is_dir() and p.name.startswith("lab-") and (p / "test_lab.py").exists())


def find_starter(submission: Path, lab: str) -> Path | None:
    """The learner's starter.py for ``lab``: a course copy (labs/LAB/starter.py) or a folder per lab."""
    for candidate in (submission / "labs" / lab / "starter.py", submission / lab / "starter.py"):
        if candidate.is_file() and not candidate.is_symlink():
            return candidate
    return None


def _ignored(parts) -> bool:
    name = parts[-1]
    return (any(p in ("__pycache__", "calibrations", ".ipynb_checkpoints") for p in parts)
            or name.endswith(".pyc") or name in ("solution.py", "starter.py"))


def read_course(source: Path = SOURCE_ROOT, hidden: Path = HIDDEN_DIR) -> dict:
    """The grader's own files, read once into memory: {relative path: bytes}. No starter, no solution.

    Every tree a lab is graded in is written from this copy, so nothing a learner's process does
    to files on disk (in same-user mode it could) changes what the next lab is graded with.
    """
    files = {}

    def add(folder: Path, prefix: str):
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if path.is_file() and not path.is_symlink() and not _ignored(relative.parts):
                files[f"{prefix}{relative.as_posix()}"] = path.read_bytes()

    add(source / "commtax", "commtax/")
    for path in sorted((source / "grading").glob("*.py")):
        files[f"grading/{path.name}"] = path.read_bytes()
    for name in ("conftest.py", "pyproject.toml"):
        files[name] = (source / name).read_bytes()
    files["labs/conftest.py"] = (source / "labs" / "conftest.py").read_bytes()
    for lab in lab_names(source):
        add(source / "labs" / lab, f"labs/{lab}/")
        if (hidden / lab).is_dir():
            add(hidden / lab, f"labs/{lab}/hidden/")
    return files


def _write_files(root: Path, files: dict) -> None:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def write_trusted_tree(work: Path, course: dict, labs: list) -> None:
    """The tree a lab's pytest process runs in: the grader's files for ``labs`` (hidden tests included)."""
    wanted = tuple(f"labs/{lab}/" for lab in labs)
    _write_files(work, {rel: data for rel, data in course.items()
                        if not rel.startswith("labs/lab-") or rel.startswith(wanted)})


WITHHELD = '''"""Withheld by the grader: this module of commtax holds lab answers, so graded code gets a stub."""

class _Withheld:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _Withheld(self._name + "." + attribute)

    def __call__(self, *args, **kwargs):
        raise RuntimeError(self._name + " is not available to graded code: that part of commtax holds lab answers")

    def __repr__(self):
        return "<withheld " + self._name + ">"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Withheld(__name__ + "." + name)
'''


def _learner_module(relative: str, data: bytes) -> bytes | None:
    """What the sandbox gets for ``commtax/<relative>``: the file, a stub, or None (not a module)."""
    from fnmatch import fnmatch
    if any(fnmatch(relative, pattern) for pattern in LEARNER_COMMTAX):
        return data
    if not relative.endswith(".py"):
        return None
    text = WITHHELD
    helpers = SHARED_HELPERS.get(relative)
    if helpers:
        source = data.decode()
        tree = ast.parse(source)
        keep = [node for node in tree.body if isinstance(node, ast.Import)
                or isinstance(node, ast.ImportFrom) and node.module != "__future__"]
        keep += [node for node in tree.body
                 if isinstance(node, ast.FunctionDef) and node.name in helpers
                 or isinstance(node, ast.Assign) and any(getattr(t, "id", None) in helpers for t in node.targets)]
        text += "\n\n" + "\n\n\n".join(ast.get_source_segment(source, node) for node in keep) + "\n"
    return text.encode()


def write_learner_tree(box: Path, course: dict, lab: str, starter: bytes) -> None:
    """The sandbox of ``lab``: the starter, the lab's public files, and commtax without its answers."""
    files = {}
    for relative, data in course.items():
        if relative.startswith("commtax/"):
            content = _learner_module(relative.removeprefix("commtax/"), data)
            if content is not None:
                files[relative] = content
        elif relative.startswith(f"labs/{lab}/") and not relative.startswith(f"labs/{lab}/hidden/"):
            files[relative] = data
    files[f"labs/{lab}/starter.py"] = starter
    _write_files(box, files)


def starter_of(submission: Path | None, lab: str, source: Path = SOURCE_ROOT) -> bytes | None:
    """The bytes of the starter to grade for ``lab``: the learner's, or the shipped one (``submission`` None)."""
    origin = source / "labs" / lab / "starter.py" if submission is None else find_starter(submission, lab)
    return None if origin is None else origin.read_bytes()


# -- running pytest, safely -------------------------------------------------------------------

def _limits():
    """In the child, before exec: cap the size of any file it writes (its log included)."""
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT, OUTPUT_LIMIT))
    except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX
        pass


def _kill_tagged(tag: str) -> None:
    """Kill every process whose environment carries ``tag``: the lab's process and all it started."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return
    me = os.getpid()
    for _ in range(3):  # a dying parent can spawn while we sweep: look again
        found = []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == me:
                continue
            try:
                if proc.environ().get(RUN_TAG) == tag:
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        if not found:
            return
        for proc in found:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(found, timeout=5)


def run_pytest(work: Path, args: list[str], timeout: float, extra_env: dict | None = None):
    """Run pytest in ``work`` with the collector plugin; return (verified records, log tail, problem, seconds).

    The pytest process is trusted (it imports no learner code): it runs as the grader's user;
    ``extra_env`` (the sandbox settings) tells it how to start the learner's processes.
    """
    key = os.urandom(32)
    out_read, out_write = os.pipe()
    key_read, key_write = os.pipe()
    os.write(key_write, key)
    os.close(key_write)
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMTAX_GRADING", "PYTEST_"))}
    env.update({
        "LAB_IMPL": "starter", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": str(work), OUTCOME_FD: str(out_write), KEY_FD: str(key_read), RUN_TAG: tag,
        "MPLBACKEND": "Agg",
    })
    env.update(extra_env or {})
    log_path = work / f".grading-log-{tag}.txt"
    records, chunks = [], []

    def reader():
        with os.fdopen(out_read, "rb") as pipe:
            for line in pipe:
                chunks.append(line)

    command = [sys.executable, "-m", "pytest", "-p", "grading.collector", "-p", "no:cacheprovider",
               "-p", "no:nbval", "-o", "addopts=--import-mode=importlib", "-q", "--color=no", *args]
    start = time.monotonic()
    problem = ""
    with open(log_path, "wb") as log:
        kwargs = dict(cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                      pass_fds=(out_write, key_read), start_new_session=True, preexec_fn=_limits)
        proc = subprocess.Popen(command, **kwargs)
    os.close(out_write)
    os.close(key_read)
    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        code = proc.wait(timeout=timeout)
        if code == -getattr(signal, "SIGXFSZ", 0):
            problem = f"the test process wrote more than {OUTPUT_LIMIT // 2**20} MB of output and was stopped"
        elif code < 0:
            problem = f"the test process was killed by signal {signal.Signals(-code).name}"
        elif code not in (0, 1, 5):  # pytest: all passed, some failed, none collected
            problem = f"the test process exited with code {code}"
        else:
            problem = f"the test process exited (code {code}) before every test had run (sys.exit or os._exit?)"
    except subprocess.TimeoutExpired:
        problem = f"timed out after {timeout:g} s"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        _kill_tagged(tag)
        thread.join(timeout=5)
    seconds = time.monotonic() - start
    for line in chunks:
        try:
            envelope = json.loads(line)
            payload = envelope["payload"]
            if hmac.compare_digest(envelope["mac"], sign(key, payload)):
                records.append(json.loads(payload))
        except (ValueError, KeyError, TypeError):
            continue  # not ours: ignore
    log_tail = _tail(log_path)
    log_path.unlink(missing_ok=True)
    return records, log_tail, problem, seconds


def _tail(path: Path) -> str:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(max(0, size - OUTPUT_SHOWN))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return (f"[{size - OUTPUT_SHOWN} earlier bytes of output not shown]\n" if size > OUTPUT_SHOWN else "") + text


# -- grading ----------------------------------------------------------------------------------

def collect(work: Path, labs: list[str], timeout: float = 300) -> dict:
    """The trusted pass: {lab: [collected records]} from the shipped starters (no learner code)."""
    records, log, problem, _ = run_pytest(work, ["--collect-only", *[f"labs/{lab}" for lab in labs]], timeout)
    if not records:
        raise RuntimeError(f"could not collect the lab tests ({problem or 'no tests found'}):\n{log}")
    by_lab = {lab: [] for lab in labs}
    for record in records:
        lab = record["nodeid"].split("/")[1]
        by_lab.setdefault(lab, []).append(record)
    return by_lab


def _gpus_missing() -> str | None:
    from commtax.ranks.launch import backend_unavailable_reason
    try:
        return backend_unavailable_reason("nccl", 2)
    except Exception as exc:  # pragma: no cover
        return str(exc)


def score_lab(lab: str, expected: list, records: list, problem: str) -> list:
    """Turn the lab's verified records into scored results, test by test, in collection order."""
    reported = {r["nodeid"]: r for r in records if r.get("kind") == "result"}
    no_gpu = _gpus_missing()
    results = []
    for item in expected:
        nodeid, points, hidden = item["nodeid"], item["points"], item["hidden"]
        record = reported.get(nodeid)
        if record is None:
            why = problem or "the test process ended before this test reported"
            results.append(TestResult(nodeid, lab, points, "failed", 0.0, f"not run: {why}", hidden))
            continue
        message = "" if hidden else record.get("message", "")
        outcome = record["outcome"]
        if outcome == "passed":
            results.append(TestResult(nodeid, lab, points, "passed", points, "", hidden, record["duration"]))
        elif outcome == "skipped" and item["nccl"] and no_gpu and NCCL_SKIP in record.get("message", ""):
            results.append(TestResult(nodeid, lab, points, "neutral", 0.0,
                                      f"skipped, no points either way: {no_gpu}", hidden, record["duration"]))
        else:
            if outcome == "skipped":
                message = f"skipped ({message})" if message else "skipped"
            if hidden:
                message = "hidden test failed" if outcome != "skipped" else "hidden test skipped"
            results.append(TestResult(nodeid, lab, points, "failed", 0.0, message, hidden, record["duration"]))
    return results


def sandbox_user(name: str = SANDBOX_USER) -> tuple[int, int]:
    """(uid, gid) of the unprivileged user learner code runs as in root mode; created if missing."""
    import pwd
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       check=True, capture_output=True, timeout=60)
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise ValueError(f"user {name} is root: learner code must run as an unprivileged user")
    return entry.pw_uid, entry.pw_gid


def choose_mode(user: str | None = None, same_user: bool = False) -> dict:
    """Root mode (learner code as an unprivileged user) when we are root, else same-user mode."""
    if same_user or not hasattr(os, "geteuid") or os.geteuid() != 0:
        if user:
            raise ValueError("user: running learner code as another user needs root")
        import getpass
        me = getpass.getuser()
        return {"uid": None, "gid": None,
                "mode": f"same-user mode: learner code ran as {me}, the grader's own user (no root; see "
                        "grading/README.md for what that does not defend)"}
    name = user or SANDBOX_USER
    uid, gid = sandbox_user(name)
    return {"uid": uid, "gid": gid, "mode": f"root mode: learner code ran as the unprivileged user {name}"}


def protect_source(source: Path = SOURCE_ROOT) -> list:
    """Root mode: make the grader's own course folder unreadable to other users (the sandbox user).

    Its solutions, hidden tests and answer modules must be out of the learner's reach. Each
    top-level entry of ``source`` loses its permissions for "other" users, except the Python
    environment that learner processes run with (when it lives inside ``source``); ``source``
    itself keeps only its "x" bit for them. Returns the paths changed.
    """
    changed = []
    environment = Path(sys.prefix).resolve()
    for path in [source, *source.iterdir()]:
        if path.is_symlink():
            continue
        resolved = path.resolve()
        if resolved == environment or environment.is_relative_to(resolved) and resolved != source.resolve():
            continue
        mode = path.stat().st_mode
        wanted = (mode & ~0o007) | (0o001 if path == source else 0)
        if stat.S_IMODE(mode) != stat.S_IMODE(wanted):
            os.chmod(path, stat.S_IMODE(wanted))
            changed.append(path)
    return changed


PYTHON_ACCESS = Path(tempfile.gettempdir()) / "commtax-grading-python-access.json"


def open_interpreter(uid: int, gid: int):
    """Root mode: let the sandbox user reach this Python (its standard library and environment).

    A Python installed under a private folder (pyenv in /root) is out of an unprivileged user's
    reach. Each folder on the way that other users cannot pass through gets their "x" bit (pass
    through, never list) while any grading runs. The original modes are kept in a root-owned file
    under a lock, so that the last of several concurrent gradings puts them back. Returns
    (lock descriptor, [folders granted]) for :func:`close_interpreter`.
    """
    import fcntl
    fd = os.open(PYTHON_ACCESS, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise RuntimeError(f"{PYTHON_ACCESS} is not ours: remove it and grade again")
    fcntl.flock(fd, fcntl.LOCK_EX)
    saved = _read_saved(fd)
    granted = []
    for target in {Path(sys.base_prefix), Path(sys.prefix), Path(sys.executable).parent}:
        for folder in [*reversed(target.resolve().parents), target.resolve()]:
            try:
                info = folder.stat()
            except OSError:
                continue
            if info.st_uid == uid or info.st_mode & 0o001:
                continue
            saved.setdefault(str(folder), stat.S_IMODE(info.st_mode))
            os.chmod(folder, stat.S_IMODE(info.st_mode) | 0o001)
            granted.append(folder)
    _write_saved(fd, saved)
    fcntl.flock(fd, fcntl.LOCK_SH)  # held while this grading runs
    return fd, sorted(set(granted) | {Path(p) for p in saved})


def _read_saved(fd) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        return {str(k): int(v) for k, v in json.loads(os.read(fd, 1 << 20) or b"{}").items()}
    except (ValueError, AttributeError):
        return {}


def _write_saved(fd, saved: dict) -> None:
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(saved).encode())


def close_interpreter(access) -> None:
    """Put the folders' modes back, unless another grading still runs (it will)."""
    import fcntl
    if not access:
        return
    fd, _ = access
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another grading holds it: the last one restores
        for folder, mode in _read_saved(fd).items():
            try:
                os.chmod(folder, mode)
            except OSError:
                pass
        _write_saved(fd, {})
    finally:
        os.close(fd)


def check_sandbox_python(uid: int, gid: int) -> None:
    """Fail early, with the reason, if the sandbox user cannot run this Python with its standard library."""
    probe = subprocess.run([sys.executable, "-c", "import ctypes, json, encodings, numpy"], user=uid, group=gid,
                           extra_groups=[], cwd="/", capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        raise RuntimeError(f"the sandbox user (uid {uid}) cannot run {sys.executable} with its libraries: "
                           f"{probe.stderr.strip()[-500:]}")


def _kill_descendants() -> None:
    """Kill every descendant of this process: with the subreaper flag, a learner's daemon is one of them."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return
    for _ in range(3):
        found = psutil.Process().children(recursive=True)
        if not found:
            return
        for proc in found:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(found, timeout=5)


def _kill_user(uid: int) -> None:
    """Root mode: kill every process of the sandbox user (a forked child that cleared its environment too)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return
    for _ in range(3):
        found = []
        for proc in psutil.process_iter(["uids"]):
            try:
                if uid in (proc.info["uids"].real, proc.info["uids"].effective):
                    found.append(proc)
            except (psutil.Error, TypeError, AttributeError):
                continue
        if not found:
            return
        for proc in found:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(found, timeout=5)


SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")


def _sweep_files(uid: int, tops=SHARED_TMP) -> None:
    """Root mode: remove what the sandbox user left in the world-writable folders, between labs."""
    def walk(folder: str, depth: int):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid == uid:
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    try:
                        os.unlink(entry.path)
                    except OSError:
                        pass
            elif stat.S_ISDIR(info.st_mode) and info.st_mode & 0o002 and depth < 4:
                walk(entry.path, depth + 1)  # another world-writable folder: it may hide files too

    for top in tops:
        walk(top, 0)


def _grade_lab(base: Path, course: dict, lab: str, starter: bytes, timeout: float, mode: dict):
    """Run ``lab``'s tests in a fresh trusted tree, against ``starter`` in a fresh sandbox."""
    uid, gid = mode["uid"], mode["gid"]
    secret = base / secrets.token_hex(16)          # only the grader's user can open it (root mode)
    work = secret / "course"
    box = base / f"sandbox-{lab}-{secrets.token_hex(4)}"
    tmp = base / f"tmp-{lab}-{secrets.token_hex(4)}"
    runs = base / f"runs-{lab}-{secrets.token_hex(4)}"
    try:
        secret.mkdir(mode=0o700)
        write_trusted_tree(work, course, [lab])
        (work / "labs" / lab / "starter.py").write_bytes(starter)  # parsed (never run) by the stub check
        write_learner_tree(box, course, lab, starter)
        tmp.mkdir(mode=0o700)
        runs.mkdir(mode=0o711)
        if uid is not None:
            os.chown(tmp, uid, gid)
            for path in [box, *box.rglob("*")]:  # readable, not writable, by the sandbox user
                os.chmod(path, 0o755 if path.is_dir() else 0o644)
        settings = {"trusted_root": os.path.realpath(work), "learner_root": os.path.realpath(box),
                    "tmp": os.path.realpath(tmp), "runs": os.path.realpath(runs), "uid": uid, "gid": gid}
        from commtax.boundary import SANDBOX_ENV
        return run_pytest(work, [f"labs/{lab}"], timeout, {SANDBOX_ENV: json.dumps(settings)})
    finally:
        _kill_descendants()
        if uid is not None:
            _kill_user(uid)
            _sweep_files(uid)
        for folder in (secret, box, tmp, runs):
            shutil.rmtree(folder, ignore_errors=True)


def grade(submission: Path | None, labs: list[str] | None = None, *, source: Path = SOURCE_ROOT,
          hidden: Path = HIDDEN_DIR, lab_timeout: float = 300.0, total_timeout: float = 1500.0,
          user: str | None = None, same_user: bool = False, progress=None) -> GradeResult:
    """Grade ``submission`` (a folder; None grades the shipped starters) on ``labs`` (default: all).

    Root mode (learner code runs as ``user``, default ``commtax-learner``) when this process is
    root, unless ``same_user``; same-user mode otherwise. ``GradeResult.mode`` says which.
    """
    from commtax.boundary import become_subreaper, make_undumpable

    start = time.monotonic()
    labs = labs or lab_names(source)
    unknown = sorted(set(labs) - set(lab_names(source)))
    if unknown:
        raise ValueError(f"labs: no such lab {', '.join(unknown)}; the labs are {', '.join(lab_names(source))}")
    if submission is not None and not Path(submission).is_dir():
        raise ValueError(f"submission {submission} is not a folder")
    make_undumpable()  # same-user mode: learner processes cannot read our memory or descriptors
    become_subreaper()  # a process a lab left behind (double fork, setsid, cleared environment) stays ours
    mode = choose_mode(user, same_user)
    access = None
    if mode["uid"] is not None:
        access = open_interpreter(mode["uid"], mode["gid"])
        if access[1]:
            mode["mode"] += (" (for the time of the grading, other users may pass through "
                             + ", ".join(str(f) for f in access[1]) + " to reach Python)")
        protect_source(Path(source))
        if Path(hidden).is_dir():
            os.chmod(hidden, stat.S_IMODE(Path(hidden).stat().st_mode) & ~0o007)
    try:
        if mode["uid"] is not None:
            check_sandbox_python(mode["uid"], mode["gid"])
        return _grade(submission, labs, source, hidden, lab_timeout, total_timeout, mode, progress, start)
    finally:
        close_interpreter(access)


def _grade(submission, labs, source, hidden, lab_timeout, total_timeout, mode, progress, start) -> GradeResult:
    result = GradeResult(mode=mode["mode"])
    course = read_course(source, hidden)
    starters = {lab: starter_of(Path(submission) if submission else None, lab, source) for lab in labs}
    with tempfile.TemporaryDirectory(prefix="commtax-grading-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o711)  # the sandbox user may pass through to its own folders, not list them
        collect_tree = base / secrets.token_hex(16)
        collect_tree.mkdir(mode=0o700)
        write_trusted_tree(collect_tree / "course", course, labs)
        for lab in labs:  # the shipped starters: trusted, for the collection pass
            shutil.copyfile(source / "labs" / lab / "starter.py", collect_tree / "course" / "labs" / lab / "starter.py")
        expected = collect(collect_tree / "course", labs)
        shutil.rmtree(collect_tree, ignore_errors=True)
        for lab in labs:
            remaining = total_timeout - (time.monotonic() - start)
            if progress:
                progress(f"grading {lab} ...")
            if starters[lab] is None:
                missing = f"the submission has no starter.py for {lab}"
                result.labs.append(LabResult(lab, score_lab(lab, expected[lab], [], missing), 0.0, missing))
                continue
            if remaining <= 5:
                tests = score_lab(lab, expected[lab], [], "the total grading time ran out")
                result.labs.append(LabResult(lab, tests, 0.0, "the total grading time ran out"))
                continue
            records, log, problem, seconds = _grade_lab(base, course, lab, starters[lab],
                                                        min(lab_timeout, remaining), mode)
            tests = score_lab(lab, expected[lab], records, problem)
            unreported = any(t.message.startswith("not run") for t in tests)
            result.labs.append(LabResult(lab, tests, seconds, problem if unreported else ""))
    result.seconds = time.monotonic() - start
    return result

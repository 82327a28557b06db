"""Review flags (grading/flags.py): honest code scans clean, every attack is flagged, and only the teacher sees them.

Cheap: the scan parses files, it never runs them; the reports are checked on hand-made results. Grading
runs that show the flags end to end are reused from tests/test_grading_*.py (the hostile-text attack's
table and results.json, grade-many's CSV and per-student reports).
"""

import ast
from pathlib import Path

import pytest

from grading import flags, lms, reports
from grading.grader import flag_starters, lab_names
from grading.release import RELEASE_EXCLUDED
from grading.results import GradeResult, LabResult
from grading.results import TestResult as Outcome

ROOT = Path(__file__).resolve().parent.parent
ATTACKS = Path(__file__).resolve().parent / "attacks"
LABS = lab_names()
HAS_SOLUTIONS = (ROOT / "labs" / LABS[0] / "solution.py").exists()


def shipped(lab: str) -> str:
    return (ROOT / "labs" / lab / "starter.py").read_text()


def scan_in(lab: str, text: str) -> list:
    return flags.scan(text, lab, flags.allowed_imports(shipped(lab)))


# -- honest code: nothing to read ------------------------------------------------------------------


@pytest.mark.parametrize("lab", LABS)
def test_every_reference_solution_and_shipped_starter_scans_clean(lab):
    # A flag on the course's own answer would send the teacher to read every honest submission.
    names = ["starter.py"] + (["solution.py"] if HAS_SOLUTIONS else [])
    for name in names:
        assert scan_in(lab, (ROOT / "labs" / lab / name).read_text()) == [], f"{lab}/{name}"


# -- every attack is flagged, with the reasons a teacher needs -------------------------------------

FAST = "lab-06-tp-comm-cost"
# attack file -> (the lab it is graded on in tests/test_grading_*.py, its prelude or None, reasons expected)
ATTACK_FLAGS = {
    "deep_tree.py": (
        "lab-02-ring-allreduce",
        None,
        ["imports os", "imports sys", "runs code when the module is imported"],
    ),
    "fill_run_folder.py": (
        "lab-02-ring-allreduce",
        None,
        ["imports os", "imports sys", "opens a file", "runs code when the module is imported"],
    ),
    "serialization_alias_suffix.py": (
        "lab-02-ring-allreduce",
        None,
        [
            "file I/O (torch.save), as torch.serialization.save",
            "file I/O (torch.load), as torch.serialization.load",
            "file I/O (torch.jit.load)",
            "imports torch.serialization",
        ],
    ),
    "crafted_object.py": (FAST, None, ["imports os", "is a kind of float", "defines __eq__", "defines __reduce__"]),
    "crafted_object_suffix.py": (FAST, "crafted_object.py", ["globals()"]),
    "find_answers.py": (FAST, None, ["imports os", "a string naming /proc", "opens a file", "exec()", "compile()"]),
    "forge_channel.py": (FAST, None, ["imports gc", "imports hmac", "a string naming /proc", "opens a file"]),
    "forge_rank_stack_suffix.py": (
        "lab-02-ring-allreduce",
        None,
        [
            "imports os",
            "a string naming commtax/",
            "site-packages",
            "opens a file",
            "defines ring_all_gather again",
            "replaces commtax.ranks._heartbeat._stack",
        ],
    ),
    "forged_values.py": (FAST, None, ["imports sys", "control characters", "runs code when the module is imported"]),
    "fork_outlive.py": (FAST, None, ["imports os", "a string naming /tmp", "runs code when the module is imported"]),
    "hidden_inputs.py": ("lab-01-alpha-beta", None, ["imports os", "a string naming /dev/", "opens a file"]),
    "hostile_text.py": (FAST, None, ["control characters", "globals()", "__module__"]),
    "import_answers.py": (
        FAST,
        None,
        ["a string naming commtax modules", "__import__()", "globals()", "getattr() with a computed name"],
    ),
    "leak_hidden.py": ("lab-01-alpha-beta", None, ["imports glob", "a string naming /proc", "opens a file"]),
    "leak_hidden_suffix.py": ("lab-01-alpha-beta", "leak_hidden.py", ["defines p2p_time again"]),
    "memory_hog.py": (FAST, None, ["imports subprocess", "imports tempfile", "runs code when the module is imported"]),
    "outlive_and_plant.py": ("lab-01-alpha-beta", None, ["imports ctypes", "a string naming /tmp", "opens a file"]),
    "patch_grader.py": (FAST, None, ["imports os", "a string naming /proc", "a string naming grading modules"]),
    "patch_reporting.py": (
        FAST,
        None,
        ["imports gc", "imports _pytest.reports", "replaces _pytest.reports", "is a kind of dict"],
    ),
    "quote_from_stack.py": (
        "lab-07-pipeline-schedules",
        None,
        ["imports os", "a string naming commtax/", "opens a file"],
    ),
    "rank_forgery_suffix.py": (
        "lab-02-ring-allreduce",
        None,
        ["__closure__", "cell_contents", "defines ring_all_reduce again"],
    ),
    "rank_worker.py": (FAST, None, ["imports pickle", "defines __reduce__", "replaces commtax.boundary.dumps"]),
    "read_notes.py": (FAST, None, ["imports ctypes", "a string naming /tmp", "opens a file"]),
    "rewrite_other_labs.py": (
        "lab-01-alpha-beta",
        None,
        ["imports glob", "a string naming test_lab.py", "opens a file"],
    ),
    "write_other_lab.py": ("lab-01-alpha-beta", None, ["imports glob", "a string naming /tmp", "opens a file"]),
    # Inputs swapped through /tmp: the common part goes before the starter (a prelude), each lab's functions
    # after it; the loopback padded and the counters in dist.send's closure bumped.
    "swap_inputs_through_tmp.py": (
        "lab-02-ring-allreduce",
        None,
        ["imports socket", "imports io", "file I/O (torch.save)", "opens a file", "__closure__", "cell_contents"],
    ),
    **{
        f"swap_inputs_through_tmp_lab{n}_suffix.py": (
            lab,
            "swap_inputs_through_tmp.py",
            [
                "imports socket",
                "imports io",
                "a string naming /tmp",
                "file I/O (torch.save)",
                "opens a file",
                "__closure__",
                "cell_contents",
            ],
        )
        for n, lab in [
            ("02", "lab-02-ring-allreduce"),
            ("07", "lab-07-pipeline-schedules"),
            ("09", "lab-09-ddp-overlap"),
            ("10", "lab-10-moe-all-to-all"),
            ("13", "lab-13-context-parallel"),
        ]
    },
    # gloo's collectives called on the ProcessGroup object, out of sight of the counter of dist's calls.
    "process_group_collectives_suffix.py": (
        "lab-02-ring-allreduce",
        None,
        [
            "distributed_c10d",
            "_get_default_group",
            "allreduce: a ProcessGroup method",
            "allgather: a ProcessGroup method",
            "__closure__",
            "defines ring_all_reduce again",
        ],
    ),
    # The inputs carried by a helper started via random._os from a hex string.
    "swap_inputs_through_a_hex_helper_suffix.py": (
        "lab-02-ring-allreduce",
        None,
        [
            "the private name random._os",
            ".execvp(): starts a process",
            ".fork(): starts a process",
            ".pipe(): makes a file descriptor",
            "hex or base64 characters",
        ],
    ),
    # Every Lab 05 rank computes the others' shards itself, behind all-reduces of zeros.
    "tp_shards_computed_locally_lab05_suffix.py": (
        "lab-05-tensor-parallel-layers",
        None,
        [
            "dist.all_reduce of a tensor made in the call",
            "dist.all_gather_into_tensor of a tensor made in the call",
            "defines TensorParallelMLP again",
            "defines ColumnParallelLinear again",
        ],
    ),
    # Inputs swapped over NETLINK_USERSOCK, or as OFD locks on torch's own files; both pad the loopback and bump
    # the counters in dist.send's closure.
    "swap_inputs_over_netlink_suffix.py": (
        "lab-02-ring-allreduce",
        None,
        [
            "imports socket",
            "imports struct",
            "imports threading",
            "file I/O (torch.save)",
            "__closure__",
            "cell_contents",
            "defines ring_all_reduce again",
        ],
    ),
    "swap_inputs_through_file_locks_suffix.py": (
        "lab-02-ring-allreduce",
        None,
        [
            "imports fcntl",
            "imports struct",
            "__file__",
            "file I/O (torch.save)",
            "__closure__",
            "cell_contents",
            "defines ring_all_reduce again",
        ],
    ),
}
NOT_LEARNER_CODE = {
    "lazy.py",  # the recipe of the lazy submissions (tests/test_lazy_submissions.py)
    "rank_snoop.py",
}  # worker functions of the per-rank sandbox test (run as ranks, not a starter)


def attack_submission(name: str) -> tuple[str, str]:
    """(lab, the starter.py text) as the grading tests build it: a prelude before the shipped starter, a
    suffix (a file that starts with a blank line) after it."""
    lab, prelude, _ = ATTACK_FLAGS[name]
    text = (ATTACKS / name).read_text()
    if prelude:
        return lab, (ATTACKS / prelude).read_text() + shipped(lab) + text
    return lab, (shipped(lab) + text) if text.startswith("\n") else (text + shipped(lab))


def test_every_attack_file_has_its_expected_flags_listed():
    # A new attack in tests/attacks/ must say which flags point a teacher at it.
    files = {p.name for p in ATTACKS.glob("*.py")} - NOT_LEARNER_CODE
    assert files == set(ATTACK_FLAGS), sorted(files ^ set(ATTACK_FLAGS))


@pytest.mark.parametrize("name", sorted(ATTACK_FLAGS))
def test_every_attack_and_red_team_submission_is_flagged_with_its_reasons(name):
    lab, text = attack_submission(name)
    found = scan_in(lab, text)
    missing = [reason for reason in ATTACK_FLAGS[name][2] if not any(reason in flag for flag in found)]
    assert not missing, f"{name} on {lab}: no flag says {missing}; the flags were {found}"
    assert all(flag.startswith("line ") for flag in found)


# -- the rules themselves -------------------------------------------------------------------------------

IMPORTS = (
    "import torch\nimport torch.distributed as dist\nimport numpy as np\n"
    "import torch.nn.functional as F\n\n\ndef f(x, p, t):\n"
)
# One line of a function each: the constructs a flag exists for (what a lab's code has no need of), and what the
# attacks use.
CONSTRUCTS = [
    ("    import marshal, base64, zlib, threading, builtins, importlib", "imports marshal"),
    ("    return open(p).read()", "opens a file"),
    ("    return eval(p)", "eval()"),
    ("    return __import__(p)", "__import__()"),
    ("    return getattr(x, p)", "getattr() with a computed name"),
    ("    return x.__globals__", "__globals__ (an interpreter internal)"),
    ("    return x.__code__", "__code__"),
    ("    return x.__dict__", "__dict__"),
    ("    return object.__subclasses__()", "__subclasses__"),
    ("    return __builtins__", "__builtins__"),
    ("    return torch._C._get_tracing_state()", "the private name torch._C"),
    ("    return dist._functional_collectives", "the private name torch.distributed._functional_collectives"),
    ("    return dist.distributed_c10d._get_default_group()", "_get_default_group"),
    ("    return dist.ProcessGroup", "ProcessGroup: the ProcessGroup object"),
    ("    return x.allreduce([t]).wait()", "allreduce: a ProcessGroup method"),
    ("    return dist.TCPStore", "a rendezvous store"),
    ("    return x.f_back.f_globals", "f_globals: the interpreter's frames"),
    ("    return torch.os.getpid()", ".os: the os module reached through another"),
    ("    torch.save(t, p)", "file I/O (torch.save)"),
    ("    np.fromfile(p)", "file I/O (numpy)"),
    ("    dist.send = x", "replaces torch.distributed.send"),
    ("    return '/dev/shm/' + p", "a string naming /dev/"),
    ("    dist.send(torch.zeros(8), 1)", "dist.send of a tensor made in the call"),
    ("    return np.random._os", "the private name numpy.random._os"),
    ("    return x.fork()", ".fork(): starts a process"),
    ("    return t.posix_spawn(p, [p], {})", ".posix_spawn(): starts a process"),
    ("    return x.pipe2(0)", ".pipe2(): makes a file descriptor"),
    ("    return bytes.fromhex(p)", ".fromhex(): decodes text into bytes"),
    ("    return '" + "6f73" * 60 + "'", "a string of 240 hex or base64 characters"),
]


@pytest.mark.parametrize("line,reason", CONSTRUCTS, ids=[reason for _, reason in CONSTRUCTS])
def test_each_construct_an_honest_solution_does_not_need_is_flagged_with_its_line(line, reason):
    found = scan_in(FAST, IMPORTS + line + "\n")
    assert any(f.startswith("line 8: ") and reason in f for f in found), found


def test_a_file_that_does_not_parse_or_nests_too_deep_is_itself_a_flag():
    assert flags.scan("def f(:\n") == [
        "line 1: the file does not parse (invalid syntax): it cannot have been run as written"
    ]
    assert "does not parse" in flags.scan(b"x = 1\x00\n")[0]
    assert flags.scan("x = " + "a." * 200_000 + "b") == ["line 0: the file could not be parsed (nested too deeply)"]


def test_a_file_past_the_node_limit_is_scanned_up_to_it_and_says_so(monkeypatch):
    monkeypatch.setattr(flags, "NODE_LIMIT", 500)
    text = "import math\n" + "x = [" + ", ".join(["1"] * 600) + "]\nimport os\n"
    found = flags.scan(text)
    assert any("too large to scan past 500 syntax nodes" in f for f in found), found


def test_at_most_kept_flags_are_listed_and_the_rest_counted():
    found = flags.scan("".join(f"import os{i}\n" for i in range(150)))
    assert len(found) == flags.KEPT + 1 and found[-1] == "... and 50 more"
    assert reports.flag_count(found) == 150


def test_getattr_is_flagged_for_a_computed_name_but_read_through_a_loop_over_literal_names():
    honest = 'def f(plan):\n    for name in ("layers", "hidden"):\n        getattr(plan, name)\n'
    assert flags.scan(honest) == []
    assert flags.scan('def f(plan):\n    for name in ("__globals__",):\n        getattr(plan, name)\n') != []
    computed = "def f(plan, name):\n    return getattr(plan, name)\n"
    assert flags.scan(computed) == [
        "line 2: getattr() with a computed name (which attribute cannot be read from the file)"
    ]
    assert flags.scan('def f(x):\n    return getattr(x, "__closure__")\n') == [
        "line 2: __closure__ (an interpreter internal)"
    ]


def test_what_one_lab_asks_for_is_still_flagged_in_the_others():
    # Lab 12's traffic meter replaces dist.all_reduce, send and isend; Lab 02 asks for point-to-point only.
    meter = (
        "import torch.distributed as dist\n\ndef start(saved, name, wrapper):\n"
        "    dist.all_reduce = wrapper\n    setattr(dist, name, saved)\n"
    )
    assert scan_in("lab-12-the-whole-bill", meter) == []
    assert {f.split(": ", 1)[1].split(" (")[0] for f in scan_in("lab-13-context-parallel", meter)} == {
        "replaces torch.distributed.all_reduce",
        "setattr() with a computed name",
    }
    assert scan_in(FAST, 'import torch.distributed as dist\nsetattr(dist, "send", print)\n')[0] == (
        "line 2: replaces torch.distributed.send (changes a module for everything that uses it)"
    )
    collective = "import torch.distributed as dist\n\ndef f(t):\n    dist.all_reduce(t)\n"
    assert scan_in("lab-05-tensor-parallel-layers", collective) == []
    assert scan_in("lab-02-ring-allreduce", collective) == [
        "line 4: calls dist.all_reduce (this lab asks for point-to-point messages only)"
    ]


def test_imports_are_allowed_from_the_common_set_and_the_labs_own_starter():
    given = "from commtax.ranks.wholebill import make_batch\n"
    assert scan_in("lab-12-the-whole-bill", given) == []
    assert scan_in("lab-06-tp-comm-cost", given) == ["line 1: imports commtax.ranks.wholebill (not needed by this lab)"]
    assert scan_in("lab-06-tp-comm-cost", "import math, itertools, functools, numpy as np\n") == []
    assert scan_in("lab-06-tp-comm-cost", "from torch.distributed import distributed_c10d\n") == [
        "line 1: distributed_c10d: torch.distributed's internal module"
    ]


def test_learner_text_in_a_flag_is_short_and_printable_and_bidi_source_is_flagged():
    found = flags.scan("import " + "a" * 300 + "\nx = 1  # \u202e\n")
    assert (
        found[0].startswith("line 1: bidirectional")
        and len(found[1]) < 120
        and found[1].endswith("... (not needed by this lab)")
    ), found


def test_the_scanner_never_imports_or_runs_the_file(tmp_path):
    marker = tmp_path / "ran"
    assert flags.scan(f"open({str(marker)!r}, 'w').close()\n")
    assert not marker.exists()
    tree = ast.parse((ROOT / "grading" / "flags.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert imported == {"ast", "unicodedata", "inspect", "sys"}  # (sys.modules: names resolved, never imported)


def test_a_flagged_function_is_flagged_under_any_name_that_resolves_to_it():
    # A Lab 02 moving its data through torch.serialization.save/load (torch.save and torch.load themselves)
    # must be flagged: matching spellings alone would miss it, so names are resolved to the objects they name.
    import torch  # noqa: F401 - as in the grader, which imports it before it scans

    text = (
        "import torch\nimport torch.serialization as ser\nfrom torch.serialization import load as fetch\n"
        "def f(x):\n    ser.save(x, 'a')\n    return fetch('a'), torch.jit.save, torch.serialization.load\n"
    )
    found = flags.scan(text, FAST)
    assert any("line 3: file I/O (torch.load), as torch.serialization.load" in f for f in found), found
    assert any("line 5: file I/O (torch.save), as torch.serialization.save" in f for f in found), found
    assert any("line 6: file I/O (torch.jit.save)" in f for f in found), found
    assert any("line 6: file I/O (torch.load), as torch.serialization.load" in f for f in found), found
    assert not [f for f in flags.scan("import torch\ndef f(x):\n    return torch.add(x, 1)\n", FAST) if "I/O" in f]


# -- only the teacher sees them ---------------------------------------------------------------------

SECRET_REASON = "line 3: imports socket (not needed by this lab)"


def flagged_result() -> GradeResult:
    tests = [
        Outcome(f"labs/{FAST}/test_lab.py::test_a", FAST, 2.0, "passed", 2.0),
        Outcome(f"labs/{FAST}/test_lab.py::test_b", FAST, 1.0, "failed", 0.0, "AssertionError: no"),
        Outcome(f"labs/{FAST}/hidden/test_h.py::test_h", FAST, 1.0, "failed", 0.0, "hidden test failed", hidden=True),
    ]
    many = [f"line {i}: imports os{i} (not needed by this lab)" for i in range(4, 16)]
    return GradeResult(
        labs=[LabResult(FAST, tests, 3.0, flags=[SECRET_REASON, *many]), LabResult("lab-01-alpha-beta", [], 1.0)],
        seconds=4.0,
        mode="root mode: ...",
    )


def test_flags_show_in_the_teachers_table_and_csv_and_in_no_learners_view():
    result = flagged_result()
    teacher = reports.table(result)
    assert "review flags" in teacher and f"{FAST}: 13 flags" in teacher and SECRET_REASON in teacher
    assert "... and 5 more" in teacher  # eight listed per lab
    row = reports.csv_rows("s1", result)
    assert reports.csv_header([FAST, "lab-01-alpha-beta"])[-2:] == ["problem", "flags"]
    assert row[-1].startswith(f"13: {FAST} {SECRET_REASON}; {FAST} line 4: imports os4") and row[-1].endswith("...")
    learner_views = [
        reports.table(result, visible_only=True),
        reports.table(result, learner=True),
        str(reports.gradescope(result)),
        str(reports.classroom(result)),
        reports.detailed("s1", result),
    ]
    for text in learner_views:
        assert "socket" not in text and "flag" not in text.lower(), text[:500]


def test_the_lms_export_leaves_the_flags_column_out_and_reads_csvs_written_before_it(tmp_path):
    header = ["student_id", "score", "max_score", FAST, "problem", "flags"]
    rows = [header, ["Points Possible", "", "10", "10", "", ""], ["alice", "7", "10", "7", "", SECRET_REASON]]
    for columns in (rows, [r[:-1] for r in rows]):  # with the flags column, and from before it
        grades = tmp_path / "grades.csv"
        lms.write(columns, grades)
        for fmt in lms.FORMATS:
            out = lms.export(grades, fmt, "Labs", per_lab=True)
            assert out[0][-2:] == ["Labs", f"Labs: {FAST}"] and "socket" not in str(out)


def test_the_grader_scans_each_starter_it_read_and_a_failed_scan_is_a_flag_never_a_stop(monkeypatch):
    flagged = flag_starters(
        {
            FAST: b"import os\n",
            "lab-01-alpha-beta": None,
            "lab-12-the-whole-bill": shipped("lab-12-the-whole-bill").encode(),
        }
    )
    assert flagged == {FAST: ["line 1: imports os (not needed by this lab)"], "lab-12-the-whole-bill": []}
    assert "flags.py" in RELEASE_EXCLUDED  # the release's grader runs without it (tests/test_grading.py)

    def broken(*args, **kwargs):
        raise IndexError("a bug in the scanner")

    monkeypatch.setattr(flags, "scan", broken)
    assert flag_starters({FAST: b"x = 1\n"}) == {FAST: ["line 0: the review scan failed (IndexError): read the file"]}


def test_gradescope_autograde_prints_the_flags_to_its_hidden_stdout_and_never_into_results_json(
    tmp_path, monkeypatch, capsys
):
    import json

    import grading.__main__ as cli

    monkeypatch.setattr(cli, "grade", lambda submission, labs, progress=None, on_lab=None, **options: flagged_result())
    (tmp_path / "submission").mkdir()
    assert cli.main(["autograde", "--root", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert results["stdout_visibility"] == "hidden" and SECRET_REASON in capsys.readouterr().out
    assert "socket" not in json.dumps(results) and "flag" not in json.dumps(results).lower()


def test_regrading_into_a_csv_written_before_the_flags_column_keeps_its_rows_with_an_empty_cell(tmp_path):
    import grading.__main__ as cli

    old = tmp_path / "grades.csv"
    lms.write(
        [
            ["student_id", "score", "max_score", FAST, "problem"],
            ["Points Possible", "", "10", "10", ""],
            ["alice", "7", "10", "7", ""],
        ],
        old,
    )
    assert cli._previous_rows(old, [FAST], ["alice"]) == {"alice": ["alice", "7", "10", "7", "", ""]}

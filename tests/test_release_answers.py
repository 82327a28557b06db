"""The student release ships no answers: no graded implementation, no exercise answer.

One release is built for the module (about 15 s) and walked: every function a
lab's tests call and the learner writes must be absent from every shipped
module or a stub (a NotImplementedError, or a call into the learner's own lab
code through ``commtax.learner``). Then the release's ``commtax`` is run in a
child process, once with the starters (the calculators say which lab function
lights them) and once with a learner's Lab 01 written (they run on it).

Every visible lab test must also run in the release: none may reach a reference
the release lacks (it would be skipped there); the values they take from the
reference are recorded in each lab's ``expected.json`` (``commtax.recorded``),
checked here against the recipes that compute them.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commtax import recorded
from commtax.testing import mismatch
from grading import answers
from grading.release import build_release

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return build_release(tmp_path_factory.mktemp("release") / "course")


def _is_stub(node: ast.AST) -> bool:
    """A body that only raises, or only hands the call to the learner's lab code (commtax.learner)."""
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if not body:
        return False
    if ast.unparse(body[0]) == "from commtax import learner":
        body = body[1:]
    if len(body) != 1:
        return False
    text = ast.unparse(body[0])
    if isinstance(body[0], ast.Raise):
        return "NotImplementedError" in text
    return isinstance(body[0], (ast.Return, ast.Expr)) and (
        "learner.lab(" in text or "learner.unlit(" in text or "learner.unavailable(" in text
    )


def _is_starter_stub(node: ast.FunctionDef) -> bool:
    """A starter function: it ends by raising NotImplementedError and returns nothing (checks it is given may come first)."""
    last = node.body[-1]
    return (
        isinstance(last, ast.Raise)
        and "NotImplementedError" in ast.unparse(last)
        and not any(isinstance(n, ast.Return) for n in ast.walk(node))
    )


def _shipped_definitions(release: Path):
    for path in answers.shipped_modules(release):
        yield from answers.definitions(release, path)


def test_no_shipped_module_implements_a_function_a_lab_grades(release):
    """Every graded name defined in commtax, grading, course.py or a lab's helper script is a stub there."""
    leaks = []
    for lab_dir in answers.lab_dirs_of(ROOT):
        lab = lab_dir.name[:6]
        graded = answers.graded_names(ROOT, lab_dir)
        assert graded, f"{lab_dir.name}: no graded names found (the finder is broken)"
        for definition in _shipped_definitions(release):
            name = definition.qualname.split(".")[-1]
            if name in graded and isinstance(definition.node, ast.FunctionDef) and not _is_stub(definition.node):
                if (lab, name, definition.where) not in answers.NOT_ANSWERS:
                    leaks.append(f"{lab} {name}: {definition.where}:{definition.line}")
    assert not leaks, "graded implementations in the release:\n" + "\n".join(leaks)


def test_every_starter_function_a_lab_grades_is_a_stub(release):
    """The learner's files themselves: each graded function only raises NotImplementedError with its hint."""
    written = []
    for lab_dir in answers.lab_dirs_of(ROOT):
        starter = ast.parse((release / "labs" / lab_dir.name / "starter.py").read_text())
        for name in answers.graded_names(ROOT, lab_dir):
            mine = next((n for n in starter.body if getattr(n, "name", None) == name), None)
            if isinstance(mine, ast.FunctionDef) and not _is_starter_stub(mine):
                written.append(f"{lab_dir.name}: {name}")
    assert not written, "starter functions with a body:\n" + "\n".join(written)


def test_no_solution_file_marker_or_scrambled_answer_ships(release):
    """No solution.py, solutions/, hidden tests or GRADED block; exercises.py holds no answer, scrambled or computed."""
    assert not list(release.rglob("solution.py")) and not (release / "solutions").exists()
    assert not list(release.rglob("hidden"))
    marked = [
        str(p.relative_to(release))
        for p in release.rglob("*.py")
        if p.name != "answers.py" and any(map(answers.BEGIN_RE.match, p.read_text().splitlines()))
    ]
    assert not marked, marked
    package = release / "commtax" / "exercises"  # its answers live in exercises/hidden/, which does not ship
    exercises = "".join(p.read_text() for p in sorted(package.rglob("*.py")))
    assert "\n# BEGIN ANSWERS" not in exercises
    assert not re.findall(r'"[A-Za-z0-9+/]{11}="', exercises), "a scrambled answer (8 bytes in base64) ships"
    assert "compute=" not in exercises, "an answer computed from commtax ships"
    shipped = _run_in(release, "from commtax.exercises import ANSWERS_SHIPPED; print(ANSWERS_SHIPPED)")
    assert shipped.stdout.strip() == "False", shipped.stderr


def test_release_readme_and_lessons_do_not_point_to_worked_solutions(release):
    readme = (release / "README.md").read_text()
    assert "solutions/" not in readme and "solution.py" not in readme
    for path in (release / "lessons").glob("*.ipynb"):
        text = "".join(
            cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            for cell in json.loads(path.read_text())["cells"]
        )
        assert "solutions/" not in text, path.name


def _run_in(release: Path, code: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(release), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg", "HOME": str(release)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=release, env=env, capture_output=True, text=True, timeout=120
    )


CALCULATOR_PROBE = """
import commtax, json
from commtax.formulas import collectives as C
from commtax.exercises import check, verdict
assert commtax.__file__.startswith({root!r}), commtax.__file__
try:
    value = C.allreduce_time(1e9, 8, 3e-6, 450e9, "ring")
except NotImplementedError as exc:
    value = str(exc)
print(json.dumps({{"value": value, "type": type(value).__name__, "verdict": verdict("01.1", 42)}}))
check("01.1", 42)
"""


def test_release_calculators_name_the_lab_function_until_it_is_written(release):
    """With the starters, a formula the lessons use says which lab function lights it; check() says self-study."""
    done = _run_in(release, CALCULATOR_PROBE.format(root=str(release)))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[0])
    assert result["value"].startswith("implement Lab 01's `allreduce_time` (labs/lab-01-alpha-beta/starter.py)")
    assert result["verdict"] == "no answers in this copy"
    assert "self-study in the course's public repository" in done.stdout


def test_release_calculators_run_on_the_learners_lab_code(release, tmp_path):
    """A learner's Lab 01 written (the reference, copied in): the release's formula returns its value."""
    from commtax.formulas import collectives

    expected = collectives.allreduce_time(1e9, 8, 3e-6, 450e9, "ring")
    starter = release / "labs" / "lab-01-alpha-beta" / "starter.py"
    kept = starter.read_text()
    try:
        starter.write_text((ROOT / "labs" / "lab-01-alpha-beta" / "solution.py").read_text())
        done = _run_in(release, CALCULATOR_PROBE.format(root=str(release)))
    finally:
        starter.write_text(kept)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[0])
    assert result["type"] == "float" and result["value"] == pytest.approx(expected, rel=1e-12)


def test_full_repository_markers_are_balanced_and_every_finding_is_covered():
    """In the course repository: each GRADED block's release call fits the lab's signature; no finding the release
    cannot ship unmarked (the same name, or a graded function's statements under another name) is left."""
    assert answers.check_markers(ROOT) == []
    uncovered = [
        f"{f.lab} {f.name}: {f.definition.where} ({f.why})"
        for f in answers.find(ROOT)
        if answers.must_cover(f) and not f.covered
    ]
    assert not uncovered, uncovered


def test_strip_graded_replaces_the_block_and_rejects_unbalanced_markers():
    text = (
        'def f(n):\n    """Doc."""\n    # BEGIN GRADED lab-01 p2p_time\n    return n + 1\n'
        '    # END GRADED: return learner.lab("01").p2p_time(n, 0, 1)\n'
    )
    stripped = answers.strip_graded(text)
    assert "n + 1" not in stripped and 'return learner.lab("01").p2p_time(n, 0, 1)' in stripped
    plain = answers.strip_graded(text.replace(': return learner.lab("01").p2p_time(n, 0, 1)', ""))
    assert "learner.unavailable('lab-01', 'p2p_time')" in plain
    with pytest.raises(answers.GradedMarkerError):
        answers.strip_graded(text.replace("    # END GRADED", "    # END GRADE"))


def test_release_ships_the_exercise_answer_file_and_the_teachers_copy_scores_it(release, tmp_path):
    """exercises/answers.toml lists every exercise; scoring: right within tolerance, a slip named, no answer 0."""
    from commtax import exercises
    from grading import exercise_answers

    shipped = (release / "exercises" / "answers.toml").read_text()
    assert all(f'# "{key}" = ...' in shipped for key in exercises.EXERCISES)
    submission = tmp_path / "alice"
    (submission / "exercises").mkdir(parents=True)
    right, slipped = exercises._answer("01.1"), exercises._answer("02.2") * 8
    (submission / "exercises" / "answers.toml").write_text(
        shipped.replace('# "01.1" = ...', f'"01.1" = {right * 1.004!r}')
        .replace('# "02.2" = ...', f'"02.2" = {slipped!r}')
        .replace('# "03.1" = ...', '"03.1" = "lots"')
    )
    scores = {s.exercise: s for s in exercise_answers.score(submission)}
    assert len(scores) == len(exercises.EXERCISES)
    assert (scores["01.1"].score, scores["01.1"].output) == (1, "right")
    assert scores["02.2"].score == 0 and scores["02.2"].output.startswith("wrong, a known slip (per-rank vs total")
    assert scores["03.1"].score == 0 and scores["03.1"].output.startswith("not a finite number")
    assert sum(s.score for s in scores.values()) == 1 and scores["04.1"].output == "no answer"
    assert all(repr(right)[:6] not in s.output for s in scores.values())  # the verdict never shows the answer
    (submission / "exercises" / "answers.toml").write_text('"01.1" = ')
    broken = exercise_answers.score(submission)
    assert sum(s.score for s in broken) == 0 and "not valid TOML" in broken[0].output


# -- every visible lab test runs in the release ---------------------------------------------------------


def test_no_visible_lab_test_reaches_a_reference_the_release_does_not_ship():
    """A lab test that calls a commtax function holding a GRADED block (or calling one, transitively) would be
    skipped in the release (commtax.learner): it must ask EXPECTED (commtax.recorded) for its expected values."""
    reaching = answers.visible_tests_reaching_references(ROOT)
    assert not reaching, (
        "visible lab tests that use a reference the student release does not ship (they would be "
        "skipped there; record their expected values in the lab's expected.py):\n" + "\n".join(reaching)
    )


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_release_records_exactly_the_expected_values_the_visible_tests_ask_for(release):
    """Each lab with recipes (expected.py, not shipped) has expected.json in the release: one entry per listed case
    (the visible tests' inputs), plain data (numbers, the odd name or flag, None), equal to what the reference gives in the full
    repository once read back."""
    labs = sorted(p.parent for p in ROOT.glob(f"labs/lab-*/{recorded.RECIPES_FILE}"))
    assert {p.name for p in labs} >= {"lab-08-memory-and-zero", "lab-11-plan-a-cluster", "lab-12-the-whole-bill"}
    for lab_dir in labs:
        shipped = release / "labs" / lab_dir.name
        assert not (shipped / recorded.RECIPES_FILE).exists(), f"{lab_dir.name}: the recipes ship"
        record = json.loads((shipped / recorded.RECORD_FILE).read_text())
        data = all(v is None or isinstance(v, (int, float, str)) for v in _leaves(record))  # None: no binding axis
        assert data, f"{lab_dir.name}: expected.json holds something other than numbers and names"
        full, released = recorded.Expected(lab_dir), recorded.Expected(shipped)
        assert full.reference_here and not released.reference_here
        cases = list(recorded._load_recipes(lab_dir).cases())
        assert set(record) == {recorded.key(name, args) for name, args in cases}, lab_dir.name
        for name, args in cases:
            why = mismatch(released(name, *args), full(name, *args), rel=0.0)
            assert why is None, f"{lab_dir.name} {recorded.key(name, args)}: {why}"


def test_expected_fails_loudly_for_a_missing_record_or_an_unlisted_case(tmp_path):
    """The release without expected.json, or without an entry, fails the test (no skip); in the course repository
    a test asking for a case the recipes do not list fails, since the release would have no value for it."""
    release_lab, course_lab = tmp_path / "release", tmp_path / "course"
    release_lab.mkdir()
    course_lab.mkdir()
    with pytest.raises(recorded.MissingRecord, match="expected.json is missing"):
        recorded.Expected(release_lab)("f", 1)
    (release_lab / recorded.RECORD_FILE).write_text(json.dumps({recorded.key("f", [1]): 2.0}))
    assert recorded.Expected(release_lab)("f", 1) == 2.0
    with pytest.raises(recorded.MissingRecord, match=r"no expected value for f\[2\]"):
        recorded.Expected(release_lab)("f", 2)
    (course_lab / recorded.RECIPES_FILE).write_text(
        "RECIPES = {'f': lambda x: 2.0 * x}\n\ndef cases():\n    yield 'f', (1,)\n"
    )
    assert recorded.Expected(course_lab)("f", 1) == 2.0
    with pytest.raises(recorded.MissingRecord, match=r"does not list the case f\[3\]"):
        recorded.Expected(course_lab)("f", 3)

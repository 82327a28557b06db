"""No exercise's answer ships outside ``commtax/exercises/hidden/`` (the folder the release drops), and no lesson,
README or check() example shows one.

The lesson search covers every notebook (markdown, code and any stored outputs, legends included), the README and
the labs' READMEs, looking for each exercise's answer written the ways it would be shown (three significant digits,
with units scaled: ``format_bytes``, ``format_seconds``, a percentage).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from commtax import exercises
from commtax.units import format_bytes, format_rate, format_seconds

ROOT = Path(__file__).resolve().parent.parent

PACKAGE = ROOT / "commtax" / "exercises"
SCRAMBLED = re.compile(r'"[A-Za-z0-9+/]{11}="')  # 8 bytes in base64: a scrambled answer or slip


def test_answers_and_slips_live_only_in_the_folder_the_release_drops():
    """Outside ``hidden/`` the package holds no scrambled value and nothing computed; the release leaves out
    every folder named ``hidden`` (as it does the labs' hidden tests)."""
    from grading.release import RELEASE_EXCLUDED

    assert "hidden" in RELEASE_EXCLUDED
    for path in sorted(PACKAGE.rglob("*.py")):
        if "hidden" in path.relative_to(PACKAGE).parts:
            continue
        text = path.read_text()
        assert not SCRAMBLED.findall(text) and "compute=lambda" not in text, path.name
    assert SCRAMBLED.findall((PACKAGE / "hidden" / "answers.py").read_text())


def test_without_the_hidden_folder_check_says_self_study(tmp_path):
    """The package as the release copies it (``hidden/`` left out): no answers, no slips, check() says so."""
    import shutil
    import subprocess
    import sys

    from grading.release import RELEASE_EXCLUDED

    shutil.copytree(ROOT / "commtax", tmp_path / "commtax", ignore=shutil.ignore_patterns(*RELEASE_EXCLUDED))
    assert not (tmp_path / "commtax" / "exercises" / "hidden").exists()
    code = (
        "from commtax import exercises as e; assert not e.ANSWERS_SHIPPED and e.SLIPS == {}; "
        "assert not any(x.scrambled or x.compute for x in e.EXERCISES.values()); e.check('01.1', 42)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert exercises.SELF_STUDY in done.stdout


# -- no answer in the lessons ---------------------------------------------------------------------------------


def _notebook_text(path: Path) -> str:
    """Every cell's source and every stored output's text (a legend is in a cell's source or its output)."""
    parts = []
    for cell in json.loads(path.read_text())["cells"]:
        parts.append("".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"])
        for output in cell.get("outputs", []):
            for key in ("text",):
                if key in output:
                    parts.append("".join(output[key]) if isinstance(output[key], list) else output[key])
            for mime, data in output.get("data", {}).items():
                if mime.startswith("text/"):
                    parts.append("".join(data) if isinstance(data, list) else data)
    return "\n".join(parts)


def _shown(answer: float, what: str) -> set[str]:
    """The ways an answer would be written: three significant digits, units scaled, a percentage."""
    forms = set()
    what = what.lower()
    ratio = any(word in what for word in ("divided", "ratio", "times", "fraction of", "per byte"))
    if "bytes/s" in what:
        forms |= {format_rate(answer), format_rate(answer, 2)}  # "1.61 GB/s", and "1.6 GB/s" in prose
    elif "bytes" in what and not ratio and not what.startswith("tokens"):
        forms.add(format_bytes(answer))
        for power, unit in ((30, "GiB"), (20, "MiB")):  # binary, as the lessons write tensors
            if answer >= 2**power:
                forms.add(f"{answer / 2**power:.3g} {unit}")
                break
    if "seconds" in what:
        forms.add(format_seconds(answer))
    if exercises._asks_fraction(exercises.Exercise(what)) and 0 < answer < 2:
        forms.add(f"{answer:.1%}" if answer >= 0.1 else f"{100 * answer:.3g}%")  # three digits: 54.9%, 9.86%
    text = f"{answer:.3g}"
    digits = text.replace(".", "").replace("-", "").strip("0") if "." in text else text.strip("0")
    if "e" not in text and len(digits) >= 3:  # a bare number only with three digits to go by (not 300, 42, 4.5)
        forms.add(text)
    if answer >= 1000 and not forms - {f"{answer:.1%}"}:
        rounded = float(text)
        forms |= (
            {f"{rounded:,.0f}", f"{rounded:.0f}", f"{answer:,.0f}"} if len(f"{rounded:.0f}".strip("0")) >= 3 else set()
        )
    return forms


def _documents():
    yield from sorted((ROOT / "lessons").glob("*.ipynb"))
    yield ROOT / "README.md"
    yield from sorted((ROOT / "labs").glob("*/README.md"))


# Numbers that coincide with an answer but are not it: (place, form, exercise, why).
COINCIDENCES = {
    ("labs/lab-03-measure-the-wire/README.md", "0.875", "02.4", "the all-gather's busbw factor (P-1)/P at P = 8"),
    ("labs/lab-13-context-parallel/README.md", "13.2", "10.2", "a measured zigzag step, 13.2 ms"),
    ("lessons/13-your-cluster-measured.ipynb", "13.2", "10.2", "the id of exercise 13.2 in its check line"),
    ("lessons/06-pipeline-bubbles.ipynb", "1 GiB", "07.3", "the modeler's transfer per step and a layer's 34 sbh"),
    ("lessons/13-your-cluster-measured.ipynb", "1 GiB", "07.3", "the nccl-tests row of exercise 13.2"),
}
# Answers a lab's README may show: none.
IN_LAB_READMES: set[tuple[str, str, str]] = set()


def _answers_shown() -> set[tuple[str, str, str]]:
    found = set()
    texts = {path: (_notebook_text(path) if path.suffix == ".ipynb" else path.read_text()) for path in _documents()}
    for exercise_id, exercise in exercises.EXERCISES.items():
        answer = exercises._answer(exercise_id)
        for form in _shown(answer, exercise.what):
            pattern = re.compile(r"(?<![\d.,])" + re.escape(form) + r"(?![\d])")
            for path, text in texts.items():
                if pattern.search(text):
                    found.add((str(path.relative_to(ROOT)), form, exercise_id))
    return found - {c[:3] for c in COINCIDENCES}


def test_no_exercise_answer_appears_in_a_lesson_or_the_readme():
    found = sorted(
        f"{exercise_id}: {form!r} in {where}"
        for where, form, exercise_id in _answers_shown()
        if (where, form, exercise_id) not in IN_LAB_READMES
    )
    assert not found, "answers shown:\n" + "\n".join(found)


def test_no_exercise_answer_appears_in_a_lab_readme():
    shown = sorted(f"{i}: {form!r} in {where}" for where, form, i in _answers_shown() if where.startswith("labs/"))
    assert not shown, "answers shown in lab READMEs:\n" + "\n".join(shown)


# Round factors a reader could undo: an example that is the answer times one of them gives the answer away.
_SIMPLE_FACTORS = (1, 2, 1 / 2, 4, 1 / 4, 8, 1 / 8, 10, 1 / 10, 100, 1 / 100, 1e3, 1e-3, 1e6, 1e-6, 1e9, 1e-9)


def test_no_check_example_in_a_readme_or_a_lesson_gives_an_answer():
    """A `check("NN.k", number)` written out (the README's example, TEACHING.md's, a docstring's) reveals nothing:
    it is not the answer nor a round multiple of it, and its verdict is the bare "wrong" (a named slip or a
    factor hint would tell the reader how far the answer is from it)."""
    calls = []
    for path in [*_documents(), ROOT / "TEACHING.md"]:
        text = _notebook_text(path) if path.suffix == ".ipynb" else path.read_text()
        calls += [(path.name, e, v) for e, v in re.findall(r'check\("(\d\d\.\d)", ([-+.\deE]+)\)', text)]
    for path in sorted((ROOT / "commtax" / "exercises").rglob("*.py")):
        calls += [(path.name, e, v) for e, v in re.findall(r'check\("(\d\d\.\d)", ([-+.\deE]+)\)', path.read_text())]
    assert any(where == "README.md" for where, _, _ in calls), "the README's check example is gone"
    for where, exercise_id, value in calls:
        for factor in _SIMPLE_FACTORS:
            assert exercises.verdict(exercise_id, float(value) * factor) != "right", (
                f"{where}: check({exercise_id!r}, {value}) is the answer times {1 / factor:g}"
            )
        assert exercises.verdict(exercise_id, float(value)) == "wrong", (
            f"{where}: check({exercise_id!r}, {value}) names a slip or a factor, so it tells where the answer is"
        )


def test_no_lesson_prints_or_plots_an_answer_when_run():
    """An answer a lesson would print or plot only when run is not in its stored text, where the search above
    looks: the code that would show each is absent (and, where a lesson states a number instead, it is there)."""
    text = {
        name: _notebook_text(next((ROOT / "lessons").glob(f"{name}-*.ipynb")))
        for name in ("01", "03", "04", "05", "06", "08", "12")
    }
    assert "tax {across.axes['TP'].tax:.0%}" not in text["04"]  # 04.4: TP 16's tax, printed
    assert "(8, 256)" not in text["01"] and "(8, 64, 256" not in text["01"]  # 01.3: the P = 256 crossover
    assert "equal to TP (Exercise 5)" not in text["03"]  # 03.5: the legend
    assert "For a 7B model" not in text["03"] and "$7\\times10^9$ parameters" in text["03"]  # 03.2 says its number
    assert "at t = 8 the one-shot" not in text["05"]  # 05.3: the printed crossover
    assert '("interleaved_1f1b", 8, 32, 2)' not in text["06"]  # 06.1: the simulator's table
    assert "s* = {format_bytes(s_star)}" not in text["08"]  # 08.2: the printed optimum
    assert "s = 131072\nrows" not in text["12"]  # 12.1, 12.3: the bytes table
    assert '"exercise 2"' in text["12"]  # 12.2: the crossover table's row
    assert "(1048576, 8)" not in text["12"]  # 07.3: the buffer table
    assert "{format_seconds(ib_case.exposed)}" not in text["12"]  # 12.5: the source check

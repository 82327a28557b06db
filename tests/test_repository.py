"""The course's structure keeps its conventions: pins, lab folders, starters, notebooks, README."""

import ast
import inspect
import re
from pathlib import Path

import nbformat
import pytest

from commtax.labs import lab_dirs, load_lab
from grading.starters import make_starter

ROOT = Path(__file__).resolve().parent.parent
LABS = lab_dirs()
LAB_IDS = [p.name for p in LABS]
LESSONS = sorted((ROOT / "lessons").glob("*.ipynb"))
PIN_RE = re.compile(r"^([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)$")


def requirements_pins() -> dict:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            match = PIN_RE.match(line)
            assert match, f"requirements.txt: {line!r} is not pinned with =="
            pins[match.group(1).lower()] = match.group(2)
    return pins


def environment_pins() -> dict:
    # environment.yml is simple enough to read without a YAML library (not a dependency).
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == "- pip:")
    pins = {}
    for line in lines[start + 1 :]:
        item = line.strip()
        if not item.startswith("- "):
            break
        item = item[2:].strip()
        if item == "-e .":
            continue
        match = PIN_RE.match(item)
        assert match, f"environment.yml: {item!r} is not pinned with =="
        pins[match.group(1).lower()] = match.group(2)
    return pins


def test_requirements_and_environment_pin_the_same_versions():
    assert requirements_pins() == environment_pins()
    assert requirements_pins()["torch"] == "2.13.0"
    assert "python=3.11" in (ROOT / "environment.yml").read_text()


def test_grading_requirements_are_a_subset_of_the_course_pins_without_the_notebook_tools():
    # Gradescope's setup.sh and the Classroom workflow install grading/requirements.txt only.
    grading = dict(
        PIN_RE.match(line).groups()
        for line in (ROOT / "grading" / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    course = requirements_pins()
    assert {name: course.get(name.lower()) for name in grading} == grading
    assert {"torch", "numpy", "pytest", "psutil"} <= set(grading) and not {"jupyterlab", "playwright"} & set(grading)


def test_top_level_is_laid_out_as_the_course_is_browsed():
    for name in (
        "lessons",
        "labs",
        "solutions",
        "grading",
        "environment.yml",
        "README.md",
        "TEACHING.md",
        "CONTRIBUTING.md",
        "requirements.txt",
        "pyproject.toml",
        "course.py",
        ".ci/run",
    ):
        assert (ROOT / name).exists(), name


@pytest.mark.parametrize("lab_dir", LABS, ids=LAB_IDS)
def test_each_lab_folder_is_complete(lab_dir):
    for name in ("README.md", "starter.py", "solution.py", "test_lab.py"):
        assert (lab_dir / name).is_file(), f"{lab_dir.name} has no {name}"
    readme = (lab_dir / "README.md").read_text().lower()
    for heading in (
        "why this lab exists",
        "background",
        "files",
        "run",
        "what the tests prove",
        "notes",
        "going further",
        "references",
    ):
        assert f"## {heading}" in readme, f"{lab_dir.name}/README.md has no '## {heading}' section"


@pytest.mark.parametrize("lab_dir", LABS, ids=LAB_IDS)
def test_starter_is_the_solution_with_its_marked_bodies_removed(lab_dir):
    # Regenerate with `python -m grading starters` after editing a solution.
    expected = make_starter((lab_dir / "solution.py").read_text(), str(lab_dir / "solution.py"))
    assert (lab_dir / "starter.py").read_text() == expected, (
        f"{lab_dir.name}/starter.py is out of date: run `python -m grading starters`"
    )


def _public_api(module) -> dict:
    api = {}
    for name, obj in vars(module).items():
        if (
            name.startswith("_")
            or inspect.ismodule(obj)
            or getattr(obj, "__module__", module.__name__) != module.__name__
        ):
            continue
        if inspect.isfunction(obj):
            api[name] = str(inspect.signature(obj))
        elif inspect.isclass(obj):
            api[name] = {
                m: str(inspect.signature(f))
                for m, f in vars(obj).items()
                if inspect.isfunction(f) and (not m.startswith("_") or m == "__init__")
            }
        else:
            api[name] = repr(obj) if isinstance(obj, (int, float, str, tuple)) else type(obj).__name__
    return api


@pytest.mark.parametrize("lab_dir", LABS, ids=LAB_IDS)
def test_starter_and_solution_have_the_same_public_names_and_signatures(lab_dir):
    starter, solution = load_lab(lab_dir, "starter"), load_lab(lab_dir, "solution")
    assert _public_api(starter) == _public_api(solution)


@pytest.mark.parametrize("lab_dir", LABS, ids=LAB_IDS)
def test_starter_functions_document_units_and_raise_with_a_hint(lab_dir):
    source = (lab_dir / "starter.py").read_text()
    assert source.count("not implemented yet") >= 1
    for func in [
        f
        for f in vars(load_lab(lab_dir, "starter")).values()
        if inspect.isfunction(f) and not f.__name__.startswith("_")
    ]:
        assert func.__doc__ and len(func.__doc__) > 40, f"{func.__name__} needs a real docstring"


def test_lesson_and_solution_notebooks_pair_up_and_are_stored_clean():
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    assert [p.name for p in LESSONS] == [p.name for p in solutions]
    for path in LESSONS + solutions:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.kernelspec.name == "python3", path.name
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, (
                    f"{path.name}: store notebooks without outputs (Kernel > Restart and clear outputs)"
                )
    for path in LESSONS:
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
        assert "## Exercises" in text, f"{path.name} has no exercises"


def test_readme_maps_every_lesson_and_lab_and_shows_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "python3 course.py lab" in readme and "python3 course.py test" in readme
    for path in LESSONS:
        assert path.stem in readme, f"README.md does not list lessons/{path.name}"
    for lab_dir in LABS:
        assert lab_dir.name in readme, f"README.md does not list labs/{lab_dir.name}"


@pytest.mark.parametrize("lab_dir", LABS, ids=LAB_IDS)
def test_lab_readme_table_lists_exactly_the_lab_tests(lab_dir):
    tests = set(re.findall(r"^def (test_\w+)", (lab_dir / "test_lab.py").read_text(), re.M))
    listed = set(re.findall(r"^\| `(test_\w+)`", (lab_dir / "README.md").read_text(), re.M))
    assert tests - listed == set(), f"tests missing from {lab_dir.name}/README.md"
    assert listed - tests == set(), f"{lab_dir.name}/README.md lists tests that do not exist"


def test_binder_installs_the_course_pins_with_the_cpu_torch_and_python_of_environment_yml():
    # Binder reads binder/ (and then ignores environment.yml): the same pins by reference, never a copy
    # that drifts; torch from PyTorch's CPU index (PyPI's Linux wheel is the CUDA build, GBs that a
    # GPU-less Binder machine cannot use); the Python of environment.yml; the package and settings.
    lines = [l.split("#")[0].strip() for l in (ROOT / "binder" / "requirements.txt").read_text().splitlines()]
    assert [l for l in lines if l] == [
        "--extra-index-url https://download.pytorch.org/whl/cpu",
        "-r ../requirements.txt",
    ]
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    assert f"python={runtime.removeprefix('python-')}" in (ROOT / "environment.yml").read_text()
    post_build = ROOT / "binder" / "postBuild"
    assert post_build.stat().st_mode & 0o111, "binder/postBuild must be executable"
    text = post_build.read_text()
    assert "pip install --no-deps -e ." in text and "install_settings" in text


def secret_seed_misuses(path: Path) -> list:
    """Where a test module derives a stream from its secret seed other than through ``stream_seed``.

    The seed must be read once, ``NAME = input_seed(default)``, and NAME used only as the first argument
    of ``stream_seed(NAME, ...)``: ``NAME + rank`` or ``NAME * k + rank`` seeds would let a rank that
    recovered its own stream's seed work out every other rank's.
    """
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def called(node, name):
        return isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name

    names, problems = set(), []
    for node in ast.walk(tree):
        if called(node, "input_seed"):
            parent = parents.get(node)
            if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
                names.add(parent.targets[0].id)
            else:
                problems.append(f"line {node.lineno}: input_seed(...) not read as NAME = input_seed(default)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load):
            parent = parents.get(node)
            if not (called(parent, "stream_seed") and parent.args and parent.args[0] is node):
                problems.append(f"line {node.lineno}: {node.id} used outside stream_seed({node.id}, ...)")
    return problems


# (a lab's test helpers beside test_lab.py, _workers.py, _inputs.py, ..., draw its secret inputs too)
SEEDED = [
    *(p / "test_lab.py" for p in LABS),
    *(f for p in LABS for f in sorted(p.glob("_*.py"))),
    *sorted((ROOT / "grading" / "hidden").glob("*/test_*.py")),
]


@pytest.mark.parametrize("path", SEEDED, ids=[p.parent.name + "/" + p.name for p in SEEDED])
def test_secret_seeds_reach_every_stream_through_stream_seed_only(path):
    assert secret_seed_misuses(path) == []


def test_the_secret_seed_check_catches_offsets_arithmetic_and_a_changed_read(tmp_path):
    module = tmp_path / "test_lab.py"
    module.write_text(
        "SEED = input_seed(1) % 2 ** 52\nS2 = input_seed(2)\n"
        "a = manual_seed(SEED + rank)\nb = stream_seed(S2, 'rank', rank)\nc = stream_seed(0, S2)\n"
    )
    assert secret_seed_misuses(module) == [
        "line 1: input_seed(...) not read as NAME = input_seed(default)",
        "line 5: S2 used outside stream_seed(S2, ...)",
    ]

"""A teacher's working files (student work, grades, reports, rosters, variant files, the variant secret) never
leave their copy: git ignores them at its top, and the student release and the Gradescope zip leave them out,
for a teacher who keeps them in the copy rather than in ../term as TEACHING.md says.
"""

import shutil
import subprocess
import zipfile
from pathlib import Path

from grading.release import TEACHERS_FILES, build_gradescope_zip, build_release, teachers_file
from tests.grading_support import NEEDS_SOLUTIONS, ROOT

pytestmark = NEEDS_SOLUTIONS

# What TEACHING.md's commands would write at the top of the copy, one of each kind.
PLANTED = [
    "submissions/s001/labs/lab-06-tp-comm-cost/starter.py",
    "late/s002/starter.py",
    "plag/x/starter.py",
    "term/grades.csv",
    "variants/s001.toml",
    "grades.csv",
    "grades-lab06.csv",
    "grades-reports/s001.txt",
    "roster.csv",
    "canvas.csv",
    "moodle.csv",
    "commtax-secret",
]


def _tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


def test_git_ignores_the_teachers_files_and_none_of_the_courses():
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *PLANTED], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert ignored == PLANTED
    assert all(teachers_file(Path(p)) for p in PLANTED)
    assert not [p for p in _tracked() if teachers_file(Path(p))], "a course file has a teacher's file's name"
    assert set(TEACHERS_FILES) <= {line.strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()}


def test_the_release_and_the_gradescope_zip_leave_the_teachers_files_out(tmp_path):
    copy = tmp_path / "copy"
    for name in _tracked():  # the teacher's copy: the course, and their term's files at its top
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    for name in PLANTED:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_text("a teacher's file\n")
    release = build_release(tmp_path / "release", source=copy)
    shipped = [p.relative_to(release).as_posix() for p in release.rglob("*")]
    assert not [p for p in shipped if teachers_file(Path(p))], shipped
    assert (release / "labs" / "lab-06-tp-comm-cost" / "starter.py").exists()
    names = zipfile.ZipFile(build_gradescope_zip(tmp_path / "ag.zip", source=copy)).namelist()
    assert not [n for n in names if teachers_file(Path(n))]
    assert "labs/lab-06-tp-comm-cost/starter.py" in names and "grading/grader.py" in names

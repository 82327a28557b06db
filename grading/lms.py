"""Turn a ``grade-many`` CSV into a file a learning management system imports (Canvas, Moodle).

Neither LMS knows our student ids (the submission folder names), so a **roster** links them: any CSV
with a ``student_id`` column (the folder name) and the LMS's own identity columns, most simply the
LMS's own gradebook export with a ``student_id`` column added. Without one, the folder name is used as
the login (name the folders by the students' LMS logins).

* **Canvas** (Grades > Import): Canvas reads the columns ``Student``, ``ID``, ``SIS User ID``,
  ``SIS Login ID`` and ``Section`` to find each student (one of name, ID or SIS User ID, plus SIS
  Login ID and Section, are required: Ohio State's guide to Canvas grade import,
  https://teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-grades/import-csv-file-carmen-grades),
  then one column per assignment; a column whose name is no existing assignment creates one. Canvas's
  own exports have a second row ``Points Possible``; this file has it too.
* **Moodle** (Grades > Import > CSV file): any columns; in the import's preview you map one identity
  column ("Map from") to a Moodle user field ("Map to": username, email address or ID number) and each
  grade column to a grade item (MoodleDocs, "Grade import",
  https://docs.moodle.org/311/en/Grade_import). Every row is a user, so there is no points row; a
  grade above the grade item's maximum is refused by Moodle (make the item's maximum the CSV's
  ``max_score``, or weight the labs to it with grading/weights.toml).
"""

from __future__ import annotations

import csv
from pathlib import Path

CANVAS_IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
FORMATS = ("canvas", "moodle")


def read_grades(path: Path) -> tuple[list, list, list]:
    """(header, the Points Possible row, the student rows) of a ``grade-many`` CSV."""
    with open(path, newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    if len(rows) < 2 or rows[0][:3] != ["student_id", "score", "max_score"] or rows[1][0] != "Points Possible":
        raise ValueError(
            f"grades {path}: not a grade-many CSV (header student_id, score, max_score, ...; "
            "a second row Points Possible)"
        )
    return rows[0], rows[1], rows[2:]


def read_roster(path: Path | None) -> tuple[list, dict]:
    """(its columns besides student_id, {student_id: {column: value}}); ({}, {}) without a roster."""
    if path is None:
        return [], {}
    with open(path, newline="", encoding="utf-8-sig") as f:  # a spreadsheet's byte-order mark is fine
        reader = csv.DictReader(f)
        if not reader.fieldnames or "student_id" not in reader.fieldnames:
            raise ValueError(f"roster {path}: needs a student_id column (each student's submission folder name)")
        people = {row["student_id"]: row for row in reader if row.get("student_id")}
        return [c for c in reader.fieldnames if c != "student_id"], people


def export(grades: Path, fmt: str, assignment: str, roster: Path | None = None, per_lab: bool = False) -> list:
    """The rows of the LMS file (header first): the total as ``assignment``, and with ``per_lab`` one
    column per lab (``assignment: lab``)."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt: {fmt!r} is not one of {', '.join(FORMATS)}")
    if not assignment.strip():
        raise ValueError("assignment: give the LMS column a name")
    header, points, students = read_grades(grades)
    # The lab columns lie between max_score and "problem" (then "flags", the teacher's only: never exported).
    end = header.index("problem") if "problem" in header else len(header) - 1
    labs = header[3:end] if per_lab else []
    columns, people = read_roster(roster)
    grade_names = [assignment, *[f"{assignment}: {lab}" for lab in labs]]
    grade_index = [1, *[header.index(lab) for lab in labs]]
    missing = sorted(row[0] for row in students if people and row[0] not in people)
    if missing:
        raise ValueError(
            f"roster {roster}: no row for {', '.join(missing[:10])}" + (" ..." if len(missing) > 10 else "")
        )
    if fmt == "canvas":
        identity = CANVAS_IDENTITY
        if people and not {"Student", "ID", "SIS User ID"} & set(columns):  # Canvas would match no one
            raise ValueError(
                f"roster {roster}: a Canvas roster needs Student, ID or SIS User ID beside student_id "
                f"(Canvas's own gradebook export with a student_id column added); it has "
                f"{', '.join(columns) or 'student_id only'}"
            )
        out = [
            [*identity, *grade_names],
            [
                "Points Possible",
                *[""] * (len(identity) - 1),
                rounded(points[2]),
                *[rounded(points[i]) for i in grade_index[1:]],
            ],
        ]
        for row in students:
            who = people.get(row[0]) or {"Student": row[0], "SIS Login ID": row[0]}
            out.append([who.get(c, "") for c in identity] + [rounded(row[i]) for i in grade_index])
        return out
    identity = ["student_id", *columns]
    out = [[*identity, *grade_names]]
    for row in students:
        who = people.get(row[0], {})
        out.append([row[0], *[who.get(c, "") for c in columns]] + [rounded(row[i]) for i in grade_index])
    return out


def rounded(cell: str) -> str:
    """A points cell as the LMS imports it: at most two decimals ("16.93", not "16.9338"); other text kept.
    (Older grade-many CSVs have unrounded weighted points.)"""
    try:
        value = float(cell)
    except (TypeError, ValueError):
        return cell
    return f"{round(value, 2) + 0.0:g}" if value == value and abs(value) != float("inf") else cell


def write(rows: list, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return path

"""The trusted side never writes through a link learner code planted in a folder it can write.

In same-user mode learner code runs as the teacher's user, and a rank (or a process it left behind)
can plant ``RUN_DIR/rank1.out -> /any/file/the/grader/can/write`` before the launcher creates the
rank's output file; a ``chmod`` by path can likewise follow a link that replaced a rank's folder.
"""

from __future__ import annotations

import os

import pytest

from commtax import boundary
from commtax.ranks import _start


def test_a_file_the_launcher_creates_is_never_opened_through_a_planted_link(tmp_path):
    target = tmp_path / "teachers_file.py"
    target.write_text("# the teacher's\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "rank1.out").symlink_to(target)
    with pytest.raises(FileExistsError):
        _start.start_rank(str(run_dir), 1, 2, None)
    assert target.read_text() == "# the teacher's\n"


def test_a_file_already_there_is_refused_and_a_new_one_is_made(tmp_path):
    (tmp_path / "job.pkl").write_bytes(b"planted")
    with pytest.raises(FileExistsError):
        boundary.create_trusted_file(tmp_path / "job.pkl")
    with boundary.create_trusted_file(tmp_path / "new.out") as f:
        f.write(b"ok")
    assert (tmp_path / "new.out").read_bytes() == b"ok"


def test_a_rank_folder_is_made_and_its_mode_set_without_following_a_link(tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o1777)
    real_mkdir = os.mkdir

    def mkdir_then_swap(path, mode=0o777):   # the race: the new folder replaced by a link before its chmod
        real_mkdir(path, mode)
        os.rmdir(path)
        os.symlink(outside, path)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    with pytest.raises(OSError):
        _start.make_rank_folders(str(run_dir), 1)
    assert outside.stat().st_mode & 0o7777 == 0o700


def test_a_rank_result_larger_than_the_boundary_carries_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from commtax.ranks import _watch
    folder = tmp_path / "rank0"
    folder.mkdir()
    result = folder / "rank0.result"
    with open(result, "wb") as f:          # sparse: nothing of a tmpfs cap, all of the reader's memory if read
        f.truncate(boundary.MAX_FRAME + 1)
    reads = []
    real_open = boundary.open_learner_file

    def watched_open(path, mode="rb"):
        handle = real_open(path, mode)
        real_read = handle.read
        handle.read = lambda *args: reads.append(args) or real_read(*args)
        return handle

    monkeypatch.setattr(boundary, "open_learner_file", watched_open)
    failure = _watch.collect(str(tmp_path), 0, 0, 1.0)
    assert "larger than" in failure.summary and not reads

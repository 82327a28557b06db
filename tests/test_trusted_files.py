"""The trusted side never writes through a link learner code planted in a folder it can write.

In same-user mode learner code runs as the teacher's user, and a rank (or a process it left behind)
can plant ``RUN_DIR/rank1.out -> /any/file/the/grader/can/write`` before the launcher creates the
rank's output file; a ``chmod`` by path can likewise follow a link that replaced a rank's folder.
"""

from __future__ import annotations

import os

import pytest

from commtax import boundary, learner_process
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

    def mkdir_then_swap(path, mode=0o777, *, dir_fd=None):  # the race: the new folder replaced by a link
        real_mkdir(path, mode, dir_fd=dir_fd)  # before its chmod
        os.rmdir(path, dir_fd=dir_fd)
        os.symlink(outside, path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    with pytest.raises(OSError):
        _start.make_rank_folders(str(run_dir), 1)
    assert outside.stat().st_mode & 0o7777 == 0o700


def test_a_rank_result_larger_than_the_boundary_carries_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from commtax.ranks import _watch

    folder = tmp_path / "rank0"
    folder.mkdir()
    result = folder / "rank0.result"
    with open(result, "wb") as f:  # sparse: nothing of a tmpfs cap, all of the reader's memory if read
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


def test_a_run_folder_swapped_for_a_link_gets_none_of_the_launchers_files(tmp_path, monkeypatch):
    # Same-user mode: the learner's user owns the run folder, so a rank can rename it and put a link to any
    # folder of the teacher's at its path; the launcher's later files must still land in the folder it made.
    monkeypatch.setattr(learner_process, "sandbox", lambda: None)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    outside = tmp_path / "teachers_folder"
    outside.mkdir()
    run_dir = boundary.learner_run_dir()
    _start.write_job(run_dir, len, ((1, 2),), {}, 2, "gloo", 5.0)
    os.rename(run_dir, tmp_path / "moved")
    os.symlink(outside, run_dir)
    _start.make_rank_folders(run_dir, 2)
    assert _start.files_lock(run_dir) in (True, False)
    _start.start_rank(run_dir, 1, 2, None).wait(timeout=60)
    assert sorted(os.listdir(outside)) == []
    assert {"job.pkl", "rank0", "rank1", "rank1.out"} <= set(os.listdir(tmp_path / "moved"))


def test_a_run_folder_is_made_and_its_mode_set_without_following_a_link(tmp_path, monkeypatch):
    # In the grader's sandbox the run folder is world-writable and sticky; were that mode set by path, a
    # learner process could swap the new folder for a link to any file of the teacher's in between.
    runs = tmp_path / "runs"
    runs.mkdir()
    target = tmp_path / "teachers_file"
    target.write_text("secret")
    target.chmod(0o600)
    monkeypatch.setattr(learner_process, "sandbox", lambda: {"runs": str(runs)})
    real_mkdir = os.mkdir

    def mkdir_then_swap(path, mode=0o777, *, dir_fd=None):
        real_mkdir(path, mode, dir_fd=dir_fd)
        folder = os.path.join(runs, path) if dir_fd is not None else path
        os.rmdir(folder)
        os.symlink(target, folder)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    with pytest.raises(OSError):
        boundary.learner_run_dir()
    assert target.stat().st_mode & 0o7777 == 0o600


def test_run_folders_are_refused_where_the_runs_folder_is_no_longer_the_one_the_grader_recorded(tmp_path, monkeypatch):
    # Same-user mode: the folders above the sandbox's runs tmpfs are the learner's, so learner code can move
    # them and point the host's path at any folder; the trusted side checks it still reaches the tmpfs.
    runs, elsewhere = tmp_path / "runs", tmp_path / "teachers_folder"
    runs.mkdir()
    elsewhere.mkdir()
    recorded = [runs.stat().st_dev, runs.stat().st_ino]
    monkeypatch.setattr(learner_process, "sandbox", lambda: {"runs": str(runs), "runs_id": recorded})
    made = boundary.learner_run_dir()
    assert os.path.dirname(made) == str(runs) and os.stat(made).st_mode & 0o7777 == 0o1777
    os.rename(runs, tmp_path / "moved")
    os.symlink(elsewhere, runs)
    with pytest.raises(OSError, match="no longer"):
        boundary.learner_run_dir()
    assert os.listdir(elsewhere) == []


def test_files_below_a_run_folder_are_read_from_the_folder_made_even_after_it_is_swapped_for_a_link(
    tmp_path, monkeypatch
):
    # A rank's output is quoted in the failure message its learner sees: a run folder renamed and replaced by
    # a link to a folder of the teacher's must not make the launcher quote the teacher's files instead.
    monkeypatch.setattr(learner_process, "sandbox", lambda: None)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    outside = tmp_path / "teachers_folder"
    (outside / "rank0").mkdir(parents=True)
    (outside / "rank0.out").write_text("the teacher's file\n")
    (outside / "rank0" / "rank0.stack").write_text("the teacher's other file\n")
    run_dir = boundary.learner_run_dir()
    _start.make_rank_folders(run_dir, 1)
    with open(os.path.join(run_dir, "rank0.out"), "w") as f:
        f.write("what rank 0 printed\n")
    os.rename(run_dir, tmp_path / "moved")
    os.symlink(outside, run_dir)
    assert _start.tail(os.path.join(run_dir, "rank0.out")) == "what rank 0 printed\n"
    assert _start.read_text(_start.rank_path(run_dir, 0, "stack")) == ""
    os.rename(tmp_path / "moved" / "rank0", tmp_path / "rank0-moved")  # a rank's folder swapped likewise
    os.symlink(outside / "rank0", tmp_path / "moved" / "rank0")
    assert _start.read_text(_start.rank_path(run_dir, 0, "stack")) == ""


def test_a_run_folders_descriptor_is_closed_when_the_run_ends_even_if_its_error_is_kept():
    from commtax.ranks.launch import run_ranks

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    kept = []
    before = open_fds()
    for _ in range(3):
        try:  # arguments that cannot be sent: refused after the run folder was made
            run_ranks(_start.write_job, 1, rank_args=[(lambda: 0,)], timeout=60)
        except ValueError as exc:
            kept.append(exc)  # a caller that keeps the error keeps the runner's frames with it
    assert len(kept) == 3 and "cannot send rank 0 its arguments" in str(kept[0])
    assert open_fds() <= before
    folder = learner_process.learner_run_dir()
    fd = folder.fd
    folder.close()
    folder.close()  # twice is fine
    assert folder.fd == -1
    with pytest.raises(OSError):
        os.fstat(fd)

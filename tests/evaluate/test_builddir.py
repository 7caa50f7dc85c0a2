"""The candidate's build directory (krex_lab/evaluate/judge/builddir.py), on real files: emptied
and removed around each evaluation, links never followed, the compilers' cache kept per source."""

from __future__ import annotations

import os
from pathlib import Path

from krex_lab.evaluate.judge.builddir import BuildDir


def _planted(build: Path, outside: Path) -> None:
    """What a candidate leaves: a file, links out of its directory, a pipe, in a cache and beside."""
    (build / "answers.pkl").write_text("memo")
    (build / "torch_extensions" / "ext").mkdir(parents=True)
    (build / "torch_extensions" / "ext" / "ext.so").write_text("built")
    (build / "torch_extensions" / "ext" / "link").symlink_to(outside)
    os.mkfifo(build / "torch_extensions" / "ext" / "pipe")
    (build / "linked-dir").symlink_to(outside.parent)


def test_each_evaluation_starts_empty_but_for_the_kept_cache_and_no_link_is_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "builds", tmp_path / "users-file.txt"
    outside.write_text("the user's own")
    first = BuildDir(str(root), "abc")
    build = Path(first.open())
    assert build == root / "abc" and list(build.iterdir()) == []
    _planted(build, outside)
    first.keep()
    (build / "torch_extensions" / "ext" / "late.txt").write_text("written after the load")
    first.close()
    assert not build.exists() and outside.read_text() == "the user's own" and outside.parent.exists()

    second = BuildDir(str(root), "abc")
    assert Path(second.open()) == build and second.restored
    found = sorted(str(p.relative_to(build)) for p in build.rglob("*"))
    # the load's cache alone: the .so with its time, the link as a link, no pipe, nothing after the load
    assert found == [
        "torch_extensions",
        "torch_extensions/ext",
        "torch_extensions/ext/ext.so",
        "torch_extensions/ext/link",
    ]
    assert (build / "torch_extensions" / "ext" / "link").is_symlink()
    second.close()
    assert outside.read_text() == "the user's own"


def test_an_evaluation_of_the_same_source_at_the_same_time_gets_a_directory_of_its_own(tmp_path: Path) -> None:
    root = tmp_path / "builds"
    holder, other = BuildDir(str(root), "abc"), BuildDir(str(root), "abc")
    mine = holder.open()
    theirs = other.open()
    assert theirs != mine and Path(theirs).parent == root and Path(theirs).name.startswith("abc-")
    Path(theirs, "torch_extensions").mkdir()
    other.keep()  # only the holder of the stable directory keeps a cache
    assert not (root / "abc.kept").exists()
    other.close()
    assert not Path(theirs).exists() and Path(mine).is_dir()
    holder.close()
    again = BuildDir(str(root), "abc")
    assert again.open() == mine  # let go: the stable directory is free again
    again.close()


def test_a_kept_cache_is_kept_again_only_where_a_load_changed_it(tmp_path: Path) -> None:
    """A cache found again and left as it was is not copied again; one a load rebuilt (a newer
    compiler, a changed build) replaces the kept one, or the rebuild would recur every time."""
    root = tmp_path / "builds"
    first = BuildDir(str(root), "abc")
    build = Path(first.open())
    (build / "torch_extensions").mkdir()
    (build / "torch_extensions" / "ext.so").write_text("built by the old compiler")
    first.keep()
    first.close()
    kept = root / "abc.kept"
    inode = kept.stat().st_ino

    same = BuildDir(str(root), "abc")
    same.open()
    same.keep()  # found again, unchanged: nothing copied
    same.close()
    assert kept.stat().st_ino == inode

    rebuilt = BuildDir(str(root), "abc")
    build = Path(rebuilt.open())
    (build / "torch_extensions" / "ext.so").write_text("built by the new compiler")
    rebuilt.keep()
    rebuilt.close()
    assert (kept / "torch_extensions" / "ext.so").read_text() == "built by the new compiler"
    assert sorted(p.name for p in root.iterdir()) == ["abc.kept", "abc.lock"]  # nothing half-made left

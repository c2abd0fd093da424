"""Where switched-out states wait: on disk, never in memory the budget does not count
(explore.scheduler.switched), read from a mounts table written here."""

from __future__ import annotations

from pathlib import Path

from explore.scheduler.switched import SWITCHED, SwitchFolder, memory_backed, on_disk


def _mounts(tmp_path: Path, *entries: tuple[str, str]) -> str:
    """A /proc/mounts of ``(mount point, file system)`` lines, and / on ext4."""
    lines = ["/dev/vda / ext4 rw 0 0"]
    lines += [f"fs {point.replace(' ', chr(92) + '040')} {kind} rw 0 0" for point, kind in entries]
    path = tmp_path / "mounts"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_the_deepest_mount_point_decides(tmp_path: Path) -> None:
    ram, disk = tmp_path / "ram", tmp_path / "ram" / "disk"
    mounts = _mounts(tmp_path, (str(ram), "tmpfs"), (str(disk), "ext4"))
    assert memory_backed(ram / "a" / "b", mounts)
    assert not memory_backed(disk / "c", mounts)
    assert not memory_backed(tmp_path / "ramx", mounts)  # a sibling whose name starts alike


def test_a_mount_point_with_a_space_is_read_as_the_kernel_escapes_it(tmp_path: Path) -> None:
    ram = tmp_path / "in memory"
    mounts = _mounts(tmp_path, (str(ram), "ramfs"))
    assert memory_backed(ram / "x", mounts)


def test_a_folder_on_disk_is_used_as_asked(tmp_path: Path) -> None:
    mounts = _mounts(tmp_path)
    folder = SwitchFolder(tmp_path / "run.artifacts", fallbacks=(), mounts=mounts)
    assert (folder.in_memory, folder.instead_of) == (False, None)
    assert folder.path.parent == (tmp_path / "run.artifacts").resolve() / SWITCHED


def test_states_asked_into_memory_wait_on_disk_instead(tmp_path: Path) -> None:
    ram, disk = tmp_path / "ram", tmp_path / "disk"
    disk.mkdir()
    mounts = _mounts(tmp_path, (str(ram), "tmpfs"))
    folder = SwitchFolder(ram / "run.artifacts", fallbacks=(str(ram / "x"), str(disk)),
                          mounts=mounts)
    assert not folder.in_memory
    assert folder.instead_of == (ram / "run.artifacts").resolve()
    assert folder.path.parent == disk / SWITCHED
    folder.path.mkdir(parents=True)
    (folder.path / "trial-3.state").write_bytes(b"x")
    folder.close()
    assert list(disk.iterdir()) == []  # its own folder and the shared parent it made


def test_a_fallback_that_cannot_be_made_is_passed_over(tmp_path: Path) -> None:
    ram, a_file = tmp_path / "ram", tmp_path / "a-file"
    a_file.write_text("")
    mounts = _mounts(tmp_path, (str(ram), "tmpfs"))
    assert on_disk(ram, (str(a_file / "states"),), mounts) == (ram, True)
    assert on_disk(ram, (str(a_file / "states"), str(tmp_path / "new")), mounts) == (
        tmp_path / "new", False)


def test_with_no_folder_on_disk_the_run_is_told_its_states_would_be_in_memory(
        tmp_path: Path) -> None:
    ram = tmp_path / "ram"
    mounts = _mounts(tmp_path, (str(ram), "tmpfs"))
    folder = SwitchFolder(ram / "a", fallbacks=(str(ram / "b"),), mounts=mounts)
    assert folder.in_memory and folder.instead_of is None
    assert folder.path.parent == (ram / "a").resolve() / SWITCHED

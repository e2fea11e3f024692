"""metricscale.files: the bounded reader every command reads its files with."""

from __future__ import annotations

from pathlib import Path

import pytest

from metricscale.files import FileError, read_bytes


def test_an_unreadable_file_keeps_the_system_s_own_words(tmp_path: Path) -> None:
    with pytest.raises(FileError) as caught:
        read_bytes(str(tmp_path / "missing"))
    assert caught.value.strerror == "No such file or directory"
    assert str(caught.value) == f"cannot read {tmp_path / 'missing'}: no such file or directory"


def test_a_file_over_the_limit_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * 11)
    assert read_bytes(str(path), limit=11) == b"x" * 11
    with pytest.raises(FileError) as caught:
        read_bytes(str(path), limit=10)
    assert caught.value.strerror is None and caught.value.reading

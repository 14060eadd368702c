"""Every store write is whole or absent; a failed one is one line naming the path and the cause."""

import errno

import pytest

from pipeline.store.atomic import StoreWriteError, write_atomically


def _failing(exc):
    def write(f):
        f.write(b"half")
        raise exc

    return write


@pytest.mark.parametrize(("code", "cause"), [(errno.ENOSPC, "no space left on device"), (errno.EROFS, "read-only file system"),
                                             (errno.EACCES, "permission denied")])
def test_a_failed_write_names_the_path_and_cause_and_keeps_the_old_file(tmp_path, code, cause):
    path = tmp_path / "result.json"
    path.write_text("old")
    with pytest.raises(StoreWriteError) as info:
        write_atomically(path, _failing(OSError(code, "raw")))
    message = str(info.value)
    assert message.startswith(f"cannot write {path}: {cause}") and "\n" not in message
    assert ("on the disk at" in message) == (code == errno.ENOSPC)  # a full disk is named
    assert path.read_text() == "old" and list(tmp_path.iterdir()) == [path]


def test_an_error_that_is_not_about_storage_goes_on_as_it_was(tmp_path):
    with pytest.raises(RuntimeError, match="not a disk problem"):
        write_atomically(tmp_path / "x.pt", _failing(RuntimeError("not a disk problem")))
    assert list(tmp_path.iterdir()) == []


def test_a_whole_write_replaces_the_file(tmp_path):
    path = tmp_path / "a" / "b.bin"
    assert write_atomically(path, lambda f: f.write(b"12345")) == 5 and path.read_bytes() == b"12345"

import pytest

from training.errors import StorageError
from training.storage import resolve


@pytest.fixture
def root(storage_root):
    return storage_root


def test_roundtrip_list_range_and_delete(root):
    f = root.child("a", "b.bin")
    f.write_bytes(b"0123456789")
    assert f.exists() and f.size() == 10
    assert f.read_bytes() == b"0123456789"
    assert f.read_range(3, 4) == b"3456"
    root.child("a", "c.txt").write_text("hi")
    assert root.child("a").list_names() == ["b.bin", "c.txt"]
    root.child("a").delete_tree()
    assert not f.exists()
    assert root.child("missing").list_names() == []


def test_file_url_and_plain_path_are_the_same_place(tmp_path):
    resolve(str(tmp_path / "x")).write_text("same")
    assert resolve(f"file://{tmp_path}/x").read_text() == "same"


def test_missing_object_is_a_storage_error_naming_the_url(root):
    with pytest.raises(StorageError, match="nope"):
        root.child("nope").read_bytes()


@pytest.mark.parametrize("url", ["", "gs://bucket/x", "s3:///no-bucket"])
def test_bad_urls_say_what_is_supported(url):
    with pytest.raises(StorageError):
        resolve(url)

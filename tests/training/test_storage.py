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
    with f.open_input() as opened:
        assert opened.read_at(4, 3) == b"3456"
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


def test_file_named_is_the_location_itself_or_its_child_in_a_directory(root):
    root.child("model", "config.json").write_text("{}")
    root.child("plain.json").write_text("{}")
    assert root.child("model").file_named("config.json").url == root.child("model", "config.json").url
    assert root.child("plain.json").file_named("config.json").url == root.child("plain.json").url

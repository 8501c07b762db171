import pytest

from spotray.errors import StorageError
from spotray.storage import resolve


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


def test_directories_are_listed_apart_and_a_missing_object_reads_as_none(root):
    root.child("attempt-1", "attempt.json").write_text("{}")
    root.child("run.json").write_text("{}")
    assert root.list_dir_names() == ["attempt-1"] and root.child("missing").list_dir_names() == []
    assert root.child("run.json").read_text_if_exists() == "{}"
    assert root.child("nope.json").read_text_if_exists() is None


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


def test_a_directory_moves_whole_and_leaves_nothing_behind(root):
    big = bytes(range(256)) * (40 * 1024 * 4)  # 40 MiB: on S3 over boto3's multipart threshold, copied in parts
    source = root.child("ckpt", "step_1")
    source.child("shard.bin").write_bytes(big)
    source.child("sub", "small.txt").write_text("small")
    source.child("MARKER").write_text("whole")
    dest = root.child("aside", "step_1.x")
    source.move_tree_to(dest, last="MARKER")
    assert dest.child("shard.bin").read_bytes() == big
    assert (dest.child("sub", "small.txt").read_text(), dest.child("MARKER").read_text()) == ("small", "whole")
    assert not source.exists() and root.child("ckpt").list_names() == []


def test_moving_a_directory_that_is_not_there_is_a_storage_error(root):
    with pytest.raises(StorageError, match="missing"):
        root.child("missing").move_tree_to(root.child("elsewhere"), last="MARKER")

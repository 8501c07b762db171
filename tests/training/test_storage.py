import os
import shutil
import threading

import pytest

from spotray.config import StorageSection
from spotray.drills.s3local import create_bucket, moto_server
from spotray.errors import StorageError, Unreachable
from spotray.ray_local import free_port
from spotray.storage import ENDPOINT_VARIABLES, StorageOptions, _StorageGuard, resolve


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


def test_a_directory_created_while_it_is_listed_lists_as_empty_never_as_an_error(tmp_path):
    """pyarrow lists a missing directory, then checks that it is missing: created in between, it raised NotFound
    (a drill's poll hit this as the run made its checkpoints' directory). Here another thread makes and removes the
    directory as fast as it can; about 3 in 100 listings fell in that window."""
    listed = resolve(str(tmp_path / "checkpoints"))
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            os.makedirs(listed.path, exist_ok=True)
            shutil.rmtree(listed.path, ignore_errors=True)

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        for _ in range(3000):
            assert listed.list_names() == []
    finally:
        stop.set()
        thread.join()


def test_file_url_and_plain_path_are_the_same_place(tmp_path):
    resolve(str(tmp_path / "x")).write_text("same")
    assert resolve(f"file://{tmp_path}/x").read_text() == "same"


def test_missing_object_is_a_storage_error_naming_the_url(root):
    with pytest.raises(StorageError, match="nope"):
        root.child("nope").read_bytes()


def test_a_store_that_does_not_answer_is_unreachable_naming_its_endpoint_not_the_url():
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(Unreachable, match=f"^cannot stat s3://b/run: the object store at {endpoint} does not answer "
                                          r"\(Failed to connect to 127.0.0.1.*\): correct --endpoint-url, or start "
                                          "the store$"):
        resolve("s3://b/run", StorageOptions(endpoint_url=endpoint)).is_dir()


@pytest.mark.parametrize("origin", ["storage.endpoint_url", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_a_store_that_does_not_answer_names_the_setting_its_endpoint_came_from(monkeypatch, origin):
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1" if origin == "AWS_ENDPOINT_URL_S3" else endpoint)
    if origin == "AWS_ENDPOINT_URL_S3":
        monkeypatch.setenv(origin, endpoint)  # the more specific variable wins
    options = StorageSection(endpoint_url=endpoint if origin == "storage.endpoint_url" else None).options()
    with pytest.raises(Unreachable, match=f"at {endpoint} does not answer .*: correct {origin}, or start the store$"):
        resolve("s3://b/run", options).is_dir()


def test_a_writable_place_passes_its_write_check_and_keeps_nothing_of_it(root):
    root.check_writable()
    assert root.list_names() == []


def test_the_write_check_of_a_local_folder_yet_to_be_made_leaves_no_folder_behind(tmp_path):
    resolve(str(tmp_path / "runs" / "r1")).check_writable()
    assert list(tmp_path.iterdir()) == []


def test_the_write_check_of_a_bucket_that_does_not_exist_names_the_place_not_its_probe(s3_server):
    with pytest.raises(StorageError, match=f"^cannot write s3://missing/runs/r1: the object store at {s3_server} has "
                                           "no bucket 'missing'"):
        resolve("s3://missing/runs/r1", StorageOptions(endpoint_url=s3_server)).check_writable()


def test_aws_s3_not_answering_asks_for_an_endpoint_or_the_network(monkeypatch):
    for name in ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(Unreachable, match=r"^cannot stat s3://b/x: the object store \(AWS S3\) does not answer \(no "
                                          r"route\): give the store's endpoint \(--endpoint-url, or AWS_ENDPOINT_URL\) "
                                          "if it is not AWS S3, or check this machine's network$"):
        with _StorageGuard("s3://b/x", "stat"):  # AWS itself cannot be reached from a test
            raise OSError("When getting information for key 'x': AWS Error NETWORK_CONNECTION. Details: no route")


def test_a_write_into_a_bucket_that_does_not_exist_names_the_bucket_and_the_fix(s3_server):
    with pytest.raises(StorageError, match=f"^cannot write s3://missing/runs/x: the object store at {s3_server} has no "
                                           "bucket 'missing': create it, or give a URL in a bucket that exists$"):
        resolve("s3://missing/runs/x", StorageOptions(endpoint_url=s3_server)).write_text("lost")


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


@pytest.fixture(scope="module")
def tls_endpoint(tmp_path_factory):
    """moto serving https with a certificate for 127.0.0.1 signed by a CA of its own: (endpoint, CA file)."""
    folder = tmp_path_factory.mktemp("tls")
    ca_file, cert, key = certificate_chain(folder)
    with moto_server(tls=(cert, key)) as endpoint:
        yield endpoint, ca_file


def test_an_https_endpoint_is_trusted_through_the_aws_ca_bundle_by_pyarrow_and_boto3(tls_endpoint, monkeypatch):
    endpoint, ca_file = tls_endpoint
    monkeypatch.setenv("AWS_CA_BUNDLE", ca_file)
    root = resolve(f"{create_bucket(endpoint)}/root", StorageOptions(endpoint_url=endpoint))
    root.child("a/x.bin").write_bytes(b"over tls")  # pyarrow
    assert root.child("a/x.bin").read_bytes() == b"over tls"
    root.child("a").move_tree_to(root.child("b"), last="x.bin")  # boto3's server-side copies
    assert root.child("b/x.bin").read_bytes() == b"over tls"


def test_an_untrusted_or_missing_ca_bundle_is_one_storage_error(tls_endpoint, monkeypatch, tmp_path):
    endpoint, ca_file = tls_endpoint
    monkeypatch.setenv("AWS_CA_BUNDLE", ca_file)
    x = resolve(f"{create_bucket(endpoint)}/x", StorageOptions(endpoint_url=endpoint))
    x.write_text("x")
    monkeypatch.delenv("AWS_CA_BUNDLE")
    with pytest.raises(StorageError, match=r"^cannot read s3://.*certificate"):
        resolve(x.url, StorageOptions(endpoint_url=endpoint)).read_bytes()
    monkeypatch.setenv("AWS_CA_BUNDLE", str(tmp_path / "nowhere.pem"))
    with pytest.raises(StorageError, match="^AWS_CA_BUNDLE=.*nowhere.pem: no such file; point it at"):
        resolve("s3://any-bucket/x", StorageOptions(endpoint_url=endpoint))


def certificate_chain(folder) -> tuple[str, str, str]:
    """A CA, and a server certificate for 127.0.0.1 it signed: paths of (CA, certificate, key), PEM."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def issue(subject: str, key, issuer: x509.Name, signer, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spotray test CA")])
    ca = issue("spotray test CA", ca_key, ca_name, ca_key, ca=True)
    server = issue("127.0.0.1", server_key, ca.subject, ca_key, ca=False)
    paths = [folder / "ca.pem", folder / "server.pem", folder / "server.key"]
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return str(paths[0]), str(paths[1]), str(paths[2])

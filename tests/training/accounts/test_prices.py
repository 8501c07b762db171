"""Prices: the AWS APIs through botocore's Stubber with their real response shapes (moto's spot prices are a
constant fake and it has no Pricing API), the prices file's checks, Karpenter's estimates from a real Prometheus,
and the precedence of the sources."""

from __future__ import annotations

import argparse
import copy
import http.server
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from datetime import UTC, datetime

import boto3
import pytest
from botocore.config import Config
from botocore.stub import ANY, Stubber

from spotray.accounts import aws_prices, prices
from spotray.config import CostSection
from spotray.errors import SpotrayError
from tests.monitoring.prom import binary
from tests.repo import REPO

FIXTURES = REPO / "tests" / "fixtures" / "prices"
NOW = datetime(2026, 11, 21, tzinfo=UTC).timestamp()
WEEK_AGO = datetime(2026, 11, 14, tzinfo=UTC)
LINUX_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def spot_page(name: str) -> dict:
    """A recorded DescribeSpotPriceHistory page as boto3 returns it: timestamps as datetimes."""
    page = fixture(name)
    for item in page["SpotPriceHistory"]:
        item["Timestamp"] = datetime.fromisoformat(item["Timestamp"])
    return page


def unix(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp())


def filters(**fields: str) -> list[dict]:
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


def products_request(instance_type: str, region: str = "us-east-1") -> dict:
    return {"ServiceCode": "AmazonEC2",
            "Filters": filters(instanceType=instance_type, regionCode=region, **LINUX_FILTERS)}


@contextmanager
def stubbed(service: str, region: str):
    client = boto3.client(service, region_name=region, aws_access_key_id="stub", aws_secret_access_key="stub")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def stub_two_types(pricing: Stubber, ec2: Stubber, start=WEEK_AGO) -> None:
    for instance_type in ("g5.xlarge", "g6.xlarge"):
        pricing.add_response("get_products", fixture(f"get_products_{instance_type}.json"),
                             products_request(instance_type))
    spot_request = {"InstanceTypes": ["g5.xlarge", "g6.xlarge"], "ProductDescriptions": ["Linux/UNIX"],
                    "StartTime": start}
    first = spot_page("describe_spot_price_history_page1.json")
    ec2.add_response("describe_spot_price_history", first, spot_request)
    ec2.add_response("describe_spot_price_history", spot_page("describe_spot_price_history_page2.json"),
                     {**spot_request, "NextToken": first["NextToken"]})


# --- AWS ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("region, endpoint", [
    ("us-east-1", "us-east-1"), ("us-west-2", "us-east-1"), ("ca-central-1", "us-east-1"),
    ("sa-east-1", "us-east-1"), ("eu-west-1", "eu-central-1"), ("me-south-1", "eu-central-1"),
    ("af-south-1", "eu-central-1"), ("il-central-1", "eu-central-1"), ("ap-northeast-1", "ap-south-1"),
    ("ap-southeast-2", "ap-south-1")])
def test_the_pricing_api_is_asked_at_its_nearest_endpoint(region, endpoint):
    assert aws_prices.pricing_endpoint(region) == endpoint
    ec2, pricing = aws_prices.clients(region)
    assert pricing.meta.region_name == endpoint and ec2.meta.region_name == region
    assert pricing.meta.endpoint_url == f"https://api.pricing.{endpoint}.amazonaws.com"


def test_clients_ignore_an_s3_endpoint_in_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")  # MinIO for storage, say
    ec2, pricing = aws_prices.clients("eu-west-1")
    assert ec2.meta.endpoint_url == "https://ec2.eu-west-1.amazonaws.com"
    assert pricing.meta.endpoint_url == "https://api.pricing.eu-central-1.amazonaws.com"


def test_recorded_responses_become_a_prices_file_across_pages():
    with stubbed("ec2", "us-east-1") as (ec2, ec2_stub), stubbed("pricing", "us-east-1") as (pricing, pricing_stub):
        stub_two_types(pricing_stub, ec2_stub)
        got = aws_prices.fetch_prices("us-east-1", ["g5.xlarge", "g6.xlarge"], ec2=ec2, pricing=pricing, now=NOW)
    assert got == {
        "region": "us-east-1", "fetched_at": int(NOW),
        "on_demand": {"g5.xlarge": 1.006, "g6.xlarge": 0.8048},
        "spot": {"g5.xlarge": {"us-east-1a": [[unix("2026-11-13T22:58:09+00:00"), 0.4471],  # from the 2nd page
                                              [unix("2026-11-17T13:40:55+00:00"), 0.439],
                                              [unix("2026-11-20T18:32:15+00:00"), 0.4512]],
                               "us-east-1b": [[unix("2026-11-19T06:15:27+00:00"), 0.4387],
                                              [unix("2026-11-20T21:07:41+00:00"), 0.4218]]},
                 "g6.xlarge": {"us-east-1c": [[unix("2026-11-16T02:11:30+00:00"), 0.3811],
                                              [unix("2026-11-20T11:49:02+00:00"), 0.3964]]}}}
    prices.check_prices_file(got)  # what `spotray prices` writes, a run reads back


def test_the_on_demand_price_is_the_hourly_on_demand_term_only():
    item = json.loads(fixture("get_products_g5.xlarge.json")["PriceList"][0])
    assert set(item["terms"]) == {"OnDemand", "Reserved"}  # a reserved term's hourly price is 0 and its fee upfront
    assert aws_prices.on_demand_price([json.dumps(item)], "g5.xlarge") == 1.006
    block = copy.deepcopy(item)  # capacity blocks are priced apart from on-demand
    block["product"]["attributes"]["marketoption"] = "CapacityBlock"
    next(iter(next(iter(block["terms"]["OnDemand"].values()))["priceDimensions"].values()))["pricePerUnit"] = {
        "USD": "0.5000000000"}
    assert aws_prices.on_demand_price([json.dumps(block), json.dumps(item)], "g5.xlarge") == 1.006
    assert aws_prices.on_demand_price([], "g5.xlarge") is None


def test_an_instance_type_aws_does_not_price_is_one_line():
    with stubbed("ec2", "us-east-1") as (ec2, _), stubbed("pricing", "us-east-1") as (pricing, stub):
        stub.add_response("get_products", fixture("get_products_empty.json"), products_request("foo.bar"))
        stub.add_response("get_products", fixture("get_products_g5.xlarge.json"),
                          {"ServiceCode": "AmazonEC2", "Filters": filters(regionCode="us-east-1"), "MaxResults": 1})
        with pytest.raises(SpotrayError) as error:
            aws_prices.fetch_prices("us-east-1", ["foo.bar"], ec2=ec2, pricing=pricing, now=NOW)
    assert str(error.value) == ("prices: no on-demand price for foo.bar in us-east-1: check the instance type's name "
                                "(e.g. g5.xlarge)")


def test_a_region_without_prices_is_one_line():
    with stubbed("ec2", "xx-nowhere-1") as (ec2, _), stubbed("pricing", "us-east-1") as (pricing, stub):
        stub.add_response("get_products", fixture("get_products_empty.json"), products_request("g5.xlarge",
                                                                                              "xx-nowhere-1"))
        stub.add_response("get_products", fixture("get_products_empty.json"),
                          {"ServiceCode": "AmazonEC2", "Filters": filters(regionCode="xx-nowhere-1"), "MaxResults": 1})
        with pytest.raises(SpotrayError) as error:
            aws_prices.fetch_prices("xx-nowhere-1", ["g5.xlarge"], ec2=ec2, pricing=pricing, now=NOW)
    assert str(error.value) == ("prices: the Pricing API has no EC2 prices for region xx-nowhere-1: check the "
                                "region's name (e.g. us-east-1)")


@pytest.mark.parametrize("region, types, days, message", [
    ("US East", ["g5.xlarge"], 7, "prices: 'US East' is not an AWS region's name: use a code like us-east-1"),
    ("us-east-1", ["g5 xlarge"], 7, "prices: 'g5 xlarge' is not an EC2 instance type: use a name like g5.xlarge "
                                    "or p5.48xlarge"),
    ("us-east-1", [], 7, "prices: no instance types: name them, e.g. --instance-types g5.xlarge,p5.48xlarge"),
    ("us-east-1", ["g5.xlarge"], 91, "prices: --days is 91: give whole days from 1 to 90 (EC2 keeps 90 days of "
                                     "spot prices)")])
def test_bad_names_are_refused_before_any_call(region, types, days, message):
    with stubbed("ec2", "us-east-1") as (ec2, _), stubbed("pricing", "us-east-1") as (pricing, _):
        with pytest.raises(SpotrayError) as error:  # a call would fail the Stubber: none is stubbed
            aws_prices.fetch_prices(region, types, ec2=ec2, pricing=pricing, days=days)
    assert str(error.value) == message


def test_access_denied_names_the_permission():
    with stubbed("ec2", "us-east-1") as (ec2, _), stubbed("pricing", "us-east-1") as (pricing, stub):
        stub.add_client_error("get_products", "AccessDeniedException", "User: arn:aws:iam::1:user/x is not "
                              "authorized to perform: pricing:GetProducts\nmore", 400)
        with pytest.raises(SpotrayError) as error:
            aws_prices.fetch_prices("us-east-1", ["g5.xlarge"], ec2=ec2, pricing=pricing, now=NOW)
    assert str(error.value) == (
        "prices: the Pricing API's GetProducts for g5.xlarge in us-east-1 failed (AccessDeniedException: User: "
        "arn:aws:iam::1:user/x is not authorized to perform: pricing:GetProducts): allow pricing:GetProducts to "
        "these credentials")


def test_expired_credentials_on_ec2_say_to_refresh_them():
    with stubbed("ec2", "us-east-1") as (ec2, ec2_stub), stubbed("pricing", "us-east-1") as (pricing, stub):
        stub.add_response("get_products", fixture("get_products_g5.xlarge.json"), products_request("g5.xlarge"))
        ec2_stub.add_client_error("describe_spot_price_history", "RequestExpired", "Request has expired.", 400)
        with pytest.raises(SpotrayError, match=r"^prices: EC2's DescribeSpotPriceHistory in us-east-1 failed "
                           r"\(RequestExpired: Request has expired.\): refresh the AWS credentials"):
            aws_prices.fetch_prices("us-east-1", ["g5.xlarge"], ec2=ec2, pricing=pricing, now=NOW)


def test_no_credentials_is_one_line_naming_the_fix(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # nothing leaves this machine
    pricing = boto3.Session().client("pricing", region_name="us-east-1")
    with pytest.raises(SpotrayError) as error:
        aws_prices.fetch_prices("us-east-1", ["g5.xlarge"], ec2=object(), pricing=pricing, now=NOW)
    assert str(error.value) == ("prices: no AWS credentials for the Pricing API's GetProducts for g5.xlarge in "
                                "us-east-1: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or run "
                                "`aws sso login`)")


def test_an_endpoint_that_cannot_be_reached_is_one_line():
    closed = free_port()  # nothing listens here: the connection is refused on loopback
    config = Config(retries={"max_attempts": 1}, connect_timeout=2)
    pricing = boto3.client("pricing", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{closed}",
                           aws_access_key_id="x", aws_secret_access_key="x", config=config)
    with pytest.raises(SpotrayError) as error:
        aws_prices.fetch_prices("us-east-1", ["g5.xlarge"], ec2=object(), pricing=pricing, now=NOW)
    message = str(error.value)
    assert "\n" not in message and message.startswith("prices: cannot reach AWS for the Pricing API's GetProducts")
    assert message.endswith(": check the network, a proxy, and the region's name")


# --- the effective price and the prices file ---------------------------------------------------------------------

def test_the_effective_price_is_the_newest_at_or_before_the_time():
    history = [[100, 0.40], [200, 0.45], [300, 0.42]]
    assert prices.effective_price(history, 99) is None  # before the first
    assert prices.effective_price(history, 100) == 0.40
    assert prices.effective_price(history, 250) == 0.45  # between
    assert prices.effective_price(history, 300) == 0.42
    assert prices.effective_price(history, 10_000) == 0.42  # after the last
    assert prices.effective_price([], 100) is None


def prices_file(**changes) -> dict:
    data = {"region": "us-east-1", "fetched_at": 1_700_000_000, "on_demand": {"g5.xlarge": 1.006},
            "spot": {"g5.xlarge": {"us-east-1a": [[100, 0.40], [200, 0.45], [300, 0.42]],
                                   "us-east-1b": [[150, 0.50]]}}}
    data.update(changes)
    return data


@pytest.mark.parametrize("data, message", [
    (prices_file(on_demand={"gpu-large": 1.0}),
     "on_demand.gpu-large is not an EC2 instance type: use a name like g5.xlarge or p5.48xlarge"),
    (prices_file(spot={"g5.xlarge": {"us-east-1a": [[100, 0.4], [200, 0.4], [300, 0.4], [400, -0.2]]}}),
     "spot.g5.xlarge.us-east-1a[3] is -0.2: give a positive price in USD per hour"),
    (prices_file(on_demand={"g5.xlarge": -1.006}), "on_demand.g5.xlarge is -1.006: give a positive price in USD "
                                                   "per hour"),
    (prices_file(on_demand={"g5.xlarge": "1.006"}), "on_demand.g5.xlarge is '1.006': give a positive price in USD "
                                                    "per hour"),
    (prices_file(on_demand={"g5.xlarge": 0}), "on_demand.g5.xlarge is 0: give a positive price in USD per hour"),
    (prices_file(spot={"p5": {"us-east-1a": [[1, 1.0]]}}),
     "spot.p5 is not an EC2 instance type: use a name like g5.xlarge or p5.48xlarge"),
    (prices_file(spot={"g5.xlarge": {"us-east-1a": [[200, 0.4], [100, 0.4]]}}),
     "spot.g5.xlarge.us-east-1a[1] is at 100, before the entry above it: sort the history by time"),
    (prices_file(spot={"g5.xlarge": {"us-east-1a": [0.4]}}),
     "spot.g5.xlarge.us-east-1a[0] is 0.4: give [unix time, USD per hour]"),
    (prices_file(ondemand={}), "ondemand is not a key of a prices file: use only region, fetched_at, on_demand, "
                               "spot"),
    ({"spot": {}}, "on_demand is missing: write the file with `spotray prices`"),
    ([1, 2], "the file is list, not an object: write it with `spotray prices`"),
])
def test_a_bad_prices_file_is_one_line_naming_the_key(tmp_path, data, message):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpotrayError) as error:
        prices.read_prices_file(str(path), None)
    assert str(error.value) == f"prices file {path}: {message}"


def test_a_prices_file_that_is_missing_or_not_json_is_one_line(tmp_path):
    missing = tmp_path / "none.json"
    with pytest.raises(SpotrayError) as error:
        prices.read_prices_file(str(missing), None)
    assert str(error.value) == (f"prices file {missing}: not found: write it with `spotray prices --region R "
                                f"--instance-types T --output {missing}`")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("g5.xlarge: 1.006\n")
    with pytest.raises(SpotrayError, match=rf"^prices file {garbage}: not JSON \(.*\): write it with `spotray "
                                           r"prices`$"):
        prices.read_prices_file(str(garbage), None)


# --- Karpenter's estimates ---------------------------------------------------------------------------------------

KARPENTER = {("g5.xlarge", "on-demand", "us-east-1a"): 1.006, ("g5.xlarge", "on-demand", "us-east-1b"): 1.006,
             ("g5.xlarge", "spot", "us-east-1a"): 0.4512, ("g5.xlarge", "spot", "us-east-1b"): 0.4218,
             ("g6.xlarge", "spot", "us-east-1c"): 0.3964}  # the sample's, less "reserved" (Karpenter exports 0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def http_server(path: str, body: bytes, content_type: str):
    """A server on loopback answering ``path`` with ``body``; yields its base URL and the paths asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            asked.append(self.path)
            found = self.path.split("?")[0] == path
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(body if found else b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def recorded_prometheus():
    """A loopback server answering /api/v1/query with what a real Prometheus answered for the query
    (recorded by test_karpenter_estimates_from_a_real_prometheus)."""
    body = (FIXTURES / "prometheus_query_karpenter.json").read_bytes()
    with http_server("/api/v1/query", body, "application/json") as (url, asked):
        yield url, asked


def test_the_recorded_query_answer_parses_to_the_estimates():
    body = fixture("prometheus_query_karpenter.json")
    assert {s["metric"]["capacity_type"] for s in body["data"]["result"]} == {"on-demand", "spot", "reserved"}
    assert prices.parse_karpenter_response(body) == KARPENTER
    assert prices.parse_karpenter_response({"status": "error", "error": "bad query"}) == {}


def test_karpenter_estimates_ask_prometheus_for_the_metric(recorded_prometheus):
    url, asked = recorded_prometheus
    assert prices.karpenter_estimates(url + "/") == KARPENTER
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(asked[0]).query)["query"]
    assert query == ["avg by (instance_type, capacity_type, zone) "
                     "(karpenter_cloudprovider_instance_type_offering_price_estimate)"]


def test_an_unreachable_prometheus_is_a_warning_once_and_no_estimates(monkeypatch, caplog):
    monkeypatch.setattr(prices, "_warned", set())
    url = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="spotray.accounts.prices"):
        assert prices.karpenter_estimates(url) == {}
        assert prices.karpenter_estimates(url) == {}
    assert len(caplog.records) == 1
    assert caplog.records[0].getMessage().startswith(f"no Karpenter price estimates: cannot query Prometheus at {url}")


def test_karpenter_estimates_from_a_real_prometheus(tmp_path):
    """A real Prometheus scrapes Karpenter's metrics (the sample, served as Karpenter's /metrics serves them) and
    answers the query. With SPOTRAY_RECORD=1 it rewrites the recorded answer the fast tests replay."""
    sample = (FIXTURES / "karpenter_metrics.txt").read_bytes()
    with http_server("/metrics", sample, "text/plain; version=0.0.4") as (karpenter, _):
        port = free_port()
        config = {"global": {"scrape_interval": "1s"},
                  "scrape_configs": [{"job_name": "karpenter",
                                      "static_configs": [{"targets": [karpenter.removeprefix("http://")]}]}]}
        (tmp_path / "prometheus.yaml").write_text(json.dumps(config))
        with (tmp_path / "prometheus.log").open("w") as log:
            proc = subprocess.Popen([binary("prometheus"), f"--config.file={tmp_path / 'prometheus.yaml'}",
                                     f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
            try:
                url = f"http://127.0.0.1:{port}"
                deadline = time.time() + 60
                estimates: dict[tuple[str, str, str | None], float] = {}
                while estimates != KARPENTER and time.time() < deadline and proc.poll() is None:
                    time.sleep(0.3)
                    estimates = prices.karpenter_estimates(url, timeout_s=2)
                assert estimates == KARPENTER, (tmp_path / "prometheus.log").read_text()[-2000:]
                query = urllib.parse.urlencode({"query": prices.KARPENTER_QUERY})
                answer = json.loads(urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5).read())
                if os.environ.get("SPOTRAY_RECORD"):
                    (FIXTURES / "prometheus_query_karpenter.json").write_text(json.dumps(answer, indent=1) + "\n")
                assert prices.parse_karpenter_response(answer) == KARPENTER
            finally:
                proc.terminate()
                proc.wait(timeout=30)


# --- the price book ----------------------------------------------------------------------------------------------

def write_prices_file(tmp_path) -> str:
    path = tmp_path / "prices.json"
    spot = {**prices_file()["spot"], "p5.48xlarge": {"us-east-1a": [[100, 30.0]]}}
    path.write_text(json.dumps(prices_file(on_demand={"g5.xlarge": 1.006, "p5.48xlarge": 55.04}, spot=spot)))
    return str(path)


def test_config_beats_karpenter_beats_the_prices_file(tmp_path, recorded_prometheus):
    url, _ = recorded_prometheus
    cost = CostSection(prices={"g5.xlarge": {"spot": 0.30}}, prometheus_url=url,
                       prices_file=write_prices_file(tmp_path))
    book = prices.price_book(cost)
    assert (book.source("g5.xlarge", "spot"), book.hourly("g5.xlarge", "spot", "us-east-1a")) == ("config", 0.30)
    assert (book.source("g5.xlarge", "on-demand"), book.hourly("g5.xlarge", "on-demand")) == ("karpenter", 1.006)
    assert (book.source("g6.xlarge", "spot"), book.hourly("g6.xlarge", "spot", "us-east-1c")) == ("karpenter", 0.3964)
    assert (book.source("p5.48xlarge", "on-demand"), book.hourly("p5.48xlarge", "on-demand")) == ("prices file",
                                                                                                  55.04)
    assert (book.source("p5.48xlarge", "spot"), book.hourly("p5.48xlarge", "spot", at=150)) == ("prices file", 30.0)


def test_unknown_stays_unknown_never_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(prices, "_warned", set())
    cost = CostSection(prices={"g5.xlarge": {"spot": 0.30}}, prometheus_url=f"http://127.0.0.1:{free_port()}",
                       prices_file=write_prices_file(tmp_path))
    book = prices.price_book(cost)  # Prometheus is down: the file still prices
    assert book.karpenter == {} and book.hourly("g5.xlarge", "on-demand") == 1.006
    for instance_type, capacity_type in [("g6.xlarge", "spot"), ("g6.xlarge", "on-demand"), ("g5.xlarge", "reserved"),
                                         (None, "spot"), ("g5.xlarge", None)]:
        assert book.hourly(instance_type, capacity_type) is None
        assert book.source(instance_type, capacity_type) is None
    assert book.hourly("p5.48xlarge", "spot", "us-east-1a", at=99) is None  # before the file's first price
    empty = prices.price_book(CostSection())
    assert empty.hourly("g5.xlarge", "spot") is None and empty.source("g5.xlarge", "spot") is None


def test_an_unknown_zone_is_priced_at_the_mean_over_zones(tmp_path):
    book = prices.PriceBook(file=prices.read_prices_file(write_prices_file(tmp_path)),
                            karpenter={("g6.xlarge", "spot"): {"us-east-1a": 0.30, "us-east-1b": 0.40}})
    # the file's spot: us-east-1a 0.40 from t=100, 0.45 from 200, 0.42 from 300; us-east-1b 0.50 from 150
    assert book.hourly("g5.xlarge", "spot", "us-east-1a", at=250) == 0.45
    assert book.hourly("g5.xlarge", "spot", "us-east-1b", at=250) == 0.50
    assert book.hourly("g5.xlarge", "spot", None, at=250) == pytest.approx((0.45 + 0.50) / 2)
    assert book.hourly("g5.xlarge", "spot", "us-east-1f", at=250) == pytest.approx((0.45 + 0.50) / 2)
    assert book.hourly("g5.xlarge", "spot", None, at=120) == 0.40  # only us-east-1a had a price then
    assert book.hourly("g5.xlarge", "spot") == pytest.approx((0.42 + 0.50) / 2)  # no time: the newest prices
    assert book.hourly("g6.xlarge", "spot", "us-east-1b") == 0.40
    assert book.hourly("g6.xlarge", "spot") == pytest.approx(0.35)


# --- `spotray prices` --------------------------------------------------------------------------------------------

def test_the_prices_command_writes_the_file_and_prints_a_line_per_type(tmp_path, monkeypatch, capsys):
    with stubbed("ec2", "us-east-1") as (ec2, ec2_stub), stubbed("pricing", "us-east-1") as (pricing, pricing_stub):
        stub_two_types(pricing_stub, ec2_stub, start=ANY)  # a week before now
        monkeypatch.setattr(aws_prices, "clients", lambda region: (ec2, pricing))
        parser = argparse.ArgumentParser()
        aws_prices.add_arguments(parser)
        output = tmp_path / "out" / "prices.json"
        aws_prices.run(parser.parse_args(["--region", "us-east-1", "--instance-types", "g5.xlarge, g6.xlarge",
                                      "--output", str(output)]))
    written = prices.read_prices_file(str(output))
    assert written["on_demand"] == {"g5.xlarge": 1.006, "g6.xlarge": 0.8048}
    assert capsys.readouterr().out.splitlines() == [
        "g5.xlarge in us-east-1: on-demand $1.0060/h, spot $0.4218-0.4512/h now over 2 zones (58% below on-demand "
        "at the cheapest)",
        "g6.xlarge in us-east-1: on-demand $0.8048/h, spot $0.3964-0.3964/h now over 1 zone (51% below on-demand at "
        "the cheapest)",
        f"wrote {output}: name it in cost.prices_file"]


def test_the_prices_command_that_fails_says_one_line_and_no_line_of_botocores(tmp_path):
    """boto3 logs where it found the credentials at INFO, which the command line's logging would print."""
    code = f"""import sys, boto3
from botocore.config import Config
from spotray import cli
from spotray.accounts import aws_prices
config = Config(retries={{"max_attempts": 1}}, connect_timeout=2)
aws_prices.clients = lambda region: tuple(boto3.client(service, region_name=region, config=config,
    endpoint_url="http://127.0.0.1:{free_port()}") for service in ("ec2", "pricing"))
sys.exit(cli.main(["prices", "--region", "us-east-1", "--instance-types", "g5.xlarge", "--output", "prices.json"]))
"""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("spotray: error: prices: cannot reach AWS for the Pricing API's GetProducts")


def test_the_prices_command_requires_region_types_and_output(capsys):
    parser = argparse.ArgumentParser()
    aws_prices.add_arguments(parser)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--region", "us-east-1"])
    assert exit_.value.code == 2
    assert "--instance-types, --output" in capsys.readouterr().err

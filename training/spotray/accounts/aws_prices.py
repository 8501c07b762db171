"""Prices from AWS, and the ``spotray prices`` command that writes them to a prices file: spot prices per zone
from EC2's ``DescribeSpotPriceHistory``, on-demand prices from the Pricing API. A run reads that file through
``spotray.accounts.prices``; boto3 is imported only when AWS is called.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from spotray.accounts.prices import REGION, _is_instance_type, _number, check_prices_file
from spotray.errors import SpotrayError

PRODUCT_DESCRIPTION = "Linux/UNIX"
MAX_DAYS = 90  # how far back DescribeSpotPriceHistory goes
_ON_DEMAND_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                      "capacitystatus": "Used"}


# --- fetching from AWS ---------------------------------------------------------------------------------------------

def pricing_endpoint(region: str) -> str:
    """The nearest of the Pricing API's regional endpoints (it has only these three)."""
    if region.startswith(("eu-", "me-", "af-", "il-")):
        return "eu-central-1"
    if region.startswith("ap-"):
        return "ap-south-1"
    return "us-east-1"


def clients(region: str) -> tuple[Any, Any]:
    """boto3 clients for EC2 in ``region`` and for the nearest Pricing API endpoint. They ignore
    ``AWS_ENDPOINT_URL`` (which may point at MinIO for storage): prices always come from AWS."""
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 5, "mode": "standard"},
                    ignore_configured_endpoint_urls=True)
    return (boto3.client("ec2", region_name=region, config=config),
            boto3.client("pricing", region_name=pricing_endpoint(region), config=config))


def fetch_prices(region: str, instance_types: list[str], *, ec2=None, pricing=None, now: float | None = None,
                 days: int = 7) -> dict:
    """The prices file's content: on-demand USD per hour per instance type, and each instance type's spot price
    history per zone over the last ``days`` (ascending ``[unix time, USD per hour]``; the first entry may predate
    the window: it is the price that was in effect at its start). Linux, shared tenancy."""
    instance_types = _check_request(region, instance_types, days)
    now = time.time() if now is None else now
    if ec2 is None or pricing is None:
        default_ec2, default_pricing = clients(region)
        ec2, pricing = ec2 or default_ec2, pricing or default_pricing
    on_demand = _on_demand(pricing, region, instance_types)
    spot = _spot(ec2, region, instance_types, now - days * 86400)
    return {"region": region, "fetched_at": int(now), "on_demand": on_demand, "spot": spot}


def _check_request(region: str, instance_types: list[str], days: int) -> list[str]:
    if not isinstance(region, str) or not REGION.fullmatch(region):
        raise SpotrayError(f"prices: {region!r} is not an AWS region's name: use a code like us-east-1")
    if not instance_types:
        raise SpotrayError("prices: no instance types: name them, e.g. --instance-types g5.xlarge,p5.48xlarge")
    for instance_type in instance_types:
        if not _is_instance_type(instance_type):
            raise SpotrayError(f"prices: {instance_type!r} is not an EC2 instance type: use a name like g5.xlarge "
                               "or p5.48xlarge")
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise SpotrayError(f"prices: --days is {days!r}: give whole days from 1 to {MAX_DAYS} (EC2 keeps {MAX_DAYS} "
                           "days of spot prices)")
    return list(dict.fromkeys(instance_types))


def _on_demand(pricing, region: str, instance_types: list[str]) -> dict[str, float]:
    prices, missing = {}, []
    for instance_type in instance_types:
        filters = {"instanceType": instance_type, "regionCode": region, **_ON_DEMAND_FILTERS}
        items = _products(pricing, filters, f"the Pricing API's GetProducts for {instance_type} in {region}")
        price = on_demand_price(items, instance_type)
        if price is None:
            missing.append(instance_type)
        else:
            prices[instance_type] = price
    if missing:
        if not _region_has_prices(pricing, region):
            raise SpotrayError(f"prices: the Pricing API has no EC2 prices for region {region}: check the region's "
                               "name (e.g. us-east-1)")
        raise SpotrayError(f"prices: no on-demand price for {', '.join(missing)} in {region}: check the instance "
                           "type's name (e.g. g5.xlarge)")
    return prices


def _filters(filters: dict[str, str]) -> list[dict]:
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()]


def _products(pricing, filters: dict[str, str], what: str) -> list[str]:
    items: list[str] = []
    with _aws_errors(what, "pricing:GetProducts"):
        for page in pricing.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=_filters(filters)):
            items.extend(page.get("PriceList", []))
    return items


def _region_has_prices(pricing, region: str) -> bool:
    """Whether the Pricing API prices anything of EC2's in ``region`` (asked only once a type went unpriced)."""
    with _aws_errors(f"the Pricing API's GetProducts for {region}", "pricing:GetProducts"):
        page = pricing.get_products(ServiceCode="AmazonEC2", Filters=_filters({"regionCode": region}), MaxResults=1)
    return bool(page.get("PriceList"))


def on_demand_price(price_list: list[str], instance_type: str) -> float | None:
    """The hourly on-demand USD price in a GetProducts ``PriceList`` (JSON strings, one per product), or None.
    Where several products match, the instance's own usage (``BoxUsage``) is preferred over any other, then the
    lowest price."""
    found: list[tuple[bool, float]] = []
    for item in price_list:
        try:
            product = json.loads(item) if isinstance(item, str) else item
            attributes = product.get("product", {}).get("attributes", {})
            terms = product.get("terms", {}).get("OnDemand", {})
        except (ValueError, AttributeError) as exc:
            raise SpotrayError(f"prices: the Pricing API returned a product that cannot be read ({exc}): retry, "
                               "or report it") from exc
        if attributes.get("instanceType", instance_type) != instance_type:
            continue
        if attributes.get("marketoption", "OnDemand") != "OnDemand":  # e.g. capacity blocks
            continue
        box = "BoxUsage" in attributes.get("usagetype", "")
        for term in terms.values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = _number(dimension.get("pricePerUnit", {}).get("USD"))
                if dimension.get("unit") == "Hrs" and usd is not None and usd > 0:
                    found.append((not box, usd))
    return min(found)[1] if found else None


def _spot(ec2, region: str, instance_types: list[str], start: float) -> dict[str, dict[str, list]]:
    items: list[dict] = []
    with _aws_errors(f"EC2's DescribeSpotPriceHistory in {region}", "ec2:DescribeSpotPriceHistory"):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=instance_types, ProductDescriptions=[PRODUCT_DESCRIPTION],
            StartTime=datetime.fromtimestamp(start, tz=UTC))
        for page in pages:
            items.extend(page.get("SpotPriceHistory", []))
    return spot_history(items, instance_types)


def spot_history(items: list[dict], instance_types: list[str]) -> dict[str, dict[str, list]]:
    """``SpotPriceHistory`` items (newest first, as EC2 returns them) as ``{type: {zone: [[unix, usd], ...]}}``,
    each zone's history ascending; Linux/UNIX only, each instance type asked for present (maybe empty)."""
    history: dict[str, dict[str, set]] = {t: {} for t in instance_types}
    for item in items:
        if item.get("ProductDescription") != PRODUCT_DESCRIPTION or item.get("InstanceType") not in history:
            continue
        price = _number(item.get("SpotPrice"))
        if price is None or price <= 0:
            continue
        when = item["Timestamp"]
        seconds = when.timestamp() if isinstance(when, datetime) else float(when)
        history[item["InstanceType"]].setdefault(item["AvailabilityZone"], set()).add((int(seconds), price))
    return {t: {zone: [list(entry) for entry in sorted(entries)] for zone, entries in sorted(zones.items())}
            for t, zones in history.items()}


@contextlib.contextmanager
def _aws_errors(what: str, permission: str) -> Iterator[None]:
    """botocore's errors as one line naming the fix."""
    from botocore import exceptions as aws

    try:
        yield
    except (aws.NoCredentialsError, aws.PartialCredentialsError) as exc:
        raise SpotrayError(f"prices: no AWS credentials for {what}: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY (or run `aws sso login`)") from exc
    except (aws.SSOError, aws.TokenRetrievalError) as exc:
        raise SpotrayError(f"prices: the AWS SSO session for {what} has expired ({exc}): run `aws sso login`") from exc
    except (aws.ConnectionError, aws.HTTPClientError) as exc:  # no route, timeouts, a proxy, TLS
        raise SpotrayError(f"prices: cannot reach AWS for {what} ({exc}): check the network, a proxy, and the "
                           "region's name") from exc
    except aws.ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "?"), (error.get("Message") or "").splitlines()[0:1]
        if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
            fix = f"allow {permission} to these credentials"
        elif code in ("AuthFailure", "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch",
                      "ExpiredToken", "ExpiredTokenException", "RequestExpired"):
            fix = "refresh the AWS credentials (e.g. `aws sso login`) or check AWS_PROFILE"
        elif code == "OptInRequired":
            fix = "enable the region in the AWS account, or use another"
        else:
            fix = "check the region and instance types, or retry"
        detail = f"{code}: {message[0]}" if message else code
        raise SpotrayError(f"prices: {what} failed ({detail}): {fix}") from exc
    except aws.BotoCoreError as exc:
        raise SpotrayError(f"prices: {what} failed ({exc}): check the AWS credentials and the region") from exc


# --- `spotray prices` ----------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--region", required=True, help="the AWS region, e.g. us-east-1")
    parser.add_argument("--instance-types", required=True, metavar="A,B,C",
                        help="EC2 instance types, comma-separated, e.g. g5.xlarge,p5.48xlarge")
    parser.add_argument("--output", required=True, metavar="URL",
                        help="where the prices file goes: a local path, file:// or s3:// (name it in cost.prices_file)")
    parser.add_argument("--days", type=int, default=7,
                        help=f"days of spot price history (default 7, at most {MAX_DAYS})")
    parser.add_argument("--endpoint-url", default=None,
                        help="S3 endpoint for --output (MinIO); default: AWS_ENDPOINT_URL")


def run(args: argparse.Namespace) -> None:
    from spotray.storage import StorageOptions, resolve

    instance_types = [t.strip() for t in args.instance_types.split(",") if t.strip()]
    prices = fetch_prices(args.region, instance_types, days=args.days)
    check_prices_file(prices, "prices")  # what a run will read back
    location = resolve(args.output, StorageOptions(endpoint_url=getattr(args, "endpoint_url", None)))
    location.write_text(json.dumps(prices, indent=1) + "\n")
    for line in summary_lines(prices):
        print(line)
    print(f"wrote {location.url}: name it in cost.prices_file")


def summary_lines(prices: dict) -> list[str]:
    """One line per instance type: its on-demand price and the range of its zones' latest spot prices."""
    lines = []
    for instance_type, on_demand in prices["on_demand"].items():
        latest = [history[-1][1] for history in prices["spot"].get(instance_type, {}).values() if history]
        if latest:
            low, high = min(latest), max(latest)
            spot = (f"spot ${low:.4f}-{high:.4f}/h now over {len(latest)} zone{'s' * (len(latest) > 1)} "
                    f"({1 - low / on_demand:.0%} below on-demand at the cheapest)")
        else:
            spot = "no spot price in the window (not offered as spot in this region?)"
        lines.append(f"{instance_type} in {prices['region']}: on-demand ${on_demand:.4f}/h, {spot}")
    return lines

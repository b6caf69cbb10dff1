"""The price catalog: the default data file, user catalogs and bad input."""

from pathlib import Path

import pytest

from elastune.planners.cost.pricing.catalog import parse_catalog, read_catalog
from elastune.planners.spec import SpecError

REQUIRED = {
    "p3.2xlarge": (1, "V100"),
    "p3.8xlarge": (4, "V100"),
    "p3.16xlarge": (8, "V100"),
    "g5.xlarge": (1, "A10G"),
    "g5.12xlarge": (4, "A10G"),
    "g5.48xlarge": (8, "A10G"),
    "p4d.24xlarge": (8, "A100"),
    "g4dn.xlarge": (1, "T4"),
    "g4dn.12xlarge": (4, "T4"),
}


def test_default_catalog_has_the_aws_gpu_types_with_dated_prices() -> None:
    catalog = read_catalog()
    assert catalog.region == "us-east-1"
    assert catalog.prices_read[:4].isdigit()  # a date, e.g. 2024-06
    for name, (gpus, model) in REQUIRED.items():
        node = catalog.get(name)
        assert (node.gpus, node.gpu) == (gpus, model)
        assert node.price_per_hour > 0
        assert node.billing.quantum_s == 1 and node.billing.min_charge_s == 60
        assert node.startup.mean_s > 0
    # Per GPU, a 4-GPU p3 costs the same as the 1-GPU one (list prices scale linearly).
    assert catalog.get("p3.8xlarge").price_per_gpu_hour == catalog.get("p3.2xlarge").price_per_hour


def test_defaults_are_merged_and_a_type_may_override_one_billing_key() -> None:
    catalog = parse_catalog(
        """
        defaults:
          billing: {quantum_s: 1, min_charge_s: 60}
          startup: {mean_s: 120, sd_s: 30}
        instance_types:
          a: {gpus: 4, gpu: V100, price_per_hour: 12.24}
          b: {gpus: 1, gpu: T4, price_per_hour: 0.5, billing: {quantum_s: 3600}}
        """
    )
    a, b = catalog.get("a"), catalog.get("b")
    assert (a.billing.quantum_s, a.billing.min_charge_s, a.startup.mean_s) == (1, 60, 120)
    assert (b.billing.quantum_s, b.billing.min_charge_s, b.startup.sd_s) == (3600, 60, 30)


def test_user_catalog_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("instance_types: {x: {gpus: 2, gpu: L4, price_per_hour: 1.5}}\n")
    assert read_catalog(path).get("x").price_per_gpu_hour == 0.75
    with pytest.raises(SpecError, match="cannot read catalog"):
        read_catalog(tmp_path / "missing.yaml")


def test_unknown_instance_type_names_the_field_and_lists_the_known_ones() -> None:
    catalog = read_catalog()
    with pytest.raises(SpecError, match=r"compute.instance_types\[1\]: unknown instance type 'p9'"):
        catalog.select(["p3.2xlarge", "p9"])
    with pytest.raises(SpecError, match=r"g5\.xlarge"):
        catalog.get("nope")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"instance_types": {}}, "catalog: instance_types: the catalog lists no instance types"),
        ({}, "catalog: instance_types: Field required"),
        ("instance_types: [", "catalog: malformed YAML"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_empty_or_malformed_catalog(data: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_catalog(data)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"gpus": 0}, "instance_types.x.gpus"),
        ({"price_per_hour": 0}, "instance_types.x.price_per_hour"),
        ({"price_per_hour": -3.06}, "instance_types.x.price_per_hour"),
        ({"startup": {"mean_s": -1}}, "instance_types.x.startup.mean_s"),
        ({"queueing": {"mean_s": 10, "sd_s": -1}}, "instance_types.x.queueing.sd_s"),
        ({"billing": {"quantum_s": 0}}, "instance_types.x.billing.quantum_s"),
        ({"billing": {"min_charge_s": -60}}, "instance_types.x.billing.min_charge_s"),
        (
            {"spot": {"discount": 1.5, "interruptions_per_hour": 0}},
            "instance_types.x.spot.discount",
        ),
        ({"colour": "red"}, "instance_types.x.colour"),
    ],
)
def test_bad_values_name_the_field(override: dict, field: str) -> None:
    spec = {"gpus": 4, "gpu": "V100", "price_per_hour": 12.24, **override}
    with pytest.raises(SpecError, match=f"catalog: {field}:"):
        parse_catalog({"instance_types": {"x": spec}})

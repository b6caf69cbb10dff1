"""The profile: timings per GPU count, from the job file, measurements or a scaling model."""

import math
from fractions import Fraction

import pytest

from elastune.planners.cost.pricing.catalog import read_catalog
from elastune.planners.spec import SpecError, parse_job
from elastune.planners.spec.model import ProfileSpec
from elastune.planners.staging import Profile, ProfileError, Timing

JOB = {
    "name": "d",
    "trainable": "m:f",
    "metric": "acc",
    "space": {"x": {"type": "float", "low": 0, "high": 1}},
}


def job_profile(section: dict) -> Profile:
    spec = parse_job({**JOB, "profile": section})
    assert spec.profile is not None
    return Profile.from_spec(spec.profile)


def test_explicit_table_with_spread() -> None:
    profile = job_profile(
        {"seconds_per_unit": {1: 720, 2: 400, 0.5: 1200}, "sd_per_unit": {1: 36}, "unit_cv": 0.1}
    )
    assert profile.gpu_counts == (0.5, 1.0, 2.0)
    assert profile.timing(1) == Timing(720, 36)  # absolute sd wins
    assert profile.timing(2) == Timing(400, 40)  # relative sd for the others
    assert profile.speedup[2] == pytest.approx(1.8)


def test_speedup_table_and_amdahl_models() -> None:
    table = job_profile({"seconds_per_unit": {1: 720}, "speedup": {2: 1.8, 4: 3.2}})
    assert {g: t.mean for g, t in table.timings.items()} == {1: 720, 2: 400, 4: 225}
    amdahl = job_profile({"seconds_per_unit": {1: 100}, "serial_fraction": 0.1, "gpus": [1, 2, 4]})
    # S(g) = 1 / (f + (1 - f) / g): S(2) = 1/0.55, S(4) = 1/0.325.
    assert amdahl.timing(2).mean == pytest.approx(55)
    assert amdahl.timing(4).mean == pytest.approx(32.5)
    linear = Profile.from_scaling(100, gpus=(1, 2))
    assert linear.timing(2).mean == 50


def test_measurements_round_trip_through_the_job_file() -> None:
    measured = Profile.from_measurements(
        {1: [700.0, 740.0, 720.0], 2: [410.0, 390.0]}, segment_cv=0.05, overhead_s=12, gpu="V100"
    )
    assert measured.timing(1) == Timing(720.0, 20.0)
    assert measured.timing(2).sd == pytest.approx(math.sqrt(200))
    assert job_profile(measured.to_dict()) == measured
    with pytest.raises(ProfileError, match=r"profile.seconds_per_unit.4: no measurements"):
        Profile.from_measurements({4: []})


def test_segment_time_adds_clt_spread_and_straggler_spread() -> None:
    profile = Profile({1.0: Timing(10.0, 2.0)}, segment_cv=0.1, overhead_s=5)
    mean, sd = profile.segment(1, 9)
    assert mean == 5 + 90
    # Unit noise grows as sqrt(9) * 2 = 6, the straggler part as 0.1 * 90 = 9.
    assert sd == pytest.approx(math.hypot(6, 9))


def test_missing_gpu_count_names_the_field_and_the_count() -> None:
    profile = Profile.from_scaling(720, speedup={2: 1.8})
    with pytest.raises(ProfileError, match=r"profile.seconds_per_unit: no timing for 4 GPUs"):
        profile.timing(4)


def test_gpu_models_need_a_relative_speed() -> None:
    catalog = read_catalog()
    profile = Profile({1.0: 100.0}, gpu="V100", gpu_speed={"A100": 2.0})
    assert profile.timing(1, catalog.get("p3.2xlarge")).mean == 100
    assert profile.timing(1, catalog.get("p4d.24xlarge")).mean == 50
    assert not profile.covers(catalog.get("g5.xlarge"))
    with pytest.raises(ProfileError, match=r"profile.speed.A10G: no timing for A10G GPUs"):
        profile.timing(1, catalog.get("g5.xlarge"))
    assert profile.counts_for(catalog.get("p3.2xlarge")) == (1.0,)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"seconds_per_unit": {1: -720}}, r"profile.seconds_per_unit.1: Input should be greater"),
        ({"seconds_per_unit": {1: 0}}, r"profile.seconds_per_unit.1: Input should be greater"),
        ({"seconds_per_unit": {-2: 5}}, r"profile.seconds_per_unit.-2.\[key\]: Input should be"),
        ({"seconds_per_unit": {}}, r"profile.seconds_per_unit: Dictionary should have at least"),
        ({"seconds_per_unit": {1: 5}, "segment_cv": -0.1}, r"profile.segment_cv: Input should"),
        ({"seconds_per_unit": {1: 5}, "overhead_s": -1}, r"profile.overhead_s: Input should"),
        ({"seconds_per_unit": {1: 5}, "sd_per_unit": {2: 1}}, r"profile: sd_per_unit: 2 GPUs"),
        (
            {"seconds_per_unit": {1: 5}, "speedup": {2: 1.8}, "serial_fraction": 0.1},
            "profile: give either speedup or serial_fraction",
        ),
        ({"seconds_per_unit": {1: 5, 2: 3}, "speedup": {4: 3}}, "with a scaling model give"),
        ({"seconds_per_unit": {1: 5}, "serial_fraction": 1.0}, "profile.serial_fraction"),
        ({"seconds_per_unit": {1: 5}, "speed": {"A100": 2}}, "name the GPU model"),
        ({"seconds_per_unit": {1: 5}, "speedup": {2: 0}}, r"profile.speedup.2: Input should be"),
        ({"seconds": {1: 5}}, "profile.seconds_per_unit: Field required"),
    ],
)
def test_bad_profile_sections_name_the_field(section: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_job({**JOB, "profile": section})


def test_the_calibrations_covariance_round_trips_and_is_checked() -> None:
    cov = [[0.04, 0.01, 0.0, 0.0], [0.01, 0.01, 0.0, 0.0], [0.0] * 4, [0.0, 0.0, 0.0, 0.0025]]
    profile = Profile({1.0: 2.0}, calibration_cov=cov, calibration_dof=6, segment_cv_dof=13)
    assert Profile.from_spec(ProfileSpec.model_validate(profile.to_dict())) == profile
    with pytest.raises(ProfileError, match=r"profile.calibration_dof: must be > 0"):
        Profile({1.0: 2.0}, calibration_dof=0)
    with pytest.raises(ProfileError, match=r"profile.segment_cv_dof: must be > 0"):
        Profile({1.0: 2.0}, segment_cv_dof=-1)
    with pytest.raises(ProfileError, match=r"profile.calibration_cov: must be symmetric"):
        Profile({1.0: 2.0}, calibration_cov=[[0.0, 1.0, 0.0, 0.0], *cov[1:]])
    with pytest.raises(ProfileError, match=r"profile.calibration_cov: must be 4 x 4"):
        Profile({1.0: 2.0}, calibration_cov=[[1.0]])


def test_profile_constructor_checks_values() -> None:
    with pytest.raises(ProfileError, match=r"profile.seconds_per_unit.2: seconds must be > 0"):
        Profile({1.0: 10.0, 2.0: -1.0})
    with pytest.raises(ProfileError, match="has no GPU counts"):
        Profile({})
    with pytest.raises(ProfileError, match=r"profile\.segment_cv"):
        Profile({1.0: 1.0}, segment_cv=-1)
    assert ProfileSpec.model_validate(Profile({1.0: 1.0}).to_dict()).seconds_per_unit == {1.0: 1.0}


def test_the_packer_reads_speeds_relative_to_one_gpu() -> None:
    # The job file's profile, converted once, is what both the cost planner and the packer read.
    profile = job_profile(
        {"seconds_per_unit": {0.5: 900, 1: 600, 2: 375, 3: 300}, "overhead_s": 20}
    )
    assert profile.speedup == pytest.approx({1: 1.0, 2: 1.6, 3: 2.0})
    assert profile.sharing == pytest.approx({2: 600 / 900})
    assert profile.speed(Fraction(1, 2)) == pytest.approx(600 / 900)
    assert profile.speed(Fraction(3)) == pytest.approx(2.0)
    # The same speeds given directly: a unit takes one second on one GPU.
    speeds = Profile.from_speeds({2: 1.6, 3: 2.0}, {2: 600 / 900}, overhead_s=20)
    assert speeds.timing(2).mean == pytest.approx(1 / 1.6)
    assert speeds.speedup == pytest.approx(profile.speedup)
    assert speeds.sharing == pytest.approx(profile.sharing)
    assert Profile.linear(8).speedup == {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}


def test_a_share_the_packer_computes_finds_its_timing_as_written() -> None:
    # sharing reads 0.3333333333 as a third of a GPU, so the packer runs segments at 1/3:
    # timing them (the re-planner's estimate does, per segment) must find that key.
    profile = Profile({1: 1.0, 0.3333333333: 2.0})
    assert profile.sharing == pytest.approx({3: 0.5})
    assert profile.timing(1 / 3).mean == 2.0
    with pytest.raises(ProfileError, match=r"no timing for 0\.25 GPUs"):
        profile.timing(0.25)


def test_a_profile_without_one_gpu_cannot_be_packed() -> None:
    profile = Profile({2: 400.0, 4: 225.0})
    assert not profile.packable
    assert profile.timing(2).mean == 400  # the cost planner can still use it
    with pytest.raises(ProfileError, match=r"profile.seconds_per_unit: packing needs the time"):
        _ = profile.speedup
    with pytest.raises(ValueError, match=r"speedup width must be an integer >= 1, got 1.5"):
        Profile.from_speeds({1.5: 1.4})

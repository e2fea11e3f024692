"""`metricscale autoscaler --shadow`'s flags: its own Lease unless told otherwise (never the
controller's), a label selector checked before anything starts, and no mixing with the mode
that acts on HPAs."""

from __future__ import annotations

import argparse

import pytest

from autoscaler.server import add_arguments, options_from_arguments
from metricscale.core.errors import ConfigError


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(flags))


def test_shadow_mode_takes_a_lease_of_its_own() -> None:
    options = options_from_arguments(parse("--shadow"))
    assert options.shadow and options.shadow_selector == ""
    assert options.leader_election.resource_name == "metricscale-shadow"
    assert options_from_arguments(parse()).leader_election.resource_name == \
        "metricscale-autoscaler"


def test_shadow_mode_never_takes_the_controllers_lease() -> None:
    options = options_from_arguments(parse("--shadow",
                                           "--leader-elect-resource-name=metricscale-autoscaler"))
    assert options.leader_election.resource_name == "metricscale-shadow"
    named = options_from_arguments(parse("--shadow", "--leader-elect-resource-name=canary"))
    assert named.leader_election.resource_name == "canary"


def test_a_shadow_selector_is_kept_as_given() -> None:
    options = options_from_arguments(parse("--shadow", "--shadow-selector", "team=shop,tier!=db"))
    assert options.shadow_selector == "team=shop,tier!=db"


@pytest.mark.parametrize(("flags", "words"), [
    (("--shadow", "--enable-native-hpa"), "--shadow and --enable-native-hpa exclude each other"),
    (("--shadow-selector=team=shop",), "--shadow-selector: only with --shadow"),
    (("--shadow", "--shadow-selector=team in (shop"), "--shadow-selector 'team in (shop'"),
])
def test_flags_that_cannot_be_used_together_are_refused_naming_them(
        flags: tuple[str, ...], words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        options_from_arguments(parse(*flags))
    assert words in str(refused.value)

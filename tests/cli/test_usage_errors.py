"""A usage mistake, for every subcommand, is one line naming the flag and the problem, then a
one-line hint where the options are; not argparse's whole usage (22 to 53 lines) first."""

from __future__ import annotations

import pytest

from cli.main import SUBCOMMANDS, main

# Flags a subcommand requires, so that the mistake reported is the one the case makes.
REQUIRED = {"replay": ["--prometheus-url", "http://prometheus:9090"], "migrate": ["hpa"]}


def _usage_error(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(arguments)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def _hint(prog: str) -> str:
    return f"usage: {prog} [options]; see {prog} --help\n"


@pytest.mark.parametrize("name", [subcommand.name for subcommand in SUBCOMMANDS])
def test_an_unknown_flag_is_one_line_then_the_hint(name: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error([name, *REQUIRED.get(name, []), "--no-such-flag"], capsys)
    prog = f"metricscale {name}"
    assert err == f"{prog}: error: unrecognized arguments: --no-such-flag\n{_hint(prog)}"


# A flag of each subcommand that takes a value.
VALUED = {"demo": "--workdir", "adapter": "--config", "certs": "--dir", "explain": "--output",
          "autoscaler": "--kubeconfig", "replay": "--step", "autoscale": "--max",
          "doctor": "--output", "migrate": "--timeout"}


def test_every_subcommand_has_a_valued_flag_case() -> None:
    assert set(VALUED) == {subcommand.name for subcommand in SUBCOMMANDS}


@pytest.mark.parametrize(("name", "flag"), sorted(VALUED.items()))
def test_a_flag_without_its_value_is_one_line_then_the_hint(
        name: str, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error([name, *REQUIRED.get(name, []), flag], capsys)
    prog = f"metricscale {name}"
    first, hint = err.splitlines()
    assert first.startswith(f"{prog}: error: argument ") and first.endswith(
        f"{flag}: expected one argument")
    assert f"{hint}\n" == _hint(prog)


def test_a_missing_required_flag_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["replay", "autoscaler.yaml"], capsys)
    assert err == ("metricscale replay: error: the following arguments are required: "
                   f"--prometheus-url\n{_hint('metricscale replay')}")


def test_a_bad_value_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["autoscale", "deployment/web", "--max", "ten"], capsys)
    assert err == ("metricscale autoscale: error: argument --max: invalid int value: 'ten'\n"
                   f"{_hint('metricscale autoscale')}")


def test_an_unknown_subcommand_is_one_line_then_the_hint(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["nope"], capsys)
    first, hint = err.splitlines()
    assert first.startswith("metricscale: error: argument SUBCOMMAND: invalid choice: 'nope'")
    assert hint == "usage: metricscale SUBCOMMAND [options]; see metricscale --help"

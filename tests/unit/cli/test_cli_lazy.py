"""The ``kvstored`` group loads optional commands lazily and skips missing ones."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

from kvstored.cli.main import LazyGroup


def test_lazy_commands_load_on_demand_and_missing_ones_are_skipped() -> None:
    @click.group(cls=LazyGroup, lazy_commands={
        "version": "platform:python_version",  # not a click command: ignored
        "missing": "kvstored.no_such_module:cmd",
    })
    def group() -> None:
        """One local and two lazy commands."""

    @group.command()
    def local() -> None:
        click.echo("local ran")

    runner = CliRunner()
    assert runner.invoke(group, ["local"]).output == "local ran\n"
    listed = runner.invoke(group, ["--help"]).output
    assert "local" in listed and "missing" not in listed
    assert runner.invoke(group, ["missing"]).exit_code == 2  # "No such command"


def test_serve_help_does_not_import_optional_commands() -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from kvstored.cli.main import main\n"
        "r = CliRunner().invoke(main, ['serve', '--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert '--dram-size' in r.output and '--ssd-dir' in r.output\n"
        "bad = [m for m in ('torch', 'kvstored.demo.cli', 'kvstored.scheduler.cli') if m in sys.modules]\n"
        "sys.exit(f'imported {bad}' if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout

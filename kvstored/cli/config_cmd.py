"""``kvstored config show`` and ``kvstored config check``: the effective configuration and
where each value came from, and a validation of one file.

``show`` prints TOML that loads back to the same configuration (a value that is unset, None,
is listed as a comment under its section's header: TOML has no null); each key's line ends
in a comment naming its source::

    [node]
    # socket_mode: unset  # default
    dram_size_bytes = 8589934592  # config file /etc/kvstored/node.toml (8.0 GiB)
    ssd_size_bytes = 17179869184  # env var KVSTORED_NODE__SSD_SIZE_BYTES (16.0 GiB)
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import click
import tomli_w

from kvstored.errors import ConfigInvalid


def _note(field: str, ev: Any) -> str:
    from kvstored.units import format_size

    if field.endswith("_bytes") and isinstance(ev.value, int) and not isinstance(ev.value, bool):
        return f"{ev.source} ({format_size(ev.value)})"
    return str(ev.source)


_MODE_LINE = re.compile(r"^(\w+_mode) = (\d+)$")
_KEY_LINE = re.compile(r"^([A-Za-z0-9_-]+) = ")
_HEADER = re.compile(r"^\[+([^\]]+)\]+$")


def _without_none(value: Any) -> Any:
    """``value`` with the unset (None) entries of nested tables left out: TOML has no null,
    and an absent key loads back as the same default."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


def render_toml(effective: dict[str, dict[str, Any]]) -> str:
    """The effective config as TOML with a source comment per key (see the module doc).

    tomli_w writes the document (nested tables and multi-line arrays stay valid TOML); each
    key's first line then gets its comment, and unset keys are listed as comments under
    their section's header.
    """
    doc = {sec: {k: _without_none(ev.value) for k, ev in fields.items() if ev.value is not None}
           for sec, fields in effective.items()}
    out: list[str] = []
    section: str | None = None  # the section whose own keys the next lines are
    for line in tomli_w.dumps(doc).splitlines():
        header = _HEADER.match(line)
        if header:
            path = header.group(1).split(".")
            top = path[0] if path[0] in effective else None
            section = top if len(path) == 1 else None  # keys of a sub-table are not fields
            if section is not None:  # a section: its unset keys first
                out.append(line)
                out += [f"# {k}: unset  # {_note(k, ev)}"
                        for k, ev in effective[section].items() if ev.value is None]
                continue
            if len(path) == 2 and top is not None and path[1] in effective[top]:
                line += f"  # {_note(path[1], effective[top][path[1]])}"
            out.append(line)
            continue
        key = _KEY_LINE.match(line)
        if key and section is not None and key.group(1) in effective[section]:
            field = key.group(1)
            mode = _MODE_LINE.match(line)
            if mode:  # file modes read best in octal
                line = f"{field} = 0o{int(mode.group(2)):o}"
            line += f"  # {_note(field, effective[section][field])}"
        out.append(line)
    return "\n".join(out) + "\n"


def _env_file(path: str | None) -> dict[str, str]:
    """A systemd EnvironmentFile (``KEY=VALUE`` lines, ``#`` comments) read by python-dotenv."""
    import os

    from dotenv import dotenv_values

    if path is None:
        return dict(os.environ)
    values = dotenv_values(path, interpolate=False)
    return {k: v for k, v in values.items() if v is not None}


@click.group("config")
def config_group() -> None:
    """Show the effective configuration, or check a config file."""


@config_group.command("show")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="TOML config file layered over the defaults.")
@click.option("--env-file", type=click.Path(exists=True, dir_okay=False),
              help="Read KVSTORED_* variables from this file (e.g. /etc/kvstored/node.env, the "
                   "unit's EnvironmentFile) instead of this shell's environment.")
@click.option("--output", type=click.Choice(["toml", "json"]), default="toml", show_default=True)
def show(config_path: str | None, env_file: str | None, output: str) -> None:
    """Print the effective configuration (defaults < --config < env) and each value's source.

    TOML (loadable again: ``kvstored config show > x.toml``) or, with ``--output json``,
    ``{section: {key: {"value": ..., "source": ...}}}``. Exit 2 with the error when the
    configuration is invalid.
    """
    from kvstored.config import load_effective_config

    try:
        _, effective = load_effective_config(config_path, environ=_env_file(env_file))
    except ConfigInvalid as exc:
        click.echo(f"kvstored: {exc}", err=True)
        sys.exit(2)
    if output == "json":
        doc = {sec: {k: {"value": ev.value, "source": ev.source} for k, ev in fields.items()}
               for sec, fields in effective.items()}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(render_toml(effective), nl=False)


@config_group.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--env-file", type=click.Path(exists=True, dir_okay=False),
              help="Also layer the KVSTORED_* variables of this file (the unit's EnvironmentFile).")
@click.option("--host", "host_checks", is_flag=True,
              help="Also run the checks against this host (the SSD cap fits its disk, the arena "
                   "group exists), as the node daemon does at start.")
def check(file: str, env_file: str | None, host_checks: bool) -> None:
    """Validate FILE: exit 0 and print ``FILE: ok``, or exit 2 with the error naming the key.

    The file is checked alone (this shell's KVSTORED_* variables are ignored), plus the
    variables of --env-file when given.
    """
    from kvstored.config import check_node_host, load_config

    try:
        cfg = load_config(file, environ=_env_file(env_file) if env_file else {})
        if host_checks:
            check_node_host(cfg.node)
    except ConfigInvalid as exc:
        click.echo(f"kvstored: {exc}", err=True)
        sys.exit(2)
    click.echo(f"{file}: ok")

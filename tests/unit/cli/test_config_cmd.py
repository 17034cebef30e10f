"""``kvstored config show`` / ``kvstored config check`` (in-process, click's CliRunner)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvstored.cli.main import main
from kvstored.config import load_config, load_effective_config


@pytest.fixture
def node_toml(tmp_path: Path) -> Path:
    f = tmp_path / "node.toml"
    f.write_text('[node]\nnode_id = "n1"\ndram_size_bytes = "2GiB"\narena_mode = 0o660\n'
                 '[cluster]\nmaster_address = "10.0.0.1:7080"\n[tenants.team-a]\ndram_quota_bytes = "1GiB"\n')
    return f


def test_show_names_each_source_and_its_toml_loads_back_to_the_same_config(
        node_toml: Path, tmp_path: Path) -> None:
    env = {"KVSTORED_NODE__SSD_SIZE_BYTES": "16GiB", "KVSTORED_MASTER__NODE_LEASE_S": "7"}
    r = CliRunner().invoke(main, ["config", "show", "--config", str(node_toml)], env=env)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert f"dram_size_bytes = {2 << 30}  # config file {node_toml} (2.0 GiB)" in lines
    assert f"ssd_size_bytes = {16 << 30}  # env var KVSTORED_NODE__SSD_SIZE_BYTES (16.0 GiB)" in lines
    assert "node_lease_s = 7.0  # env var KVSTORED_MASTER__NODE_LEASE_S" in lines
    assert f"arena_mode = 0o660  # config file {node_toml}" in lines
    assert "pin_lease_s = 30.0  # default" in lines and "# socket_mode: unset  # default" in lines
    assert f"[tenants.team-a]  # config file {node_toml}" in lines  # a table of tables
    shown = tmp_path / "shown.toml"
    shown.write_text(r.output)
    tomllib.loads(r.output)
    expected = load_config(node_toml, environ=env)
    assert load_config(shown, environ={}).model_dump() == expected.model_dump()


def test_show_json_and_flags_beat_env(node_toml: Path) -> None:
    env = {"KVSTORED_NODE__DRAM_SIZE_BYTES": "3GiB"}
    r = CliRunner().invoke(main, ["config", "show", "--config", str(node_toml), "--output", "json"], env=env)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["node"]["dram_size_bytes"] == {"value": 3 << 30, "source": "env var KVSTORED_NODE__DRAM_SIZE_BYTES"}
    assert doc["cluster"]["master_address"]["source"] == f"config file {node_toml}"
    assert set(doc) >= {"node", "master", "cluster", "tenants"}
    assert doc["tenants"]["team-a"]["value"]["dram_quota_bytes"] == 1 << 30
    _, eff = load_effective_config(node_toml, environ=env, overrides={"node": {"dram_size_bytes": "4GiB"}},
                                   override_sources={"node.dram_size_bytes": "--dram-size"})
    assert (eff["node"]["dram_size_bytes"].value, eff["node"]["dram_size_bytes"].source) == (
        4 << 30, "flag --dram-size")


def test_show_of_an_invalid_environment_exits_2_naming_the_variable() -> None:
    r = CliRunner().invoke(main, ["config", "show"], env={"KVSTORED_NODE__PIN_LEASE_S": "-1"})
    assert r.exit_code == 2
    assert "node.pin_lease_s (env var KVSTORED_NODE__PIN_LEASE_S)" in r.output


def test_check_ok_and_bad_files(node_toml: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["config", "check", str(node_toml)], env={"KVSTORED_NODE__DRAM_SIZE_BYTES": "x"})
    assert (r.exit_code, r.output) == (0, f"{node_toml}: ok\n")  # the shell's env is not the file's
    bad = tmp_path / "bad.toml"
    bad.write_text('[node]\ndram_size_bytes = "12 parsecs"\n')
    r = runner.invoke(main, ["config", "check", str(bad)])
    assert r.exit_code == 2
    assert f"node.dram_size_bytes (config file {bad}): cannot parse size '12 parsecs'" in r.output
    r = runner.invoke(main, ["config", "check", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "cannot read config file" in r.output
    env_file = tmp_path / "node.env"
    env_file.write_text("# the unit's EnvironmentFile\nKVSTORED_NODE__MIN_KEY_BYTES=65\n")
    r = runner.invoke(main, ["config", "check", str(node_toml), "--env-file", str(env_file)])
    assert r.exit_code == 2 and "node.min_key_bytes (env var KVSTORED_NODE__MIN_KEY_BYTES) (65)" in r.output


def test_check_host_runs_the_daemons_host_checks(tmp_path: Path) -> None:
    f = tmp_path / "g.toml"
    f.write_text('[node]\narena_group = "kvstored-no-such-group"\n')
    assert CliRunner().invoke(main, ["config", "check", str(f)]).exit_code == 0
    r = CliRunner().invoke(main, ["config", "check", str(f), "--host"])
    assert r.exit_code == 2 and "node.arena_group" in r.output and "is not a group on this host" in r.output


def test_render_keeps_nested_tables_valid_and_annotates_only_fields() -> None:
    from kvstored.cli.config_cmd import render_toml
    from kvstored.config import EffectiveValue as EV

    effective = {"s": {"quotas": EV({"a": {"dram_bytes": 5}}, "env var KVSTORED_S__QUOTAS"),
                       "unset": EV(None, "default"), "dram_bytes": EV(2048, "default")}}
    text = render_toml(effective)
    assert tomllib.loads(text) == {"s": {"dram_bytes": 2048, "quotas": {"a": {"dram_bytes": 5}}}}
    lines = text.splitlines()
    assert "# unset: unset  # default" in lines and "dram_bytes = 2048  # default (2.0 KiB)" in lines
    assert "[s.quotas.a]" in lines and "dram_bytes = 5" in lines  # a sub-table's key: no field note

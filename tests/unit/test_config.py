"""Config loader precedence and errors."""

from __future__ import annotations

import pathlib

import pytest

from kvstored.config import load_config
from kvstored.errors import ConfigInvalid
from kvstored.units import format_size, parse_size


def test_precedence_defaults_file_env_flags(tmp_path: pathlib.Path) -> None:
    cfg_file = tmp_path / "kvstored.toml"
    cfg_file.write_text('[node]\ndram_size_bytes = "2GiB"\nssd_size_bytes = "8GiB"\nmax_batch_keys = 5\n')
    assert load_config(environ={}).node.dram_size_bytes == 1 << 30
    cfg = load_config(cfg_file, environ={})
    assert cfg.node.dram_size_bytes == 2 << 30 and cfg.node.ssd_size_bytes == 8 << 30
    env = {"KVSTORED_NODE__SSD_SIZE_BYTES": "16GiB", "KVSTORED_NODE__MAX_BATCH_KEYS": "7"}
    cfg = load_config(cfg_file, environ=env)
    assert cfg.node.ssd_size_bytes == 16 << 30 and cfg.node.max_batch_keys == 7
    cfg = load_config(
        cfg_file, environ=env, overrides={"node": {"ssd_size_bytes": "1GiB", "dram_size_bytes": None}}
    )
    assert cfg.node.ssd_size_bytes == 1 << 30 and cfg.node.dram_size_bytes == 2 << 30


def test_env_list_value() -> None:
    cfg = load_config(environ={"KVSTORED_NODE__LISTEN": '["unix:/tmp/x.sock", "127.0.0.1:1"]'})
    assert cfg.node.listen == ["unix:/tmp/x.sock", "127.0.0.1:1"]


def test_unknown_key_is_named(tmp_path: pathlib.Path) -> None:
    cfg_file = tmp_path / "bad.toml"
    cfg_file.write_text("[node]\ndram_sise_bytes = 5\n")
    with pytest.raises(ConfigInvalid, match="node.dram_sise_bytes"):
        load_config(cfg_file, environ={})


def test_bad_value_names_key_and_value(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigInvalid, match=r"node.dram_size_bytes.*12 parsecs"):
        load_config(overrides={"node": {"dram_size_bytes": "12 parsecs"}}, environ={})
    with pytest.raises(ConfigInvalid, match="node.dram_size_bytes"):
        load_config(overrides={"node": {"dram_size_bytes": 0}}, environ={})
    bad = tmp_path / "broken.toml"
    bad.write_text("[node\n")
    with pytest.raises(ConfigInvalid, match="not valid TOML"):
        load_config(bad, environ={})
    with pytest.raises(ConfigInvalid, match="cannot read config file"):
        load_config(tmp_path / "missing.toml", environ={})


@pytest.mark.parametrize(
    "text,expected",
    [("4096", 4096), ("1GiB", 1 << 30), ("512 MB", 512_000_000), ("1.5KiB", 1536), (7, 7), ("2g", 2 * 10**9),
     # exact, not through float: 2**53 + 1 and sizes past 2**53 keep every digit
     ("9007199254740993", 2**53 + 1), ("4611686018427387905", 2**62 + 1),
     ("1.005MB", 1_005_000), ("1.005GB", 1_005_000_000)],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "1 parsec", "GiB", True, -5])
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ValueError):
        parse_size(text)  # type: ignore[arg-type]


def test_format_size() -> None:
    assert format_size(1536) == "1.5 KiB" and format_size(10) == "10 B"

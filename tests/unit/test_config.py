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


# ---- issue 6 section 4: bad combinations and env-var naming, all refused at load ----------------


def test_max_block_bytes_2gib_is_a_config_error_naming_the_env_var_and_the_limit() -> None:
    # was: OverflowError from grpc.max_receive_message_length (32-bit) after the arena existed
    from kvstored.config import MAX_BLOCK_BYTES_LIMIT

    env = {"KVSTORED_NODE__MAX_BLOCK_BYTES": "2GiB", "KVSTORED_NODE__DRAM_SIZE_BYTES": "4GiB"}
    with pytest.raises(ConfigInvalid) as info:
        load_config(environ=env)
    msg = str(info.value)
    assert "node.max_block_bytes (env var KVSTORED_NODE__MAX_BLOCK_BYTES)" in msg
    assert str(MAX_BLOCK_BYTES_LIMIT) in msg and "2147483648" in msg
    ok = load_config(environ={**env, "KVSTORED_NODE__MAX_BLOCK_BYTES": str(MAX_BLOCK_BYTES_LIMIT)})
    assert ok.node.max_block_bytes == MAX_BLOCK_BYTES_LIMIT
    with pytest.raises(ConfigInvalid, match=r"node.max_inline_bytes .*2146435071"):
        load_config(environ={"KVSTORED_NODE__MAX_INLINE_BYTES": "3GiB"})


def test_min_key_bytes_above_max_key_bytes_names_both_keys_and_the_variable() -> None:
    with pytest.raises(ConfigInvalid) as info:
        load_config(environ={"KVSTORED_NODE__MIN_KEY_BYTES": "65"})
    msg = str(info.value)
    assert "node.min_key_bytes (env var KVSTORED_NODE__MIN_KEY_BYTES) (65)" in msg
    assert "node.max_key_bytes (64)" in msg
    assert load_config(environ={"KVSTORED_NODE__MIN_KEY_BYTES": "64"}).node.min_key_bytes == 64


def test_max_block_bytes_larger_than_dram_is_refused(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "n.toml"
    f.write_text('[node]\nmax_block_bytes = "32MiB"\n')
    with pytest.raises(ConfigInvalid) as info:
        load_config(f, environ={"KVSTORED_NODE__DRAM_SIZE_BYTES": "16MiB"})
    msg = str(info.value)
    assert f"node.max_block_bytes (config file {f}) (33554432)" in msg
    assert "node.dram_size_bytes (env var KVSTORED_NODE__DRAM_SIZE_BYTES) (16777216" in msg
    # a block occupies whole 4 KiB pages of a whole-page arena: 8193 bytes need 12 KiB
    with pytest.raises(ConfigInvalid, match="max_block_bytes"):
        load_config(overrides={"node": {"dram_size_bytes": 8192 + 100, "max_block_bytes": 8193}},
                    environ={})
    assert load_config(overrides={"node": {"dram_size_bytes": 16 << 20, "max_block_bytes": 16 << 20}},
                       environ={}).node.max_block_bytes == 16 << 20


def test_default_max_block_bytes_follows_a_small_dram_tier() -> None:
    assert load_config(environ={}).node.max_block_bytes == 64 << 20
    cfg = load_config(overrides={"node": {"dram_size_bytes": "16MiB"}}, environ={})
    assert cfg.node.max_block_bytes == 16 << 20


@pytest.mark.parametrize("key,flag", [("ssd_dir", "--ssd-dir"), ("arena_dir", "--arena-dir")])
def test_empty_directory_is_refused_not_the_current_directory(key: str, flag: str) -> None:
    with pytest.raises(ConfigInvalid, match=rf"node.{key} \(flag {flag}\): is empty"):
        load_config(overrides={"node": {key: ""}}, environ={},
                    override_sources={f"node.{key}": flag})
    with pytest.raises(ConfigInvalid, match=rf"node.{key} \(env var KVSTORED_NODE__{key.upper()}\)"):
        load_config(environ={f"KVSTORED_NODE__{key.upper()}": " "})


def test_every_env_var_error_names_the_variable() -> None:
    cases = {
        "KVSTORED_NODE__DRAM_SIZE_BYTES": "lots",
        "KVSTORED_NODE__DRAM_SISE_BYTES": "1GiB",
        "KVSTORED_NODE__PIN_LEASE_S": "-1",
        "KVSTORED_NODE__ARENA_MODE": "0999",
        "KVSTORED_NODEE__X": "1",
    }
    for var, value in cases.items():
        with pytest.raises(ConfigInvalid) as info:
            load_config(environ={var: value})
        assert f"env var {var}" in str(info.value), (var, str(info.value))


def test_file_modes_parse_octal_from_env_and_toml(tmp_path: pathlib.Path) -> None:
    assert load_config(environ={"KVSTORED_NODE__ARENA_MODE": "0660"}).node.arena_mode == 0o660
    f = tmp_path / "m.toml"
    f.write_text("[node]\narena_mode = 0o640\nsocket_mode = \"0o660\"\n")
    cfg = load_config(f, environ={}).node
    assert (cfg.arena_mode, cfg.socket_mode) == (0o640, 0o660)
    assert load_config(environ={}).node.socket_mode is None


def test_ssd_cap_larger_than_its_disk_is_refused_by_the_host_check(tmp_path: pathlib.Path) -> None:
    import os

    from kvstored.config import check_node_host

    st = os.statvfs(tmp_path)
    disk = st.f_blocks * st.f_frsize
    missing = tmp_path / "not" / "yet"  # statvfs of the nearest existing parent
    cfg = load_config(environ={"KVSTORED_NODE__SSD_SIZE_BYTES": str(disk + 1),
                               "KVSTORED_NODE__SSD_DIR": str(missing)}).node
    with pytest.raises(ConfigInvalid) as info:
        check_node_host(cfg)
    msg = str(info.value)
    assert "node.ssd_size_bytes (env var KVSTORED_NODE__SSD_SIZE_BYTES)" in msg
    assert str(disk) in msg and str(missing) in msg
    check_node_host(load_config(environ={"KVSTORED_NODE__SSD_SIZE_BYTES": str(disk),
                                         "KVSTORED_NODE__SSD_DIR": str(missing)}).node)
    # a disabled SSD tier is not checked
    check_node_host(load_config(overrides={"node": {"ssd_size_bytes": 0}}, environ={}).node)


def test_unknown_arena_group_is_refused_by_the_host_check() -> None:
    from kvstored.config import check_node_host

    cfg = load_config(environ={"KVSTORED_NODE__ARENA_GROUP": "kvstored-no-such-group"}).node
    with pytest.raises(ConfigInvalid, match=r"node.arena_group \(env var KVSTORED_NODE__ARENA_GROUP\)"):
        check_node_host(cfg)


@pytest.mark.parametrize("node_id", ["", "two words", "x" * 129, "tab\there", "gpu\u00e9"])
def test_a_bad_node_id_is_a_config_error_naming_the_flag(node_id: str) -> None:
    with pytest.raises(ConfigInvalid, match=r"node.node_id \(flag --node-id\): must have "
                                            r"1..128 printable ASCII"):
        load_config(overrides={"node": {"node_id": node_id}}, environ={},
                    override_sources={"node.node_id": "--node-id"})


def test_good_node_ids_pass_and_the_master_accepts_exactly_the_same() -> None:
    from kvstored.config import node_id_problem

    for good in ("n1", "gpu-0.rack7", "x" * 128, "a:b@c_d"):
        assert load_config(overrides={"node": {"node_id": good}}, environ={}).node.node_id == good
        assert node_id_problem(good) is None
    assert node_id_problem("") is not None and node_id_problem("a b") is not None


def test_replicas_settings_zone_and_their_errors(tmp_path: pathlib.Path) -> None:
    ns = "ab" * 16
    cfg_file = tmp_path / "kvstored.toml"
    cfg_file.write_text(f'[node]\nzone = "rack-2"\n[cluster]\ndefault_replicas = 2\n'
                        f'[cluster.namespace_replicas]\n"{ns.upper()}" = 3\n')
    cfg = load_config(cfg_file, environ={})
    assert cfg.node.zone == "rack-2"
    assert cfg.cluster.replicas_for(bytes.fromhex(ns)) == 3  # hex keys normalised
    assert cfg.cluster.replicas_for(b"\x00" * 16) == 2 and cfg.cluster.replicas_for(b"") == 2
    assert load_config(environ={}).cluster.default_replicas == 1
    with pytest.raises(ConfigInvalid, match=r"cluster.default_replicas.*9"):
        load_config(overrides={"cluster": {"default_replicas": 9}}, environ={})
    with pytest.raises(ConfigInvalid, match=r"namespace ids of 32 hex digits, got 'abc'"):
        load_config(overrides={"cluster": {"namespace_replicas": {"abc": 2}}}, environ={})
    with pytest.raises(ConfigInvalid, match=rf"namespace {ns}: replicas must be in 1\.\.8, got 0"):
        load_config(overrides={"cluster": {"namespace_replicas": {ns: 0}}}, environ={})
    with pytest.raises(ConfigInvalid, match=r"node.zone.*without spaces \(got 'a b'\)$"):
        load_config(overrides={"node": {"zone": "a b"}}, environ={})


# ---- issue 20: the layering goes through pydantic-settings ------------------------------------


def test_the_root_is_a_pydantic_settings_model_reading_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic_settings import BaseSettings

    from kvstored.config import KvstoredConfig

    assert issubclass(KvstoredConfig, BaseSettings)
    monkeypatch.setenv("KVSTORED_NODE__MAX_BATCH_KEYS", "9")
    monkeypatch.setenv("KVSTORED_CLUSTER__MASTER_ADDRESS", "10.0.0.1:7080")
    cfg = KvstoredConfig(node={"max_batch_keys": 11})  # init kwargs (flags) beat the env
    assert (cfg.node.max_batch_keys, cfg.cluster.master_address) == (11, "10.0.0.1:7080")
    assert load_config().node.max_batch_keys == 9  # environ=None reads os.environ


def test_env_lists_take_toml_syntax_and_a_bad_one_names_the_variable() -> None:
    cfg = load_config(environ={"KVSTORED_NODE__LISTEN": "['unix:/tmp/a.sock']"})  # TOML, not JSON
    assert cfg.node.listen == ["unix:/tmp/a.sock"]
    with pytest.raises(ConfigInvalid, match=r"env var KVSTORED_NODE__LISTEN: cannot parse list '\[\"x\"'"):
        load_config(environ={"KVSTORED_NODE__LISTEN": '["x"'})


def test_an_unknown_section_is_named_not_skipped() -> None:
    # (known: every section, cluster, master, node and any added later)
    with pytest.raises(ConfigInvalid, match=r"env var KVSTORED_NODEE__X: 'nodee' is not a config section "
                                            r"\(known: .*master, node"):
        load_config(environ={"KVSTORED_NODEE__X": "1"})
    # variables without a section (KVSTORED_ADDRESS, KVSTORED_TEST_HOOKS) are not config keys
    quiet = {"KVSTORED_ADDRESS": "unix:/x", "KVSTORED_TEST_HOOKS": "", "KVSTORED_MASTER": "10.0.0.1:7080"}
    assert load_config(environ=quiet).node.max_batch_keys == 8192


def test_spill_watermarks_out_of_order_name_the_file_and_the_variable(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[cluster]\nspill_low_watermark = 0.95\n")
    with pytest.raises(ConfigInvalid) as info:
        load_config(f, environ={})
    assert str(info.value) == (f"invalid configuration: cluster.spill_low_watermark (config file {f}) (0.95) "
                               "must be below cluster.spill_high_watermark (0.9)")
    with pytest.raises(ConfigInvalid) as info:
        load_config(environ={"KVSTORED_CLUSTER__SPILL_HIGH_WATERMARK": "0.5"})
    assert ("cluster.spill_high_watermark (env var KVSTORED_CLUSTER__SPILL_HIGH_WATERMARK) (0.5)"
            in str(info.value))

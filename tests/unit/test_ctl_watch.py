"""``kvstorectl --watch``: the refresh loop of kvstored.cli.output.emit_watched, driven by an
injected sleep (each "sleep" changes what the next refresh reads)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from kvstored.cli import output
from kvstored.cli.kvstorectl import main
from kvstored.errors import Unavailable


def _tables(d: dict[str, Any]) -> list[Any]:
    return [output.kv_table("counters", [("puts", d["puts"])])]


def test_json_watch_prints_one_document_per_refresh_and_counters_move(
        capsys: pytest.CaptureFixture[str]) -> None:
    state = {"puts": 0}

    def sleep(s: float) -> None:
        assert s == 0.5
        state["puts"] += 3  # what happened on the node between two refreshes

    output.emit_watched("json", lambda: dict(state), _tables, watch_s=0.5, count=3, sleep=sleep)
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [d["refresh"] for d in docs] == [1, 2, 3]
    assert [d["data"]["puts"] for d in docs] == [0, 3, 6]


def test_a_failed_refresh_is_shown_and_the_watch_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    calls = iter([{"puts": 1}, Unavailable("node restarting"), {"puts": 2}])

    def produce() -> dict[str, int]:
        got = next(calls)
        if isinstance(got, Exception):
            raise got
        return got

    output.emit_watched("json", produce, _tables, watch_s=0.1, count=3, errors=(Unavailable,),
                        sleep=lambda s: None)
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert docs[1]["error"] == {"code": "UNAVAILABLE", "message": "node restarting"}
    assert [d.get("data") for d in docs] == [{"puts": 1}, None, {"puts": 2}]


def test_an_error_not_listed_ends_the_watch() -> None:
    def produce() -> dict[str, int]:
        raise ValueError("bug")

    with pytest.raises(ValueError):
        output.emit_watched("json", produce, _tables, watch_s=0.1, count=3, errors=(Unavailable,),
                            sleep=lambda s: None)


def test_table_watch_on_a_pipe_prints_each_refresh(capsys: pytest.CaptureFixture[str]) -> None:
    n = iter(range(10))
    output.emit_watched("table", lambda: {"puts": next(n)}, _tables, watch_s=1.0, count=2,
                        sleep=lambda s: None)
    out = capsys.readouterr().out
    assert out.count("kvstorectl --watch 1s") == 2
    assert "refresh 2" in out


def test_single_print_without_watch(capsys: pytest.CaptureFixture[str]) -> None:
    output.emit_watched("json", lambda: {"puts": 7}, _tables, watch_s=None,
                        sleep=lambda s: pytest.fail("no sleep without --watch"))
    assert json.loads(capsys.readouterr().out) == {"puts": 7}


@pytest.mark.parametrize("args", [["--watch", "blocks"], ["--count", "2", "where", "00"]])
def test_watch_on_a_command_it_does_not_apply_to_is_refused(args: list[str]) -> None:
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2
    assert "--watch/--count apply to status, stats, nodes" in res.output

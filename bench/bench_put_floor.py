"""Where a steady shared-memory put of 16 x 256 KiB spends its time, and what each lever of
issue 18's put target could at most win: ratios to the working-set memcpy of the same run.

Usage (starts its own daemon, DRAM only):
    python bench/bench_put_floor.py [--reps 200] [--batch 16] [--size 256KiB]
                                    [--json bench/results/bench_put_floor.json]

Rows, measured alternated rep by rep (so load drift on shared cores hits all alike); each
ratio is the median over reps of (reference time / row time):

  * memcpy_ws     ``np.copyto`` of the batch into a working set as large as the reps' keys
                  (bench_one_sided.py's ``memcpy_ws_put``: the reference)
  * put           ``Client.put`` of the batch (reserve-ahead slots: one CommitSlots per put)
  * floor         the same copy (``copy_many(stream=True)`` into slots held by a second
                  client's session) and one CommitSlots of the batch with the refill of the
                  next batch's slots, sent straight on the control channel: the node's and
                  the socket's part of a put with no client code around it; ``put - floor``
                  is what the client's own Python costs
  * floor_no_refill  as ``floor``, the refill asked for in an untimed CommitSlots after the
                  timed one: the most that granting the refill after the answer (off the
                  critical path) could win
  * floor_pipelined  the batch in two halves on two control connections of that session:
                  copy the first, send its commit, copy the second while the node commits
                  the first, send the second, then wait for both: what pipelining the
                  commit against the copy wins (or loses) on these cores
  * floor_after_answer  what the client sends now: the writes as packed columns, the copy
                  with ``copy_at``, the refill granted after the answer (``grant_after_answer``,
                  on a third connection: its frame is read with the row's next request, as the
                  client does); ``put - floor_after_answer`` is the client's own Python
  * copy          the copy alone into held slots (no commit): what is left of a put with a
                  commit that cost nothing
  * empty_rtt     a CommitSlots with nothing in it: the bare round trip

The floor rows use private client state (``Client._st``): they measure the protocol, not an
API. Keys are removed every 20 reps (not timed).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from kvstored.client._control import _Connection  # noqa: E402
from kvstored.client.sync import Client  # noqa: E402
from kvstored.native import copy_at, copy_many  # noqa: E402
from kvstored.transport.control import frame, recv_frame  # noqa: E402
from kvstored.units import parse_size  # noqa: E402
from kvstored.v1 import node_pb2 as pb  # noqa: E402

ROWS = ("memcpy_ws", "put", "floor", "floor_no_refill", "floor_pipelined", "floor_after_answer", "copy",
        "empty_rtt")


class _RawSession:
    """Slots of one client's session, committed by hand over the control channel."""

    def __init__(self, c: Client, size: int, batch: int) -> None:
        st = c._st  # noqa: SLF001 (the floor measures the protocol below the client)
        c.put([b"floor-warm-up".ljust(16, b".")], [np.zeros(size, dtype=np.uint8)])  # (ReservePut)
        self.sid = c._session.session_id(time.monotonic() + 30.0)  # noqa: SLF001
        assert st.info is not None
        self.epoch = st.info.epoch
        assert st.control is not None and st.arena is not None, "no control channel / arena"
        self.ns = st.namespace_id
        self.arena = st.arena
        self.size, self.batch = size, batch
        self.conns = [_Connection(st.control.path) for _ in range(3)]
        for conn in self.conns:
            conn.sock.settimeout(30.0)
        self.held: list[tuple[int, int]] = []  # (slot id, offset)
        while len(self.held) < 2 * batch:
            self.send(0, [], 2 * batch)
            self.recv(0)

    def request_after(self, writes: list[tuple[int, bytes]], want: int) -> None:
        """One CommitSlots as the client sends it now (columns, refill after the answer) on
        connection 2, through its request() (which reads the last refill frame first)."""
        req = self.request(writes, want, columns=True, after=True)
        resp = self.conns[2].request(req.SerializeToString(), 30.0, self._refill)
        self._check(resp)

    def _refill(self, resp: pb.ControlResponse | None) -> None:
        if resp is not None:  # (None: the connection closed with the last refill unread)
            self._check(resp)

    def send(self, k: int, writes: list[tuple[int, bytes]], want: int) -> None:
        self.conns[k].sock.sendall(frame(self.request(writes, want)))

    def request(self, writes: list[tuple[int, bytes]], want: int, *, columns: bool = False,
                after: bool = False) -> pb.ControlRequest:
        req = pb.ControlRequest(session_id=self.sid)
        r = req.commit_slots
        r.namespace_id, r.session_id, r.epoch = self.ns, self.sid, self.epoch
        r.lease_ms = 600_000  # the reps hold slots for minutes on a loaded machine
        r.grant_after_answer = after
        if want:
            w = r.want.add()
            w.size_bytes, w.num_slots = self.size, want
        if columns:
            r.write_slot_ids.extend([sid for sid, _ in writes])
            r.write_keys.extend([key for _, key in writes])
            r.write_sizes.extend([self.size] * len(writes))
        else:
            add = r.writes.add
            for sid, key in writes:
                m = add()
                m.slot_id, m.key, m.size_bytes = sid, key, self.size
        return req

    def recv(self, k: int) -> None:
        self._check(pb.ControlResponse.FromString(recv_frame(self.conns[k].sock)))

    def _check(self, resp: pb.ControlResponse) -> None:
        if resp.error_code:
            raise RuntimeError(f"CommitSlots failed: {resp.error_message}")
        got = resp.commit_slots
        bad = [x.status.message for x in got.results if x.HasField("status")]
        if bad:
            raise RuntimeError(f"CommitSlots refused writes: {bad[:2]}")
        self.held.extend((g.slot_id, g.offset) for g in got.slots)
        self.held.extend(zip(got.slot_ids, got.slot_offsets, strict=True))

    def take(self) -> list[tuple[int, int]]:
        while len(self.held) < self.batch:  # the node granted fewer (its budget): ask again
            self.send(0, [], 2 * self.batch)
            self.recv(0)
        out, self.held = self.held[: self.batch], self.held[self.batch :]
        return out

    def copy(self, slots: list[tuple[int, int]], values: list[np.ndarray]) -> None:
        copy_many(self.arena.copy_pairs([(off, memoryview(v)) for (_, off), v in zip(slots, values, strict=True)]),
                  stream=True)

    def copy_at(self, slots: list[tuple[int, int]], values: list[np.ndarray]) -> None:
        copy_at(self.arena.view, [off for _, off in slots], values, stream=True)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


def run(reps: int, batch: int, size: int, dram_bytes: int = 1 << 30) -> dict[str, Any]:
    """Every row (see the module docstring) against a daemon of ``dram_bytes`` of DRAM (at
    least 8 x 20 batches); seconds in, microseconds out.

    Raises:
        RuntimeError: the node refused a floor row's CommitSlots or one of its writes.
    """
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_blocks import daemon  # the same daemon launcher

    rng = np.random.default_rng(size)
    values = [rng.integers(0, 255, size, dtype=np.uint8) for _ in range(batch)]
    groups = 20 + 2
    ws = np.ones(size * batch * groups, dtype=np.uint8)
    ws_slots = [ws[k * size:(k + 1) * size] for k in range(batch * groups)]
    t: dict[str, list[float]] = {r: [] for r in ROWS}
    with tempfile.TemporaryDirectory(prefix="kvstored-bench-floor-") as tmpdir:
        tmp = pathlib.Path(tmpdir)
        dram = f"{max(dram_bytes, 8 * 20 * batch * size)}"
        with daemon(tmp, dram=dram, ssd_size="0", name="floor") as (addr, _), \
                Client(addr, timeout_s=60.0, transport="shm") as c, \
                Client(addr, timeout_s=60.0, transport="shm", reserve_ahead_bytes=0) as c2:
            raw = _RawSession(c2, size, batch)

            def keys(tag: str, i: int) -> list[bytes]:
                return [f"fl:{tag}:{i}:{j}".encode().ljust(16, b".") for j in range(batch)]

            def memcpy_ws(i: int) -> None:
                g = i % groups
                for v, dst in zip(values, ws_slots[g * batch:(g + 1) * batch], strict=True):
                    np.copyto(dst, v)

            def put(i: int) -> None:
                r = c.put(keys("p", i), values)
                assert all(x.ok for x in r), r

            def floor(i: int) -> None:
                slots = raw.take()
                raw.copy(slots, values)
                raw.send(0, [(s, k) for (s, _), k in zip(slots, keys("f", i), strict=True)], 2 * batch)
                raw.recv(0)

            def floor_no_refill(i: int) -> None:
                slots = raw.take()
                raw.copy(slots, values)
                raw.send(0, [(s, k) for (s, _), k in zip(slots, keys("n", i), strict=True)], 0)
                raw.recv(0)

            def floor_pipelined(i: int) -> None:
                slots, ks, h = raw.take(), keys("q", i), batch // 2
                for part, (a, b) in enumerate(((0, h), (h, batch))):
                    raw.copy(slots[a:b], values[a:b])
                    raw.send(part, [(s, k) for (s, _), k in zip(slots[a:b], ks[a:b], strict=True)], 2 * batch)
                raw.recv(0)
                raw.recv(1)

            def floor_after_answer(i: int) -> None:
                slots = raw.take()
                raw.copy_at(slots, values)
                raw.request_after([(s, k) for (s, _), k in zip(slots, keys("a", i), strict=True)], 2 * batch)

            def copy(_i: int) -> None:
                slots = raw.take()
                raw.copy(slots, values)
                raw.held[:0] = slots  # not committed: used again

            def empty_rtt(_i: int) -> None:
                raw.send(0, [], 0)
                raw.recv(0)

            fns: dict[str, Callable[[int], None]] = {
                "memcpy_ws": memcpy_ws, "put": put, "floor": floor, "floor_no_refill": floor_no_refill,
                "floor_pipelined": floor_pipelined, "floor_after_answer": floor_after_answer, "copy": copy,
                "empty_rtt": empty_rtt,
            }
            for i in range(-10, reps):
                for name in ROWS:
                    t0 = time.perf_counter()
                    fns[name](i)
                    if i >= 0:
                        t[name].append(time.perf_counter() - t0)
                if i % 20 == 19:  # drop the reps' keys (not timed)
                    c.remove([k for j in range(i - 19, i + 1) for k in keys("p", j)])
                    c2.remove([k for tag in "fnqa" for j in range(i - 19, i + 1) for k in keys(tag, j)])
                if len(raw.held) < 2 * batch:  # floor_no_refill's slots, granted untimed
                    raw.send(0, [], 2 * batch)
                    raw.recv(0)
            raw.close()
    out: dict[str, Any] = {"batch": batch, "size_bytes": size, "reps": reps}
    for name in ROWS:
        out[f"{name}_p50_us"] = statistics.median(t[name]) * 1e6
        out[f"{name}_ratio_vs_ws_memcpy"] = statistics.median(
            r / m for r, m in zip(t["memcpy_ws"], t[name], strict=True))
    out["client_python_p50_us"] = out["put_p50_us"] - out["floor_p50_us"]
    out["client_python_after_answer_p50_us"] = out["put_p50_us"] - out["floor_after_answer_p50_us"]
    out["date_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", default="256KiB")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "bench_put_floor.json"))
    args = ap.parse_args()
    res = run(args.reps, args.batch, parse_size(args.size))
    print(f"shm put of {res['batch']} x {args.size}, p50 of {res['reps']} alternated reps")
    print(f"{'row':16s} {'p50 us':>8s} {'x ws memcpy':>12s}")
    for name in ROWS:
        print(f"{name:16s} {res[name + '_p50_us']:8.0f} {res[name + '_ratio_vs_ws_memcpy']:11.2f}x")
    print(f"the client's own code (put - floor): {res['client_python_p50_us']:.0f} us; "
          f"(put - floor_after_answer): {res['client_python_after_answer_p50_us']:.0f} us")
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

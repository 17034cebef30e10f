"""The whole-system test (issue 17): "it works", with two real vLLM engines on a cluster.

Topology (tests/e2e/bridge_helpers.py): one bridge in the root namespace; the two masters
listen on its address and elect a leader through etcd (loopback, root namespace only); three
network namespaces on the bridge, each with one ``kvstored node`` given both masters:

    ns a: node a + vLLM engine A            root ns: etcd (loopback) + masters 0 and 1
    ns b: node b + vLLM engine B (and R)             (``kvstored master --etcd``)
    ns c: node c (the third node)

Each engine talks to its own node over the node's unix socket and shared-memory arena; the
nodes and the masters talk over the bridge only. The engines run SmolLM2-135M (the vLLM
venv, ``scripts/setup-vllm-venv.sh``) with the KvstoredConnector.

1. Engine A computes a ~4k-token prefix (a document + question 1, then question 2): its
   blocks are saved with ``replicas=2`` (the connector's ``replicas``): on node a and, by
   the zone rule (a and b share zone z1, c is z2), on node c; node b holds none.
2. Meanwhile engine R, B's configuration without the connector, gives the reference answers,
   and engine B starts and waits (its timings are taken alone on the machine).
3. B: the prompt under another ``cache_salt`` (other block hashes, nothing cached): the miss
   TTFT; the prompt itself: the hit TTFT, its blocks loaded through the cluster (node b
   copies them from nodes a and c); then a full answer.
4. During B's load: node b runs with the ``remote_fill_gate`` fault hook
   (kvstored/node/fault_hooks.py), so every copy of its remote fill waits after the master
   lookup named the holders (and their alternates) and before the first byte moves. Once
   the gate holds, a node other than B's (``a`` or ``c``, chosen from a seed printed in the
   log; ``KVSTORED_SYSTEM_SEED`` replays one; ``KVSTORED_SYSTEM_VICTIM=named`` kills the
   holder the lookup named for B's copies instead, ``a`` or ``c`` that node) and the
   leading master are SIGKILLed, then the gate is released: the copies from a dead holder
   fail and fall back to the surviving replica, with no master (where the victim is not
   the named holder, the load does not notice). The load in flight is served whole.
5. After the hit, node b's copies of A's blocks are removed; once the other master leads (a
   higher term) and answers ``complete=true``, B asks again with vLLM's prefix cache reset:
   the prefix comes through the new leader from the replica that survived.
6. Asserted: every request is answered; each answer equals R's token for token; B's hit
   TTFT is below its miss TTFT; the hit loaded the whole shared prefix and no load failed;
   node b copied A's blocks from its peers (its TCP counter) and fell back from the dead
   holder where it was named; after the failover B loads the common prefix again.

The kills happen while the gate holds B's load (the driver waits for the gate's ``.held``
file), and B's later requests wait for the driver's go file, so what runs before, during
and after the kills is deterministic; no sleep stands in for synchronisation.
Needs root (network namespaces, a bridge), etcd (the ``etcd`` fixture) and the vLLM venv;
skipped with the reason otherwise. Run only this test:
``python -m pytest -q -s tests/e2e/test_system_vllm_cluster.py``.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import BridgedNamespace, BridgeNet
from cluster_helpers import MasterProcess, NodeProcess, _wait, start_nodes, wait_healthy
from vllm_helpers import MODEL, PYTHON, engine_stats, engine_steps, requires_vllm, wait_engine_file

from kvstored import Client, Namespace
from kvstored.client.master import MasterClient
from kvstored.client.master_admin import MasterAdminClient
from kvstored.demo.vllm_demo import (
    EngineProcess,
    build_prompts,
    engine_spec,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.timeout(1200),  # ~10-12 min on a loaded shared 2-core machine
    requires_vllm,
]

PREFIX_TOKENS = 4096  # the shared document; the issue asks for a 4k-token prefix
ANSWER_TOKENS = 16
QUESTIONS = (
    "Which Python module does this document describe? Answer in one sentence.",
    "Name one class or function that the document describes.",
)
BLOCK_TOKENS = 128  # the engine's block_size (run_engine's default)
NODE_DRAM = "768MiB"  # ~180 MiB of KV per 4k-token prompt (30 layers x 3 KV heads x 64 x fp32)
ENGINE_KV_BYTES = 512 << 20  # vLLM's own KV cache per engine (a 4.4k-token context needs ~200 MiB)
NODE_ENV = {
    "KVSTORED_CLUSTER__REMOTE_FETCH_TIMEOUT_S": "20",  # B's held fill keeps its deadline
    "KVSTORED_CLUSTER__RPC_TIMEOUT_S": "2",  # a dead master costs a lookup 2 s, not 5
}
CONNECTOR = {
    # a loaded 2-core machine: the node's cluster lookup of ~1,000 keys (32 blocks x 30
    # layers) takes far more than the 50 ms default; a missed deadline would be a miss
    "lookup_timeout_ms": 10_000,
    "timeout_ms": 60_000,  # one load batch: ~180 MiB copied from a peer, then into vLLM
}
SEED_ENV = "KVSTORED_SYSTEM_SEED"
VICTIM_ENV = "KVSTORED_SYSTEM_VICTIM"  # a, c or named (the holder B's load copies from)
ENGINE_WAIT_S = 600.0  # a hang guard on an engine's progress (it fails fast if it exits)
ELECTION_PREFIX = "/kvsystem"
ELECTION_LEASE_S = 3  # the leader's etcd lease: a dead leader is replaced within ~3 s
NODE_LEASE_S = 4.0
ENGINE_ENV = {"VLLM_HOST_IP": "127.0.0.1"}  # else vLLM probes a route to 8.8.8.8 for its IP

# A's blocks want 2 replicas on distinct nodes, new zones first: a (the writer) and c, never
# b, whose load must go through the cluster
ZONES = {"a": "z1", "b": "z1", "c": "z2"}
REPLICAS = 2

# prompt indexes in the engines' spec: one ~4k-token document, two questions
P_SHARED_Q1, P_SHARED_Q2 = 0, 1


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    _, ps = build_prompts(MODEL, PREFIX_TOKENS, QUESTIONS)
    assert all(len(p) >= PREFIX_TOKENS for p in ps), [len(p) for p in ps]
    return ps


@pytest.fixture
def net() -> Iterator[BridgeNet]:
    bridge = BridgeNet()
    try:
        yield bridge.create()
    finally:
        bridge.close()


def _node(ns: BridgedNamespace, workdir: Path, master: str, node_id: str) -> NodeProcess:
    """A ``kvstored node`` inside ``ns``, its TCP ports on the namespace's bridge address,
    in its zone of :data:`ZONES`."""
    n = NodeProcess(workdir, master, node_id, dram_size=NODE_DRAM, ssd_size="0")
    n.args += ["--zone", ZONES[node_id]]
    n.args = ns.exec_args(*[a.replace("127.0.0.1:", f"{ns.ip}:") for a in n.args])
    return n


def _engine(ns: BridgedNamespace, prompts: list[list[int]], steps: list[dict[str, Any]],
            workdir: Path, *, node: NodeProcess | None, replicas: int = 1) -> EngineProcess:
    """A vLLM engine in ``ns``: with the connector on ``node``'s unix socket (its saves
    wanting ``replicas`` replicas), or none."""
    assert PYTHON is not None and MODEL is not None
    if node is None:
        spec = engine_spec(MODEL, prompts, steps, connector=None)
    else:
        spec = engine_spec(MODEL, prompts, steps, extra_config={
            **CONNECTOR, "address": node.unix_address, "stats_dir": str(workdir / "stats"),
            "replicas": replicas})
    spec["kv_cache_memory_bytes"] = ENGINE_KV_BYTES
    return EngineProcess(PYTHON, spec, workdir, env=ENGINE_ENV, argv_prefix=ns.exec_args())


def _master(workdir: Path, name: str, etcd_url: str, host: str) -> MasterProcess:
    """A ``kvstored master`` electing through ``etcd_url``, listening on ``host`` (port 0)."""
    d = workdir / name
    d.mkdir()
    m = MasterProcess(d)
    m.args[m.args.index("--listen") + 1] = f"{host}:0"
    m.args[m.args.index("--node-lease-s") + 1] = str(NODE_LEASE_S)
    m.args += ["--etcd", etcd_url, "--election-prefix", ELECTION_PREFIX,
               "--election-lease-s", str(ELECTION_LEASE_S)]
    return m


def _leader(addresses: str) -> tuple[str, int]:
    """The leading master's address and term, as a client given every master finds it."""
    with MasterClient(addresses, timeout_s=2) as m:
        m.list_nodes()
        return m.address, m.fence.term


def _wait_file(path: Path, engine: EngineProcess) -> None:
    # B may still be starting, then prefills ~4k tokens: minutes on a loaded 2-core machine
    wait_engine_file(path, engine, ENGINE_WAIT_S)


def _keys_on(node: NodeProcess, namespace: Namespace) -> list[bytes]:
    """The keys of ``namespace`` that ``node`` itself holds (its admin listing, no probe)."""
    with Client(node.unix_address, namespace=namespace) as kv:
        blocks, truncated = kv.list_blocks(namespace.id)
    assert not truncated
    return sorted(b.key for b in blocks)


def _common_blocks(x: list[int], y: list[int]) -> int:
    """Full blocks that vLLM can take from a cache of ``x`` for a request of ``y``."""
    same = next((i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v),
                min(len(x), len(y)))
    return min(same, len(y) - 1) // BLOCK_TOKENS


def _readable_on(m: MasterAdminClient, ns_id: bytes, keys: list[bytes]) -> Counter[str]:
    """How many of ``keys`` each node holds readable, as the leader indexes them (0 for
    all while its answer is not complete)."""
    per_key, complete = m.list_replicas(ns_id, keys)
    if not complete:
        return Counter()
    return Counter(r["node_id"] for reps in per_key for r in reps if r["readable"])


@pytest.mark.etcd
def test_two_engines_share_a_prefix_through_the_cluster_while_a_node_and_the_leader_die(
    workdir: Path, net: BridgeNet, request: pytest.FixtureRequest, procs: list[Any],
    prompts: list[list[int]]
) -> None:
    _run_system(workdir, net, procs, prompts, etcd=request.getfixturevalue("etcd"))


def _run_system(workdir: Path, net: BridgeNet, procs: list[Any], prompts: list[list[int]], *,
                etcd: Any) -> None:
    """The scenario of the module docstring: two masters electing through ``etcd``."""
    t_start = time.monotonic()
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(1 << 32))
    victim = random.Random(seed).choice(["a", "c"])
    pick = os.environ.get(VICTIM_ENV, "")
    assert pick in ("", "a", "c", "named"), f"{VICTIM_ENV} must be a, c or named; got {pick!r}"
    print(f"whole-system test: seed {seed} ({SEED_ENV}={seed} replays it): the node killed "
          f"is {pick or victim}", flush=True)

    ns = {name: net.add_namespace() for name in ("a", "b", "c")}
    masters = [_master(workdir, f"master-{i}", etcd.url(i), net.root_ip) for i in (0, 1)]
    for m in masters:
        procs.append(m)
        m.start()
    both = ",".join(m.address for m in masters)  # the nodes cannot reach etcd (loopback)
    _wait("a leader", lambda: _leader(both))
    nodes = {name: _node(ns[name], workdir / f"node-{name}", both, name) for name in ns}
    gate = workdir / "b-fill.fifo"  # every remote copy of node b waits here (fault_hooks.py)
    os.mkfifo(gate)
    gate_held = Path(f"{gate}.held")
    nodes["b"].env["KVSTORED_TEST_HOOKS"] = f"remote_fill_gate:{gate}"
    start_nodes(list(nodes.values()), procs, NODE_ENV)
    wait_healthy(both, set(nodes))
    assert all(n.data.startswith(f"{ns[k].ip}:") for k, n in nodes.items())

    # A computes the shared prefix; R (no connector) the reference answers; B starts and
    # waits for `go` so that its TTFTs are measured alone on the machine.
    go, reached, resume = workdir / "b-go", workdir / "b-reached", workdir / "b-resume"
    b_steps: list[dict[str, Any]] = [
        {"wait_for_file": str(go)},
        # miss: the same prompt under another cache_salt (other block hashes): nothing
        # cached anywhere, so B computes all of it
        {"prompt": P_SHARED_Q1, "max_tokens": 1, "cache_salt": "cold"},
        # hit: A's blocks through the cluster, its copies held by the gate for the kills
        {"prompt": P_SHARED_Q1, "max_tokens": 1},
        {"prompt": P_SHARED_Q1, "max_tokens": ANSWER_TOKENS},
        {"signal_file": str(reached), "wait_for_file": str(resume)},  # the failover
        # with vLLM's own cache reset and node b's copies removed: the prefix comes through
        # the new leader from the replica that survived
        {"prompt": P_SHARED_Q2, "max_tokens": ANSWER_TOKENS, "reset_prefix_cache": True},
        {"prompt": P_SHARED_Q1, "max_tokens": ANSWER_TOKENS, "reset_prefix_cache": True},
    ]
    engine_b = _engine(ns["b"], prompts, b_steps, workdir / "engine-b", node=nodes["b"])
    procs.append(engine_b)
    engine_a = _engine(ns["a"], prompts, [
        {"prompt": P_SHARED_Q1, "max_tokens": 1},
        {"prompt": P_SHARED_Q2, "max_tokens": 1},
    ], workdir / "engine-a", node=nodes["a"], replicas=REPLICAS)
    procs.append(engine_a)
    engine_r = _engine(ns["b"], prompts, [
        {"prompt": p, "max_tokens": ANSWER_TOKENS} for p in (P_SHARED_Q1, P_SHARED_Q2)
    ], workdir / "engine-r", node=None)
    procs.append(engine_r)

    a_steps = engine_steps(engine_a)
    assert a_steps[0]["num_cached_tokens"] == 0, "engine A must compute the prefix itself"
    a_worker = engine_stats(workdir / "engine-a" / "stats", "worker")
    namespace = Namespace(**a_worker["extra"]["namespace"])
    assert a_worker["blocks_short_of_replicas"] == 0 and a_worker["save_errors"] == 0, a_worker
    a_keys = _keys_on(nodes["a"], namespace)
    on = {k: len(set(a_keys) & set(_keys_on(n, namespace))) for k, n in nodes.items()}
    # the writer keeps every block it saved (node a without A's blocks: fixed in e912599)
    assert len(a_keys) == a_worker["keys_saved"] > 0, (on, a_worker)
    reference = engine_steps(engine_r)
    answers = dict(zip((P_SHARED_Q1, P_SHARED_Q2), reference, strict=True))
    with MasterAdminClient(both) as admin:  # just before B goes: every block on a and c
        _wait("A's blocks readable on nodes a and c, none on b",
              lambda: _readable_on(admin, namespace.id, a_keys)
              == Counter({"a": len(a_keys), "c": len(a_keys)}))
    on = {k: len(set(a_keys) & set(_keys_on(n, namespace))) for k, n in nodes.items()}
    assert on == {"a": len(a_keys), "b": 0, "c": len(a_keys)}, on
    assert not gate_held.exists(), "a copy into node b reached the gate before B's load"

    go.write_text("go\n")
    _wait_file(gate_held, engine_b)  # B's hit: every copy of its load waits at the gate
    leader_address, old_term = _leader(both)  # who leads now (asked just before the kill)
    leader = next(m for m in masters if m.address == leader_address)
    with MasterClient(leader_address, timeout_s=10) as m:  # whom b's lookup named
        named_got = m.lookup_each(namespace.id, a_keys, local_node_id="b")
    assert named_got is not None
    named = Counter(r.node_id for r in named_got[0].values())
    if pick:  # the node B's load copies from (the fallback within the load), or as told
        victim = named.most_common(1)[0][0] if pick == "named" else pick
    nodes[victim].kill()
    leader.kill()
    t_kill = time.monotonic()
    open(gate, "wb").close()  # release: the copies from the dead holder fail over
    print(f"killed node {victim} and the leading master {leader.address} (term {old_term}) "
          f"at {t_kill - t_start:.1f} s while B's load was held (named: {dict(named)})",
          flush=True)
    survivor = next(m for m in masters if m is not leader)
    failover_s, new_term = _new_leader(both, survivor, namespace, a_keys, t_kill)
    _wait_file(reached, engine_b)  # B's hit and its full answer are done
    held_by_b = len(set(a_keys) & set(_keys_on(nodes["b"], namespace)))
    with Client(nodes["b"].unix_address, namespace=namespace) as kv:
        b_stats = kv.stats()
        removed = kv.remove(a_keys)  # B's next loads must go through the cluster again
    assert all(removed), f"{removed.count(False)} of node b's copies were not removed"
    wait_healthy(survivor.address, set(nodes) - {victim})  # they followed it, no restart
    resume.write_text("go\n")
    b = engine_steps(engine_b)
    wall_s = time.monotonic() - t_start
    b_log = nodes["b"].log()
    _check(b, prompts, answers, workdir, {
        "seed": seed, "killed": [f"node {victim}", f"master {leader.address}"],
        "failover_s": round(failover_s, 2), "terms": [old_term, new_term],
        "keys_named_per_holder": dict(named), "keys_of_A": len(a_keys),
        "keys_of_A_on_node_b_after_the_hit": held_by_b,
        "node_b_remote_tcp_blocks": b_stats["remote_tcp_blocks"],
        "node_b_fell_back": "remote_fill_fallback" in b_log,
    }, wall_s)
    assert "test_hook_released" in b_log, "B's load never reached node b's gate"
    assert held_by_b == len(a_keys), held_by_b  # the hit copied A's blocks into node b
    assert b_stats["remote_tcp_blocks"] >= len(a_keys), b_stats  # ... over TCP, from peers
    if named[victim]:  # b's lookup named the dead holder for some: those fell back
        assert "remote_fill_fallback" in b_log, "node b did not fall back from " + victim
    assert new_term > old_term, (old_term, new_term)


def _new_leader(both: str, survivor: MasterProcess, namespace: Namespace,
                a_keys: list[bytes], t_kill: float) -> tuple[float, int]:
    """Wait until ``survivor`` leads and answers complete=true (it rebuilt its index from
    the nodes' inventories); returns (seconds since the kill, its term)."""
    with MasterClient(both, timeout_s=2) as m:
        def new_leader_complete() -> bool:
            try:
                _, complete = m.lookup_prefix(namespace.id, a_keys[:1])
            except Exception as exc:  # noqa: BLE001 (no leader yet)
                assert type(exc).__name__ in ("Unavailable", "NotLeader", "DeadlineExceeded"), exc
                return False
            return complete and m.address == survivor.address
        _wait("the other master leads and answers complete=true", new_leader_complete)
        return time.monotonic() - t_kill, m.fence.term


def _check(b: list[dict[str, Any]], prompts: list[list[int]],
           answers: dict[int, dict[str, Any]], workdir: Path, facts: dict[str, Any],
           wall_s: float) -> None:
    """B's results against R's answers and the TTFTs (node b's copies were removed before
    the requests after the failover; the surviving replica serves them)."""
    miss, hit, after_kill = b[0], b[1], b[3]
    scheduler = engine_stats(workdir / "engine-b" / "stats", "scheduler")
    worker = engine_stats(workdir / "engine-b" / "stats", "worker")
    answered = [s for s in b if s["token_ids"]]
    summary = {
        **facts,
        "prompt_tokens": [s["prompt_tokens"] for s in b],
        "cached_tokens": [s["num_cached_tokens"] for s in b],
        "ttft_miss_s": round(miss["wall_s"], 3), "ttft_hit_s": round(hit["wall_s"], 3),
        "requests": len(b), "answered": len(answered),
        "blocks_loaded": worker["blocks_loaded"], "load_errors": worker["load_errors"],
        "lookup_s_max": round(scheduler["lookup_s_max"], 3),
        "lookup_errors": scheduler["lookup_errors"], "wall_s": round(wall_s, 1),
    }
    print("whole-system result: " + json.dumps(summary), flush=True)

    assert len(b) == len(answered) == 5, summary  # every request answered
    assert miss["num_cached_tokens"] == 0, summary
    shared_blocks = (hit["prompt_tokens"] - 1) // BLOCK_TOKENS
    assert hit["num_cached_tokens"] == shared_blocks * BLOCK_TOKENS, summary  # loaded whole
    assert hit["wall_s"] < miss["wall_s"], summary
    assert worker["load_errors"] == 0, worker  # no load failed, the one the kills cut included
    common = _common_blocks(prompts[P_SHARED_Q1], prompts[P_SHARED_Q2])
    assert worker["blocks_loaded"] >= shared_blocks + common, worker
    assert after_kill["prefix_cache_reset"] is True, after_kill
    # one replica of every block survived the node's death: the new leader names it
    assert after_kill["num_cached_tokens"] >= common * BLOCK_TOKENS, summary
    # every answer B gave equals the no-connector engine's, token for token
    asked = [(P_SHARED_Q1, 1), (P_SHARED_Q1, 1), (P_SHARED_Q1, ANSWER_TOKENS),
             (P_SHARED_Q2, ANSWER_TOKENS), (P_SHARED_Q1, ANSWER_TOKENS)]
    for i, (step, (p, n)) in enumerate(zip(b, asked, strict=True)):
        want = answers[p]["token_ids"][:n]
        assert step["token_ids"] == want, (i, step["text"], answers[p]["text"])

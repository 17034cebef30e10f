"""The arena is mappable by the socket's group (systemd: engine user in group kvstored), and a
client that cannot map it says so once before falling back to TCP."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest
from it_helpers import NodeFactory, random_keys, value_for

from kvstored.client import Client

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IS_ROOT = os.geteuid() == 0
SHARED_GID = 100 if IS_ROOT else os.getegid()  # root: group "users", which the daemon is not in


def _share_dir_with_group(sock_dir: str) -> None:
    """The socket directory as systemd's RuntimeDirectory: group-traversable, setgid to the
    shared group, so the socket (and hence the arena) gets that group."""
    if IS_ROOT:
        os.chown(sock_dir, -1, SHARED_GID)
    os.chmod(sock_dir, 0o2750)


def test_arena_and_socket_get_the_configured_mode_and_the_sockets_group(
    start_node: NodeFactory, sock_dir: str
) -> None:
    _share_dir_with_group(sock_dir)
    node = start_node(arena_mode=0o660, socket_mode=0o660)
    sock = node.unix_address[len("unix:"):]
    arena = node.daemon.arena_path
    assert arena is not None
    st_sock, st_arena = os.stat(sock), os.stat(arena)
    assert stat.S_IMODE(st_sock.st_mode) == 0o660
    assert stat.S_IMODE(st_arena.st_mode) == 0o660
    assert st_sock.st_gid == SHARED_GID and st_arena.st_gid == SHARED_GID


def test_default_arena_mode_stays_private(start_node: NodeFactory) -> None:
    node = start_node()
    assert node.daemon.arena_path is not None
    assert stat.S_IMODE(os.stat(node.daemon.arena_path).st_mode) == 0o600


def test_explicit_arena_group_is_applied(start_node: NodeFactory) -> None:
    node = start_node(arena_mode=0o640, arena_group=str(SHARED_GID))
    assert node.daemon.arena_path is not None
    st = os.stat(node.daemon.arena_path)
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o640, SHARED_GID)


_CHILD = textwrap.dedent("""
    import sys
    from kvstored.client import Client
    key, value = bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3])
    with Client(sys.argv[1], timeout_s=20) as c:
        transport = c.describe().transport
        assert c.get([key]) == [value], "wrong bytes"
    print(transport)
""")


def _client_as_nobody(
    address: str, key: bytes, value: bytes, groups: list[int]
) -> subprocess.CompletedProcess[str]:
    """Run a client as uid/gid 65534 with ``groups``. It keeps CAP_DAC_READ_SEARCH only so that
    it can load this interpreter and checkout (which may live under a private home); opening
    the arena read-write and connecting to the socket need *write* permission, which that
    capability does not grant: those follow the file modes exactly like an engine's user."""
    group_arg = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", group_arg,
         "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
         sys.executable, "-c", _CHILD, address, key.hex(), value.hex()],
        capture_output=True, text=True, timeout=120, cwd="/",
        env={**os.environ, "PYTHONPATH": ROOT},
    )


@pytest.mark.skipif(not IS_ROOT or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run a client as another user")
def test_engine_user_in_the_sockets_group_maps_the_arena(start_node: NodeFactory, sock_dir: str) -> None:
    # systemd/kvstored-node.service: daemon as kvstored:kvstored, engine user in group kvstored
    _share_dir_with_group(sock_dir)
    node = start_node(arena_mode=0o660, socket_mode=0o660, dram_size_bytes=8 << 20)
    key = random_keys(1)[0]
    value = value_for(key, 16 << 10)  # passed as hex on the command line
    with Client(node.unix_address) as c:
        assert c.put([key], [value])[0].stored
    r = _client_as_nobody(node.unix_address, key, value, [SHARED_GID])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "shm", r.stdout
    # not in the group: cannot even connect to the socket
    r = _client_as_nobody(node.unix_address, key, value, [])
    assert r.returncode != 0 and "Unavailable" in r.stderr


_FALLBACK_CHILD = textwrap.dedent("""
    import json, sys
    from structlog.testing import capture_logs
    from kvstored.client import Client
    key, value = bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3])
    with capture_logs() as logs:
        with Client(sys.argv[1], timeout_s=20) as a, Client(sys.argv[1], timeout_s=20) as b:
            transports = [a.describe().transport, b.describe().transport]
            assert a.get([key]) == [value] and b.get([key]) == [value], "wrong bytes"
    print(json.dumps({"transports": transports, "logs": logs}, default=str))
""")


def test_client_that_cannot_map_the_arena_logs_the_fallback_once(
    start_node: NodeFactory, sock_dir: str
) -> None:
    # The systemd case before the fix: the engine may connect to the socket but the arena is
    # 0600 for the daemon's user, so it cannot be mapped and the client silently used TCP.
    _share_dir_with_group(sock_dir)
    node = start_node(socket_mode=0o660, dram_size_bytes=8 << 20)
    arena = node.daemon.arena_path
    assert arena is not None and stat.S_IMODE(os.stat(arena).st_mode) == 0o600
    key = random_keys(1)[0]
    value = value_for(key, 16 << 10)
    with Client(node.unix_address) as c:
        assert c.put([key], [value])[0].stored
    args = [sys.executable, "-c", _FALLBACK_CHILD, node.unix_address, key.hex(), value.hex()]
    if IS_ROOT:
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv to run a client as another user")
        args = ["setpriv", "--reuid=65534", "--regid=65534", f"--groups={SHARED_GID}",
                "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", *args]
    else:
        os.chmod(arena, 0)  # the owner itself may not open it now
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd="/",
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["transports"] == ["tcp", "tcp"]
    fallbacks = [e for e in out["logs"] if e["event"] == "shm_transport_fell_back"]
    assert len(fallbacks) == 1, out["logs"]  # two clients, one warning
    (event,) = fallbacks
    assert event["log_level"] == "warning" and event["transport"] == "tcp"
    assert arena in event["reason"] and "Permission denied" in event["reason"]
    assert event["address"] == node.unix_address


def test_a_file_put_at_the_arena_path_later_is_never_mapped(start_node: NodeFactory) -> None:
    """Describe reports the device/inode of the file the node mapped, not of whatever sits at
    the path now: a replaced arena file fails the client's check and it falls back to TCP,
    so it never reads (or writes) bytes that are not the node's."""
    node = start_node()
    keys = random_keys(2)
    size = 64 << 10
    with Client(node.unix_address, transport="grpc") as c:
        c.put(keys, [value_for(k, size) for k in keys])
    arena = node.daemon.arena_path
    assert arena is not None
    impostor = arena + ".impostor"
    with open(impostor, "wb") as f:
        f.truncate(os.path.getsize(arena))  # same size, all zeros
    os.rename(impostor, arena)  # the node keeps its own mapping of the old inode
    with Client(node.unix_address) as c:
        assert c.get(keys) == [value_for(k, size) for k in keys]
    with pytest.raises(Exception, match="not the node's arena"):
        Client(node.unix_address, transport="shm").get(keys)

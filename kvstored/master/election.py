"""Leader election of ``kvstored master --etcd`` processes: etcd's standard recipe, nothing more.

Every master campaigns under one prefix (``[master] election_prefix``, default ``/kvstored``)::

    campaign:  lease = LeaseGrant(election_lease_s)
               Txn(if create_revision(PFX/leader) == 0
                   then Put(PFX/leader, {addresses, name}, lease)   -> leader, term = the put's revision
                   else Get(PFX/leader))                             -> follower of that record
    leader:    LeaseKeepAlive every lease/3, each under the lease's local deadline;
               Watch(PFX/leader): deleted, or re-created by someone else -> lost
    follower:  Watch(PFX/leader) (and a Get once per lease): deleted -> campaign again

The *term* is the election key's etcd create revision: etcd's revisions only grow, so every
later leadership has a higher term than every earlier one, whoever holds it.

**Fencing by construction.** :meth:`Elector.is_leading` is true only while the lease can
still be alive in etcd: it is false from the moment a keepalive fails (error, TTL 0, the
key gone or owned by another) and, even when the loop is starved or a keepalive hangs, from
the local deadline on, which is the send time of the last acknowledged keepalive plus the
TTL etcd granted then (etcd counts the TTL from when it received that keepalive, later than
we sent it, so our deadline is never after etcd's). No other master can have been elected
before that deadline, so no two masters ever both answer as leader. A master that stops
leading revokes its lease (best effort) so that a follower takes over without waiting for
the TTL, and campaigns again (a new term if it wins).

Not thread-safe: the master's event loop only. Errors talking to etcd are logged and end the
current campaign (stepping down if it led); the loop pauses ``retry_s`` and tries the next
etcd endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from kvstored.addresses import parse_host_port
from kvstored.errors import InvalidArgument
from kvstored.transport.master_targets import (
    decode_leader_record,
    election_key,
    encode_leader_record,
)

log = structlog.get_logger(__name__)

Hook = Callable[[], Awaitable[None]]


@dataclass(slots=True)
class ElectionHooks:
    """Test hooks (None: nothing). Each is awaited at its step and may hold it or raise.

    Attributes:
        before_keepalive: before each keepalive of a leader's lease; raising fails that
            keepalive (the leader steps down at once).
        before_campaign: before each campaign's transaction.
    """

    before_keepalive: Hook | None = None
    before_campaign: Hook | None = None


class _Lost(Exception):
    """The leadership (or the follower's view of the leader) ended; the campaign restarts."""


class Elector:
    """One master's side of the election (async ``start``/``stop``; loop only).

    Args:
        endpoints: etcd client endpoints ``HOST:PORT``, tried in order.
        prefix: the election prefix (the key is ``PFX/leader``).
        name: this master's name in its leader record (logs and kvstorectl).
        addresses: ``HOST:PORT`` addresses nodes and clients reach this master on (the
            leader record; the first is the hint followers give).
        lease_s: the etcd lease's TTL, whole seconds >= 1 (etcd grants integer TTLs).
        on_lead: called with the term when this master starts leading (before
            :meth:`is_leading` turns true).
        on_step_down: called with a reason when it stops leading.
        clock: monotonic seconds (the lease's local deadline).
        retry_s: pause after a failed campaign (default a third of the lease).
        hooks: test hooks.

    Raises:
        InvalidArgument: no endpoints, a malformed endpoint or a lease below 1 s.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        prefix: str,
        *,
        name: str,
        addresses: Sequence[str],
        lease_s: float,
        on_lead: Callable[[int], None],
        on_step_down: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        retry_s: float | None = None,
        hooks: ElectionHooks | None = None,
    ) -> None:
        if not endpoints:
            raise InvalidArgument("master.etcd: give at least one etcd endpoint HOST:PORT")
        for e in endpoints:
            parse_host_port(e)
        if lease_s < 1:
            raise InvalidArgument(f"master.election_lease_s must be >= 1 s, got {lease_s}")
        self.endpoints = tuple(endpoints)
        self.key = election_key(prefix)
        self.name = name
        self.record = encode_leader_record(addresses, name)
        self.lease_ttl = int(lease_s)
        self.on_lead = on_lead
        self.on_step_down = on_step_down
        self.clock = clock
        self.retry_s = self.lease_ttl / 3 if retry_s is None else retry_s
        self.hooks = hooks or ElectionHooks()
        self.term = 0  # this master's term while it leads (else the last one it had)
        self.leader_address = ""  # the leader's first address as last seen ("" = none known)
        self.leader_term = 0  # the newest term seen (own or another's)
        self.num_terms = 0
        self._leading = False
        self._deadline = 0.0
        self._endpoint_index = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False  # set by stop(): the loop campaigns no more, whatever it was doing
        self._client: Any = None
        self._lease: Any = None
        self.lead_changed = asyncio.Event()  # set at every change of leadership (tests wait on it)

    # ---- what the servicer asks ------------------------------------------------------
    def is_leading(self) -> bool:
        """Whether this master may answer as leader now (see the module docstring)."""
        return self._leading and self.clock() < self._deadline

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        """Start campaigning (returns at once)."""
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._run(), name="kvstored-master-election")

    async def stop(self) -> None:
        """Stop campaigning; a leader steps down and revokes its lease (best effort, 1 s)."""
        self._stopping = True
        task, self._task = self._task, None
        while task is not None and not task.done():
            # Python 3.11's asyncio.wait_for can swallow a cancel that lands as its inner await
            # completes; the loop then sees _stopping at its next turn, and the cancel is re-sent
            # until the task has ended (it never starts another campaign once _stopping is set).
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()
        self._step_down("stopping")
        await self._revoke()
        await self._close_client()

    # ---- the loop --------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._campaign_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every etcd client error (and _Lost) ends this campaign
                self._step_down(f"{type(exc).__name__}: {exc}")
                if not isinstance(exc, _Lost):
                    log.warning("election_etcd_failed", endpoint=self._endpoint(),
                                error=f"{type(exc).__name__}: {exc}")
                    await self._close_client()
                    self._endpoint_index += 1
                await self._revoke()
                await asyncio.sleep(self.retry_s)

    def _endpoint(self) -> str:
        return self.endpoints[self._endpoint_index % len(self.endpoints)]

    async def _connect(self) -> Any:
        import aetcd  # type: ignore[import-untyped]  # aetcd ships no type information

        if self._client is None:
            host, port = parse_host_port(self._endpoint())
            client = aetcd.Client(host=host, port=port, timeout=self.lease_ttl)
            await asyncio.wait_for(client.connect(), self.lease_ttl)
            self._client = client
        return self._client

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 1.0)

    async def _revoke(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None and self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(lease.revoke(), 1.0)

    async def _campaign_once(self) -> None:
        client = await self._connect()
        if self.hooks.before_campaign is not None:
            await self.hooks.before_campaign()
        sent = self.clock()
        lease = await client.lease(self.lease_ttl)
        self._lease = lease
        tx = client.transactions
        ok, responses = await client.transaction(
            compare=[tx.create(self.key) == 0],
            success=[tx.put(self.key, self.record, lease=lease)],
            failure=[tx.get(self.key)],
        )
        if ok:
            term = int(responses[0].response_put.header.revision)
            self._lead(term, deadline=sent + lease.ttl)
            await self._keep_leading(client, lease, term)
            return
        await self._revoke()  # not needed: the key is someone else's
        got = responses[0][0][1] if responses and responses[0] else None
        if got is None:  # deleted between compare and get: campaign again at once
            return
        self._follow(got.value, int(got.create_revision))
        await self._wait_gone(client, int(got.create_revision), int(got.mod_revision))

    def _lead(self, term: int, *, deadline: float) -> None:
        self.term = term
        self.leader_term = max(self.leader_term, term)
        own = decode_leader_record(self.record)
        self.leader_address = own[0] if own else ""
        self.num_terms += 1
        self.on_lead(term)
        self._deadline = deadline
        self._leading = True
        self.lead_changed.set()
        log.info("election_won", term=term, name=self.name, lease_s=self.lease_ttl)

    def _follow(self, record: bytes, term: int) -> None:
        addresses = decode_leader_record(record)
        changed = term != self.leader_term or not self.leader_address
        self.leader_address = addresses[0] if addresses else ""
        self.leader_term = max(self.leader_term, term)
        if changed:
            self.lead_changed.set()
            log.info("election_following", leader=self.leader_address, term=term)

    def _step_down(self, reason: str) -> None:
        if self._leading:
            self._leading = False
            self.leader_address = ""
            self.lead_changed.set()
            log.warning("election_stepped_down", term=self.term, reason=reason)
            self.on_step_down(reason)

    async def _keep_leading(self, client: Any, lease: Any, term: int) -> None:
        watch = await client.watch(self.key, start_revision=term + 1)
        watcher = asyncio.create_task(self._watch_own(watch, term), name="kvstored-election-watch")
        try:
            while True:
                if watcher.done():
                    watcher.result()  # raises _Lost (or the watch's error)
                    raise _Lost("election key watch ended")
                if self.hooks.before_keepalive is not None:
                    await self.hooks.before_keepalive()
                sent = self.clock()
                left = self._deadline - sent
                if left <= 0:
                    raise _Lost("lease deadline passed before a keepalive answered")
                try:
                    reply = await asyncio.wait_for(lease.refresh(), left)
                except TimeoutError:
                    raise _Lost("keepalive did not answer before the lease's deadline") from None
                if reply is None or reply.TTL <= 0:
                    raise _Lost("lease expired in etcd")
                self._deadline = sent + reply.TTL
                await asyncio.wait([watcher], timeout=self.lease_ttl / 3)
        except asyncio.CancelledError:
            self._step_down("stopping")
            raise
        except Exception as exc:
            self._step_down(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
            with contextlib.suppress(Exception):
                await asyncio.wait_for(watch.cancel(), 1.0)

    async def _watch_own(self, watch: Any, term: int) -> None:
        async for event in watch:
            if event.kind == "DELETE" or int(event.kv.create_revision) != term:
                self._step_down(f"election key {event.kind.lower()}d by another")
                raise _Lost("election key gone")
        raise _Lost("election key watch ended")

    async def _wait_gone(self, client: Any, term: int, mod_revision: int) -> None:
        """Follow until the leader's key is deleted (watch, and a Get once per lease)."""
        watch = await client.watch(self.key, start_revision=mod_revision + 1)

        async def deleted() -> None:
            async for event in watch:
                if event.kind == "DELETE":
                    return
                if int(event.kv.create_revision) != term:  # a new leader in between
                    return

        waiter = asyncio.create_task(deleted(), name="kvstored-election-follow")
        try:
            while not waiter.done():
                await asyncio.wait([waiter], timeout=self.lease_ttl)
                if waiter.done():
                    waiter.result()
                    return
                got = await client.get(self.key)
                if got is None or int(got.create_revision) != term:
                    return
        finally:
            waiter.cancel()
            with contextlib.suppress(BaseException):
                await waiter
            with contextlib.suppress(Exception):
                await asyncio.wait_for(watch.cancel(), 1.0)

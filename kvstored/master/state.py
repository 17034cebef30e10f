"""MasterState: everything one master term owns, built together in one place.

A *term* is the span during which one master process leads: one start of
``kvstored master`` (under leader election, one leadership). The master keeps no block
metadata on disk, so a term starts empty and is rebuilt from the nodes' inventories (they
re-register and resync when their heartbeats are answered REREGISTER)::

    MasterState(epoch E)     generations from E   (E > every earlier term's epoch)
        index                BlockIndex: (namespace id, block hash) -> replicas
        membership           nodes, leases, health; owns the index's holders
        placement            two-phase puts over the membership
        repair               replication factors, repair, drain, hot blocks (commands to
                             nodes through membership.commands)

A new term builds a fresh MasterState and swaps it in whole
(:meth:`MasterServicer.set_state <kvstored.master.service.MasterServicer.set_state>`);
nothing of an earlier term's state is carried over, so no answer mixes two terms. The
parts hold each other (placement holds the membership, the membership the index): use
them through one MasterState, never keep one past its term.

Not thread-safe: the master's event loop only.
"""

from __future__ import annotations

import random

from kvstored.clock import Clock
from kvstored.config import MasterConfig
from kvstored.master.generations import Generations
from kvstored.master.index import BlockIndex
from kvstored.master.membership import Membership
from kvstored.master.observed import IndexObserver, ObservedBlockIndex
from kvstored.master.placement import Placement
from kvstored.master.repair import Repair, RepairSettings
from kvstored.master.types import PlacementPolicy


class MasterState:
    """The block index, membership and placement of one master term.

    Args:
        epoch: the term's epoch (ns since the Unix epoch for a daemon start; any positive
            int in tests), reported to nodes and kvstorectl.
        clock: monotonic seconds for leases (:class:`~kvstored.clock.FakeClock` in tests).
        node_lease_s / unhealthy_after_failures / unhealthy_retry_s / unhealthy_retry_max_s
            / rejoin_grace_s: the membership's (:class:`~kvstored.master.membership.Membership`).
        policy / write_lease_s / rng: placement's (:class:`~kvstored.master.placement.Placement`).
        initial_blocks: block slots and replica rows the index allocates up front.
        repair: the repair's rate and hot-block settings (defaults if None).
        command_resend_s: an unacknowledged command is sent again after this long (None:
            one node lease).
        first_generation: the first write generation (None: ``epoch``, so generations
            increase across terms whose epochs do).
        term: the term every answer carries (None: ``epoch``, a master without election;
            under etcd the election key's create revision, kvstored/master/election.py).
        observer: hears every change of the visible replicas (the KV-event publisher,
            kvstored/master/events.py); None = a plain index.

    Raises:
        InvalidArgument: a setting out of range (named by the part that refused it), or a
            first generation outside (0, 2**63).
    """

    def __init__(
        self,
        *,
        epoch: int,
        clock: Clock,
        node_lease_s: float = 10.0,
        unhealthy_after_failures: int = 3,
        unhealthy_retry_s: float | None = None,
        unhealthy_retry_max_s: float | None = None,
        rejoin_grace_s: float = 0.0,
        policy: PlacementPolicy = PlacementPolicy.LOCAL_FIRST,
        write_lease_s: float = 30.0,
        rng: random.Random | None = None,
        initial_blocks: int = 1024,
        first_generation: int | None = None,
        repair: RepairSettings | None = None,
        command_resend_s: float | None = None,
        term: int | None = None,
        observer: IndexObserver | None = None,
    ) -> None:
        self.epoch = int(epoch)
        self.term = self.epoch if term is None else int(term)
        self.clock = clock
        self.index = (BlockIndex(initial_blocks) if observer is None
                      else ObservedBlockIndex(observer, initial_blocks))
        self.generations = Generations(self.epoch if first_generation is None
                                       else first_generation)
        self.membership = Membership(
            self.index, clock, self.generations, node_lease_s=node_lease_s,
            unhealthy_after_failures=unhealthy_after_failures,
            unhealthy_retry_s=unhealthy_retry_s, unhealthy_retry_max_s=unhealthy_retry_max_s,
            rejoin_grace_s=rejoin_grace_s,
        )
        self.placement = Placement(self.membership, policy=policy, write_lease_s=write_lease_s,
                                   rng=rng)
        if command_resend_s:
            self.membership.commands.resend_after_s = float(command_resend_s)
        self.commands = self.membership.commands
        self.commands.term = lambda: self.term  # every command carries this term's number
        self.repair = Repair(self.membership, self.placement, self.commands, repair)
        self.membership.on_left.append(self.repair.on_node_left)

    @classmethod
    def from_config(cls, cfg: MasterConfig, clock: Clock, *, epoch: int,
                    restarted: bool, term: int | None = None,
                    observer: IndexObserver | None = None) -> MasterState:
        """The state of a term started from the master's settings.

        Args:
            cfg: the master's settings (validated).
            clock: monotonic seconds for leases.
            epoch: this term's epoch (the daemon's :func:`~kvstored.master.daemon.next_master_epoch`).
            restarted: an earlier term ran (its nodes may yet come back): lookups say
                ``complete=false`` for one node lease.
            term: the term answers carry (None: ``epoch``).
            observer: as the constructor's.
        """
        return cls(
            epoch=epoch, clock=clock, node_lease_s=cfg.node_lease_s,
            unhealthy_after_failures=cfg.unhealthy_after_failures,
            unhealthy_retry_s=cfg.unhealthy_retry_s or None,  # 0: one node lease
            unhealthy_retry_max_s=cfg.unhealthy_retry_max_s or None,
            rejoin_grace_s=cfg.node_lease_s if restarted else 0.0,
            policy=PlacementPolicy(cfg.placement_policy), write_lease_s=cfg.write_lease_s,
            repair=RepairSettings(repair_bytes_per_s=cfg.repair_bytes_per_s,
                                  hot_reads_per_window=cfg.hot_reads_per_window,
                                  hot_window_s=cfg.hot_window_s,
                                  hot_max_extra_replicas=cfg.hot_max_extra_replicas),
            command_resend_s=cfg.command_resend_s or None,
            term=term, observer=observer,
        )

    def node_of_holder(self, holder: int) -> str | None:
        """The node id owning a holder of this term's index (None once retired)."""
        rec = self.membership.record_of_holder(holder)
        return rec.spec.node_id if rec is not None else None

    def maintain(self, max_gc_rows: int) -> tuple[list[str], int, int]:
        """One maintenance step of the term: expire lapsed node leases, abort lapsed writes,
        one repair tick (copy commands for blocks short of replicas, drains, hot blocks),
        unlink up to ``max_gc_rows`` rows of retired holders (queueing promotions).

        Returns:
            (node ids expired, writes aborted, replica rows unlinked).
        """
        gone = self.membership.expire_lapsed()
        aborted = self.placement.reclaim_expired_writes()
        self.repair.tick()
        unlinked = self.membership.collect_garbage(max_gc_rows)
        return gone, aborted, unlinked

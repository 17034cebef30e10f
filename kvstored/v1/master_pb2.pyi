from kvstored.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_ACTION_UNSPECIFIED: _ClassVar[NodeAction]
    NODE_ACTION_REREGISTER: _ClassVar[NodeAction]
    NODE_ACTION_RESYNC: _ClassVar[NodeAction]

class NodeHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_HEALTH_UNSPECIFIED: _ClassVar[NodeHealth]
    NODE_HEALTH_HEALTHY: _ClassVar[NodeHealth]
    NODE_HEALTH_UNHEALTHY: _ClassVar[NodeHealth]
    NODE_HEALTH_SYNCING: _ClassVar[NodeHealth]

class ReplicaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_STATE_UNSPECIFIED: _ClassVar[ReplicaState]
    REPLICA_STATE_WRITING: _ClassVar[ReplicaState]
    REPLICA_STATE_COMMITTED: _ClassVar[ReplicaState]

class PlacementPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLACEMENT_POLICY_UNSPECIFIED: _ClassVar[PlacementPolicy]
    PLACEMENT_POLICY_LOCAL_FIRST: _ClassVar[PlacementPolicy]
    PLACEMENT_POLICY_MOST_FREE: _ClassVar[PlacementPolicy]
    PLACEMENT_POLICY_RANDOM: _ClassVar[PlacementPolicy]

class NodeCommandKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_COMMAND_KIND_UNSPECIFIED: _ClassVar[NodeCommandKind]
    NODE_COMMAND_KIND_COPY: _ClassVar[NodeCommandKind]
    NODE_COMMAND_KIND_PROMOTE: _ClassVar[NodeCommandKind]
    NODE_COMMAND_KIND_DROP: _ClassVar[NodeCommandKind]
    NODE_COMMAND_KIND_LEAVE: _ClassVar[NodeCommandKind]
    NODE_COMMAND_KIND_PEER_LEFT: _ClassVar[NodeCommandKind]

class BlockEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BLOCK_EVENT_KIND_UNSPECIFIED: _ClassVar[BlockEventKind]
    BLOCK_EVENT_KIND_ADDED: _ClassVar[BlockEventKind]
    BLOCK_EVENT_KIND_REMOVED: _ClassVar[BlockEventKind]

class PutStartOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUT_START_OUTCOME_UNSPECIFIED: _ClassVar[PutStartOutcome]
    PUT_START_OUTCOME_PLACED: _ClassVar[PutStartOutcome]
    PUT_START_OUTCOME_EXISTS: _ClassVar[PutStartOutcome]
    PUT_START_OUTCOME_NO_CAPACITY: _ClassVar[PutStartOutcome]
    PUT_START_OUTCOME_ERROR: _ClassVar[PutStartOutcome]
NODE_ACTION_UNSPECIFIED: NodeAction
NODE_ACTION_REREGISTER: NodeAction
NODE_ACTION_RESYNC: NodeAction
NODE_HEALTH_UNSPECIFIED: NodeHealth
NODE_HEALTH_HEALTHY: NodeHealth
NODE_HEALTH_UNHEALTHY: NodeHealth
NODE_HEALTH_SYNCING: NodeHealth
REPLICA_STATE_UNSPECIFIED: ReplicaState
REPLICA_STATE_WRITING: ReplicaState
REPLICA_STATE_COMMITTED: ReplicaState
PLACEMENT_POLICY_UNSPECIFIED: PlacementPolicy
PLACEMENT_POLICY_LOCAL_FIRST: PlacementPolicy
PLACEMENT_POLICY_MOST_FREE: PlacementPolicy
PLACEMENT_POLICY_RANDOM: PlacementPolicy
NODE_COMMAND_KIND_UNSPECIFIED: NodeCommandKind
NODE_COMMAND_KIND_COPY: NodeCommandKind
NODE_COMMAND_KIND_PROMOTE: NodeCommandKind
NODE_COMMAND_KIND_DROP: NodeCommandKind
NODE_COMMAND_KIND_LEAVE: NodeCommandKind
NODE_COMMAND_KIND_PEER_LEFT: NodeCommandKind
BLOCK_EVENT_KIND_UNSPECIFIED: BlockEventKind
BLOCK_EVENT_KIND_ADDED: BlockEventKind
BLOCK_EVENT_KIND_REMOVED: BlockEventKind
PUT_START_OUTCOME_UNSPECIFIED: PutStartOutcome
PUT_START_OUTCOME_PLACED: PutStartOutcome
PUT_START_OUTCOME_EXISTS: PutStartOutcome
PUT_START_OUTCOME_NO_CAPACITY: PutStartOutcome
PUT_START_OUTCOME_ERROR: PutStartOutcome

class TierCapacity(_message.Message):
    __slots__ = ("tier", "capacity_bytes", "used_bytes", "num_blocks", "spare_bytes")
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SPARE_BYTES_FIELD_NUMBER: _ClassVar[int]
    tier: _common_pb2.Tier
    capacity_bytes: int
    used_bytes: int
    num_blocks: int
    spare_bytes: int
    def __init__(self, tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., num_blocks: _Optional[int] = ..., spare_bytes: _Optional[int] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "epoch", "grpc_address", "data_address", "tiers", "transports", "zone")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    grpc_address: str
    data_address: str
    tiers: _containers.RepeatedCompositeFieldContainer[TierCapacity]
    transports: _containers.RepeatedScalarFieldContainer[str]
    zone: str
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., grpc_address: _Optional[str] = ..., data_address: _Optional[str] = ..., tiers: _Optional[_Iterable[_Union[TierCapacity, _Mapping]]] = ..., transports: _Optional[_Iterable[str]] = ..., zone: _Optional[str] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: NodeInfo
    def __init__(self, node: _Optional[_Union[NodeInfo, _Mapping]] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("node_lease_ms", "master_epoch", "superseded_epoch", "term", "announces_departures", "heartbeat_carries_events")
    NODE_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    ANNOUNCES_DEPARTURES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_CARRIES_EVENTS_FIELD_NUMBER: _ClassVar[int]
    node_lease_ms: int
    master_epoch: int
    superseded_epoch: bool
    term: int
    announces_departures: bool
    heartbeat_carries_events: bool
    def __init__(self, node_lease_ms: _Optional[int] = ..., master_epoch: _Optional[int] = ..., superseded_epoch: _Optional[bool] = ..., term: _Optional[int] = ..., announces_departures: _Optional[bool] = ..., heartbeat_carries_events: _Optional[bool] = ...) -> None: ...

class UnregisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "epoch")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class UnregisterNodeResponse(_message.Message):
    __slots__ = ("term",)
    TERM_FIELD_NUMBER: _ClassVar[int]
    term: int
    def __init__(self, term: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "epoch", "tiers", "load", "last_seq", "coldest_age_ms", "events", "acked_command_ids")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    COLDEST_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ACKED_COMMAND_IDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierCapacity]
    load: float
    last_seq: int
    coldest_age_ms: int
    events: _containers.RepeatedCompositeFieldContainer[BlockEvent]
    acked_command_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierCapacity, _Mapping]]] = ..., load: _Optional[float] = ..., last_seq: _Optional[int] = ..., coldest_age_ms: _Optional[int] = ..., events: _Optional[_Iterable[_Union[BlockEvent, _Mapping]]] = ..., acked_command_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("action", "node_lease_ms", "applied_seq", "promote_copies", "commands", "term")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    NODE_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQ_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_COPIES_FIELD_NUMBER: _ClassVar[int]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    action: NodeAction
    node_lease_ms: int
    applied_seq: int
    promote_copies: _containers.RepeatedCompositeFieldContainer[BlockKey]
    commands: _containers.RepeatedCompositeFieldContainer[NodeCommand]
    term: int
    def __init__(self, action: _Optional[_Union[NodeAction, str]] = ..., node_lease_ms: _Optional[int] = ..., applied_seq: _Optional[int] = ..., promote_copies: _Optional[_Iterable[_Union[BlockKey, _Mapping]]] = ..., commands: _Optional[_Iterable[_Union[NodeCommand, _Mapping]]] = ..., term: _Optional[int] = ...) -> None: ...

class NodeCommand(_message.Message):
    __slots__ = ("command_id", "kind", "target_epoch", "term", "namespace_id", "key", "source_node_id", "source_epoch", "source_data_address", "size_bytes", "generation")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TARGET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    command_id: int
    kind: NodeCommandKind
    target_epoch: int
    term: int
    namespace_id: bytes
    key: bytes
    source_node_id: str
    source_epoch: int
    source_data_address: str
    size_bytes: int
    generation: int
    def __init__(self, command_id: _Optional[int] = ..., kind: _Optional[_Union[NodeCommandKind, str]] = ..., target_epoch: _Optional[int] = ..., term: _Optional[int] = ..., namespace_id: _Optional[bytes] = ..., key: _Optional[bytes] = ..., source_node_id: _Optional[str] = ..., source_epoch: _Optional[int] = ..., source_data_address: _Optional[str] = ..., size_bytes: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class WaitCommandsRequest(_message.Message):
    __slots__ = ("node_id", "epoch", "acked_command_ids", "wait_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACKED_COMMAND_IDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    acked_command_ids: _containers.RepeatedScalarFieldContainer[int]
    wait_ms: int
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., acked_command_ids: _Optional[_Iterable[int]] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class WaitCommandsResponse(_message.Message):
    __slots__ = ("commands", "term")
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[NodeCommand]
    term: int
    def __init__(self, commands: _Optional[_Iterable[_Union[NodeCommand, _Mapping]]] = ..., term: _Optional[int] = ...) -> None: ...

class BlockRef(_message.Message):
    __slots__ = ("namespace_id", "key", "tier", "size_bytes", "generation", "copy", "replicas")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    COPY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    key: bytes
    tier: _common_pb2.Tier
    size_bytes: int
    generation: int
    copy: bool
    replicas: int
    def __init__(self, namespace_id: _Optional[bytes] = ..., key: _Optional[bytes] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., size_bytes: _Optional[int] = ..., generation: _Optional[int] = ..., copy: _Optional[bool] = ..., replicas: _Optional[int] = ...) -> None: ...

class SyncInventoryRequest(_message.Message):
    __slots__ = ("node_id", "epoch", "sync_id", "blocks", "last_chunk", "seq")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHUNK_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    sync_id: int
    blocks: _containers.RepeatedCompositeFieldContainer[BlockRef]
    last_chunk: bool
    seq: int
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., sync_id: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[BlockRef, _Mapping]]] = ..., last_chunk: _Optional[bool] = ..., seq: _Optional[int] = ...) -> None: ...

class SyncInventoryResponse(_message.Message):
    __slots__ = ("action", "num_replicas", "term")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    action: NodeAction
    num_replicas: int
    term: int
    def __init__(self, action: _Optional[_Union[NodeAction, str]] = ..., num_replicas: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class BlockEvent(_message.Message):
    __slots__ = ("seq", "kind", "block")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    seq: int
    kind: BlockEventKind
    block: BlockRef
    def __init__(self, seq: _Optional[int] = ..., kind: _Optional[_Union[BlockEventKind, str]] = ..., block: _Optional[_Union[BlockRef, _Mapping]] = ...) -> None: ...

class ReportEventsRequest(_message.Message):
    __slots__ = ("node_id", "epoch", "events")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    events: _containers.RepeatedCompositeFieldContainer[BlockEvent]
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., events: _Optional[_Iterable[_Union[BlockEvent, _Mapping]]] = ...) -> None: ...

class ReportEventsResponse(_message.Message):
    __slots__ = ("action", "applied_seq", "term")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQ_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    action: NodeAction
    applied_seq: int
    term: int
    def __init__(self, action: _Optional[_Union[NodeAction, str]] = ..., applied_seq: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class ReportTransferRequest(_message.Message):
    __slots__ = ("node_id", "epoch", "ok", "reporter_node_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    REPORTER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    ok: bool
    reporter_node_id: str
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., ok: _Optional[bool] = ..., reporter_node_id: _Optional[str] = ...) -> None: ...

class ReportTransferResponse(_message.Message):
    __slots__ = ("health", "term")
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    health: NodeHealth
    term: int
    def __init__(self, health: _Optional[_Union[NodeHealth, str]] = ..., term: _Optional[int] = ...) -> None: ...

class ReplicaRef(_message.Message):
    __slots__ = ("node_id", "epoch", "tier", "size_bytes", "generation", "data_address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    tier: _common_pb2.Tier
    size_bytes: int
    generation: int
    data_address: str
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., size_bytes: _Optional[int] = ..., generation: _Optional[int] = ..., data_address: _Optional[str] = ...) -> None: ...

class MasterLookupPrefixRequest(_message.Message):
    __slots__ = ("namespace_id", "keys", "local_node_id", "every_key", "avoid_node_ids", "max_alternates")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EVERY_KEY_FIELD_NUMBER: _ClassVar[int]
    AVOID_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_ALTERNATES_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    local_node_id: str
    every_key: bool
    avoid_node_ids: _containers.RepeatedScalarFieldContainer[str]
    max_alternates: int
    def __init__(self, namespace_id: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., local_node_id: _Optional[str] = ..., every_key: _Optional[bool] = ..., avoid_node_ids: _Optional[_Iterable[str]] = ..., max_alternates: _Optional[int] = ...) -> None: ...

class MasterLookupPrefixResponse(_message.Message):
    __slots__ = ("nodes", "node_index", "tier", "size_bytes", "generation", "complete", "key_index", "every_key", "term", "num_alternates", "alternate_node_index", "alternate_tier", "alternate_size_bytes", "alternate_generation")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    KEY_INDEX_FIELD_NUMBER: _ClassVar[int]
    EVERY_KEY_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NUM_ALTERNATES_FIELD_NUMBER: _ClassVar[int]
    ALTERNATE_NODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ALTERNATE_TIER_FIELD_NUMBER: _ClassVar[int]
    ALTERNATE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALTERNATE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[ReplicaNode]
    node_index: _containers.RepeatedScalarFieldContainer[int]
    tier: _containers.RepeatedScalarFieldContainer[_common_pb2.Tier]
    size_bytes: _containers.RepeatedScalarFieldContainer[int]
    generation: _containers.RepeatedScalarFieldContainer[int]
    complete: bool
    key_index: _containers.RepeatedScalarFieldContainer[int]
    every_key: bool
    term: int
    num_alternates: _containers.RepeatedScalarFieldContainer[int]
    alternate_node_index: _containers.RepeatedScalarFieldContainer[int]
    alternate_tier: _containers.RepeatedScalarFieldContainer[_common_pb2.Tier]
    alternate_size_bytes: _containers.RepeatedScalarFieldContainer[int]
    alternate_generation: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, nodes: _Optional[_Iterable[_Union[ReplicaNode, _Mapping]]] = ..., node_index: _Optional[_Iterable[int]] = ..., tier: _Optional[_Iterable[_Union[_common_pb2.Tier, str]]] = ..., size_bytes: _Optional[_Iterable[int]] = ..., generation: _Optional[_Iterable[int]] = ..., complete: _Optional[bool] = ..., key_index: _Optional[_Iterable[int]] = ..., every_key: _Optional[bool] = ..., term: _Optional[int] = ..., num_alternates: _Optional[_Iterable[int]] = ..., alternate_node_index: _Optional[_Iterable[int]] = ..., alternate_tier: _Optional[_Iterable[_Union[_common_pb2.Tier, str]]] = ..., alternate_size_bytes: _Optional[_Iterable[int]] = ..., alternate_generation: _Optional[_Iterable[int]] = ...) -> None: ...

class ReplicaNode(_message.Message):
    __slots__ = ("node_id", "epoch", "data_address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    data_address: str
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., data_address: _Optional[str] = ...) -> None: ...

class PutStartRequest(_message.Message):
    __slots__ = ("namespace_id", "key", "size_bytes", "writer_node_id", "num_replicas", "policy", "exclude_writer", "max_used_fraction", "headroom_bytes", "holder_reports", "replicas")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WRITER_FIELD_NUMBER: _ClassVar[int]
    MAX_USED_FRACTION_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOLDER_REPORTS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    key: bytes
    size_bytes: int
    writer_node_id: str
    num_replicas: int
    policy: PlacementPolicy
    exclude_writer: bool
    max_used_fraction: float
    headroom_bytes: int
    holder_reports: bool
    replicas: int
    def __init__(self, namespace_id: _Optional[bytes] = ..., key: _Optional[bytes] = ..., size_bytes: _Optional[int] = ..., writer_node_id: _Optional[str] = ..., num_replicas: _Optional[int] = ..., policy: _Optional[_Union[PlacementPolicy, str]] = ..., exclude_writer: _Optional[bool] = ..., max_used_fraction: _Optional[float] = ..., headroom_bytes: _Optional[int] = ..., holder_reports: _Optional[bool] = ..., replicas: _Optional[int] = ...) -> None: ...

class PutStartResponse(_message.Message):
    __slots__ = ("exists", "generation", "replicas", "term")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    generation: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaRef]
    term: int
    def __init__(self, exists: _Optional[bool] = ..., generation: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaRef, _Mapping]]] = ..., term: _Optional[int] = ...) -> None: ...

class PutEndRequest(_message.Message):
    __slots__ = ("namespace_id", "key", "generation", "commit")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    key: bytes
    generation: int
    commit: bool
    def __init__(self, namespace_id: _Optional[bytes] = ..., key: _Optional[bytes] = ..., generation: _Optional[int] = ..., commit: _Optional[bool] = ...) -> None: ...

class PutEndResponse(_message.Message):
    __slots__ = ("num_replicas", "term")
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    num_replicas: int
    term: int
    def __init__(self, num_replicas: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node", "health", "load", "num_replicas", "lease_left_s", "last_seq", "probation", "draining", "coldest_age_s")
    NODE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEASE_LEFT_S_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    PROBATION_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    COLDEST_AGE_S_FIELD_NUMBER: _ClassVar[int]
    node: NodeInfo
    health: NodeHealth
    load: float
    num_replicas: int
    lease_left_s: float
    last_seq: int
    probation: bool
    draining: bool
    coldest_age_s: float
    def __init__(self, node: _Optional[_Union[NodeInfo, _Mapping]] = ..., health: _Optional[_Union[NodeHealth, str]] = ..., load: _Optional[float] = ..., num_replicas: _Optional[int] = ..., lease_left_s: _Optional[float] = ..., last_seq: _Optional[int] = ..., probation: _Optional[bool] = ..., draining: _Optional[bool] = ..., coldest_age_s: _Optional[float] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "master_epoch", "num_replicas", "departed", "term")
    NODES_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DEPARTED_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    master_epoch: int
    num_replicas: int
    departed: _containers.RepeatedCompositeFieldContainer[DepartedNode]
    term: int
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., master_epoch: _Optional[int] = ..., num_replicas: _Optional[int] = ..., departed: _Optional[_Iterable[_Union[DepartedNode, _Mapping]]] = ..., term: _Optional[int] = ...) -> None: ...

class DepartedNode(_message.Message):
    __slots__ = ("node", "reason", "departed_s_ago", "num_replicas")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEPARTED_S_AGO_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    node: NodeInfo
    reason: str
    departed_s_ago: float
    num_replicas: int
    def __init__(self, node: _Optional[_Union[NodeInfo, _Mapping]] = ..., reason: _Optional[str] = ..., departed_s_ago: _Optional[float] = ..., num_replicas: _Optional[int] = ...) -> None: ...

class ListReplicasRequest(_message.Message):
    __slots__ = ("namespace_id", "keys")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace_id: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ReplicaDetail(_message.Message):
    __slots__ = ("node_id", "epoch", "tier", "size_bytes", "generation", "state", "readable", "grpc_address", "data_address", "copy")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    READABLE_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    COPY_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    tier: _common_pb2.Tier
    size_bytes: int
    generation: int
    state: ReplicaState
    readable: bool
    grpc_address: str
    data_address: str
    copy: bool
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., size_bytes: _Optional[int] = ..., generation: _Optional[int] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., readable: _Optional[bool] = ..., grpc_address: _Optional[str] = ..., data_address: _Optional[str] = ..., copy: _Optional[bool] = ...) -> None: ...

class BlockReplicas(_message.Message):
    __slots__ = ("key", "replicas", "replication_factor")
    KEY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaDetail]
    replication_factor: int
    def __init__(self, key: _Optional[bytes] = ..., replicas: _Optional[_Iterable[_Union[ReplicaDetail, _Mapping]]] = ..., replication_factor: _Optional[int] = ...) -> None: ...

class ListReplicasResponse(_message.Message):
    __slots__ = ("blocks", "complete", "term")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockReplicas]
    complete: bool
    term: int
    def __init__(self, blocks: _Optional[_Iterable[_Union[BlockReplicas, _Mapping]]] = ..., complete: _Optional[bool] = ..., term: _Optional[int] = ...) -> None: ...

class ListNodeBlocksRequest(_message.Message):
    __slots__ = ("node_id", "any_namespace", "namespace_id", "limit", "page_token")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ANY_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    any_namespace: bool
    namespace_id: bytes
    limit: int
    page_token: bytes
    def __init__(self, node_id: _Optional[str] = ..., any_namespace: _Optional[bool] = ..., namespace_id: _Optional[bytes] = ..., limit: _Optional[int] = ..., page_token: _Optional[bytes] = ...) -> None: ...

class NodeBlockEntry(_message.Message):
    __slots__ = ("namespace_id", "key", "tier", "size_bytes", "generation", "state", "copy")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    COPY_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    key: bytes
    tier: _common_pb2.Tier
    size_bytes: int
    generation: int
    state: ReplicaState
    copy: bool
    def __init__(self, namespace_id: _Optional[bytes] = ..., key: _Optional[bytes] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., size_bytes: _Optional[int] = ..., generation: _Optional[int] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., copy: _Optional[bool] = ...) -> None: ...

class ListNodeBlocksResponse(_message.Message):
    __slots__ = ("blocks", "next_page_token", "epoch", "num_replicas", "term")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[NodeBlockEntry]
    next_page_token: bytes
    epoch: int
    num_replicas: int
    term: int
    def __init__(self, blocks: _Optional[_Iterable[_Union[NodeBlockEntry, _Mapping]]] = ..., next_page_token: _Optional[bytes] = ..., epoch: _Optional[int] = ..., num_replicas: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class PutStartItem(_message.Message):
    __slots__ = ("namespace_id", "key", "size_bytes", "replicas")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    key: bytes
    size_bytes: int
    replicas: int
    def __init__(self, namespace_id: _Optional[bytes] = ..., key: _Optional[bytes] = ..., size_bytes: _Optional[int] = ..., replicas: _Optional[int] = ...) -> None: ...

class PutStartBatchRequest(_message.Message):
    __slots__ = ("items", "writer_node_id", "num_replicas", "policy", "exclude_writer", "max_used_fraction", "headroom_bytes", "holder_reports", "top_up", "ends")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    WRITER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WRITER_FIELD_NUMBER: _ClassVar[int]
    MAX_USED_FRACTION_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOLDER_REPORTS_FIELD_NUMBER: _ClassVar[int]
    TOP_UP_FIELD_NUMBER: _ClassVar[int]
    ENDS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PutStartItem]
    writer_node_id: str
    num_replicas: int
    policy: PlacementPolicy
    exclude_writer: bool
    max_used_fraction: float
    headroom_bytes: int
    holder_reports: bool
    top_up: bool
    ends: _containers.RepeatedCompositeFieldContainer[PutEndRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[PutStartItem, _Mapping]]] = ..., writer_node_id: _Optional[str] = ..., num_replicas: _Optional[int] = ..., policy: _Optional[_Union[PlacementPolicy, str]] = ..., exclude_writer: _Optional[bool] = ..., max_used_fraction: _Optional[float] = ..., headroom_bytes: _Optional[int] = ..., holder_reports: _Optional[bool] = ..., top_up: _Optional[bool] = ..., ends: _Optional[_Iterable[_Union[PutEndRequest, _Mapping]]] = ...) -> None: ...

class PutStartResult(_message.Message):
    __slots__ = ("outcome", "generation", "replicas", "error_code", "message", "num_held")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_HELD_FIELD_NUMBER: _ClassVar[int]
    outcome: PutStartOutcome
    generation: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaRef]
    error_code: int
    message: str
    num_held: int
    def __init__(self, outcome: _Optional[_Union[PutStartOutcome, str]] = ..., generation: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaRef, _Mapping]]] = ..., error_code: _Optional[int] = ..., message: _Optional[str] = ..., num_held: _Optional[int] = ...) -> None: ...

class PutStartBatchResponse(_message.Message):
    __slots__ = ("results", "end_results", "term")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    END_RESULTS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutStartResult]
    end_results: _containers.RepeatedCompositeFieldContainer[PutEndResult]
    term: int
    def __init__(self, results: _Optional[_Iterable[_Union[PutStartResult, _Mapping]]] = ..., end_results: _Optional[_Iterable[_Union[PutEndResult, _Mapping]]] = ..., term: _Optional[int] = ...) -> None: ...

class PutEndBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PutEndRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[PutEndRequest, _Mapping]]] = ...) -> None: ...

class PutEndResult(_message.Message):
    __slots__ = ("num_replicas", "error_code", "message")
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    num_replicas: int
    error_code: int
    message: str
    def __init__(self, num_replicas: _Optional[int] = ..., error_code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class PutEndBatchResponse(_message.Message):
    __slots__ = ("results", "term")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutEndResult]
    term: int
    def __init__(self, results: _Optional[_Iterable[_Union[PutEndResult, _Mapping]]] = ..., term: _Optional[int] = ...) -> None: ...

class BlockKey(_message.Message):
    __slots__ = ("namespace_id", "key")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    key: bytes
    def __init__(self, namespace_id: _Optional[bytes] = ..., key: _Optional[bytes] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ("draining", "num_blocks", "num_blocks_to_move", "num_copies_issued", "leave_sent", "term")
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_TO_MOVE_FIELD_NUMBER: _ClassVar[int]
    NUM_COPIES_ISSUED_FIELD_NUMBER: _ClassVar[int]
    LEAVE_SENT_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    draining: bool
    num_blocks: int
    num_blocks_to_move: int
    num_copies_issued: int
    leave_sent: bool
    term: int
    def __init__(self, draining: _Optional[bool] = ..., num_blocks: _Optional[int] = ..., num_blocks_to_move: _Optional[int] = ..., num_copies_issued: _Optional[int] = ..., leave_sent: _Optional[bool] = ..., term: _Optional[int] = ...) -> None: ...

class SetReplicationRequest(_message.Message):
    __slots__ = ("namespace_id", "keys", "replicas")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    replicas: int
    def __init__(self, namespace_id: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., replicas: _Optional[int] = ...) -> None: ...

class SetReplicationResponse(_message.Message):
    __slots__ = ("num_keys", "term")
    NUM_KEYS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    num_keys: int
    term: int
    def __init__(self, num_keys: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

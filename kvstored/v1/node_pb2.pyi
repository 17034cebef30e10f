from kvstored.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefetchRequest(_message.Message):
    __slots__ = ("namespace_id", "keys")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace_id: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PrefetchResponse(_message.Message):
    __slots__ = ("num_present", "num_fetched", "num_missing")
    NUM_PRESENT_FIELD_NUMBER: _ClassVar[int]
    NUM_FETCHED_FIELD_NUMBER: _ClassVar[int]
    NUM_MISSING_FIELD_NUMBER: _ClassVar[int]
    num_present: int
    num_fetched: int
    num_missing: int
    def __init__(self, num_present: _Optional[int] = ..., num_fetched: _Optional[int] = ..., num_missing: _Optional[int] = ...) -> None: ...

class ConnectRdmaRequest(_message.Message):
    __slots__ = ("advert", "node_id", "epoch")
    ADVERT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    advert: bytes
    node_id: str
    epoch: int
    def __init__(self, advert: _Optional[bytes] = ..., node_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class ConnectRdmaResponse(_message.Message):
    __slots__ = ("advert", "session_id", "arena_size_bytes", "arena_path", "epoch")
    ADVERT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ARENA_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARENA_PATH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    advert: bytes
    session_id: int
    arena_size_bytes: int
    arena_path: str
    epoch: int
    def __init__(self, advert: _Optional[bytes] = ..., session_id: _Optional[int] = ..., arena_size_bytes: _Optional[int] = ..., arena_path: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class DisconnectRdmaRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class DisconnectRdmaResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("client_name", "pid")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    pid: int
    def __init__(self, client_name: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("session_id", "epoch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    epoch: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("namespace_id",)
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    def __init__(self, namespace_id: _Optional[bytes] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("node_id", "version", "epoch", "arena_path", "arena_size_bytes", "data_address", "max_block_bytes", "max_batch_keys", "max_inline_bytes", "draining", "listen_addresses", "metrics_address", "arena_dev", "arena_ino", "max_meta_bytes", "min_key_bytes", "max_key_bytes", "pin_lease_ms", "control_path", "default_replicas", "transports")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ARENA_PATH_FIELD_NUMBER: _ClassVar[int]
    ARENA_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MAX_BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_KEYS_FIELD_NUMBER: _ClassVar[int]
    MAX_INLINE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    LISTEN_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ARENA_DEV_FIELD_NUMBER: _ClassVar[int]
    ARENA_INO_FIELD_NUMBER: _ClassVar[int]
    MAX_META_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIN_KEY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_KEY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIN_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    CONTROL_PATH_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    version: str
    epoch: int
    arena_path: str
    arena_size_bytes: int
    data_address: str
    max_block_bytes: int
    max_batch_keys: int
    max_inline_bytes: int
    draining: bool
    listen_addresses: _containers.RepeatedScalarFieldContainer[str]
    metrics_address: str
    arena_dev: int
    arena_ino: int
    max_meta_bytes: int
    min_key_bytes: int
    max_key_bytes: int
    pin_lease_ms: int
    control_path: str
    default_replicas: int
    transports: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., version: _Optional[str] = ..., epoch: _Optional[int] = ..., arena_path: _Optional[str] = ..., arena_size_bytes: _Optional[int] = ..., data_address: _Optional[str] = ..., max_block_bytes: _Optional[int] = ..., max_batch_keys: _Optional[int] = ..., max_inline_bytes: _Optional[int] = ..., draining: _Optional[bool] = ..., listen_addresses: _Optional[_Iterable[str]] = ..., metrics_address: _Optional[str] = ..., arena_dev: _Optional[int] = ..., arena_ino: _Optional[int] = ..., max_meta_bytes: _Optional[int] = ..., min_key_bytes: _Optional[int] = ..., max_key_bytes: _Optional[int] = ..., pin_lease_ms: _Optional[int] = ..., control_path: _Optional[str] = ..., default_replicas: _Optional[int] = ..., transports: _Optional[_Iterable[str]] = ...) -> None: ...

class ReplicateRequest(_message.Message):
    __slots__ = ("namespace_id", "keys", "replicas")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    replicas: int
    def __init__(self, namespace_id: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., replicas: _Optional[int] = ...) -> None: ...

class ReplicateResult(_message.Message):
    __slots__ = ("status", "num_replicas", "num_wanted")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NUM_WANTED_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.ItemStatus
    num_replicas: int
    num_wanted: int
    def __init__(self, status: _Optional[_Union[_common_pb2.ItemStatus, _Mapping]] = ..., num_replicas: _Optional[int] = ..., num_wanted: _Optional[int] = ...) -> None: ...

class ReplicateResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ReplicateResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ReplicateResult, _Mapping]]] = ...) -> None: ...

class PutItem(_message.Message):
    __slots__ = ("key", "value", "meta")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    meta: bytes
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., meta: _Optional[bytes] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("items", "namespace_id")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PutItem]
    namespace_id: bytes
    def __init__(self, items: _Optional[_Iterable[_Union[PutItem, _Mapping]]] = ..., namespace_id: _Optional[bytes] = ...) -> None: ...

class PutResult(_message.Message):
    __slots__ = ("status", "stored")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.ItemStatus
    stored: bool
    def __init__(self, status: _Optional[_Union[_common_pb2.ItemStatus, _Mapping]] = ..., stored: _Optional[bool] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PutResult, _Mapping]]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("keys", "namespace_id")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace_id: bytes
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., namespace_id: _Optional[bytes] = ...) -> None: ...

class GetResult(_message.Message):
    __slots__ = ("status", "found", "value", "meta", "tier")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.ItemStatus
    found: bool
    value: bytes
    meta: bytes
    tier: _common_pb2.Tier
    def __init__(self, status: _Optional[_Union[_common_pb2.ItemStatus, _Mapping]] = ..., found: _Optional[bool] = ..., value: _Optional[bytes] = ..., meta: _Optional[bytes] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[GetResult]
    def __init__(self, results: _Optional[_Iterable[_Union[GetResult, _Mapping]]] = ...) -> None: ...

class ReserveItem(_message.Message):
    __slots__ = ("key", "size_bytes", "meta")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    size_bytes: int
    meta: bytes
    def __init__(self, key: _Optional[bytes] = ..., size_bytes: _Optional[int] = ..., meta: _Optional[bytes] = ...) -> None: ...

class ReservePutRequest(_message.Message):
    __slots__ = ("items", "namespace_id", "lease_ms", "epoch", "session_id", "request_id")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ReserveItem]
    namespace_id: bytes
    lease_ms: int
    epoch: int
    session_id: int
    request_id: int
    def __init__(self, items: _Optional[_Iterable[_Union[ReserveItem, _Mapping]]] = ..., namespace_id: _Optional[bytes] = ..., lease_ms: _Optional[int] = ..., epoch: _Optional[int] = ..., session_id: _Optional[int] = ..., request_id: _Optional[int] = ...) -> None: ...

class Reservation(_message.Message):
    __slots__ = ("status", "exists", "offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.ItemStatus
    exists: bool
    offset: int
    def __init__(self, status: _Optional[_Union[_common_pb2.ItemStatus, _Mapping]] = ..., exists: _Optional[bool] = ..., offset: _Optional[int] = ...) -> None: ...

class ReservePutResponse(_message.Message):
    __slots__ = ("reservation_id", "reservations")
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    reservation_id: int
    reservations: _containers.RepeatedCompositeFieldContainer[Reservation]
    def __init__(self, reservation_id: _Optional[int] = ..., reservations: _Optional[_Iterable[_Union[Reservation, _Mapping]]] = ...) -> None: ...

class CommitPutRequest(_message.Message):
    __slots__ = ("reservation_id", "abort")
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    reservation_id: int
    abort: bool
    def __init__(self, reservation_id: _Optional[int] = ..., abort: _Optional[bool] = ...) -> None: ...

class CommitPutResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PutResult, _Mapping]]] = ...) -> None: ...

class SlotWrite(_message.Message):
    __slots__ = ("slot_id", "key", "size_bytes", "meta")
    SLOT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    slot_id: int
    key: bytes
    size_bytes: int
    meta: bytes
    def __init__(self, slot_id: _Optional[int] = ..., key: _Optional[bytes] = ..., size_bytes: _Optional[int] = ..., meta: _Optional[bytes] = ...) -> None: ...

class SlotWant(_message.Message):
    __slots__ = ("size_bytes", "num_slots")
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    size_bytes: int
    num_slots: int
    def __init__(self, size_bytes: _Optional[int] = ..., num_slots: _Optional[int] = ...) -> None: ...

class GrantedSlot(_message.Message):
    __slots__ = ("slot_id", "offset", "size_bytes")
    SLOT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    slot_id: int
    offset: int
    size_bytes: int
    def __init__(self, slot_id: _Optional[int] = ..., offset: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class CommitSlotsRequest(_message.Message):
    __slots__ = ("namespace_id", "session_id", "epoch", "lease_ms", "request_id", "writes", "return_slot_ids", "want", "grant_after_answer", "write_slot_ids", "write_keys", "write_sizes")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    RETURN_SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    WANT_FIELD_NUMBER: _ClassVar[int]
    GRANT_AFTER_ANSWER_FIELD_NUMBER: _ClassVar[int]
    WRITE_SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    WRITE_KEYS_FIELD_NUMBER: _ClassVar[int]
    WRITE_SIZES_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    session_id: int
    epoch: int
    lease_ms: int
    request_id: int
    writes: _containers.RepeatedCompositeFieldContainer[SlotWrite]
    return_slot_ids: _containers.RepeatedScalarFieldContainer[int]
    want: _containers.RepeatedCompositeFieldContainer[SlotWant]
    grant_after_answer: bool
    write_slot_ids: _containers.RepeatedScalarFieldContainer[int]
    write_keys: _containers.RepeatedScalarFieldContainer[bytes]
    write_sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, namespace_id: _Optional[bytes] = ..., session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., lease_ms: _Optional[int] = ..., request_id: _Optional[int] = ..., writes: _Optional[_Iterable[_Union[SlotWrite, _Mapping]]] = ..., return_slot_ids: _Optional[_Iterable[int]] = ..., want: _Optional[_Iterable[_Union[SlotWant, _Mapping]]] = ..., grant_after_answer: _Optional[bool] = ..., write_slot_ids: _Optional[_Iterable[int]] = ..., write_keys: _Optional[_Iterable[bytes]] = ..., write_sizes: _Optional[_Iterable[int]] = ...) -> None: ...

class CommitSlotsResponse(_message.Message):
    __slots__ = ("results", "slots", "slot_budget_bytes", "grant_follows", "accepts_columns", "write_stored", "slot_ids", "slot_offsets", "slot_sizes")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SLOT_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRANT_FOLLOWS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    WRITE_STORED_FIELD_NUMBER: _ClassVar[int]
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    SLOT_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SLOT_SIZES_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutResult]
    slots: _containers.RepeatedCompositeFieldContainer[GrantedSlot]
    slot_budget_bytes: int
    grant_follows: bool
    accepts_columns: bool
    write_stored: _containers.RepeatedScalarFieldContainer[bool]
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    slot_offsets: _containers.RepeatedScalarFieldContainer[int]
    slot_sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, results: _Optional[_Iterable[_Union[PutResult, _Mapping]]] = ..., slots: _Optional[_Iterable[_Union[GrantedSlot, _Mapping]]] = ..., slot_budget_bytes: _Optional[int] = ..., grant_follows: _Optional[bool] = ..., accepts_columns: _Optional[bool] = ..., write_stored: _Optional[_Iterable[bool]] = ..., slot_ids: _Optional[_Iterable[int]] = ..., slot_offsets: _Optional[_Iterable[int]] = ..., slot_sizes: _Optional[_Iterable[int]] = ...) -> None: ...

class PinBlocksRequest(_message.Message):
    __slots__ = ("keys", "namespace_id", "lease_ms", "epoch", "session_id", "request_id")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace_id: bytes
    lease_ms: int
    epoch: int
    session_id: int
    request_id: int
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., namespace_id: _Optional[bytes] = ..., lease_ms: _Optional[int] = ..., epoch: _Optional[int] = ..., session_id: _Optional[int] = ..., request_id: _Optional[int] = ...) -> None: ...

class PinnedBlock(_message.Message):
    __slots__ = ("status", "found", "offset", "size_bytes", "meta", "tier", "through")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    THROUGH_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.ItemStatus
    found: bool
    offset: int
    size_bytes: int
    meta: bytes
    tier: _common_pb2.Tier
    through: bool
    def __init__(self, status: _Optional[_Union[_common_pb2.ItemStatus, _Mapping]] = ..., found: _Optional[bool] = ..., offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., meta: _Optional[bytes] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., through: _Optional[bool] = ...) -> None: ...

class PinBlocksResponse(_message.Message):
    __slots__ = ("pin_id", "blocks")
    PIN_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    pin_id: int
    blocks: _containers.RepeatedCompositeFieldContainer[PinnedBlock]
    def __init__(self, pin_id: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[PinnedBlock, _Mapping]]] = ...) -> None: ...

class ReleasePinsRequest(_message.Message):
    __slots__ = ("pin_ids", "session_id", "orphan_request_ids")
    PIN_IDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ORPHAN_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    pin_ids: _containers.RepeatedScalarFieldContainer[int]
    session_id: int
    orphan_request_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, pin_ids: _Optional[_Iterable[int]] = ..., session_id: _Optional[int] = ..., orphan_request_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleasePinsResponse(_message.Message):
    __slots__ = ("num_released", "expired_pin_ids", "num_orphans_released")
    NUM_RELEASED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_PIN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_ORPHANS_RELEASED_FIELD_NUMBER: _ClassVar[int]
    num_released: int
    expired_pin_ids: _containers.RepeatedScalarFieldContainer[int]
    num_orphans_released: int
    def __init__(self, num_released: _Optional[int] = ..., expired_pin_ids: _Optional[_Iterable[int]] = ..., num_orphans_released: _Optional[int] = ...) -> None: ...

class LookupPrefixRequest(_message.Message):
    __slots__ = ("keys", "namespace_id")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace_id: bytes
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., namespace_id: _Optional[bytes] = ...) -> None: ...

class LookupPrefixResponse(_message.Message):
    __slots__ = ("num_hit_blocks", "tiers")
    NUM_HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    num_hit_blocks: int
    tiers: _containers.RepeatedScalarFieldContainer[_common_pb2.Tier]
    def __init__(self, num_hit_blocks: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[_common_pb2.Tier, str]]] = ...) -> None: ...

class ExistsRequest(_message.Message):
    __slots__ = ("keys", "namespace_id", "with_tiers")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    WITH_TIERS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace_id: bytes
    with_tiers: bool
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., namespace_id: _Optional[bytes] = ..., with_tiers: _Optional[bool] = ...) -> None: ...

class ExistsResponse(_message.Message):
    __slots__ = ("exists", "tiers")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    exists: _containers.RepeatedScalarFieldContainer[bool]
    tiers: _containers.RepeatedScalarFieldContainer[_common_pb2.Tier]
    def __init__(self, exists: _Optional[_Iterable[bool]] = ..., tiers: _Optional[_Iterable[_Union[_common_pb2.Tier, str]]] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("keys", "namespace_id")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace_id: bytes
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., namespace_id: _Optional[bytes] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, removed: _Optional[_Iterable[bool]] = ...) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("tier", "capacity_bytes", "used_bytes", "num_blocks", "hits", "evictions")
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    tier: _common_pb2.Tier
    capacity_bytes: int
    used_bytes: int
    num_blocks: int
    hits: int
    evictions: int
    def __init__(self, tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., num_blocks: _Optional[int] = ..., hits: _Optional[int] = ..., evictions: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("node_id", "epoch", "tiers", "gets", "hits", "misses", "puts", "put_failures", "checksum_failures", "pinned_blocks", "uptime_s", "draining", "quarantined_bytes", "num_sessions", "remote_rdma_blocks", "remote_tcp_blocks", "rdma_fallbacks", "rdma_device", "rdma_sessions")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    GETS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    PUTS_FIELD_NUMBER: _ClassVar[int]
    PUT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FAILURES_FIELD_NUMBER: _ClassVar[int]
    PINNED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_RDMA_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_TCP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RDMA_FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    RDMA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    RDMA_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    gets: int
    hits: int
    misses: int
    puts: int
    put_failures: int
    checksum_failures: int
    pinned_blocks: int
    uptime_s: float
    draining: bool
    quarantined_bytes: int
    num_sessions: int
    remote_rdma_blocks: int
    remote_tcp_blocks: int
    rdma_fallbacks: int
    rdma_device: str
    rdma_sessions: int
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., gets: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., puts: _Optional[int] = ..., put_failures: _Optional[int] = ..., checksum_failures: _Optional[int] = ..., pinned_blocks: _Optional[int] = ..., uptime_s: _Optional[float] = ..., draining: _Optional[bool] = ..., quarantined_bytes: _Optional[int] = ..., num_sessions: _Optional[int] = ..., remote_rdma_blocks: _Optional[int] = ..., remote_tcp_blocks: _Optional[int] = ..., rdma_fallbacks: _Optional[int] = ..., rdma_device: _Optional[str] = ..., rdma_sessions: _Optional[int] = ...) -> None: ...

class ListBlocksRequest(_message.Message):
    __slots__ = ("namespace_id", "limit")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    limit: int
    def __init__(self, namespace_id: _Optional[bytes] = ..., limit: _Optional[int] = ...) -> None: ...

class BlockInfo(_message.Message):
    __slots__ = ("key", "size_bytes", "namespace_id", "tiers", "pinned")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    size_bytes: int
    namespace_id: bytes
    tiers: _containers.RepeatedScalarFieldContainer[_common_pb2.Tier]
    pinned: bool
    def __init__(self, key: _Optional[bytes] = ..., size_bytes: _Optional[int] = ..., namespace_id: _Optional[bytes] = ..., tiers: _Optional[_Iterable[_Union[_common_pb2.Tier, str]]] = ..., pinned: _Optional[bool] = ...) -> None: ...

class ListBlocksResponse(_message.Message):
    __slots__ = ("blocks", "truncated")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    truncated: bool
    def __init__(self, blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ("session_id", "release_pin_ids", "pin_blocks", "release_pins", "reserve_put", "commit_put", "lookup_prefix", "exists", "put", "commit_slots", "one_sided")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_PIN_IDS_FIELD_NUMBER: _ClassVar[int]
    PIN_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_PINS_FIELD_NUMBER: _ClassVar[int]
    RESERVE_PUT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_PUT_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_PREFIX_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_SLOTS_FIELD_NUMBER: _ClassVar[int]
    ONE_SIDED_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    release_pin_ids: _containers.RepeatedScalarFieldContainer[int]
    pin_blocks: PinBlocksRequest
    release_pins: ReleasePinsRequest
    reserve_put: ReservePutRequest
    commit_put: CommitPutRequest
    lookup_prefix: LookupPrefixRequest
    exists: ExistsRequest
    put: PutRequest
    commit_slots: CommitSlotsRequest
    one_sided: OneSidedReport
    def __init__(self, session_id: _Optional[int] = ..., release_pin_ids: _Optional[_Iterable[int]] = ..., pin_blocks: _Optional[_Union[PinBlocksRequest, _Mapping]] = ..., release_pins: _Optional[_Union[ReleasePinsRequest, _Mapping]] = ..., reserve_put: _Optional[_Union[ReservePutRequest, _Mapping]] = ..., commit_put: _Optional[_Union[CommitPutRequest, _Mapping]] = ..., lookup_prefix: _Optional[_Union[LookupPrefixRequest, _Mapping]] = ..., exists: _Optional[_Union[ExistsRequest, _Mapping]] = ..., put: _Optional[_Union[PutRequest, _Mapping]] = ..., commit_slots: _Optional[_Union[CommitSlotsRequest, _Mapping]] = ..., one_sided: _Optional[_Union[OneSidedReport, _Mapping]] = ...) -> None: ...

class OneSidedReport(_message.Message):
    __slots__ = ("hit_blocks", "hit_bytes", "fallback_blocks", "miss_blocks", "lookup_blocks", "lookup_hit_blocks")
    HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MISS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    hit_blocks: int
    hit_bytes: int
    fallback_blocks: int
    miss_blocks: int
    lookup_blocks: int
    lookup_hit_blocks: int
    def __init__(self, hit_blocks: _Optional[int] = ..., hit_bytes: _Optional[int] = ..., fallback_blocks: _Optional[int] = ..., miss_blocks: _Optional[int] = ..., lookup_blocks: _Optional[int] = ..., lookup_hit_blocks: _Optional[int] = ...) -> None: ...

class ControlResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "released", "pin_blocks", "release_pins", "reserve_put", "commit_put", "lookup_prefix", "exists", "put", "commit_slots")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    PIN_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_PINS_FIELD_NUMBER: _ClassVar[int]
    RESERVE_PUT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_PUT_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_PREFIX_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_SLOTS_FIELD_NUMBER: _ClassVar[int]
    error_code: int
    error_message: str
    released: ReleasePinsResponse
    pin_blocks: PinBlocksResponse
    release_pins: ReleasePinsResponse
    reserve_put: ReservePutResponse
    commit_put: CommitPutResponse
    lookup_prefix: LookupPrefixResponse
    exists: ExistsResponse
    put: PutResponse
    commit_slots: CommitSlotsResponse
    def __init__(self, error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., released: _Optional[_Union[ReleasePinsResponse, _Mapping]] = ..., pin_blocks: _Optional[_Union[PinBlocksResponse, _Mapping]] = ..., release_pins: _Optional[_Union[ReleasePinsResponse, _Mapping]] = ..., reserve_put: _Optional[_Union[ReservePutResponse, _Mapping]] = ..., commit_put: _Optional[_Union[CommitPutResponse, _Mapping]] = ..., lookup_prefix: _Optional[_Union[LookupPrefixResponse, _Mapping]] = ..., exists: _Optional[_Union[ExistsResponse, _Mapping]] = ..., put: _Optional[_Union[PutResponse, _Mapping]] = ..., commit_slots: _Optional[_Union[CommitSlotsResponse, _Mapping]] = ...) -> None: ...

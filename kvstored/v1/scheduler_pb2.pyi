from kvstored.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InstanceRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSTANCE_ROLE_UNSPECIFIED: _ClassVar[InstanceRole]
    INSTANCE_ROLE_PREFILL: _ClassVar[InstanceRole]
    INSTANCE_ROLE_DECODE: _ClassVar[InstanceRole]

class CopyState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COPY_STATE_UNSPECIFIED: _ClassVar[CopyState]
    COPY_STATE_PENDING: _ClassVar[CopyState]
    COPY_STATE_DONE: _ClassVar[CopyState]
    COPY_STATE_FAILED: _ClassVar[CopyState]

class RejectReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECT_REASON_UNSPECIFIED: _ClassVar[RejectReason]
    REJECT_REASON_TTFT_SLO: _ClassVar[RejectReason]
    REJECT_REASON_TBT_SLO: _ClassVar[RejectReason]
    REJECT_REASON_DECODE_OVERLOADED: _ClassVar[RejectReason]
    REJECT_REASON_NO_INSTANCE: _ClassVar[RejectReason]
INSTANCE_ROLE_UNSPECIFIED: InstanceRole
INSTANCE_ROLE_PREFILL: InstanceRole
INSTANCE_ROLE_DECODE: InstanceRole
COPY_STATE_UNSPECIFIED: CopyState
COPY_STATE_PENDING: CopyState
COPY_STATE_DONE: CopyState
COPY_STATE_FAILED: CopyState
REJECT_REASON_UNSPECIFIED: RejectReason
REJECT_REASON_TTFT_SLO: RejectReason
REJECT_REASON_TBT_SLO: RejectReason
REJECT_REASON_DECODE_OVERLOADED: RejectReason
REJECT_REASON_NO_INSTANCE: RejectReason

class InstanceInfo(_message.Message):
    __slots__ = ("instance_id", "node_id", "role", "relative_speed", "max_running_requests", "kv_capacity_tokens")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_SPEED_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    node_id: str
    role: InstanceRole
    relative_speed: float
    max_running_requests: int
    kv_capacity_tokens: int
    def __init__(self, instance_id: _Optional[str] = ..., node_id: _Optional[str] = ..., role: _Optional[_Union[InstanceRole, str]] = ..., relative_speed: _Optional[float] = ..., max_running_requests: _Optional[int] = ..., kv_capacity_tokens: _Optional[int] = ...) -> None: ...

class RegisterInstanceRequest(_message.Message):
    __slots__ = ("instance",)
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    instance: InstanceInfo
    def __init__(self, instance: _Optional[_Union[InstanceInfo, _Mapping]] = ...) -> None: ...

class RegisterInstanceResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnregisterInstanceRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    def __init__(self, instance_id: _Optional[str] = ...) -> None: ...

class UnregisterInstanceResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportLoadRequest(_message.Message):
    __slots__ = ("instance_id", "queued_prefill_ms", "num_running_requests", "num_context_tokens", "step_time_us", "added_block_keys", "removed_block_keys", "clear_blocks", "added_tier")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_US_FIELD_NUMBER: _ClassVar[int]
    ADDED_BLOCK_KEYS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_BLOCK_KEYS_FIELD_NUMBER: _ClassVar[int]
    CLEAR_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ADDED_TIER_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    queued_prefill_ms: int
    num_running_requests: int
    num_context_tokens: int
    step_time_us: int
    added_block_keys: _containers.RepeatedScalarFieldContainer[bytes]
    removed_block_keys: _containers.RepeatedScalarFieldContainer[bytes]
    clear_blocks: bool
    added_tier: _common_pb2.Tier
    def __init__(self, instance_id: _Optional[str] = ..., queued_prefill_ms: _Optional[int] = ..., num_running_requests: _Optional[int] = ..., num_context_tokens: _Optional[int] = ..., step_time_us: _Optional[int] = ..., added_block_keys: _Optional[_Iterable[bytes]] = ..., removed_block_keys: _Optional[_Iterable[bytes]] = ..., clear_blocks: _Optional[bool] = ..., added_tier: _Optional[_Union[_common_pb2.Tier, str]] = ...) -> None: ...

class ReportLoadResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ScheduleRequest(_message.Message):
    __slots__ = ("request_id", "block_keys", "input_tokens", "expected_output_tokens", "ttft_slo_ms", "tbt_slo_ms", "namespace_id", "copy_wait_ms", "keys_per_block")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_KEYS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_SLO_MS_FIELD_NUMBER: _ClassVar[int]
    TBT_SLO_MS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    COPY_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    KEYS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    block_keys: _containers.RepeatedScalarFieldContainer[bytes]
    input_tokens: int
    expected_output_tokens: int
    ttft_slo_ms: int
    tbt_slo_ms: int
    namespace_id: bytes
    copy_wait_ms: int
    keys_per_block: int
    def __init__(self, request_id: _Optional[str] = ..., block_keys: _Optional[_Iterable[bytes]] = ..., input_tokens: _Optional[int] = ..., expected_output_tokens: _Optional[int] = ..., ttft_slo_ms: _Optional[int] = ..., tbt_slo_ms: _Optional[int] = ..., namespace_id: _Optional[bytes] = ..., copy_wait_ms: _Optional[int] = ..., keys_per_block: _Optional[int] = ...) -> None: ...

class ScheduleResponse(_message.Message):
    __slots__ = ("admitted", "reason", "message", "prefill_instance_id", "decode_instance_id", "num_blocks", "reused_blocks", "local_blocks", "fetched_blocks", "fetched_ssd_blocks", "prefix_node_id", "replicate_block_keys", "predicted_queue_ms", "predicted_transfer_ms", "predicted_prefill_ms", "predicted_ttft_ms", "predicted_tbt_us", "predicted_decode_load", "copy_state", "copied_blocks", "missing_blocks", "copy_ms", "copied_bytes", "copy_message")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REUSED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FETCHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FETCHED_SSD_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICATE_BLOCK_KEYS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TRANSFER_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TBT_US_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_DECODE_LOAD_FIELD_NUMBER: _ClassVar[int]
    COPY_STATE_FIELD_NUMBER: _ClassVar[int]
    COPIED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MISSING_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    COPY_MS_FIELD_NUMBER: _ClassVar[int]
    COPIED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COPY_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    admitted: bool
    reason: RejectReason
    message: str
    prefill_instance_id: str
    decode_instance_id: str
    num_blocks: int
    reused_blocks: int
    local_blocks: int
    fetched_blocks: int
    fetched_ssd_blocks: int
    prefix_node_id: str
    replicate_block_keys: _containers.RepeatedScalarFieldContainer[bytes]
    predicted_queue_ms: int
    predicted_transfer_ms: int
    predicted_prefill_ms: int
    predicted_ttft_ms: int
    predicted_tbt_us: int
    predicted_decode_load: float
    copy_state: CopyState
    copied_blocks: int
    missing_blocks: int
    copy_ms: int
    copied_bytes: int
    copy_message: str
    def __init__(self, admitted: _Optional[bool] = ..., reason: _Optional[_Union[RejectReason, str]] = ..., message: _Optional[str] = ..., prefill_instance_id: _Optional[str] = ..., decode_instance_id: _Optional[str] = ..., num_blocks: _Optional[int] = ..., reused_blocks: _Optional[int] = ..., local_blocks: _Optional[int] = ..., fetched_blocks: _Optional[int] = ..., fetched_ssd_blocks: _Optional[int] = ..., prefix_node_id: _Optional[str] = ..., replicate_block_keys: _Optional[_Iterable[bytes]] = ..., predicted_queue_ms: _Optional[int] = ..., predicted_transfer_ms: _Optional[int] = ..., predicted_prefill_ms: _Optional[int] = ..., predicted_ttft_ms: _Optional[int] = ..., predicted_tbt_us: _Optional[int] = ..., predicted_decode_load: _Optional[float] = ..., copy_state: _Optional[_Union[CopyState, str]] = ..., copied_blocks: _Optional[int] = ..., missing_blocks: _Optional[int] = ..., copy_ms: _Optional[int] = ..., copied_bytes: _Optional[int] = ..., copy_message: _Optional[str] = ...) -> None: ...

class AwaitCopyRequest(_message.Message):
    __slots__ = ("request_id", "timeout_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    timeout_ms: int
    def __init__(self, request_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class AwaitCopyResponse(_message.Message):
    __slots__ = ("copy_state", "copied_blocks", "missing_blocks", "copy_ms", "copied_bytes", "copy_message", "node_id")
    COPY_STATE_FIELD_NUMBER: _ClassVar[int]
    COPIED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MISSING_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    COPY_MS_FIELD_NUMBER: _ClassVar[int]
    COPIED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COPY_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    copy_state: CopyState
    copied_blocks: int
    missing_blocks: int
    copy_ms: int
    copied_bytes: int
    copy_message: str
    node_id: str
    def __init__(self, copy_state: _Optional[_Union[CopyState, str]] = ..., copied_blocks: _Optional[int] = ..., missing_blocks: _Optional[int] = ..., copy_ms: _Optional[int] = ..., copied_bytes: _Optional[int] = ..., copy_message: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class ReportPrefillFinishedRequest(_message.Message):
    __slots__ = ("request_id", "observed_ttft_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    observed_ttft_ms: int
    def __init__(self, request_id: _Optional[str] = ..., observed_ttft_ms: _Optional[int] = ...) -> None: ...

class ReportPrefillFinishedResponse(_message.Message):
    __slots__ = ("admitted", "decode_instance_id", "reason", "decode_load")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECODE_LOAD_FIELD_NUMBER: _ClassVar[int]
    admitted: bool
    decode_instance_id: str
    reason: RejectReason
    decode_load: float
    def __init__(self, admitted: _Optional[bool] = ..., decode_instance_id: _Optional[str] = ..., reason: _Optional[_Union[RejectReason, str]] = ..., decode_load: _Optional[float] = ...) -> None: ...

class ReportRequestFinishedRequest(_message.Message):
    __slots__ = ("request_id", "num_output_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_output_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., num_output_tokens: _Optional[int] = ...) -> None: ...

class ReportRequestFinishedResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class DescribeSchedulerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InstanceStatus(_message.Message):
    __slots__ = ("instance", "load", "queued_prefill_ms", "num_running_requests", "num_context_tokens", "num_incoming_requests", "step_time_us", "last_seen_age_ms")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_INCOMING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_US_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    instance: InstanceInfo
    load: float
    queued_prefill_ms: int
    num_running_requests: int
    num_context_tokens: int
    num_incoming_requests: int
    step_time_us: int
    last_seen_age_ms: int
    def __init__(self, instance: _Optional[_Union[InstanceInfo, _Mapping]] = ..., load: _Optional[float] = ..., queued_prefill_ms: _Optional[int] = ..., num_running_requests: _Optional[int] = ..., num_context_tokens: _Optional[int] = ..., num_incoming_requests: _Optional[int] = ..., step_time_us: _Optional[int] = ..., last_seen_age_ms: _Optional[int] = ...) -> None: ...

class DescribeSchedulerResponse(_message.Message):
    __slots__ = ("policy", "admission", "instances", "num_admitted", "num_rejected", "num_completed", "profile", "uniform_decode_s")
    class NumRejectedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    NUM_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    NUM_REJECTED_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    UNIFORM_DECODE_S_FIELD_NUMBER: _ClassVar[int]
    policy: str
    admission: str
    instances: _containers.RepeatedCompositeFieldContainer[InstanceStatus]
    num_admitted: int
    num_rejected: _containers.ScalarMap[str, int]
    num_completed: int
    profile: str
    uniform_decode_s: float
    def __init__(self, policy: _Optional[str] = ..., admission: _Optional[str] = ..., instances: _Optional[_Iterable[_Union[InstanceStatus, _Mapping]]] = ..., num_admitted: _Optional[int] = ..., num_rejected: _Optional[_Mapping[str, int]] = ..., num_completed: _Optional[int] = ..., profile: _Optional[str] = ..., uniform_decode_s: _Optional[float] = ...) -> None: ...

from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    INVALID_ARGUMENT: _ClassVar[ErrorCode]
    KEY_INVALID: _ClassVar[ErrorCode]
    BLOCK_TOO_LARGE: _ClassVar[ErrorCode]
    NAMESPACE_MISMATCH: _ClassVar[ErrorCode]
    BATCH_TOO_LARGE: _ClassVar[ErrorCode]
    DTYPE_MISMATCH: _ClassVar[ErrorCode]
    NO_CAPACITY: _ClassVar[ErrorCode]
    TENANT_QUOTA_EXCEEDED: _ClassVar[ErrorCode]
    NOT_FOUND: _ClassVar[ErrorCode]
    REPLICA_NOT_READY: _ClassVar[ErrorCode]
    LEASE_EXPIRED: _ClassVar[ErrorCode]
    ALREADY_EXISTS: _ClassVar[ErrorCode]
    TRANSFER_FAILED: _ClassVar[ErrorCode]
    UNAVAILABLE: _ClassVar[ErrorCode]
    DEADLINE_EXCEEDED: _ClassVar[ErrorCode]
    DRAINING: _ClassVar[ErrorCode]
    INTERNAL: _ClassVar[ErrorCode]
    NOT_LEADER: _ClassVar[ErrorCode]
    STALE_TERM: _ClassVar[ErrorCode]
    STORAGE_IO: _ClassVar[ErrorCode]
    CHECKSUM_MISMATCH: _ClassVar[ErrorCode]
    CONFIG_INVALID: _ClassVar[ErrorCode]
    UNAUTHENTICATED: _ClassVar[ErrorCode]
    PERMISSION_DENIED: _ClassVar[ErrorCode]

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    DRAM: _ClassVar[Tier]
    SSD: _ClassVar[Tier]
ERROR_CODE_UNSPECIFIED: ErrorCode
INVALID_ARGUMENT: ErrorCode
KEY_INVALID: ErrorCode
BLOCK_TOO_LARGE: ErrorCode
NAMESPACE_MISMATCH: ErrorCode
BATCH_TOO_LARGE: ErrorCode
DTYPE_MISMATCH: ErrorCode
NO_CAPACITY: ErrorCode
TENANT_QUOTA_EXCEEDED: ErrorCode
NOT_FOUND: ErrorCode
REPLICA_NOT_READY: ErrorCode
LEASE_EXPIRED: ErrorCode
ALREADY_EXISTS: ErrorCode
TRANSFER_FAILED: ErrorCode
UNAVAILABLE: ErrorCode
DEADLINE_EXCEEDED: ErrorCode
DRAINING: ErrorCode
INTERNAL: ErrorCode
NOT_LEADER: ErrorCode
STALE_TERM: ErrorCode
STORAGE_IO: ErrorCode
CHECKSUM_MISMATCH: ErrorCode
CONFIG_INVALID: ErrorCode
UNAUTHENTICATED: ErrorCode
PERMISSION_DENIED: ErrorCode
TIER_UNSPECIFIED: Tier
DRAM: Tier
SSD: Tier

class ItemStatus(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

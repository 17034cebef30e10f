"""Plain ints as the proto enum types of the generated stubs: the wire boundary.

grpcio-tools' ``.pyi`` files (``kvstored/v1``) declare every proto enum (``Tier``,
``ErrorCode``, ``NodeHealth``, ``ReplicaState``, ...) as a subclass of ``int``, and a message's
enum fields accept only that class or a member's name. At run time the enum is an
``EnumTypeWrapper``, which cannot be called, and a field takes any int. :func:`pb_enum` and
:func:`pb_enums` are where an int (an ``IntEnum`` of :mod:`kvstored.types` or
:mod:`kvstored.errors`, whose values mirror the proto's) becomes that type for the checker. They
change no value: an int the proto does not name travels as an unknown enum value, as it would
without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar, cast

E = TypeVar("E", bound=int)


def pb_enum(enum: type[E], value: int) -> E:
    """``int(value)``, typed as the proto enum ``enum``.

    Args:
        enum: the generated enum, e.g. ``common_pb2.Tier`` (only its static type is used).
        value: the number, an ``int`` or an ``IntEnum`` member (``Tier.DRAM``).

    Returns:
        ``int(value)`` (an ``IntEnum`` member becomes its plain number).
    """
    return cast(E, int(value))


def pb_enums(enum: type[E], values: Sequence[int]) -> Sequence[E]:
    """``values`` itself (not copied), typed as a sequence of the proto enum ``enum``.

    For a repeated enum field (``tiers=``), which takes ``int`` and ``IntEnum`` members alike.

    Args:
        enum: the generated enum, e.g. ``common_pb2.Tier`` (only its static type is used).
        values: the numbers.
    """
    return cast(Sequence[E], values)

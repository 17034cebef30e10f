"""The stored namespace id (kvstored/tenancy.py): injective, so no id of one tenant's request
lands in another tenant's key space; tenant names are checked with a clear message."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstored.errors import InvalidArgument, PermissionDenied
from kvstored.tenancy import (
    check_namespace_length,
    check_stored_namespace,
    check_tenant,
    scope_namespace,
    split_namespace,
    tenant_of,
)

tenants = st.one_of(st.just(""), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True))
ids = st.binary(max_size=40)


def test_the_shared_tenant_keeps_todays_ids_and_escapes_the_reserved_byte() -> None:
    assert scope_namespace("", b"\x01abc") == b"\x01abc"
    assert scope_namespace("", b"") == b""
    assert scope_namespace("", b"\xff\x01a") == b"\xff\x00\xff\x01a"
    assert scope_namespace("a", b"ns") == b"\xff\x01ans"


@settings(max_examples=60, deadline=None)
@given(tenants, ids)
def test_split_inverts_scope(tenant: str, ns: bytes) -> None:
    assert split_namespace(scope_namespace(tenant, ns)) == (tenant, ns)


@settings(max_examples=60, deadline=None)
@given(tenants, ids, tenants, ids)
def test_two_requests_share_a_stored_id_only_if_tenant_and_id_are_equal(
    t1: str, ns1: bytes, t2: str, ns2: bytes
) -> None:
    # in particular: a request of tenant B, whatever id it sends, never addresses A's space
    if (t1, ns1) != (t2, ns2):
        assert scope_namespace(t1, ns1) != scope_namespace(t2, ns2)


@pytest.mark.parametrize("bad", ["-x", "a b", "é", "x" * 65, ".hidden"])
def test_a_bad_tenant_name_is_refused_naming_the_value(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="is not a tenant name") as e:
        check_tenant(bad, what="Client(tenant=...)")
    assert "Client(tenant=...)" in str(e.value)
    with pytest.raises(InvalidArgument):
        scope_namespace(bad, b"ns")


def test_a_stored_id_past_255_bytes_is_refused_with_both_lengths() -> None:
    with pytest.raises(InvalidArgument, match="250 bytes.*258 bytes"):
        scope_namespace("tenant", bytes(250))


def test_malformed_stored_ids_are_refused_by_split_and_shared_for_tenant_of() -> None:
    for raw in (b"\xff", b"\xff\x05ab", b"\xff\x02\x00\x01", b"\xff\x01-"):
        with pytest.raises(InvalidArgument):
            split_namespace(raw)
        assert tenant_of(raw) == ""


def test_a_data_plane_caller_may_address_only_its_own_tenant_unless_it_may_cross() -> None:
    mine, theirs = scope_namespace("a", b"ns"), scope_namespace("b", b"ns")
    check_stored_namespace(mine, tenant="a", may_cross=False, action="GET")
    check_stored_namespace(theirs, tenant="a", may_cross=True, action="GET")
    with pytest.raises(PermissionDenied, match="tenant 'a'.*tenant 'b'"):
        check_stored_namespace(theirs, tenant="a", may_cross=False, action="GET")


def test_the_64_byte_limit_applies_to_the_clients_id_not_to_its_tenant_prefix() -> None:
    longest = "t" * 64
    stored = scope_namespace(longest, bytes(64))
    assert len(stored) == 130
    check_namespace_length(stored)  # a 64-byte id of a 64-character tenant is fine
    check_namespace_length(scope_namespace("", b"\xff" + bytes(63)))  # escaped: 66 bytes
    for bad in (bytes(65), scope_namespace("a", bytes(65))):
        with pytest.raises(InvalidArgument, match="namespace_id is 65 bytes; at most 64"):
            check_namespace_length(bad)

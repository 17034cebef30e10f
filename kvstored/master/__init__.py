"""The metadata master: block index, membership, placement, MasterService (never payloads)."""

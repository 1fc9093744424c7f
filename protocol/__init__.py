"""Wire schema, codec and small shared plumbing used by every turnstream role."""

PROTOCOL_VERSION = 2

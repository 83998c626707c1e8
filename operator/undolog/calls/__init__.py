"""Calls to participants: the wire protocol's headers, the function registry, the transport
seam (HTTP is one transport) and the retry loop."""

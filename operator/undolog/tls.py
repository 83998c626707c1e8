"""TLS helpers shared by the API's client and the participants' transport."""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path


def load_certificate_chain(context: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """Present this certificate: Python's ssl loads a chain only from files, so they are written
    to a private directory for the moment they are read."""
    with tempfile.TemporaryDirectory(prefix="undolog-tls-") as folder:
        chain_file, key_file = Path(folder, "tls.crt"), Path(folder, "tls.key")
        chain_file.write_bytes(chain)
        key_file.touch(mode=0o600)
        key_file.write_bytes(key)
        context.load_cert_chain(chain_file, key_file)

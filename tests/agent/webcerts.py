"""Test certificate authorities and web config files for the agent's TLS and auth tests."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import trustme


# Cost 4 keeps the tests fast; the format and the check are the same as at cost 10.
def hashed(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


@dataclass
class Pki:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate, as files in `folder`."""

    folder: Path
    ca: trustme.CA
    server_cert: Path
    server_key: Path
    ca_file: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def make(cls, folder: Path, client_name: str = "prometheus.monitoring.svc") -> Pki:
        ca = trustme.CA()
        server = ca.issue_cert("localhost", "127.0.0.1")
        client = ca.issue_cert(client_name)
        paths = {
            name: folder / f"{name}.pem"
            for name in ("server_cert", "server_key", "ca_file", "client_cert", "client_key")
        }
        server.cert_chain_pems[0].write_to_path(str(paths["server_cert"]))
        server.private_key_pem.write_to_path(str(paths["server_key"]))
        ca.cert_pem.write_to_path(str(paths["ca_file"]))
        client.cert_chain_pems[0].write_to_path(str(paths["client_cert"]))
        client.private_key_pem.write_to_path(str(paths["client_key"]))
        return cls(folder=folder, ca=ca, **paths)

    def server_context(self, require_client_cert: bool = False) -> ssl.SSLContext:
        """A server's TLS context with this PKI's server certificate; one that asks every client for a
        certificate this CA signed with `require_client_cert`."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.server_cert), str(self.server_key))
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=str(self.ca_file))
        return context

    def web_config(self, extra: str = "", client_auth: str = "NoClientCert") -> Path:
        """Write a web config serving this PKI's server certificate, plus `extra` YAML; return its path."""
        path = self.folder / "web.yml"
        path.write_text(
            "tls_server_config:\n"
            f"  cert_file: {self.server_cert.name}\n"
            f"  key_file: {self.server_key.name}\n"
            f"  client_auth_type: {client_auth}\n"
            + (f"  client_ca_file: {self.ca_file.name}\n" if client_auth != "NoClientCert" else "")
            + extra
        )
        return path

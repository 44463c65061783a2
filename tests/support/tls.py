"""A throwaway certificate authority for tests: a CA, a server certificate for
127.0.0.1/localhost and a client certificate, all PEM files made with the openssl CLI.

    files = make_tls_files(tmp_path)   # files.ca, files.server_cert, files.client_key, ...
    ctx = files.client_context()       # an ssl.SSLContext that trusts the CA, with the client cert
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL_BIN = shutil.which("openssl") or "/usr/bin/openssl"
_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA certificate (what clients and the server trust)
    server_cert: Path
    server_key: Path
    client_cert: Path  # signed by the same CA (for servers that ask for one)
    client_key: Path

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL_BIN, *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _signed(directory: Path, name: str, subject: str, extensions: str) -> tuple[Path, Path]:
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    ext_file = directory / f"{name}.ext"
    ext_file.write_text(extensions + "\n")
    _openssl("req", *_EC, "-keyout", str(key), "-out", str(csr), "-subj", subject, cwd=directory)
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext_file),
        cwd=directory,
    )  # fmt: skip
    return cert, key


def make_tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=gateway-test-ca",
        cwd=directory,
    )  # fmt: skip
    server_cert, server_key = _signed(
        directory,
        "server",
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth",
    )
    client_cert, client_key = _signed(
        directory, "client", "/CN=gateway", "extendedKeyUsage=clientAuth"
    )
    return TlsFiles(directory / "ca.crt", server_cert, server_key, client_cert, client_key)

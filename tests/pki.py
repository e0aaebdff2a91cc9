"""Throw-away certificates for the TLS tests, made at test time with the ``openssl`` CLI
(argument lists, no shell): a CA, a server certificate for 127.0.0.1/localhost signed by it,
and a client certificate signed by it. Nothing here is checked in.

    p = make_pki(tmp_path)          # p.ca, p.server_crt, p.server_key, p.client_crt, ...
    ctx = p.client_context()        # trusts p.ca; with_cert=True presents the client cert
    write_web_config(tmp_path / "web.yml", p, users={"prom": "secret"})
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt

OPENSSL = shutil.which("openssl")


def _openssl(*args: str | Path, cwd: Path) -> None:
    r = subprocess.run([OPENSSL, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args[:2]))}: {r.stderr.strip()}")


@dataclass
class PKI:
    dir: Path
    ca: Path
    ca_key: Path
    server_crt: Path
    server_key: Path
    client_crt: Path
    client_key: Path

    def client_context(self, with_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if with_cert:
            ctx.load_cert_chain(str(self.client_crt), str(self.client_key))
        return ctx

    def sign(self, name: str, cn: str, san: str, client: bool = False) -> tuple[Path, Path]:
        """A new key and certificate ``name``.crt/.key signed by the CA."""
        d = self.dir
        key, csr, crt = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt"
        ext = d / f"{name}.ext"
        usage = "clientAuth" if client else "serverAuth"
        ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n"
                       "basicConstraints=critical,CA:FALSE\n")
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={cn}", cwd=d)
        _openssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key,
                 "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", crt, cwd=d)
        return crt, key


def make_pki(d: Path) -> PKI:
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key = d / "ca.crt", d / "ca.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=hftagent test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    p = PKI(d, ca, ca_key, d / "server.crt", d / "server.key", d / "client.crt",
            d / "client.key")
    p.sign("server", "localhost", "DNS:localhost,IP:127.0.0.1")
    p.sign("client", "prometheus", "DNS:prometheus.example,URI:spiffe://example/prom",
           client=True)
    return p


def bcrypt_hash(password: str, cost: int = 4) -> str:
    """Cost 4 (the minimum) keeps tests fast; deployments use 10 or more."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


def write_web_config(path: Path, p: PKI | None, users: dict[str, str] | None = None,
                     extra_tls: str = "", extra: str = "") -> Path:
    lines = []
    if p is not None:
        lines += ["tls_server_config:", f"  cert_file: {p.server_crt}",
                  f"  key_file: {p.server_key}"]
        lines += [f"  {ln}" for ln in extra_tls.splitlines() if ln.strip()]
    if users:
        lines.append("basic_auth_users:")
        lines += [f"  {u}: '{bcrypt_hash(pw)}'" for u, pw in users.items()]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path

"""Key material for a test cluster: a cluster token, a TLS CA + node certificate, CurveZMQ keys.

Used by ``aionet keys DIR``. TLS material is made with the ``cryptography`` package when it
is installed (``pip install 'aionet[tls]'``), else with the ``openssl`` command line tool.
Secret files are created with mode 0600 (never briefly world-readable).

The generated certificate is one node certificate shared by every node of the test cluster,
valid for both TLS roles (server and client, for mutual TLS) and for ``localhost``,
``127.0.0.1``, ``::1``, this host's name and any extra ``hosts`` given.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import AionetError

TOKEN_FILE = "token"
CA_CERT = "ca.pem"
CA_KEY = "ca.key"
NODE_CERT = "node.pem"
NODE_KEY = "node.key"
CURVE_PUBLIC = "curve.public"
CURVE_SECRET = "curve.secret"
ALL_FILES = (TOKEN_FILE, CA_CERT, CA_KEY, NODE_CERT, NODE_KEY, CURVE_PUBLIC, CURVE_SECRET)


class KeygenError(AionetError):
    """Key material could not be generated (no backend, files exist, tool failed)."""


@dataclass(frozen=True)
class KeySet:
    """Paths of a generated key set."""

    directory: Path
    token_file: Path
    ca_cert: Path
    ca_key: Path
    node_cert: Path
    node_key: Path
    curve_public: Path | None
    curve_secret: Path | None
    tls_backend: str

    def config_snippet(self) -> str:
        """The TOML a node needs to use these files (every node of the cluster uses the same)."""
        lines = [
            "[security]",
            f'token_file = "{self.token_file}"',
            f'tls_cert = "{self.node_cert}"',
            f'tls_key = "{self.node_key}"',
            f'tls_ca = "{self.ca_cert}"         # mutual TLS: peers must present a cert signed by this CA',
            "",
            "[node]",
            'listen = ["tls://0.0.0.0:7700"]      # or zmq+tcp:// (CurveZMQ below), or tcp:// with only the token',
        ]
        if self.curve_public is not None and self.curve_secret is not None:
            # One shared pair: each listener is a CURVE server with it, each dial expects it
            # (curve_server_key_file) and presents it (curve_allowed_clients defaults to it).
            lines += [
                "",
                "[transport]                          # CurveZMQ: encrypts and authenticates zmq+tcp:// (and zmq+ipc://)",
                f'zmq = {{ curve_public_key_file = "{self.curve_public}", '
                f'curve_secret_key_file = "{self.curve_secret}" }}',
            ]
        return "\n".join(lines) + "\n"


def _write(path: Path, data: bytes, secret: bool) -> None:
    """Create ``path`` exclusively with its final mode (0600 for secrets, 0644 otherwise)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    try:
        os.fchmod(fd, 0o600 if secret else 0o644)  # the umask may have narrowed 0644
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def new_token(nbytes: int = 32) -> bytes:
    """A random cluster token (URL-safe text; ``nbytes`` random bytes of entropy)."""
    return secrets.token_urlsafe(nbytes).encode()


def _hosts(extra: list[str]) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) the node certificate is valid for."""
    names = ["localhost"]
    ips = ["127.0.0.1", "::1"]
    candidates = [socket.gethostname(), *extra]
    for h in candidates:
        h = h.strip()
        if not h:
            continue
        try:
            ip = str(ipaddress.ip_address(h.strip("[]")))
        except ValueError:
            if h not in names:
                names.append(h)
        else:
            if ip not in ips:
                ips.append(ip)
    return names, ips


# ------------------------------------------------------------------ cryptography backend
def _have_cryptography() -> bool:
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        return False
    return True


def _tls_cryptography(names: list[str], ips: list[str], days: int) -> tuple[bytes, bytes, bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(minutes=5)  # tolerate small clock skew
    until = now + _dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aionet test cluster CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    node_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    node_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aionet node")]))
        .issuer_name(ca_name)
        .public_key(node_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def key_pem(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    pem = serialization.Encoding.PEM
    return ca_cert.public_bytes(pem), key_pem(ca_key), node_cert.public_bytes(pem), key_pem(node_key)


# ------------------------------------------------------------------ openssl CLI backend
def _run_openssl(openssl: str, cwd: str, cmd: str, *extra: str) -> None:
    """Run ``openssl`` with the space-separated ``cmd`` words plus ``extra`` arguments in ``cwd``."""
    args = [*cmd.split(), *extra]
    try:
        subprocess.run([openssl, *args], cwd=cwd, check=True, capture_output=True, timeout=60)
    except subprocess.CalledProcessError as exc:
        err = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        raise KeygenError(f"openssl {args[0]} failed: {err[-1] if err else exc}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KeygenError(f"cannot run openssl: {exc}") from None


def _tls_openssl(names: list[str], ips: list[str], days: int) -> tuple[bytes, bytes, bytes, bytes]:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise KeygenError(
            "cannot generate TLS certificates: neither the 'cryptography' package nor the 'openssl' "
            "command is available; install one (pip install 'aionet[tls]')"
        )
    san = ",".join([f"DNS:{n}" for n in names] + [f"IP:{i}" for i in ips])
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    with tempfile.TemporaryDirectory(prefix="aionet-keys-") as tmp:
        os.chmod(tmp, 0o700)
        _run_openssl(
            openssl, tmp, f"req -x509 {ec} -keyout ca.key -out ca.pem -days {days}",
            "-subj", "/CN=aionet test cluster CA",
            "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        )  # fmt: skip
        _run_openssl(openssl, tmp, f"req -new {ec} -keyout node.key -out node.csr", "-subj", "/CN=aionet node")
        Path(tmp, "ext.cnf").write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            f"subjectAltName={san}\n"
        )
        _run_openssl(
            openssl, tmp,
            f"x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem -sha256 -days {days}",
            "-extfile", "ext.cnf",
        )  # fmt: skip
        read = [Path(tmp, f).read_bytes() for f in ("ca.pem", "ca.key", "node.pem", "node.key")]
    return read[0], read[1], read[2], read[3]


def tls_backend() -> str:
    """Which backend :func:`generate` uses: "cryptography", "openssl" or "none"."""
    if _have_cryptography():
        return "cryptography"
    return "openssl" if shutil.which("openssl") else "none"


# ------------------------------------------------------------------ CurveZMQ
def curve_keypair() -> tuple[bytes, bytes] | None:
    """(public, secret) Z85 CurveZMQ keys, or None when libzmq was built without CURVE."""
    import zmq

    if not zmq.has("curve"):
        return None
    return zmq.curve_keypair()


# ------------------------------------------------------------------ all together
def generate(
    directory: str | os.PathLike[str],
    *,
    hosts: list[str] | None = None,
    days: int = 365,
    force: bool = False,
    backend: str = "auto",
) -> KeySet:
    """Write a token, a CA and node certificate/key, and CurveZMQ keys into ``directory``.

    Refuses to overwrite existing files unless ``force``. ``backend`` is "auto",
    "cryptography" or "openssl".
    """
    if days <= 0:
        raise KeygenError("days must be positive")
    d = Path(directory).expanduser().resolve()
    d.mkdir(parents=True, exist_ok=True)
    existing = [f for f in ALL_FILES if (d / f).exists()]
    if existing and not force:
        raise KeygenError(f"{d} already holds {', '.join(existing)}; pass --force to replace them")
    if backend == "auto":
        backend = tls_backend()
        if backend == "none":
            backend = "openssl"  # raises the explanatory error below
    names, ips = _hosts(list(hosts or []))
    if backend == "cryptography":
        if not _have_cryptography():
            raise KeygenError("the 'cryptography' package is not installed (pip install 'aionet[tls]')")
        ca_pem, ca_key, node_pem, node_key = _tls_cryptography(names, ips, days)
    elif backend == "openssl":
        ca_pem, ca_key, node_pem, node_key = _tls_openssl(names, ips, days)
    else:
        raise KeygenError(f"unknown TLS backend {backend!r} (auto, cryptography, openssl)")
    curve = curve_keypair()
    for f in existing:
        (d / f).unlink()
    _write(d / TOKEN_FILE, new_token() + b"\n", secret=True)
    _write(d / CA_CERT, ca_pem, secret=False)
    _write(d / CA_KEY, ca_key, secret=True)
    _write(d / NODE_CERT, node_pem, secret=False)
    _write(d / NODE_KEY, node_key, secret=True)
    if curve is not None:
        _write(d / CURVE_PUBLIC, curve[0] + b"\n", secret=False)
        _write(d / CURVE_SECRET, curve[1] + b"\n", secret=True)
    return KeySet(
        directory=d,
        token_file=d / TOKEN_FILE,
        ca_cert=d / CA_CERT,
        ca_key=d / CA_KEY,
        node_cert=d / NODE_CERT,
        node_key=d / NODE_KEY,
        curve_public=d / CURVE_PUBLIC if curve is not None else None,
        curve_secret=d / CURVE_SECRET if curve is not None else None,
        tls_backend=backend,
    )

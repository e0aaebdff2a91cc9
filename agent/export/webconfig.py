"""``--web.config.file``: TLS and basic auth for the /metrics exporter, in the web
configuration format of the Prometheus exporter toolkit (the file node_exporter reads):

    tls_server_config:
      cert_file: server.crt            # relative paths: from the config file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: clients-ca.crt
      min_version: TLS12               # default TLS12; max_version default TLS13
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

    cfg = load_web_config("/etc/hftagent/web-config.yml")   # AgentError: one line
    cfg.tls.context()          # ssl.SSLContext for new connections (None: plain HTTP)
    cfg.auth.check(header, peer)   # Authorization value, client address -> bool (None: no auth)

The file is read once, at start; a bad file is an error then, never at the first scrape.
What the toolkit does per connection we do as well where it matters: the certificate, key
and client CA files are read again when they change (checked at most every 5 s on a new
connection), so a rotated certificate is served without a restart; if the new files do not
load, the old context stays and a warning goes to stderr.

Strict, like the toolkit's ``yaml.UnmarshalStrict``: unknown or duplicate keys, wrong
types and values are errors. A key the toolkit knows but this exporter cannot honour is an
error too, never silently ignored: inline ``cert``/``key`` (use the files), ``curve_
preferences`` (Python's ssl module sets one curve, not a preference list),
``client_auth_type`` RequestClientCert / RequireAnyClientCert (certificates accepted without
verification: OpenSSL through Python cannot, and the toolkit calls them insecure),
``http2: true`` (this server speaks HTTP/1.1, which every Prometheus scrapes) and
``rate_limit``.

Basic auth: bcrypt (the ``bcrypt`` package, constant-time compare). A check costs ~50-100 ms
at cost 10, so each verified (user, hash, password) is remembered — under an HMAC with a
per-process random key, never the password itself — and later scrapes cost a dictionary
lookup. An unknown user is checked against a dummy hash of the same cost, so the answer's
timing does not say which users exist; checks run one at a time in each of two lanes (at
most one CPU spent on bcrypt however many wrong guesses arrive, plus a trickle for
addresses that have been guessing), a
wrong password is remembered apart from the right ones (guesses cannot push the scraper's
entry out), and a flood of guesses, from however many rotating addresses, neither waits
ahead of a scraper from another address nor gets checked past a budget that all addresses
share (:class:`BasicAuth`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import re
import ssl
import stat
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import AgentError

MAX_FILE_BYTES = 1 << 20  # a certificate chain or a key is far smaller
# The web config itself: a few users and file names (the shipped example is 1.4 KB), 64 KiB
# leaves room for an inline client_ca bundle. PyYAML's pure-Python loader took 8-15 s and
# 400 MB on a 1 MiB file; 64 KiB of the worst shape loads in about a second.
MAX_CONFIG_BYTES = 64 << 10
# The deepest the format goes is 3 (tls_server_config.client_allowed_sans: [...]); PyYAML's
# composer recurses per level, and 10,000 levels raised RecursionError.
MAX_DEPTH = 32
RELOAD_CHECK_S = 5.0

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# Go's crypto/tls names (the toolkit accepts those of tls.CipherSuites()) -> OpenSSL's.
# TLS 1.3 suites are accepted and, as in Go, not configurable: all three stay enabled.
CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": None, "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}
# The response headers the toolkit lets a config set, with their allowed values (None: any).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None, "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "client_ca",
            "client_allowed_sans", "min_version", "max_version", "cipher_suites",
            "prefer_server_cipher_suites", "cert", "key", "curve_preferences")
# $2a$/$2b$/$2y$ (htpasswd writes 2y), two-digit cost, 22 salt + 31 hash characters of
# bcrypt's base64; the salt's last character carries 2 bits, so only ".Oeu" are canonical.
BCRYPT_RE = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{21}[.Oeu][./A-Za-z0-9]{31}")


def _err(path: str, msg: str) -> AgentError:
    return AgentError(f"--web.config.file {path}: {msg}")


def read_regular(path: str, what: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """A regular file's bytes, at most ``limit``. Opened non-blocking so that a FIFO in its
    place cannot hang the start, and checked to be a regular file (not /dev/zero, not a
    directory) before a byte is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise AgentError(f"{what} {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AgentError(f"{what} {path}: not a regular file")
        if st.st_size > limit:
            raise AgentError(f"{what} {path}: larger than {limit} bytes")
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, limit + 1 - n)
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > limit:
            raise AgentError(f"{what} {path}: larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise AgentError(f"{what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


# ---- YAML ---------------------------------------------------------------------------------

def _strict_loader() -> type:
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses a key given twice (PyYAML keeps the last one silently) and
        nesting deeper than :data:`MAX_DEPTH` (before the recursion it would cost)."""

        _depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self._depth >= MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_DEPTH} levels deep",
                    self.peek_event().start_mark)
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    def mapping(loader: Any, node: Any, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                dup = key in seen
            except TypeError:  # a list or mapping as a key
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a scalar", key_node.start_mark) from None
            if dup:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return StrictLoader


def _parse_yaml(text: bytes, path: str) -> Any:
    import yaml
    try:
        return yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        what = " ".join(str(exc.problem or exc.context or "bad YAML").split())
        raise _err(path, f"bad YAML at {where}{what}") from None
    except yaml.YAMLError as exc:
        raise _err(path, "bad YAML: " + " ".join(str(exc).split())) from None
    except RecursionError:  # not reached with MAX_DEPTH; a last guard, never a traceback
        raise _err(path, "bad YAML: nested too deeply") from None


# ---- the config ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TLSSettings:
    cert_file: str
    key_file: str
    client_auth: str = "NoClientCert"
    client_ca_file: str | None = None
    client_ca_pem: str | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    ciphers: tuple[str, ...] = ()
    prefer_server_ciphers: bool = True
    client_allowed_sans: tuple[str, ...] | None = None

    def files(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)


class _Encrypted(Exception):
    pass


def _no_password() -> bytes:
    # load_cert_chain would otherwise prompt on the terminal for an encrypted key
    raise _Encrypted


def build_context(t: TLSSettings) -> ssl.SSLContext:
    """A server SSLContext for ``t``; AgentError naming the file and what is wrong."""
    cert = read_regular(t.cert_file, "tls_server_config.cert_file")
    if b"-----BEGIN CERTIFICATE-----" not in cert:
        raise AgentError(f"tls_server_config.cert_file {t.cert_file}: no PEM certificate")
    key = read_regular(t.key_file, "tls_server_config.key_file")
    if not re.search(rb"-----BEGIN (\w+ )?PRIVATE KEY-----", key):
        raise AgentError(f"tls_server_config.key_file {t.key_file}: no PEM private key")
    if b"ENCRYPTED" in key:
        raise AgentError(f"tls_server_config.key_file {t.key_file}: the key is encrypted "
                         "(a passphrase cannot be given; use an unencrypted key readable "
                         "by this user only)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[t.min_version]
    ctx.maximum_version = TLS_VERSIONS[t.max_version]
    if t.prefer_server_ciphers:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    suites = [CIPHERS[c] for c in t.ciphers if CIPHERS[c]]
    if suites:
        try:
            ctx.set_ciphers(":".join(suites))
        except ssl.SSLError:
            raise AgentError("tls_server_config.cipher_suites: none of them is available "
                             "in this OpenSSL") from None
    try:
        # Read from the paths again (ssl loads only from files), right after the checks
        # above: the files are root's configuration, not a place others can swap.
        ctx.load_cert_chain(t.cert_file, t.key_file, password=_no_password)
    except _Encrypted:
        raise AgentError(f"tls_server_config.key_file {t.key_file}: the key is encrypted "
                         "(a passphrase cannot be given)") from None
    except ssl.SSLError as exc:
        why = ("key_file does not match cert_file" if "KEY_VALUES_MISMATCH" in str(exc)
               else f"cannot load the certificate and key ({exc.reason or exc})")
        raise AgentError(f"tls_server_config: {why}") from None
    except OSError as exc:
        raise AgentError(f"tls_server_config: cannot read the certificate or key: "
                         f"{exc.strerror or exc}") from None
    ctx.verify_mode = CLIENT_AUTH[t.client_auth]
    if t.client_ca_file or t.client_ca_pem:
        what = ("tls_server_config.client_ca_file " + t.client_ca_file if t.client_ca_file
                else "tls_server_config.client_ca")
        data = (read_regular(t.client_ca_file, "tls_server_config.client_ca_file").decode(
            "ascii", "replace") if t.client_ca_file else t.client_ca_pem)
        try:
            ctx.load_verify_locations(cadata=data)
        except (ssl.SSLError, ValueError) as exc:
            raise AgentError(f"{what}: no usable CA certificate "
                             f"({getattr(exc, 'reason', None) or exc})") from None
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def san_allowed(peercert: dict | None, allowed: tuple[str, ...]) -> bool:
    """The toolkit's client_allowed_sans: some SAN of the client certificate (DNS, IP,
    e-mail, URI) equals an entry exactly; IP addresses compare as addresses (OpenSSL writes
    IPv6 SANs expanded, Go compressed)."""
    if not peercert:
        return False
    for kind, value in peercert.get("subjectAltName", ()):
        for a in allowed:
            if kind == "IP Address":
                try:
                    if ipaddress.ip_address(value.strip()) == ipaddress.ip_address(a):
                        return True
                except ValueError:
                    continue
            elif kind in ("DNS", "email", "URI") and value == a:
                return True
    return False


class TLSServer:
    """The SSLContext for new connections, rebuilt when the certificate, key or CA files
    change (mtime, size, inode), checked at most every ``check_s`` seconds."""

    def __init__(self, settings: TLSSettings, check_s: float = RELOAD_CHECK_S) -> None:
        self.settings = settings
        self.check_s = check_s
        self._stamp = self._stamps()
        self._ctx = build_context(settings)
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self.reloads = 0
        self.reload_error: str | None = None

    def _stamps(self) -> tuple:
        out = []
        for p in self.settings.files():
            try:
                st = os.stat(p)
                out.append((st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev))
            except OSError as exc:
                out.append(exc.errno)
        return tuple(out)

    def context(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked < self.check_s:
            return self._ctx
        with self._lock:
            if now - self._checked < self.check_s:
                return self._ctx
            self._checked = now
            stamp = self._stamps()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._ctx = build_context(self.settings)
                    self.reloads += 1
                    self.reload_error = None
                except AgentError as exc:
                    self.reload_error = str(exc)
                    print(f"hftagent: warning: --web.config.file: the changed TLS files do "
                          f"not load, serving the previous certificate: {exc}",
                          file=sys.stderr)
            return self._ctx


class AuthBusy(Exception):
    """An unverified password that is not checked now: answered ``status`` (503: the bcrypt
    queue is full or this peer has a check in flight; 429: this peer failed too often
    lately) with ``Retry-After: retry_after_s``, at once, instead of holding a worker
    thread. A scraper whose password was verified once never gets it: it is served from
    the cache."""

    def __init__(self, status: int = 503, retry_after_s: int = 1) -> None:
        super().__init__(status, retry_after_s)
        self.status = status
        self.retry_after_s = retry_after_s


def peer_key(addr: str | None) -> str | None:
    """The unit a peer's failures are counted in: an IPv4 address, an IPv6 /64 (what one
    host or customer gets: counting single addresses would let it rotate through 2^64)."""
    if not addr:
        return None
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return addr
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class _Peer:
    __slots__ = ("tokens", "load", "stamp", "busy", "throttled")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens, self.stamp, self.busy = tokens, stamp, False
        self.load = 0.0         # distinct unverified credentials lately (decaying)
        self.throttled = False  # spent its budget; cleared when the budget is whole again


# bcrypt lanes, one check at a time in each: clients in good standing, and addresses that
# presented other unverified credentials lately (their checks spend the global budget)
# the bcrypt lanes (6.): peers in good standing, peers that guessed lately, and credentials
# retried from a guessing peer once the global budget is spent (their own trickle, 4.)
CLEAN, GUESSING, RETRYING = "clean", "guessing", "retrying"


class _Waiter:
    __slots__ = ("prio", "seq", "lane", "peer", "bumped")

    def __init__(self, prio: float, seq: int, lane: str, peer: _Peer | None) -> None:
        self.prio, self.seq, self.lane, self.peer = prio, seq, lane, peer
        self.bumped = False

    def rank(self) -> tuple[float, int]:
        """Its standing now (its address may have kept guessing while it waited: the
        credentials since count too, less its own), then arrival order."""
        p = self.peer
        return (max(self.prio, p.load - 1.0) if p is not None else self.prio, self.seq)


class _Seen:
    """The (peer, credential) pairs presented lately, kept for a time, not a count: two
    generations of a Bloom filter (:attr:`BITS` bits each, :attr:`HASHES` bits a pair), the
    current one replaced by a fresh one when it holds :attr:`CAPACITY` pairs or is
    :attr:`SPAN_S` old; a pair is seen if either generation has it. A flood of distinct
    guesses therefore cannot push a scraper's credential out before its retry: at 20,000
    guesses a second a pair is kept 15 s or more (an LRU table of 8,192 lost it in half a
    second). False positives: about 2 in a million per generation at capacity. Memory:
    2 x BITS / 8 bytes, touched only as pairs arrive."""

    BITS = 1 << 25
    HASHES = 4
    CAPACITY = 300_000
    SPAN_S = 60.0

    def __init__(self, key: bytes, now: float) -> None:
        self._key = key
        self._old = bytearray(0)
        self._new = bytearray(self.BITS // 8)
        self._count, self._since = 0, now

    def _bits(self, pkey: str, key: bytes) -> list[int]:
        d = hashlib.blake2b(pkey.encode() + b"\0" + key, key=self._key,
                            digest_size=4 * self.HASHES).digest()
        return [int.from_bytes(d[i:i + 4], "little") % self.BITS
                for i in range(0, 4 * self.HASHES, 4)]

    @staticmethod
    def _has(bits: bytearray, idx: list[int]) -> bool:
        return bool(bits) and all(bits[i >> 3] & (1 << (i & 7)) for i in idx)

    def check_and_add(self, pkey: str, key: bytes, now: float) -> bool:
        """Whether the pair was presented lately; it is remembered from now on."""
        idx = self._bits(pkey, key)
        if self._has(self._new, idx):
            return True
        seen = self._has(self._old, idx)
        if self._count >= self.CAPACITY or now - self._since >= self.SPAN_S:
            self._old, self._new = self._new, bytearray(self.BITS // 8)
            self._count, self._since = 0, now
        for i in idx:
            self._new[i >> 3] |= 1 << (i & 7)
        self._count += 1
        return seen


class BasicAuth:
    """``basic_auth_users`` checks (see the module docstring).

    bcrypt is slow on purpose (60-100 ms at cost 10), so a flood of wrong passwords must
    not decide when a good one is checked. Source addresses are no scarce resource (a local
    user has all of 127.0.0.0/8), so no budget may grow with their number. In the order
    :meth:`check` applies them:

    1. A verified (user, hash, password) is remembered (HMAC under a per-process key, the
       last :attr:`CACHE`): a dictionary lookup, whatever else is going on; the server
       answers such a request ahead of every other (:meth:`cached`).
    2. A password that failed is remembered too (the last :attr:`BAD_CACHE`): a client
       repeating it (a scraper with a stale password, a dumb flood) costs a lookup and gets
       401 again, no bcrypt.
    3. Each peer (:func:`peer_key`) has a *standing*: the distinct unverified credentials
       it presented lately (each counts 1, halving every :attr:`LOAD_HALF_LIFE_S`; a
       credential presented again from the same address is not counted twice; a verified
       one clears it). Waiters are checked by standing — their address's now: one that
       kept guessing while its request waited falls back — then in arrival order, and a
       newcomer with a lower standing than the worst waiter of its lane (6.) takes its
       place (that one gets 503). A fresh scraper from an address that has not been
       guessing stands at 0, below every address of a flood however many it rotates
       through, as long as they are fewer than :attr:`PEERS` (the table of standings, least
       recently seen dropped first: past it an address comes back at 0, tied with the
       scraper).
    4. A global budget of failed checks for all addresses together
       (:attr:`GLOBAL_FAIL_BURST`, refilled at :attr:`GLOBAL_FAIL_PER_S`): once it is
       spent, a peer whose standing is 1 or more (it guessed lately) gets 429 without
       bcrypt, and until it is whole again a token that comes back goes only to a
       credential presented from the same address before (a scraper retrying), never to a
       new guess; a peer at a standing below 1 is always queued, so the budget is left to
       new clients. Such a retry also has a trickle of its own (:attr:`RETRY_FAIL_BURST`,
       refilled at :attr:`RETRY_FAIL_PER_S`, its own bcrypt lane), which the fresh
       addresses of a rotating flood (queued as new clients) cannot drain: a scraper whose
       address a flood shares gets through on a retry. Rotating addresses therefore buys a flood no more bcrypt than one
       address.
    5. Each peer also has its own budget of failed checks: :attr:`FAIL_BURST`, refilled at
       :attr:`FAIL_PER_S`; a scraper with a wrong password (one try per scrape interval)
       never spends it. Once a peer has spent it, and until it is whole again, its
       unverified passwords get 429 without bcrypt, and a token that comes back goes only
       to a credential presented from there before (a client retrying), never to a new
       guess.
    6. One unverified check per peer at a time (a second one gets 503). Two bcrypt lanes,
       one check at a time in each, at most :attr:`QUEUE` waiting in each: one for peers
       standing below 1, one for those above (4.), so a fresh scraper never waits behind a
       flood's check. bcrypt takes at most one CPU for peers in good standing and a trickle
       (the global budget) for the others, however many guesses arrive.

    :meth:`triage` applies the same rules for the server's event loop, which answers a
    refusal decided without bcrypt itself, without a worker.

    Nothing here depends on whether the user exists (an unknown user is checked against a
    dummy hash of the same cost, and standings count credentials, not users): no timing
    says which users exist. Memory is bounded by the class constants whatever the flood.

    A flood from the scraper's own address cannot be told from the scraper: there a fresh
    scraper shares that address's standing (its cached credential never does); firewall
    the port (docs/fleet.md)."""

    CACHE = 64
    BAD_CACHE = 4096
    QUEUE = 2
    FAIL_BURST = 8.0
    FAIL_PER_S = 0.2
    GLOBAL_FAIL_BURST = 16.0
    GLOBAL_FAIL_PER_S = 1.0
    RETRY_FAIL_BURST = 2.0
    RETRY_FAIL_PER_S = 0.5
    LOAD_HALF_LIFE_S = 60.0
    PENDING = 64
    PENDING_S = 2.0
    PEERS = 16384
    WAIT_S = 10.0

    def __init__(self, users: dict[str, bytes], clock: Any = time.monotonic) -> None:
        self.users = users
        self._cost = max(int(h[4:6]) for h in users.values())
        self._dummy: bytes | None = None
        self._dummy_lock = threading.Lock()
        self._key = os.urandom(32)
        self._clock = clock
        self._ok: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, None] = OrderedDict()
        self._seen = _Seen(os.urandom(32), clock())
        self._pending: OrderedDict[tuple[str, bytes], tuple[_Waiter, float]] = OrderedDict()
        self._peers: OrderedDict[str, _Peer] = OrderedDict()
        self._global = self.GLOBAL_FAIL_BURST
        self._global_stamp = clock()
        self._global_spent = False  # cleared when the budget is whole again
        self._retry = self.RETRY_FAIL_BURST  # the retried credentials' budget (4.)
        self._retry_stamp = self._global_stamp
        self._cond = threading.Condition(threading.Lock())
        self._running: set[str] = set()   # the lanes whose check is in progress
        self._queue: list[_Waiter] = []
        self._seq = 0
        self.checks = 0   # bcrypt computations done (the cache's hit rate, for tests/bench)
        self.gated = 0    # unverified passwords refused by the global budget

    @staticmethod
    def parse(header: str | None) -> tuple[str, bytes] | None:
        if not header:
            return None
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            raw = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = raw.partition(b":")
        if not sep:
            return None
        try:
            return user.decode("utf-8"), password
        except UnicodeDecodeError:
            return None

    def _digest(self, user: str, hashed: bytes, password: bytes) -> bytes:
        u = user.encode()
        msg = b"".join(len(x).to_bytes(4, "big") + x for x in (u, hashed, password))
        return hmac.new(self._key, msg, hashlib.sha256).digest()

    def _key_of(self, header: str | None) -> tuple[bytes, bytes | None, bytes] | None:
        """(keyed digest, the user's hash or None, the password) of a well-formed header;
        None if not."""
        creds = self.parse(header)
        if creds is None or len(creds[1]) > 72:
            return None  # bcrypt uses 72 bytes at most; the bcrypt package refuses more
        user, password = creds
        hashed = self.users.get(user)
        return self._digest(user, hashed or b"", password), hashed, password

    def cached(self, header: str | None) -> bool:
        """Whether ``header`` carries a credential verified before: answered at once,
        without bcrypt (the server puts such a request ahead of the others)."""
        k = self._key_of(header)
        if k is None or k[1] is None:
            return False
        with self._cond:
            return k[0] in self._ok

    def _peer(self, key: str, now: float) -> _Peer:
        """The peer's record with its tokens refilled and its load decayed to ``now``
        (lock held)."""
        p = self._peers.get(key)
        if p is None:
            p = self._peers[key] = _Peer(self.FAIL_BURST, now)
            while len(self._peers) > self.PEERS:
                old = next(iter(self._peers))
                if self._peers[old].busy:  # in flight: keep it, drop the next oldest
                    self._peers.move_to_end(old)
                    continue
                del self._peers[old]
        else:
            dt = max(0.0, now - p.stamp)
            p.tokens = min(self.FAIL_BURST, p.tokens + dt * self.FAIL_PER_S)
            p.load *= 0.5 ** (dt / self.LOAD_HALF_LIFE_S)
            p.stamp = now
            if p.tokens >= self.FAIL_BURST:
                p.throttled = False
            self._peers.move_to_end(key)
        return p

    def _remember(self, cache: OrderedDict, key: Any, bound: int) -> None:
        cache[key] = None
        cache.move_to_end(key)
        while len(cache) > bound:
            cache.popitem(last=False)

    def _admit(self, key: bytes, pkey: str) -> tuple[_Peer, float, str]:
        """Account an unverified credential from ``pkey`` and decide whether it may wait for
        bcrypt: (its peer, its priority, its lane), or AuthBusy (lock held)."""
        now = self._clock()
        p = self._peer(pkey, now)
        again = self._seen.check_and_add(pkey, key, now)
        standing = max(0.0, p.load - 1.0) if again else p.load  # not counting itself
        if not again:
            p.load += 1.0
        if p.throttled and (not again or p.tokens < 1.0):
            # over its own budget: a returning token goes to a credential tried before
            raise AuthBusy(429, max(1, int((1.0 - p.tokens) / self.FAIL_PER_S) + 1))
        if p.busy:
            raise AuthBusy(503, 1)
        g = self._global = min(self.GLOBAL_FAIL_BURST, self._global + max(
            0.0, now - self._global_stamp) * self.GLOBAL_FAIL_PER_S)
        self._global_stamp = now
        if g >= self.GLOBAL_FAIL_BURST:
            self._global_spent = False
        if standing < 1.0:
            return p, standing, CLEAN
        if g < 1.0 or (self._global_spent and not again):
            # the budget of all is spent: clients in good standing only, and a returning
            # token goes to a credential presented before (a client retrying), never to a
            # new guess, until the budget is whole again; such a retry also has a trickle of
            # its own, which new guesses (even in good standing) never drain
            if again and self._retry_tokens(now) >= 1.0:
                return p, standing, RETRYING
            self.gated += 1
            raise AuthBusy(429, max(1, int((1.0 - g) / self.GLOBAL_FAIL_PER_S) + 1))
        return p, standing, GUESSING

    def _retry_tokens(self, now: float) -> float:
        """The retried credentials' budget, refilled to ``now`` (lock held)."""
        self._retry = min(self.RETRY_FAIL_BURST, self._retry + max(
            0.0, now - self._retry_stamp) * self.RETRY_FAIL_PER_S)
        self._retry_stamp = now
        return self._retry

    def check(self, header: str | None, peer: str | None = None) -> bool:
        """Whether ``header`` (an Authorization value) names a user and its password.
        ``peer``: the client's address (None: no per-peer accounting). Raises
        :class:`AuthBusy` for a password that is not checked now."""
        k = self._key_of(header)
        if k is None:
            return False
        key, hashed, password = k
        known = hashed is not None
        with self._cond:
            if known and key in self._ok:
                self._ok.move_to_end(key)
                return True
            if key in self._bad:
                self._bad.move_to_end(key)
                return False
            pkey = peer_key(peer)
            if pkey is not None:
                self._pending.pop((pkey, key), None)  # triage's place: this is it
            p, prio, lane = (self._admit(key, pkey) if pkey is not None
                             else (None, 0.0, CLEAN))
            self._seq += 1
            me = _Waiter(prio, self._seq, lane, p)
            if lane in self._running or any(w.lane == lane for w in self._queue):
                self._enqueue(me)
                if p is not None:
                    p.busy = True
                try:
                    self._wait_turn(me)
                except AuthBusy:
                    if p is not None:
                        p.busy = False
                    raise
            elif p is not None:
                p.busy = True
            self._running.add(lane)
            self.checks += 1
        ok: bool | None = None
        try:
            ok = self._bcrypt(password, hashed)
        finally:
            with self._cond:
                self._settle(p, lane, key, ok, known)
        return bool(ok and known)

    def _settle(self, p: _Peer | None, lane: str, key: bytes, ok: bool | None,
                known: bool) -> None:
        """Book a finished check (lock held): a failure spends a token of the peer's budget
        and of the global one; a success clears the peer's standing."""
        self._running.discard(lane)
        if p is not None:
            p.busy = False
            if ok is False:
                p.tokens = max(0.0, p.tokens - 1.0)
                p.throttled = p.throttled or p.tokens < 1.0
            elif ok and known:
                p.load = 0.0
        if (ok is False or (ok and not known)) and lane == RETRYING:
            self._retry = max(0.0, self._retry - 1.0)
        elif ok is False or (ok and not known):
            self._global = max(0.0, self._global - 1.0)
            self._global_spent = self._global_spent or self._global < 1.0
        if ok and known:
            self._remember(self._ok, key, self.CACHE)
        elif ok is not None:
            self._remember(self._bad, key, self.BAD_CACHE)
        self._cond.notify_all()

    def triage(self, header: str | None, peer: str | None) -> tuple[int, int] | None:
        """What the server's event loop may answer itself, without a worker: (401, 0) for
        a password refused before, (429 or 503, Retry-After seconds) for one :meth:`check`
        would refuse now without bcrypt (counted the same: check() does not count it
        again). None: a worker's — no credential, a verified one, or a check to run. A
        flood's requests then never hold a connection waiting for a worker."""
        k = self._key_of(header)
        pkey = peer_key(peer)
        if k is None or pkey is None:
            return None
        key, hashed, _ = k
        with self._cond:
            if hashed is not None and key in self._ok:
                return None
            if key in self._bad:
                self._bad.move_to_end(key)
                return 401, 0
            try:
                p, prio, lane = self._admit(key, pkey)
            except AuthBusy as busy:
                return busy.status, busy.retry_after_s
            if not self._room(_Waiter(prio, self._seq + 1, lane, p), (pkey, key)):
                return 503, 1
        return None

    def _room(self, me: _Waiter, pair: tuple[str, bytes]) -> bool:
        """Whether ``me``, admitted by :meth:`triage`, has a place in its lane: counting
        the requests the loop admitted that have not reached :meth:`check` yet, so a burst
        of them cannot all be handed to workers (lock held). Admitted: it holds a place
        until check() takes it, for :attr:`PENDING_S` at most."""
        now = self._clock()
        while self._pending:
            old, (_, t) = next(iter(self._pending.items()))
            if now - t <= self.PENDING_S:
                break
            del self._pending[old]
        rivals = [w for w in self._queue if w.lane == me.lane]
        rivals += [w for w, _ in self._pending.values() if w.lane == me.lane]
        if len(rivals) >= self.QUEUE + (me.lane not in self._running):
            worst = max(rivals, key=_Waiter.rank)
            if me.rank()[0] >= worst.rank()[0]:
                return False
            for k, (w, _) in self._pending.items():  # a waiter is bumped in check()
                if w is worst:
                    del self._pending[k]
                    break
        self._pending[pair] = (me, now)
        self._pending.move_to_end(pair)
        while len(self._pending) > self.PENDING:
            self._pending.popitem(last=False)
        return True

    def _enqueue(self, me: _Waiter) -> None:
        """Join the lane's queue, taking the place of a worse waiter of the lane when it is
        full (lock held)."""
        mine = [w for w in self._queue if w.lane == me.lane]
        if len(mine) >= self.QUEUE:
            worst = max(mine, key=_Waiter.rank)
            if me.rank()[0] >= worst.rank()[0]:
                raise AuthBusy(503, 1)
            worst.bumped = True
            self._queue.remove(worst)
            self._cond.notify_all()
        self._queue.append(me)

    def _wait_turn(self, me: _Waiter) -> None:
        """Wait until ``me`` is first in its lane's queue and the lane's check is done
        (lock held)."""
        deadline = time.monotonic() + self.WAIT_S
        while True:
            if me.bumped:
                raise AuthBusy(503, 1)
            if me.lane not in self._running and min(
                    (w for w in self._queue if w.lane == me.lane), key=_Waiter.rank) is me:
                self._queue.remove(me)
                return
            left = deadline - time.monotonic()
            if left <= 0:  # a check that never ends: give the worker back
                self._queue.remove(me)
                self._cond.notify_all()
                raise AuthBusy(503, 1)
            self._cond.wait(left)

    def _bcrypt(self, password: bytes, hashed: bytes | None) -> bool:
        """One bcrypt check (the caller holds its lane's slot); an unknown user is checked
        against a dummy hash of the same cost."""
        import bcrypt
        if hashed is None:
            with self._dummy_lock:  # made once, on the first unknown user
                if self._dummy is None:
                    self._dummy = bcrypt.hashpw(b"not a password",
                                                bcrypt.gensalt(self._cost))
            hashed = self._dummy
        return bcrypt.checkpw(password, hashed)


@dataclass
class WebConfig:
    path: str
    tls_settings: TLSSettings | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    tls: TLSServer | None = None
    auth: BasicAuth | None = None

    def describe(self) -> str:
        parts = [f"TLS ({self.tls_settings.min_version}+"
                 + (f", client certificates {self.tls_settings.client_auth}"
                    if self.tls_settings.client_auth != "NoClientCert" else "") + ")"
                 if self.tls_settings else "no TLS",
                 f"basic auth ({len(self.users)} user{'s' if len(self.users) != 1 else ''})"
                 if self.users else "no auth"]
        return ", ".join(parts)


# ---- validation ---------------------------------------------------------------------------

def _mapping(v: Any, where: str, path: str) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _err(path, f"{where} must be a mapping, not {type(v).__name__}")
    for k in v:
        if not isinstance(k, str):
            raise _err(path, f"{where}: key {k!r} must be a string (quote it)")
    return v


def _string(v: Any, where: str, path: str) -> str:
    if not isinstance(v, str) or not v:
        raise _err(path, f"{where} must be a non-empty string")
    return v


def _unknown(m: dict, known: tuple[str, ...], where: str, path: str) -> None:
    bad = [k for k in m if k not in known]
    if bad:
        raise _err(path, f"unknown key {where}{bad[0]!r} (known: {', '.join(known)})")


def _tls(m: dict, base: Path, path: str) -> TLSSettings | None:
    _unknown(m, TLS_KEYS, "tls_server_config.", path)
    for k in ("cert", "key"):
        if k in m:
            raise _err(path, f"tls_server_config.{k} (inline PEM) is not supported: "
                             f"use {k}_file")
    if "curve_preferences" in m:
        raise _err(path, "tls_server_config.curve_preferences is not supported (Python's "
                         "ssl module cannot set a preference list): remove it to use "
                         "OpenSSL's defaults (X25519, P-256, ...)")
    enabled = any(k in m for k in ("cert_file", "key_file", "client_ca_file", "client_ca",
                                   "client_auth_type"))
    if not enabled:
        if m:
            raise _err(path, "tls_server_config without cert_file and key_file")
        return None

    def file(k: str) -> str | None:
        if k not in m:
            return None
        p = Path(_string(m[k], f"tls_server_config.{k}", path))
        return str(p if p.is_absolute() else base / p)

    cert, key = file("cert_file"), file("key_file")
    if cert is None:
        raise _err(path, "tls_server_config: missing cert_file")
    if key is None:
        raise _err(path, "tls_server_config: missing key_file")
    auth = m.get("client_auth_type", "NoClientCert") or "NoClientCert"
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise _err(path, f"tls_server_config.client_auth_type {auth} is not supported: it "
                         "accepts client certificates without verifying them; use "
                         "RequireAndVerifyClientCert with client_ca_file")
    if auth not in CLIENT_AUTH:
        raise _err(path, f"tls_server_config.client_auth_type {auth!r}: expected one of "
                         f"{', '.join(CLIENT_AUTH)}")
    ca_file = file("client_ca_file")
    ca_pem = m.get("client_ca")
    if ca_pem is not None:
        _string(ca_pem, "tls_server_config.client_ca", path)
        if ca_file:
            raise _err(path, "tls_server_config: client_ca and client_ca_file both given")
    has_ca = bool(ca_file or ca_pem)
    if has_ca and auth == "NoClientCert":
        raise _err(path, "tls_server_config: client CA configured without a client_auth_type")
    if not has_ca and auth != "NoClientCert":
        raise _err(path, f"tls_server_config.client_auth_type {auth} needs client_ca_file "
                         "(the CA the client certificates are checked against)")
    versions = {}
    for k, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        v = m.get(k, default)
        if v not in TLS_VERSIONS:
            raise _err(path, f"tls_server_config.{k} {v!r}: expected one of "
                             f"{', '.join(TLS_VERSIONS)}")
        versions[k] = v
    if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
        raise _err(path, "tls_server_config: min_version is above max_version")
    ciphers = m.get("cipher_suites") or []
    if not isinstance(ciphers, list) or not all(isinstance(c, str) for c in ciphers):
        raise _err(path, "tls_server_config.cipher_suites must be a list of names")
    for c in ciphers:
        if c not in CIPHERS:
            raise _err(path, f"tls_server_config.cipher_suites: unknown cipher {c!r}")
    prefer = m.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise _err(path, "tls_server_config.prefer_server_cipher_suites must be true or false")
    sans = m.get("client_allowed_sans")
    if sans is not None:
        if not isinstance(sans, list) or not all(isinstance(s, str) and s for s in sans):
            raise _err(path, "tls_server_config.client_allowed_sans must be a list of strings")
        if auth != "RequireAndVerifyClientCert":
            raise _err(path, "tls_server_config.client_allowed_sans needs client_auth_type "
                             "RequireAndVerifyClientCert")
    return TLSSettings(cert_file=cert, key_file=key, client_auth=auth, client_ca_file=ca_file,
                       client_ca_pem=ca_pem, min_version=versions["min_version"],
                       max_version=versions["max_version"], ciphers=tuple(ciphers),
                       prefer_server_ciphers=prefer,
                       client_allowed_sans=tuple(sans) if sans is not None else None)


def _http(m: dict, path: str) -> dict[str, str]:
    _unknown(m, ("http2", "headers"), "http_server_config.", path)
    http2 = m.get("http2", False)
    if not isinstance(http2, bool):
        raise _err(path, "http_server_config.http2 must be true or false")
    if http2:
        raise _err(path, "http_server_config.http2: true is not supported (this exporter "
                         "serves HTTP/1.1, which Prometheus scrapes unchanged): set it to "
                         "false or remove it")
    headers = _mapping(m.get("headers"), "http_server_config.headers", path)
    out = {}
    for k, v in headers.items():
        if k not in HEADERS:
            raise _err(path, f"http_server_config.headers: header {k!r} cannot be configured "
                             f"(allowed: {', '.join(HEADERS)})")
        if not isinstance(v, str):
            raise _err(path, f"http_server_config.headers.{k} must be a string")
        if "\r" in v or "\n" in v:
            raise _err(path, f"http_server_config.headers.{k}: a line break in a header value")
        allowed = HEADERS[k]
        if v and allowed is not None and v not in allowed:
            raise _err(path, f"http_server_config.headers.{k} {v!r}: expected one of "
                             f"{', '.join(allowed)}")
        if v:  # blank: unset, as in the toolkit
            out[k] = v
    return out


def _users(m: dict, path: str) -> dict[str, bytes]:
    out = {}
    for user, h in m.items():
        if not user or ":" in user:
            raise _err(path, f"basic_auth_users: bad user name {user!r} (non-empty, no ':')")
        if not isinstance(h, str) or not BCRYPT_RE.fullmatch(h):
            raise _err(path, f"basic_auth_users.{user}: not a bcrypt hash ($2y$10$ and 53 "
                             "characters; e.g. htpasswd -nBC 10 \"\" | tr -d ':\\n')")
        cost = int(h[4:6])
        if not 4 <= cost <= 31:
            raise _err(path, f"basic_auth_users.{user}: bcrypt cost {cost} out of 4..31")
        out[user] = h.encode("ascii")
    return out


def load_web_config(path: str) -> WebConfig:
    """Read, validate and prepare ``path`` (TLS context built, certificates loaded).
    AgentError with one line naming the file and the problem."""
    text = read_regular(path, "--web.config.file", MAX_CONFIG_BYTES)
    doc = _parse_yaml(text, path)
    top = _mapping(doc, "the file", path)
    _unknown(top, ("tls_server_config", "http_server_config", "basic_auth_users",
                   "rate_limit"), "", path)
    if "rate_limit" in top:
        raise _err(path, "rate_limit is not supported by this exporter (every connection "
                         "is bounded already: docs/fleet.md); remove it")
    base = Path(path).resolve().parent
    tls = _tls(_mapping(top.get("tls_server_config"), "tls_server_config", path), base, path)
    headers = _http(_mapping(top.get("http_server_config"), "http_server_config", path), path)
    users = _users(_mapping(top.get("basic_auth_users"), "basic_auth_users", path), path)
    cfg = WebConfig(path=path, tls_settings=tls, users=users, headers=headers)
    if tls is not None:
        try:
            cfg.tls = TLSServer(tls)
        except AgentError as exc:
            raise _err(path, str(exc)) from None
    if users:
        cfg.auth = BasicAuth(users)
    return cfg

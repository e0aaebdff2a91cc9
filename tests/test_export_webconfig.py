"""--web.config.file (agent.export.webconfig): the exporter-toolkit format, strictly; TLS and basic
auth on a live exporter; a bad file is one clean line from `hftagent watch`, before anything
starts."""

from __future__ import annotations

import base64
import http.client
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.errors import AgentError
from agent.export.metrics import WatchMetrics
from agent.export.server import Exporter
from agent.export.webconfig import AuthBusy, BasicAuth, _Seen, load_web_config
from tests.pki import OPENSSL, bcrypt_hash, make_pki, write_web_config

needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="openssl CLI not installed")
HFTAGENT = Path(sys.executable).with_name("hftagent")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if OPENSSL is None:
        pytest.skip("openssl CLI not installed")
    return make_pki(tmp_path_factory.mktemp("pki"))


def basic(user: str, pw: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()}


def get(ex: Exporter, headers=None, ctx=None, path="/metrics"):
    if ex.scheme == "https":
        c = http.client.HTTPSConnection("127.0.0.1", ex.port, timeout=10, context=ctx)
    else:
        c = http.client.HTTPConnection("127.0.0.1", ex.port, timeout=10)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, dict(r.headers), r.read()
    finally:
        c.close()


def metrics() -> WatchMetrics:
    m = WatchMetrics()
    m.observe(400_000)
    return m


# ---- parsing ------------------------------------------------------------------------------

def test_full_config_loads_with_relative_paths(pki, tmp_path):
    d = tmp_path / "etc"
    d.mkdir()
    for f in ("server.crt", "server.key", "ca.crt"):
        shutil.copy(pki.dir / f, d / f)
    h = bcrypt_hash("pw")
    (d / "web.yml").write_text(f"""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  client_allowed_sans: [prometheus.example]
  min_version: TLS13
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: false
http_server_config:
  http2: false
  headers:
    X-Content-Type-Options: nosniff
    X-Frame-Options: deny
    Content-Security-Policy: ""
basic_auth_users:
  prom: '{h}'
""")
    cfg = load_web_config(str(d / "web.yml"))
    t = cfg.tls_settings
    assert t.cert_file == str(d / "server.crt") and t.client_ca_file == str(d / "ca.crt")
    assert t.min_version == "TLS13" and t.client_auth == "RequireAndVerifyClientCert"
    assert cfg.headers == {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "deny"}
    assert cfg.users == {"prom": h.encode()}
    assert cfg.tls.context().minimum_version == ssl.TLSVersion.TLSv1_3
    assert "TLS" in cfg.describe() and "1 user" in cfg.describe()


def test_empty_file_is_plain_http_as_in_the_toolkit(tmp_path):
    p = tmp_path / "web.yml"
    p.write_text("")
    cfg = load_web_config(str(p))
    assert cfg.tls is None and cfg.auth is None


BAD = [
    ("tls_server_config: [\n", "bad YAML at line"),
    ("- a\n- b\n", "the file must be a mapping"),
    ("tls_sever_config: {}\n", "unknown key 'tls_sever_config'"),
    ("basic_auth_users:\n  a: x\n  a: y\n", "duplicate key 'a'"),
    ("rate_limit: {interval: 1s, burst: 5}\n", "rate_limit is not supported"),
    ("tls_server_config:\n  cert_file: {crt}\n", "missing key_file"),
    ("tls_server_config:\n  key_file: {key}\n", "missing cert_file"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n  bogus: 1\n",
     "unknown key tls_server_config.'bogus'"),
    ("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: {key}\n",
     "cert_file /nonexistent.crt: No such file or directory"),
    ("tls_server_config:\n  cert_file: {junk}\n  key_file: {key}\n", "no PEM certificate"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {crt}\n", "no PEM private key"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {other_key}\n",
     "key_file does not match cert_file"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {enc_key}\n", "the key is encrypted"),
    ("tls_server_config:\n  cert_file: {dir}\n  key_file: {key}\n", "not a regular file"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n  min_version: TLS14\n",
     "min_version 'TLS14'"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n  min_version: TLS13\n"
     "  max_version: TLS12\n", "min_version is above max_version"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
     "  client_auth_type: Whatever\n", "client_auth_type 'Whatever'"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
     "  client_auth_type: RequireAnyClientCert\n  client_ca_file: {ca}\n",
     "without verifying them"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
     "  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n  client_ca_file: {ca}\n",
     "client CA configured without a client_auth_type"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
     "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {junk}\n",
     "no usable CA certificate"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
     "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {ca}\n"
     "  client_allowed_sans: [x]\n", "client_allowed_sans needs client_auth_type"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n  cipher_suites: [RC4]\n",
     "unknown cipher 'RC4'"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
     "  curve_preferences: [X25519]\n", "curve_preferences is not supported"),
    ("tls_server_config:\n  cert: '-----BEGIN CERTIFICATE-----'\n  key_file: {key}\n",
     "inline PEM) is not supported"),
    ("tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
     "  prefer_server_cipher_suites: maybe\n", "must be true or false"),
    ("http_server_config:\n  http2: true\n", "http2: true is not supported"),
    ("http_server_config:\n  headers:\n    Server: evil\n", "header 'Server' cannot be"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
     "X-Frame-Options 'allow'"),
    ("basic_auth_users:\n  prom: hunter2\n", "basic_auth_users.prom: not a bcrypt hash"),
    ("basic_auth_users:\n  prom: '$2y$03$" + "a" * 21 + "." + "a" * 31 + "'\n",
     "bcrypt cost 3 out of 4..31"),
    ("basic_auth_users:\n  123: '{hash}'\n", "key 123 must be a string"),
    ("basic_auth_users:\n  'a:b': '{hash}'\n", "bad user name 'a:b'"),
    ("basic_auth_users: [a, b]\n", "basic_auth_users must be a mapping"),
]


@pytest.fixture(scope="module")
def bad_files(pki, tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    _, other_key = pki.sign("other", "other", "DNS:other")
    enc = d / "enc.key"
    subprocess.run([OPENSSL, "ec", "-in", str(pki.server_key), "-aes256", "-passout",
                    "pass:secret", "-out", str(enc)], check=True, capture_output=True,
                   timeout=60)
    junk = d / "junk.pem"
    junk.write_text("hello\n")
    return {"crt": pki.server_crt, "key": pki.server_key, "ca": pki.ca, "junk": junk,
            "other_key": other_key, "enc_key": enc, "dir": d, "hash": bcrypt_hash("x")}


@needs_openssl
@pytest.mark.parametrize("text,match", BAD, ids=[m for _, m in BAD])
def test_bad_config_is_one_clear_line(bad_files, tmp_path, text, match):
    for k, v in bad_files.items():
        text = text.replace("{" + k + "}", str(v))
    p = tmp_path / "web.yml"
    p.write_text(text)
    with pytest.raises(AgentError) as e:
        load_web_config(str(p))
    msg = str(e.value)
    assert match in msg, msg
    assert "\n" not in msg and msg.startswith(f"--web.config.file {p}: ")


def test_missing_fifo_and_device_files_do_not_hang(tmp_path):
    with pytest.raises(AgentError, match="No such file or directory"):
        load_web_config(str(tmp_path / "absent.yml"))
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(AgentError, match="not a regular file"):
        load_web_config(str(fifo))
    with pytest.raises(AgentError, match="not a regular file"):
        load_web_config("/dev/zero")
    assert time.monotonic() - t0 < 5
    big = tmp_path / "big.yml"
    big.write_bytes(b"#" * (2 << 20))
    with pytest.raises(AgentError, match="larger than"):
        load_web_config(str(big))


# ---- basic auth ---------------------------------------------------------------------------

def test_basic_auth_caches_verified_credentials_only(monkeypatch):
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()})
    hdr = basic("prom", "right")["Authorization"]
    assert auth.check(hdr) and auth.checks == 1
    for _ in range(50):
        assert auth.check(hdr)
    assert auth.checks == 1  # served from the cache
    assert not auth.check(basic("prom", "wrong")["Authorization"])
    assert not auth.check(basic("prom", "wrong")["Authorization"])
    assert auth.checks == 2  # a failure is remembered too (apart: it never evicts a success)
    assert not auth.check(basic("prom", "wrong2")["Authorization"]) and auth.checks == 3
    # an unknown user still costs a bcrypt check (timing does not reveal who exists)
    assert not auth.check(basic("nobody", "right")["Authorization"]) and auth.checks == 4
    assert len(auth._ok) == 1 and len(auth._bad) == 3
    # no credential is kept in the clear
    assert all(b"right" not in k and b"wrong" not in k for k in [*auth._ok, *auth._bad])
    for bad in (None, "", "Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"nocolon")
                .decode(), "Basic " + base64.b64encode(b"prom:" + b"x" * 100).decode()):
        assert not auth.check(bad)


def test_basic_auth_refuses_a_guess_queue_instead_of_holding_workers(monkeypatch):
    import bcrypt
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()})
    gate = threading.Event()
    real = bcrypt.checkpw

    def slow(pw, h):
        gate.wait(10)
        return real(pw, h)

    monkeypatch.setattr(bcrypt, "checkpw", slow)
    results = []
    ts = [threading.Thread(target=lambda: results.append(
        auth.check(basic("prom", "guess")["Authorization"]))) for _ in range(BasicAuth.QUEUE + 1)]
    for t in ts:
        t.start()
    deadline = time.monotonic() + 5
    while not (auth._running and len(auth._queue) == BasicAuth.QUEUE) and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(AuthBusy):
        auth.check(basic("prom", "another")["Authorization"])
    gate.set()
    for t in ts:
        t.join(10)
    assert results == [False] * (BasicAuth.QUEUE + 1)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def fast_bcrypt(monkeypatch):
    """bcrypt.checkpw without the cost: these tests count checks, not time."""
    import bcrypt
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: pw == b"right")


def _outcome(auth: BasicAuth, hdr: str, peer: str) -> object:
    try:
        return auth.check(hdr, peer)
    except AuthBusy as exc:
        return exc.status


ROTATING = [f"127.0.{i // 250}.{2 + i % 250}" for i in range(1000)]


def test_rotating_addresses_share_one_failure_budget_and_new_clients_keep_theirs(
        fast_bcrypt):
    """Issue #34 item 7: 1,000 loopback addresses each had a budget of 8 failed checks, so a
    local user got 8,000 bcrypt checks and every flood address stood as clean as a fresh
    scraper. Now all addresses together share one budget: once it is spent, an address that
    guessed lately gets 429 without bcrypt, while a client new to the exporter is checked."""
    clock = _Clock()
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()}, clock=clock)
    for i, a in enumerate(ROTATING):  # each address's first guess: it stood clean
        assert _outcome(auth, basic("prom", f"a{i}")["Authorization"], a) is False
    assert auth.checks == 1000 and auth._global < 1
    for i, a in enumerate(ROTATING):  # the second guess of each: refused, no bcrypt
        assert _outcome(auth, basic("prom", f"b{i}")["Authorization"], a) == 429
    assert auth.checks == 1000 and auth.gated == 1000
    # a fresh scraper, and a client new to the exporter, are checked all the same
    assert auth.check(basic("prom", "right")["Authorization"], "127.0.0.1")
    assert auth.check(basic("prom", "wrong")["Authorization"], "192.0.2.1") is False
    assert auth.checks == 1002
    # the budget comes back at GLOBAL_FAIL_PER_S, for all the flood's addresses together,
    # and while it is spent a returning token goes to a retry, never to a new guess
    clock.t += 1 / BasicAuth.GLOBAL_FAIL_PER_S
    got = [_outcome(auth, basic("prom", f"c{i}")["Authorization"], a)
           for i, a in enumerate(ROTATING[:50])]
    assert got == [429] * 50 and auth.checks == 1002
    got = [_outcome(auth, basic("prom", f"b{i}")["Authorization"], a)
           for i, a in enumerate(ROTATING[:50])]
    # the global token, then the retries' own trickle (its burst), and no more
    retried = 1 + int(BasicAuth.RETRY_FAIL_BURST)
    assert got.count(False) == retried and got.count(429) == 50 - retried
    assert auth.checks == 1002 + retried
    # the retries' trickle comes back at RETRY_FAIL_PER_S, for retries only
    clock.t += 1 / BasicAuth.RETRY_FAIL_PER_S
    got = [_outcome(auth, basic("prom", f"d{i}")["Authorization"], a)
           for i, a in enumerate(ROTATING[:50])]
    assert got == [429] * 50  # new guesses: none
    got = [_outcome(auth, basic("prom", f"b{i}")["Authorization"], a)
           for i, a in enumerate(ROTATING[retried:60])]
    assert got.count(False) >= 1 and auth.checks <= 1002 + retried + 3
    # the verified credential is served from the cache whatever the budget
    checks = auth.checks
    assert auth.cached(basic("prom", "right")["Authorization"])
    assert auth.check(basic("prom", "right")["Authorization"], ROTATING[0])
    assert auth.checks == checks


def test_standing_counts_distinct_credentials_and_a_success_clears_it(fast_bcrypt):
    clock = _Clock()
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()}, clock=clock)
    a = "203.0.113.5"
    for _ in range(3):  # one credential retried (a scraper after a 503) counts once
        _outcome(auth, basic("prom", "same")["Authorization"], a)
    assert auth._peers[a].load == 1.0
    _outcome(auth, basic("prom", "other")["Authorization"], a)
    assert auth._peers[a].load == 2.0
    clock.t += BasicAuth.LOAD_HALF_LIFE_S
    assert auth._peer(a, clock()).load == pytest.approx(1.0)
    assert auth.check(basic("prom", "right")["Authorization"], a)
    assert auth._peers[a].load == 0.0


def test_in_good_standing_the_quietest_address_goes_first(monkeypatch):
    """Addresses that guessed once a half-life ago still stand below 1 (their checks share
    the lane of clients in good standing): with that lane's queue full, a fresh scraper
    from a quiet address takes the worst waiter's place (503 for it) and is checked next."""
    import bcrypt
    clock = _Clock()
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()}, clock=clock)
    thin = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
    for a in thin:
        assert auth.check(basic("prom", "once " + a)["Authorization"], a) is False
    clock.t += BasicAuth.LOAD_HALF_LIFE_S
    real, gate, order, got = bcrypt.checkpw, threading.Event(), [], {}

    def held(pw: bytes, h: bytes) -> bool:
        order.append(pw)
        assert gate.wait(20)
        return real(pw, h)

    monkeypatch.setattr(bcrypt, "checkpw", held)

    def run(name: str, pw: str, peer: str) -> None:
        got[name] = _outcome(auth, basic("prom", pw)["Authorization"], peer)

    ts = []
    for name, peer in zip("abc", thin, strict=True):
        ts.append(threading.Thread(target=run, args=(name, "g" + name, peer)))
        ts[-1].start()
        deadline = time.monotonic() + 20
        while len(order) + len(auth._queue) < len(ts) and time.monotonic() < deadline:
            time.sleep(0.005)
    assert auth._running == {"clean"} and len(auth._queue) == BasicAuth.QUEUE
    ts.append(threading.Thread(target=run, args=("good", "right", "192.0.2.7")))
    ts[-1].start()
    ts[2].join(20)  # c, the worst waiter, is bumped
    assert got.get("c") == 503
    gate.set()
    for t in ts:
        t.join(20)
    assert got == {"a": False, "b": False, "c": 503, "good": True}
    assert order == [b"ga", b"right", b"gb"]


def test_triage_answers_what_check_would_refuse_without_bcrypt(fast_bcrypt):
    """The server's event loop answers, without a worker, what check() would refuse
    without bcrypt, counted once; it hands a worker the rest, holding a place in the lane
    for it so a burst cannot all be handed on."""
    clock = _Clock()
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()}, clock=clock)
    hdr = lambda pw: basic("prom", pw)["Authorization"]  # noqa: E731
    assert auth.triage(None, "10.0.0.1") is None and auth.triage("Basic !!", "10.0.0.1") is None
    assert auth.triage(hdr("right"), "10.0.0.1") is None      # a check to run: a worker's
    assert auth.check(hdr("right"), "10.0.0.1") and not auth._pending
    assert auth._peers["10.0.0.1"].load == 0.0
    assert auth.triage(hdr("right"), "10.0.0.9") is None      # verified: a worker's, at once
    assert auth.triage(hdr("x"), "10.0.0.2") is None
    assert auth.check(hdr("x"), "10.0.0.2") is False
    assert auth._peers["10.0.0.2"].load == 1.0                 # counted once, not twice
    assert auth.triage(hdr("x"), "10.0.0.3") == (401, 0)       # refused before
    auth._global = 0.0                                         # the shared budget spent
    checks = auth.checks
    assert auth.triage(hdr("y"), "10.0.0.2")[0] == 429 and auth.checks == checks
    # places in a lane: QUEUE + 1 admitted at most (none running), equals refused
    for i in range(BasicAuth.QUEUE + 1):
        assert auth.triage(hdr(f"n{i}"), f"192.0.2.{i}") is None
    assert auth.triage(hdr("late"), "192.0.2.99") == (503, 1)
    assert len(auth._pending) == BasicAuth.QUEUE + 1
    clock.t += BasicAuth.PENDING_S + 1                         # never reached check()
    assert auth.triage(hdr("later"), "192.0.2.98") is None and len(auth._pending) == 1


def _script(user: str) -> tuple[list, int, int]:
    """The same flood and scrapes against a fresh BasicAuth, guessing for ``user``."""
    clock = _Clock()
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()}, clock=clock)
    out = []
    for r in range(3):
        for i, a in enumerate(ROTATING[:100]):
            out.append(_outcome(auth, basic(user, f"g{r}-{i}")["Authorization"], a))
        clock.t += 2.0
        out.append(_outcome(auth, basic(user, "g0-0")["Authorization"], "198.51.100.1"))
    return out, auth.checks, auth.gated


def test_no_answer_says_whether_the_user_exists(fast_bcrypt):
    """Budgets and standings count credentials and addresses, never users: the same flood
    for an existing and for a missing user gets the same answers and the same number of
    bcrypt checks (an unknown user is checked against a dummy hash of the same cost)."""
    known, unknown = _script("prom"), _script("nobody")
    assert known == unknown
    assert set(known[0]) == {False, 429}


def test_auth_memory_is_bounded_under_a_flood_of_addresses(fast_bcrypt):
    """Every table has its bound (each address's standing, the credentials seen per
    address, the failed ones), however many addresses a flood rotates through: 20,000
    addresses fill them to the bound and no further, in under 16 MB."""
    import tracemalloc
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()}, clock=_Clock())
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(20_000):
            _outcome(auth, basic("prom", f"g{i}")["Authorization"],
                     f"127.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
        grown = sum(s.size_diff for s in
                    tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert len(auth._peers) == BasicAuth.PEERS and len(auth._bad) == BasicAuth.BAD_CACHE
    assert len(auth._seen._new) + len(auth._seen._old) <= 2 * _Seen.BITS // 8
    assert not auth._queue and not auth._running
    assert grown < 16 << 20, grown
    # smaller bounds hold the same way (the constants are the instance's to lower)
    small = BasicAuth({"prom": bcrypt_hash("right").encode()}, clock=_Clock())
    small.PEERS, small.BAD_CACHE = 100, 50
    small._seen.CAPACITY = 150
    for i, a in enumerate(ROTATING * 2):
        _outcome(small, basic("prom", f"g{i}")["Authorization"], a)
    assert (len(small._peers), len(small._bad)) == (100, 50)
    assert small._seen._count <= 150 and len(small._seen._old) == _Seen.BITS // 8


def test_a_retry_is_known_after_a_flood_of_fresh_guesses(fast_bcrypt):
    """The CI's fast runner: a flood of ~10,000 distinct guesses a second pushed the
    scraper's refused credential out of a seen-table of 8,192 before its retry 1-2 s later,
    so every retry counted as a new guess (429 for 60 s). Pairs are now kept for a time
    (two Bloom generations), whatever the flood's rate: the retry after 100,000 guesses from
    the flood's addresses, the scraper's own among them, takes the retries' trickle."""
    clock = _Clock()
    auth = BasicAuth({"prom": bcrypt_hash("right").encode()}, clock=clock)
    hosts = ["127.0.0.1", *ROTATING]
    for i, a in enumerate(hosts):   # the budget of all is spent, every address guessed
        _outcome(auth, basic("prom", f"a{i}")["Authorization"], a)
    right = basic("prom", "right")["Authorization"]
    assert _outcome(auth, right, "127.0.0.1") == 429   # first try: a new guess, gated
    for i in range(100_000):
        assert _outcome(auth, basic("prom", f"f{i}")["Authorization"],
                        hosts[i % len(hosts)]) == 429
    clock.t += 2.0
    assert auth.check(right, "127.0.0.1") is True      # its retry: known, checked
    assert auth.cached(right)
    # a flood's new guess is still refused, and the filter's false positives stay rare
    seen = _Seen(b"k" * 32, 0.0)
    assert sum(seen.check_and_add("127.0.0.1", i.to_bytes(8, "big"), 0.0)
               for i in range(200_000)) <= 2


def test_seen_pairs_are_kept_for_a_time_then_forgotten():
    seen = _Seen(b"k" * 32, 0.0)
    assert not seen.check_and_add("a", b"x", 0.0)
    assert seen.check_and_add("a", b"x", 1.0) and not seen.check_and_add("b", b"x", 1.0)
    # a generation later the next new pair starts a fresh one: "a" is still known (old)
    assert not seen.check_and_add("c", b"y", _Seen.SPAN_S + 1)
    assert seen._old and seen.check_and_add("a", b"x", _Seen.SPAN_S + 1)
    # two generations on, "b" (presented once, in the first) is forgotten
    assert not seen.check_and_add("d", b"y", 2 * _Seen.SPAN_S + 2)
    assert not seen.check_and_add("e", b"y", 3 * _Seen.SPAN_S + 3)
    assert not seen.check_and_add("b", b"x", 3 * _Seen.SPAN_S + 3)
    # and a full generation rotates before its span: at most CAPACITY pairs in one
    small = _Seen(b"k" * 32, 0.0)
    small.CAPACITY = 10
    for i in range(25):
        small.check_and_add("a", bytes([i]), 0.0)
    assert small._count == 5


def test_live_basic_auth_401_and_200(tmp_path):
    cfg = load_web_config(str(write_web_config(tmp_path / "w.yml", None,
                                               {"prom": "s3cret", "other": "x"})))
    with Exporter(metrics(), "127.0.0.1:0", web_config=cfg) as ex:
        assert ex.url.startswith("http://")
        for headers in (None, basic("prom", "wrong"), basic("nobody", "s3cret"),
                        {"Authorization": "Basic garbage"}):
            code, h, body = get(ex, headers)
            assert code == 401 and h["WWW-Authenticate"].startswith("Basic"), (headers, code)
            assert b"hftagent_" not in body
        code, _, body = get(ex, basic("prom", "s3cret"))
        assert code == 200 and b"hftagent_probe_samples_total" in body
        assert get(ex, None, path="/")[0] == 401  # every path is behind the password
        t0 = time.monotonic()
        for _ in range(20):
            assert get(ex, basic("prom", "s3cret"))[0] == 200
        assert time.monotonic() - t0 < 10
        assert cfg.auth.checks <= 4  # 3 failures + 1 success, then the cache
        assert ex.stats["unauthorized"] == 5


# ---- TLS ----------------------------------------------------------------------------------

def test_tls_scrape_and_plaintext_client_refused(pki, tmp_path):
    cfg = load_web_config(str(write_web_config(
        tmp_path / "w.yml", pki, {"prom": "pw"},
        extra="http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n")))
    with Exporter(metrics(), "127.0.0.1:0", web_config=cfg) as ex:
        assert ex.url.startswith("https://127.0.0.1:")
        code, h, body = get(ex, basic("prom", "pw"), ctx=pki.client_context())
        assert code == 200 and b"hftagent_probe_samples_total" in body
        assert h["X-Content-Type-Options"] == "nosniff"
        # a client that does not trust the CA fails the handshake
        with pytest.raises(ssl.SSLCertVerificationError):
            get(ex, basic("prom", "pw"), ctx=ssl.create_default_context())
        # plain HTTP on the TLS port: no answer in the clear, connection closed
        s = socket.create_connection(("127.0.0.1", ex.port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = s.recv(4096)
        except ConnectionResetError:
            data = b""
        s.close()
        assert b"hftagent_" not in data and not data.startswith(b"HTTP/1.1 200")
        assert get(ex, basic("prom", "pw"), ctx=pki.client_context())[0] == 200
        assert ex.stats["tls_failed"] >= 2


def test_tls_min_version(pki, tmp_path):
    cfg = load_web_config(str(write_web_config(tmp_path / "w.yml", pki,
                                               extra_tls="min_version: TLS13")))
    with Exporter(metrics(), "127.0.0.1:0", web_config=cfg) as ex:
        old = pki.client_context()
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(ssl.SSLError):
            get(ex, ctx=old)
        assert get(ex, ctx=pki.client_context())[0] == 200


def test_client_certificates_and_allowed_sans(pki, tmp_path):
    for sans, ok in (("[prometheus.example]", True), ("['spiffe://example/prom']", True),
                     ("[someone.else]", False)):
        cfg = load_web_config(str(write_web_config(
            tmp_path / "w.yml", pki,
            extra_tls=f"client_auth_type: RequireAndVerifyClientCert\n"
                      f"client_ca_file: {pki.ca}\nclient_allowed_sans: {sans}")))
        with Exporter(metrics(), "127.0.0.1:0", web_config=cfg) as ex:
            with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
                get(ex, ctx=pki.client_context(with_cert=False))  # no client certificate
            if ok:
                assert get(ex, ctx=pki.client_context(with_cert=True))[0] == 200, sans
            else:
                with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
                    get(ex, ctx=pki.client_context(with_cert=True))


def test_rotated_certificate_is_served_without_restart(pki, tmp_path):
    d = tmp_path / "tls"
    d.mkdir()
    shutil.copy(pki.server_crt, d / "s.crt")
    shutil.copy(pki.server_key, d / "s.key")
    (tmp_path / "w.yml").write_text(f"tls_server_config:\n  cert_file: {d / 's.crt'}\n"
                                    f"  key_file: {d / 's.key'}\n")
    cfg = load_web_config(str(tmp_path / "w.yml"))
    cfg.tls.check_s = 0.0  # check on every connection (5 s in service)

    def served_cert(ex) -> bytes:
        with socket.create_connection(("127.0.0.1", ex.port), timeout=5) as raw:
            with pki.client_context().wrap_socket(raw, server_hostname="localhost") as s:
                return s.getpeercert(binary_form=True)

    with Exporter(metrics(), "127.0.0.1:0", web_config=cfg) as ex:
        first = served_cert(ex)
        crt2, key2 = pki.sign("rotated", "localhost", "DNS:localhost,IP:127.0.0.1")
        # a half-written rotation (new cert, old key) keeps the old context serving
        shutil.copy(crt2, d / "s.crt")
        assert served_cert(ex) == first and cfg.tls.reload_error
        shutil.copy(key2, d / "s.key")
        second = served_cert(ex)
        assert second != first and cfg.tls.reloads == 1 and cfg.tls.reload_error is None


# ---- the CLI --------------------------------------------------------------------------------

def run_watch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(HFTAGENT), "watch", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.skipif(not HFTAGENT.exists(), reason="hftagent entry point not installed")
def test_watch_bad_web_config_is_one_line_and_nonzero(tmp_path):
    p = tmp_path / "w.yml"
    p.write_text("basic_auth_users:\n  prom: not-a-hash\n")
    for args in (["--listen", "127.0.0.1:0", "--web.config.file", str(p)],
                 ["--listen", "127.0.0.1:0", "--web.config.file", str(tmp_path / "nope.yml")],
                 ["--web.config.file", str(p)]):
        t0 = time.monotonic()
        r = run_watch("--probe", "numpy", "--duration", "30", "--no-live", *args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, r.stderr
        assert lines[0].startswith("hftagent: error: ") and "Traceback" not in r.stderr
        assert time.monotonic() - t0 < 60  # refused at start, not after --duration
    assert "not a bcrypt hash" in run_watch("--listen", "127.0.0.1:0", "--web.config.file",
                                            str(p)).stderr
    assert "give --listen too" in run_watch("--web.config.file", str(p)).stderr


@pytest.mark.slow
@pytest.mark.skipif(not HFTAGENT.exists(), reason="hftagent entry point not installed")
def test_watch_warns_beyond_loopback(tmp_path):
    r = run_watch("--probe", "numpy", "--duration", "1", "--no-live", "--rate", "100",
                  "--listen", "0.0.0.0:0")
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if "beyond loopback" in ln]
    assert len(warn) == 1 and warn[0].startswith("hftagent: warning: ")
    assert "without TLS or authentication" in warn[0] and "every interface" in warn[0]
    r = run_watch("--probe", "numpy", "--duration", "1", "--no-live", "--rate", "100",
                  "--listen", "127.0.0.1:0")
    assert r.returncode == 0 and "beyond loopback" not in r.stderr, r.stderr


def test_deploy_example_web_config_loads(pki, tmp_path):
    """deploy/hftagent/web-config.yml is valid as shipped (its relative tls/ paths pointed at
    throw-away certificates) and its example hash is of the password it names."""
    src = Path(__file__).resolve().parent.parent / "deploy" / "hftagent" / "web-config.yml"
    shutil.copy(src, tmp_path / "web-config.yml")
    (tmp_path / "tls").mkdir()
    shutil.copy(pki.server_crt, tmp_path / "tls" / "server.crt")
    shutil.copy(pki.server_key, tmp_path / "tls" / "server.key")
    cfg = load_web_config(str(tmp_path / "web-config.yml"))
    assert cfg.tls is not None and cfg.headers["X-Frame-Options"] == "deny"
    assert cfg.auth.check(basic("prometheus", "change-me")["Authorization"])

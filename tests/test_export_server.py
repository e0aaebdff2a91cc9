"""Exporter: exposition content, promtool-clean scrape, HTTP server lifecycle and robustness;
node_exporter textfile writer."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request

import prometheus_client
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as om_parse,
)
from prometheus_client.parser import text_string_to_metric_families

from agent.errors import AgentError
from agent.export.metrics import CAUSES, WatchMetrics
from agent.export.server import Exporter, make_registry, parse_listen, render
from agent.export.textfile import TEXTFILE_NAME, write_textfile
from tuning.findings import Finding, Status

MS = 1_000_000
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package 'prometheus'; `make apt-deps`)")


def populated() -> WatchMetrics:
    m = WatchMetrics(thresholds_ns=(500_000, 1_000_000, 5_000_000), variant="xla", p99_budget_us=2000)
    for i in range(10_000):
        m.observe(300_000 + (i % 100) * 10_000 + (8 * MS if i % 500 == 0 else 0))
    m.probe_up(True)
    m.spike("irq")
    m.spike("freq_drop")
    m.spike("not-a-cause")
    m.set_collector("cpu", True, 0.0004)
    m.set_collector("gpu", False, 0.021)
    m.set_audit([Finding("cpu.governor", "cpu", "Governor", Status.FAIL),
                 Finding("irq.balance", "irq", "irqbalance", Status.OK)])
    m.set_gauge("cpu_frequency_hertz", 2.1e9, cpu=2)
    m.set_gauge("gpu_clock_hertz", 1.98e9, gpu=0, clock="sm")
    m.set_gpu_clock_event_reasons(0, 0x1)
    m.set_gauge("pcie_link_degraded", 0, device="0000:17:00.0")
    m.set_gauge("pcie_link_width", 16, device="0000:17:00.0")
    return m


def samples_by_name(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def scrape(url: str, accept: str | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status, r.headers["Content-Type"], r.read().decode()


def test_exposition_content_and_base_units():
    body, ctype = render(make_registry(populated()))
    assert ctype.startswith("text/plain")
    s = samples_by_name(body.decode())
    buckets = {x.labels["le"]: x.value for x in s["hftagent_probe_latency_seconds_bucket"]}
    assert buckets["+Inf"] == 10_000 and buckets["1e-05"] == 0
    assert buckets["0.005"] == 10_000 - 20  # 20 samples got +8 ms
    assert s["hftagent_probe_samples_total"][0].value == 10_000
    exc = {x.labels["threshold_us"]: x.value for x in s["hftagent_probe_exceedances_total"]}
    # 300..1290 µs in 10 µs steps: 79 % over 500 µs, 29 % over 1 ms; plus the 20 at +8 ms
    # (those have i % 100 == 0, i.e. 300 µs + 8 ms, under the others' lines)
    assert exc == {"500": 7920.0, "1000": 2920.0, "5000": 20.0}
    q = {x.labels["quantile"]: x.value for x in s["hftagent_probe_latency_quantile_seconds"]}
    assert set(q) == {"0.5", "0.99", "0.999"} and q["0.999"] > 0.008
    spikes = {x.labels["cause"]: x.value for x in s["hftagent_spikes_total"]}
    assert set(spikes) == set(CAUSES) and spikes["irq"] == 1 and spikes["other"] == 1
    st = {(x.labels["check"], x.labels["status"]): x.value
          for x in s["hftagent_audit_check_status"]}
    assert st[("cpu.governor", "fail")] == 1 and st[("cpu.governor", "ok")] == 0
    assert st[("irq.balance", "ok")] == 1 and len(st) == 2 * 6
    ok = {x.labels["check"]: x.value for x in s["hftagent_audit_check_ok"]}
    assert ok == {"cpu.governor": 0.0, "irq.balance": 1.0}
    coll = {x.labels["collector"]: x.value for x in s["hftagent_collector_success"]}
    assert coll == {"cpu": 1.0, "gpu": 0.0}
    assert s["hftagent_collector_duration_seconds"][1].value == pytest.approx(0.021)
    assert s["hftagent_cpu_frequency_hertz"][0].labels == {"cpu": "2"}
    reasons = {x.labels["reason"]: x.value for x in s["hftagent_gpu_clock_event_reason"]}
    assert reasons["gpu_idle"] == 1 and reasons["hw_slowdown"] == 0
    assert s["hftagent_probe_up"][0].value == 1
    assert s["hftagent_probe_p99_budget_seconds"][0].value == pytest.approx(0.002)
    assert s["hftagent_probe_info"][0].labels == {"source": "probe", "variant": "xla"}
    assert abs(s["hftagent_probe_last_sample_timestamp_seconds"][0].value - time.time()) < 5


def test_empty_state_exports_no_fake_values():
    s = samples_by_name(render(make_registry(WatchMetrics()))[0].decode())
    assert s["hftagent_probe_samples_total"][0].value == 0
    assert s["hftagent_probe_up"][0].value == 0
    assert "hftagent_probe_last_sample_timestamp_seconds" not in s
    assert "hftagent_probe_latency_quantile_seconds" not in s  # only _count/_sum
    assert "hftagent_audit_last_run_timestamp_seconds" not in s
    assert "hftagent_cpu_frequency_hertz" not in s


def test_nothing_in_the_default_registry():
    before = set(prometheus_client.REGISTRY._names_to_collectors)
    with Exporter(populated(), "127.0.0.1:0") as ex:
        scrape(ex.url)
    assert set(prometheus_client.REGISTRY._names_to_collectors) == before
    assert not any(n.startswith("hftagent") for n in before)


@needs_promtool
def test_promtool_check_metrics_on_a_real_scrape():
    with Exporter(populated(), "127.0.0.1:0") as ex:
        status, _, body = scrape(ex.url)
    assert status == 200
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_check_metrics_catches_a_bad_exposition():
    """The check above can fail: promtool rejects what our names avoid."""
    bad = ("# HELP hftagent_probe_samples counted\n# TYPE hftagent_probe_samples counter\n"
           "hftagent_probe_samples 3\n")
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=bad, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode != 0


def test_openmetrics_negotiated():
    with Exporter(populated(), "127.0.0.1:0") as ex:
        _, ctype, body = scrape(ex.url, "application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text")
    fams = {f.name: f for f in om_parse(body)}
    assert fams["hftagent_probe_samples"].type == "counter"
    assert fams["hftagent_probe_latency_seconds"].type == "histogram"


def test_parse_listen():
    assert parse_listen("127.0.0.1:9877") == ("127.0.0.1", 9877)
    assert parse_listen(":9877") == ("127.0.0.1", 9877)
    assert parse_listen("9877") == ("127.0.0.1", 9877)
    assert parse_listen("[::1]:9000") == ("::1", 9000)
    assert parse_listen("0.0.0.0:1") == ("0.0.0.0", 1)
    for bad in ("localhost:9877", "1.2.3.4", "1.2.3.4:99999", "[::1]9000", "x:y"):
        with pytest.raises(AgentError):
            parse_listen(bad)


def test_default_is_loopback():
    ex = Exporter(WatchMetrics())
    assert (ex.host, ex.port) == ("127.0.0.1", 9877)


def refused(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True


def test_restart_leaves_no_port_bound():
    m = populated()
    ex = Exporter(m, "127.0.0.1:0").start()
    port = ex.port
    # a keep-alive connection left open by a scraper
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert conn.recv(12) == b"HTTP/1.1 200"
    ex.stop()
    ex.stop()  # idempotent
    assert refused(port)
    conn.settimeout(5)
    rest = b""
    while chunk := conn.recv(65536):  # the server closed it: EOF, not a hang
        rest += chunk
    conn.close()
    # the same port again, in the same process (a restart)
    with Exporter(m, f"127.0.0.1:{port}") as ex2:
        assert ex2.port == port and scrape(ex2.url)[0] == 200
    assert refused(port)


def test_port_in_use_is_a_one_line_error():
    with Exporter(WatchMetrics(), "127.0.0.1:0") as ex:
        with pytest.raises(AgentError, match="cannot listen on 127.0.0.1"):
            Exporter(WatchMetrics(), f"127.0.0.1:{ex.port}").start()


def test_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this kernel")
    try:
        ex = Exporter(WatchMetrics(), "[::1]:0").start()
    except AgentError as exc:
        pytest.skip(f"::1 not configured here: {exc}")
    try:
        assert ex.url.startswith("http://[::1]:")
        assert scrape(ex.url)[0] == 200
    finally:
        ex.stop()


def test_paths_and_methods():
    with Exporter(WatchMetrics(), "127.0.0.1:0") as ex:
        base = ex.url.removesuffix("/metrics")
        assert scrape(base + "/")[0] == 200
        with pytest.raises(urllib.error.HTTPError) as e:
            scrape(base + "/nope")
        assert e.value.code == 404
        c = http.client.HTTPConnection("127.0.0.1", ex.port, timeout=5)
        c.request("HEAD", "/metrics")
        r = c.getresponse()
        assert r.status == 200 and r.read() == b"" and int(r.headers["Content-Length"]) > 1000
        c.request("POST", "/metrics", body=b"x")
        assert c.getresponse().status == 501
        c.close()


def test_malformed_requests_do_not_disturb_the_probe():
    m = WatchMetrics()
    stop = threading.Event()
    fed = [0]

    def probe():
        while not stop.is_set():
            m.observe(400_000)
            fed[0] += 1
            time.sleep(0.0005)

    t = threading.Thread(target=probe)
    t.start()
    try:
        with Exporter(m, "127.0.0.1:0") as ex:
            junk = [b"\x00\xff" * 100 + b"\r\n\r\n", b"GET /metrics HTTP/9.9\r\n\r\n",
                    b"GET " + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
                    b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n",
                    b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"]
            for payload in junk:
                s = socket.create_connection(("127.0.0.1", ex.port), timeout=5)
                try:
                    s.sendall(payload)
                    s.shutdown(socket.SHUT_WR)
                    while s.recv(65536):
                        pass
                except OSError:
                    pass  # the server may reset a connection it refused: fine
                s.close()
            # half-open connections that never send a byte, and clients that hang up early
            idle = [socket.create_connection(("127.0.0.1", ex.port)) for _ in range(5)]
            for _ in range(5):
                s = socket.create_connection(("127.0.0.1", ex.port))
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()  # RST mid-response
            before = fed[0]
            status, _, body = scrape(ex.url)
            assert status == 200 and "hftagent_probe_samples_total" in body
            time.sleep(0.2)
            assert fed[0] > before  # the probe kept running throughout
            for s in idle:
                s.close()
    finally:
        stop.set()
        t.join()


def held(port: int, n: int, source: str = "127.0.0.1", send: bytes = b"") -> list[socket.socket]:
    """``n`` connections from ``source`` that send ``send`` (nothing: silent) and wait."""
    out = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        if send:
            s.sendall(send)
        out.append(s)
    return out


def closed_by_server(s: socket.socket, within_s: float = 5.0) -> bool:
    """The server closed (or answered and closed) ``s`` within ``within_s``."""
    s.settimeout(within_s)
    try:
        while s.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def close_all(socks) -> None:
    for s in socks:
        s.close()


def wait_until(fn, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(0.02)
    return fn()


def test_silent_connections_make_room_for_a_scrape_oldest_first():
    """Over the bound, the oldest connection that never sent a request head goes; the
    newcomer is served (before: 503 while 3 silent sockets held every slot)."""
    with Exporter(WatchMetrics(), "127.0.0.1:0", max_connections=3) as ex:
        socks = held(ex.port, 3)
        try:
            assert wait_until(lambda: ex.stats["open"] == 3)
            assert scrape(ex.url)[0] == 200
            assert closed_by_server(socks[0], 2)          # the oldest went
            assert not closed_by_server(socks[2], 0.3)    # the newest is still held
            assert ex.stats["evicted"] >= 1 and ex.stats["refused"] == 0
        finally:
            close_all(socks)


def test_503_only_when_every_slot_is_being_answered():
    m = WatchMetrics()
    with Exporter(m, "127.0.0.1:0", max_connections=2) as ex:
        gate, entered = threading.Event(), threading.Semaphore(0)
        real = ex.registry.render

        def slow_render(accept=""):
            entered.release()
            gate.wait(10)
            return real(accept)

        ex.registry.render = slow_render
        results: list[int] = []
        ts = [threading.Thread(target=lambda: results.append(scrape(ex.url)[0]))
              for _ in range(2)]
        for t in ts:
            t.start()
        try:
            assert entered.acquire(timeout=5) and entered.acquire(timeout=5)
            s = socket.create_connection(("127.0.0.1", ex.port), timeout=5)
            assert s.recv(100).startswith(b"HTTP/1.1 503")
            s.close()
            assert ex.stats["refused"] == 1
        finally:
            gate.set()
            for t in ts:
                t.join(10)
        assert results == [200, 200]
        ex.registry.render = real
        # the two slots free once their handlers return, which a loaded machine may delay
        deadline = time.monotonic() + 10
        while True:
            try:
                assert scrape(ex.url)[0] == 200
                break
            except urllib.error.HTTPError as exc:
                if exc.code != 503 or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_head_deadline_is_total_not_per_line():
    """A header line every 0.3 s does not keep the connection: the whole head must arrive
    within head_timeout_s of the accept (before: the socket timeout restarted per line)."""
    with Exporter(WatchMetrics(), "127.0.0.1:0", head_timeout_s=1.0) as ex:
        trickle = held(ex.port, 1, send=b"GET /metrics HTTP/1.1\r\n")[0]
        silent = held(ex.port, 1)[0]
        try:
            t0 = time.monotonic()
            gone = None
            while time.monotonic() - t0 < 5 and gone is None:
                try:
                    trickle.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    gone = time.monotonic() - t0
                    break
                trickle.settimeout(0.3)
                try:
                    data = trickle.recv(4096)
                    if not data or data.startswith(b"HTTP/1.1 408"):
                        gone = time.monotonic() - t0
                except TimeoutError:
                    pass
                except ConnectionResetError:
                    gone = time.monotonic() - t0
            assert gone is not None and 0.7 < gone < 2.5, gone
            assert closed_by_server(silent, 2)
            assert ex.stats["timed_out"] == 2
            assert scrape(ex.url)[0] == 200
        finally:
            close_all([trickle, silent])


def test_keepalive_connection_is_closed_after_idle_timeout_and_reused_before():
    with Exporter(populated(), "127.0.0.1:0", idle_timeout_s=1.0) as ex:
        c = http.client.HTTPConnection("127.0.0.1", ex.port, timeout=5)
        for _ in range(3):  # one connection, three scrapes
            c.request("GET", "/metrics")
            r = c.getresponse()
            assert r.status == 200 and r.read()
        sock = c.sock
        assert closed_by_server(sock, 3)
        c.close()
        assert ex.stats["timed_out"] == 1 and ex.stats["evicted"] == 0


def test_per_client_bound_takes_from_that_client_only():
    with Exporter(WatchMetrics(), "127.0.0.1:0", max_per_client=4, max_connections=64) as ex:
        other = held(ex.port, 2, source="127.0.0.3")
        mine = held(ex.port, 4, source="127.0.0.2")
        try:
            assert wait_until(lambda: ex.stats["open"] == 6)
            extra = held(ex.port, 1, source="127.0.0.2")
            assert closed_by_server(mine[0], 2)
            assert not any(closed_by_server(s, 0.1) for s in other + mine[1:] + extra)
        finally:
            close_all(other + mine + extra)


def test_global_bound_takes_from_the_biggest_client():
    with Exporter(WatchMetrics(), "127.0.0.1:0", max_connections=6, max_per_client=6) as ex:
        small = held(ex.port, 1, source="127.0.0.3")        # oldest of all
        big = held(ex.port, 5, source="127.0.0.2")
        try:
            assert wait_until(lambda: ex.stats["open"] == 6)
            status, _, _ = scrape(ex.url)                   # from 127.0.0.1
            assert status == 200
            assert closed_by_server(big[0], 2)              # the biggest address pays
            assert not closed_by_server(small[0], 0.2)
        finally:
            close_all(small + big)


def test_a_head_waiting_in_the_socket_is_answered_not_dropped():
    """Over the bound, a connection whose complete head is already in its socket buffer is
    answered, not taken as the victim (the loop reads it once more first)."""
    with Exporter(WatchMetrics(), "127.0.0.1:0", max_connections=2) as ex:
        silent = held(ex.port, 1)
        try:
            assert wait_until(lambda: ex.stats["open"] == 1)
            srv = ex._server
            # hold the event loop's reads back: accept-only, so the next head waits unread
            real_progress = srv._progress
            srv._progress = lambda c: None
            try:
                good = held(ex.port, 1, send=b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")[0]
                assert wait_until(lambda: ex.stats["open"] == 2)
            finally:
                srv._progress = real_progress
            newcomer = held(ex.port, 1)  # over the bound: someone must go
            good.settimeout(5)
            assert good.recv(12) == b"HTTP/1.1 200"
            assert closed_by_server(silent[0], 2)
        finally:
            close_all(silent + [good] + newcomer)


def test_stop_ends_connections_being_answered():
    m = WatchMetrics()
    ex = Exporter(m, "127.0.0.1:0").start()
    gate = threading.Event()
    real = ex.registry.render
    ex.registry.render = lambda accept="": (gate.wait(30), real(accept))[1]
    s = socket.create_connection(("127.0.0.1", ex.port), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.3)
    t0 = time.monotonic()
    threading.Timer(1.0, gate.set).start()  # the render finishes after stop() began
    ex.stop()
    assert time.monotonic() - t0 < 8
    assert closed_by_server(s, 5)
    s.close()
    assert refused(ex.port)


def test_exposure_warning():
    from agent.export.server import exposure_warning
    assert exposure_warning("127.0.0.1", 9877, None) is None
    assert exposure_warning("::1", 9877, None) is None
    assert exposure_warning("127.0.0.2", 9877, None) is None
    w = exposure_warning("0.0.0.0", 9877, None)
    assert "0.0.0.0:9877" in w and "every interface" in w
    assert "without TLS or authentication" in w
    w = exposure_warning("::", 9877, None)
    assert "[::]:9877" in w and "every interface" in w
    assert "this address" in exposure_warning("10.1.2.3", 1, None)


# ---- slowloris (issue: 64 trickling sockets held every slot; 25/25 scrapes got 503) ------

@pytest.mark.adversarial
def test_slowloris_200_hostile_sockets_every_good_scrape_served():
    """200 hostile sockets — half sending a header line every 0.5 s and never finishing the
    head, half silent, reopened as soon as the server drops them, 60 % of them from the
    good scraper's own address — against the default bounds: 20 of 20 scrapes on fresh
    connections answered 200, each within 10 s (measured: milliseconds)."""
    from bench.slowloris import Slowloris, good_scrapes
    with Exporter(populated(), "127.0.0.1:0") as ex:
        with Slowloris(ex.port, n=200) as attack:
            assert attack.ready.wait(30), attack.stats   # all 200 open at once
            results = good_scrapes("127.0.0.1", ex.port, n=20, interval_s=0.3,
                                   timeout_s=10.0)
            time.sleep(max(0.0, 5.5 - 20 * 0.3))  # past one head deadline under attack
        stats = ex.stats
    bad = [r for r in results if r[0] != 200 or r[1] > 10.0]
    assert not bad, (bad, attack.stats, stats)
    # the attack really was on: sockets were dropped by the bounds and by the deadline
    assert attack.stats["max_held"] == 200 and attack.stats["closed_by_server"] > 0
    assert stats["evicted"] > 0 and stats["timed_out"] > 0, stats


@pytest.mark.adversarial
def test_slowloris_against_tls_every_good_scrape_served(tmp_path):
    """The same over TLS, small bounds (32 connections, 8 per address): hostile sockets
    from other addresses that never start (or trickle garbage into) the handshake."""
    from bench.slowloris import Slowloris, good_scrapes
    from tests.pki import OPENSSL, make_pki, write_web_config
    if OPENSSL is None:
        pytest.skip("openssl CLI not installed")
    from agent.export.webconfig import load_web_config
    p = make_pki(tmp_path / "pki")
    cfg = load_web_config(str(write_web_config(tmp_path / "w.yml", p)))
    with Exporter(populated(), "127.0.0.1:0", web_config=cfg, max_connections=32,
                  max_per_client=8) as ex:
        with Slowloris(ex.port, n=200, sources=("127.0.0.2", "127.0.0.3", "127.0.0.4"),
                       max_opens=20_000) as attack:
            assert attack.ready.wait(30) or attack.stats["opened"] >= 200, attack.stats
            results = good_scrapes("127.0.0.1", ex.port, n=10, interval_s=0.3,
                                   timeout_s=10.0, tls=p.client_context())
    bad = [r for r in results if r[0] != 200 or r[1] > 10.0]
    assert not bad, (bad, attack.stats, ex.stats)


def test_scrape_reflects_live_state():
    m = WatchMetrics()
    with Exporter(m, "127.0.0.1:0") as ex:
        a = samples_by_name(scrape(ex.url)[2])["hftagent_probe_samples_total"][0].value
        for _ in range(7):
            m.observe(10 * MS)
        s = samples_by_name(scrape(ex.url)[2])
    assert (a, s["hftagent_probe_samples_total"][0].value) == (0, 7)
    exc = {x.labels["threshold_us"]: x.value for x in s["hftagent_probe_exceedances_total"]}
    assert exc["5000"] == 7


# ---- textfile ----------------------------------------------------------------------------

FINDINGS = [Finding("cpu.governor", "cpu", "Governor", Status.FAIL),
            Finding("kernel.nohz_full", "isolation", "nohz_full", Status.PENDING_REBOOT),
            Finding("irq.balance", "irq", "irqbalance", Status.OK)]


def test_write_textfile(tmp_path):
    p = write_textfile(FINDINGS, tmp_path, now=1700000000.0)
    assert p == tmp_path / TEXTFILE_NAME
    assert sorted(os.listdir(tmp_path)) == [TEXTFILE_NAME]  # no temp file left
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    s = samples_by_name(p.read_text())
    st = {(x.labels["check"], x.labels["status"]): x.value
          for x in s["hftagent_audit_check_status"]}
    assert st[("kernel.nohz_full", "pending-reboot")] == 1
    assert st[("cpu.governor", "fail")] == 1 and st[("cpu.governor", "ok")] == 0
    assert s["hftagent_audit_last_run_timestamp_seconds"][0].value == 1700000000.0
    assert all(x.timestamp is None for v in s.values() for x in v)  # node_exporter rule
    # rewritten in place: the new content replaces the old
    write_textfile(FINDINGS[2:], tmp_path)
    assert "cpu.governor" not in p.read_text()


@needs_promtool
def test_textfile_is_promtool_clean(tmp_path):
    p = write_textfile(FINDINGS, tmp_path)
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=p.read_text(),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_textfile_failure_keeps_the_old_file(tmp_path, monkeypatch):
    p = write_textfile(FINDINGS, tmp_path)
    old = p.read_bytes()

    def boom(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "rename", boom)  # agent/outfile.py renames it into place
    with pytest.raises(AgentError, match="No space left"):
        write_textfile(FINDINGS[2:], tmp_path)
    assert p.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == [TEXTFILE_NAME]


def test_textfile_bad_directory(tmp_path):
    with pytest.raises(AgentError, match="not a directory"):
        write_textfile(FINDINGS, tmp_path / "missing")
    with pytest.raises(AgentError, match="bad file name"):
        write_textfile(FINDINGS, tmp_path, filename="x.txt")
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(AgentError, match="cannot write"):
            write_textfile(FINDINGS, ro)


def test_series_count_matches_docs_fleet_formula():
    """docs/fleet.md: exporter series per box = 62 + 7 C + 2 K + P + 16 G + 3 D without
    watch's own cost (the other 32 of its 94: that cost's 11, Prometheus' own 5 per target
    and the 16 recording rules)."""
    C, K, P, G, D = 32, 7, 2, 1, 1
    m = WatchMetrics(p99_budget_us=2000)
    for i in range(7000):
        m.observe(400_000 + i)
    m.probe_up(True)
    m.set_audit([Finding(f"fam.check{i}", "fam", "t", Status.OK) for i in range(C)])
    for k in range(K):
        m.set_collector(f"c{k}", True, 0.001)
    for cpu in range(P):
        m.set_gauge("cpu_frequency_hertz", 2e9, cpu=cpu)
    for g in range(G):
        for clock in ("graphics", "sm", "memory", "video"):
            m.set_gauge("gpu_clock_hertz", 1e9, gpu=g, clock=clock)
        m.set_gpu_clock_event_reasons(g, 0)
        m.set_gauge("gpu_temperature_celsius", 40, gpu=g)
        m.set_gauge("gpu_power_watts", 100, gpu=g)
        m.set_gauge("gpu_foreign_processes", 0, gpu=g)
    for d in range(D):
        dev = f"0000:{17 + d:02x}:00.0"
        for name in ("pcie_link_degraded", "pcie_link_speed_transfers_per_second",
                     "pcie_link_width"):
            m.set_gauge(name, 1, device=dev)
    body = render(make_registry(m))[0].decode()
    series = [ln for ln in body.splitlines() if ln and not ln.startswith("#")]
    assert len(series) == 62 + 7 * C + 2 * K + P + 16 * G + 3 * D


def test_audit_families_are_rendered_once_per_audit_and_format():
    """The audit state (one series per check × status) is rendered once per audit result
    and exposition format and reused; a new audit replaces it; OpenMetrics keeps a single
    # EOF at the very end and parses."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    m = populated()
    reg = make_registry(m)
    b1, _ = render(reg)
    cached = dict(reg._audit_text)
    b2, _ = render(reg)
    assert reg._audit_text == cached and list(cached.values())[0] is \
        list(reg._audit_text.values())[0]
    assert b1.count(b"hftagent_audit_check_ok{") == b2.count(b"hftagent_audit_check_ok{") > 0
    om, ctype = render(reg, "application/openmetrics-text; version=1.0.0")
    assert "openmetrics" in ctype and om.count(b"# EOF") == 1 and om.endswith(b"# EOF\n")
    fams = {f.name for f in text_string_to_metric_families(om.decode())}
    assert {"hftagent_audit_check_ok", "hftagent_probe_latency_seconds"} <= fams
    m.set_audit([Finding("cpu.governor", "x", "t", Status.FAIL)])
    b3, _ = render(reg)
    assert b'hftagent_audit_check_ok{check="cpu.governor"} 0.0' in b3
    assert b3.count(b"hftagent_audit_check_ok{") == 1


# ---- exemplars (issue #17 item 4): the spike id on the latency histogram --------------------

OM = "application/openmetrics-text; version=1.0.0"


def _bucket_lines(body: str) -> list[str]:
    return [ln for ln in body.splitlines()
            if ln.startswith("hftagent_probe_latency_seconds_bucket")]


def test_openmetrics_scrape_carries_the_spike_id_exemplar_classic_does_not():
    """After a spike is logged, an OpenMetrics scrape shows `# {spike_id="…"}` on the bucket
    its latency falls in (parsed back by the OpenMetrics parser); a classic scrape has no
    exemplar and still parses (and passes promtool where installed)."""
    from agent.watch.metrics_feed import MetricsFeed
    m = populated()
    feed = MetricsFeed(m)
    rec = {"time": "2026-12-01T09:30:00.250000+00:00", "seq": 4242, "latency_us": 8312.4,
           "p50_us": 700.0, "cause": "irq"}
    feed.on_record(rec)
    feed.on_record({"time": rec["time"], "seq": 4243, "latency_us": 9000.0, "cause": None,
                    "note": "not attributed: rate limit"})  # no cause: no exemplar
    feed.on_record({"time": rec["time"], "flight_record": "/x.json", "seq": 4242})
    with Exporter(m, "127.0.0.1:0") as ex:
        _, om_type, om_body = scrape(ex.url, OM)
        _, txt_type, txt_body = scrape(ex.url)
    assert om_type.startswith("application/openmetrics-text")
    marked = [ln for ln in _bucket_lines(om_body) if " # " in ln]
    assert marked == [
        'hftagent_probe_latency_seconds_bucket{le="0.01"} 10000.0 '
        '# {spike_id="4242"} 0.0083124 1796117400.25']  # 2026-12-01T09:30:00.25Z
    fams = {f.name: f for f in om_parse(om_body)}
    ex_by_le = {s.labels["le"]: s.exemplar for s in fams["hftagent_probe_latency_seconds"].samples
                if s.name.endswith("_bucket") and s.exemplar is not None}
    assert list(ex_by_le) == ["0.01"]
    assert ex_by_le["0.01"].labels == {"spike_id": "4242"}
    assert ex_by_le["0.01"].value == pytest.approx(0.0083124)
    assert txt_type.startswith("text/plain")
    assert "spike_id" not in txt_body and " # " not in "".join(_bucket_lines(txt_body))
    s = samples_by_name(txt_body)
    assert {x.labels["le"]: x.value for x in s["hftagent_probe_latency_seconds_bucket"]
            }["0.01"] == 10_000
    if PROMTOOL:
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=txt_body,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr


def test_exemplar_spike_id_matches_the_spike_log_record(tmp_path):
    """Through a WatchSession (virtual clock, fake sampler and attributor): the sample is
    observed, detected as a spike, attributed and logged; the exemplar on its bucket names
    the seq of that spike-log record, and a newer spike in the same bucket replaces it."""
    import json
    import threading
    from types import SimpleNamespace

    import numpy as np

    from agent.client import FIELDS
    from agent.watch.attribution import Attribution
    from agent.watch.metrics_feed import MetricsFeed, watch_metrics
    from agent.watch.session import WatchConfig, WatchSession

    t = [10**12]
    clock = lambda: t[0]  # noqa: E731 - virtual monotonic ns

    class Sampler:
        lock = threading.Lock()
        stats = SimpleNamespace(per_collector={})

        def covered_ns(self):
            return t[0] + 10**9

        def poke(self):
            pass

    class Sched:
        def latest_scan_ns(self):
            return t[0] + 10**9

        def watch_tids(self, tids, pids=None):
            pass

        def request_scan(self):
            pass

    class Attr:
        slack_ns = 1_000_000

        def attribute(self, sp, recent):
            return Attribution("irq", [], 0.0, sp.in_process())

    wm = watch_metrics(threshold_ns=2_000_000, source="probe", variant="", p99_budget_us=None)
    feed = MetricsFeed(wm)
    log = tmp_path / "spikes.jsonl"
    s = WatchSession(WatchConfig(loop_s=0.05, threshold_ns=2_000_000, min_samples=0,
                                 spike_log=str(log), trace="off"),
                     clock=clock, metrics=feed, on_record=feed.on_record)
    s.open_outputs()
    s.sampler, s.sched, s.attributor = Sampler(), Sched(), Attr()

    def rows(seqs_lat_ms):
        out, now = [], t[0] - 50_000_000
        for k, (seq, lat_ms) in enumerate(seqs_lat_ms):
            r = [0] * len(FIELDS)
            r[FIELDS.index("seq")] = r[FIELDS.index("seq2")] = seq
            r[FIELDS.index("start_ns")] = now + k * 20_000_000
            r[FIELDS.index("end_ns")] = now + k * 20_000_000 + int(lat_ms * 1e6)
            r[FIELDS.index("pid")], r[FIELDS.index("tid")] = 1, 7
            out.append(r)
        return np.array(out, dtype=np.int64)

    s.ingest(rows([(1, 0.5), (2, 0.6), (3, 7.3), (4, 0.5)]))
    s.attribute_pending(t[0])
    s.close_outputs()
    recs = [json.loads(ln) for ln in log.read_text().splitlines()]
    spike = [r for r in recs if r.get("cause")]
    assert [r["seq"] for r in spike] == [3] and spike[0]["latency_us"] == 7300.0

    def exemplars() -> dict[str, tuple[str, float]]:
        body, _ = render(make_registry(wm), OM)
        fam = next(f for f in om_parse(body.decode())
                   if f.name == "hftagent_probe_latency_seconds")
        return {x.labels["le"]: (x.exemplar.labels["spike_id"], x.exemplar.value)
                for x in fam.samples if x.name.endswith("_bucket") and x.exemplar}
    assert exemplars() == {"0.0075": (str(spike[0]["seq"]), pytest.approx(0.0073))}
    assert wm.snapshot().bucket_cumulative[-1] == 4  # the exemplar adds no observation
    t[0] += 10**9
    s.open_outputs()
    s.ingest(rows([(5, 7.1)]))
    s.attribute_pending(t[0])
    s.close_outputs()
    assert exemplars() == {"0.0075": ("5", pytest.approx(0.0071))}


def test_watch_command_hands_spike_records_to_the_metrics_feed(monkeypatch):
    """`hftagent watch --listen` builds its session with the MetricsFeed's on_record (the
    exemplar hook); without --listen there is none."""
    from typer.testing import CliRunner

    import agent.watch.session as session_mod
    from agent.cli import get_app
    seen: list[dict] = []

    class Stop(Exception):
        pass

    def fake_session(cfg, host, **kw):
        seen.append(kw)
        raise Stop

    monkeypatch.setattr(session_mod, "WatchSession", fake_session)
    for extra in (["--listen", "127.0.0.1:0"], []):
        CliRunner().invoke(get_app(), ["watch", "--probe", "numpy", "--duration", "1",
                                       "--no-live", *extra])
    assert len(seen) == 2
    hook = seen[0]["on_record"]
    assert hook is not None and hook == seen[0]["metrics"].on_record
    assert seen[1]["on_record"] is None


# ---- basic-auth flood from rotating loopback addresses (issue #34 item 7) ------------------

def _auth_config(users: dict[str, str], cost: int):
    import bcrypt

    from agent.export.webconfig import BasicAuth, WebConfig
    hashed = {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(cost)) for u, p in users.items()}
    return WebConfig(path="(test)", users=hashed, auth=BasicAuth(hashed))


@pytest.mark.adversarial
def test_fresh_scraper_is_served_under_a_flood_from_1000_rotating_addresses(user):
    """A local user (the throw-away one) floods distinct wrong passwords (half for a user
    that exists) from 1,000 rotating loopback addresses, 127.0.0.2-127.0.3.251 around the
    scraper's 127.0.0.1, from more threads than the server takes connections, bcrypt cost
    10; 20 fresh scrapers, each with a credential never verified before: at least 19 are
    served (before: 503 on 81 of 81 tries, every flood address stood as clean as the
    scraper; then, with the flood's requests waiting for workers, every connection slot was
    taken). The ≤ 1 s figure is bench/scrape_bench.py --auth-flood's."""
    import base64

    from bench.scrape_bench import fresh_scrapes, start_auth_flood, stop_auth_flood
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 for the unprivileged flood client")
    creds = [(f"scraper{i}", f"pw{i}") for i in range(20)]
    cfg = _auth_config(dict(creds), cost=10)
    with Exporter(populated(), "127.0.0.1:0", web_config=cfg, max_connections=24) as ex:
        flood = start_auth_flood(ex.port, "scraper0", 1000, 120.0, 32, python=python,
                                 as_user=user[1:])
        try:
            # under the flood: every address has guessed, about three times on average
            def refused() -> int:
                st = ex.stats
                return st["refused"] + st["throttled"] + st["unauthorized"]

            assert wait_until(lambda: len(cfg.auth._peers) >= 1000 and refused() >= 3000,
                              60), (len(cfg.auth._peers), ex.stats, flood.poll())
            results = fresh_scrapes(ex.port, creds, interval_s=0.1, timeout_s=30.0)
        finally:
            counts = stop_auth_flood(flood)
        stats = ex.stats
        # a wrong password is still refused; a verified one is served from the cache
        wrong = "Basic " + base64.b64encode(b"scraper0:pw1").decode()
        assert _status(_raw_get(ex.port, "127.0.9.9", wrong)) == 401
        right = "Basic " + base64.b64encode(b"scraper1:pw1").decode()
        checks = cfg.auth.checks
        assert _status(_raw_get(ex.port, "127.0.9.10", right)) == 200
        assert cfg.auth.checks <= checks + 1  # none if scraper1 was served before
    served = [r for r in results if r[0] == 200]
    assert len(served) >= 19, (results, counts, stats)
    # the flood was on throughout and was refused: 429/503/401, never served
    assert counts.get("200", 0) == 0 and sum(counts.values()) >= 2000, counts
    assert stats["refused"] + stats["throttled"] >= 2000, stats


@pytest.mark.adversarial
def test_a_retrying_scraper_gets_through_a_flood_that_uses_its_own_address(user):
    """The flood's 1,000 addresses include the scraper's own 127.0.0.1, which then stands as
    low as any of the flood's: its first try may be refused (429 or 503 with Retry-After),
    but its retries of the same password take the shared budget's returning tokens, which
    the flood's new guesses never get. It is served, then from the cache."""
    import base64

    from bench.scrape_bench import start_auth_flood, stop_auth_flood
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 for the unprivileged flood client")
    cfg = _auth_config({"prom": "right"}, cost=10)
    right = "Basic " + base64.b64encode(b"prom:right").decode()
    with Exporter(populated(), "127.0.0.1:0", web_config=cfg) as ex:
        flood = start_auth_flood(ex.port, "prom", 1000, 120.0, 16, python=python,
                                 as_user=user[1:], also=("127.0.0.1",))
        tries: list[int] = []
        try:
            assert wait_until(lambda: cfg.auth.gated >= 1000, 60), (cfg.auth.gated, ex.stats)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (not tries or tries[-1] != 200):
                s = _raw_get(ex.port, "127.0.0.1", right)
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                finally:
                    s.close()
                tries.append(int(data[9:12]) if data.startswith(b"HTTP/") else -1)
                m = re.search(rb"Retry-After: (\d+)", data)
                time.sleep(min(2, int(m.group(1))) if m else 0.5)
            later = [_status(_raw_get(ex.port, "127.0.0.1", right)) for _ in range(10)]
        finally:
            counts = stop_auth_flood(flood)
    assert tries[-1] == 200 and later == [200] * 10, (tries, counts, ex.stats)
    assert counts.get("200", 0) == 0, counts


def _raw_get(port: int, src: str, header: str, timeout_s: float = 30.0,
             tls=None) -> socket.socket:
    """A request sent from ``src`` (not read yet): the socket (``tls``: a client context)."""
    s = socket.socket()
    s.settimeout(timeout_s)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    if tls is not None:
        s = tls.wrap_socket(s, server_hostname="127.0.0.1")
    s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {header}\r\n"
              "Connection: close\r\n\r\n".encode())
    return s


def _status(s: socket.socket) -> int:
    try:
        head = s.recv(64)
        return int(head[9:12]) if head.startswith(b"HTTP/") else -1
    finally:
        s.close()


def test_verified_credential_is_answered_ahead_of_a_full_queue(monkeypatch):
    """bcrypt held (one check running, the auth queue full) and every worker taken: the
    requests still waiting for a worker are answered in lanes, a credential verified
    before first (a dictionary lookup), then the others in arrival order (before: one
    FIFO, the scraper behind every one). The others here are malformed credentials (a
    guess the loop can refuse itself never waits for a worker)."""
    import base64
    import threading

    import bcrypt
    cfg = _auth_config({"prom": "right"}, cost=4)
    auth = cfg.auth

    def hdr(u: str, p: str) -> str:
        return "Basic " + base64.b64encode(f"{u}:{p}".encode()).decode()

    with Exporter(populated(), "127.0.0.1:0", web_config=cfg,
                  workers=auth.QUEUE + 1) as ex:
        assert _status(_raw_get(ex.port, "127.0.0.1", hdr("prom", "right"))) == 200
        gate, real, picked = threading.Semaphore(0), bcrypt.checkpw, []

        def held(pw: bytes, h: bytes) -> bool:
            assert gate.acquire(timeout=30)
            return real(pw, h)

        monkeypatch.setattr(bcrypt, "checkpw", held)
        check = auth.check
        monkeypatch.setattr(auth, "check", lambda h, p=None: picked.append(h) or check(h, p))
        held_socks = [_raw_get(ex.port, f"127.0.5.{i}", hdr("prom", f"g{i}"))
                      for i in range(1, auth.QUEUE + 2)]   # one running, QUEUE waiting
        assert wait_until(lambda: auth._running and len(auth._queue) == auth.QUEUE, 20)
        work = ex._server._work
        slow = [_raw_get(ex.port, f"127.0.6.{i}", f"Basic !{i}") for i in range(1, 6)]
        assert wait_until(lambda: work.qsize() == 5, 20), work.qsize()
        good = _raw_get(ex.port, "127.0.0.1", hdr("prom", "right"))
        assert wait_until(lambda: work.qsize() == 6, 20), work.qsize()
        gate.release()  # the running check ends: its worker takes the verified one first
        assert _status(good) == 200
        gate.release(10)
        assert [_status(s) for s in slow] == [401] * 5
        assert [_status(s) for s in held_socks] == [401] * (auth.QUEUE + 1)
    good_at = picked.index(hdr("prom", "right"))
    assert all(picked.index(f"Basic !{i}") > good_at for i in range(1, 6)), picked


def _answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(ln.split(": ", 1) for ln in lines[1:])
    return int(lines[0][9:12]), headers, body


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_refusal_the_loop_answers_is_the_workers_answer(tls, tmp_path):
    """A password refused before is answered by the event loop (no worker): the same
    status, headers and body as the worker's answer to its first try (Date, Server and
    Connection aside), the configured headers included, no body for HEAD; over TLS too."""
    import base64

    from agent.export.webconfig import TLSServer, TLSSettings
    from tests.pki import OPENSSL, make_pki
    cfg = _auth_config({"prom": "right"}, cost=4)
    cfg.headers = {"X-Content-Type-Options": "nosniff"}
    ctx = None
    if tls:
        if OPENSSL is None:
            pytest.skip("openssl CLI not installed")
        p = make_pki(tmp_path / "pki")
        cfg.tls_settings = TLSSettings(str(p.server_crt), str(p.server_key))
        cfg.tls, ctx = TLSServer(cfg.tls_settings), p.client_context()
    wrong = "Basic " + base64.b64encode(b"prom:wrong").decode()
    with Exporter(populated(), "127.0.0.1:0", web_config=cfg) as ex:
        first = _answer(_raw_get(ex.port, "127.0.0.1", wrong, tls=ctx))   # a worker's
        checks = cfg.auth.checks
        again = _answer(_raw_get(ex.port, "127.0.0.1", wrong, tls=ctx))   # the loop's
        s = socket.create_connection(("127.0.0.1", ex.port), timeout=30)
        if ctx is not None:
            s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
        s.sendall(f"HEAD /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {wrong}\r\n\r\n"
                  .encode())
        head = _answer(s)
        assert cfg.auth.checks == checks and ex.stats["unauthorized"] == 3
    drop = ("Date", "Server", "Connection")
    same = [(code, {k: v for k, v in h.items() if k not in drop}, body)
            for code, h, body in (first, again)]
    assert same[0] == same[1] and first[0] == 401, (first, again)
    assert first[1]["X-Content-Type-Options"] == "nosniff"
    assert again[1]["Connection"] == "close" and "Connection" not in first[1]  # the loop's
    assert head[0] == 401 and head[2] == b"" and head[1]["Content-Length"] == \
        first[1]["Content-Length"]

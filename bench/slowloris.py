"""A slowloris client against the /metrics exporter, and a well-behaved scraper to run beside
it. Used by tests/test_export_server.py (the adversarial test) and bench/scrape_bench.py
(--slowloris): the same attack in both.

    with Slowloris(port, n=200) as attack:          # a thread; every socket closed at exit
        results = good_scrapes(url, n=20)           # [(status or error, seconds), ...]
    attack.stats                                    # opened, closed by the server, ...

Half the sockets send a request line and then one header line every ``trickle_s`` (never
the blank line that ends the head), the other half never send a byte. A socket the server
closes is opened again on the next pass, as slowloris tools do, so the attacker always
holds about ``n`` sockets. Sources are spread over loopback addresses (127.0.0.0/8 is all
loopback on Linux) to exercise the per-address and the global connection bounds.

Every loop is bounded (``max_opens`` in all, a deadline per connect) and every socket is
closed when the attack stops, whatever happened.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time

SOURCES = ("127.0.0.1",) * 3 + ("127.0.0.2", "127.0.0.3")  # 60 % share the scraper's address


class Slowloris(threading.Thread):
    def __init__(self, port: int, n: int = 200, *, host: str = "127.0.0.1",
                 sources: tuple[str, ...] = SOURCES, trickle_s: float = 0.5,
                 max_opens: int = 50_000) -> None:
        super().__init__(name="slowloris", daemon=True)
        self.addr = (host, port)
        self.n, self.sources, self.trickle_s, self.max_opens = n, sources, trickle_s, max_opens
        self.stop_event = threading.Event()
        self.socks: list[socket.socket | None] = [None] * n
        self.next_line = [0.0] * n
        self.stats = {"opened": 0, "closed_by_server": 0, "connect_failed": 0,
                      "lines_sent": 0, "max_held": 0}
        self.ready = threading.Event()  # set once all n sockets were open at the same time

    # a trickler is every other slot; the rest stay silent
    def _open(self, i: int) -> None:
        if self.stats["opened"] >= self.max_opens:
            return
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((self.sources[i % len(self.sources)], 0))
            s.settimeout(2.0)
            s.connect(self.addr)
            s.setblocking(False)
            if i % 2 == 0:
                s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                self.stats["lines_sent"] += 1
        except OSError:
            s.close()
            self.stats["connect_failed"] += 1
            return
        self.stats["opened"] += 1
        self.socks[i] = s
        self.next_line[i] = time.monotonic() + self.trickle_s

    def _alive(self, s: socket.socket) -> bool:
        try:
            s.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
            return False         # EOF, or an answer (503, 408): the server is done with it
        except BlockingIOError:
            return True          # nothing to read: the server still holds it open
        except OSError:
            return False         # reset by the server

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                now = time.monotonic()
                held = 0
                for i in range(self.n):
                    s = self.socks[i]
                    if s is not None and not self._alive(s):
                        s.close()
                        self.socks[i] = s = None
                        self.stats["closed_by_server"] += 1
                    if s is None:
                        self._open(i)
                        s = self.socks[i]
                    if s is None:
                        continue
                    held += 1
                    if i % 2 == 0 and now >= self.next_line[i]:
                        try:
                            s.send(b"X-Slow-%d: x\r\n" % i)
                            self.stats["lines_sent"] += 1
                        except OSError:
                            pass  # closed under us: the next pass reopens it
                        self.next_line[i] = now + self.trickle_s
                self.stats["max_held"] = max(self.stats["max_held"], held)
                if held == self.n:
                    self.ready.set()
                self.stop_event.wait(0.05)
        finally:
            self.close()

    def close(self) -> None:
        for i, s in enumerate(self.socks):
            if s is not None:
                s.close()
                self.socks[i] = None

    def __enter__(self) -> Slowloris:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.join(10)
        self.close()


def good_scrapes(host: str, port: int, n: int = 20, *, interval_s: float = 0.3,
                 timeout_s: float = 10.0, tls: ssl.SSLContext | None = None,
                 headers: dict[str, str] | None = None) -> list[tuple[int | str, float]]:
    """``n`` scrapes, each on a new connection (the worst case for the scraper: it must win
    a connection slot every time), ``interval_s`` apart: (status or the error, seconds)."""
    out: list[tuple[int | str, float]] = []
    for _ in range(n):
        t0 = time.monotonic()
        if tls is not None:
            c: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=timeout_s, context=tls)
        else:
            c = http.client.HTTPConnection(host, port, timeout=timeout_s)
        try:
            c.request("GET", "/metrics", headers=headers or {})
            r = c.getresponse()
            body = r.read()
            ok = r.status != 200 or b"hftagent_probe_samples_total" in body
            out.append((r.status if ok else "200 without metrics", time.monotonic() - t0))
        except (OSError, http.client.HTTPException) as exc:
            out.append((f"{type(exc).__name__}: {exc}", time.monotonic() - t0))
        finally:
            c.close()
        time.sleep(interval_s)
    return out

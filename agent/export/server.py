"""Prometheus /metrics for `hftagent watch`, built fresh per scrape from a WatchMetrics.

    m = WatchMetrics(thresholds_ns=(500_000, 1_000_000, 5_000_000), variant="xla")
    with Exporter(m, "127.0.0.1:9877") as ex:      # or ex = Exporter(...).start(); ex.stop()
        ...                                         # ex.port is the bound port (listen ":0")

Design points:

* A dedicated :class:`~prometheus_client.CollectorRegistry` holding one custom collector
  (:class:`WatchCollector`) that turns a :class:`~agent.export.metrics.Snapshot` into metric
  families on every collect(); nothing is registered in the library's default registry and
  nothing happens at import.
* Names in base units (``_seconds``, ``_hertz``, ``_total`` for counters; ``promtool check
  metrics`` clean, tested). Every label set is bounded by agent.export.metrics (causes, statuses,
  collectors, checks, gauge allowlist).
* Exemplars: each latency-histogram bucket carries the latest logged spike whose latency
  falls in it, ``{spike_id="<seq of the spike-log record>"}``, printed only when the scrape
  asks for OpenMetrics (``Accept: application/openmetrics-text``, as Prometheus sends; the
  classic text format has no exemplars and stays as before).
* Loopback by default; another address only when the caller passes one
  (:func:`exposure_warning`: `hftagent watch` prints it on stderr).
* The HTTP server is ours, not ``start_http_server``: an event loop holds every connection
  that is not being answered and a few worker threads answer complete requests
  (:class:`_Server`): connections bounded in all and per client address, a deadline for the
  whole request head, the slow and the idle dropped first when a bound is reached, a listen
  backlog for bursts of connects, TLS and basic auth from ``--web.config.file``
  (agent.export.webconfig), no stderr noise per bad request, and a ``stop()`` that closes the
  listening socket *and* every open connection (a restart leaves no port bound).
* The probe never waits on a scrape: a scrape holds WatchMetrics' lock only to copy state.
"""

from __future__ import annotations

import errno
import io
import ipaddress
import itertools
import queue
import re
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Exemplar

from agent.errors import AgentError
from agent.export.metrics import AUDIT_STATUSES, CAUSES, GAUGES, QUANTILES, Snapshot, WatchMetrics
from agent.export.webconfig import AuthBusy, WebConfig, san_allowed

DEFAULT_LISTEN = "127.0.0.1:9877"
P = "hftagent_"


def _fmt(v: float) -> str:
    """Label value for a float bound/quantile: shortest exact repr ("0.005", "0.999")."""
    return repr(float(v))


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("hftagent")
    except Exception:  # noqa: BLE001 - not installed (source tree): still export something
        return "unknown"


# ---- families ----------------------------------------------------------------------------

def probe_families(s: Snapshot) -> Iterator[Metric]:
    """Latency histogram, sample/exceedance counters, window quantiles, probe liveness."""
    h = HistogramMetricFamily(
        P + "probe_latency_seconds",
        "Probe inference latency (one timed call), wall clock.")
    les = [*(_fmt(b) for b in s.bucket_bounds_s), "+Inf"]
    ex = s.bucket_exemplars or (None,) * len(les)
    buckets: list = []
    for le, c, e in zip(les, s.bucket_cumulative, ex, strict=False):
        # the latest logged spike of the bucket as its exemplar: OpenMetrics scrapes print
        # it (`# {spike_id="…"} value timestamp`), the classic text format drops it
        buckets.append((le, c) if e is None else
                       (le, c, Exemplar({"spike_id": e[0]}, e[1], e[2])))
    h.add_metric([], buckets, s.sum_s)
    yield h
    yield CounterMetricFamily(P + "probe_samples_total", "Probe samples timed.", value=s.count)
    exc = CounterMetricFamily(
        P + "probe_exceedances_total",
        "Probe samples strictly over threshold_us; jitter ratio = rate(this) / "
        "rate(hftagent_probe_samples_total).", labels=["threshold_us"])
    for t, c in sorted(s.exceedances.items()):
        exc.add_metric([str(t)], c)
    yield exc
    # A summary, not a gauge with a "quantile" label (promtool rejects that): quantiles over
    # the sliding window, _count/_sum cumulative, the way client_golang's Summary with MaxAge
    # works. Quantiles are absent until the window holds enough samples (99 % confidence).
    q = SummaryMetricFamily(
        P + "probe_latency_quantile_seconds",
        f"Nearest-rank probe latency quantiles over the last {s.window_s:g} s of samples.")
    q.add_sample(P + "probe_latency_quantile_seconds_count", {}, s.count)
    q.add_sample(P + "probe_latency_quantile_seconds_sum", {}, s.sum_s)
    for qq in QUANTILES:
        if qq in s.quantiles:
            q.add_sample(P + "probe_latency_quantile_seconds", {"quantile": _fmt(qq)},
                         s.quantiles[qq])
    yield q
    yield GaugeMetricFamily(P + "probe_window_samples",
                            "Samples in the rolling quantile window.", value=s.window_samples)
    yield GaugeMetricFamily(P + "probe_up", "1 when the probe is warmed and timing.",
                            value=1.0 if s.probe_up else 0.0)
    last = GaugeMetricFamily(P + "probe_last_sample_timestamp_seconds",
                             "Unix time of the newest probe sample (staleness).")
    if s.last_sample_unix_s is not None:
        last.add_metric([], s.last_sample_unix_s)
    yield last
    budget = GaugeMetricFamily(P + "probe_p99_budget_seconds",
                               "This box's P99 latency budget (HftP99OverBudget).")
    if s.p99_budget_s is not None:
        budget.add_metric([], s.p99_budget_s)
    yield budget
    # a service (watch --attach-name/-unit/-cgroup) is labelled by its name, never a pid
    extra = ["service"] if s.service else []
    info = GaugeMetricFamily(P + "probe_info", "What the probe measures (always 1).",
                             labels=["source", "variant", *extra])
    info.add_metric([s.source, s.variant, *([s.service] if extra else [])], 1.0)
    yield info


def spike_families(s: Snapshot) -> Iterator[Metric]:
    c = CounterMetricFamily(P + "spikes_total", "Slow samples attributed, by cause.",
                            labels=["cause"])
    for cause in CAUSES:
        c.add_metric([cause], s.spikes.get(cause, 0))
    yield c
    # the kernel-event breakdown of the spikes (agent/trace): bounded culprits
    cs = CounterMetricFamily(P + "spike_cause_seconds",
                             "Time in the excess of attributed spikes over P50, by what the "
                             "kernel events show ran instead of the probe (culprit: top "
                             "comm, IRQ, softirq vector or work function; other).",
                             labels=["cause", "culprit"])
    for (cause, culprit), v in sorted(s.cause_seconds.items()):
        cs.add_metric([cause, culprit], v)
    yield cs
    if s.gpu_split_s:  # watch --attach --gpu-probes (docs/attach.md, "A GPU service")
        g = CounterMetricFamily(P + "spike_gpu_seconds", "Wall time of the attached GPU "
                                "service's slow calls, by part of their GPU split.",
                                labels=["part"])
        for part, v in s.gpu_split_s:
            g.add_metric([part], v)
        yield g


def audit_families(audit: dict[str, str] | None, audit_unix_s: float | None
                   ) -> Iterator[Metric]:
    """Audit state: one 0/1 series per (check, status) (a state set) and an ok gauge.
    Shared with the node_exporter textfile writer (agent.export.textfile)."""
    st = GaugeMetricFamily(P + "audit_check_status",
                           "1 for the audit check's current status, 0 for the others.",
                           labels=["check", "status"])
    ok = GaugeMetricFamily(P + "audit_check_ok", "1 when the audit check is ok.",
                           labels=["check"])
    for check, status in sorted((audit or {}).items()):
        for candidate in AUDIT_STATUSES:
            st.add_metric([check, candidate], 1.0 if candidate == status else 0.0)
        ok.add_metric([check], 1.0 if status == "ok" else 0.0)
    yield st
    yield ok
    ts = GaugeMetricFamily(P + "audit_last_run_timestamp_seconds",
                           "Unix time of the audit these statuses come from.")
    if audit_unix_s is not None:
        ts.add_metric([], audit_unix_s)
    yield ts


def collector_families(s: Snapshot) -> Iterator[Metric]:
    ok = GaugeMetricFamily(P + "collector_success",
                           "1 when the collector's last run succeeded.", labels=["collector"])
    dur = GaugeMetricFamily(P + "collector_duration_seconds",
                            "Duration of the collector's last run.", labels=["collector"])
    for name, c in sorted(s.collectors.items()):
        ok.add_metric([name], 1.0 if c.success else 0.0)
        dur.add_metric([name], c.duration_s)
    yield ok
    yield dur


def gauge_families(s: Snapshot) -> Iterator[Metric]:
    for name, spec in GAUGES.items():
        g = GaugeMetricFamily(P + name, spec.help, labels=[ln for ln, _ in spec.labels])
        for key, v in sorted(s.gauges.get(name, {}).items()):
            g.add_metric(list(key), v)
        yield g
    d = CounterMetricFamily(P + "metrics_dropped_labels_total",
                            "Label values refused because a series bound was reached.",
                            labels=["family"])
    for fam, n in sorted(s.dropped.items()):
        d.add_metric([fam], n)
    yield d


def own_cost_families(s: Snapshot) -> Iterator[Metric]:
    """Watch's own cost (agent/watch/budget.py): its CPU by part, its budget, the spikes the
    budget decided, and what an attached service is charged for being timed."""
    cpu = CounterMetricFamily(P + "watch_cpu_seconds",
                              "watch's own CPU time by part (sampler, source reads, "
                              "detection, attribution, events: exact attribution, flight, "
                              "other).", labels=["part"])
    for part, v in s.own_cpu_s:
        cpu.add_metric([part], v)
    yield cpu
    b = GaugeMetricFamily(P + "watch_cpu_budget_ratio",
                          "watch's own CPU budget, a share of one CPU (--cpu-budget).")
    if s.cpu_budget_ratio is not None:
        b.add_metric([], s.cpu_budget_ratio)
    yield b
    d = CounterMetricFamily(P + "watch_budget_spikes",
                            "Spikes the CPU budget decided: exact (kernel-event window read), "
                            "skipped (the polled rules' cause only) or shed (the cause of a "
                            "spike ms away on the same CPU).", labels=["decision"])
    for decision, n in s.budget_spikes:
        d.add_metric([decision], n)
    yield d
    c = GaugeMetricFamily(P + "attach_cost_per_call_seconds",
                          "What the uprobes add to each call of the attached service.")
    ch = CounterMetricFamily(P + "attach_charged_cpu_seconds",
                             "CPU time charged to the attached service for being timed: the "
                             "cost per call × its calls timed.")
    if s.attach_cost_per_call_s is not None:
        c.add_metric([], s.attach_cost_per_call_s)
        ch.add_metric([], s.attach_charged_cpu_s or 0.0)
    yield c
    yield ch


class WatchCollector:
    """prometheus_client custom collector: a fresh set of families per collect().
    ``audit=False``: without the audit families (:class:`WatchRegistry` renders those
    separately and only when the audit changes)."""

    def __init__(self, metrics: WatchMetrics, audit: bool = True) -> None:
        self.metrics = metrics
        self.audit = audit
        self._version = _version()

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        s = self.metrics.snapshot()
        yield from probe_families(s)
        yield from spike_families(s)
        if self.audit:
            yield from audit_families(s.audit, s.audit_unix_s)
        yield from collector_families(s)
        yield from gauge_families(s)
        yield from own_cost_families(s)
        b = GaugeMetricFamily(P + "build_info", "hftagent version (always 1).",
                              labels=["version"])
        b.add_metric([self._version], 1.0)
        yield b
        yield GaugeMetricFamily(P + "exporter_collect_duration_seconds",
                                "Time to build the families of this scrape.",
                                value=time.perf_counter() - t0)


class _AuditCollector:
    def __init__(self, audit: dict[str, str] | None, audit_unix_s: float | None) -> None:
        self.args = (audit, audit_unix_s)

    def collect(self) -> Iterator[Metric]:
        yield from audit_families(*self.args)


class WatchRegistry:
    """The exporter's registries: the live families, built fresh on every scrape from a
    metrics snapshot, and the audit state — one 0/1 series per (check, status), 70 % of a
    scrape's samples — rendered once per audit result and per exposition format and reused
    until the audit changes (measured on a slow 2-core VM: a 40-check scrape 5.1 ms → ~1.6 ms
    to render). Never the library's global registry."""

    def __init__(self, metrics: WatchMetrics) -> None:
        self.metrics = metrics
        self.live = CollectorRegistry(auto_describe=False)
        self.live.register(WatchCollector(metrics, audit=False))  # type: ignore[arg-type]
        self._audit_key: object = None
        self._audit_text: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def render(self, accept: str = "") -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        live = encoder(self.live)
        audit, audit_s = self.metrics.audit_state()
        key = (audit_s, tuple(sorted((audit or {}).items())))
        with self._lock:  # scrapes run on concurrent server threads
            if key != self._audit_key:
                self._audit_key, self._audit_text = key, {}
            text = self._audit_text.get(content_type)
            if text is None:
                reg = CollectorRegistry(auto_describe=False)
                reg.register(_AuditCollector(audit, audit_s))  # type: ignore[arg-type]
                text = self._audit_text[content_type] = encoder(reg)
        eof = b"# EOF\n"
        if live.endswith(eof):  # OpenMetrics: one terminator, at the very end
            return live[:-len(eof)] + text, content_type
        return live + text, content_type


def make_registry(metrics: WatchMetrics) -> WatchRegistry:
    """The exporter's registry for ``metrics`` (see :class:`WatchRegistry`)."""
    return WatchRegistry(metrics)


def render(registry: CollectorRegistry | WatchRegistry, accept: str = "") -> tuple[bytes, str]:
    """Body and Content-Type for a scrape with this Accept header (text or OpenMetrics)."""
    if isinstance(registry, WatchRegistry):
        return registry.render(accept)
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


# ---- HTTP server -------------------------------------------------------------------------

def parse_listen(listen: str) -> tuple[str, int]:
    """"127.0.0.1:9877", "[::1]:9877", ":9877" (= loopback), "9877" -> (host, port)."""
    from collectors.parsers import is_uint
    s = listen.strip()
    if is_uint(s):
        host, port_s = "", s
    elif s.startswith("["):
        host, sep, port_s = s[1:].partition("]:")
        if not sep:
            raise AgentError(f"bad --listen {listen!r}: expected [ADDR]:PORT")
    else:
        host, sep, port_s = s.rpartition(":")
        if not sep:
            raise AgentError(f"bad --listen {listen!r}: expected ADDR:PORT")
    host = host or "127.0.0.1"  # loopback unless an address is given
    try:
        if not is_uint(port_s):  # ASCII digits only: int() would take "٣" as port 3
            raise ValueError(port_s)
        port = int(port_s)
        ipaddress.ip_address(host)
    except ValueError:
        raise AgentError(f"bad --listen {listen!r}: expected a numeric IP address and a "
                         "port") from None
    if not 0 <= port <= 65535:
        raise AgentError(f"bad --listen {listen!r}: port out of range")
    return host, port


def is_loopback(host: str) -> bool:
    ip = ipaddress.ip_address(host)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is loopback too
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def exposure_warning(host: str, port: int, web_config: WebConfig | None) -> str | None:
    """The warning for a listen address beyond loopback (None on loopback): what the
    address exposes and what protects it."""
    if is_loopback(host):
        return None
    h = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    where = "every interface" if ipaddress.ip_address(host).is_unspecified else "this address"
    missing = []
    if web_config is None or web_config.tls is None:
        missing.append("TLS")
    if web_config is None or web_config.auth is None:
        missing.append("authentication")
    if missing:
        return (f"/metrics listens on {h} ({where}, beyond loopback) without "
                f"{' or '.join(missing)}: whoever reaches the port reads this box's state; "
                "set TLS and basic_auth_users with --web.config.file and firewall the port "
                "to the Prometheus hosts (docs/fleet.md)")
    return (f"/metrics listens on {h} ({where}, beyond loopback) with TLS and basic auth; "
            "firewall the port to the Prometheus hosts (docs/fleet.md)")


# Connection states. A connection is in the event loop (HANDSHAKE, HEAD, IDLE) or with a
# worker (BUSY); only the event loop closes sockets.
HANDSHAKE, HEAD, IDLE, BUSY = "handshake", "head", "idle", "busy"
MAX_HEAD_BYTES = 65536
_HEAD_END = re.compile(rb"\r?\n\r?\n")
# The first Authorization line, unless folded onto the next one (then the handler's parser
# reads more than this line: the worker decides)
_AUTHORIZATION = re.compile(rb"(?im)^authorization:[ \t]*([^\r\n]*)\r?\n(?![ \t])")
_GET_OR_HEAD = re.compile(rb"(GET|HEAD) [^ \r\n]+ HTTP/1\.[01]\r?\n")
_REASONS = {401: "Unauthorized", 429: "Too Many Requests", 503: "Service Unavailable"}
# Work lanes: requests the workers can answer at once (no auth, or a credential verified
# before) go ahead of those that may wait for bcrypt; the stop sentinels after everything.
FAST, SLOW, STOP = 0, 1, 2


class _Conn:
    __slots__ = ("sock", "addr", "ip", "born", "deadline", "buf", "state", "served",
                 "last", "kill")

    def __init__(self, sock: socket.socket, addr: Any, now: float, deadline: float,
                 state: str) -> None:
        self.sock, self.addr, self.ip = sock, addr, addr[0]
        self.born = self.last = now
        self.deadline = deadline
        self.buf = b""
        self.state = state
        self.served = 0        # requests answered on this connection
        self.kill = False      # shut down by the loop while a worker held it


class _Writer(io.BufferedIOBase):
    """wfile for the handler: every write goes out whole (sendall under the socket's
    timeout)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self._sock.sendall(b)
        return len(b)


def _refusal(code: int, retry_after_s: int) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """Body and headers of a refused request: 401, or 429/503 with Retry-After."""
    if code == 401:
        return b"Unauthorized\n", (("WWW-Authenticate",
                                     'Basic realm="hftagent", charset="UTF-8"'),)
    body = b"busy\n" if code == 503 else b"too many failed logins\n"
    return body, (("Retry-After", str(retry_after_s)),)


def _refusal_bytes(code: int, retry_after_s: int, head_only: bool,
                   headers: dict[str, str]) -> bytes:
    """The whole answer the event loop sends for a refusal it decides itself: what the
    handler sends for the same refusal, and ``Connection: close``."""
    import email.utils
    body, extra = _refusal(code, retry_after_s)
    lines = [f"HTTP/1.1 {code} {_REASONS[code]}", f"Server: {_Handler.server_version}",
             f"Date: {email.utils.formatdate(usegmt=True)}", "Content-Type: text/plain",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in extra),
             *(f"{k}: {v}" for k, v in headers.items()), "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body)


class _Handler(BaseHTTPRequestHandler):
    """One request whose head the event loop has read already (``head``); runs on a worker
    thread with a blocking socket (timeout: the server's write timeout)."""

    server: _Server
    protocol_version = "HTTP/1.1"      # keep-alive: Prometheus reuses its connection
    server_version = "hftagent"
    sys_version = ""

    def __init__(self, conn: _Conn, head: bytes, server: _Server) -> None:  # noqa: D107
        # Not BaseRequestHandler.__init__: no makefile() reader — the head is in memory.
        self.server = server
        self.request = self.connection = conn.sock
        self.client_address = conn.addr
        self.rfile = io.BytesIO(head)
        self.wfile = _Writer(conn.sock)
        self.close_connection = True
        self.handle_one_request()

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._serve(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(head=True)

    def end_headers(self) -> None:
        for k, v in self.server.extra_headers.items():  # http_server_config.headers
            self.send_header(k, v)
        super().end_headers()

    def _serve(self, head: bool) -> None:
        auth = self.server.auth
        path = self.path.split("?", 1)[0]
        extra: tuple[tuple[str, str], ...] = ()
        retry = 1
        try:
            allowed = auth is None or auth.check(self.headers.get("Authorization"),
                                                 self.client_address[0])
        except AuthBusy as busy:  # not checked now (queue full, or this peer over its
            # failure budget: 429): come back later, without holding this worker
            self.server.count("refused" if busy.status == 503 else "throttled")
            allowed, code = False, busy.status
            retry = busy.retry_after_s
        else:
            code = 401
        if not allowed:
            if code == 401:
                self.server.count("unauthorized")
            body, extra = _refusal(code, retry)
            ctype = "text/plain"
        elif path == "/metrics":
            try:
                body, ctype = render(self.server.registry, self.headers.get("Accept", ""))
                code = 200
            except Exception as exc:  # noqa: BLE001 - a scrape error is a 500, never a crash
                self.server.count("errors")
                body, ctype, code = f"collect failed: {exc}\n".encode(), "text/plain", 500
        elif path == "/":
            body, ctype, code = (b"<html><body><a href=\"/metrics\">/metrics</a></body></html>\n",
                                 "text/html", 200)
        else:
            body, ctype, code = b"not found\n", "text/plain", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per scrape on stderr would drown the watch log


class _Server:
    """The listening socket, an event loop that owns every connection while it is not
    being answered, and a few worker threads that answer complete requests.

    Why not one thread per connection (http.server's ThreadingHTTPServer): a thread per
    connection ties a slot to whoever holds the socket, so 64 slow-header or silent clients
    held every slot and each good scrape got 503 (a per-read socket timeout restarts on
    every header line). Here a connection that has not sent a complete request head costs a
    file descriptor and a few bytes, never a thread:

    * **Head deadline.** The whole request head — the TLS handshake included — must arrive
      within ``head_timeout_s`` of the accept, however it trickles in; after a response a
      keep-alive connection may stay silent ``idle_timeout_s``, and once it sends a byte its
      next head has ``head_timeout_s`` too. Missed: closed (408 on plain HTTP).
    * **Bounds.** At most ``max_connections`` connections, ``max_per_client`` from one
      address. A new connection over either bound takes the place of another: first the
      oldest that has not completed a request head yet (read once more before it goes, in
      case its head just arrived), then the longest-idle keep-alive connection; for the
      global bound, from the address holding the most connections. A connection being
      answered is never dropped; only when every candidate is being answered does the
      newcomer get 503. A good scraper's head arrives within a millisecond of its connect,
      so it is answered before anyone could take its place.
    * **Workers.** ``workers`` threads answer complete requests (render + write, the write
      under ``write_timeout_s``); the connection goes back to the loop for its next head.
      Requests wait for a worker in two lanes: those answered without bcrypt (no auth, or
      a credential verified before) ahead of those that may need it, so a flood of
      unverified passwords never queues ahead of a scraper whose password is cached. A
      refusal decided without bcrypt (BasicAuth.triage: a password refused before, a guess
      over a budget, a full bcrypt lane) the loop answers itself, so such a flood never
      holds the connection slots waiting for workers.
    """

    def __init__(self, addr: tuple[str, int], registry: CollectorRegistry | WatchRegistry, *,
                 web_config: WebConfig | None, max_connections: int, max_per_client: int,
                 head_timeout_s: float, idle_timeout_s: float, write_timeout_s: float,
                 workers: int) -> None:
        family = (socket.AF_INET6 if ipaddress.ip_address(addr[0]).version == 6
                  else socket.AF_INET)
        self.registry = registry
        self.web_config = web_config
        self.tls = web_config.tls if web_config else None
        self.auth = web_config.auth if web_config else None
        self.extra_headers = dict(web_config.headers) if web_config else {}
        self.sans = (web_config.tls_settings.client_allowed_sans
                     if web_config and web_config.tls_settings else None)
        self.max_connections = max(1, max_connections)
        self.max_per_client = max(1, min(max_per_client, self.max_connections))
        self.head_timeout_s = head_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.write_timeout_s = write_timeout_s
        self.counts = dict.fromkeys(("errors", "refused", "evicted", "timed_out",
                                     "tls_failed", "unauthorized", "throttled", "too_large"),
                                    0)
        self._count_lock = threading.Lock()
        self.conns: dict[int, _Conn] = {}               # by id(); accept order = age order
        self.by_ip: dict[str, dict[int, _Conn]] = {}
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            # a restart binds again despite TIME_WAIT connections
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(addr)
            # a backlog for a burst of connects (50 concurrent scrapers, or an attack's
            # reconnects) so a good client's SYN is not dropped and retried a second later
            self.listener.listen(1024)
            self.listener.setblocking(False)
        except OSError:
            self.listener.close()
            raise
        self.server_address = self.listener.getsockname()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._returned: queue.SimpleQueue[tuple[_Conn, bool]] = queue.SimpleQueue()
        self._work: queue.PriorityQueue[tuple[int, int, tuple[_Conn, bytes] | None]] = \
            queue.PriorityQueue()
        self._work_seq = itertools.count()  # FIFO within a lane (the loop thread's)
        self._stopping = False
        self._accept_paused_until = 0.0
        self._n_workers = max(1, workers)
        self._workers: list[threading.Thread] = []

    # -- bookkeeping ----------------------------------------------------------------------
    def count(self, what: str, n: int = 1) -> None:
        with self._count_lock:
            self.counts[what] += n

    def _add(self, c: _Conn) -> None:
        self.conns[id(c)] = c
        self.by_ip.setdefault(c.ip, {})[id(c)] = c

    def _close(self, c: _Conn, reply: bytes = b"") -> None:
        """Forget and close ``c`` (event loop thread only)."""
        if self.conns.pop(id(c), None) is None:
            return
        per = self.by_ip.get(c.ip)
        if per is not None:
            per.pop(id(c), None)
            if not per:
                del self.by_ip[c.ip]
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass  # not registered: handed back by a worker, or never registered
        if reply and not isinstance(c.sock, ssl.SSLSocket):
            try:
                c.sock.send(reply)  # best effort: non-blocking, a full buffer drops it
            except OSError:
                pass
        try:
            c.sock.close()
        except OSError:
            pass

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        # The plain socket's shutdown(2), also for an SSLSocket (whose own shutdown() drops
        # its SSL object under the worker that may be writing through it): the worker's
        # blocked send fails at once and it hands the connection back.
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass

    # -- admission ------------------------------------------------------------------------
    def _victim(self, pool: dict[int, _Conn]) -> _Conn | None:
        """The connection in ``pool`` to drop for a newcomer (see the class docstring)."""
        for c in list(pool.values()):  # oldest first
            if c.served == 0 and c.state in (HANDSHAKE, HEAD):
                self._progress(c)  # its head may be waiting in the socket: answer it
                if id(c) in self.conns and c.state in (HANDSHAKE, HEAD):
                    return c
        idle = [c for c in pool.values() if c.served > 0 and c.state in (IDLE, HEAD)]
        return min(idle, key=lambda c: c.last) if idle else None

    def _make_room(self, ip: str) -> bool:
        """Below both bounds for one more connection from ``ip``, dropping others if need
        be; False when every candidate is being answered."""
        while True:  # each turn closes one connection: it ends
            per = self.by_ip.get(ip, {})
            if len(per) >= self.max_per_client:
                victim = self._victim(per)
            elif len(self.conns) >= self.max_connections:
                victim = (self._victim(max(self.by_ip.values(), key=len))
                          or self._victim(self.conns))
            else:
                return True
            if victim is None:
                # reading the candidates may have answered and closed some (a refusal the
                # loop decides itself), and workers may have handed some back since this
                # round began: room, unless both bounds still hold
                per = self.by_ip.get(ip, {})
                if len(per) < self.max_per_client and len(self.conns) < self.max_connections:
                    return True
                if not self._take_back(time.monotonic()):
                    return False
                continue
            if id(victim) in self.conns:
                self.count("evicted")
                self._close(victim)

    def _admit(self, sock: socket.socket, addr: Any, now: float) -> None:
        if not self._make_room(addr[0]):
            return self._refuse(sock)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            state = HEAD
            if self.tls is not None:
                sock = self.tls.context().wrap_socket(sock, server_side=True,
                                                      do_handshake_on_connect=False)
                state = HANDSHAKE
        except (OSError, ValueError):
            sock.close()
            self.count("tls_failed")
            return
        c = _Conn(sock, addr, now, now + self.head_timeout_s, state)
        self._add(c)
        self._sel.register(sock, selectors.EVENT_READ, c)
        self._progress(c)  # the head is usually there already: no extra select round

    def _refuse(self, sock: socket.socket) -> None:
        self.count("refused")
        if self.tls is None:
            try:
                sock.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                          b"Connection: close\r\n\r\n")
            except OSError:
                pass
        sock.close()

    def _accept(self, now: float) -> None:
        for _ in range(256):  # a burst per wake-up, then the ready connections get a turn
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # EMFILE/ENFILE/ENOBUFS: the listener stays readable; pause accepting for
                # a moment instead of spinning (the sweep frees descriptors meanwhile)
                self.count("errors")
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._accept_paused_until = now + 0.1
                    self._sel.unregister(self.listener)
                return
            self._admit(sock, addr, now)

    # -- reading heads --------------------------------------------------------------------
    def _progress(self, c: _Conn) -> None:
        """Advance ``c`` without blocking: the TLS handshake, then read; a complete head
        goes to a worker. Closes the connection on EOF, an error or an oversized head."""
        if c.state == BUSY:  # a worker's now (dispatched earlier in this round)
            return
        sock = c.sock
        if c.state == HANDSHAKE:
            try:
                sock.do_handshake()  # type: ignore[attr-defined]
            except ssl.SSLWantReadError:
                return self._want(c, selectors.EVENT_READ)
            except ssl.SSLWantWriteError:
                return self._want(c, selectors.EVENT_WRITE)
            except (OSError, ValueError):  # ssl.SSLError is an OSError
                self.count("tls_failed")
                return self._close(c)
            if self.sans is not None and not san_allowed(sock.getpeercert(), self.sans):
                self.count("tls_failed")
                return self._close(c)
            c.state = HEAD
            self._want(c, selectors.EVENT_READ)
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                return self._want(c, selectors.EVENT_READ)  # (back from a TLS want-write)
            except ssl.SSLWantWriteError:
                return self._want(c, selectors.EVENT_WRITE)
            except (OSError, ValueError):
                return self._close(c)
            if not data:
                return self._close(c)
            if c.state == IDLE:  # a keep-alive connection starts its next request
                c.state = HEAD
                c.deadline = min(c.deadline, time.monotonic() + self.head_timeout_s)
            start = max(0, len(c.buf) - 3)
            c.buf += data
            m = _HEAD_END.search(c.buf, start)
            if m is not None:
                return self._dispatch(c, m.end())
            if len(c.buf) > MAX_HEAD_BYTES:
                self.count("too_large")
                return self._close(c, b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                                      b"Content-Length: 0\r\nConnection: close\r\n\r\n")

    def _want(self, c: _Conn, events: int) -> None:
        key = self._sel.get_key(c.sock)
        if key.events != events:
            self._sel.modify(c.sock, events, c)

    def _dispatch(self, c: _Conn, end: int) -> None:
        head, c.buf = c.buf[:end], c.buf[end:]
        refusal = self._triage(c, head)
        if refusal is not None:  # answered here: it never waits for a worker
            try:
                c.sock.send(refusal)  # a fresh connection's empty buffer takes it whole
            except (OSError, ValueError):  # ssl.SSLWantWriteError included: dropped
                pass
            return self._close(c)
        self._sel.unregister(c.sock)
        c.state = BUSY
        c.last = time.monotonic()
        c.deadline = c.last + self.write_timeout_s + 5.0  # render time on a loaded box
        try:
            c.sock.settimeout(self.write_timeout_s)
        except OSError:
            c.state = IDLE
            return self._close(c)
        self._work.put((self._lane(head), next(self._work_seq), (c, head)))

    def _triage(self, c: _Conn, head: bytes) -> bytes | None:
        """The answer to a GET or HEAD the loop refuses itself (BasicAuth.triage: a
        password refused before, or one that would be refused now without bcrypt); None:
        a worker's."""
        if self.auth is None:
            return None
        m = _AUTHORIZATION.search(head)
        if m is None or not _GET_OR_HEAD.match(head):
            return None
        verdict = self.auth.triage(m.group(1).decode("latin-1").strip(), c.ip)
        if verdict is None:
            return None
        code, retry = verdict
        self.count({401: "unauthorized", 429: "throttled"}.get(code, "refused"))
        return _refusal_bytes(code, retry, head.startswith(b"HEAD "), self.extra_headers)

    def _lane(self, head: bytes) -> int:
        """FAST for a request a worker answers without bcrypt: no auth configured, or the
        head carries a credential verified before (a dictionary lookup). A flood of
        unverified passwords then never queues ahead of a scraper whose password is
        cached."""
        if self.auth is None:
            return FAST
        m = _AUTHORIZATION.search(head)
        if m is None:
            return SLOW
        return FAST if self.auth.cached(m.group(1).decode("latin-1").strip()) else SLOW

    def _back(self, c: _Conn, keep: bool, now: float) -> None:
        """A worker handed ``c`` back: close it, or wait for its next head."""
        if id(c) not in self.conns:
            return
        c.state = IDLE  # the loop's again
        if not keep or c.kill or self._stopping:
            return self._close(c)
        c.served += 1
        c.last = now
        try:
            c.sock.setblocking(False)
        except OSError:
            return self._close(c)
        if c.buf:  # pipelined bytes of the next request
            c.state, c.deadline = HEAD, now + self.head_timeout_s
        else:
            c.state, c.deadline = IDLE, now + self.idle_timeout_s
        self._sel.register(c.sock, selectors.EVENT_READ, c)
        m = _HEAD_END.search(c.buf)
        if m is not None:
            return self._dispatch(c, m.end())
        self._progress(c)  # TLS may hold decrypted bytes that select() cannot see

    def _take_back(self, now: float) -> int:
        """Take the connections the workers handed back (loop thread): how many."""
        n = 0
        while True:
            try:
                c, keep = self._returned.get_nowait()
            except queue.Empty:
                return n
            self._back(c, keep, now)
            n += 1

    def _sweep(self, now: float) -> None:
        for c in list(self.conns.values()):
            if now < c.deadline:
                continue
            if c.state == BUSY:
                if not c.kill:  # a client that does not read its answer
                    c.kill = True
                    self.count("timed_out")
                    self._shutdown(c.sock)
                continue
            self.count("timed_out")
            self._close(c, b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n"
                           b"Connection: close\r\n\r\n" if c.state == HEAD and c.buf else b"")

    # -- threads --------------------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            _, _, item = self._work.get()
            if item is None:
                return
            c, head = item
            keep = False
            try:
                keep = not _Handler(c, head, self).close_connection
            except Exception:  # noqa: BLE001 - a client that hung up mid-answer: count it
                self.count("errors")
            self._returned.put((c, keep))
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass  # the pipe is full: the loop is awake anyway

    def serve_forever(self) -> None:
        sel = self._sel
        sel.register(self.listener, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        for i in range(self._n_workers):
            t = threading.Thread(target=self._worker, name=f"hftagent-exporter-w{i}",
                                 daemon=True)
            t.start()
            self._workers.append(t)
        next_sweep = 0.0
        try:
            while not self._stopping:
                events = sel.select(0.1)
                now = time.monotonic()
                for key, _mask in events:
                    d = key.data
                    if d == "listen":
                        self._accept(now)
                    elif d == "wake":
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except OSError:
                            pass
                    elif id(d) in self.conns:
                        self._progress(d)
                self._take_back(now)
                if now >= next_sweep:
                    next_sweep = now + 0.1
                    self._sweep(now)
                if self._accept_paused_until and now >= self._accept_paused_until:
                    self._accept_paused_until = 0.0
                    sel.register(self.listener, selectors.EVENT_READ, "listen")
        finally:
            self._teardown()

    def _teardown(self) -> None:
        try:
            self._sel.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.listener.close()  # the port is free from here on
        for c in list(self.conns.values()):
            if c.state == BUSY:
                self._shutdown(c.sock)
            else:
                self._close(c)
        for _ in self._workers:
            self._work.put((STOP, next(self._work_seq), None))
        deadline = time.monotonic() + 5.0
        for t in self._workers:
            t.join(max(0.0, deadline - time.monotonic()))
        while True:  # what the workers handed back, and anything still held
            try:
                c, _ = self._returned.get_nowait()
            except queue.Empty:
                break
            c.state = IDLE
            self._close(c)
        for c in list(self.conns.values()):
            c.state = IDLE
            self._close(c)
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def stop(self) -> None:
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass


class Exporter:
    """The /metrics HTTP endpoint. ``start()`` binds (AgentError if it cannot), ``stop()``
    closes the listening socket and every connection; both idempotent. Call stop() from any
    thread but the server's (e.g. the watch loop's SIGTERM path).

    ``web_config`` (agent.export.webconfig.load_web_config): TLS and basic auth. The connection
    bounds and deadlines are described in :class:`_Server`; their defaults hold 200 hostile
    sockets (slow headers and silent ones) with every good scrape answered
    (tests/test_export_server.py, docs/benchmarks.md)."""

    def __init__(self, metrics: WatchMetrics, listen: str = DEFAULT_LISTEN, *,
                 web_config: WebConfig | None = None, max_connections: int = 256,
                 max_per_client: int = 64, head_timeout_s: float = 5.0,
                 idle_timeout_s: float = 120.0, write_timeout_s: float = 10.0,
                 workers: int = 8) -> None:
        self.metrics = metrics
        self.host, self._port = parse_listen(listen)
        self.registry = make_registry(metrics)
        self.web_config = web_config
        self.limits = {"max_connections": max_connections, "max_per_client": max_per_client,
                       "head_timeout_s": head_timeout_s, "idle_timeout_s": idle_timeout_s,
                       "write_timeout_s": write_timeout_s, "workers": workers}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._last_counts: dict[str, int] = {}

    @property
    def port(self) -> int:
        """The bound port (the real one when listen asked for port 0)."""
        return self._server.server_address[1] if self._server else self._port

    @property
    def scheme(self) -> str:
        return "https" if self.web_config is not None and self.web_config.tls else "http"

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{h}:{self.port}/metrics"

    @property
    def stats(self) -> dict[str, int]:
        """Counters since start: errors, refused (503), evicted (dropped for a newcomer),
        timed_out (head, idle or write deadline), tls_failed, unauthorized (401), throttled
        (429: a peer over its own failed-login budget, or guessing while the one all peers
        share is spent), too_large, and the connections open now."""
        s = self._server
        if s is None:
            return dict(self._last_counts) or {"errors": 0, "refused": 0}
        with s._count_lock:
            out = dict(s.counts)
        out["open"] = len(s.conns)
        return out

    def exposure_warning(self) -> str | None:
        """A warning for stderr when the address is beyond loopback (None on loopback)."""
        return exposure_warning(self.host, self.port, self.web_config)

    def start(self) -> Exporter:
        with self._lock:
            if self._server is not None:
                return self
            try:
                server = _Server((self.host, self._port), self.registry,
                                 web_config=self.web_config, **self.limits)
            except OSError as exc:
                raise AgentError(f"cannot listen on {self.host}:{self._port}: "
                                 f"{exc.strerror or exc}") from None
            t = threading.Thread(target=server.serve_forever, name="hftagent-exporter",
                                 daemon=True)
            t.start()
            self._server, self._thread = server, t
            return self

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._lock:
            server, thread = self._server, self._thread
            if server is None:
                return
            self._port = server.server_address[1]
            server.stop()        # the loop closes the listening socket and every connection
            if thread is not None:
                thread.join(timeout_s)
            self._last_counts = dict(server.counts)
            self._server = self._thread = None

    def __enter__(self) -> Exporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""Scrape benchmark: /metrics latency while observe() runs at 1 kHz, and 50 concurrent
scrapers for 30 s against the probe's tail, side by side in one run.

Layout (the deployment's): this process = the watch process (WatchMetrics, the exporter, a
1 kHz latency stream calling observe()) on the housekeeping CPU; a separate probe process on
the probe CPU timing a fixed compute unit open-loop at 1 kHz (a stand-in for the TF probe
worker); the scrapers in a third process on the housekeeping CPU (like a local Prometheus
agent).

Phases, in this order, in one run:
  off1   (--off-s)   stream + probe, no scrapes
  single (--single-s) one scraper in a loop: the scrape latency figure (P50/P99/max)
  load   (--load-s)  --scrapers concurrent scrapers, each every --interval s (0 = flat out)
  off2   (--off-s)   no scrapes again
Probe latency and observe() cost in `load` are compared with off1+off2 pooled (ratios), so
drift of this noisy shared machine over the run shows as off1 vs off2.

    .venv/bin/python bench/scrape_bench.py                    # paced: 50 scrapers at 1/s
    .venv/bin/python bench/scrape_bench.py --interval 0       # flat out
    .venv/bin/python bench/scrape_bench.py --ab-pairs 150     # + alternating on/off blocks:
                                                              # P99 ratio with a 95 % CI
    .venv/bin/python bench/scrape_bench.py --slowloris 200    # only: good scrapes, each on
                                                              # a new connection, without
                                                              # and then under 200 hostile
                                                              # sockets (bench/slowloris.py)
    .venv/bin/python bench/scrape_bench.py --tls-auth         # only: scrape cost, plain vs
                                                              # TLS + basic auth (bcrypt
                                                              # cost 10, throw-away certs)
    .venv/bin/python bench/scrape_bench.py --auth-flood 1000  # only: fresh scrapers (never
                                                              # verified credentials, bcrypt
                                                              # cost 10) under wrong
                                                              # passwords from 1,000 rotating
                                                              # loopback addresses
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent import stats  # noqa: E402
from agent.export.metrics import WatchMetrics  # noqa: E402
from agent.export.server import Exporter  # noqa: E402
from tuning.findings import Finding, Status  # noqa: E402


def pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            pass


def pct(a: np.ndarray, q: float) -> float:
    """Nearest-rank P``q`` (agent.stats); NaN for no samples."""
    return float(stats.quantile(np.asarray(a), q)) if len(a) else float("nan")


# ---- probe stand-in (own process) ----------------------------------------------------------

def work_unit(n: int) -> int:
    acc = 0
    for i in range(n):
        acc += i * i
    return acc


def probe_proc(cpu: int | None, n: int, stop_at: float, out: mp.Queue, stop=None) -> None:
    """Open loop at 1 kHz: intended start times, latency = end − intended start (coordinated-
    omission free). Runs until ``stop_at`` or, checked once a second, the ``stop`` event."""
    pin(cpu)
    times, phases = [], []
    period = 1_000_000
    t_next = time.monotonic_ns()
    while time.monotonic() < stop_at and not (stop is not None and len(times) % 1000 == 0
                                              and stop.is_set()):
        while time.monotonic_ns() < t_next:
            pass
        work_unit(n)
        end = time.monotonic_ns()
        times.append(end - t_next)
        phases.append(end)
        t_next += period
        if end > t_next + 50 * period:  # fell far behind (machine stalled): resync
            t_next = end
    out.put((np.array(phases, dtype=np.int64), np.array(times, dtype=np.int64)))


# ---- scrapers (own process) ----------------------------------------------------------------

def scraper_proc(cpu: int | None, port: int, n: int, interval: float, duration: float,
                 out: mp.Queue, gate=None) -> None:
    """``gate`` (an mp.Event, optional): scrapers only start a scrape while it is set (the
    A/B phase switches the load on and off without restarting 50 connections)."""
    pin(cpu)
    lat: list[list[int]] = [[] for _ in range(n)]
    errors: list[str] = []
    start = time.monotonic()

    def one(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        nxt = time.monotonic() + (interval * k / n if interval else 0)
        while True:
            now = time.monotonic()
            if now - start >= duration:
                break
            if interval and now < nxt:
                time.sleep(nxt - now)
            if gate is not None and not gate.is_set():  # an "off" block: wait, keep pace
                gate.wait(0.05)
                nxt = max(nxt, time.monotonic())
                continue
            nxt += interval
            t0 = time.perf_counter_ns()
            try:
                conn.request("GET", "/metrics")
                r = conn.getresponse()
                body = r.read()
                if r.status != 200 or b"hftagent_probe_samples_total" not in body:
                    errors.append(f"status {r.status}")
            except (OSError, http.client.HTTPException) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                continue
            lat[k].append(time.perf_counter_ns() - t0)
        conn.close()

    ts = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put((np.array([x for v in lat for x in v], dtype=np.int64), errors))


# ---- slowloris (own processes) ---------------------------------------------------------------

def slowloris_proc(port: int, n: int, seconds: float, ready, out: mp.Queue) -> None:
    from bench.slowloris import Slowloris
    with Slowloris(port, n=n) as attack:
        ok = attack.ready.wait(30)
        ready.set()
        time.sleep(seconds)
    out.put((ok, attack.stats))


def good_proc(port: int, n: int, interval: float, out: mp.Queue) -> None:
    from bench.slowloris import good_scrapes
    out.put(good_scrapes("127.0.0.1", port, n=n, interval_s=interval, timeout_s=10.0))


def slowloris_bench(a: argparse.Namespace, m: WatchMetrics, ctx) -> dict:
    """Good scrapes (a new connection each: the scraper must win a slot every time) for
    --slowloris-s without an attack, then as long again under --slowloris hostile sockets
    (half trickling a header line every 0.5 s, half silent, reopened when dropped, 60 % from
    the scraper's own address), against the exporter's default bounds."""
    n = max(1, int(a.slowloris_s / a.slowloris_interval))

    def summary(res: list) -> dict:
        lat = np.array([t for st, t in res if st == 200]) * 1e3
        fails = [st for st, _ in res if st != 200]
        return {"n": len(res), "failed": len(fails), "fail_samples": fails[:5],
                "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
                "max_ms": float(lat.max()) if len(lat) else None}

    out: dict = {"command": " ".join(sys.argv), "hostile": a.slowloris,
                 "interval_s": a.slowloris_interval}
    with Exporter(m, "127.0.0.1:0") as ex:
        q: mp.Queue = ctx.Queue()
        g = ctx.Process(target=good_proc, args=(ex.port, n, a.slowloris_interval, q))
        g.start()
        out["quiet"] = summary(q.get())
        g.join()
        ready, aq = ctx.Event(), ctx.Queue()
        att = ctx.Process(target=slowloris_proc,
                          args=(ex.port, a.slowloris, a.slowloris_s + 2.0, ready, aq))
        att.start()
        ready.wait(60)
        g = ctx.Process(target=good_proc, args=(ex.port, n, a.slowloris_interval, q))
        g.start()
        out["attack"] = summary(q.get())
        g.join()
        all_held, out["attacker"] = aq.get()
        out["attacker"]["all_held_at_once"] = all_held
        att.join()
        out["server"] = ex.stats
    return out


def tls_auth_bench(m: WatchMetrics, n: int = 2000) -> dict:
    """Scrape latency in this process, plain HTTP vs TLS + basic auth (--web.config.file with
    a cost-10 bcrypt hash and throw-away certificates from tests/pki.py, openssl CLI): the
    first scrape (one bcrypt check), ``n`` keep-alive scrapes (the verified credentials come
    from the cache), and 200 scrapes on new connections (a TLS handshake each)."""
    import base64
    import tempfile

    import bcrypt

    from agent.export.webconfig import load_web_config
    from tests.pki import make_pki

    out: dict = {"command": " ".join(sys.argv), "bcrypt_cost": 10}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        pki = make_pki(d / "pki")
        h = bcrypt.hashpw(b"bench-pw", bcrypt.gensalt(10)).decode()
        (d / "web.yml").write_text(f"tls_server_config:\n  cert_file: {pki.server_crt}\n"
                                   f"  key_file: {pki.server_key}\nbasic_auth_users:\n"
                                   f"  prom: '{h}'\n")
        hdr = {"Authorization": "Basic " + base64.b64encode(b"prom:bench-pw").decode()}
        for name, cfg in (("plain", None), ("tls_auth", load_web_config(str(d / "web.yml")))):
            with Exporter(m, "127.0.0.1:0", web_config=cfg) as ex:
                def conn(ex=ex, cfg=cfg) -> http.client.HTTPConnection:
                    if cfg is None:
                        return http.client.HTTPConnection("127.0.0.1", ex.port, timeout=10)
                    return http.client.HTTPSConnection("127.0.0.1", ex.port, timeout=10,
                                                       context=pki.client_context())

                def one(c: http.client.HTTPConnection, name: str = name) -> float:
                    t0 = time.perf_counter_ns()
                    c.request("GET", "/metrics", headers=hdr)
                    r = c.getresponse()
                    r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{name}: status {r.status}")
                    return time.perf_counter_ns() - t0

                c = conn()
                first = one(c)
                keep = np.array([one(c) for _ in range(n)])
                c.close()
                fresh = []
                for _ in range(200):
                    c = conn()
                    fresh.append(one(c))
                    c.close()
                fresh_a = np.array(fresh)
                out[name] = {"first_ms": first / 1e6, "keepalive_n": n,
                             "keepalive_p50_ms": pct(keep, 50) / 1e6,
                             "keepalive_p99_ms": pct(keep, 99) / 1e6,
                             "new_conn_p50_ms": pct(fresh_a, 50) / 1e6,
                             "new_conn_p99_ms": pct(fresh_a, 99) / 1e6,
                             "bcrypt_checks": cfg.auth.checks if cfg else 0}
    return out


# ---- basic-auth flood from rotating loopback addresses (own process) -------------------------

# The flood client, standard library only, so that a test can run it as an unprivileged
# user with the system Python: `python3 -c FLOOD_CLIENT PORT USER N_ADDRS SECONDS THREADS
# [ALSO]`. Distinct wrong passwords, each on a new connection from the next of N_ADDRS
# rotating loopback addresses (127.0.x.y, y in 2..251: 1,000 of them cover the scraper's own
# /24, 127.0.0.0/24, and its neighbours, never 127.0.0.1 itself; ALSO, comma-separated,
# take the first places), half for USER (one that exists), half for users that do not.
# Bounded: it stops at SECONDS or when its stdin closes (its parent stopped it, or died),
# then prints {status: count} as JSON.
FLOOD_CLIENT = r'''
import base64, collections, json, os, socket, sys, threading, time
port, user, n_addrs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
deadline = time.monotonic() + float(sys.argv[4])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
lock, counts, seq = threading.Lock(), collections.Counter(), iter(range(10**9))
also = [a for a in (sys.argv[6] if len(sys.argv) > 6 else "").split(",") if a]
sources = also + [f"127.0.{(i // 250) % 256}.{2 + i % 250}" for i in range(n_addrs)]
sources = sources[:n_addrs]

def one(src, who, pw):
    cred = base64.b64encode(f"{who}:{pw}".encode()).decode()
    s = socket.socket()
    try:
        s.settimeout(5.0)
        s.bind((src, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {cred}\r\n"
                  "Connection: close\r\n\r\n".encode())
        resp = b""
        while len(resp) < 4096:  # the whole answer (it is small), as a client reads it
            b = s.recv(4096)
            if not b:
                break
            resp += b
        return resp[9:12].decode("ascii", "replace") if resp.startswith(b"HTTP/") else "eof"
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()

def run():
    while time.monotonic() < deadline and not stop.is_set():
        with lock:
            n = next(seq)
        st = one(sources[n % n_addrs], user if n % 2 else f"nobody{n % 5}",
                 f"guess-{os.getpid()}-{n}")
        with lock:
            counts[st] += 1

ts = [threading.Thread(target=run, daemon=True) for _ in range(int(sys.argv[5]))]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(json.dumps(dict(counts)))
'''


def start_auth_flood(port: int, user: str, n_addrs: int, seconds: float, threads: int, *,
                     python: str = sys.executable, as_user: tuple[int, int] | None = None,
                     also: tuple[str, ...] = ()) -> subprocess.Popen:
    """The flood client (:data:`FLOOD_CLIENT`) in its own process, as ``as_user`` (uid,
    gid) when given (root only), ``also`` among its addresses; stop it with
    :func:`stop_auth_flood`."""
    ids: dict = {} if as_user is None else {"user": as_user[0], "group": as_user[1],
                                            "extra_groups": []}
    return subprocess.Popen([python, "-c", FLOOD_CLIENT, str(port), user, str(n_addrs),
                             str(seconds), str(threads), ",".join(also)],
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd="/", env={"PATH": "/usr/bin:/bin"}, **ids)


def stop_auth_flood(p: subprocess.Popen, timeout_s: float = 30.0) -> dict[str, int]:
    """Stop the flood (its stdin closes) and return its {status: count}."""
    try:
        out, err = p.communicate(input="", timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"client failed": p.returncode,
                "stderr": err.strip()[-300:]}  # type: ignore[dict-item]


def fresh_scrapes(port: int, creds: list[tuple[str, str]], *, interval_s: float = 0.2,
                  timeout_s: float = 10.0) -> list[tuple[int | str, float]]:
    """One scrape per credential, each never seen by the exporter before (a fresh scraper),
    on a new connection from 127.0.0.1: [(status or the error, seconds)]."""
    import base64

    from bench.slowloris import good_scrapes
    out: list[tuple[int | str, float]] = []
    for user, pw in creds:
        hdr = {"Authorization": "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()}
        out += good_scrapes("127.0.0.1", port, n=1, interval_s=interval_s,
                            timeout_s=timeout_s, headers=hdr)
    return out


def auth_flood_bench(a: argparse.Namespace, m: WatchMetrics) -> dict:
    """A fresh scraper (a credential the exporter never verified: the first scrape after a
    restart) under a flood of distinct wrong passwords from --auth-flood rotating loopback
    addresses, bcrypt cost 10: the share of its scrapes served (200) within 1 s, and their
    latency. The flood runs in its own process (:data:`FLOOD_CLIENT`), the scrapes in this
    one."""
    import bcrypt

    from agent.export.webconfig import BasicAuth, WebConfig

    n = a.auth_flood_tries
    users = {f"scraper{i}": bcrypt.hashpw(f"pw{i}".encode(), bcrypt.gensalt(10))
             for i in range(n)}
    cfg = WebConfig(path="(bench)", users=users, auth=BasicAuth(users))
    out: dict = {"command": " ".join(sys.argv), "bcrypt_cost": 10, "addresses": a.auth_flood}
    with Exporter(m, "127.0.0.1:0", web_config=cfg) as ex:
        fl = start_auth_flood(ex.port, "scraper0", a.auth_flood, n * 2.0 + 60.0, 16)
        try:
            warm = time.monotonic() + 30.0  # every address has guessed once
            while len(cfg.auth._peers) < a.auth_flood and time.monotonic() < warm:
                time.sleep(0.1)
            out["warmup_s"] = round(30.0 - (warm - time.monotonic()), 1)
            res = fresh_scrapes(ex.port, [(u, f"pw{i}") for i, u in enumerate(users)])
        finally:
            out["flood"] = stop_auth_flood(fl)
        out["server"] = ex.stats
        out["bcrypt_checks"], out["gated"] = cfg.auth.checks, cfg.auth.gated
    lat = np.array([t for st, t in res if st == 200]) * 1e3
    out["served"] = sum(st == 200 for st, _ in res)
    out["served_within_1s"] = sum(st == 200 and t <= 1.0 for st, t in res)
    out.update(n=len(res), fail_samples=[st for st, _ in res if st != 200][:5],
               p50_ms=pct(lat, 50), p99_ms=pct(lat, 99),
               max_ms=float(lat.max()) if len(lat) else None)
    return out


# ---- the watch-side stream (this process) --------------------------------------------------

class Stream(threading.Thread):
    """Calls observe() at 1 kHz, recording each call's cost and when it happened."""

    def __init__(self, m: WatchMetrics, seconds: float) -> None:
        super().__init__(daemon=True)
        self.m = m
        n = int(seconds * 1000) + 1000
        self.at = np.zeros(n, dtype=np.int64)
        self.cost = np.zeros(n, dtype=np.int64)
        self.n = 0
        self.stop = threading.Event()

    def run(self) -> None:
        rng = np.random.default_rng(3)
        vals = (rng.lognormal(np.log(450e3), 0.3, size=4096)).astype(np.int64).tolist()
        m, at, cost = self.m, self.at, self.cost
        period = 1_000_000
        t_next = time.monotonic_ns()
        i = 0
        while not self.stop.is_set() and i < len(at):
            now = time.monotonic_ns()
            if now < t_next:
                time.sleep((t_next - now) / 1e9)
            t0 = time.perf_counter_ns()
            m.observe(vals[i & 4095])
            cost[i] = time.perf_counter_ns() - t0
            at[i] = time.monotonic_ns()
            i += 1
            t_next += period
        self.n = i


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scrapers", type=int, default=50)
    ap.add_argument("--interval", type=float, default=1.0,
                    help="seconds between one scraper's scrapes; 0 = flat out (default 1)")
    ap.add_argument("--load-s", type=float, default=30.0)
    ap.add_argument("--single-s", type=float, default=10.0)
    ap.add_argument("--off-s", type=float, default=15.0)
    ap.add_argument("--work", type=int, default=4000, help="probe work unit (loop iterations)")
    ap.add_argument("--housekeeping-cpu", type=int, default=0)
    ap.add_argument("--probe-cpu", type=int, default=1)
    ap.add_argument("--ab-pairs", type=int, default=0,
                    help="after the phases, this many pairs of --ab-block-s blocks with the "
                         "scrapers on and off (order per pair by a coin flip): the probe P99 "
                         "ratio on/off with a paired block bootstrap 95 %% interval")
    ap.add_argument("--ab-block-s", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--slowloris", type=int, default=0, metavar="N",
                    help="instead of the phases: good scrapes without, then under N hostile "
                         "sockets (bench/slowloris.py)")
    ap.add_argument("--slowloris-s", type=float, default=20.0)
    ap.add_argument("--slowloris-interval", type=float, default=0.1)
    ap.add_argument("--tls-auth", action="store_true",
                    help="instead of the phases: scrape cost plain vs TLS + basic auth")
    ap.add_argument("--auth-flood", type=int, default=0, metavar="N",
                    help="instead of the phases: fresh scrapers (credentials never verified "
                         "yet, bcrypt cost 10) under a flood of wrong passwords from N "
                         "rotating loopback addresses: served within 1 s, latency")
    ap.add_argument("--auth-flood-tries", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    pin(a.housekeeping_cpu)

    m = WatchMetrics(thresholds_ns=(500_000, 1_000_000, 5_000_000), variant="bench", p99_budget_us=2000)
    m.probe_up(True)
    m.set_audit([Finding(f"check.c{i}", "x", "t", Status.OK if i % 5 else Status.WARN)
                 for i in range(40)])
    for c in ("cpu", "sched", "irq", "memory", "numa", "pcie", "gpu"):
        m.set_collector(c, True, 0.0004)
    for cpu in range(2):
        m.set_gauge("cpu_frequency_hertz", 2.0e9, cpu=cpu)
    if a.tls_auth:
        res = tls_auth_bench(m)
        if a.json:
            print(json.dumps(res, indent=2))
        else:
            for k in ("plain", "tls_auth"):
                v = res[k]
                print(f"{k:8s} first {v['first_ms']:.1f} ms; keep-alive P50 "
                      f"{v['keepalive_p50_ms']:.2f} / P99 {v['keepalive_p99_ms']:.2f} ms; new "
                      f"connection P50 {v['new_conn_p50_ms']:.2f} / P99 "
                      f"{v['new_conn_p99_ms']:.2f} ms; bcrypt checks {v['bcrypt_checks']}")
        return 0
    if a.auth_flood:
        res = auth_flood_bench(a, m)
        if a.json:
            print(json.dumps(res, indent=2))
        else:
            print(f"fresh scraper under a flood from {a.auth_flood} addresses: served within "
                  f"1 s {res['served_within_1s']}/{res['n']} (served {res['served']}); P50 "
                  f"{res['p50_ms']:.0f} / P99 {res['p99_ms']:.0f} / max "
                  f"{res['max_ms'] or float('nan'):.0f} ms;"
                  f" flood {res['flood']}; bcrypt checks {res['bcrypt_checks']}")
        return 0
    if a.slowloris:
        res = slowloris_bench(a, m, ctx)
        if a.json:
            print(json.dumps(res, indent=2))
        else:
            for k in ("quiet", "attack"):
                v = res[k]
                print(f"{k:6s} good scrapes (new connection each, every "
                      f"{a.slowloris_interval:g} s): n={v['n']} failed {v['failed']} "
                      f"{v['fail_samples'] or ''} P50 {v['p50_ms']:.2f} ms  P99 "
                      f"{v['p99_ms']:.2f} ms  max {v['max_ms'] or float('nan'):.2f} ms")
            print(f"attacker ({a.slowloris} sockets): {res['attacker']}")
            print(f"server: {res['server']}")
        return 0 if res["attack"]["failed"] == 0 and res["quiet"]["failed"] == 0 else 1

    total = 2 * a.off_s + a.single_s + a.load_s + 2.0 + \
        (2 * a.ab_pairs * a.ab_block_s + 3.0 if a.ab_pairs else 0.0)
    with Exporter(m, "127.0.0.1:0") as ex:
        stream = Stream(m, total + 120)  # stopped explicitly at the end
        q: mp.Queue = ctx.Queue()
        t_begin = time.monotonic()
        probe_stop = ctx.Event()  # the phases' process start-ups add seconds to `total`
        probe = ctx.Process(target=probe_proc, args=(a.probe_cpu, a.work,
                                                     time.monotonic() + total + 120, q,
                                                     probe_stop))
        probe.start()
        stream.start()
        time.sleep(1.0)  # probe process start-up
        marks = {"off1": time.monotonic_ns()}
        time.sleep(a.off_s)
        marks["single"] = time.monotonic_ns()
        sq: mp.Queue = ctx.Queue()
        sp = ctx.Process(target=scraper_proc,
                         args=(a.housekeeping_cpu, ex.port, 1, 0.0, a.single_s, sq))
        sp.start()
        single_lat, single_err = sq.get()
        sp.join()
        marks["load"] = time.monotonic_ns()
        lq: mp.Queue = ctx.Queue()
        lp = ctx.Process(target=scraper_proc, args=(a.housekeeping_cpu, ex.port, a.scrapers,
                                                    a.interval, a.load_s, lq))
        lp.start()
        load_lat, load_err = lq.get()
        lp.join()
        marks["off2"] = time.monotonic_ns()
        time.sleep(a.off_s)
        marks["end"] = time.monotonic_ns()
        ab_blocks: list[tuple[str, int, int]] = []
        ab_err: list[str] = []
        if a.ab_pairs:
            gate = ctx.Event()
            aq: mp.Queue = ctx.Queue()
            ap_ = ctx.Process(target=scraper_proc, args=(
                a.housekeeping_cpu, ex.port, a.scrapers, a.interval,
                2 * a.ab_pairs * a.ab_block_s + 1.0, aq, gate))
            ap_.start()
            time.sleep(0.5)  # connections up, gate closed
            rng = np.random.default_rng(a.seed)
            for _ in range(a.ab_pairs):
                for mode in (("on", "off") if rng.random() < 0.5 else ("off", "on")):
                    (gate.set if mode == "on" else gate.clear)()
                    t0 = time.monotonic_ns()
                    time.sleep(a.ab_block_s)
                    ab_blocks.append((mode, t0, time.monotonic_ns()))
            gate.set()  # let the scrapers run out their duration
            _ab_lat, ab_err = aq.get()
            ap_.join()
        probe_stop.set()
        phases, plat = q.get()
        probe.join()
        stream.stop.set()
        stream.join()
        server_stats = ex.stats
    del t_begin

    def sel(at: np.ndarray, v: np.ndarray, p0: str, p1: str) -> np.ndarray:
        return v[(at >= marks[p0]) & (at < marks[p1])]

    n = stream.n
    s_at, s_cost = stream.at[:n], stream.cost[:n]
    off_probe = np.concatenate([sel(phases, plat, "off1", "single"),
                                sel(phases, plat, "off2", "end")])
    off_cost = np.concatenate([sel(s_at, s_cost, "off1", "single"),
                               sel(s_at, s_cost, "off2", "end")])
    res = {
        "command": " ".join(sys.argv),
        "scrape_single": {"n": int(len(single_lat)), "errors": len(single_err),
                          "p50_ms": pct(single_lat, 50) / 1e6, "p99_ms": pct(single_lat, 99) / 1e6,
                          "max_ms": float(single_lat.max()) / 1e6 if len(single_lat) else None},
        "scrape_load": {"scrapers": a.scrapers, "interval_s": a.interval, "seconds": a.load_s,
                        "n": int(len(load_lat)), "errors": len(load_err),
                        "error_samples": load_err[:5], "server": server_stats,
                        "p50_ms": pct(load_lat, 50) / 1e6, "p99_ms": pct(load_lat, 99) / 1e6},
        "probe_us": {}, "observe_ns": {},
    }
    for name, arr in (("off1", sel(phases, plat, "off1", "single")),
                      ("single", sel(phases, plat, "single", "load")),
                      ("load", sel(phases, plat, "load", "off2")),
                      ("off2", sel(phases, plat, "off2", "end")), ("off_pooled", off_probe)):
        res["probe_us"][name] = {"n": int(len(arr)), "p50": pct(arr, 50) / 1e3,
                                 "p99": pct(arr, 99) / 1e3}
    for name, arr in (("off1", sel(s_at, s_cost, "off1", "single")),
                      ("single", sel(s_at, s_cost, "single", "load")),
                      ("load", sel(s_at, s_cost, "load", "off2")),
                      ("off2", sel(s_at, s_cost, "off2", "end")), ("off_pooled", off_cost)):
        res["observe_ns"][name] = {"n": int(len(arr)), "p50": pct(arr, 50), "p99": pct(arr, 99)}
    po, pl = res["probe_us"]["off_pooled"], res["probe_us"]["load"]
    oo, ol = res["observe_ns"]["off_pooled"], res["observe_ns"]["load"]
    res["ratios_load_vs_off"] = {
        "probe_p50": pl["p50"] / po["p50"], "probe_p99": pl["p99"] / po["p99"],
        "observe_p50": ol["p50"] / oo["p50"], "observe_p99": ol["p99"] / oo["p99"],
        "off2_vs_off1_probe_p99": res["probe_us"]["off2"]["p99"] / res["probe_us"]["off1"]["p99"],
    }
    if ab_blocks:
        from bench.abstats import paired_bootstrap
        skip = 100_000_000  # the first 0.1 s after a switch: scrapes still in flight
        blocks = {"on": [], "off": []}
        for mode, t0, t1 in ab_blocks:
            blocks[mode].append(plat[(phases >= t0 + skip) & (phases < t1)])
        keep = [i for i in range(len(blocks["on"])) if len(blocks["on"][i]) and
                len(blocks["off"][i])]  # a pair with an empty block (a stalled probe): out
        ab = paired_bootstrap([blocks["on"][i] for i in keep], [blocks["off"][i] for i in keep],
                              n_boot=4000, seed=a.seed)
        res["ab"] = {"pairs": a.ab_pairs, "pairs_used": len(keep), "block_s": a.ab_block_s,
                     "errors": len(ab_err),
                     "p50": ab["p50"], "p99": ab["p99"], "n_on": ab["n_a"], "n_off": ab["n_b"]}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        ss, sl = res["scrape_single"], res["scrape_load"]
        print(f"scrape, 1 scraper, observe at 1 kHz: n={ss['n']} P50 {ss['p50_ms']:.2f} ms  "
              f"P99 {ss['p99_ms']:.2f} ms  max {ss['max_ms']:.2f} ms  errors {ss['errors']}")
        print(f"scrape, {a.scrapers} scrapers x {a.load_s:g} s (interval {a.interval:g} s): "
              f"n={sl['n']} P50 {sl['p50_ms']:.2f} ms  P99 {sl['p99_ms']:.2f} ms  "
              f"errors {sl['errors']}  server {sl['server']}")
        for ph, v in res["probe_us"].items():
            o = res["observe_ns"][ph]
            print(f"  {ph:10s} probe P50 {v['p50']:8.1f} us  P99 {v['p99']:8.1f} us  (n={v['n']})"
                  f" | observe() P50 {o['p50']:6.0f} ns  P99 {o['p99']:6.0f} ns")
        r = res["ratios_load_vs_off"]
        print(f"load / off: probe P50 x{r['probe_p50']:.3f}  P99 x{r['probe_p99']:.3f}  "
              f"observe P50 x{r['observe_p50']:.2f}  P99 x{r['observe_p99']:.2f}  "
              f"(drift off2/off1 probe P99 x{r['off2_vs_off1_probe_p99']:.3f})")
        if "ab" in res:
            ab = res["ab"]
            for k in ("p50", "p99"):
                v = ab[k]
                print(f"A/B {ab['pairs']} pairs x {ab['block_s']:g} s, {a.scrapers} scrapers on vs "
                      f"off: probe {k.upper()} {v['a'] / 1e3:.1f} / {v['b'] / 1e3:.1f} us = "
                      f"x{v['ratio']:.3f}, 95 % CI [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}] → "
                      f"{v['verdict']}")
    errors = res["scrape_load"]["errors"] + res["scrape_single"]["errors"] + \
        res.get("ab", {}).get("errors", 0)
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""What reading kernel events around a spike costs: the instance's ``trace`` text against
``trace_pipe_raw`` pages, and decoding with this project's parser against libtraceevent.

    sudo .venv/bin/python bench/events_read_cost.py [--cpu 1] [--buffer-kb 8192] [--json]
    sudo .venv/bin/python bench/events_read_cost.py --skip-ring --windows 300 --fill-s 10

1. Fills a private instance's ring on ``--cpu`` with a pipe ping-pong storm until it wraps,
   stops that instance's tracing (so each reader sees the same events), then times:
   ``cat``-like reads of the instance's ``trace`` (it formats the whole buffer on every read,
   non-consuming) and of ``per_cpu/cpuN/trace`` (that CPU only); scanning that text for a
   5 ms window with agent.trace.text.parse_text; and draining every page of
   ``per_cpu/cpuN/trace_pipe_raw`` (consuming) then decoding a 5 ms window from them.
2. ``--windows N``: N spike-sized windows read back from a private instance on ``--cpu``
   after ``--fill-s`` seconds of a bursty SCHED_FIFO hog there (bench/faults/kit.py
   preempting_hog; ``--load flood``: the softirq flood of bench/faults/kit.py softirq_flood,
   RPS-steered NET_RX bursts, ~25,000 events/s on the development VM), each as watch asks
   for it (``window(start, end + 1 ms, margin 2 ms)``, start random over the kept pages, end
   0.5-8 ms later; ``--burst K``: K consecutive windows 1-3 ms apart from each start, as a
   burst of spikes reads them): the CPU of each read (``Window.cpu_ns``, median / P90 /
   mean) against its wall time, the events per window, and the read's work
   (``Window.walked`` pages walked, ``Window.decoded`` records decoded) beside the pages
   kept: the work follows the window, not the pages kept.
3. Decodes the captured pages of tests/fixtures/events with agent.trace.pages
   (every field, derived fields included) and, where ``libtraceevent.so.1`` is installed
   (Debian: libtraceevent1), with libtraceevent's kbuffer + tep_read_number_field through
   ctypes (no Python binding of it is packaged in Debian or PyPI), per event.

Needs root and tracefs (mounted on a temporary directory when /sys/kernel/tracing is not,
and unmounted after). Touches only its own instance.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.trace import EventSource  # noqa: E402
from agent.trace import tracefs as tfs  # noqa: E402
from agent.trace.event import parse_format  # noqa: E402
from agent.trace.pages import iter_page  # noqa: E402
from agent.trace.text import parse_text  # noqa: E402
from collectors.host import Host  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "events"


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _storm(cpu: int, seconds: float) -> None:
    code = (f"import os,time\nos.sched_setaffinity(0,{{{cpu}}})\n"
            "r1,w1=os.pipe();r2,w2=os.pipe()\n"
            "if os.fork()==0:\n os.close(w1)\n while os.read(r1,1): os.write(w2,b'x')\n"
            " os._exit(0)\n"
            f"end=time.monotonic()+{seconds}\n"
            "while time.monotonic()<end: os.write(w1,b'x');os.read(r2,1)\n"
            "os.close(w1)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def ring_costs(host: Host, cpu: int, buffer_kb: int) -> dict:
    # a rate hint that sizes the ring to buffer_kb for one second (the drain and the kept
    # pages are bounded by the ring's size)
    src = EventSource.open(host, [cpu], buffer_s=1,
                           rate_hint=buffer_kb * 1024 / tfs.ASSUMED_EVENT_BYTES)
    if not src:
        return {"error": src.reason}
    out: dict = {}
    try:
        p = src.path
        _storm(cpu, 3.0)
        (p / "tracing_on").write_text("0")
        st = src.cpu_stats(cpu)
        out["buffer_kb"] = buffer_kb
        out["entries"] = st.entries
        out["bytes"] = st.bytes
        span_ns = (st.now_ns or 0) - (st.oldest_ns or 0)
        text_times = []
        for name, path in (("trace", p / "trace"), ("per_cpu_trace",
                                                    p / "per_cpu" / f"cpu{cpu}" / "trace")):
            best = None
            for _ in range(3):
                c0, t0 = _cpu_s(), time.perf_counter()
                with open(path, "rb") as fh:
                    n = 0
                    while chunk := fh.read(1 << 20):
                        n += len(chunk)
                wall, cpu_s = time.perf_counter() - t0, _cpu_s() - c0
                best = min(best or (wall, cpu_s, n), (wall, cpu_s, n))
            out[f"{name}_read_ms"] = round(best[0] * 1e3, 1)
            out[f"{name}_cpu_ms"] = round(best[1] * 1e3, 1)
            out[f"{name}_bytes"] = best[2]
            text_times.append(best[0])
        # a 5 ms window in the middle, found by scanning the text (what a text reader must do)
        text = (p / "per_cpu" / f"cpu{cpu}" / "trace").read_text().splitlines()
        first = parse_text(text[:200])
        mid = (first[0].ts_ns + span_ns // 2) if first else 0
        c0 = _cpu_s()
        win_text = parse_text(text, t_from=mid, t_to=mid + 5_000_000)
        out["text_scan_window_cpu_ms"] = round((_cpu_s() - c0) * 1e3, 1)
        out["text_window_events"] = len(win_text)
        # raw: drain every page, then decode the same window
        c0, t0 = _cpu_s(), time.perf_counter()
        pages = src.drain()
        out["raw_drain_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        out["raw_drain_cpu_ms"] = round((_cpu_s() - c0) * 1e3, 2)
        out["raw_pages"] = pages
        c0 = _cpu_s()
        win = src._window_raw(mid, mid, mid + 5_000_000)
        out["raw_window_decode_cpu_ms"] = round((_cpu_s() - c0) * 1e3, 2)
        out["raw_window_events"] = len(win.events)  # includes the last switch before it
        # the same events through both readers (text timestamps are rounded to the µs)
        # (inside the window by more than the text's 0.5 µs rounding)
        inner = (mid + 1000, mid + 5_000_000 - 1000)
        out["same_events"] = sorted((e.name, e.pid) for e in win.events[1:]
                                    if inner[0] <= e.ts_ns <= inner[1]) == sorted(
            (e.name, e.pid) for e in win_text if inner[0] <= e.ts_ns <= inner[1])
        out["span_s"] = round(span_ns / 1e9, 3)
        out["kept_bytes"] = sum(r.kept_bytes for r in src._rings.values())
    finally:
        src.close()
    return out


def window_costs(host: Host, cpu: int, fill_s: float, n: int, seed: int,
                 load: str = "hog", burst: int = 1) -> dict:
    import random
    import statistics

    from bench.faults import kit
    src = EventSource.open(host, [cpu], buffer_s=10.0)
    if not src:
        return {"error": src.reason}
    try:
        if load == "flood":
            hk = min(c for c in os.sched_getaffinity(0) if c != cpu)
            filler = kit.softirq_flood(cpu, hk)
        else:
            filler = kit.preempting_hog(cpu)[0]
        with filler:
            time.sleep(fill_s)
            src.drain()
        ring = src._rings[cpu]
        if len(ring.pages) < 4:
            return {"error": f"only {len(ring.pages)} pages after {fill_s:g} s"}
        t0, t1 = ring.pages[0].ts_ns, ring.pages[-1].ts_ns
        rng = random.Random(seed)
        cpu_us, wall_us, nev, walked, decoded = [], [], [], [], []
        for _ in range(max(1, n // burst)):
            a = rng.randrange(t0 + 10_000_000, t1)
            for _k in range(burst):
                win = src.window(a, a + rng.randrange(500_000, 8_000_000) + 1_000_000,
                                 margin_ns=2_000_000)
                a += rng.randrange(1_000_000, 3_000_000)
                cpu_us.append(win.cpu_ns / 1e3)
                wall_us.append(win.read_ns / 1e3)
                nev.append(len(win.events))
                walked.append(win.walked)
                decoded.append(win.decoded)
        q = lambda v, p: round(sorted(v)[min(len(v) - 1, int(p * len(v)))], 1)  # noqa: E731
        return {"windows": len(cpu_us), "load": load, "burst": burst,
                "pages_kept": len(ring.pages), "fill_s": fill_s,
                "events_per_s": round(src.rate().get(cpu, 0)),
                "read_cpu_us": {"median": q(cpu_us, 0.5), "p90": q(cpu_us, 0.9),
                                "mean": round(statistics.fmean(cpu_us), 1)},
                "read_wall_us": {"median": q(wall_us, 0.5), "p90": q(wall_us, 0.9),
                                 "mean": round(statistics.fmean(wall_us), 1)},
                "events_per_window": {"median": q(nev, 0.5), "max": max(nev)},
                "pages_walked_per_window": {"median": q(walked, 0.5), "max": max(walked)},
                "records_decoded_per_window": {"median": q(decoded, 0.5),
                                               "mean": round(statistics.fmean(decoded), 1)}}
    finally:
        src.close()


# --- decoding: ours vs libtraceevent ---------------------------------------------------------

def _fixture():
    fmts = {}
    texts = {}
    for f in sorted((FIXTURE / "formats").glob("*/*/format")):
        fmt = parse_format(f.read_text(), f.parent.parent.name)
        fmts[fmt.id] = fmt
        texts[fmt.id] = (f.read_bytes(), f.parent.parent.name)
    data = (FIXTURE / "pages.bin").read_bytes()
    pages = [data[i:i + 4096] for i in range(0, len(data), 4096)]
    return fmts, texts, pages


def decode_ours(rounds: int = 30) -> dict:
    """µs per event decoding the fixture's pages: each round with fresh formats
    (``us_per_event``: the record memo starts empty, as for pages never seen, the figure to
    set against libtraceevent's) and again with the memo warm (``us_per_event_repeat``:
    every record decoded before, as under a flood of identical records)."""
    import dataclasses
    fmts, _, pages = _fixture()
    n = sum(1 for pg in pages for _ in iter_page(pg, 1, fmts))
    fresh = [{i: dataclasses.replace(f, _maker=None, _fast=None, _plan=None, _memo={})
              for i, f in fmts.items()} for _ in range(rounds)]
    t0 = time.perf_counter()
    for fm in fresh:
        for pg in pages:
            for _ev in iter_page(pg, 1, fm):
                pass
    cold = (time.perf_counter() - t0) / rounds / n
    t0 = time.perf_counter()
    for _ in range(rounds):
        for pg in pages:
            for _ev in iter_page(pg, 1, fmts):
                pass
    warm = (time.perf_counter() - t0) / rounds / n
    return {"events": n, "us_per_event": round(cold * 1e6, 2),
            "us_per_event_repeat": round(warm * 1e6, 2)}


def decode_libtraceevent(rounds: int = 30) -> dict:
    name = ctypes.util.find_library("traceevent")
    if not name:
        return {"error": "libtraceevent not installed (Debian: libtraceevent1)"}
    lib = ctypes.CDLL(name)
    vp, ull = ctypes.c_void_p, ctypes.c_ulonglong
    lib.kbuffer_alloc.restype = vp
    lib.kbuffer_alloc.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.kbuffer_load_subbuffer.argtypes = [vp, vp]
    lib.kbuffer_read_event.restype = vp
    lib.kbuffer_read_event.argtypes = [vp, ctypes.POINTER(ull)]
    lib.kbuffer_next_event.restype = vp
    lib.kbuffer_next_event.argtypes = [vp, ctypes.POINTER(ull)]
    lib.tep_alloc.restype = vp
    lib.tep_parse_event.argtypes = [vp, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    lib.tep_find_event.restype = vp
    lib.tep_find_event.argtypes = [vp, ctypes.c_int]
    lib.tep_find_field.restype = vp
    lib.tep_find_field.argtypes = [vp, ctypes.c_char_p]
    lib.tep_read_number_field.argtypes = [vp, vp, ctypes.POINTER(ull)]
    fmts, texts, pages = _fixture()
    tep = lib.tep_alloc()
    plan = {}
    for ev_id, (text, system) in texts.items():
        lib.tep_parse_event(tep, text, len(text), system.encode())
        ev = lib.tep_find_event(tep, ev_id)
        fields = []
        for f in fmts[ev_id].fields:
            fp = lib.tep_find_field(ev, f.name.encode())
            fields.append((f.name, fp, f.kind != 0, f.offset))
        plan[ev_id] = fields
    kbuf = lib.kbuffer_alloc(1, 1)  # KBUFFER_LSIZE_8, KBUFFER_ENDIAN_LITTLE
    ts = ull()
    val = ull()
    read_number = lib.tep_read_number_field
    string_at = ctypes.string_at
    bufs = [ctypes.create_string_buffer(pg, len(pg)) for pg in pages]

    def one_round() -> int:
        n = 0
        for b in bufs:
            lib.kbuffer_load_subbuffer(kbuf, b)
            data = lib.kbuffer_read_event(kbuf, ctypes.byref(ts))
            while data:
                ev_id = ctypes.c_uint16.from_address(data).value
                out = {}
                for fname, fp, is_str, off in plan.get(ev_id, ()):
                    if is_str:
                        out[fname] = string_at(data + off, 16).split(b"\0", 1)[0]
                    else:
                        read_number(fp, data, ctypes.byref(val))
                        out[fname] = val.value
                n += 1
                data = lib.kbuffer_next_event(kbuf, ctypes.byref(ts))
        return n

    n = one_round()
    t0 = time.perf_counter()
    for _ in range(rounds):
        one_round()
    per = (time.perf_counter() - t0) / rounds / max(1, n)
    return {"library": name, "events": n, "us_per_event": round(per * 1e6, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", type=int, default=1 if (os.cpu_count() or 1) > 1 else 0)
    ap.add_argument("--buffer-kb", type=int, default=8192)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--windows", type=int, default=0,
                    help="also read this many spike-sized windows back (0: not)")
    ap.add_argument("--fill-s", type=float, default=10.0,
                    help="seconds of events before the windows are read (10)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--load", choices=("hog", "flood"), default="hog",
                    help="what fills the ring before the windows: a bursty SCHED_FIFO hog "
                         "(hog) or an RPS-steered softirq flood (flood; needs RPS)")
    ap.add_argument("--burst", type=int, default=1,
                    help="windows read 1-3 ms apart from each random start (1)")
    ap.add_argument("--skip-ring", action="store_true",
                    help="skip the trace-text vs raw-drain comparison (a 3 s storm)")
    args = ap.parse_args()
    if args.windows < 0 or args.fill_s <= 0 or args.burst < 1:
        ap.error("need --windows >= 0, --fill-s > 0 and --burst >= 1")
    result: dict = {"kernel": os.uname().release}
    result["decode_ours"] = decode_ours()
    result["decode_libtraceevent"] = decode_libtraceevent()
    if os.geteuid() != 0:
        result["ring"] = {"error": "needs root"}
    else:
        host = Host()
        mnt = None
        if tfs.find_tracefs(host) is None:
            mnt = Path(tempfile.mkdtemp())
            (mnt / "kernel" / "tracing").mkdir(parents=True)
            (mnt / "devices").symlink_to("/sys/devices")
            tfs._mount_tracefs(mnt / "kernel" / "tracing")
            host = Host(sysfs=mnt)
        try:
            if not args.skip_ring:
                result["ring"] = ring_costs(host, args.cpu, args.buffer_kb)
            if args.windows:
                result["windows"] = window_costs(host, args.cpu, args.fill_s, args.windows,
                                                 args.seed, args.load, args.burst)
        finally:
            if mnt is not None:
                ctypes.CDLL(None).umount2(os.fsencode(str(mnt / "kernel" / "tracing")), 0)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

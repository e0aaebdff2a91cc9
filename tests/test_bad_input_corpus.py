"""Bad-input corpus (issue #13): hundreds of bad command lines over every command and option.

Every case must end with a non-zero exit status and exactly one non-empty line on stderr (the
``hftagent: error: ...`` line), never a traceback, never "internal error", and within its
timeout (a hang is a failure). Where a case says which option is wrong (``expect``), that
option's name or value must be in the line: a case that fails for another reason (say, a
missing ncu instead of a bad ``--timeout``) proves nothing.

The families are generated: every numeric option gets negatives, zero where it is invalid,
huge values (1e309, 2**64), NaN, inf, a Unicode digit (``٣``), the empty string, whitespace and
garbage; every CPU list gets ``''``, ``-``, ``0-``, ``3-1``, ``0-4294967295``, ``٣``, ``0,,1``,
``all`` and offline CPUs; every path option gets a nonexistent path, a directory where a file
is expected, a FIFO, /dev/zero, /dev/full and a symlink loop.

Safety: commands that write the host run only as ``tune plan``, ``tune apply --dry-run`` or
``rollback``/``status`` with ``--root`` on a temporary copy of a fixture tree and
``--state-dir`` in a temporary directory. Heavy work is fenced off: the probe runner, the gate
scenarios, watch's session loop, ``run``'s exec and the Nsight runner raise
:class:`HeavyWork` here, so a bad value that slips past validation fails its case at once
(as "internal error") instead of starting TensorFlow, a watch loop or a child process.

Cases run in-process through :func:`agent.cli.main` (a SIGALRM timer bounds each one). Cases
that could read without bound (``/dev/zero``, ``/dev/full``), allocate without bound, block
outside the main thread or must really exec run in a subprocess with a timeout and an
address-space limit, several at a time, before the first one is checked.

Cases whose fix belongs to another module are ``xfail(strict=True)`` with the owner in the
reason: once fixed, the strict xfail turns into a failure and the mark comes off.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests import elfcraft

pytestmark = pytest.mark.adversarial

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
TIMEOUT_S = 5.0          # in-process; a healthy case takes 10-300 ms
SUB_TIMEOUT_S = 8.0      # subprocess (a few at a time on a loaded 2-core machine)
SUB_PARALLEL = 6
SUB_MEMORY = 2 << 30     # address-space limit of a subprocess case: an unbounded read dies


class HeavyWork(BaseException):
    """Raised where a command would start its real work; BaseException so that no handler in
    the command turns it into a clean-looking line."""


class Hang(BaseException):
    """The case ran past its timeout."""


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    expect: str | tuple[str, ...] | None = None  # one must be in the stderr line (any case)
    owner: str | None = None    # xfail(strict) reason: whose fix it is and what
    sub: bool = False           # run in a subprocess (unbounded reads/allocations, real exec)


# -- value families ----------------------------------------------------------------------------
HUGE_INT = str(2**64)
# Never an integer: typer must refuse them all.
NOT_INT = ["", " ", "abc", "1.5", "٣", "1e309", "nan", "inf"]
# Never a usable float.
NOT_FLOAT = ["", " ", "abc", "٣"]
NONFINITE = ["nan", "inf", "-inf", "1e309"]
# ("all" is not here: it is in the kernel's list grammar, which every --cpus takes.)
CPU_BAD = ["", " ", "-", "0-", "-1", "3-1", "0-4294967295", "٣", "١", "0,,1", "x", "1:0",
           "0-1:0", "4095", "0-1,4095", ",", "1-٣", "0-١"]
# Path placeholders, filled in by the `world` fixture: {DIR} an empty directory, {FILE} a text
# file that is nothing the agent reads, {FIFO}, {LOOP} a symlink loop, {MISSING} a path under a
# directory that does not exist; and the real /dev/zero and /dev/full.
PATHS_READ = ["{MISSING}", "{DIR}", "{FIFO}", "/dev/zero", "/dev/full", "{LOOP}", ""]
# /dev/zero and /dev/full read as endless zeros, and a parser that expanded a 2**32-CPU range
# would allocate without bound: such cases run where a memory limit and a kill can stop them.
ENDLESS = {"/dev/zero", "/dev/full", "0-4294967295"}

# -- owners of fixes outside the modules this corpus's author fixed ---------------------------
PARSERS = "owned by parsers/cpu lists (collectors/parsers.py)"
TUNE = "owned by tune/journal/profiles (agent/commands/tune.py, tuning/)"
WATCH = "owned by watch (agent/commands/watch.py, agent/watch/)"

CASES: list[Case] = []


def add(*argv: str, expect: str | tuple[str, ...] | None = None, owner: str | None = None,
        sub: bool = False) -> None:
    CASES.append(Case(tuple(argv), expect, owner, sub or any(a in ENDLESS for a in argv)))


def int_family(prefix: list[str], opt: str, extra: list[str], *, suffix: list[str] = (),
               owner: dict[str, str] | None = None) -> None:
    """Garbage for an integer option plus ``extra`` (its own out-of-range values)."""
    for v in NOT_INT + extra:
        add(*prefix, opt, v, *suffix, expect=opt, owner=(owner or {}).get(v))


def float_family(prefix: list[str], opt: str, extra: list[str], *, suffix: list[str] = (),
                 owner: dict[str, str] | None = None) -> None:
    """Garbage, NaN and infinities for a float option plus ``extra`` (out of its range)."""
    for v in NOT_FLOAT + NONFINITE + extra:
        add(*prefix, opt, v, *suffix, expect=opt, owner=(owner or {}).get(v))


def cpu_family(prefix: list[str], opt: str = "--cpus", *, suffix: list[str] = (),
               owner: dict[str, str] | None = None, values: list[str] = CPU_BAD) -> None:
    owner = dict(owner or {})
    for v in values:
        add(*prefix, opt, v, *suffix, expect=opt, owner=owner.get(v))


def path_family(prefix: list[str], opt: str, *, suffix: list[str] = (),
                values: list[str] = PATHS_READ, owner: dict[str, str] | None = None,
                expect: str | None = None) -> None:
    """The line must name the option (or ``expect``) or the path itself."""
    for v in values:
        add(*prefix, opt, v, *suffix, expect=(expect or opt,) + ((v,) if v.strip() else ()),
            owner=(owner or {}).get(v))


# ==============================================================================================
# audit (on fixture trees: a 2-CPU VM capture, and a 16-CPU tree with CPUs 4-7 offline, where
# a Unicode digit would name a real CPU)
# ==============================================================================================
AUD = ["audit", "--root", "{TREE}"]
cpu_family(["audit", "--root", "{OFFTREE}"])
cpu_family(["audit", "--root", "{OFFTREE}"], values=["4", "4-7", "0-5", "15,4", "16"])
int_family(AUD, "--pid", ["0", "-1", "4194305", "999999999", HUGE_INT])
path_family(AUD, "--profile", values=PATHS_READ + ["nope", "hft-cpux", "{FILE}", "{BADTOML}",
                                                   "{BADTOML_EXT}", "{MISSING}.toml"],
            expect="profile")
for v in ["", "bogus", "FAIL", "error"]:
    add(*AUD, "--fail-on", v, expect="--fail-on")
path_family(AUD, "--textfile", values=["{MISSING}", "{FILE}", "{FIFO}", "/dev/full", "{LOOP}",
                                       "/dev/zero"], expect="textfile")
float_family(AUD, "--steal-window", ["-1", "10.5", "1e300", HUGE_INT])
float_family(AUD, "--noise", ["0", "-1", "61"])
add("audit", "--noise", "1", "--root", "{TREE}", expect="--noise")
for opt in ("--root", "--procfs", "--sysfs"):
    # (an existing empty directory is audited as "everything unreadable": exit 1 with the
    # report, by design, so it is not here)
    base = ["audit"] if opt == "--root" else AUD
    path_family(base, opt, values=["{MISSING}", "{FILE}", "{FIFO}", "/dev/null", "{LOOP}", ""],
                expect="root" if opt == "--root" else opt.lstrip("-"))
add("audit", "--bogus-option", expect="--bogus-option")
add("audit", "extra-argument", expect="extra-argument")
add("audit", "--cpus", expect="--cpus")

# ==============================================================================================
# capture (option validation only)
# ==============================================================================================
path_family(["capture"], "--out", values=["{DIR}", "{FILE}", "{FIFO}", "/dev/full",
                                          "/dev/null/x", "{FILE}/sub", "{LOOP}", "{LOOP}/x", ""])
path_family(["capture", "--out", "{NEWOUT}"], "--root",
            values=["{MISSING}", "{FILE}", "{FIFO}", "{LOOP}", "/dev/null"], expect="root")
add("capture", expect="--out")

# ==============================================================================================
# probe (the runner is fenced: every case must fail in options.build or before)
# ==============================================================================================
PR = ["probe", "--no-history"]
int_family(PR, "--samples", ["0", "-1", "-5", "99999999999", HUGE_INT, "5000001"])
float_family(PR, "--duration", ["0", "-1", "-0.0", "1e300", "86401"])
int_family(PR, "--warmup", ["0", "-1", HUGE_INT, "1000001"])
float_family(PR, "--rate", ["0", "-1", "1e300", "1000001"])
float_family(PR, "--threshold-us", ["0", "-1", "1e300", "1e10"])
int_family(PR, "--intra", ["0", "-1", "-5", "4097", HUGE_INT])
int_family(PR, "--inter", ["0", "-2", "-5", "4097", HUGE_INT])
for v in ["", " ", ",", "0", "-1", "1,0", "a", "1,a", "٣", "1,٣", "1.5", "1,,2", "+1", "1_0",
          "1,1099511627776", "65536,65536", HUGE_INT]:
    add(*PR, "--shape", v, expect="--shape")
for v in ["", " ", ",", "0", "-1", "a", "٣", "1,,8", "1,0", "65537", HUGE_INT]:
    add(*PR, "--batch", v, expect="--batch")
for v in ["", " ", "bogus", "graph,bogus", ",", "GRAPH", "all,graph"]:
    add(*PR, "--variant", v, expect="--variant")
for v in ["", "bogus", "LSTM", "lstm,mlp"]:
    add(*PR, "--builtin", v, expect="--builtin")
add(*PR, "--builtin", "mlp", "--model", "{EMPTY_KERAS}", expect="--builtin")
for v in ["", "grid", "Threads"]:
    add(*PR, "--sweep", v, expect="--sweep")
for v in ["other", "", " "]:
    add(*PR, "--signature", v, expect="--signature")
cpu_family(PR)
path_family(PR, "--model", values=PATHS_READ + ["{FILE}", "{FIFO_KERAS}", "{EMPTY_KERAS}",
                                                "{JUNK_TFLITE}"],
            expect="model")
path_family(PR, "--input-data", values=PATHS_READ + ["{FILE}", "bogus", "{NAN_NPY}",
                                                     "{FIFO_NPY}"])
path_family(PR, "--calib", values=PATHS_READ + ["{FILE}", "{NAN_NPY}", "{SCALAR_NPY}",
                                                "{FIFO_NPY}"])
path_family(PR, "--csv", values=["{DIR}", "{FIFO}", "/dev/full", "{MISSING}", "{LOOP}", ""])
path_family(["probe"], "--db", values=["{DIR}", "{FIFO}", "/dev/zero", "{NOTDB}", "{LOOP}",
                                       "/dev/null/x.sqlite", ""], expect="database")
add("probe", "--db", "{NODB}", "--no-history", expect="--no-history")
add("probe", "--sweep", "threads", "--intra", "2", expect="--sweep")
add("probe", "--sweep", "threads", "--inter", "1", expect="--sweep")
add("probe", "--samples", expect="--samples")
for v in ["", "1h", "-1ms", "٣ms", "1e3", "0,,1ms", "61s"]:
    add(*PR, "--idle-gaps", v, expect="--idle-gaps")
add(*PR, "--idle-gaps", "0,1ms", "--rate", "100", expect="--idle-gaps")
add(*PR, "--plot", "/tmp/x.png", expect="--plot")
add(*PR, "--idle-gaps", "0,1ms", "--plot", "{DIR}", expect="--plot")

# ==============================================================================================
# profile (the Nsight runner is fenced)
# ==============================================================================================
PF = ["profile", "--nsight"]
CMD = ["--", "true"]
int_family(PF, "--inferences", ["0", "-1"], suffix=CMD)
float_family(PF, "--wall-us", ["0", "-1", "1e300"], suffix=CMD)
int_family(PF, "--launch-skip", ["-1"], suffix=CMD)
int_family(PF, "--launch-count", ["0", "-1"], suffix=CMD)
int_family(PF, "--top", ["0", "-1", "10001"], suffix=CMD)
float_family(PF, "--timeout", ["0", "-1", "1e300", "86401"], suffix=CMD)
path_family(PF, "--keep-csv", values=["{DIR}", "{FIFO}", "/dev/full", "{MISSING}", "{LOOP}",
                                      ""], suffix=CMD)
path_family(PF, "--ncu", values=["", "{MISSING}", "{DIR}", "{FILE}", "/dev/null"], suffix=CMD)
add("profile", *CMD, expect="--nsight")
add(*PF, expect="command")
add(*PF, "--inferences", "10", expect="command")

# ==============================================================================================
# tune: plan, apply --dry-run (on a copy, journal in a temporary dir), rollback/status on a
# copy with crafted journals, threads (the sweep is fenced)
# ==============================================================================================
TP = ["tune", "plan", "--root", "{TREE}"]
TA = ["tune", "apply", "--dry-run", "--root", "{TREE}", "--state-dir", "{STATE}"]
for pre in (TP, TA):
    cpu_family([("{OFFTREE}" if a == "{TREE}" else a) for a in pre])
    path_family(pre, "--profile", values=["nope", "", "{DIR}", "{FIFO}", "/dev/zero",
                                          "{BADTOML}", "{MISSING}.toml", "{LOOP}"],
                expect="profile")
    for opt in ("--only", "--skip"):
        for v in ["", "bogus", "cpu.bogus", "gpus"]:
            add(*pre, opt, v, expect=opt)
cpu_family(["tune", "plan", "--root", "{OFFTREE}"], values=["4", "4-7", "0-5"])
path_family(["tune", "apply", "--dry-run", "--root", "{TREE}"], "--state-dir",
            values=["{FILE}", "{FIFO}", "/dev/full", "{LOOP}", "/dev/null"])
path_family(["tune", "plan"], "--root", values=["{MISSING}", "{FILE}", "{FIFO}", "{LOOP}",
                                                "/dev/null"], expect="root")
add("tune", "plan", "--root", "{EMPTYTREE}")  # empty files everywhere (#13.7)
add("tune", "bogus", expect="bogus")
TR = ["tune", "rollback", "--root", "{TREE}"]
for sd in ["{FILE}", "{J_GARBAGE}", "{J_NESTED}", "{J_WRONG}", "{J_NUL}", "{J_IRQ}",
           "{J_FIFO}"]:
    add(*TR, "--state-dir", sd, sub=sd == "{J_FIFO}")
    add("tune", "status", "--root", "{TREE}", "--state-dir", sd, sub=sd == "{J_FIFO}")
for v in ["{MISSING}", "{FILE}", "{LOOP}"]:
    add("tune", "status", "--root", v, expect="root")
    add("tune", "rollback", "--root", v, expect="root")
TT = ["tune", "threads"]
path_family(TT, "--from", values=["{MISSING}", "{DIR}", "{FILE}", "{BADJSON}", "{WRONGJSON}",
                                  "{NESTED}", "{LOOP}", "", "{FIFO}", "/dev/zero"])
for v in ["", "bogus"]:
    add(*TT, "--builtin", v, expect="--builtin")
    add(*TT, "--variant", v, expect="--variant")
float_family(TT, "--duration", ["0", "-1"])
cpu_family(TT, values=["", "-", "3-1", "0-4294967295", "0,,1", "4095"])
add(*TT, "--from", "{PROBEJSON}", "--duration", "3", expect="--duration")

# ==============================================================================================
# run (--dry-run in-process, exec fenced; a real exec only in a subprocess)
# ==============================================================================================
RU = ["run", "--dry-run", "--root", "{TREE}"]
cpu_family(["run", "--dry-run", "--root", "{OFFTREE}"], suffix=CMD)
int_family(RU, "--mem-node", ["-1", "99", HUGE_INT], suffix=CMD)
int_family(RU, "--intra", ["0", "-1", "4097"], suffix=CMD)
int_family(RU, "--inter", ["0", "-1", "4097"], suffix=CMD)
int_family(RU, "--gpu", ["-1", "7", HUGE_INT], suffix=CMD)
for v in ["", "fifo", "fifo:", "fifo:0", "fifo:100", "fifo:-1", "fifo:٣", "idle:1", "rr:",
          "fifo:1:2", "FIFO:1", "fifo:" + HUGE_INT]:
    add(*RU, "--sched", v, *CMD, expect="--sched")
for v in ["", "spin", "PAUSE", "pause,busy", "٣"]:
    add(*RU, "--keep-awake", "--keep-awake-loop", v, *CMD, expect="--keep-awake-loop")
add(*RU, "--keep-awake-loop", "busy", *CMD, expect="--keep-awake-loop")
add(*RU, expect="command")
add(*RU, "--", "definitely-not-a-command-xyz", expect="definitely-not-a-command-xyz")
add("run", "--root", "{TREE}", *CMD, expect="--root")
add("run", "--cpus", "0", "--", "/nonexistent/hftagent-corpus-cmd", sub=True,
    expect="/nonexistent/hftagent-corpus-cmd")
add("run", "--cpus", "0", "--", "{FILE}", sub=True, expect="cannot start")

# ==============================================================================================
# history list / show / export / plot
# ==============================================================================================
H = ["history", "--db", "{DB}"]
int_family(H, "--limit", ["0", "-1", "1000001", HUGE_INT])
for v in ["bogus", "", "PROBE", "probe,watch"]:
    add(*H, "--kind", v, expect="--kind")
path_family(["history"], "--db", values=["{DIR}", "{FIFO}", "/dev/zero", "/dev/full",
                                         "{NOTDB}", "{LOOP}", "{NEWERDB}", "{FOREIGNDB}", ""],
            expect="database")
for v in ["1234567890123456789012345678901234567890", HUGE_INT, "9223372036854775808", "٣",
          "abc", "", " ", "1.5", "0", "1e3", "0x1", "+1", " 1", "1_0", "latest1", "LATEST"]:
    add(*H, "show", v, expect="run id")
add(*H, "show", "99", expect="99")
add(*H, "show", "-1", expect="-1")
add("history", "show", expect="run_id")
# an option given before the subcommand is applied or refused, never ignored
add("history", "--db", "{NODB}", "show", "1", expect="{NODB}")
add("history", "--db", "{NODB}", "export", expect="{NODB}")
add("history", "--db", "{NODB}", "plot", "--out", "{TMP}/p.png", expect="{NODB}")
add("history", "--db", "{DB}", "show", "1", "--db", "{NODB}", expect="--db")
add("history", "--limit", "5", "show", "1", expect="--limit")
add("history", "--kind", "probe", "show", "1", expect="--kind")
add("history", "--model", "x", "show", "1", expect="--model")
add("history", "--kind", "bogus", "export", expect="--kind")
add("history", "--json", "plot", "--out", "{TMP}/p.png", expect="--json")
add("history", "--json", "export", expect="--json")
add("history", "--db", "{EMPTYDB}", "show", "latest", expect="no runs")
add("history", "--db", "{NODB}", "show", "latest", expect="{NODB}")
for v in ["", "xml", "CSV"]:
    add(*H, "export", "--format", v, expect="--format")
path_family(H + ["export"], "--out", values=["{DIR}", "{FIFO}", "/dev/full", "{MISSING}",
                                             "{LOOP}", ""])
int_family(H + ["export"], "--limit", ["0", "-1", "1000001"])
for v in ["bogus", ""]:
    add(*H, "export", "--kind", v, expect="--kind")
path_family(H + ["plot"], "--out", values=["", "{TMP}/p", "{TMP}/p.jpg", "{DIR}",
                                           "{MISSING}.png", "/dev/full", "{FIFO}",
                                           "{FIFO_PNG}", "{DIR_PNG}"])
int_family(H + ["plot", "--out", "{TMP}/p.png"], "--limit", ["0", "-1", "1000001"])
for opt in ("--variant", "--model", "--scenario"):
    add(*H, "plot", "--out", "{TMP}/p.png", opt, "bogus", expect=opt)
add(*H, "plot", expect="--out")
add(*H, "bogus", expect="bogus")

# ==============================================================================================
# gate (scenarios are fenced)
# ==============================================================================================
G = ["gate", "--db", "{DB}", "--run", "2"]
for v in ["", " ", "abc", "-5%", "1001%", "nan%", "nan", "inf", "5", "1e309%", "%", "10%%",
          "٣%", "1_0%", "10 %x"]:
    add(*G, "--max-p99-regression", v, expect="--max-p99-regression")
for v in ["", " ", "abc", "1", "-0.1", "nan", "100%", "inf", "٣", "off-ish"]:
    add(*G, "--max-jitter-rate", v, expect="--max-jitter-rate")
for opt in ("--max-p99-us", "--max-cold-start-us", "--jitter-threshold-us"):
    float_family(G, opt, ["0", "-1", "1e300", "1e16"])
int_family(G, "--resamples", ["99", "0", "-1", "1000001", HUGE_INT])
int_family(G, "--seed", ["-1", "-" + HUGE_INT])
for v in ["", "abc", "0", "-1", "٣", "1234567890123456789012345678901234567890",
          "9223372036854775808", "1.0", " 2", "+2", "LATEST"]:
    add("gate", "--db", "{DB}", "--run", v, expect="--run")
add("gate", "--db", "{DB}", "--run", "99", expect="99")
path_family(G, "--baseline", values=["abc", "{MISSING}", "{DIR}", "{FIFO}", "/dev/zero",
                                     "/dev/full", "{FILE}", "{BADJSON}", "{WRONGJSON}",
                                     "{NESTED}", "{LOOP}", "٣", "", "-1",
                                     "1234567890123456789012345678901234567890", "0"])
add(*G, "--baseline", "99", expect="99")
add(*G, "--baseline", "2", expect="2")
path_family(["gate", "--run", "1"], "--db", values=["{DIR}", "{FIFO}", "/dev/zero", "{NOTDB}",
                                                    "{NODB}", "{LOOP}", "{NEWERDB}", ""],
            expect="database")
GP = ["gate", "--db", "{NODB}"]  # probing now: every probe option is checked before anything
for v in ["", ",", "bogus", "concurrent1", "concurrent257", "concurrent٣", "concurrent",
          "cold,bogus", "Warm"]:
    add(*GP, "--scenarios", v, expect="scenario")
add(*GP, "--scenarios", "cold,warm", "--baseline", "1", expect="baseline")
int_family(GP, "--cold-processes", ["0", "-1", "101", HUGE_INT])
for v in ["graph,xla", "all", "bogus", "", ","]:
    add(*GP, "--variant", v, expect="--variant")
for v in ["", "bogus"]:
    add(*GP, "--builtin", v, expect="--builtin")
int_family(GP, "--samples", ["0", "-1", "5000001"])
float_family(GP, "--duration", ["0", "-1"])
int_family(GP, "--warmup", ["0", "-1"])
int_family(GP, "--intra", ["0", "-1"])
int_family(GP, "--inter", ["0", "-5"])
cpu_family(GP, values=["", "-", "3-1", "0-4294967295", "0,,1", "4095"])
path_family(GP, "--model", values=["{MISSING}", "{DIR}", "{FIFO}", "{FILE}", ""],
            expect="model")
# probe options with --run: given, so never ignored
for opt, v in [("--scenarios", "cold"), ("--scenarios", "warm"), ("--samples", "1000"),
               ("--duration", "1"), ("--warmup", "10"), ("--cpus", "0"), ("--intra", "1"),
               ("--inter", "1"), ("--builtin", "mlp"), ("--model", "{FILE}"),
               ("--variant", "xla"), ("--cold-processes", "3")]:
    add(*G, opt, v, expect=opt)
add("gate", "--db", "{EMPTYDB}", "--run", "latest", expect="no")

# ==============================================================================================
# watch (the session loop is fenced)
# ==============================================================================================
W = ["watch", "--probe", "numpy", "--duration", "1"]
for v in ["", "bogus", "TF"]:
    add("watch", "--probe", v, expect="--probe")
for v in ["", " ", "abc", "0", "-1", "nan", "inf", "1e309", "٣", "autox", "1e300"]:
    add(*W, "--rate", v, expect="--rate")
cpu_family(W)
# (0,,1 would overlap the probe's CPU 1 and fail for that: 0,,0 names the housekeeping CPU)
cpu_family(W, "--housekeeping", values=[v if v != "0,,1" else "0,,0" for v in CPU_BAD])
int_family(["watch", "--duration", "1"], "--pid", ["0", "-1", "4194305", HUGE_INT])
path_family(["watch", "--duration", "1"], "--ring",
            values=["{MISSING}", "{DIR}", "{FILE}", "{LOOP}", "/dev/full", "", "{FIFO}",
                    "/dev/zero"])
float_family(W, "--sample-hz", ["0", "-1", "1e9", "1e300"])
for v in ["", "bogus", "Native"]:
    add(*W, "--sampler", v, expect="--sampler")
float_family(W, "--threshold-us", ["0", "-1"])
float_family(W, "--flight-us", ["0", "-1"])
float_family(W, "--k", ["1", "0.5", "0", "-1"])
float_family(["watch", "--probe", "numpy"], "--duration", ["0", "-1"])
int_family(W, "--p99-budget-us", ["0", "-1"])
int_family(W, "--nice", ["-21", "20", "1e3"])
for v in ["", "abc", ":", "127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1:", "host name:80",
          "[::1", "127.0.0.1:٣"]:
    add(*W, "--listen", v, expect="--listen")
path_family(W, "--spike-log", values=["{DIR}", "/dev/full", "{MISSING}", "{FIFO}"])
path_family([*W, "--flight-us", "100"], "--flight-dir", values=["{FILE}", "/dev/full"])
for v in ["nope", "{BADTOML}", "{DIR}"]:
    add(*W, "--listen", "127.0.0.1:0", "--profile", v, expect=("profile", v))
add(*W, "--profile", "nope", expect="--profile")
for v in ["", "bogus"]:
    add("watch", "--probe", "tf", "--duration", "1", "--model", v, expect="--model")
    add("watch", "--probe", "tf", "--duration", "1", "--variant", v, expect="--variant")
path_family(["watch", "--probe", "numpy", "--duration", "1"], "--root",
            values=["{MISSING}", "{FILE}", "{LOOP}"], expect="root")
add("watch", "--probe", "external", expect="--pid")
for v in ("", "most", "DEFAULT", "default\n", "\x1b[31m"):  # --gpu-probes (issue #36)
    add("watch", "--attach", "1", "--gpu-probes", v, "--duration", "1", expect="--gpu-probes")
    add("attach", "1", "--gpu-probes", v, expect="--gpu-probes")
add("watch", "--probe", "numpy", "--gpu-probes", "off", expect="--gpu-probes")
# bounds (issue #30 item 8): a web config nested 10,000 deep (was internal error:
# RecursionError) or over its size; profile strings a megabyte long (a hang in rich's
# highlighter) or with a terminal escape in them
add(*W, "--listen", "127.0.0.1:0", "--web.config.file", "{DEEPWEB}", expect="nested more than")
add(*W, "--listen", "127.0.0.1:0", "--web.config.file", "{BIGWEB}", expect="larger than")
add(*AUD, "--profile", "{LONGNAME}", expect="name is 1,000,000 characters")
add(*AUD, "--profile", "{LONGWHY}", expect="why is 1,000,000 characters")
add(*AUD, "--profile", "{ESCNAME}", expect="control character")
add("tune", "plan", "--root", "{TREE}", "--profile", "{LONGNAME}", expect="name is")

# ==============================================================================================
# cpus (the noise scan is fenced)
# ==============================================================================================
float_family(["cpus"], "--duration", ["0", "-1", "61"])
float_family(["cpus"], "--threshold-us", ["0", "-1", "1000001"])
int_family(["cpus"], "--count", ["0", "-1", "3"])
add("cpus", "--db", "{DIR}/x.sqlite", "--no-history", expect="--db")
cpu_family(["cpus"], "--candidates", values=["", "-", "3-1", "0-4294967295", "٣", "1,,1",
                                              "4095", "0"])
path_family(["cpus"], "--plot", values=["{DIR}", "{FIFO}", "{MISSING}.png", "", "{DIR_PNG}"])
path_family(["cpus"], "--textfile", values=["{FILE}", "{MISSING}", "/dev/full", ""],
            expect="textfile")

# ==============================================================================================
# outputs another user prepared (issue #30 items 2, 4, 8; #28 item 4): a symlink to a root-only
# file ({LINK}; a database path to an empty one, {LINKDB}), another user's file ({OTHERS}: uid
# 65534 when root, else a root-owned file), another user's directory link on the way
# ({EVILDIR}, root only), another application's database, an empty file, a row of the wrong
# type. Refused before any work, one line (tests/test_agent_outfile.py checks they stay
# untouched).
# ==============================================================================================
ROOT = os.geteuid() == 0
OUT_PLANTED = ["{LINK}", "{OTHERS}"] + (["{EVILDIR}/out"] if ROOT else [])
PNG_PLANTED = ["{LINK_PNG}", "{OTHERS_PNG}"] + (["{EVILDIR}/out.png"] if ROOT else [])
DB_PLANTED = ["{LINKDB}", "{OTHERSDB}", "{APPIDDB}", "{EMPTYFILEDB}"] + (
    ["{EVILDIR}/h.sqlite"] if ROOT else [])
path_family(PR, "--csv", values=OUT_PLANTED)
path_family([*PR, "--idle-gaps", "0,1ms"], "--plot", values=PNG_PLANTED)
path_family(PF, "--keep-csv", values=OUT_PLANTED, suffix=CMD)
path_family(H + ["export"], "--out", values=OUT_PLANTED)
path_family(H + ["plot"], "--out", values=PNG_PLANTED)
path_family(["cpus"], "--plot", values=PNG_PLANTED)
path_family(["capture", "--root", "{TREE}"], "--out",
            values=["{LINK}"] + (["{EVILDIR}/cap"] if ROOT else []))
for cmd in (["probe"], ["cpus"], ["gate", "--run", "1"], ["history"], ["history", "export"]):
    path_family(cmd, "--db", values=DB_PLANTED, expect="database")
    if cmd != ["history"]:  # (listing a database that is not there says "no runs yet")
        # a missing directory is an error, never created: before the probe or the scan
        add(*cmd, "--db", "{MISSING}", expect=("does not exist", "{MISSING}"))
add("audit", "--steal-window", "0", "--db", "{MISSING}", expect=("does not exist", "{MISSING}"))
add("audit", "--steal-window", "0", "--db", "{APPIDDB}", expect="database")
add("history", "--db", "{BADROWSDB}", "show", "2", expect="wrong type")
add("gate", "--db", "{BADROWSDB}", "--run", "2", expect="wrong type")

# ==============================================================================================
# attach: crafted libraries (issue #34), mapped executable by a helper process ({ELFPID}) the
# world starts; each names the header it breaks or why the symbol is not a function
# ==============================================================================================
def _elf_broken(change) -> bytes:
    data, lay = elfcraft.plain()
    change(data, lay)
    return bytes(data)


def _elf_symbol(typ: int, value: int) -> bytes:
    strings, at = elfcraft.strtab(["hft_infer"])
    return bytes(elfcraft.library([elfcraft.sym(at["hft_infer"], typ, value)], strings)[0])


ELF_BAD: dict[str, tuple] = {
    "bad-shentsize.so": (lambda: _elf_broken(lambda d, lay: struct.pack_into("<H", d, 58, 40)),
                         "e_shentsize 40 is smaller"),
    "bad-phentsize.so": (lambda: _elf_broken(lambda d, lay: struct.pack_into("<H", d, 54, 8)),
                         "e_phentsize 8 is smaller"),
    "bad-shoff.so": (lambda: _elf_broken(lambda d, lay: struct.pack_into("<Q", d, 40, 2**63)),
                     "truncated ELF headers"),
    "bad-hdrcap.so": (lambda: _elf_broken(lambda d, lay: struct.pack_into("<HH", d, 58, 0xFFFF,
                                                                          0xFFFF)),
                      "header cap"),
    "bad-symoff.so": (lambda: _elf_broken(lambda d, lay: struct.pack_into(
        "<Q", d, lay.shdr(3) + 24, 2**62)), "ends past the end of the file"),
    "bad-link.so": (lambda: _elf_broken(lambda d, lay: struct.pack_into(
        "<I", d, lay.shdr(3) + 40, 1)), "not a string table"),
    "bad-entsize.so": (lambda: _elf_broken(lambda d, lay: struct.pack_into(
        "<Q", d, lay.shdr(3) + 56, 16)), "entries of 16 bytes"),
    "bad-class32.so": (lambda: _elf_broken(lambda d, lay: struct.pack_into("B", d, 4, 1)),
                       "64-bit"),
    "bad-short.so": (lambda: b"\x7fELF\x02\x01\x01" + bytes(9), "too short"),
    "bad-object.so": (lambda: _elf_symbol(elfcraft.STT_OBJECT, elfcraft.TEXT_VADDR),
                      ("OBJECT symbol, not a function", "has none of")),
    "bad-outside.so": (lambda: _elf_symbol(elfcraft.STT_FUNC, 0x900000),
                       ("outside every executable segment", "has none of")),
    "bad-readcap.so": (None, "exceed the 512 MiB read cap"),     # a 1 GiB sparse file
}
for _name, (_make, _expect) in ELF_BAD.items():
    add("attach", "{ELFPID}", "--check", "--attach-symbol", f"{_name}:hft_infer",
        expect=_expect)

# ==============================================================================================
# the CLI itself
# ==============================================================================================
add("bogus-command", expect="bogus-command")
add("--bogus", expect="--bogus")
add("tune", "plan", "--root", "{TREE}", "--profile", "a\nb", expect="profile")


def _ids() -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for c in CASES:
        s = " ".join(repr(a) if (not a or " " in a or "\t" in a) else a for a in c.argv)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.append(s if n == 0 else f"{s} #{n}")
    return out


def _params():
    out = []
    for c, i in zip(CASES, _ids(), strict=True):
        marks = [pytest.mark.xfail(strict=True, reason=c.owner)] if c.owner else []
        out.append(pytest.param(c, id=i, marks=marks))
    return out


# -- the world the cases point into -----------------------------------------------------------
def _make_db(path: Path, runs: int) -> None:
    from agent.history import History, record_run
    fp = {"version": 1, "hostname": "corpus", "kernel": "6.1", "cpu_model": "X",
          "online_cpus": "0-1", "governors": "0-1=performance", "turbo": False,
          "isolated_cpus": "", "nohz_full_cpus": "", "smt_active": 0, "virtualization": "none",
          "gpu_models": None, "gpu_driver": None, "audit": None}
    rng = np.random.default_rng(0)
    for _ in range(runs):
        lat = rng.lognormal(np.log(200e3), 0.2, 1000).astype(np.int64)
        record_run("probe", {}, lat, command="probe", builtin="lstm", variant="tflite",
                   fingerprint=fp, cold_start_ns=300_000, db=path)
    if not runs:
        History(path).close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = build_world(tmp_path_factory.mktemp("corpus"))
    with _elf_mapper(Path(w["TMP"]) / "elf") as pid:
        w["ELFPID"] = str(pid)
        yield w


_MAPPER = r"""
import mmap, os, sys
maps = [mmap.mmap(os.open(p, os.O_RDONLY), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)
        for p in sys.argv[1:]]
print("ready", flush=True)
sys.stdin.read()                # our lifeline: gone with the test process
"""


@contextlib.contextmanager
def _elf_mapper(d: Path):
    """Write the ELF_BAD libraries into ``d`` and yield the pid of a process that maps each
    executable, as a runtime maps its library (what `attach` looks for)."""
    d.mkdir()
    for name, (make, _expect) in ELF_BAD.items():
        if make is not None:
            (d / name).write_bytes(make())
    elfcraft.sparse_giant(d / "bad-readcap.so", 1 << 30, 400 << 20, 200 << 20)
    p = subprocess.Popen([sys.executable, "-c", _MAPPER, *sorted(map(str, d.iterdir()))],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        yield p.pid
    finally:
        p.kill()
        p.wait()
        p.stdin.close()
        p.stdout.close()


def build_world(t: Path) -> dict[str, str]:
    """Create the files the placeholders name under ``t``; {placeholder: path}."""
    w: dict[str, str] = {"TMP": str(t)}

    def place(name: str, p: Path) -> Path:
        w[name] = str(p)
        return p

    place("DIR", t / "empty-dir").mkdir()
    place("FILE", t / "plain.txt").write_text("this is not anything hftagent reads\n")
    for name, fname in (("FIFO", "fifo"), ("FIFO_KERAS", "fifo.keras"), ("FIFO_NPY", "fifo.npy"),
                        ("FIFO_PNG", "fifo.png")):
        os.mkfifo(place(name, t / fname))
    place("DIR_PNG", t / "dir.png").mkdir()
    loop = place("LOOP", t / "loop-a")
    os.symlink(t / "loop-b", loop)
    os.symlink(loop, t / "loop-b")
    w["MISSING"] = str(t / "no-such-dir" / "no-such-file")
    w["NEWOUT"] = str(t / "capture-out")
    place("EMPTY_KERAS", t / "empty.keras").write_bytes(b"")
    place("JUNK_TFLITE", t / "junk.tflite").write_bytes(b"\0" * 64)
    np.save(place("NAN_NPY", t / "nan.npy"), np.array([[1.0, np.nan]], dtype=np.float32))
    np.save(place("SCALAR_NPY", t / "scalar.npy"), np.float32(1.0))
    place("BADTOML", t / "bad.toml").write_text("extends = = 'hft-cpu'\n")
    place("BADTOML_EXT", t / "bad-ext.toml").write_text("extends = 'no-such-profile'\n")
    place("DEEPWEB", t / "deep-web.yml").write_text("[" * 10_000 + "]" * 10_000)
    place("BIGWEB", t / "big-web.yml").write_text("a: [" + "1," * 100_000 + "1]\n")
    place("LONGNAME", t / "long-name.toml").write_text(
        'extends = "hft-cpu"\nname = "' + "a." * 500_000 + '"\n')
    place("LONGWHY", t / "long-why.toml").write_text(
        '[settings.swappiness]\nexpected = 1\nwhy = "' + "w" * 1_000_000 + '"\n')
    place("ESCNAME", t / "esc-name.toml").write_text('name = "a\\u001b[2Jb"\n')
    place("BADJSON", t / "bad.json").write_text("{\"schema\": ")
    place("WRONGJSON", t / "wrong.json").write_text('{"schema": "something.else"}\n')
    place("NESTED", t / "nested.json").write_text("[" * 200_000 + "]" * 200_000)
    place("PROBEJSON", t / "probe.json").write_text(json.dumps(
        {"schema": "hftagent.probe", "schema_version": 1, "runs": []}))
    # trees: a pristine-copy root for audit/tune/run, one with CPUs 4-7 offline, one whose
    # files are all empty (#13.7)
    shutil.copytree(FIXTURES / "vm-dev", place("TREE", t / "tree"), symlinks=True)
    off = place("OFFTREE", t / "offtree")
    shutil.copytree(FIXTURES / "synthetic-2socket", off, symlinks=True)
    (off / "sys/devices/system/cpu/online").write_text("0-3,8-15\n")
    (off / "sys/devices/system/cpu/offline").write_text("4-7\n")
    empty = place("EMPTYTREE", t / "emptytree")
    shutil.copytree(FIXTURES / "vm-dev", empty, symlinks=True)
    for p in empty.rglob("*"):
        if p.is_file() and not p.is_symlink():
            p.write_bytes(b"")
    place("STATE", t / "state").mkdir()
    # journals for rollback/status
    for name, body in (("J_GARBAGE", "not json"), ("J_NESTED", "[" * 200_000),
                       ("J_WRONG", '{"version": 99, "entries": "x"}'),
                       ("J_NUL", json.dumps(_journal("/proc/sys/vm/swappiness\0x"))),
                       ("J_IRQ", json.dumps(_journal("/proc/irq/1x/smp_affinity_list")))):
        d = place(name, t / name.lower())
        d.mkdir()
        (d / "journal.json").write_text(body)
    jf = place("J_FIFO", t / "j_fifo")
    jf.mkdir()
    os.mkfifo(jf / "journal.json")
    # history databases
    _make_db(place("DB", t / "history.sqlite"), 2)
    _make_db(place("DEFAULTDB", t / "default-history.sqlite"), 3)
    _make_db(place("EMPTYDB", t / "empty.sqlite"), 0)
    w["NODB"] = str(t / "no-such-history.sqlite")
    place("NOTDB", t / "not-a-db.sqlite").write_text("hello, I am not SQLite\n")
    newer = place("NEWERDB", t / "newer.sqlite")
    _make_db(newer, 0)
    import sqlite3
    con = sqlite3.connect(newer)
    con.execute("PRAGMA user_version = 99")
    con.close()
    foreign = place("FOREIGNDB", t / "foreign.sqlite")
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE runs (x)")
    con.close()
    # outputs another user prepared (the section above)
    root = os.geteuid() == 0
    secret = place("SECRET", t / "secret")
    secret.write_text("root only\n")
    secret.chmod(0o600)
    empty_secret = t / "empty-secret"
    empty_secret.write_bytes(b"")
    empty_secret.chmod(0o600)
    for name, fname, target in (("LINK", "link-out", secret), ("LINK_PNG", "link.png", secret),
                                ("LINKDB", "link.sqlite", empty_secret)):
        os.symlink(target, place(name, t / fname))
        if root:
            os.lchown(t / fname, 65534, 65534)
    for name, fname in (("OTHERS", "others.csv"), ("OTHERS_PNG", "others.png"),
                        ("OTHERSDB", "others.sqlite")):
        p = place(name, t / fname)
        if root:
            if name == "OTHERSDB":
                _make_db(p, 1)
            else:
                p.write_text("someone else's\n")
            os.chown(p, 65534, 65534)
        else:
            w[name] = "/etc/passwd"  # root's: never ours to replace
    evil_real = t / "evil-real"
    evil_real.mkdir()
    os.symlink(evil_real, place("EVILDIR", t / "evil"))
    if root:
        os.lchown(t / "evil", 65534, 65534)
    appid = place("APPIDDB", t / "other-app.sqlite")
    con = sqlite3.connect(appid)
    con.execute("PRAGMA application_id = 1196444237")
    con.execute("CREATE TABLE features (x)")
    con.commit()
    con.close()
    place("EMPTYFILEDB", t / "empty-file.sqlite").write_bytes(b"")
    bad = place("BADROWSDB", t / "bad-rows.sqlite")
    _make_db(bad, 2)
    con = sqlite3.connect(bad)
    con.execute("UPDATE runs SET created_utc = x'00ff' WHERE id = 2")
    con.commit()
    con.close()
    return w


def _journal(target: str) -> dict:
    """A journal that looks like tune apply's, with one entry at ``target``."""
    return {"version": 1, "boot_id": None, "profile": "hft-cpu", "cpus": "1",
            "root": "/", "entries": [{"tunable": "kernel.swappiness", "target": target,
                                      "original": "60", "written": "1", "state": "written"}]}


_PLACEHOLDER = re.compile(r"\{([A-Z_]+)\}")


def _fill(arg: str, w: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: w[m[1]], arg)


# -- running a case ---------------------------------------------------------------------------
_FENCES = (
    ("agent.probe.runner", "run_probe"),
    ("agent.gate.evaluate", "run_scenario"),
    ("agent.watch.session", "WatchSession.run"),
    ("tuning.launcher", "exec_launch"),
    ("collectors.nsight", "profile"),
    ("agent.noise.scan", "scan"),
)


def _fence(monkeypatch) -> None:
    import importlib

    def heavy(*_a, **_k):
        raise HeavyWork("a bad input reached the command's real work")

    for mod, attr in _FENCES:
        obj = importlib.import_module(mod)
        *owners, name = attr.split(".")
        for o in owners:
            obj = getattr(obj, o)
        monkeypatch.setattr(obj, name, heavy)


def _env(w: dict[str, str]) -> dict[str, str]:
    t = w["TMP"]
    return {"HFTAGENT_DB": w["DEFAULTDB"], "XDG_STATE_HOME": f"{t}/state-home",
            "HFTAGENT_CACHE": f"{t}/cache", "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1", "COLUMNS": "100"}


def _run_inprocess(argv: list[str], timeout: float) -> tuple[int | str, str, str, float]:
    from agent import cli

    def on_alarm(_sig, _frame):
        raise Hang(f"no exit within {timeout} s")

    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, on_alarm)
    old_argv = sys.argv
    sys.argv = ["hftagent", *argv]
    t0 = time.monotonic()
    rc: int | str
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
                rc = "returned without sys.exit"
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
    except Hang as exc:
        rc = f"HANG: {exc}"
    except HeavyWork as exc:
        rc = f"HEAVY WORK: {exc}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        sys.argv = old_argv
    return rc, out.getvalue(), err.getvalue(), time.monotonic() - t0


_BOOT = r"""
import sys
if sys.argv[1] == "fence":
    import os
    def heavy(*a, **k):
        sys.stderr.write("\nHEAVY WORK: a bad input reached the command's real work\n")
        sys.stderr.flush()
        os._exit(97)
    import importlib
    for mod, attr in FENCES:
        obj = importlib.import_module(mod)
        *owners, name = attr.split(".")
        for o in owners:
            obj = getattr(obj, o)
        setattr(obj, name, heavy)
del sys.argv[1]
from agent.cli import main
main()
"""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (SUB_MEMORY, SUB_MEMORY))


@pytest.fixture(scope="module")
def sub_results(world, tmp_path_factory):
    return run_subprocess_cases([c for c in CASES if c.sub], world,
                                tmp_path_factory.mktemp("corpus-sub"))


def run_subprocess_cases(cases: list[Case], world: dict[str, str], outdir: Path) -> dict:
    """Run ``cases``, SUB_PARALLEL at a time, each with its own timeout, and collect
    {case: (rc, stdout, stderr, seconds)}. Output goes to files: a pipe that fills up would
    block the child and look like a hang."""
    env = {**os.environ, **_env(world)}
    env.pop("HFTAGENT_DEBUG", None)
    todo = list(enumerate(cases))
    running: dict[Case, tuple[subprocess.Popen, float, Path]] = {}
    results = {}

    def finish(c: Case, rc) -> None:
        p, t0, base = running.pop(c)
        err = base.with_suffix(".err").read_text(errors="replace")
        if rc == 97 and "HEAVY WORK:" in err:
            rc = "HEAVY WORK: a bad input reached the command's real work"
        results[c] = (rc, base.with_suffix(".out").read_text(errors="replace"), err,
                      time.monotonic() - t0)

    while todo or running:
        while todo and len(running) < SUB_PARALLEL:
            n, c = todo.pop(0)
            argv = [_fill(a, world) for a in c.argv]
            fence = "exec" if argv[0] == "run" else "fence"  # run's cases exec for real
            base = outdir / f"case{n}"
            with open(base.with_suffix(".out"), "wb") as out, \
                    open(base.with_suffix(".err"), "wb") as err:
                p = subprocess.Popen([sys.executable, "-c", f"FENCES = {_FENCES!r}\n{_BOOT}",
                                      fence, *argv],
                                     cwd=world["TMP"], env=env, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=err, preexec_fn=_limit_memory,
                                     start_new_session=True)
            running[c] = (p, time.monotonic(), base)
        time.sleep(0.02)
        for c, (p, t0, _base) in list(running.items()):
            if p.poll() is not None:
                finish(c, p.returncode)
            elif time.monotonic() - t0 > SUB_TIMEOUT_S:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                finish(c, f"HANG: no exit within {SUB_TIMEOUT_S} s")
    return results


@pytest.fixture
def inproc(world, monkeypatch, tmp_path):
    for k, v in _env(world).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("HFTAGENT_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    _fence(monkeypatch)


def check(c: Case, rc, out: str, err: str, world: dict[str, str]) -> None:
    shown = f"rc={rc!r} stderr={err[-1500:]!r} stdout={out[-300:]!r}"
    assert not (isinstance(rc, str) and rc.startswith("HANG")), shown
    assert not (isinstance(rc, str) and rc.startswith("HEAVY")), \
        f"validation let the case reach the command's real work: {shown}"
    assert isinstance(rc, int) and rc != 0, shown
    assert "Traceback" not in err and "Traceback" not in out, shown
    assert "internal error" not in err.lower(), shown
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"stderr must be exactly one line: {shown}"
    assert lines[0].startswith("hftagent: "), shown
    if c.expect:
        wants = [_fill(e, world) for e in ((c.expect,) if isinstance(c.expect, str)
                                           else c.expect)]
        assert any(x.lower() in lines[0].lower() for x in wants), \
            f"the line names none of {wants!r}: {shown}"


def test_corpus_is_large_enough():
    assert len(CASES) >= 400, len(CASES)
    ids = _ids()
    assert len(set(ids)) == len(ids)
    commands = {c.argv[0] for c in CASES}
    assert {"audit", "capture", "probe", "profile", "tune", "run", "history", "gate",
            "watch"} <= commands
    assert {c.argv[1] for c in CASES if c.argv[0] in ("tune", "history") and len(c.argv) > 1
            } >= {"plan", "apply", "rollback", "status", "threads", "--db"}


@pytest.mark.parametrize("case", _params())
def test_bad_input(case: Case, world, request):
    if case.sub:
        rc, out, err, _s = request.getfixturevalue("sub_results")[case]
    else:
        request.getfixturevalue("inproc")
        rc, out, err, _s = _run_inprocess([_fill(a, world) for a in case.argv], TIMEOUT_S)
    check(case, rc, out, err, world)


# -- what the probe's checks still accept (a corpus of refusals proves nothing alone) ---------
PROBE_DEFAULTS = dict(model=None, builtin=None, signature=None, shape=None, input_data="random",
                      variant=None, samples=None, duration=None, warmup=200, rate=None,
                      threshold_us=5000.0, calib=None, intra=None, inter=None, cpus=None,
                      sweep=None, batch="1")


def test_probe_options_accept_the_documented_values(tmp_path):
    from agent.probe import options
    from agent.probe.config import MAX_SAMPLES
    cpu = min(os.sched_getaffinity(0))
    s, c = options.build(**{**PROBE_DEFAULTS, "intra": 1, "inter": -1, "shape": "1,64,32",
                            "batch": "1, 8,32", "samples": MAX_SAMPLES, "variant": "graph,xla",
                            "duration": 86_400.0, "rate": 1000.0, "cpus": str(cpu)})
    assert (c[0].intra, c[0].inter, c[0].cpus) == (1, -1, [cpu])
    assert s.shape == [1, 64, 32] and s.batch == [1, 8, 32] and s.variants == ["graph", "xla"]
    # what `tune threads` and `gate` pass: the defaults spelled out
    s, _c = options.build(**{**PROBE_DEFAULTS, "builtin": "lstm",
                             "signature": "serving_default"})
    assert s.model.builtin == "lstm" and s.model.signature == "serving_default"
    np.save(tmp_path / "x.npy", np.zeros((4, 64, 32), dtype=np.float32))
    s, _c = options.build(**{**PROBE_DEFAULTS, "input_data": str(tmp_path / "x.npy"),
                             "calib": str(tmp_path / "x.npy"), "intra": 4096, "inter": 4096})
    assert s.calib == str(tmp_path / "x.npy")


@pytest.mark.parametrize("change,needle", [
    ({"intra": 0}, "--intra"), ({"inter": -5}, "--inter"), ({"inter": 0}, "--inter"),
    ({"shape": ""}, "--shape is empty"), ({"shape": "1,٣"}, "--shape"),
    ({"variant": ""}, "--variant"), ({"samples": 5_000_001}, "--samples"),
    ({"signature": "other"}, "--signature"), ({"sweep": "threads", "intra": 1}, "--sweep"),
])
def test_probe_options_refuse(change, needle):
    """#13.8: --intra 0, --inter -5 and --shape '' were accepted (and silently defaulted)."""
    from agent.errors import AgentError
    from agent.probe import options
    with pytest.raises(AgentError, match=re.escape(needle)):
        options.build(**{**PROBE_DEFAULTS, **change})

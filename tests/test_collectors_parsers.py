"""Pure parsers: canned files and property tests (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.parsers import (
    NeedsCpuCount,
    ParseError,
    format_cpulist,
    format_cpumask,
    group_by_value,
    isolation_cpus,
    parse_bracketed,
    parse_cmdline,
    parse_cpulist,
    parse_cpumask,
    parse_interrupts,
    parse_pci_speed,
    parse_pci_width,
    parse_proc_stat,
    parse_softirqs,
    parse_task_stat,
    pcie_generation,
)

cpu_sets = st.sets(st.integers(min_value=0, max_value=511), max_size=64)


@given(cpu_sets)
def test_cpulist_roundtrip(cpus):
    assert parse_cpulist(format_cpulist(cpus)) == sorted(cpus)


@given(cpu_sets)
def test_cpumask_roundtrip(cpus):
    assert parse_cpumask(format_cpumask(cpus)) == sorted(cpus)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=5))
def test_cpulist_is_compact(cpus):
    text = format_cpulist(cpus)
    # never two adjacent numbers that should have merged into a range
    parts = [p for p in text.split(",") if "-" not in p]
    nums = sorted(int(p) for p in parts)
    assert all(b - a > 1 or a == b for a, b in zip(nums, nums[1:]))


@pytest.mark.parametrize("text,expected", [
    ("0-3,8", [0, 1, 2, 3, 8]), ("", []), ("5", [5]), (" 1,2 \n", [1, 2]), ("0-0", [0]),
    # the kernel skips any run of commas and whitespace between regions (bitmap_find_region)
    ("1,,2", [1, 2]), (",1 2,", [1, 2]), ("007", [7]),
    # range:used/group (lib/bitmap-str.c): from each group of 4 CPUs the first 2
    ("0-7:2/4", [0, 1, 4, 5]), ("1-7:2/4", [1, 2, 5, 6]), ("0-7:1/1", list(range(8))),
    ("100-200:2/25", [100, 101, 125, 126, 150, 151, 175, 176, 200]),
    ("0-31:1/3,1-31:1/3,2-31:1/3", list(range(32))),  # lib/test_bitmap.c
    ("1-10:8/12,8-31:24/29,0-31:0/3", list(range(1, 32))),  # lib/test_bitmap.c
])
def test_cpulist_examples(text, expected):
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("bad", [
    "3-1", "x", "-1", "1-", "a-b", "1--2", "0x10", "+1", "1_0", "1.0",
    "0-3:0", "0-7:2",  # a stride needs /group in the kernel's grammar
    "0-3:3/2", "0-3:1/0", "5:1/2",  # used > group, group 0, a pattern after a single CPU
    "٣", "0-٣", "²", "１",  # Unicode digits: int() takes them, the kernel does not
    "al", "alll", "n", "N1",
])
def test_cpulist_rejects(bad):
    with pytest.raises(ParseError):
        parse_cpulist(bad, 32)


def test_cpulist_n_and_all_need_the_cpu_count():
    """Defect: "1-N" and "all" (Linux 5.12 / 5.13) made the isolation family fail with
    "bad CPU range"."""
    assert parse_cpulist("1-N", 8) == list(range(1, 8))
    assert parse_cpulist("N", 8) == [7]
    assert parse_cpulist("0-N:1/2", 8) == [0, 2, 4, 6]
    assert parse_cpulist("all", 4) == [0, 1, 2, 3]
    assert parse_cpulist("0, 1, all,  ", 32) == list(range(32))  # lib/test_bitmap.c
    assert parse_cpulist("all:1/2", 8) == parse_cpulist("ALL:1/2", 8) == [0, 2, 4, 6]
    with pytest.raises(ParseError, match="runs backwards"):
        parse_cpulist("16-N", 4)  # kernel-parameters.rst: "16-3" on a 4-CPU box
    for text in ("1-N", "all"):
        with pytest.raises(NeedsCpuCount):
            parse_cpulist(text)


def test_cpulist_bounds_are_checked_before_expanding():
    """Defect: "0-4294967295" expanded 4 billion CPUs (MemoryError) before any bound."""
    for text in ("0-4294967295", "0-99999999999999999999", "4294967295", "9" * 5000):
        with pytest.raises(ParseError) as exc:
            parse_cpulist(text)
        assert len(str(exc.value)) < 200
    assert parse_cpulist("8191") == [8191]
    with pytest.raises(ParseError, match="at most 8192"):
        parse_cpulist("8192")
    with pytest.raises(ParseError, match=r"past the last CPU \(3\)"):
        parse_cpulist("2-4", 4)
    assert len(parse_cpulist("0-8191")) == 8192


def test_cpumask_words():
    assert parse_cpumask("00000001,00000003") == [0, 1, 32]
    assert format_cpumask([0, 1, 32]) == "00000001,00000003"
    with pytest.raises(ValueError):
        parse_cpumask("zz")


def test_group_by_value():
    assert group_by_value({0: "performance", 1: "performance", 2: "powersave", 3: None}) == \
        "0-1=performance; 2=powersave; 3=unreadable"


def test_cmdline():
    args = parse_cmdline('BOOT_IMAGE=/vmlinuz ro quiet isolcpus=managed_irq,domain,2-5 '
                         'foo="a b" nohz_full=2-5 -- --init-arg=1')
    assert args["isolcpus"] == "managed_irq,domain,2-5"
    assert args["ro"] is None and args["foo"] == "a b"
    assert "--init-arg" not in args
    assert isolation_cpus(args["isolcpus"]) == [2, 3, 4, 5]
    assert isolation_cpus("nohz,domain,1-2") == [1, 2]
    assert isolation_cpus(None) == []


def test_cmdline_is_split_as_the_kernel_splits_it():
    """lib/cmdline.c next_arg: only double quotes group; single quotes and backslashes are
    plain characters (shlex took them for quoting)."""
    args = parse_cmdline("a='b c' \"x=y z\" w=\"1 2\" bs=a\\b =odd e= flag\t\n")
    assert args == {"a": "'b", "c'": None, "x": "y z", "w": "1 2", "bs": "a\\b",
                    "=odd": None, "e": "", "flag": None}
    assert parse_cmdline("") == {} and parse_cmdline("  -- a=1") == {}
    assert parse_cmdline('q="unterminated value') == {"q": "unterminated value"}


@pytest.mark.parametrize("param,value,nr,expected", [
    ("nohz_full", "1-N", 8, list(range(1, 8))),
    ("isolcpus", "1-7:2/4", 8, [1, 2, 5, 6]),
    ("isolcpus", "nohz,domain,managed_irq,1-3", 8, [1, 2, 3]),
    ("isolcpus", "domain,some_new_flag,2-3", 8, [2, 3]),  # unknown flags are skipped
    ("isolcpus", "managed_irq,domain,2-N", 4, [2, 3]),
    ("isolcpus", "domain,", 4, []),
    ("rcu_nocbs", "all", 8, list(range(8))),
    ("rcu_nocbs", "1-N", 4, [1, 2, 3]),
    # tree_nocb.h: "rcu_nocbs= bad CPU range, all CPUs set"
    ("rcu_nocbs", "garbage", 4, [0, 1, 2, 3]), ("rcu_nocbs", "0-9", 4, [0, 1, 2, 3]),
    ("nohz_full", "", 4, []), ("rcu_nocbs", None, 4, []),
])
def test_isolation_cpus_reads_the_boot_syntax_the_kernel_accepts(param, value, nr, expected):
    """Defect: nohz_full=1-N and isolcpus=1-7:2/4 failed the isolation family with "bad CPU
    range"; rcu_nocbs=all covered nothing."""
    assert isolation_cpus(value, nr, param=param) == expected


@pytest.mark.parametrize("param,value,nr,match", [
    ("isolcpus", "all", 8, "as a flag"),  # the kernel's flag loop eats any leading letter
    ("isolcpus", "domain", 8, "no CPU list"),
    ("isolcpus", "dom4in,1-3", 8, "invalid flag"),
    ("nohz_full", "nohz,1-3", 8, "kernel ignores it"),
    ("nohz_full", "0-9", 4, "past the last CPU"),
])
def test_isolation_cpus_errors(param, value, nr, match):
    with pytest.raises(ParseError, match=match):
        isolation_cpus(value, nr, param=param)


def test_isolation_cpus_without_the_cpu_count():
    for param, value in (("nohz_full", "1-N"), ("rcu_nocbs", "all"), ("rcu_nocbs", "x"),
                         ("isolcpus", "domain,2-N")):
        with pytest.raises(NeedsCpuCount):
            isolation_cpus(value, param=param)


INTERRUPTS = """\
           CPU0       CPU1       CPU4
  0:         36          0          0  IR-IO-APIC    2-edge      timer
 24:          1          2          3  PCI-MSI 1-edge      nvme0q1, extra
NMI:          0          1          2   Non-maskable interrupts
LOC:     100000     200000     300000   Local timer interrupts
ERR:          0
MIS:          7
"""


def test_interrupts_single_column_rows_and_offline_cpus():
    cpus, rows = parse_interrupts(INTERRUPTS)
    assert cpus == [0, 1, 4]
    by = {r.irq: r for r in rows}
    assert by["24"].counts == (1, 2, 3) and by["24"].desc.endswith("nvme0q1, extra")
    assert by["ERR"].counts == (0,) and by["MIS"].total == 7
    assert by["LOC"].counts == (100000, 200000, 300000)
    assert by["0"].numeric and not by["NMI"].numeric


@given(st.integers(1, 8), st.lists(st.tuples(st.integers(0, 4096),
                                             st.lists(st.integers(0, 2**40), min_size=8,
                                                      max_size=8)), max_size=20, unique_by=lambda t: t[0]))
def test_interrupts_property(ncpu, irqs):
    lines = [" " * 10 + "".join(f"CPU{i:<8}" for i in range(ncpu))]
    for n, counts in irqs:
        lines.append(f"{n:>4}: " + " ".join(str(c) for c in counts[:ncpu]) + "  IO-APIC 1-edge dev")
    lines.append("ERR: 5")
    cpus, rows = parse_interrupts("\n".join(lines))
    assert cpus == list(range(ncpu))
    assert [r.counts for r in rows[:-1]] == [tuple(c[:ncpu]) for _, c in irqs]
    assert rows[-1].counts == (5,)


@given(st.lists(st.lists(st.integers(0, 2**50), min_size=10, max_size=10), min_size=1,
                max_size=16))
def test_proc_stat_property(per_cpu):
    text = "cpu  " + " ".join(str(sum(c[i] for c in per_cpu)) for i in range(10)) + "\n"
    text += "".join(f"cpu{i} " + " ".join(map(str, c)) + "\n" for i, c in enumerate(per_cpu))
    text += "ctxt 42\nbtime 7\n"
    ps = parse_proc_stat(text)
    assert ps.ctxt == 42 and ps.btime == 7
    for i, c in enumerate(per_cpu):
        assert ps.cpus[i]["steal"] == c[7] and ps.cpus[i]["user"] == c[0]
    assert ps.cpus[-1]["idle"] == sum(c[3] for c in per_cpu)


def test_proc_stat_old_kernel_has_no_steal_field():
    ps = parse_proc_stat("cpu 1 2 3 4\ncpu0 1 2 3 4\n")
    assert "steal" not in ps.cpus[0]  # absent, not 0
    with pytest.raises(ValueError):
        parse_proc_stat("intr 5\n")


def test_softirqs():
    cpus, rows = parse_softirqs("       CPU0 CPU1\n   HI: 1 2\nNET_RX: 30 40\n")
    assert cpus == [0, 1] and rows["NET_RX"] == (30, 40)


def test_pci_link_attributes():
    assert parse_pci_speed("16.0 GT/s PCIe") == 16.0
    assert parse_pci_speed("8 GT/s") == 8.0
    assert parse_pci_speed("Unknown") is None
    assert pcie_generation(32.0) == 5 and pcie_generation(2.5) == 1
    assert parse_pci_width("16") == 16 and parse_pci_width("x8") == 8
    assert parse_pci_width("0") is None and parse_pci_width("255") is None
    with pytest.raises(ValueError):
        parse_pci_speed("fast")


def test_bracketed_and_task_stat():
    assert parse_bracketed("always [madvise] never") == ("madvise", ["always", "madvise", "never"])
    with pytest.raises(ValueError):
        parse_bracketed("always madvise")
    st_ = parse_task_stat("1234 (my (odd) proc) R 1 1 1 0 -1 4194560 50 0 3 0 7 8 0 0 20 0 9 "
                          "0 100 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 5 0 0")
    assert st_.comm == "my (odd) proc" and st_.minflt == 50 and st_.majflt == 3
    assert st_.utime == 7 and st_.num_threads == 9 and st_.processor == 5


@pytest.mark.parametrize("spec,msg", [("3-1", "runs backwards"), ("", "empty"),
                                      ("0-4", "CPU(s) 4 not online (online: 0-3)")])
def test_cpu_option_is_validated_against_online(spec, msg):
    from collectors.parsers import parse_cpu_option

    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        parse_cpu_option(spec, [0, 1, 2, 3])
    assert parse_cpu_option("1-2", [0, 1, 2, 3]) == [1, 2]


def test_cpu_option_bounds_n_and_unicode_digits():
    """Defect: --cpus 0-4294967295 was a MemoryError; "٣" (an Arabic 3) was CPU 3."""
    from collectors.parsers import parse_cpu_option

    for spec in ("0-4294967295", "٣", "1-٣", "0-8191:1/2"):
        with pytest.raises(ParseError) as exc:
            parse_cpu_option(spec, [0, 1, 2, 3])
        assert len(str(exc.value)) < 160, str(exc.value)  # never a huge list
    with pytest.raises(ParseError, match=r"CPU\(s\) 4,6,8,.*,… \(4094 CPUs\) not online"):
        parse_cpu_option("0-8191:1/2", [0, 1, 2, 3], nr_cpus=8192)
    assert parse_cpu_option("1-N", [0, 1, 2, 3]) == [1, 2, 3]  # N: the last online CPU
    assert parse_cpu_option("all", [0, 1, 2, 3]) == [0, 1, 2, 3]
    with pytest.raises(ParseError, match=r"CPU\(s\) 4-7 not online"):
        parse_cpu_option("1-N", [0, 1, 2, 3], nr_cpus=8)  # N: the last possible CPU
    with pytest.raises(ParseError, match="past the last CPU"):
        parse_cpu_option("9", [0, 1, 2, 3], nr_cpus=8)


def test_truncated_proc_stat_is_a_parse_error():
    """Defect: "ctxt" without its value, or a cpu line cut short, raised IndexError."""
    for text in ("cpu 1 2 3 4\nctxt\n", "cpu 1 2 3 4\ncpu0 1 2\n", "cpu 1 2 3 4\nsoftirq\n",
                 "cpu 1 2 3 4\ncpu٣ 1 2 3 4\n", "cpu 1 2 3 -4\n", "cpu 1 2 3 nan\n",
                 "cpuX 1 2 3 4\n", "cpu99999 1 2 3 4\n"):
        with pytest.raises(ParseError):
            parse_proc_stat(text)


def test_truncated_task_stat_is_a_parse_error():
    """Defect: a /proc/<pid>/stat cut after a few fields raised IndexError."""
    full = ("1234 (x) R 1 1 1 0 -1 4194560 50 0 3 0 7 8 0 0 20 0 9 0 100 1000 10 "
            "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 5 0 0")
    assert parse_task_stat(full).policy == 0
    for text in (full[:40], "1234 (x)", "1234 (x) R", "(x", full.replace("1234", "١٢"),
                 full.replace(" 50 ", " -50 "), full.replace(" R ", " RR ")):
        with pytest.raises(ParseError):
            parse_task_stat(text)


def test_softirq_rows_must_have_a_count_per_cpu():
    """Defect: a softirq row shorter than the header was accepted."""
    with pytest.raises(ParseError, match="1 counts for 2 CPUs"):
        parse_softirqs("       CPU0 CPU1\n   HI: 1 2\nNET_RX: 30\n")
    for text in ("", "CPUx\nHI: 1\n", "CPU0 CPU0\nHI: 1 2\n", "CPU0\nHI: -1\n",
                 "CPU0\nHI: ٣\n", "CPU0\ngarbage\n"):
        with pytest.raises(ParseError):
            parse_softirqs(text)


def test_interrupts_rows_and_numbers_are_ascii_and_complete():
    with pytest.raises(ParseError, match="1 counts for 3 CPUs"):
        parse_interrupts("CPU0 CPU1 CPU2\n 24: 1 IO-APIC 2-edge timer\n")
    with pytest.raises(ParseError):
        parse_interrupts("CPU٣\n 24: 1\n")
    _, rows = parse_interrupts("CPU0\n ٣: 5 x\n")
    assert not rows[0].numeric  # a row named "٣" is not IRQ 3
    # a count past a u64's 20 digits is refused, naming its row
    with pytest.raises(ParseError, match=r"^bad count in /proc/interrupts row 'LOC' "):
        parse_interrupts("CPU0 CPU1\n 24: 1 2 x\nLOC: 3 " + "1" * 21 + " Local\n")
    _, rows = parse_interrupts("CPU0 CPU1\n 24: 1 " + "9" * 20 + " x\n")
    assert rows[0].counts == (1, 10**20 - 1)


def test_pci_class_speed_and_width_reject_garbage():
    """Defect: a garbage class crashed the pcie family with a bare int() error; a speed with
    garbage around "8 GT/s" was taken."""
    from collectors.parsers import pci_class_name

    assert pci_class_name("0x030200\n") == "gpu-3d"
    assert pci_class_name("0x0b4000") == "class-0b40"
    for bad in ("zz", "", "0x", "0x1234567", "-0x1", "0x03_0200", "٣"):
        with pytest.raises(ParseError, match="bad PCI class"):
            pci_class_name(bad)
    assert parse_pci_speed("Unknown speed") is None
    assert parse_pci_speed("2.5 GT/s PCIe\n") == 2.5
    for bad in ("garbage 8 GT/s garbage", "8.0.1 GT/s", "nan GT/s", "-8 GT/s", "", "Unknownx"):
        with pytest.raises(ParseError):
            parse_pci_speed(bad)
    for bad in ("64", "-1", "x", "", "٣"):
        with pytest.raises(ParseError):
            parse_pci_width(bad)


def test_masks_aer_and_key_value_files_reject_garbage():
    from collectors.parsers import parse_aer, parse_meminfo, parse_swaps, parse_vmstat

    for bad in ("1,,2", "123456789", "f" * 10000, ",".join(["f"] * 300), "٣", "1 2"):
        with pytest.raises(ParseError):
            parse_cpumask(bad)
    assert parse_cpumask(" ff,00000001\n") == [0, 32, 33, 34, 35, 36, 37, 38, 39]
    assert parse_aer("RxErr 1\nTOTAL_ERR_COR 3\n") == {"RxErr": 1, "TOTAL_ERR_COR": 3}
    for bad in ("", "RxErr\n", "RxErr -1\n", "RxErr ٣\n"):
        with pytest.raises(ParseError):
            parse_aer(bad)
    assert parse_vmstat("pgfault 10\nnr_x -2\n") == {"pgfault": 10, "nr_x": -2}
    assert parse_meminfo("MemTotal: 2 kB\nHugePages_Total: 3\n") == \
        {"MemTotal": 2048, "HugePages_Total": 3}
    for fn, bad in ((parse_vmstat, "pgfault ٣\n"), (parse_vmstat, "pgfault\n"),
                    (parse_meminfo, "MemTotal: ٣ kB\n"), (parse_meminfo, "MemTotal: 1 MB\n"),
                    (parse_swaps, "Filename Type Size Used Priority\n/dev/x partition 1\n"),
                    (parse_swaps, "garbage\n")):
        with pytest.raises(ParseError):
            fn(bad)


@given(st.integers(0, 200), st.integers(0, 200), st.integers(0, 60), st.integers(1, 60))
def test_cpulist_groups_match_the_kernel_loop(a, b, used, group):
    """bitmap_set_region: for (start = r->start; start <= r->end; start += r->group_len)
    bitmap_set(bitmap, start, min(r->end - start + 1, r->off))."""
    start, end = min(a, b), max(a, b)
    text = f"{start}-{end}:{used}/{group}"
    if used > group:
        with pytest.raises(ParseError):
            parse_cpulist(text)
        return
    want: set[int] = set()
    for base in range(start, end + 1, group):
        want.update(range(base, base + min(end - base + 1, used)))
    assert parse_cpulist(text) == sorted(want)


def test_cpu_option_refuses_empty_elements_the_kernel_list_grammar_skips():
    from collectors.parsers import parse_cpu_option
    assert parse_cpulist("0,,1") == [0, 1]                 # a boot argument: the kernel's way
    for bad in ("0,,1", "1,", ",1", "0, ,1"):
        with pytest.raises(ParseError, match="empty element"):
            parse_cpu_option(bad, [0, 1])
    assert parse_cpu_option("0,1", [0, 1]) == [0, 1]

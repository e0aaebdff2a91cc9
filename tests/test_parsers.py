"""Pure parsers: canned files and property tests (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.parsers import (
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
    ("0-3,8", [0, 1, 2, 3, 8]), ("", []), ("5", [5]), ("0-7:2", [0, 2, 4, 6]),
    (" 1,2 \n", [1, 2]), ("0-0", [0]),
])
def test_cpulist_examples(text, expected):
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("bad", ["3-1", "x", "1,,2", "-1", "1-", "a-b", "0-3:0"])
def test_cpulist_rejects(bad):
    with pytest.raises(ValueError):
        parse_cpulist(bad)


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

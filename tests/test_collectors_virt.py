"""When no source can tell a guest from bare metal (collectors/virt.py: ``known`` False), the
audit header, its JSON and the host fingerprint say "unknown", never "none" (bare metal):
issue #28."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agent.cli import get_app
from agent.gate import fingerprint
from collectors.host import Host
from collectors.system import virtualization
from tests.conftest import FIXTURES

runner = CliRunner()


def _unknown_host(tmp_path) -> tuple[str, str]:
    """A tuned bare-metal-shaped tree whose procfs has an unreadable cpuinfo: the CPUID test
    cannot be made and DMI alone is not enough (collectors/virt.py)."""
    (tmp_path / "proc/cpuinfo").mkdir(parents=True)
    return str(FIXTURES / "synthetic-tuned"), str(tmp_path / "proc")


def test_the_tree_is_unknown_and_the_untouched_one_is_bare_metal(tmp_path):
    root, procfs = _unknown_host(tmp_path)
    assert not virtualization(Host(root, procfs=procfs)).known
    v = virtualization(Host(root))
    assert v.known and v.kind is None


def test_audit_header_and_json_say_unknown(tmp_path):
    root, procfs = _unknown_host(tmp_path)
    res = runner.invoke(get_app(), ["audit", "--root", root, "--procfs", procfs, "--json"])
    assert json.loads(res.stdout)["host"]["virtualization"] == "unknown"
    res = runner.invoke(get_app(), ["audit", "--root", root, "--procfs", procfs],
                        env={"COLUMNS": "200"})
    header = res.stdout.splitlines()[1]
    assert "virt unknown" in header and "virt none" not in header
    res = runner.invoke(get_app(), ["audit", "--root", root], env={"COLUMNS": "200"})
    assert "virt none" in res.stdout.splitlines()[1]  # bare metal shown by CPUID stays none


def test_fingerprint_says_unknown(tmp_path):
    root, procfs = _unknown_host(tmp_path)
    assert fingerprint.collect(Host(root, procfs=procfs))["virtualization"] == "unknown"
    assert fingerprint.collect(Host(root))["virtualization"] == "none"

"""Boot-time CPU isolation arguments: never applied, printed as exact commands.

isolcpus=, nohz_full=, rcu_nocbs= and irqaffinity= only take effect at boot. Changing the
bootloader configuration is outside what a runtime journal can undo (the journal lives on tmpfs
and a reboot is needed anyway), so these are reported ``pending-reboot`` with the exact grubby
(RHEL, Fedora) and GRUB (Debian, Ubuntu) commands to run.
"""

from __future__ import annotations

import shlex

from collectors.kernel import cmdline
from collectors.parsers import format_cpulist, isolation_cpus, parse_cpulist
from tuning.findings import Finding, Status
from tuning.tunables.base import PENDING_REBOOT, Change, Tunable, TuneContext


def boot_args(cpus: list[int], online: list[int]) -> dict[str, str]:
    """The kernel arguments that isolate ``cpus`` (the housekeeping CPUs get the IRQs)."""
    c = format_cpulist(cpus)
    house = format_cpulist(sorted(set(online) - set(cpus)))
    return {"isolcpus": f"managed_irq,domain,{c}", "nohz_full": c, "rcu_nocbs": c,
            "irqaffinity": house, "skew_tick": "1"}


def grub_commands(args: dict[str, str]) -> list[str]:
    """The one GRUB recipe (audit's fixes and tune's pending-reboot changes both print it):
    exact commands an operator runs to set ``args`` on every installed kernel.

    RHEL/Fedora: grubby, removing any earlier value of each argument first. Debian/Ubuntu:
    GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub (the normal boot entries; the recovery
    entry stays plain, which is what one wants when a box will not come up with nohz_full),
    earlier values of each argument removed first so the command can be run twice, then
    update-grub. The values are CPU lists and flags (digits, ',', '-'), safe inside the
    single-quoted sed script."""
    words = " ".join(f"{k}={v}" for k, v in args.items())
    removed = " ".join(args)
    keys = "|".join(args)
    return [
        f"grubby --update-kernel=ALL --remove-args={shlex.quote(removed)} "
        f"--args={shlex.quote(words)}",
        f"sed -i -E '/^GRUB_CMDLINE_LINUX_DEFAULT=/{{s/ ?\\b({keys})=[^ \"]*//g; "
        f"s/\"$/ {words}\"/}}' /etc/default/grub && update-grub",
        "reboot",
    ]


class BootIsolation(Tunable):
    """CPU isolation at boot (profile ``isolation = true``) for the target CPUs.

    Source: /proc/cmdline (``cat /proc/cmdline``). Never written; ``tune apply`` reports it
    pending-reboot with the commands from :func:`grub_commands`.
    """

    id, family, title, key = "isolation.boot_args", "isolation", "CPU isolation (boot args)", \
        "isolation"
    scope = ""

    def available(self, ctx: TuneContext) -> str | None:
        if not ctx.cpus:
            return "no target CPUs: pass --cpus"
        if sorted(set(ctx.online) - set(ctx.cpus)) == []:
            return "target CPUs cover every online CPU"
        r = cmdline(ctx.host)
        return None if r.ok else f"unsupported: {r.path} {r.reason}"

    def wanted(self, ctx: TuneContext):
        return True if ctx.profile.expected(self.key) is True else None

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        from collectors.system import nr_cpu_ids
        # "N" and "all" in the current boot arguments mean the last possible CPU / every CPU
        self._nr_cpus = nr_cpu_ids(ctx.host, ctx.online)
        return {f"cmdline:{k}": v for k, v in boot_args(ctx.cpus, ctx.online).items()}

    def read_target(self, ctx: TuneContext, target: str) -> str | None:
        r = cmdline(ctx.host)
        return None if not r.ok else r.value.get(target.partition(":")[2])

    def write(self, ctx: TuneContext, target: str, value: str) -> None:
        raise OSError(1, "boot arguments are never applied at runtime")

    _nr_cpus: int | None = None

    def _same(self, key: str, cur: str | None, want: str) -> bool:
        if cur is None:
            return False
        try:
            if key == "skew_tick":
                return cur.strip() == want
            if key in ("isolcpus", "nohz_full", "rcu_nocbs"):
                return (isolation_cpus(cur, self._nr_cpus, param=key)
                        == isolation_cpus(want, self._nr_cpus, param=key))
            return parse_cpulist(cur, self._nr_cpus) == parse_cpulist(want, self._nr_cpus)
        except ValueError:  # the parsers' ParseError: a value the kernel would not take
            return False

    def plan(self, desired: dict[str, str], current: dict[str, str | None]) -> list[Change]:
        missing = {t: v for t, v in desired.items()
                   if not self._same(t.partition(":")[2], current.get(t), v)}
        if not missing:
            return []
        cmds = grub_commands({t.partition(":")[2]: v for t, v in desired.items()})
        return [Change(self.id, t, current.get(t), v, PENDING_REBOOT, detail="; ".join(cmds))
                for t, v in missing.items()]

    def verify(self, ctx: TuneContext, desired: dict[str, str]) -> Finding:
        current = self.read(ctx, desired)
        changes = self.plan(desired, current)
        setting = ctx.profile.get(self.key)
        return Finding(
            id=self.id, family=self.family, title=self.title,
            status=Status.OK if not changes else Status.PENDING_REBOOT,
            current=" ".join(f"{t.partition(':')[2]}={v}" for t, v in current.items() if v)
            or "none",
            expected=" ".join(f"{t.partition(':')[2]}={v}" for t, v in desired.items()),
            evidence="/proc/cmdline", fix=changes[0].detail if changes else "",
            why=setting.why if setting else "")

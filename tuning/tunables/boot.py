"""Boot-time CPU isolation arguments: never applied, printed as exact commands.

isolcpus=, nohz_full=, rcu_nocbs= and irqaffinity= only take effect at boot. Changing the
bootloader configuration is outside what a runtime journal can undo (the journal lives on tmpfs
and a reboot is needed anyway), so these are reported ``pending-reboot`` with the exact grubby
(RHEL, Fedora) and GRUB (Debian, Ubuntu) commands to run.
"""

from __future__ import annotations

import re
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


GRUB_FILE = "/etc/default/grub"

# What grub_commands puts into a shell word and a sed script: kernel parameter names
# (kernel-parameters.txt: letters, digits, '_', '-', '.' as in "rcutree.kthread_prio") and values
# made of CPU lists, flags and numbers. Nothing else can reach a command line.
_KEY = re.compile(r"[a-z][a-z0-9_.-]*")
_VALUE = re.compile(r"[A-Za-z0-9_.,:-]*")


def _checked(args: dict[str, str]) -> dict[str, str]:
    if not args:
        raise ValueError("no boot arguments")
    for k, v in args.items():
        if not _KEY.fullmatch(k) or not _VALUE.fullmatch(v):
            raise ValueError(f"not a boot argument a GRUB command can carry: {k}={v}")
    return args


def _grubby(args: dict[str, str]) -> str:
    words = " ".join(f"{k}={v}" for k, v in args.items())
    return (f"grubby --update-kernel=ALL --remove-args={shlex.quote(' '.join(args))} "
            f"--args={shlex.quote(words)}")


def _grub_guard(grub_file: str) -> str:
    """The test the sed script relies on: GRUB_CMDLINE_LINUX_DEFAULT is one double-quoted
    value (Debian's and Ubuntu's form). Anything else (single quotes, a value continued on
    the next line, no such line) is left to a person rather than edited half-right."""
    return (f"grep -Eq '^GRUB_CMDLINE_LINUX_DEFAULT=\"[^\"]*\"[[:space:]]*$' "
            f"{shlex.quote(grub_file)}")


def _grub_sed(args: dict[str, str], grub_file: str) -> str:
    """sed -i that removes every earlier ``key=value`` of ``args`` from GRUB_CMDLINE_LINUX and
    GRUB_CMDLINE_LINUX_DEFAULT and appends ``args`` once to GRUB_CMDLINE_LINUX_DEFAULT.

    Both lines lose the keys: grub-mkconfig puts GRUB_CMDLINE_LINUX first on the kernel
    command line, and a second ``nohz_full=``/``isolcpus=`` with another mask is ignored by
    the kernel ("Housekeeping: nohz_full= must match isolcpus=", kernel/sched/isolation.c since
    v5.6), so an old value left there would win. A key is matched only after a space or the
    opening quote and before '=', so ``rcu_nocbs`` never touches ``rcu_nocb_poll``."""
    keys = "|".join(re.escape(k) for k in args)
    words = " ".join(f"{k}={v}" for k, v in args.items())
    edit = (f'/^GRUB_CMDLINE_LINUX(_DEFAULT)?=/{{s/([ "])({keys})=[^ "]*/\\1/g; '
            f's/  +/ /g; s/=" +/="/; s/ +"([[:space:]]*)$/"\\1/}}; '
            f'/^GRUB_CMDLINE_LINUX_DEFAULT=/{{s/"([[:space:]]*)$/ {words}"\\1/; s/=" /="/}}')
    return f"sed -i -E '{edit}' {shlex.quote(grub_file)}"


def grub_commands(args: dict[str, str], grub_file: str = GRUB_FILE) -> list[str]:
    """The one GRUB recipe (audit's fixes and tune's pending-reboot changes both print it):
    exact commands an operator runs to set ``args`` on every installed kernel, one line each
    for pasting, the first for RHEL/Fedora, the second for Debian/Ubuntu. Neither reboots:
    the caller says "then reboot" in words.

    RHEL/Fedora: grubby, removing any earlier value of each argument first. Debian/Ubuntu:
    GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub (the normal boot entries; the recovery
    entry stays plain, which is what one wants when a box will not come up with nohz_full),
    earlier values of each argument removed first (from GRUB_CMDLINE_LINUX too) so the
    command can be run twice, then update-grub; a file not in that form is reported and left
    alone. Both are idempotent: each key ends up on the line exactly once. The arguments are
    checked (:data:`_KEY`, :data:`_VALUE`): CPU lists and flags, safe inside the
    single-quoted sed script."""
    args = _checked(dict(args))
    debian = (f"if {_grub_guard(grub_file)}; then {_grub_sed(args, grub_file)} && update-grub; "
              f"else echo {shlex.quote(_grub_form(grub_file))} >&2; false; fi")
    return [_grubby(args), debian]


def _grub_form(grub_file: str) -> str:
    return (f"hftagent: GRUB_CMDLINE_LINUX_DEFAULT in {grub_file} is not one double-quoted "
            "line: set the boot arguments by hand")


def grub_script(args: dict[str, str], grub_file: str = GRUB_FILE) -> list[str]:
    """The same recipe as :func:`grub_commands` for a ``set -e`` script (``audit
    --fix-script``): grubby where it is installed, else /etc/default/grub and update-grub,
    each step its own command so that any failure stops the script."""
    args = _checked(dict(args))
    return [
        "if command -v grubby >/dev/null 2>&1; then",
        f"    {_grubby(args)}",
        "else",
        f"    {_grub_guard(grub_file)} || {{ echo {shlex.quote(_grub_form(grub_file))} >&2; exit 1; }}",
        f"    {_grub_sed(args, grub_file)}",
        "    update-grub",
        "fi",
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
        return [Change(self.id, t, current.get(t), v, PENDING_REBOOT, detail="\n".join(cmds))
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

#!/usr/bin/env bash
# Run on the lent GPU machine (device tool): capture the /proc and /sys files the audit reads,
# plus read-only GPU facts, into $OUT. Changes nothing on the machine.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
PYTHONPATH=$PWD python3 -c "
from pathlib import Path
from collectors.host import Host
from collectors.capture import capture
skipped = capture(Host(), Path('/tmp/gpu-host'))
print('capture: skipped', len(skipped))
"
tar -C /tmp/gpu-host -czf "$out/gpu-host.tar.gz" .
{ uname -a; python3 --version; nvidia-smi; nvidia-smi -q; nvidia-smi topo -m; } > "$out/gpu-facts.txt" 2>&1
python3 - > "$out/nvml-facts.txt" 2>&1 <<'PY'
import pynvml as n
n.nvmlInit()
print("driver", n.nvmlSystemGetDriverVersion(), "cuda", n.nvmlSystemGetCudaDriverVersion_v2())
h = n.nvmlDeviceGetHandleByIndex(0)
for name in ["nvmlDeviceGetName", "nvmlDeviceGetPciInfo", "nvmlDeviceGetPersistenceMode",
             "nvmlDeviceGetComputeMode", "nvmlDeviceGetCurrentClocksEventReasons",
             "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration",
             "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth",
             "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetMigMode", "nvmlDeviceGetNumaNodeId",
             "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetUtilizationRates"]:
    try:
        print(name, getattr(n, name)(h))
    except Exception as e:
        print(name, "ERR", type(e).__name__, e)
for c in (n.NVML_CLOCK_SM, n.NVML_CLOCK_MEM):
    try:
        print("clock", c, n.nvmlDeviceGetClockInfo(h, c), n.nvmlDeviceGetMaxClockInfo(h, c))
    except Exception as e:
        print("clock ERR", e)
PY
pip list 2>/dev/null | grep -iE "torch|cupy|numpy|typer|psutil|prometheus|nvidia-ml|cpuinfo|rich" > "$out/pip.txt"
which numactl taskset ncu nsys perf irqbalance >> "$out/pip.txt" 2>&1
ls -la "$out"

"""GPU workload that reports its own latencies to `hftagent watch` through agent.client.

PyTorch LSTM [1,64,32] -> 128 -> 3 at batch 1 on the GPU, synchronised per inference, paced
open loop at --rate Hz for --seconds. Each inference is wrapped in agent.client's start/end,
so `hftagent watch --probe external --pid PID` attributes this process's slow inferences.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from agent.client import end, ring, start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--rate", type=float, default=500)
    a = ap.parse_args()
    x = torch.randn(1, 64, 32).cuda()
    lstm = torch.nn.LSTM(32, 128, batch_first=True).cuda().eval()
    head = torch.nn.Linear(128, 3).cuda().eval()
    with torch.inference_mode():
        for _ in range(300):  # warm: CUDA context, cuDNN plans
            head(lstm(x)[0][:, -1])
        torch.cuda.synchronize()
        ring()  # create the ring before announcing readiness
        print(f"ready pid {os.getpid()}", flush=True)
        period = 1e9 / a.rate
        t_next = time.monotonic_ns()
        stop = t_next + int(a.seconds * 1e9)
        n = 0
        while t_next < stop:
            while time.monotonic_ns() < t_next:
                pass
            t = start()
            head(lstm(x)[0][:, -1])
            torch.cuda.synchronize()
            end(t)
            n += 1
            t_next += period
    print(f"workload done: {n} inferences", flush=True)


if __name__ == "__main__":
    main()

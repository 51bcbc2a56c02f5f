"""Client-observed latency of an openpi websocket policy server (frt's `serve`, or openpi's
own), measured with the real `openpi-client` over loopback: DROID observations (two images of
the given size, 8 state values, a prompt), N clients at once, each sending requests back to
back. Prints a markdown table: per client count, the round trip p50 / p99 over every client's
requests, the server's reported inference time (`policy_timing.infer_ms`) p50, the server's
whole time for a request (`server_timing.prev_total_ms`: receipt to reply sent) p50, and the
round trip less the inference — what the protocol, the client, the queue and the preprocessing
cost.

    PYTHONPATH=.cache/pip-openpi python3 scripts/openpi-latency.py PORT [--size 224x224]
        [--clients 1,2,4] [--requests 200] [--warmup 10]
"""
import argparse
import threading
import time

import numpy as np
from openpi_client import websocket_client_policy

p = argparse.ArgumentParser()
p.add_argument("port", type=int)
p.add_argument("--size", default="224x224", help="WIDTHxHEIGHT of both images")
p.add_argument("--clients", default="1,2,4")
p.add_argument("--requests", type=int, default=200)
p.add_argument("--warmup", type=int, default=10)
a = p.parse_args()
w, h = (int(x) for x in a.size.split("x"))
rng = np.random.default_rng(0)


def observation():
    return {
        "observation/exterior_image_1_left": rng.integers(256, size=(h, w, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(256, size=(h, w, 3), dtype=np.uint8),
        "observation/joint_position": rng.random(7),
        "observation/gripper_position": rng.random(1),
        "prompt": "pick up the red block",
    }


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


print("| clients | image | round trip p50 / p99 ms | server infer_ms p50 | server total p50 ms | round trip − infer p50 ms |")
print("|---|---|---|---|---|---|")
for n in [int(x) for x in a.clients.split(",")]:
    rtts, infers, totals = [], [], []
    lock = threading.Lock()

    def run():
        c = websocket_client_policy.WebsocketClientPolicy(host="127.0.0.1", port=a.port)
        obs = observation()
        for i in range(a.warmup + a.requests):
            t = time.perf_counter()
            out = c.infer(obs)
            dt = (time.perf_counter() - t) * 1e3
            if i >= a.warmup:
                with lock:
                    rtts.append(dt)
                    infers.append(out["policy_timing"]["infer_ms"])
                    if "prev_total_ms" in out["server_timing"]:
                        totals.append(out["server_timing"]["prev_total_ms"])

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    diff = [r - i for r, i in zip(rtts, infers)]
    print(
        f"| {n} | {w}×{h} | {pct(rtts, 0.5):.2f} / {pct(rtts, 0.99):.2f} | {pct(infers, 0.5):.2f} | {pct(totals, 0.5):.2f} | {pct(diff, 0.5):.2f} |",
        flush=True,
    )

"""Drives frt's openpi websocket server with the real `openpi-client` (PyPI), as openpi's robot
examples do, and prints one JSON line of findings for `openpi_server.rs` to check.

    python3 openpi_peer.py PORT SCENARIO [N]

Scenarios: `droid`, `libero`, `aloha` (metadata, observation layouts and dtypes of that
preset), `errors` (malformed observations, then a new connection), `concurrent` (3 clients
at once), `stalls` (a silent socket, a client that never reads, a client that disconnects
mid-request, beside a normal client), `sequential N` (N requests on one connection),
`oversize` (a message over the server's size limit, then a new connection), `health`
(GET /healthz).
"""
import json
import sys
import threading
import urllib.request

import numpy as np
from openpi_client import websocket_client_policy

port, scenario = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)


def client():
    return websocket_client_policy.WebsocketClientPolicy(host="127.0.0.1", port=port)


def droid(h=224, w=224, float_images=False, chw=False):
    def img():
        x = rng.integers(256, size=(h, w, 3), dtype=np.uint8)
        if float_images:
            x = x.astype(np.float32) / 255.0
        if chw:
            x = np.transpose(x, (2, 0, 1))
        return x

    return {
        "observation/exterior_image_1_left": img(),
        "observation/wrist_image_left": img(),
        "observation/joint_position": rng.random(7),
        "observation/gripper_position": rng.random(1),
        "prompt": "pick up the red block",
    }


def libero():
    return {
        "observation/state": rng.random(8),
        "observation/image": rng.integers(256, size=(224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(256, size=(224, 224, 3), dtype=np.uint8),
        "prompt": "put the bowl on the plate",
    }


def aloha():
    return {
        "state": np.ones((14,)),
        "images": {
            "cam_high": rng.integers(256, size=(3, 224, 224), dtype=np.uint8),
            "cam_low": rng.integers(256, size=(3, 224, 224), dtype=np.uint8),
            "cam_left_wrist": rng.integers(256, size=(3, 224, 224), dtype=np.uint8),
            "cam_right_wrist": rng.integers(256, size=(3, 224, 224), dtype=np.uint8),
        },
        "prompt": "fold the towel",
    }


def summary(out):
    a = out["actions"]
    return {
        "shape": list(a.shape),
        "dtype": str(a.dtype),
        "finite": bool(np.isfinite(a).all()),
        "min": float(a.min()),
        "max": float(a.max()),
        "keys": sorted(out.keys()),
        "server_timing": sorted(out["server_timing"].keys()),
    }


result = {}
if scenario in ("droid", "libero", "aloha"):
    c = client()
    result["metadata"] = c.get_server_metadata()
    make = {"droid": droid, "libero": libero, "aloha": aloha}[scenario]
    result["first"] = summary(c.infer(make()))
    result["second"] = summary(c.infer(make()))
    if scenario == "droid":
        result["vga"] = summary(c.infer(droid(480, 640)))
        result["float_chw"] = summary(c.infer(droid(float_images=True, chw=True)))
        # The same observation twice gives the same actions only if the server is deterministic
        # per request (noise is drawn per request, so they differ); both are valid chunks.
elif scenario == "errors":
    errors = []
    bad = [
        ("missing key", lambda o: o.pop("observation/wrist_image_left")),
        ("short state", lambda o: o.__setitem__("observation/joint_position", np.zeros(5))),
        ("NaN state", lambda o: o.__setitem__("observation/joint_position", np.full(7, np.nan))),
        ("bad image shape", lambda o: o.__setitem__("observation/exterior_image_1_left", np.zeros((224, 224), np.uint8))),
        ("float image out of range", lambda o: o.__setitem__("observation/exterior_image_1_left", np.full((224, 224, 3), 7.0, np.float32))),
        ("prompt not a string", lambda o: o.__setitem__("prompt", 3)),
    ]
    for name, spoil in bad:
        c = client()
        obs = droid()
        spoil(obs)
        try:
            c.infer(obs)
            errors.append({"case": name, "raised": False})
        except RuntimeError as e:
            errors.append({"case": name, "raised": True, "message": str(e)})
        # The server closed that connection; a new one works.
        ok = summary(client().infer(droid()))
        errors[-1]["after"] = ok["shape"]
    result["errors"] = errors
elif scenario == "concurrent":
    shapes, failures = [], []

    def run():
        try:
            c = client()
            for _ in range(3):
                shapes.append(summary(c.infer(droid()))["shape"])
        except Exception as e:  # noqa: BLE001
            failures.append(repr(e))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result["shapes"] = shapes
    result["failures"] = failures
elif scenario == "stalls":
    import socket

    from openpi_client import msgpack_numpy

    silent = socket.create_connection(("127.0.0.1", port))  # sends nothing
    never_reads = client()
    for _ in range(3):
        never_reads._ws.send(msgpack_numpy.packb(droid()))  # noqa: SLF001
    gone = client()
    gone._ws.send(msgpack_numpy.packb(droid()))  # noqa: SLF001
    gone._ws.close()  # noqa: SLF001
    normal = client()
    result["shapes"] = [summary(normal.infer(droid()))["shape"] for _ in range(3)]
    silent.close()
elif scenario == "sequential":
    n = int(sys.argv[3])
    c = client()
    obs = droid()
    ok = 0
    for i in range(n):
        out = c.infer(obs)
        ok += int(out["actions"].shape == (50, 8) and np.isfinite(out["actions"]).all())
        if i == 9:
            # The server process's memory after warm-up, read by the test from here on.
            print(json.dumps({"warm": True}), flush=True)
            sys.stdin.readline()
    result["ok"] = ok
elif scenario == "oversize":
    c = client()
    try:
        c.infer(droid(480, 640))
        result["refused"] = False
    except Exception as e:  # noqa: BLE001 — the connection is closed under the client
        result["refused"] = True
        result["error"] = type(e).__name__
    result["after"] = summary(client().infer(droid()))["shape"]
elif scenario == "health":
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz") as r:
        result["status"] = r.status
        result["body"] = r.read().decode()
print(json.dumps(result), flush=True)

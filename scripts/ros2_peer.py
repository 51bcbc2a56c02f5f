#!/usr/bin/env python3
"""An rclpy peer of the robot host for `scripts/ros2-integration.sh`.

It plays the robot: two cameras (one `sensor_msgs/Image`, one `sensor_msgs/CompressedImage`
PNG) at 30 Hz and `sensor_msgs/JointState` at 100 Hz, stamped now, and listens to everything
the node publishes: `~/action_chunk` (frt_msgs/ActionChunk), the JointTrajectory output,
`~/status`, `/diagnostics` and `/rosout`.

    ros2_peer.py --node /frt_robot_host --checks     # the checks below; exit 1 on a failure
    ros2_peer.py --node /frt_robot_host --feed 60    # only feed the sensors for 60 s

The checks: chunks arrive in order with the configured shape, finite and within the limits;
the trajectory mirrors them; the status and `/diagnostics` come from the node; its log records
reach `/rosout`; `~/set_subgoal` accepts an instruction (and the next chunks carry it) and
refuses an empty one; `~/subgoal` switches it too; `~/interrupt` ends in a halt chunk and no
chunk that moves after it, the status says halted; `~/resume` brings chunks back; a frame of
the wrong size is refused and counted while the node keeps running.
"""
import argparse
import math
import struct
import sys
import time
import zlib

import rclpy
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data, QoSProfile, ReliabilityPolicy, DurabilityPolicy
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import Log
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Empty, String
from trajectory_msgs.msg import JointTrajectory

from frt_msgs.msg import ActionChunk, HostStatus
from frt_msgs.srv import SetSubgoal

JOINTS = ["joint1", "joint2", "joint3", "joint4", "joint5", "joint6", "gripper"]
W, H = 640, 480


def png(width, height, pixel):
    """An RGB PNG of `pixel(x, y) -> (r, g, b)` (zlib only)."""
    rows = bytearray()
    for y in range(height):
        rows.append(0)
        for x in range(width):
            rows.extend(pixel(x, y))

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(bytes(rows), 6)) + chunk(b"IEND", b""))


class Peer(Node):
    def __init__(self, target, chunk_topic, trajectory_topic):
        super().__init__("frt_peer")
        self.target = target.rstrip("/")
        self.logger_name = self.target.strip("/").replace("/", ".")
        self.base = self.create_publisher(Image, "/camera/base/image_raw", qos_profile_sensor_data)
        self.wrist = self.create_publisher(
            CompressedImage, "/camera/wrist/image_raw/compressed", qos_profile_sensor_data)
        self.joints = self.create_publisher(JointState, "/joint_states", qos_profile_sensor_data)
        self.subgoal = self.create_publisher(String, self.target + "/subgoal", 10)
        self.interrupt = self.create_publisher(Empty, self.target + "/interrupt", 10)
        self.resume = self.create_publisher(Empty, self.target + "/resume", 10)
        self.chunks, self.trajectories, self.statuses, self.diagnostics, self.logs = [], [], [], [], []
        self.create_subscription(ActionChunk, chunk_topic, self.chunks.append, 50)
        self.create_subscription(JointTrajectory, trajectory_topic, self.trajectories.append, 50)
        self.create_subscription(HostStatus, self.target + "/status", self.statuses.append, 10)
        self.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append, 10)
        rosout_qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                                durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.create_subscription(Log, "/rosout", self.logs.append, rosout_qos)
        self.set_subgoal = self.create_client(SetSubgoal, self.target + "/set_subgoal")
        self.rgb = b"".join(bytes(((x + y) % 256, (2 * x) % 256, (3 * y) % 256))
                            for y in range(H) for x in range(W))
        self.png = png(320, 240, lambda x, y: (x % 256, y % 256, 128))
        self.bad_frame = False
        self.t0 = time.monotonic()
        self.create_timer(1 / 30, self.cameras)
        self.create_timer(1 / 100, self.state)

    def stamp(self):
        ns = self.get_clock().now().nanoseconds
        return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)

    def cameras(self):
        img = Image(height=H, width=W, encoding="rgb8", is_bigendian=0, step=3 * W)
        img.header.stamp = self.stamp()
        img.header.frame_id = "base_camera"
        img.data = self.rgb[:-3] if self.bad_frame else self.rgb
        self.base.publish(img)
        c = CompressedImage(format="png")
        c.header.stamp = img.header.stamp
        c.header.frame_id = "wrist_camera"
        c.data = self.png
        self.wrist.publish(c)

    def state(self):
        t = time.monotonic() - self.t0
        js = JointState(name=JOINTS, position=[0.1 * math.sin(t + i) for i in range(7)])
        js.header.stamp = self.stamp()
        self.joints.publish(js)


class Checks:
    def __init__(self, peer):
        self.peer, self.passed, self.failed = peer, 0, 0

    def spin(self, seconds, until=None):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            rclpy.spin_once(self.peer, timeout_sec=0.02)
            if until is not None and until():
                return True
        return until() if until is not None else True

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok   {name}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL {name}: {detail}", flush=True)
        return ok

    def call(self, subgoal):
        fut = self.peer.set_subgoal.call_async(SetSubgoal.Request(subgoal=subgoal))
        self.spin(10, fut.done)
        return fut.result() if fut.done() else None

    def run(self, horizon, action_dim, limit):
        p = self.peer
        self.check("~/set_subgoal is served", p.set_subgoal.wait_for_service(timeout_sec=20))
        self.spin(30, lambda: len(p.chunks) >= 5)
        cs = list(p.chunks)
        if not self.check("five chunks within 30 s", len(cs) >= 5, f"{len(cs)} chunks"):
            return
        self.check("chunks in order", all(a.seq < b.seq for a, b in zip(cs, cs[1:])),
                   [c.seq for c in cs])
        shapes = {(c.horizon, c.action_dim, len(c.actions)) for c in cs}
        self.check("chunk shape", shapes == {(horizon, action_dim, horizon * action_dim)}, shapes)
        values = [v for c in cs for v in c.actions]
        self.check("actions finite and within the limits",
                   all(math.isfinite(v) and -limit <= v <= limit for v in values),
                   (min(values), max(values)))
        first = cs[0]
        self.check("first chunk: initial subgoal, not a halt",
                   first.subgoal == "pick up the red block" and not first.halt,
                   (first.subgoal, first.halt))
        self.check("chunk stamped with the observation time", first.header.stamp.sec > 0,
                   first.header.stamp)
        self.spin(5, lambda: p.trajectories and p.statuses and p.diagnostics)
        trs = list(p.trajectories)
        self.check("JointTrajectory published",
                   trs and trs[-1].joint_names == JOINTS and len(trs[-1].points) > 0
                   and all(len(pt.positions) == action_dim for pt in trs[-1].points),
                   trs[-1] if trs else "none")
        self.check("~/status published", bool(p.statuses) and not p.statuses[-1].halted,
                   p.statuses[-1] if p.statuses else "none")
        named = [s for a in p.diagnostics for s in a.status if "frt_robot_host" in s.name]
        self.check("/diagnostics names the node", bool(named),
                   [s.name for a in p.diagnostics for s in a.status][:5])

        r = self.call("open the drawer")
        if self.check("set_subgoal accepted", r is not None and r.accepted, r):
            want = r.subgoal_id
            self.spin(10, lambda: any(c.subgoal_id == want for c in p.chunks))
            got = [c for c in p.chunks if c.subgoal_id == want]
            self.check("chunks carry the service's subgoal and id",
                       got and got[-1].subgoal == "open the drawer", got[-1:] or "none")
        r = self.call("")
        self.check("set_subgoal refuses an empty instruction",
                   r is not None and not r.accepted and r.message != "", r)

        p.subgoal.publish(String(data="wipe the table"))
        self.spin(10, lambda: p.chunks[-1].subgoal == "wipe the table")
        self.check("~/subgoal switches the subgoal", p.chunks[-1].subgoal == "wipe the table",
                   p.chunks[-1].subgoal)

        p.interrupt.publish(Empty())
        self.spin(10, lambda: any(c.halt for c in p.chunks))
        halts = [i for i, c in enumerate(p.chunks) if c.halt]
        if self.check("~/interrupt ends in a halt chunk", bool(halts)):
            self.spin(2)
            after = p.chunks[halts[0] + 1:]
            self.check("no chunk that moves after the halt",
                       all(c.halt for c in after), [(c.seq, c.halt) for c in after])
            self.spin(3, lambda: p.statuses[-1].halted)
            self.check("status says halted", p.statuses[-1].halted)
        n = len(p.chunks)
        p.resume.publish(Empty())
        self.spin(10, lambda: any(not c.halt for c in p.chunks[n:]))
        self.check("~/resume brings moving chunks back",
                   any(not c.halt for c in p.chunks[n:]), len(p.chunks) - n)

        bad_before = p.statuses[-1].bad_frames
        p.bad_frame = True
        self.spin(2)
        p.bad_frame = False
        self.spin(3)
        st = p.statuses[-1]
        self.check("a frame of the wrong size is refused and counted",
                   st.bad_frames > bad_before and "base" in st.last_error,
                   (bad_before, st.bad_frames, st.last_error))
        n = len(p.chunks)
        self.spin(5, lambda: len(p.chunks) > n + 2)
        self.check("the node keeps publishing after refused frames", len(p.chunks) > n + 2)

        self.spin(2)
        mine = [m for m in p.logs if m.name == p.logger_name]
        self.check("the node's log records reach /rosout", bool(mine),
                   sorted({m.name for m in p.logs}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--node", default="/frt_robot_host")
    ap.add_argument("--trajectory", default="/joint_trajectory")
    ap.add_argument("--checks", action="store_true")
    ap.add_argument("--feed", type=float, default=0.0, help="only feed the sensors for SECONDS")
    ap.add_argument("--horizon", type=int, default=50)
    ap.add_argument("--action-dim", type=int, default=7)
    ap.add_argument("--limit", type=float, default=3.0)
    a = ap.parse_args()
    rclpy.init()
    peer = Peer(a.node, a.node.rstrip("/") + "/action_chunk", a.trajectory)
    checks = Checks(peer)
    try:
        if a.feed:
            checks.spin(a.feed)
            return 0
        checks.run(a.horizon, a.action_dim, a.limit)
        print(f"peer: {checks.passed} passed, {checks.failed} failed", flush=True)
        return 1 if checks.failed else 0
    finally:
        peer.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())

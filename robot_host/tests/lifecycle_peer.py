"""The far end of the lifecycle test (tests/lifecycle.rs): a ROS 2 peer on Eclipse Cyclone DDS
driving `frt-robot-host ros --dds -p autostart:=false` through its lifecycle services
(rmw_cyclonedds framing) as `ros2 lifecycle get/set` does, while publishing a camera and
joint states and reading the node's action chunks and `~/transition_event`:

  get_state, get_available_transitions (unconfigured) -> activate (refused) -> configure
  -> get_state -> ~/resume (refused while inactive) -> activate -> chunks -> deactivate
  (a halt chunk) -> ~/resume (refused) -> cleanup -> get_state -> shutdown (the process ends)

Every event is one JSON line on stdout; the Rust test asserts on them. Exits 2 on timeout.

    python lifecycle_peer.py DOMAIN NODE_NAME
"""
import json
import sys
import time

from cyclonedds.core import Policy, Qos
from cyclonedds.domain import DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

from ros_idl import (ActionChunk, CycloneChangeStateRequest, CycloneChangeStateResponse,
                     CycloneGetAvailableTransitionsRequest,
                     CycloneGetAvailableTransitionsResponse, CycloneGetStateRequest,
                     CycloneGetStateResponse, Empty, Header, Image, JointState,
                     LifecycleTransition, Time, TransitionEvent)

GUID = 0x5566778899AABBCC
JOINTS = ["j1", "j2", "j3", "j4", "j5", "j6", "gripper"]
W, H = 64, 48


def emit(**kv):
    print(json.dumps(kv), flush=True)


def main():
    domain, node = int(sys.argv[1]), sys.argv[2]
    dp = DomainParticipant(domain)
    sensor = Qos(Policy.Reliability.BestEffort, Policy.History.KeepLast(5))
    reliable = Qos(Policy.Reliability.Reliable(duration(milliseconds=100)),
                   Policy.History.KeepLast(10))

    def service(name, req, resp):
        return (DataWriter(dp, Topic(dp, f"rq/{node}/{name}Request", req), qos=reliable),
                DataReader(dp, Topic(dp, f"rr/{node}/{name}Reply", resp), qos=reliable))

    change = service("change_state", CycloneChangeStateRequest, CycloneChangeStateResponse)
    get = service("get_state", CycloneGetStateRequest, CycloneGetStateResponse)
    available = service("get_available_transitions", CycloneGetAvailableTransitionsRequest,
                        CycloneGetAvailableTransitionsResponse)
    cam = DataWriter(dp, Topic(dp, "rt/camera/base", Image), qos=sensor)
    joints = DataWriter(dp, Topic(dp, "rt/joint_states", JointState), qos=sensor)
    chunks = DataReader(dp, Topic(dp, f"rt/{node}/action_chunk", ActionChunk), qos=reliable)
    events = DataReader(dp, Topic(dp, f"rt/{node}/transition_event", TransitionEvent),
                        qos=reliable)
    resume = DataWriter(dp, Topic(dp, f"rt/{node}/resume", Empty), qos=reliable)
    t0 = time.time()
    seq = [0]
    counts = {"chunks": 0, "halts": 0}
    kinds = []  # "C" (a chunk) or "H" (a halt chunk), in arrival order

    def pump(seconds):
        """Publishes observations and reports what arrives for `seconds`."""
        end = time.time() + seconds
        k = 0
        while time.time() < end:
            if time.time() - t0 > 120:
                emit(event="timeout")
                sys.exit(2)
            now = time.time()
            h = Header(Time(int(now), int((now % 1) * 1e9)), "camera")
            data = [((i * 7 + k * 31) % 251) for i in range(W * H * 3)]
            cam.write(Image(h, H, W, "rgb8", 0, W * 3, data))
            joints.write(JointState(h, JOINTS, [0.1 * j for j in range(7)], [], []))
            k += 1
            # Writers the node drops (cleanup) show up as invalid samples: skipped.
            for c in chunks.take(16):
                if isinstance(c, ActionChunk):
                    counts["halts" if c.halt else "chunks"] += 1
                    kinds.append("H" if c.halt else "C")
            for e in events.take(16):
                if not isinstance(e, TransitionEvent):
                    continue
                emit(event="transition_event", transition=e.transition.label,
                     start=e.start_state.label, goal=e.goal_state.label)
            time.sleep(0.05)

    def call(svc, make, timeout=90):
        seq[0] += 1
        svc[0].write(make(seq[0]))
        end = time.time() + timeout
        while time.time() < end:
            for r in svc[1].take(4):
                if getattr(r, "sequence", None) == seq[0]:
                    return r
            pump(0.05)
        emit(event="timeout", sequence=seq[0])
        sys.exit(2)

    def state():
        r = call(get, lambda s: CycloneGetStateRequest(GUID, s, 0))
        return r.current_state.label

    def set_(tid, label):
        before = dict(counts)
        r = call(change, lambda s: CycloneChangeStateRequest(GUID, s,
                                                             LifecycleTransition(tid, label)))
        emit(event="change_state", transition=label, success=r.success)
        return before

    pump(1.0)  # discovery
    emit(event="state", state=state())
    r = call(available, lambda s: CycloneGetAvailableTransitionsRequest(GUID, s, 0))
    emit(event="available", transitions=[d.transition.label for d in r.available_transitions])
    set_(3, "activate")
    set_(1, "configure")
    emit(event="state", state=state())
    resume.write(Empty(0))  # refused: only `activate` leaves the inactive state
    pump(1.0)
    emit(event="inactive", chunks=counts["chunks"])
    set_(3, "activate")
    pump(2.0)
    emit(event="active", chunks=counts["chunks"])
    n = len(kinds)
    set_(4, "deactivate")
    pump(0.3)
    resume.write(Empty(0))  # refused again
    pump(0.7)
    emit(event="state", state=state())
    # Chunks published before the node had the request may still arrive before the halt.
    emit(event="deactivated", since="".join(kinds[n:]))
    set_(2, "cleanup")
    emit(event="state", state=state())
    set_(5, "shutdown")
    pump(0.5)
    emit(event="done")


if __name__ == "__main__":
    main()

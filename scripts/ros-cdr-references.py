#!/usr/bin/env python3
"""Reference CDR bytes of every ROS 2 message the robot host exchanges, from an independent
XCDR1 implementation (the `cyclonedds` PyPI package, its Python IDL serializer), for
robot_host/tests/cdr.rs. Development only; the output is committed:

    python3 -m venv /tmp/cdds && /tmp/cdds/bin/pip install cyclonedds==11.0.1
    /tmp/cdds/bin/python scripts/ros-cdr-references.py

Writes robot_host/tests/data/cdr-references.json: per ROS type name, the field values (JSON)
and the serialized message (hex, encapsulation header included).
"""
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "robot_host/tests"))
from ros_idl import *  # noqa: E402,F401,F403

OUT = ROOT / "robot_host/tests/data/cdr-references.json"


H = Header(Time(1_700_000_123, 456_789_000), "base_link")
H0 = Header(Time(0, 0), "")
CASES = {
    "builtin_interfaces/msg/Time": Time(-3, 999_999_999),
    "std_msgs/msg/Header": H,
    "rosgraph_msgs/msg/Clock": Clock(Time(12, 500_000_000)),
    "std_msgs/msg/String": StringMsg("subgoal: wipe the table ✓"),
    "std_msgs/msg/Empty": Empty(0),
    "sensor_msgs/msg/Image": Image(H, 2, 3, "rgb8", 0, 9, list(range(18))),
    "sensor_msgs/msg/CompressedImage": CompressedImage(H, "jpeg", [0xFF, 0xD8, 0xFF, 0xD9, 7]),
    "sensor_msgs/msg/JointState": JointState(H, ["j1", "gripper"], [0.5, -1.25], [], [2.0]),
    "sensor_msgs/msg/JointState#empty": JointState(H0, [], [], [], []),
    "trajectory_msgs/msg/JointTrajectory": JointTrajectory(
        H, ["a", "bb", "ccc"],
        [JointTrajectoryPoint([0.25, 0.5, 0.75], [], [], [], Duration(0, 20_000_000)),
         JointTrajectoryPoint([1.0, 1.5, -2.0], [0.125], [], [], Duration(1, 0))]),
    "diagnostic_msgs/msg/DiagnosticArray": DiagnosticArray(H, [
        DiagnosticStatus(0, "frt_robot_host: control loop", "running", "gpu0",
                         [KeyValue("ticks", "42"), KeyValue("halted", "false")]),
        DiagnosticStatus(2, "frt_robot_host: camera base", "stale", "", [])]),
    "audio_common_msgs/msg/AudioDataStamped#ros_drivers": RdAudioDataStamped(H, RdAudioData([1, 2, 3, 250, 255])),
    "audio_common_msgs/msg/AudioStamped#mgonzs13": MgAudioStamped(H, MgAudio(
        MgAudioData([], [], [-32768, 0, 1, 32767, -2], [], []), MgAudioInfo(8, 1, 16000, 5))),
    "audio_common_msgs/msg/AudioStamped#mgonzs13_float": MgAudioStamped(H, MgAudio(
        MgAudioData([0.5, -0.25, 0.0], [], [], [-1, 2], [9]), MgAudioInfo(1, 2, 48000, 3))),
    "frt_msgs/msg/ActionChunk": ActionChunk(H, 17, 2, 3, [0.5, -0.25, 1.0, 2.0, -3.5, 0.125], 0.02,
                                            "pick up the red block", 3, False, 0.0175, 1, 2),
    "frt_msgs/msg/ActionChunk#halt": ActionChunk(H, 18, 1, 1, [0.0], 0.02, "", 3, True, 0.0001, 0, 15),
    "std_msgs/msg/Float64MultiArray": Float64MultiArray(
        MultiArrayLayout([MultiArrayDimension("joints", 3, 3)], 0), [0.25, -1.5, 1e-3]),
    "frt_msgs/msg/AudioChunk": AudioChunk(H, 16000, 1, [0.0, 0.5, -0.5, 1.0]),
    "frt_msgs/msg/Transcript": Transcript(H, "Stop.", -0.359375, 0.0625, "stop"),
    "frt_msgs/msg/HostStatus": HostStatus(H, True, "open the drawer", 4, 100, 90, 2, 3, 1, 5, 6, 7, 8, 9, 10, 11,
                                          "camera `base`: step 10 is below width × 3 bytes = 12",
                                          [StageLatency("tick", 17.5, 18.25, 90), StageLatency("halt", 0.03125, 0.0625, 2)],
                                          0.125, 9.5, 1, 2, 3, 4, 5,
                                          [InputActivity("camera base", 271, 29.75, 0.0390625, False),
                                           InputActivity("state", 0, 0.0, 1.5, True)]),
    "frt_msgs/srv/SetSubgoal_Request": SetSubgoalRequest("wipe the table"),
    "frt_msgs/srv/SetSubgoal_Response": SetSubgoalResponse(True, 5, ""),
}


def main():
    out = {}
    for name, value in CASES.items():
        out[name] = {"values": asdict(value), "hex": value.serialize().hex()}
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(out)} references to {OUT}")


if __name__ == "__main__":
    main()

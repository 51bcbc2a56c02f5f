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
from dataclasses import dataclass, asdict
from pathlib import Path

import cyclonedds.idl.types as t
from cyclonedds.idl import IdlStruct

OUT = Path(__file__).resolve().parent.parent / "robot_host/tests/data/cdr-references.json"


def dds(name):
    pkg, kind, typ = name.split("/")
    return f"{pkg}::{kind}::dds_::{typ}_"


@dataclass
class Time(IdlStruct, typename=dds("builtin_interfaces/msg/Time")):
    sec: t.int32
    nanosec: t.uint32


@dataclass
class Duration(IdlStruct, typename=dds("builtin_interfaces/msg/Duration")):
    sec: t.int32
    nanosec: t.uint32


@dataclass
class Header(IdlStruct, typename=dds("std_msgs/msg/Header")):
    stamp: Time
    frame_id: str


@dataclass
class StringMsg(IdlStruct, typename=dds("std_msgs/msg/String")):
    data: str


@dataclass
class Empty(IdlStruct, typename=dds("std_msgs/msg/Empty")):
    structure_needs_at_least_one_member: t.uint8


@dataclass
class Image(IdlStruct, typename=dds("sensor_msgs/msg/Image")):
    header: Header
    height: t.uint32
    width: t.uint32
    encoding: str
    is_bigendian: t.uint8
    step: t.uint32
    data: t.sequence[t.uint8]


@dataclass
class CompressedImage(IdlStruct, typename=dds("sensor_msgs/msg/CompressedImage")):
    header: Header
    format: str
    data: t.sequence[t.uint8]


@dataclass
class JointState(IdlStruct, typename=dds("sensor_msgs/msg/JointState")):
    header: Header
    name: t.sequence[str]
    position: t.sequence[t.float64]
    velocity: t.sequence[t.float64]
    effort: t.sequence[t.float64]


@dataclass
class JointTrajectoryPoint(IdlStruct, typename=dds("trajectory_msgs/msg/JointTrajectoryPoint")):
    positions: t.sequence[t.float64]
    velocities: t.sequence[t.float64]
    accelerations: t.sequence[t.float64]
    effort: t.sequence[t.float64]
    time_from_start: Duration


@dataclass
class JointTrajectory(IdlStruct, typename=dds("trajectory_msgs/msg/JointTrajectory")):
    header: Header
    joint_names: t.sequence[str]
    points: t.sequence[JointTrajectoryPoint]


@dataclass
class KeyValue(IdlStruct, typename=dds("diagnostic_msgs/msg/KeyValue")):
    key: str
    value: str


@dataclass
class DiagnosticStatus(IdlStruct, typename=dds("diagnostic_msgs/msg/DiagnosticStatus")):
    level: t.uint8
    name: str
    message: str
    hardware_id: str
    values: t.sequence[KeyValue]


@dataclass
class DiagnosticArray(IdlStruct, typename=dds("diagnostic_msgs/msg/DiagnosticArray")):
    header: Header
    status: t.sequence[DiagnosticStatus]


@dataclass
class RdAudioData(IdlStruct, typename="rd::" + dds("audio_common_msgs/msg/AudioData")):
    data: t.sequence[t.uint8]


@dataclass
class RdAudioDataStamped(IdlStruct, typename="rd::" + dds("audio_common_msgs/msg/AudioDataStamped")):
    header: Header
    audio: RdAudioData


@dataclass
class MgAudioData(IdlStruct, typename="mg::" + dds("audio_common_msgs/msg/AudioData")):
    float32_data: t.sequence[t.float32]
    int32_data: t.sequence[t.int32]
    int16_data: t.sequence[t.int16]
    int8_data: t.sequence[t.int8]
    uint8_data: t.sequence[t.uint8]


@dataclass
class MgAudioInfo(IdlStruct, typename="mg::" + dds("audio_common_msgs/msg/AudioInfo")):
    format: t.int32
    channels: t.int32
    rate: t.int32
    chunk: t.int32


@dataclass
class MgAudio(IdlStruct, typename="mg::" + dds("audio_common_msgs/msg/Audio")):
    audio_data: MgAudioData
    info: MgAudioInfo


@dataclass
class MgAudioStamped(IdlStruct, typename="mg::" + dds("audio_common_msgs/msg/AudioStamped")):
    header: Header
    audio: MgAudio


@dataclass
class ActionChunk(IdlStruct, typename=dds("frt_msgs/msg/ActionChunk")):
    header: Header
    seq: t.uint64
    horizon: t.uint32
    action_dim: t.uint32
    actions: t.sequence[t.float32]
    dt: t.float64
    subgoal: str
    subgoal_id: t.uint64
    halt: bool
    inference_latency: t.float64


@dataclass
class AudioChunk(IdlStruct, typename=dds("frt_msgs/msg/AudioChunk")):
    header: Header
    sample_rate: t.uint32
    channels: t.uint16
    samples: t.sequence[t.float32]


@dataclass
class Transcript(IdlStruct, typename=dds("frt_msgs/msg/Transcript")):
    header: Header
    text: str
    avg_logprob: t.float32
    no_speech_prob: t.float32
    decision: str


@dataclass
class StageLatency(IdlStruct, typename=dds("frt_msgs/msg/StageLatency")):
    name: str
    p50_ms: t.float64
    p99_ms: t.float64
    count: t.uint64


@dataclass
class HostStatus(IdlStruct, typename=dds("frt_msgs/msg/HostStatus")):
    header: Header
    halted: bool
    subgoal: str
    subgoal_id: t.uint64
    ticks: t.uint64
    chunks: t.uint64
    halts: t.uint64
    abandoned: t.uint64
    stale: t.uint64
    bad_frames: t.uint64
    bad_states: t.uint64
    bad_audio: t.uint64
    bad_commands: t.uint64
    non_finite: t.uint64
    deadline_misses: t.uint64
    clamped: t.uint64
    last_error: str
    latency: t.sequence[StageLatency]


@dataclass
class SetSubgoalRequest(IdlStruct, typename=dds("frt_msgs/srv/SetSubgoal_Request")):
    subgoal: str


@dataclass
class SetSubgoalResponse(IdlStruct, typename=dds("frt_msgs/srv/SetSubgoal_Response")):
    accepted: bool
    subgoal_id: t.uint64
    message: str


H = Header(Time(1_700_000_123, 456_789_000), "base_link")
H0 = Header(Time(0, 0), "")
CASES = {
    "builtin_interfaces/msg/Time": Time(-3, 999_999_999),
    "std_msgs/msg/Header": H,
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
                                            "pick up the red block", 3, False, 0.0175),
    "frt_msgs/msg/ActionChunk#halt": ActionChunk(H, 18, 1, 1, [0.0], 0.02, "", 3, True, 0.0001),
    "frt_msgs/msg/AudioChunk": AudioChunk(H, 16000, 1, [0.0, 0.5, -0.5, 1.0]),
    "frt_msgs/msg/Transcript": Transcript(H, "Stop.", -0.359375, 0.0625, "stop"),
    "frt_msgs/msg/HostStatus": HostStatus(H, True, "open the drawer", 4, 100, 90, 2, 3, 1, 5, 6, 7, 8, 9, 10, 11,
                                          "camera `base`: step 10 is below width × 3 bytes = 12",
                                          [StageLatency("tick", 17.5, 18.25, 90), StageLatency("halt", 0.03125, 0.0625, 2)]),
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

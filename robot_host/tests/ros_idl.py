"""The ROS 2 messages the robot host exchanges, as IDL structs of the `cyclonedds` Python
package (an XCDR1 implementation independent of the node's): the DDS type names ROS 2
middlewares register and the fields in `.msg` order. Used by scripts/ros-cdr-references.py
(reference bytes) and tests/dds_peer.py (the wire test's peer).
"""
from dataclasses import dataclass

import cyclonedds.idl.types as t
from cyclonedds.idl import IdlStruct


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
class Clock(IdlStruct, typename=dds("rosgraph_msgs/msg/Clock")):
    clock: Time


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
class MultiArrayDimension(IdlStruct, typename=dds("std_msgs/msg/MultiArrayDimension")):
    label: str
    size: t.uint32
    stride: t.uint32


@dataclass
class MultiArrayLayout(IdlStruct, typename=dds("std_msgs/msg/MultiArrayLayout")):
    dim: t.sequence[MultiArrayDimension]
    data_offset: t.uint32


@dataclass
class Float64MultiArray(IdlStruct, typename=dds("std_msgs/msg/Float64MultiArray")):
    layout: MultiArrayLayout
    data: t.sequence[t.float64]


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
    due_row: t.uint32
    execution_horizon: t.uint32


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
class InputActivity(IdlStruct, typename=dds("frt_msgs/msg/InputActivity")):
    name: str
    count: t.uint64
    rate_hz: t.float64
    age_s: t.float64
    stale: bool


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
    since_tick_s: t.float64
    window_s: t.float64
    recent_stale: t.uint64
    recent_bad_inputs: t.uint64
    recent_deadline_misses: t.uint64
    recent_withheld: t.uint64
    recent_halts: t.uint64
    inputs: t.sequence[InputActivity]


@dataclass
class SetSubgoalRequest(IdlStruct, typename=dds("frt_msgs/srv/SetSubgoal_Request")):
    subgoal: str


@dataclass
class SetSubgoalResponse(IdlStruct, typename=dds("frt_msgs/srv/SetSubgoal_Response")):
    accepted: bool
    subgoal_id: t.uint64
    message: str


# The service as rmw_cyclonedds frames it on the wire: a request header (the client's id and
# the request's sequence number) before the request or response fields, on the topics
# `rq/<service>Request` and `rr/<service>Reply`.
@dataclass
class CycloneSetSubgoalRequest(IdlStruct, typename=dds("frt_msgs/srv/SetSubgoal_Request")):
    client_guid: t.uint64
    sequence: t.int64
    subgoal: str


@dataclass
class CycloneSetSubgoalResponse(IdlStruct, typename=dds("frt_msgs/srv/SetSubgoal_Response")):
    client_guid: t.uint64
    sequence: t.int64
    accepted: bool
    subgoal_id: t.uint64
    message: str


# ROS 2's graph topic `ros_discovery_info` (rmw_dds_common, Jazzy: 16-byte gids): each
# participant lists its nodes and, per node, the gids of its readers and writers.
@dataclass
class Gid(IdlStruct, typename=dds("rmw_dds_common/msg/Gid")):
    data: t.array[t.uint8, 16]


@dataclass
class NodeEntitiesInfo(IdlStruct, typename=dds("rmw_dds_common/msg/NodeEntitiesInfo")):
    node_namespace: str
    node_name: str
    reader_gid_seq: t.sequence[Gid]
    writer_gid_seq: t.sequence[Gid]


@dataclass
class ParticipantEntitiesInfo(IdlStruct, typename=dds("rmw_dds_common/msg/ParticipantEntitiesInfo")):
    gid: Gid
    node_entities_info_seq: t.sequence[NodeEntitiesInfo]


# rcl_interfaces: ROS 2's parameter services, as rmw_cyclonedds frames them (the request
# header first: the client's id and the request's sequence number).
@dataclass
class ParameterValue(IdlStruct, typename=dds("rcl_interfaces/msg/ParameterValue")):
    type: t.uint8
    bool_value: bool
    integer_value: t.int64
    double_value: t.float64
    string_value: str
    byte_array_value: t.sequence[t.uint8]
    bool_array_value: t.sequence[bool]
    integer_array_value: t.sequence[t.int64]
    double_array_value: t.sequence[t.float64]
    string_array_value: t.sequence[str]


@dataclass
class Parameter(IdlStruct, typename=dds("rcl_interfaces/msg/Parameter")):
    name: str
    value: ParameterValue


@dataclass
class SetParametersResult(IdlStruct, typename=dds("rcl_interfaces/msg/SetParametersResult")):
    successful: bool
    reason: str


@dataclass
class FloatingPointRange(IdlStruct, typename=dds("rcl_interfaces/msg/FloatingPointRange")):
    from_value: t.float64
    to_value: t.float64
    step: t.float64


@dataclass
class IntegerRange(IdlStruct, typename=dds("rcl_interfaces/msg/IntegerRange")):
    from_value: t.int64
    to_value: t.int64
    step: t.uint64


@dataclass
class ParameterDescriptor(IdlStruct, typename=dds("rcl_interfaces/msg/ParameterDescriptor")):
    name: str
    type: t.uint8
    description: str
    additional_constraints: str
    read_only: bool
    dynamic_typing: bool
    floating_point_range: t.sequence[FloatingPointRange, 1]
    integer_range: t.sequence[IntegerRange, 1]


@dataclass
class ListParametersResult(IdlStruct, typename=dds("rcl_interfaces/msg/ListParametersResult")):
    names: t.sequence[str]
    prefixes: t.sequence[str]


@dataclass
class CycloneListParametersRequest(IdlStruct,
                                   typename=dds("rcl_interfaces/srv/ListParameters_Request")):
    client_guid: t.uint64
    sequence: t.int64
    prefixes: t.sequence[str]
    depth: t.uint64


@dataclass
class CycloneListParametersResponse(IdlStruct,
                                    typename=dds("rcl_interfaces/srv/ListParameters_Response")):
    client_guid: t.uint64
    sequence: t.int64
    result: ListParametersResult


@dataclass
class CycloneGetParametersRequest(IdlStruct,
                                  typename=dds("rcl_interfaces/srv/GetParameters_Request")):
    client_guid: t.uint64
    sequence: t.int64
    names: t.sequence[str]


@dataclass
class CycloneGetParametersResponse(IdlStruct,
                                   typename=dds("rcl_interfaces/srv/GetParameters_Response")):
    client_guid: t.uint64
    sequence: t.int64
    values: t.sequence[ParameterValue]


@dataclass
class CycloneDescribeParametersRequest(
        IdlStruct, typename=dds("rcl_interfaces/srv/DescribeParameters_Request")):
    client_guid: t.uint64
    sequence: t.int64
    names: t.sequence[str]


@dataclass
class CycloneDescribeParametersResponse(
        IdlStruct, typename=dds("rcl_interfaces/srv/DescribeParameters_Response")):
    client_guid: t.uint64
    sequence: t.int64
    descriptors: t.sequence[ParameterDescriptor]


@dataclass
class CycloneSetParametersRequest(IdlStruct,
                                  typename=dds("rcl_interfaces/srv/SetParameters_Request")):
    client_guid: t.uint64
    sequence: t.int64
    parameters: t.sequence[Parameter]


@dataclass
class CycloneSetParametersResponse(IdlStruct,
                                   typename=dds("rcl_interfaces/srv/SetParameters_Response")):
    client_guid: t.uint64
    sequence: t.int64
    results: t.sequence[SetParametersResult]


@dataclass
class Log(IdlStruct, typename=dds("rcl_interfaces/msg/Log")):
    stamp: Time
    level: t.uint8
    name: str
    msg: str
    file: str
    function: str
    line: t.uint32


# lifecycle_msgs: a managed node's services and transition events (rmw_cyclonedds framing for
# the services).
@dataclass
class LifecycleState(IdlStruct, typename=dds("lifecycle_msgs/msg/State")):
    id: t.uint8
    label: str


@dataclass
class LifecycleTransition(IdlStruct, typename=dds("lifecycle_msgs/msg/Transition")):
    id: t.uint8
    label: str


@dataclass
class TransitionDescription(IdlStruct, typename=dds("lifecycle_msgs/msg/TransitionDescription")):
    transition: LifecycleTransition
    start_state: LifecycleState
    goal_state: LifecycleState


@dataclass
class TransitionEvent(IdlStruct, typename=dds("lifecycle_msgs/msg/TransitionEvent")):
    timestamp: t.uint64
    transition: LifecycleTransition
    start_state: LifecycleState
    goal_state: LifecycleState


@dataclass
class CycloneChangeStateRequest(IdlStruct, typename=dds("lifecycle_msgs/srv/ChangeState_Request")):
    client_guid: t.uint64
    sequence: t.int64
    transition: LifecycleTransition


@dataclass
class CycloneChangeStateResponse(IdlStruct,
                                 typename=dds("lifecycle_msgs/srv/ChangeState_Response")):
    client_guid: t.uint64
    sequence: t.int64
    success: bool


@dataclass
class CycloneGetStateRequest(IdlStruct, typename=dds("lifecycle_msgs/srv/GetState_Request")):
    client_guid: t.uint64
    sequence: t.int64
    structure_needs_at_least_one_member: t.uint8


@dataclass
class CycloneGetStateResponse(IdlStruct, typename=dds("lifecycle_msgs/srv/GetState_Response")):
    client_guid: t.uint64
    sequence: t.int64
    current_state: LifecycleState


@dataclass
class CycloneGetAvailableTransitionsRequest(
        IdlStruct, typename=dds("lifecycle_msgs/srv/GetAvailableTransitions_Request")):
    client_guid: t.uint64
    sequence: t.int64
    structure_needs_at_least_one_member: t.uint8


@dataclass
class CycloneGetAvailableTransitionsResponse(
        IdlStruct, typename=dds("lifecycle_msgs/srv/GetAvailableTransitions_Response")):
    client_guid: t.uint64
    sequence: t.int64
    available_transitions: t.sequence[TransitionDescription]


@dataclass
class ParameterEvent(IdlStruct, typename=dds("rcl_interfaces/msg/ParameterEvent")):
    stamp: Time
    node: str
    new_parameters: t.sequence[Parameter]
    changed_parameters: t.sequence[Parameter]
    deleted_parameters: t.sequence[Parameter]

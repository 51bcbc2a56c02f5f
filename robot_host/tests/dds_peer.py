"""The far end of the DDS wire test (tests/dds_wire.rs): a ROS 2 peer built on Eclipse Cyclone
DDS (the `cyclonedds` PyPI wheel), independent of the node's DDS stack and of its CDR codec.

It publishes camera frames and joint states the way ROS 2 drivers do (topic `rt/<name>`,
type `<pkg>::msg::dds_::<Type>_`), reads `frt_msgs/ActionChunk` and `frt_msgs/HostStatus`,
and drives a timeline from what it receives:

  3 chunks   -> a subgoal on ~/subgoal
  a chunk carrying that subgoal -> two requests to the ~/set_subgoal service (rmw_cyclonedds
               framing): an empty subgoal (to be refused), then a real one
  the replies -> waits for a chunk carrying the accepted subgoal
  that chunk -> a garbage command on ~/command, then ~/interrupt
  the halt chunk -> asks the parameter services (rmw_cyclonedds framing): lists `safety.*`,
               gets three names (one no parameter), describes a live and a read-only one, and
               sets three (the live `safety.action_max`, the read-only `model.precision`, and
               `safety.action_max` with the wrong type); keeps listening for 2 s, then
               reports the graph: the node's readers and
               writers as its participant lists them on `ros_discovery_info`, each named by the
               topic DDS discovery gives for its gid (what `ros2 node info` does); exits 0

All along it reads `/rosout` and reports each record. Every event is one JSON line on stdout; the Rust test asserts on them. Exits 2 on timeout.

    python dds_peer.py DOMAIN NODE_NAMESPACE_AND_NAME
"""
import json
import sys
import time

from cyclonedds.builtin import (BuiltinDataReader, BuiltinTopicDcpsPublication,
                                BuiltinTopicDcpsSubscription)
from cyclonedds.core import Qos, Policy
from cyclonedds.domain import DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

from ros_idl import (ActionChunk, CycloneDescribeParametersRequest,
                     CycloneDescribeParametersResponse, CycloneGetParametersRequest,
                     CycloneGetParametersResponse, CycloneListParametersRequest,
                     CycloneListParametersResponse, CycloneSetParametersRequest,
                     CycloneSetParametersResponse, CycloneSetSubgoalRequest,
                     CycloneSetSubgoalResponse, Empty, Header, HostStatus, Image, JointState, Log,
                     Parameter, ParameterEvent, ParameterValue, ParticipantEntitiesInfo, StringMsg,
                     Time)

SUBGOAL = "wipe the table"
SERVICE_SUBGOAL = "open the drawer"
CLIENT_GUID = 0x1122334455667788
JOINTS = ["j1", "j2", "j3", "j4", "j5", "j6", "gripper"]
W, H = 64, 48


def emit(**kv):
    print(json.dumps(kv), flush=True)


def graph(dp, discovery, publications, subscriptions, node):
    """The node's readers' and writers' topics, from the last `ros_discovery_info` of its
    participant and DDS discovery's endpoints (gid = GUID)."""
    topics = {}
    for reader in (publications, subscriptions):
        for e in reader.take(N=1024):
            topics[bytes(e.key.bytes)] = e.topic_name
    nodes = {}
    for info in discovery.take(N=256):
        for n in info.node_entities_info_seq:
            nodes[(n.node_namespace, n.node_name)] = n
    ns, name = "/" + node.rsplit("/", 1)[0] if "/" in node else "/", node.rsplit("/", 1)[-1]
    n = nodes.get((ns, name))
    if n is None:
        return {"event": "graph", "found": False, "nodes": [f"{a}|{b}" for a, b in nodes]}
    named = lambda gids: [topics.get(bytes(g.data[:16]), "?") for g in gids]
    return {"event": "graph", "found": True, "readers": named(n.reader_gid_seq),
            "writers": named(n.writer_gid_seq)}


def value(**kv):
    """An rcl_interfaces ParameterValue with the given fields set."""
    v = ParameterValue(0, False, 0, 0.0, "", [], [], [], [], [])
    for k, x in kv.items():
        setattr(v, k, x)
    return v


def describe_value(v):
    return {"type": v.type, "integer": v.integer_value, "double": v.double_value,
            "string": v.string_value, "doubles": list(v.double_array_value)}


def main():
    domain, node = int(sys.argv[1]), sys.argv[2].strip("/")
    dp = DomainParticipant(domain)
    sensor = Qos(Policy.Reliability.BestEffort, Policy.History.KeepLast(5))
    reliable = Qos(Policy.Reliability.Reliable(duration(milliseconds=100)),
                   Policy.History.KeepLast(10))

    def writer(name, typ, qos):
        return DataWriter(dp, Topic(dp, "rt/" + name, typ), qos=qos)

    def reader(name, typ):
        return DataReader(dp, Topic(dp, "rt/" + name, typ), qos=reliable)

    cam = writer("camera/base", Image, sensor)
    joints = writer("joint_states", JointState, sensor)
    subgoal = writer(f"{node}/subgoal", StringMsg, reliable)
    command = writer(f"{node}/command", StringMsg, reliable)
    interrupt = writer(f"{node}/interrupt", Empty, reliable)
    chunks = reader(f"{node}/action_chunk", ActionChunk)
    status = reader(f"{node}/status", HostStatus)
    requests = DataWriter(dp, Topic(dp, f"rq/{node}/set_subgoalRequest", CycloneSetSubgoalRequest),
                          qos=reliable)
    replies = DataReader(dp, Topic(dp, f"rr/{node}/set_subgoalReply", CycloneSetSubgoalResponse),
                         qos=reliable)
    accepted_id = None
    discovery = DataReader(dp, Topic(dp, "ros_discovery_info", ParticipantEntitiesInfo),
                           qos=Qos(Policy.Reliability.Reliable(duration(milliseconds=100)),
                                   Policy.Durability.TransientLocal, Policy.History.KeepLast(1)))
    def service(name, req, resp):
        return (DataWriter(dp, Topic(dp, f"rq/{node}/{name}Request", req), qos=reliable),
                DataReader(dp, Topic(dp, f"rr/{node}/{name}Reply", resp), qos=reliable))

    params = {
        "list": service("list_parameters", CycloneListParametersRequest,
                        CycloneListParametersResponse),
        "get": service("get_parameters", CycloneGetParametersRequest,
                       CycloneGetParametersResponse),
        "describe": service("describe_parameters", CycloneDescribeParametersRequest,
                            CycloneDescribeParametersResponse),
        "set": service("set_parameters", CycloneSetParametersRequest,
                       CycloneSetParametersResponse),
    }
    rosout = DataReader(dp, Topic(dp, "rt/rosout", Log), qos=reliable)
    parameter_events = DataReader(dp, Topic(dp, "rt/parameter_events", ParameterEvent),
                                  qos=reliable)
    publications = BuiltinDataReader(dp, BuiltinTopicDcpsPublication)
    subscriptions = BuiltinDataReader(dp, BuiltinTopicDcpsSubscription)

    sent = []
    phase, n_chunks, t_end = 0, 0, None
    t0 = time.time()
    k = 0
    while True:
        now = time.time()
        if now - t0 > 90:
            emit(event="timeout", phase=phase)
            sys.exit(2)
        if t_end is not None and now > t_end:
            print(json.dumps(graph(dp, discovery, publications, subscriptions, node)), flush=True)
            emit(event="done")
            return
        stamp = Time(int(now), int((now % 1) * 1e9))
        sent.append(stamp.sec * 10**9 + stamp.nanosec)
        h = Header(stamp, "camera")
        if k % 2 == 0:
            data = [((i * 7 + k * 31) % 251) for i in range(W * H * 3)]
            cam.write(Image(h, H, W, "rgb8", 0, W * 3, data))
        joints.write(JointState(h, list(reversed(JOINTS)),
                                [0.1 * j + 0.01 * (k % 10) for j in range(7)], [], []))
        k += 1
        for c in chunks.take(16):
            n_chunks += 1
            st = c.header.stamp.sec * 10**9 + c.header.stamp.nanosec
            finite = all(abs(a) < float("inf") and a == a for a in c.actions)
            emit(event="chunk", seq=c.seq, subgoal=c.subgoal, subgoal_id=c.subgoal_id,
                 halt=c.halt, n=len(c.actions), horizon=c.horizon, action_dim=c.action_dim,
                 finite=finite, stamp_error_ns=min(abs(st - x) for x in sent), frame_id=c.header.frame_id,
                 dt=c.dt)
            if phase == 0 and n_chunks >= 3:
                subgoal.write(StringMsg(SUBGOAL))
                emit(event="sent", what="subgoal")
                phase = 1
            elif phase == 1 and c.subgoal == SUBGOAL:
                requests.write(CycloneSetSubgoalRequest(CLIENT_GUID, 1, "   "))
                requests.write(CycloneSetSubgoalRequest(CLIENT_GUID, 2, SERVICE_SUBGOAL))
                emit(event="sent", what="service requests")
                phase = 2
            elif phase == 3 and c.subgoal == SERVICE_SUBGOAL and c.subgoal_id == accepted_id:
                command.write(StringMsg("dance wildly"))
                interrupt.write(Empty(0))
                emit(event="sent", what="interrupt")
                phase = 4
            elif phase == 4 and c.halt:
                g = CLIENT_GUID
                params["list"][0].write(CycloneListParametersRequest(g, 10, ["safety"], 0))
                # Every parameter: a reply longer than one datagram (sent in fragments).
                params["list"][0].write(CycloneListParametersRequest(g, 14, [], 0))
                params["get"][0].write(CycloneGetParametersRequest(
                    g, 11, ["control.rate_hz", "safety.action_max", "nope"]))
                params["describe"][0].write(CycloneDescribeParametersRequest(
                    g, 12, ["safety.action_max", "model.precision"]))
                params["set"][0].write(CycloneSetParametersRequest(g, 13, [
                    Parameter("safety.action_max", value(type=8, double_array_value=[1.5])),
                    Parameter("model.precision", value(type=4, string_value="bf16")),
                    Parameter("safety.action_max", value(type=4, string_value="x")),
                ]))
                emit(event="sent", what="parameters")
                t_end = time.time() + 2.0
                phase = 5
        for r in replies.take(16):
            emit(event="reply", client_guid=r.client_guid, sequence=r.sequence, accepted=r.accepted,
                 subgoal_id=r.subgoal_id, message=r.message)
            if phase == 2 and r.sequence == 2 and r.accepted:
                accepted_id = r.subgoal_id
                phase = 3
        for r in params["list"][1].take(4):
            emit(event="list_parameters", sequence=r.sequence, names=list(r.result.names),
                 prefixes=list(r.result.prefixes))
        for r in params["get"][1].take(4):
            emit(event="get_parameters", values=[describe_value(v) for v in r.values])
        for r in params["describe"][1].take(4):
            emit(event="describe_parameters",
                 descriptors=[{"name": d.name, "type": d.type, "read_only": d.read_only,
                               "description": d.description} for d in r.descriptors])
        for r in params["set"][1].take(4):
            emit(event="set_parameters",
                 results=[{"successful": x.successful, "reason": x.reason} for x in r.results])
        for e in parameter_events.take(16):
            if isinstance(e, ParameterEvent):
                emit(event="parameter_event", node=e.node,
                     changed=[{"name": p.name, "value": describe_value(p.value)}
                              for p in e.changed_parameters])
        for r in rosout.take(64):
            emit(event="rosout", level=r.level, name=r.name, msg=r.msg, file=r.file,
                 line=r.line)
        for s in status.take(16):
            emit(event="status", halted=s.halted, chunks=s.chunks, halts=s.halts,
                 bad_commands=s.bad_commands, bad_frames=s.bad_frames, subgoal=s.subgoal,
                 last_error=s.last_error)
        time.sleep(0.02)


if __name__ == "__main__":
    main()

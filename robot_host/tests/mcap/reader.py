"""Reads a recording of the robot host with the `mcap` and `mcap-ros2-support` packages (an MCAP
reader and a ros2msg/CDR decoder independent of the node's) and prints one JSON object: the
header's profile, per topic its schema, message encoding and count, every message decoded, the
attachments, the metadata, and the action chunks' seq, halt flag and first values. Exits
non-zero when a message does not decode.

usage: reader.py FILE.mcap
"""
import json
import sys

from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory


def main(path):
    out = {"topics": {}, "chunks": [], "attachments": {}, "metadata": {}}
    with open(path, "rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        out["profile"] = reader.get_header().profile
        for schema, channel, message, decoded in reader.iter_decoded_messages(log_time_order=False):
            t = out["topics"].setdefault(
                channel.topic,
                {"schema": schema.name, "schema_encoding": schema.encoding,
                 "message_encoding": channel.message_encoding, "count": 0},
            )
            t["count"] += 1
            if schema.name == "frt_msgs/msg/ActionChunk":
                out["chunks"].append({
                    "seq": decoded.seq, "halt": decoded.halt, "subgoal": decoded.subgoal,
                    "horizon": decoded.horizon, "action_dim": decoded.action_dim,
                    "first": list(decoded.actions[:3]),
                    "stamp": decoded.header.stamp.sec + decoded.header.stamp.nanosec * 1e-9,
                })
        for a in reader.iter_attachments():
            out["attachments"][a.name] = {"media_type": a.media_type, "text": a.data.decode()}
        for m in reader.iter_metadata():
            out["metadata"][m.name] = dict(m.metadata)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])

//! The bytes a DDS reader or writer of the node carries: a message's CDR body, passed
//! through ros2-client's serde CDR unchanged (the node's codec encodes and decodes it).

use bytes::Bytes;

/// A message's CDR body as it crossed the wire (the encapsulation header stripped or added
/// by RustDDS); our codec encodes and decodes it.
///
/// The node's readers and writers are ros2-client's (so that the node announces them in
/// `ros_discovery_info`), which go through serde's CDR: [`Body`] passes through it unchanged.
/// Written as a fixed-length array of bytes (CDR puts no length before an array); read as
/// the whole remaining input, eight bytes at a time, from little-endian CDR only (every
/// ROS 2 middleware on the platforms we target writes it; a big-endian message is refused,
/// never misread).
pub(super) struct Body(pub(super) Bytes);

impl serde::Serialize for Body {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(self.0.len())?;
        for b in self.0.iter() {
            t.serialize_element(b)?;
        }
        t.end()
    }
}

impl<'de> serde::Deserialize<'de> for Body {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Body, D::Error> {
        // RustDDS picks the CDR deserializer's byte order from the encapsulation header; the
        // type says which it picked.
        let little_endian = std::any::type_name::<D>().contains("LittleEndian");
        if !little_endian {
            return Err(serde::de::Error::custom(
                "only little-endian CDR is read (the message is big-endian)",
            ));
        }
        d.deserialize_tuple(usize::MAX, BodyVisitor)
    }
}

struct BodyVisitor;

impl<'de> serde::de::Visitor<'de> for BodyVisitor {
    type Value = Body;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a CDR message body")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Body, A::Error> {
        let mut out = Vec::new();
        // Eight bytes per element while eight remain (aligned: the body starts at offset 0,
        // so no padding is skipped), then one at a time; the end of the input ends each loop.
        while let Ok(Some(w)) = seq.next_element::<u64>() {
            out.extend_from_slice(&w.to_le_bytes());
        }
        while let Ok(Some(b)) = seq.next_element::<u8>() {
            out.push(b);
        }
        Ok(Body(Bytes::from(out)))
    }
}

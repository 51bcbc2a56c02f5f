//! The node's service servers, in the framing of the clients' middleware.
//!
//! For rmw_cyclonedds clients the node serves on its own request reader and reply writer
//! ([`CycloneServer`]), not ros2-client's `Server`, which does two things such clients cannot
//! take:
//! - it attaches the request's identity to every reply as inline QoS, and RustDDS (0.15)
//!   writes that inline QoS one byte off into the fragments of a reply longer than a datagram
//!   (about 1.4 KB), which Cyclone DDS then drops as malformed: `ros2 param list` never got
//!   its answer;
//! - it replies at once, to whatever reply readers are matched: the reply to a client seen
//!   for the first time was sometimes lost (the request carried out, the client waiting).
//!
//! Here the request's identity travels in the payload only (rmw_cyclonedds's 16-byte request
//! header: the client's id and the request's sequence number), and a reply waits, up to
//! [`REPLY_WAIT`], until a reader of the reply topic in the requester's participant has been
//! known for [`MATCH_GRACE`] (rmw_cyclonedds's own servers wait until the client's reply
//! reader is matched; RustDDS tells when a reader is discovered, and matches it to the writer
//! on its own thread shortly after).
//! rmw_fastrtps's framing (the identity in inline QoS) keeps ros2-client's `Server`.

use super::body::Body;
use super::{dds_err, qos};
use crate::error::Result;
use crate::node::Inputs;
use bytes::Bytes;
use ros2_client::dds::rustdds::{
    self, GUID, QosPolicies, TopicKind,
    mio1::{Interest, Poll, Token, event::Source},
};
use ros2_client::{Context, Name, ServiceMapping, ServiceTypeName};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

/// How long a reply waits for the requester's reply reader to be discovered before it is
/// dropped (with a warning); rmw_cyclonedds's servers wait in the same way.
pub(super) const REPLY_WAIT: Duration = Duration::from_secs(2);

/// How long after its discovery a reply reader is taken as matched to the reply writer.
pub(super) const MATCH_GRACE: Duration = Duration::from_millis(100);

/// Reply readers remembered (when first seen discovered); beyond this many the oldest
/// half is forgotten.
const KNOWN_READERS: usize = 256;

/// The length of rmw_cyclonedds's request header: the client's id (u64) and the request's
/// sequence number (i64), little-endian CDR at the start of the body.
const HEADER: usize = 16;

/// A request's identity, for its reply.
#[derive(Clone, Copy, Debug)]
pub(super) enum RequestId {
    Ros2(ros2_client::RmwRequestId),
    Cyclone {
        /// rmw_cyclonedds's header, as the request carried it.
        header: [u8; HEADER],
        /// The request's writer (its prefix: the requester's participant).
        from: GUID,
    },
}

/// A service server in the clients' framing (see the module docs).
pub(super) enum Server<Req, Resp>
where
    Req: ros2_client::Message,
    Resp: ros2_client::Message,
{
    Ros2(ros2_client::Server<Req, Resp>),
    Cyclone(CycloneServer<Req, Resp>),
}

impl<Req, Resp> Server<Req, Resp>
where
    Req: ros2_client::Message + Clone + 'static,
    Resp: ros2_client::Message + 'static,
{
    /// Serves `name` (fully qualified) of type `pkg/srv/ty` in `mapping`'s framing.
    pub(super) fn new(
        node: &mut ros2_client::Node,
        context: &Context,
        mapping: ServiceMapping,
        name: &str,
        (pkg, ty): (&str, &str),
    ) -> Result<Server<Req, Resp>> {
        if mapping == ServiceMapping::Cyclone {
            return Ok(Server::Cyclone(CycloneServer::new(
                node,
                context,
                name,
                (pkg, ty),
            )?));
        }
        let parsed = Name::parse(name).map_err(|e| dds_err(name, e))?;
        let server = node
            .create_server::<Req, Resp>(
                mapping,
                &parsed,
                &ServiceTypeName::new(pkg, ty),
                qos(false),
                qos(false),
            )
            .map_err(|e| dds_err(name, e))?;
        Ok(Server::Ros2(server))
    }

    /// The next request that has arrived, if any; an error for one that does not decode (see
    /// [`Server::next_request`]).
    fn receive_request(&self) -> std::result::Result<Option<(RequestId, Req)>, String> {
        match self {
            Server::Ros2(s) => match s.receive_request() {
                Ok(r) => Ok(r.map(|(id, req)| (RequestId::Ros2(id), req))),
                Err(e) => Err(e.to_string()),
            },
            Server::Cyclone(s) => s.receive_request(),
        }
    }

    /// The next request that decodes, if any: one that does not is taken, logged, counted
    /// as a refused command when `inputs` is given, and skipped (a request behind it is not
    /// left waiting for the next readiness event).
    pub(super) fn next_request(
        &self,
        what: &str,
        inputs: Option<&Inputs>,
    ) -> Option<(RequestId, Req)> {
        loop {
            match self.receive_request() {
                Ok(r) => return r,
                Err(e) => {
                    let why = format!("{what}: {e}");
                    tracing::warn!("request refused: {why}");
                    if let Some(inputs) = inputs {
                        inputs.refuse_message(crate::node::Refusal::Command, &why);
                    }
                }
            }
        }
    }

    /// Sends (or, for a requester whose reply reader is not yet discovered, queues) the
    /// reply to request `id`.
    pub(super) fn send_response(
        &self,
        id: RequestId,
        resp: Resp,
    ) -> std::result::Result<(), String> {
        match (self, id) {
            (Server::Ros2(s), RequestId::Ros2(id)) => {
                s.send_response(id, resp).map_err(|e| format!("{e:?}"))
            }
            (Server::Cyclone(s), RequestId::Cyclone { header, from }) => {
                s.send_response(header, from, &resp)
            }
            _ => Err("a request id of another framing".into()),
        }
    }

    /// Sends the queued replies whose requester's reply reader has been discovered since;
    /// drops those that waited [`REPLY_WAIT`]. Called on every turn of the transport's poll.
    pub(super) fn flush(&self) {
        if let Server::Cyclone(s) = self {
            s.flush();
        }
    }

    /// Registers the server's request reader with `poll` under `token`, or deregisters it.
    pub(super) fn register(&mut self, poll: &Poll, token: Token, on: bool) -> std::io::Result<()> {
        let r = poll.registry();
        let src: &mut dyn Source = match self {
            Server::Ros2(s) => s,
            Server::Cyclone(s) => &mut s.requests,
        };
        if on {
            r.register(src, token, Interest::READABLE)
        } else {
            r.deregister(src)
        }
    }
}

/// A reply waiting for its requester's reply reader.
struct Pending {
    since: Instant,
    from: GUID,
    body: Bytes,
}

/// A service in rmw_cyclonedds's framing on the node's own reader and writer (see the module
/// docs). Both are the node's (`ros_discovery_info` attributes them to it).
pub(super) struct CycloneServer<Req, Resp> {
    requests: ros2_client::Subscription<Body>,
    replies: ros2_client::Publisher<Body>,
    participant: rustdds::DomainParticipant,
    reply_topic: String,
    name: String,
    pending: RefCell<Vec<Pending>>,
    /// Reply readers by when this server first saw them discovered.
    known: RefCell<Vec<(GUID, Instant)>>,
    types: PhantomData<fn(Req) -> Resp>,
}

impl<Req, Resp> CycloneServer<Req, Resp>
where
    Req: ros2_client::Message,
    Resp: ros2_client::Message,
{
    fn new(
        node: &mut ros2_client::Node,
        context: &Context,
        name: &str,
        (pkg, ty): (&str, &str),
    ) -> Result<CycloneServer<Req, Resp>> {
        let participant = context.domain_participant();
        let profile = qos(false);
        let policies = QosPolicies::from(&profile);
        let topic = |dds_name: String, dds_type: String| {
            participant
                .create_topic(dds_name, dds_type, &policies, TopicKind::NoKey)
                .map_err(|e| dds_err(name, e))
        };
        let reply_topic = format!("rr{name}Reply");
        let rq = topic(
            format!("rq{name}Request"),
            format!("{pkg}::srv::dds_::{ty}_Request_"),
        )?;
        let rr = topic(
            reply_topic.clone(),
            format!("{pkg}::srv::dds_::{ty}_Response_"),
        )?;
        let requests = node
            .create_subscription::<Body>(&rq, Some(profile.clone()))
            .map_err(|e| dds_err(name, e))?;
        let replies = node
            .create_publisher::<Body>(&rr, Some(profile))
            .map_err(|e| dds_err(name, e))?;
        Ok(CycloneServer {
            requests,
            replies,
            participant,
            reply_topic,
            name: name.to_string(),
            pending: RefCell::new(Vec::new()),
            known: RefCell::new(Vec::new()),
            types: PhantomData,
        })
    }

    fn receive_request(&self) -> std::result::Result<Option<(RequestId, Req)>, String> {
        let (body, info) = match self.requests.take() {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let b = &body.0;
        if b.len() < HEADER {
            return Err(format!(
                "a request of {} bytes, without rmw_cyclonedds's {HEADER}-byte header",
                b.len()
            ));
        }
        let (req, _) =
            rustdds::cdr_encoding::from_bytes::<Req, byteorder::LittleEndian>(&b[HEADER..])
                .map_err(|e| format!("request: {e}"))?;
        let mut header = [0; HEADER];
        header.copy_from_slice(&b[..HEADER]);
        let from = GUID::from(info.publisher_gid());
        Ok(Some((RequestId::Cyclone { header, from }, req)))
    }

    fn send_response(
        &self,
        header: [u8; HEADER],
        from: GUID,
        resp: &Resp,
    ) -> std::result::Result<(), String> {
        let mut body = header.to_vec();
        body.extend(
            rustdds::cdr_encoding::to_vec::<Resp, byteorder::LittleEndian>(resp)
                .map_err(|e| format!("reply: {e}"))?,
        );
        self.pending.borrow_mut().push(Pending {
            since: Instant::now(),
            from,
            body: Bytes::from(body),
        });
        self.flush();
        Ok(())
    }

    /// The reply readers of this service discovered at least [`MATCH_GRACE`] ago (as far as
    /// this server has seen: from the first time it looked and found each).
    fn matched_readers(&self) -> Vec<GUID> {
        let now = Instant::now();
        let mut known = self.known.borrow_mut();
        let mut matched = Vec::new();
        for d in self.participant.discovered_readers() {
            if *d.subscription_topic_data.topic_name() != self.reply_topic {
                continue;
            }
            let guid = d.reader_proxy.remote_reader_guid;
            let since = match known.iter().find(|(g, _)| *g == guid) {
                Some((_, t)) => *t,
                None => {
                    if known.len() >= KNOWN_READERS {
                        known.drain(..KNOWN_READERS / 2);
                    }
                    known.push((guid, now));
                    now
                }
            };
            if now.duration_since(since) >= MATCH_GRACE {
                matched.push(guid);
            }
        }
        matched
    }

    fn flush(&self) {
        let mut pending = self.pending.borrow_mut();
        if pending.is_empty() {
            return;
        }
        let matched = self.matched_readers();
        pending.retain(|p| {
            // A reader of the reply topic in the requester's participant (the request's
            // writer's prefix).
            if matched.iter().any(|g| g.prefix == p.from.prefix) {
                if let Err(e) = self.replies.publish(Body(p.body.clone())) {
                    tracing::warn!(service = %self.name, "reply not sent: {e}");
                }
                false
            } else if p.since.elapsed() >= REPLY_WAIT {
                tracing::warn!(
                    service = %self.name,
                    "reply dropped: the requester's reply reader was not discovered within {} ms",
                    REPLY_WAIT.as_millis()
                );
                false
            } else {
                true
            }
        });
    }
}

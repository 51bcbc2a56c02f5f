//! `Plan`: a dumb DAG of graph replays across streams.

use crate::error::{Error, Result};
use crate::{Ctx, Event, Graph, ShapeKey, Stream};

/// Index of a node in a [`Plan`].
pub type NodeId = usize;

struct Node {
    graph: Graph,
    key: ShapeKey,
    stream: Stream,
    /// Earlier nodes on other streams this node waits for.
    waits_for: Vec<NodeId>,
    /// Recorded after this node when a node on another stream depends on it.
    done: Option<Event>,
}

/// A static DAG of replays: nodes are `(graph, key, stream)`, edges are data dependencies.
/// No priorities, deadlines or preemption: those are the caller's policy; the caller that
/// needs to act between replays replays graphs itself.
///
/// * Nodes run in the order they were added on each stream; `after(node, dep)` orders a
///   node after an earlier node on another stream through an event (a dependency on the
///   same stream is already implied and needs none).
/// * A dependency on an unknown node, on itself or on a later node is rejected when
///   declared, so a plan can never hold a cycle.
/// * Events are created when dependencies are declared, never by `execute`, which
///   allocates nothing.
/// * `execute(key)` first checks that every node has a variant (nodes added with
///   [`ShapeKey::INHERIT`] use `key`; no variant is ever stored under `INHERIT`, so
///   `execute(INHERIT)` with such a node is [`Error::NoVariant`]), so a missing variant
///   enqueues nothing; then it
///   enqueues every node and returns without waiting. `sync` waits for every stream the
///   plan uses.
pub struct Plan {
    ctx: Ctx,
    nodes: Vec<Node>,
    streams: Vec<Stream>,
}

impl Plan {
    pub fn new(ctx: &Ctx) -> Plan {
        Plan {
            ctx: ctx.clone(),
            nodes: Vec::new(),
            streams: Vec::new(),
        }
    }

    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// Appends a node replaying `graph` at `key` (or [`ShapeKey::INHERIT`]) on `stream`.
    pub fn add(&mut self, graph: &Graph, key: ShapeKey, stream: Stream) -> Result<NodeId> {
        if !graph.ctx().same(&self.ctx) {
            return Err(Error::invalid(
                "Plan::add",
                format!("graph `{}` belongs to another context", graph.name()),
            ));
        }
        self.ctx.stream_priority(stream)?;
        if !self.streams.contains(&stream) {
            self.streams.push(stream);
        }
        self.nodes.push(Node {
            graph: graph.clone(),
            key,
            stream,
            waits_for: Vec::new(),
            done: None,
        });
        Ok(self.nodes.len() - 1)
    }

    /// Declares that `node` runs after `dep` has completed. `dep` must be an earlier node.
    pub fn after(&mut self, node: NodeId, dep: NodeId) -> Result<()> {
        let n = self.nodes.len();
        if node >= n || dep >= n {
            return Err(Error::invalid(
                "Plan::after",
                format!("node {node} or {dep} does not exist ({n} nodes)"),
            ));
        }
        if dep >= node {
            return Err(Error::invalid(
                "Plan::after",
                format!(
                    "node {node} cannot depend on node {dep}: dependencies must be earlier nodes (no cycles)"
                ),
            ));
        }
        if self.nodes[node].stream == self.nodes[dep].stream
            || self.nodes[node].waits_for.contains(&dep)
        {
            return Ok(());
        }
        if self.nodes[dep].done.is_none() {
            self.nodes[dep].done = Some(self.ctx.event()?);
        }
        self.nodes[node].waits_for.push(dep);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The streams the plan's nodes run on.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }

    fn resolve(node: &Node, key: ShapeKey) -> ShapeKey {
        if node.key.is_inherit() { key } else { node.key }
    }

    /// Enqueues the whole DAG once (see the type's docs). Returns without waiting.
    pub fn execute(&self, key: ShapeKey) -> Result<()> {
        for node in &self.nodes {
            // A node that inherits INHERIT finds no variant (none is ever stored under it):
            // NoVariant, as FlashRT's.
            let k = Self::resolve(node, key);
            if !node.graph.has_variant(k) {
                return Err(Error::NoVariant {
                    graph: node.graph.name().to_string(),
                    key: k,
                });
            }
        }
        for node in &self.nodes {
            for &dep in &node.waits_for {
                let ev = self.nodes[dep]
                    .done
                    .as_ref()
                    .expect("created when the dependency was declared");
                self.ctx.stream_wait(node.stream, ev)?;
            }
            node.graph.replay(Self::resolve(node, key), node.stream)?;
            if let Some(ev) = &node.done {
                ev.record(node.stream)?;
            }
        }
        Ok(())
    }

    /// Blocks until every stream the plan uses is idle; reports the first error.
    pub fn sync(&self) -> Result<()> {
        let mut first = Ok(());
        for &s in &self.streams {
            let r = self.ctx.sync_stream(s);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

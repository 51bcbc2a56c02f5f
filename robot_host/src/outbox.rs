//! The node's output channel as its producers see it: bounded, never blocking, and with room
//! kept for halts.
//!
//! Every producer (the control thread, the status, command and speech threads, a fault's
//! halt from the watchdog) queues into one bounded channel that the transport drains. A
//! consumer that falls behind loses messages rather than stall the loop; what does not fit
//! is dropped and counted (`dropped_outputs`). A halt is what must never be lost: everything
//! but a halt leaves the last [`HALT_RESERVE`] slots free, so a stop's halt chunk and its plan
//! still get in when policy chunks, statuses and transcripts have filled the rest (the check
//! and the send are not one step, so producers racing each other can overshoot a limit by
//! at most one message each: a handful, against a reserve of 64).

use crate::messages::Outbound;
use crossbeam_channel::{Receiver, Sender};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Capacity of the channel.
pub const CAPACITY: usize = 1024;

/// The slots only halts (a halt chunk and its plan) may take.
pub const HALT_RESERVE: usize = 64;

/// The most fixed-rate commands the channel may hold: a consumer that stops draining loses
/// commands before it could lose a chunk.
pub const COMMAND_SHARE: usize = CAPACITY / 4;

/// The sending side (cheap to clone; every clone feeds the same channel and counter).
#[derive(Clone)]
pub struct Outbox {
    tx: Sender<Outbound>,
    dropped: Arc<AtomicU64>,
}

impl Outbox {
    /// A channel of [`CAPACITY`] and the receiver the transport drains.
    pub fn new() -> (Outbox, Receiver<Outbound>) {
        let (tx, rx) = crossbeam_channel::bounded(CAPACITY);
        let dropped = Arc::default();
        (Outbox { tx, dropped }, rx)
    }

    /// How many queued messages `o` may find and still be queued.
    fn limit(o: &Outbound) -> usize {
        match o {
            Outbound::Chunk(c) if c.halt => CAPACITY,
            Outbound::Plan(p) if p.halt => CAPACITY,
            Outbound::Command(_) => COMMAND_SHARE,
            _ => CAPACITY - HALT_RESERVE,
        }
    }

    /// Queues `o` without blocking: a halt while any slot is free, a command below its
    /// share, anything else while the reserve stays free. Returns whether it was queued;
    /// what was not is counted.
    pub fn send(&self, o: Outbound) -> bool {
        if self.tx.len() < Self::limit(&o) && self.tx.try_send(o).is_ok() {
            return true;
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Messages dropped so far for want of room.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// A handle that reads the dropped count and holds no sender (the channel still
    /// disconnects once every sender is gone).
    pub fn dropped_count(&self) -> DroppedCount {
        DroppedCount(self.dropped.clone())
    }

    /// Messages queued now.
    pub fn len(&self) -> usize {
        self.tx.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.tx.is_empty()
    }
}

/// The dropped count of an [`Outbox`], apart from its sender.
#[derive(Clone)]
pub struct DroppedCount(Arc<AtomicU64>);

impl DroppedCount {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{ActionChunk, JointCommand, Transcript};

    fn transcript() -> Outbound {
        Outbound::Transcript(Transcript {
            stamp: 0.0,
            text: String::new(),
            avg_logprob: 0.0,
            no_speech_prob: 0.0,
            decision: String::new(),
        })
    }

    fn chunk(halt: bool) -> Outbound {
        Outbound::Chunk(ActionChunk {
            stamp: 0.0,
            seq: 0,
            horizon: 0,
            action_dim: 0,
            actions: Arc::default(),
            dt: 0.02,
            subgoal: Arc::from(""),
            subgoal_id: 0,
            halt,
            latency: 0.0,
            due_row: 0,
            execution_horizon: 0,
        })
    }

    fn command() -> Outbound {
        Outbound::Command(JointCommand {
            stamp: 0.0,
            values: Vec::new(),
            halt: false,
        })
    }

    /// A consumer that stopped draining: policy chunks and transcripts fill the channel up to
    /// the reserve and are counted as dropped past it; commands stop at their share; halt
    /// chunks still get in, up to the channel's capacity.
    #[test]
    fn a_full_channel_keeps_room_for_halts() {
        let (out, rx) = Outbox::new();
        let mut queued = 0;
        for i in 0..2 * CAPACITY {
            let o = if i % 2 == 0 {
                chunk(false)
            } else {
                transcript()
            };
            queued += out.send(o) as usize;
        }
        assert_eq!(queued, CAPACITY - HALT_RESERVE);
        assert_eq!(out.dropped(), (2 * CAPACITY - queued) as u64);
        assert!(!out.send(command()), "a command past its share");
        for _ in 0..HALT_RESERVE {
            assert!(out.send(chunk(true)), "a halt chunk into the reserve");
        }
        assert!(!out.send(chunk(true)), "no slot at all is left");
        assert_eq!(out.len(), CAPACITY);
        // The consumer catches up: the halts are the last messages it sees.
        let seen: Vec<Outbound> = rx.try_iter().collect();
        assert!(
            seen[CAPACITY - HALT_RESERVE..]
                .iter()
                .all(|o| matches!(o, Outbound::Chunk(c) if c.halt))
        );
        // Drained, everything gets in again.
        assert!(out.send(transcript()) && out.send(command()));
    }
}

//! Event subscriptions that lose nothing.
//!
//! A subscription first replays the journal after the client's `after_seq`,
//! page by page, then follows live events. It subscribes to the live bus
//! *before* reading the journal, so an event committed during the replay is
//! either in the replay or on the bus; duplicates are dropped by seq. If the
//! live feed skips a seq (the subscriber lagged, or two commits published out
//! of order) the gap is read back from the store. So the stream a client sees
//! is exactly the journal, in order, with no holes.

use std::collections::VecDeque;
use std::sync::Arc;

use keel_protocol::Event;
use keel_store::Store;
use tokio::sync::broadcast;

use crate::error::Result;

/// What flows on a session's live bus.
#[derive(Debug, Clone)]
pub enum BusMessage {
    /// A committed journal event.
    Event(Event),
    /// Streamed model text: live only, never journaled or replayed.
    Delta { turn_id: String, text: String },
}

/// Journal page size when replaying.
const PAGE: u32 = 500;

/// An ordered, gap-free stream of one session's events.
pub struct EventStream {
    store: Arc<dyn Store>,
    session_id: String,
    last_seq: u64,
    live: broadcast::Receiver<BusMessage>,
    backlog: VecDeque<Event>,
    catching_up: bool,
}

impl EventStream {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        session_id: String,
        after_seq: u64,
        live: broadcast::Receiver<BusMessage>,
    ) -> EventStream {
        EventStream { store, session_id, last_seq: after_seq, live, backlog: VecDeque::new(), catching_up: true }
    }

    /// The seq of the last event returned.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    async fn fill_from_store(&mut self) -> Result<bool> {
        let page = self.store.events(self.session_id.clone(), self.last_seq, PAGE).await?;
        let full = page.len() as u32 == PAGE;
        self.backlog.extend(page);
        Ok(full)
    }

    fn take_backlog(&mut self) -> Option<Event> {
        while let Some(event) = self.backlog.pop_front() {
            if event.seq > self.last_seq {
                self.last_seq = event.seq;
                return Some(event);
            }
        }
        None
    }

    /// The next event or delta; `None` when the runtime shut down.
    pub async fn next(&mut self) -> Result<Option<BusMessage>> {
        loop {
            if let Some(event) = self.take_backlog() {
                return Ok(Some(BusMessage::Event(event)));
            }
            if self.catching_up {
                self.catching_up = self.fill_from_store().await?;
                if !self.backlog.is_empty() {
                    continue;
                }
            }
            match self.live.recv().await {
                Ok(BusMessage::Event(event)) => {
                    if event.seq <= self.last_seq {
                        continue;
                    }
                    if event.seq == self.last_seq + 1 {
                        self.last_seq = event.seq;
                        return Ok(Some(BusMessage::Event(event)));
                    }
                    // A hole: read it back from the journal.
                    self.catching_up = true;
                }
                Ok(delta @ BusMessage::Delta { .. }) => return Ok(Some(delta)),
                Err(broadcast::error::RecvError::Lagged(_)) => self.catching_up = true,
                Err(broadcast::error::RecvError::Closed) => return Ok(None),
            }
        }
    }
}

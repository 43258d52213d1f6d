//! The overlay links' receiving halves, polled by the driver's loop itself.
//!
//! Every overlay link (parent and children, whatever it runs on) is one entry; the loop polls the set like any
//! other input ([`LinkSet::poll_next`]) and gets the next event of any link, tagged with the link's peer and
//! connection number. Each entry has its own waker, so a pass polls only the links that were woken (a child's
//! reader task queued a message, a QP completion arrived), not all of them: a router with hundreds of children
//! pays for the links that have something. A link whose receiving half wakes itself at once (the verbs link's
//! busy polling, `rdma_link.rs`) is polled again in the loop's next pass, after the runtime's other ready
//! tasks; one pass polls each woken link at most once, so such a link never keeps the loop from its other
//! inputs.
//!
//! Why the loop and not a task per link: a message then goes from the transport to the broker with no hand-off
//! between tasks (a TCP link's reader task wakes the loop directly; a verbs link's message is taken from the
//! completion queue by the loop), which is what busy polling exists for and saves a wake-up on every link.

use super::core::Peer;
use super::driver::Event;
use super::transport::{LinkEvent, LinkRx};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// The receiving halves of the overlay links, each tagged with its peer and connection number.
#[derive(Default)]
pub(crate) struct LinkSet {
    entries: HashMap<u64, Entry>,
    next_key: u64,
    /// Entries to poll: woken since they were last polled, or with more to give.
    due: VecDeque<u64>,
    shared: Arc<Shared>,
}

struct Entry {
    peer: Peer,
    conn: u64,
    rx: LinkRx,
    wake: Arc<EntryWake>,
    waker: Waker,
}

/// What the entries' wakers share with the set: the entries woken, and the task polling the set.
#[derive(Default)]
struct Shared {
    state: Mutex<WokenState>,
}

#[derive(Default)]
struct WokenState {
    woken: Vec<u64>,
    task: Option<Waker>,
}

/// An entry's waker: queues the entry (once until it is polled) and wakes the task polling the set.
struct EntryWake {
    key: u64,
    queued: AtomicBool,
    shared: Arc<Shared>,
}

impl Wake for EntryWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let task = {
            let mut s = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            s.woken.push(self.key);
            s.task.clone()
        };
        if let Some(t) = task {
            t.wake();
        }
    }
}

impl LinkSet {
    /// Poll `rx` from now on, its events tagged `peer` and `conn`; it is polled at the next pass.
    pub(crate) fn insert(&mut self, peer: Peer, conn: u64, rx: LinkRx) {
        let key = self.next_key;
        self.next_key += 1;
        let wake = Arc::new(EntryWake { key, queued: AtomicBool::new(true), shared: self.shared.clone() });
        let waker = Waker::from(wake.clone());
        self.entries.insert(key, Entry { peer, conn, rx, wake, waker });
        self.due.push_back(key);
    }

    /// The next event of any link, as the driver's loop takes it: a message ([`Event::Peer`]), or the link's
    /// end ([`Event::PeerClosed`], after which the link leaves the set). A link whose receiving half ends
    /// without saying why gives "link dropped". `Pending` once every link woken has been polled once.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        {
            let mut s = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            if !s.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                s.task = Some(cx.waker().clone());
            }
        }
        match self.next_ready(None) {
            Some(e) => Poll::Ready(e),
            None => Poll::Pending,
        }
    }

    /// The next event that is there now, without waiting (for the loop's group commit, and to let a peer's
    /// queued messages pass before a kernel's verdict on its connection): from `peer`'s links only if given.
    pub(crate) fn try_next(&mut self, peer: Option<Peer>) -> Option<Event> {
        self.next_ready(peer)
    }

    /// Poll each due entry (of `only`, if given) once, in the order they were woken, until one has an event.
    fn next_ready(&mut self, only: Option<Peer>) -> Option<Event> {
        {
            let mut s = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            self.due.extend(s.woken.drain(..));
        }
        let mut skipped = Vec::new();
        let mut found = None;
        // Each entry due at the start is polled at most once: one that wakes itself while polled (busy polling)
        // is due again in the next pass, not this one.
        for _ in 0..self.due.len() {
            let Some(key) = self.due.pop_front() else { break };
            let Some(e) = self.entries.get_mut(&key) else { continue };
            if only.is_some_and(|p| p != e.peer) {
                skipped.push(key);
                continue;
            }
            e.wake.queued.store(false, Ordering::Release);
            let mut cx = Context::from_waker(&e.waker);
            match e.rx.poll_recv(&mut cx) {
                Poll::Pending => {}
                Poll::Ready(Some(LinkEvent::Message(m))) => {
                    // Maybe more where this came from: a receiver that was ready registered no waker.
                    if !e.wake.queued.swap(true, Ordering::AcqRel) {
                        self.due.push_back(key);
                    }
                    found = Some(Event::Peer(e.peer, e.conn, m));
                    break;
                }
                Poll::Ready(Some(LinkEvent::Closed(why))) => {
                    found = Some(Event::PeerClosed(e.peer, e.conn, why));
                    self.entries.remove(&key);
                    break;
                }
                Poll::Ready(None) => {
                    found = Some(Event::PeerClosed(e.peer, e.conn, "link dropped".into()));
                    self.entries.remove(&key);
                    break;
                }
            }
        }
        for k in skipped.into_iter().rev() {
            self.due.push_front(k);
        }
        found
    }

    /// Number of links in the set.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::transport::mem_pair;
    use crate::message::Message;
    use serde_json::json;

    async fn next(set: &mut LinkSet) -> Event {
        let f = std::future::poll_fn(|cx| set.poll_next(cx));
        tokio::time::timeout(std::time::Duration::from_secs(5), f).await.expect("an event in time")
    }

    #[tokio::test]
    async fn events_of_every_link_tagged_in_order_then_its_end() {
        let mut set = LinkSet::default();
        let (a_far, a) = mem_pair("child 1", "parent");
        let (b_far, b) = mem_pair("child 2", "parent");
        set.insert(Peer::Child(1), 7, a.rx);
        set.insert(Peer::Child(2), 9, b.rx);
        for i in 0..3u32 {
            a_far.tx.send(Message::request("t.a", 0, &json!({"i": i}))).unwrap();
        }
        b_far.tx.send(Message::request("t.b", 0, &json!({}))).unwrap();
        let mut a_seen = Vec::new();
        let mut b_seen = 0;
        for _ in 0..4 {
            match next(&mut set).await {
                Event::Peer(Peer::Child(1), 7, m) => a_seen.push(m.json()["i"].as_u64().unwrap()),
                Event::Peer(Peer::Child(2), 9, m) => {
                    assert_eq!(m.topic, "t.b");
                    b_seen += 1;
                }
                _ => panic!("unexpected event"),
            }
        }
        assert_eq!((a_seen, b_seen), (vec![0, 1, 2], 1));
        drop(a_far);
        assert!(
            matches!(next(&mut set).await, Event::PeerClosed(Peer::Child(1), 7, why) if why == "connection closed")
        );
        assert_eq!(set.len(), 1);
        // Nothing more: the set waits (and a message sent later wakes it).
        let waiting =
            tokio::time::timeout(std::time::Duration::from_millis(50), std::future::poll_fn(|cx| set.poll_next(cx)));
        assert!(waiting.await.is_err());
        b_far.tx.send(Message::request("t.b", 0, &json!({}))).unwrap();
        assert!(matches!(next(&mut set).await, Event::Peer(Peer::Child(2), 9, _)));
    }

    #[tokio::test]
    async fn try_next_takes_one_peers_queued_messages_first() {
        let mut set = LinkSet::default();
        let (a_far, a) = mem_pair("child 1", "parent");
        let (b_far, b) = mem_pair("child 2", "parent");
        set.insert(Peer::Child(1), 1, a.rx);
        set.insert(Peer::Child(2), 2, b.rx);
        b_far.tx.send(Message::control("goodbye", &json!({}))).unwrap();
        a_far.tx.send(Message::control("hb", &json!({}))).unwrap();
        assert!(
            matches!(set.try_next(Some(Peer::Child(2))), Some(Event::Peer(Peer::Child(2), 2, m)) if m.topic == "goodbye")
        );
        assert!(set.try_next(Some(Peer::Child(2))).is_none());
        // Child 1's message is still there for the next pass.
        assert!(matches!(next(&mut set).await, Event::Peer(Peer::Child(1), 1, m) if m.topic == "hb"));
    }

    /// A receiving half that wakes itself at once, as a busy-polling verbs link does: polled once per pass,
    /// and the other links are still served.
    #[tokio::test]
    async fn a_self_waking_link_is_polled_once_per_pass_and_starves_nobody() {
        #[derive(Debug)]
        struct Spinner(Arc<std::sync::atomic::AtomicU32>);
        impl crate::broker::transport::LinkRecv for Spinner {
            fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<LinkEvent>> {
                self.0.fetch_add(1, Ordering::Relaxed);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
        let polls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut set = LinkSet::default();
        set.insert(Peer::Parent, 0, LinkRx::new(Spinner(polls.clone())));
        let (far, near) = mem_pair("child", "parent");
        set.insert(Peer::Child(3), 1, near.rx);
        // One pass: the spinner is polled once, then the set says Pending (and has asked to be polled again).
        let waker = Waker::from(Arc::new(Flag::default()));
        assert!(set.poll_next(&mut Context::from_waker(&waker)).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 1);
        far.tx.send(Message::control("hb", &json!({}))).unwrap();
        assert!(matches!(next(&mut set).await, Event::Peer(Peer::Child(3), 1, _)));
        assert!(polls.load(Ordering::Relaxed) >= 2, "the spinner keeps being polled");
    }

    #[derive(Default)]
    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

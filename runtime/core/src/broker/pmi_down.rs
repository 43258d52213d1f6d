//! A PMI exchange's answer goes down the TBON once per link, not once per shell from rank 0.
//!
//! Rank 0 holds every shell's `job-exec.pmi-barrier` request of a job until the exchange is complete
//! (`Broker::pmi_barrier_complete`), then answers them all with the same payload, the union of their puts (up to
//! 63 MiB, `PMI_EXCHANGE_MAX` in `services/job_exec.rs`). Answered one response per shell, N shells cost rank 0
//! N copies of the union. Instead the answer travels as one `rexec.pmi-answer` request per child link: its
//! payload names the requests answered below that link, each by matchtag, userid and the rest of its route stack
//! (as a response would have carried them), and carries the answer once. Each broker on the way
//! ([`Broker::pmi_answer_down`]) answers those of its own local clients (its node's shell), forgets those it had
//! sent up (as a response from its parent would: no stale EHOSTUNREACH if its parent is lost later), and sends
//! one `rexec.pmi-answer` to each child with requests below it. Rank 0 sends at most one copy per child (the
//! TBON's fanout), every router one per child of its own that has shells of the job below it.
//!
//! Loss is handled as for the responses it replaces: a request whose next hop is a link that is down is dropped
//! here, and the broker that sent it up through the lost rank answers it with EHOSTUNREACH
//! (`Broker::fail_sent_up`), so no shell waits for an answer that cannot come.
//!
//! Wire form of a `rexec.pmi-answer` payload: one line of JSON, `{"to": [[matchtag, userid, [route...]], ...]}`,
//! a newline, then the answer's JSON bytes verbatim (never parsed on the way, so a router copies but does not
//! decode the union). Compact JSON holds no raw newline, so the first one ends the header.

use super::core::{Broker, Effect, Peer, PARENT};
use crate::message::{Message, FLAG_NORESPONSE, MAX_FRAME, MAX_ROUTE, ROUTE_LOCAL};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tracing::debug;

/// The topic of the answer's hop down one link (served on every rank, `services/rexec.rs`).
pub const TOPIC: &str = "rexec.pmi-answer";

/// The topic of the requests it answers.
const ANSWERS: &str = "job-exec.pmi-barrier";

/// Room kept in a frame for a `rexec.pmi-answer`'s header, topic and route, beyond its payload: a hop whose
/// payload would not fit [`MAX_FRAME`] with this much left is answered one response per request instead.
const FRAME_SLACK: usize = 4096;

/// A request the answer is for: `(matchtag, userid, route)`, the route stack as a response to it would carry it
/// when it reaches this broker (its last entry is the next hop: a child rank, or `ROUTE_LOCAL | connection`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipient(pub u32, pub u32, pub Vec<u32>);

/// The header line of a `rexec.pmi-answer` payload.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    /// The requests answered below the link it came down.
    to: Vec<Recipient>,
}

/// A `rexec.pmi-answer` payload: the header line for `to`, a newline, `answer`.
pub fn encode(to: &[Recipient], answer: &[u8]) -> Vec<u8> {
    let mut p = serde_json::to_vec(&Header { to: to.to_vec() }).unwrap_or_default();
    p.reserve(1 + answer.len());
    p.push(b'\n');
    p.extend_from_slice(answer);
    p
}

/// Split a `rexec.pmi-answer` payload into its recipients and the answer bytes. Errors name what is wrong: no
/// header line, a header that is not `{"to": [[matchtag, userid, [route...]], ...]}`, a recipient with an empty
/// route or one deeper than [`MAX_ROUTE`].
pub fn decode(payload: &[u8]) -> Result<(Vec<Recipient>, &[u8]), String> {
    let nl = payload.iter().position(|&b| b == b'\n').ok_or("payload: no header line ending in a newline")?;
    let header: Header = serde_json::from_slice(&payload[..nl])
        .map_err(|e| format!("header: not {{\"to\": [[matchtag, userid, [route]]]}}: {e}"))?;
    if let Some(r) = header.to.iter().find(|r| r.2.is_empty() || r.2.len() > MAX_ROUTE) {
        return Err(format!("to: matchtag {}: a route of {} entries (1 to {MAX_ROUTE})", r.0, r.2.len()));
    }
    Ok((header.to, &payload[nl + 1..]))
}

impl Broker {
    /// Answer each request of `to` with `answer` (a `job-exec.pmi-barrier` response's JSON payload): its own
    /// local clients' at once, the others with one `rexec.pmi-answer` per child link they go down. A request sent
    /// up from here is no longer in flight. One whose next hop is neither (its link down, or up to the parent) is
    /// answered as a response would be, which drops it when the link is down.
    pub fn pmi_answer_down(&mut self, to: Vec<Recipient>, answer: &[u8]) {
        let mut down: BTreeMap<u32, Vec<Recipient>> = BTreeMap::new();
        for Recipient(tag, uid, mut route) in to {
            self.answered_route(PARENT, tag, &route, 0);
            match route.last().copied() {
                Some(c) if c & ROUTE_LOCAL == 0 && self.children.contains_key(&c) => {
                    route.pop();
                    down.entry(c).or_default().push(Recipient(tag, uid, route));
                }
                _ => self.route_response(response(tag, uid, route, answer)),
            }
        }
        for (c, to) in down {
            let payload = encode(&to, answer);
            if payload.len() + FRAME_SLACK > MAX_FRAME as usize {
                // Too many requests below one link to list beside the answer in one frame: one response each.
                debug!("PMI answer for {} requests below rank {c}: one response each", to.len());
                for Recipient(tag, uid, mut route) in to {
                    route.push(c);
                    self.route_response(response(tag, uid, route, answer));
                }
                continue;
            }
            let mut m = Message::request_json(TOPIC, c, payload);
            m.flags = FLAG_NORESPONSE;
            m.userid = self.env.uid;
            self.effect(Effect::Send(Peer::Child(c), m));
        }
    }
}

/// A successful `job-exec.pmi-barrier` response carrying `answer`, to the request `(tag, uid, route)`.
fn response(tag: u32, uid: u32, route: Vec<u32>, answer: &[u8]) -> Message {
    let mut req = Message::request_json(ANSWERS, 0, Vec::new());
    (req.matchtag, req.userid, req.route) = (tag, uid, route);
    req.into_response(answer.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_is_a_header_line_then_the_answer_verbatim() {
        let to = vec![Recipient(7, 1000, vec![ROUTE_LOCAL | 3, 5]), Recipient(8, 1000, vec![ROUTE_LOCAL | 4])];
        let answer = br#"{"kvs":{"a":"b\nc"}}"#;
        let p = encode(&to, answer);
        assert_eq!(decode(&p), Ok((to, &answer[..])));
        for (bad, why) in [
            (&b"{\"to\": []}"[..], "no header line"),
            (b"[1]\n{}", "header"),
            (b"{\"to\": [[1, 2]]}\n{}", "header"),
            (b"{\"to\": [[1, 2, []]]}\n{}", "matchtag 1: a route of 0 entries"),
        ] {
            let e = decode(bad).expect_err("refused");
            assert!(e.contains(why), "{e}");
        }
        let deep = encode(&[Recipient(9, 0, vec![1; MAX_ROUTE + 1])], b"{}");
        assert!(decode(&deep).expect_err("too deep").contains("65 entries"));
    }
}

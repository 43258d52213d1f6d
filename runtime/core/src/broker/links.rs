//! What each overlay link runs on (TCP, RDMA verbs, libfabric), as the broker records and reports it: a child
//! reports its parent link to rank 0 (`overlay.transport`), `overlay.status` and `vigil uptime` show it. Choosing
//! and setting up the link is the driver's (`rdma_link.rs`, `ofi_link.rs` in `vigil`).

use crate::message::Message;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// What one overlay link runs on, for logs and status.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LinkChoice {
    /// "rdma", "ofi" or "tcp".
    pub transport: &'static str,
    /// For rdma: the device, port and GID; for tcp: why not rdma.
    pub detail: String,
}

impl LinkChoice {
    /// A TCP link, and why it is not a faster one.
    pub fn tcp(why: impl Into<String>) -> LinkChoice {
        LinkChoice { transport: "tcp", detail: why.into() }
    }
    /// For logs: "rdma on DEVICE port P gid ...", "ofi (provider ...)", "tcp (why not the others)".
    pub fn describe(&self) -> String {
        match self.transport {
            "rdma" => format!("rdma on {}", self.detail),
            t => format!("{t} ({})", self.detail),
        }
    }
    /// `{"transport", "detail"}`, as `overlay.status` shows it.
    pub fn to_json(&self) -> Value {
        json!({"transport": self.transport, "detail": self.detail})
    }
}

/// Per-broker record of link choices.
#[derive(Debug, Default)]
pub struct Links {
    /// This broker's link to its parent.
    pub parent: Option<LinkChoice>,
    /// Rank 0: every rank's link to its parent, as reported with `overlay.transport`.
    pub by_rank: BTreeMap<u32, LinkChoice>,
}

impl Links {
    /// One line for `vigil uptime` / `overlay status`: "rdma" (or "ofi"), "tcp (fallback: why)", "mixed (rdma N,
    /// ofi N, tcp M: why)", or "tcp" for a single broker.
    pub fn summary(&self) -> String {
        let mut all: Vec<&LinkChoice> = self.by_rank.values().collect();
        if all.is_empty() {
            all.extend(self.parent.as_ref());
        }
        let count = |t: &str| all.iter().filter(|c| c.transport == t).count();
        let fast: Vec<(&str, usize)> =
            ["rdma", "ofi"].into_iter().map(|t| (t, count(t))).filter(|(_, n)| *n > 0).collect();
        let first_tcp = all.iter().find(|c| c.transport == "tcp");
        match (fast.as_slice(), first_tcp) {
            ([], None) => "tcp".into(),
            ([(t, _)], None) => (*t).into(),
            ([], Some(t)) => format!("tcp (fallback: {})", t.detail),
            (f, t) => {
                let mut parts: Vec<String> = f.iter().map(|(t, n)| format!("{t} {n}")).collect();
                if let Some(t) = t {
                    parts.push(format!("tcp {}: {}", count("tcp"), t.detail));
                }
                format!("mixed ({})", parts.join(", "))
            }
        }
    }

    /// Rank 0's view of `rank`'s parent link, for `overlay.status` rows.
    pub fn of_rank(&self, rank: u32) -> Value {
        self.by_rank.get(&rank).map(LinkChoice::to_json).unwrap_or(Value::Null)
    }

    /// Record an `overlay.transport` report (rank 0).
    pub fn on_report(&mut self, body: &Value) -> Result<(), String> {
        let rank = body.get("rank").and_then(Value::as_u64).ok_or("missing rank")? as u32;
        let transport = match body.get("transport").and_then(Value::as_str) {
            Some("rdma") => "rdma",
            Some("ofi") => "ofi",
            Some("tcp") => "tcp",
            _ => return Err("transport must be rdma, ofi or tcp".into()),
        };
        let detail = body.get("detail").and_then(Value::as_str).unwrap_or("").chars().take(400).collect();
        self.by_rank.insert(rank, LinkChoice { transport, detail });
        Ok(())
    }
}

/// The `overlay.transport` request a child sends to rank 0 about its parent link.
pub fn report(rank: u32, c: &LinkChoice) -> Message {
    let mut m =
        Message::request("overlay.transport", 0, &json!({"rank": rank, "transport": c.transport, "detail": c.detail}));
    m.flags = crate::message::FLAG_NORESPONSE;
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary() {
        let mut l = Links::default();
        assert_eq!(l.summary(), "tcp");
        l.on_report(&json!({"rank": 1, "transport": "rdma", "detail": "rxe0"})).unwrap();
        assert_eq!(l.summary(), "rdma");
        l.on_report(&json!({"rank": 2, "transport": "tcp", "detail": "no verbs devices"})).unwrap();
        assert_eq!(l.summary(), "mixed (rdma 1, tcp 1: no verbs devices)");
        assert!(l.on_report(&json!({"rank": 3, "transport": "carrier pigeon"})).is_err());
        l.on_report(&json!({"rank": 3, "transport": "ofi", "detail": "provider cxi"})).unwrap();
        assert_eq!(l.summary(), "mixed (rdma 1, ofi 1, tcp 1: no verbs devices)");
        let mut l = Links::default();
        l.on_report(&json!({"rank": 1, "transport": "ofi", "detail": "provider cxi"})).unwrap();
        assert_eq!(l.summary(), "ofi");
    }
}

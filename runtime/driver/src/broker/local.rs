//! Local connector: a Unix socket per broker. Only the instance owner's uid is admitted (SO_PEERCRED); any
//! other uid receives a `refused` control message saying why, and is disconnected.

use super::core::Peer;
use super::driver::{pump, Event};
use super::transport::link_from_stream;
use crate::message::Message;
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{info, warn};

pub(crate) async fn accept_local(
    l: tokio::net::UnixListener,
    tx: mpsc::UnboundedSender<Event>,
    owner: u32,
    rank: u32,
    size: u32,
    instance: String,
    rank0_grace: f64,
) {
    let mut next: u32 = 0;
    loop {
        let s = match l.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                warn!("local accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let uid = match s.peer_cred() {
            Ok(c) => c.uid(),
            Err(e) => {
                warn!("local connection without credentials ({e}); refusing");
                continue;
            }
        };
        let link = link_from_stream(s, format!("uid {uid}"));
        if uid != owner {
            info!("refusing local connection from uid {uid}: not the instance owner");
            let _ = link.tx.send(Message::control(
                "refused",
                &json!({"errstr": format!("permission denied: uid {uid} is not the owner of this instance (uid {owner})")}),
            ));
            // Keep the writer alive long enough to flush, then drop.
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                drop(link);
            });
            continue;
        }
        next = (next + 1) % (1 << 30);
        let id = next;
        let _ = link.tx.send(Message::control(
            "welcome",
            &json!({"rank": rank, "size": size, "instance": instance, "uid": owner, "rank0_grace": rank0_grace}),
        ));
        if tx.send(Event::LocalNew { id, uid, tx: link.tx }).is_err() {
            return;
        }
        tokio::spawn(pump(link.rx, Peer::Local(id), 0, tx.clone()));
    }
}

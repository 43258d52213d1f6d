//! Local connector: a Unix socket per broker. The kernel says who connected (SO_PEERCRED): that uid is the
//! client's identity, which the broker writes into the `userid` of every request the client sends
//! (`vigil_core::broker::routing`), whatever the client put there. A personal instance admits its owner's uid
//! only; a multi-user system instance (`access.allow-guest-users`) admits every uid, and what each may do is
//! `vigil_core::broker::access`'s table. A refused uid receives a `refused` control message saying why, and is
//! disconnected.

use super::core::Peer;
use super::driver::{pump, Event};
use super::transport::link_from_stream;
use crate::message::Message;
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// Accept clients on `l` for ever: each admitted one (the instance `owner`'s uid, or any uid when `guests`) is
/// sent `welcome` and handed to the loop as [`Event::LocalNew`] with the uid the kernel gave.
pub(crate) async fn accept_local(
    l: tokio::net::UnixListener,
    tx: mpsc::UnboundedSender<Event>,
    owner: u32,
    guests: bool,
    welcome: serde_json::Value,
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
        if uid != owner && !guests {
            info!("refusing local connection from uid {uid}: not the instance owner");
            let _ = link.tx.send(Message::control(
                "refused",
                &json!({"errstr": format!(
                    "permission denied: uid {uid} is not the owner of this instance (uid {owner}), which serves its \
                     owner only (a multi-user system instance sets [access] allow-guest-users = true)"
                )}),
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
        let _ = link.tx.send(Message::control("welcome", &welcome));
        if tx.send(Event::LocalNew { id, uid, tx: link.tx }).is_err() {
            return;
        }
        tokio::spawn(pump(link.rx, Peer::Local(id), 0, tx.clone()));
    }
}

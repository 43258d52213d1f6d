//! Overlay transports. The overlay sees a link as a pair of message channels; a transport turns a byte stream
//! (TCP today, RDMA verbs later, in-memory in simulations) into such a pair.
//!
//! Reading stops at the first malformed frame: the link reports [`LinkEvent::Closed`] with the decode error as
//! the reason, and the broker drops that peer only.

use crate::message::{read_frame, Message};
use std::future::Future;
use std::pin::Pin;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

/// Sending half of a link: queue a message for the peer.
pub type LinkTx = mpsc::UnboundedSender<Message>;

/// What a link's reader reports.
#[derive(Debug)]
pub enum LinkEvent {
    /// A decoded message.
    Message(Message),
    /// The link closed; the string says why ("eof", an i/o error, a decode error).
    Closed(String),
}

/// A connected link.
pub struct Link {
    /// Send messages to the peer.
    pub tx: LinkTx,
    /// Receive messages from the peer, then one `Closed`.
    pub rx: mpsc::UnboundedReceiver<LinkEvent>,
    /// Peer address, for logs.
    pub peer: String,
}

/// A way to reach overlay peers. Implementations: [`TcpTransport`]; RDMA comes later.
pub trait Transport: Send + Sync {
    /// Name shown in `vigil uptime` / `vigil overlay status` (e.g. "tcp").
    fn name(&self) -> &'static str;
    /// Connect to a peer's endpoint.
    fn connect(&self, endpoint: String) -> Pin<Box<dyn Future<Output = std::io::Result<Link>> + Send>>;
}

/// Wrap any byte stream into a [`Link`], spawning a reader and a writer task.
pub fn link_from_stream<S>(stream: S, peer: String) -> Link
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, wr) = tokio::io::split(stream);
    let (tx, mut out_rx) = mpsc::unbounded_channel::<Message>();
    let (in_tx, rx) = mpsc::unbounded_channel::<LinkEvent>();
    tokio::spawn(async move {
        let mut w = BufWriter::new(wr);
        while let Some(m) = out_rx.recv().await {
            if w.write_all(&m.encode()).await.is_err() {
                return;
            }
            // Batch what is already queued, then flush once.
            while let Ok(m) = out_rx.try_recv() {
                if w.write_all(&m.encode()).await.is_err() {
                    return;
                }
            }
            if w.flush().await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    });
    tokio::spawn(async move {
        loop {
            match read_frame(&mut rd).await {
                Ok(Some(m)) => {
                    if in_tx.send(LinkEvent::Message(m)).is_err() {
                        return;
                    }
                }
                Ok(None) => {
                    let _ = in_tx.send(LinkEvent::Closed("connection closed".into()));
                    return;
                }
                Err(e) => {
                    let _ = in_tx.send(LinkEvent::Closed(e.to_string()));
                    return;
                }
            }
        }
    });
    Link { tx, rx, peer }
}

/// TCP overlay transport (tokio, `TCP_NODELAY`).
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpTransport;

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn connect(&self, endpoint: String) -> Pin<Box<dyn Future<Output = std::io::Result<Link>> + Send>> {
        Box::pin(async move {
            let addr = endpoint.strip_prefix("tcp://").unwrap_or(&endpoint).to_string();
            let s = tokio::net::TcpStream::connect(&addr).await?;
            s.set_nodelay(true)?;
            Ok(link_from_stream(s, addr))
        })
    }
}

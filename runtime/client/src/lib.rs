//! # Vigil local-connector client
//!
//! Client side of the local connector: RPCs, response streams and events over a broker's Unix socket (tokio).
//! This is all a program needs to talk to an instance (the `vigil` commands, the job shell), without linking the
//! broker; [`frame`] reads and writes the messages of `vigil_proto::message` on a stream, here and on the
//! broker's overlay links.
//!
//! A `VIGIL_URI` has the form `local:///path/to/local-N` (a bare path is accepted too). On connect the broker
//! answers with a `welcome` control message (`{"rank", "size", "instance", "uid"}`) or a `refused` one
//! (`{"errstr"}`), e.g. when the connecting uid is not the instance owner's (SO_PEERCRED check). [`munge`] makes
//! the credential a guest's submission to a multi-user instance carries.

pub mod frame;
pub mod munge;

use crate::frame::read_frame;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use vigil_proto::message::{errno, Message, MsgType, FLAG_NORESPONSE, FLAG_STREAMING};

/// Environment variable naming the URI of the broker a command talks to.
pub const URI_ENV: &str = "VIGIL_URI";

/// Failure of an RPC: the errno of the error response (POSIX) and its message.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{errstr}")]
pub struct RpcError {
    /// POSIX errno (e.g. 38 ENOSYS, 113 EHOSTUNREACH); 0 never appears here.
    pub errnum: u32,
    /// Human-readable reason (the response's `errstr`, or the errno's description).
    pub errstr: String,
}

impl RpcError {
    fn from_response(m: &Message) -> RpcError {
        let errstr = m.errstr().unwrap_or_else(|| errno_str(m.errnum).to_string());
        RpcError { errnum: m.errnum, errstr }
    }
    fn disconnected() -> RpcError {
        RpcError { errnum: errno::EHOSTUNREACH, errstr: Self::disconnected_text().into() }
    }

    /// The `errstr` of a request whose connection to the broker ended before its answer.
    pub fn disconnected_text() -> &'static str {
        "lost connection to broker"
    }

    /// A request whose connection was closed because what the broker sent could not be read (`why`, e.g. a
    /// frame larger than `MAX_FRAME`): EPROTO, not a lost broker, which is still there.
    fn unreadable(why: &str) -> RpcError {
        RpcError {
            errnum: errno::EPROTO,
            errstr: format!("the broker's answer could not be read ({why}); the connection was closed"),
        }
    }
}

/// Short description of the errno values Vigil uses (defined in `vigil-proto`, beside the values).
pub use vigil_proto::message::errno_str;

/// Error connecting to a broker.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// `VIGIL_URI` is not set and no URI was given.
    #[error("VIGIL_URI is not set: run this command inside an instance (vigil start ...), or set VIGIL_URI=local:///RUNDIR/local-0")]
    NoUri,
    /// The URI scheme is not `local://`.
    #[error("unsupported URI '{0}': expected local:///path")]
    BadUri(String),
    /// The socket could not be reached.
    #[error("cannot connect to {path}: {err}")]
    Io {
        /// Socket path.
        path: String,
        /// Underlying error.
        err: std::io::Error,
    },
    /// The broker refused the connection (e.g. not the instance owner).
    #[error("broker refused connection: {0}")]
    Refused(String),
    /// The broker sent something other than a welcome.
    #[error("protocol error during connect: {0}")]
    Protocol(String),
}

/// What the broker said about itself on connect.
#[derive(Debug, Clone, serde::Deserialize, Serialize, Default)]
pub struct Welcome {
    /// Rank of the broker this client is attached to.
    pub rank: u32,
    /// Number of brokers in the instance.
    pub size: u32,
    /// Instance identifier.
    #[serde(default)]
    pub instance: String,
    /// uid of the instance owner.
    #[serde(default)]
    pub uid: u32,
    /// Said by rank 0 only: how long, in seconds, the other brokers keep their jobs running when rank 0 is lost
    /// (`tbon.parent_grace`; with a state directory a restarted rank 0 takes them back within it), so how long a
    /// client following a job may wait for rank 0 to come back. 0 (and from other ranks): they stop with it.
    #[serde(default)]
    pub rank0_grace: f64,
    /// A multi-user instance (`access.allow-guest-users`): users other than the owner may connect, and their
    /// submissions carry a munge credential ([`munge`]). False from brokers that do not say.
    #[serde(default)]
    pub guests: bool,
}

type Pending = Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Message>>>>;

/// A connection to one broker. Cheap to clone; all clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
    tx: mpsc::UnboundedSender<Message>,
    pending: Pending,
    events: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Message>>>,
    next_tag: Arc<AtomicU32>,
    /// The connection has ended (set by its reader before it drops every waiter): a request made after that is
    /// answered "disconnected" at once instead of waiting forever.
    closed: Arc<AtomicBool>,
    /// Why the reader ended, when it was not the broker closing the connection (an unreadable frame): requests
    /// are then answered with that ([`RpcError::unreadable`]), not "lost connection".
    broken: Arc<Mutex<Option<String>>>,
    /// The broker's welcome (its rank, the instance size...).
    pub welcome: Welcome,
}

/// Parse a `local://` URI (or bare path) into a socket path.
pub fn uri_to_path(uri: &str) -> Result<String, ConnectError> {
    if let Some(p) = uri.strip_prefix("local://") {
        Ok(p.to_string())
    } else if uri.starts_with('/') || uri.starts_with('.') {
        Ok(uri.to_string())
    } else {
        Err(ConnectError::BadUri(uri.to_string()))
    }
}

impl Client {
    /// Connect to the broker named by `$VIGIL_URI`.
    pub async fn connect_env() -> Result<Client, ConnectError> {
        let uri = std::env::var(URI_ENV).map_err(|_| ConnectError::NoUri)?;
        Client::connect(&uri).await
    }

    /// Connect to the broker at `uri` (`local:///path`) and wait for its welcome.
    pub async fn connect(uri: &str) -> Result<Client, ConnectError> {
        let path = uri_to_path(uri)?;
        let stream = UnixStream::connect(&path).await.map_err(|err| ConnectError::Io { path: path.clone(), err })?;
        let (mut rd, mut wr) = stream.into_split();
        let first = read_frame(&mut rd).await.map_err(|e| ConnectError::Protocol(e.to_string()))?;
        let welcome = match first {
            Some(m) if m.msgtype == MsgType::Control && m.topic == "welcome" => {
                m.decode::<Welcome>().map_err(|e| ConnectError::Protocol(e.to_string()))?
            }
            Some(m) if m.msgtype == MsgType::Control && m.topic == "refused" => {
                return Err(ConnectError::Refused(m.errstr().unwrap_or_else(|| "no reason given".into())))
            }
            Some(m) => return Err(ConnectError::Protocol(format!("unexpected {:?} '{}'", m.msgtype, m.topic))),
            None => return Err(ConnectError::Refused("connection closed by broker".into())),
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
        let (etx, erx) = mpsc::unbounded_channel::<Message>();
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if wr.write_all(&m.encode()).await.is_err() {
                    break;
                }
            }
        });
        let p2 = pending.clone();
        let closed = Arc::new(AtomicBool::new(false));
        let c2 = closed.clone();
        let broken: Arc<Mutex<Option<String>>> = Arc::default();
        let b2 = broken.clone();
        tokio::spawn(async move {
            loop {
                let m = match read_frame(&mut rd).await {
                    Ok(Some(m)) => m,
                    Ok(None) | Err(vigil_proto::message::FrameError::Io(_)) => break,
                    Err(e @ vigil_proto::message::FrameError::Decode(_)) => {
                        if let Ok(mut b) = b2.lock() {
                            *b = Some(e.to_string());
                        }
                        break;
                    }
                };
                match m.msgtype {
                    MsgType::Response => {
                        let tx = p2.lock().ok().and_then(|g| g.get(&m.matchtag).cloned());
                        if let Some(tx) = tx {
                            let _ = tx.send(m);
                        }
                    }
                    MsgType::Event => {
                        let _ = etx.send(m);
                    }
                    _ => {}
                }
            }
            // Dropping the senders wakes every waiter with "disconnected".
            c2.store(true, Ordering::SeqCst);
            if let Ok(mut g) = p2.lock() {
                g.clear();
            }
        });
        Ok(Client {
            tx,
            pending,
            events: Arc::new(tokio::sync::Mutex::new(erx)),
            next_tag: Arc::new(AtomicU32::new(1)),
            closed,
            broken,
            welcome,
        })
    }

    /// The error of a request whose connection has ended: "lost connection to broker", or, where the broker is
    /// still there but what it sent could not be read, that ([`RpcError::unreadable`]).
    fn gone(&self) -> RpcError {
        match self.broken.lock().ok().and_then(|b| b.clone()) {
            Some(why) => RpcError::unreadable(&why),
            None => RpcError::disconnected(),
        }
    }

    fn send_request(
        &self,
        topic: &str,
        nodeid: u32,
        payload: &impl Serialize,
        flags: u8,
    ) -> Result<(u32, mpsc::UnboundedReceiver<Message>), RpcError> {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let mut m = Message::request(topic, nodeid, payload);
        m.matchtag = tag;
        m.flags = flags;
        let (tx, rx) = mpsc::unbounded_channel();
        if flags & FLAG_NORESPONSE == 0 {
            if let Ok(mut g) = self.pending.lock() {
                g.insert(tag, tx);
            }
        }
        // Checked after the insert: a reader that ends later drops this waiter with the others.
        if self.closed.load(Ordering::SeqCst) {
            self.forget(tag);
            return Err(self.gone());
        }
        self.tx.send(m).map_err(|_| self.gone())?;
        Ok((tag, rx))
    }

    fn forget(&self, tag: u32) {
        if let Ok(mut g) = self.pending.lock() {
            g.remove(&tag);
        }
    }

    /// Send a request and wait for its single response. `nodeid` is a rank or
    /// [`NODEID_ANY`](vigil_proto::message::NODEID_ANY).
    pub async fn rpc(&self, topic: &str, nodeid: u32, payload: &impl Serialize) -> Result<Value, RpcError> {
        let (tag, mut rx) = self.send_request(topic, nodeid, payload, 0)?;
        let r = rx.recv().await;
        self.forget(tag);
        match r {
            Some(m) if m.errnum == 0 => Ok(m.json()),
            Some(m) => Err(RpcError::from_response(&m)),
            None => Err(self.gone()),
        }
    }

    /// [`Client::rpc`], its answer's payload as it came (JSON text), unparsed: for an answer too large to hold as a
    /// [`Value`] at once (`vigil history` of 100,000 records is 40 MB of it), which the caller parses as it goes.
    pub async fn rpc_bytes(&self, topic: &str, nodeid: u32, payload: &impl Serialize) -> Result<Vec<u8>, RpcError> {
        let (tag, mut rx) = self.send_request(topic, nodeid, payload, 0)?;
        let r = rx.recv().await;
        self.forget(tag);
        match r {
            Some(m) if m.errnum == 0 => Ok(m.payload),
            Some(m) => Err(RpcError::from_response(&m)),
            None => Err(self.gone()),
        }
    }

    /// Send a request that wants no response.
    pub fn send(&self, topic: &str, nodeid: u32, payload: &impl Serialize) -> Result<(), RpcError> {
        self.send_request(topic, nodeid, payload, FLAG_NORESPONSE).map(|_| ())
    }

    /// Send a streaming request; read its responses with [`RpcStream::next`] until it ends (ENODATA).
    pub fn rpc_stream(&self, topic: &str, nodeid: u32, payload: &impl Serialize) -> Result<RpcStream, RpcError> {
        let (tag, rx) = self.send_request(topic, nodeid, payload, FLAG_STREAMING)?;
        Ok(RpcStream { rx, done: false, tag, client: self.clone() })
    }

    /// Subscribe to events whose topic starts with `prefix`.
    pub async fn subscribe(&self, prefix: &str) -> Result<(), RpcError> {
        self.rpc("broker.sub", vigil_proto::message::NODEID_ANY, &serde_json::json!({"topic": prefix}))
            .await
            .map(|_| ())
    }

    /// Wait for the next event this client subscribed to; `None` when the connection closed.
    pub async fn next_event(&self) -> Option<Message> {
        self.events.lock().await.recv().await
    }
}

/// The responses of a streaming RPC.
#[derive(Debug)]
pub struct RpcStream {
    rx: mpsc::UnboundedReceiver<Message>,
    done: bool,
    tag: u32,
    client: Client,
}

impl RpcStream {
    /// Next response payload; `None` after the normal end of the stream (ENODATA); `Some(Err)` once on error.
    pub async fn next(&mut self) -> Option<Result<Value, RpcError>> {
        if self.done {
            return None;
        }
        let r = match self.rx.recv().await {
            Some(m) if m.errnum == 0 => return Some(Ok(m.json())),
            Some(m) if m.errnum == errno::ENODATA => None,
            Some(m) => Some(Err(RpcError::from_response(&m))),
            None => Some(Err(self.client.gone())),
        };
        self.done = true;
        self.client.forget(self.tag);
        r
    }
}

impl Drop for RpcStream {
    fn drop(&mut self) {
        self.client.forget(self.tag);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer the client cannot read (a frame past `MAX_FRAME`, as a listing of 100,000 jobs once was) from a
    /// broker that is still there is said as such (EPROTO), not as a lost connection, which would send the user
    /// looking for a dead broker (and `vigil submit` sending its job again).
    #[tokio::test]
    async fn an_unreadable_answer_is_not_a_lost_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("local-0");
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        let broker = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let welcome = Message::control("welcome", &serde_json::json!({"rank": 0, "size": 1}));
            s.write_all(&welcome.encode()).await.unwrap();
            let (mut rd, mut wr) = s.split();
            let _request = read_frame(&mut rd).await.unwrap();
            let len = vigil_proto::message::MAX_FRAME + 1;
            wr.write_all(&len.to_be_bytes()).await.unwrap();
            // Still there: the connection stays open while the client reads.
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        });
        let c = Client::connect(path.to_str().unwrap()).await.unwrap();
        let e = c.rpc("job-manager.list", 0, &serde_json::json!({})).await.unwrap_err();
        assert_eq!(e.errnum, errno::EPROTO, "{e}");
        assert!(e.errstr.starts_with("the broker's answer could not be read (") && e.errstr.contains("exceeds"), "{e}");
        // Later requests on the closed connection say the same.
        assert_eq!(c.rpc("broker.ping", 0, &serde_json::json!({})).await.unwrap_err().errnum, errno::EPROTO);
        broker.abort();
    }
}

//! The tasks' I/O: their stdout and stderr read line by line and forwarded in batches to rank 0
//! (`job-exec.output`) or to the job's output files, and the job's standard input broadcast to their stdin.

use crate::Shell;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt as _, BufReader};
use tokio::sync::mpsc;
use vigil_client::Client;
use vigil_proto::shellproto::{OutputLine, TOPIC_OUTPUT};

/// Longest line forwarded as one output entry (bytes); longer lines are split.
const MAX_LINE: usize = 64 * 1024;

/// Most lines sent in one `job-exec.output` message.
const BATCH_LINES: usize = 256;

/// Output chunks buffered in the shell before tasks block on their pipes.
pub(crate) const OUTPUT_QUEUE: usize = 1024;

/// `job-exec.output` batches in flight to rank 0 before the shell waits for an acknowledgement.
const OUTPUT_WINDOW: usize = 8;

/// Times a `job-exec.output` batch is sent again after EHOSTUNREACH, which our broker answers when the router it
/// went up through was lost with it in flight (the broker then re-parents and holds the next try for its new
/// parent: docs/failure-detection.md, "Re-parenting").
const OUTPUT_RESENDS: usize = 3;

impl Shell {
    /// Open the files named by the `output` shell option (`{"stdout": {"path"}, "stderr": {"path"}}`, its
    /// templates filled in: `{{id}}`, `{{name}}`, [`vigil_proto::shellproto::output_path`]), relative to the job's working directory, for appending.
    pub(crate) fn output_files(&self) -> Result<(Option<std::fs::File>, Option<std::fs::File>), String> {
        let open = |which: &str| -> Result<Option<std::fs::File>, String> {
            let Some(p) = self
                .input
                .options
                .get("output")
                .and_then(|o| o.get(which))
                .and_then(|o| o.get("path"))
                .and_then(|p| p.as_str())
            else {
                return Ok(None);
            };
            let i = &self.input;
            let p = vigil_proto::shellproto::output_path(p, i.id, &i.id_f58, i.name.as_deref());
            let path = match &self.input.cwd {
                Some(c) if !p.starts_with('/') => std::path::Path::new(c).join(&p),
                _ => std::path::PathBuf::from(&p),
            };
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map(Some)
                .map_err(|e| format!("cannot open output file {}: {e}", path.display()))
        };
        Ok((open("stdout")?, open("stderr")?))
    }

    /// The output forwarder: takes the tasks' lines from `out_rx` in batches, writes those of a stream with an output
    /// file (`out_file`, `err_file`: the job's `--output`, `--error`) there, and sends the rest to rank 0
    /// (`job-exec.output`) without waiting, at most [`OUTPUT_WINDOW`] batches in flight. Ends when `out_rx` does.
    pub(crate) fn spawn_forwarder(
        &self,
        mut out_rx: mpsc::Receiver<OutputLine>,
        mut out_file: Option<std::fs::File>,
        mut err_file: Option<std::fs::File>,
    ) -> tokio::task::JoinHandle<()> {
        let id = self.input.id;
        let client = self.client.clone();
        let broker_rank = self.input.broker_rank;
        tokio::spawn(async move {
            let mut inflight: std::collections::VecDeque<tokio::task::JoinHandle<()>> =
                std::collections::VecDeque::new();
            // Batches are numbered, so that rank 0 takes one that is sent again (see `send_output`) once, in order.
            let mut seq: u64 = 0;
            while let Some(first) = out_rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < BATCH_LINES {
                    match out_rx.try_recv() {
                        Ok(l) => batch.push(l),
                        Err(_) => break,
                    }
                }
                let mut rest = Vec::new();
                for l in batch {
                    use std::io::Write as _;
                    let f =
                        if l.stream == "stderr" { err_file.as_mut().or(out_file.as_mut()) } else { out_file.as_mut() };
                    match f {
                        Some(f) => {
                            let _ = f.write_all(&l.bytes());
                        }
                        None => rest.push(l),
                    }
                }
                if rest.is_empty() {
                    continue;
                }
                // At most OUTPUT_WINDOW batches in flight: rank 0's acknowledgements pace the shell.
                if inflight.len() >= OUTPUT_WINDOW {
                    if let Some(h) = inflight.pop_front() {
                        let _ = h.await;
                    }
                }
                let c = client.clone();
                let body = serde_json::json!({"id": id, "lines": rest, "broker_rank": broker_rank, "seq": seq});
                seq += 1;
                inflight.push_back(tokio::spawn(async move {
                    let _ = send_output(&c, &body).await;
                }));
            }
            for h in inflight {
                let _ = h.await;
            }
        })
    }

    /// The job's standard input (from `vigil run`), broadcast to every task; EOF closes their stdin. A job
    /// without any reads /dev/null, and rank 0 is not asked.
    pub(crate) fn forward_stdin(&self, stdins: Vec<mpsc::UnboundedSender<Option<Vec<u8>>>>) {
        let id = self.input.id;
        if self.input.stdin {
            let c = self.client.clone();
            tokio::spawn(async move {
                use base64::Engine as _;
                if let Ok(mut s) = c.rpc_stream("job-info.stdin", 0, &serde_json::json!({"id": id})) {
                    while let Some(Ok(v)) = s.next().await {
                        let Some(d) = v.get("data").and_then(|d| d.as_str()) else { continue };
                        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(d) else { continue };
                        for w in &stdins {
                            let _ = w.send(Some(bytes.clone()));
                        }
                    }
                }
                for w in &stdins {
                    let _ = w.send(None);
                }
            });
        }
    }
}

/// Feed a task's stdin from a queue; `None` (or a closed queue) closes it. A task that does not read only
/// costs the queued bytes.
pub(crate) fn stdin_writer(mut si: tokio::process::ChildStdin) -> mpsc::UnboundedSender<Option<Vec<u8>>> {
    use tokio::io::AsyncWriteExt;
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<Vec<u8>>>();
    tokio::spawn(async move {
        while let Some(Some(b)) = rx.recv().await {
            if si.write_all(&b).await.is_err() {
                break;
            }
        }
        drop(si);
    });
    tx
}

/// Send one `job-exec.output` batch to rank 0 and wait for its acknowledgement. A batch lost in flight with a
/// router (EHOSTUNREACH) is sent again, at most [`OUTPUT_RESENDS`] times; by its `broker_rank` and `seq`, rank 0
/// puts it back in order and takes it once (if it had arrived before the router died, with only its
/// acknowledgement lost).
pub(crate) async fn send_output(
    c: &Client,
    body: &serde_json::Value,
) -> Result<serde_json::Value, vigil_client::RpcError> {
    let mut r = c.rpc(TOPIC_OUTPUT, 0, body).await;
    for _ in 0..OUTPUT_RESENDS {
        match &r {
            Err(e) if e.errnum == vigil_proto::message::errno::EHOSTUNREACH => r = c.rpc(TOPIC_OUTPUT, 0, body).await,
            _ => break,
        }
    }
    r
}

/// Read `r` and forward it as output of task `rank`: one chunk per line (newline stripped, `eol` set), lines
/// longer than `MAX_LINE` bytes in several chunks, bytes exactly as written.
pub(crate) async fn forward<R: AsyncRead + Unpin>(r: R, rank: u32, stream: &'static str, tx: mpsc::Sender<OutputLine>) {
    let mut rd = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = match (&mut rd).take(MAX_LINE as u64).read_until(b'\n', &mut buf).await {
            Ok(n) => n,
            Err(_) => break,
        };
        if n == 0 {
            break;
        }
        let eol = buf.last() == Some(&b'\n');
        if eol {
            buf.pop();
        }
        if tx.send(OutputLine::from_bytes(rank, stream, &buf, eol)).await.is_err() {
            break;
        }
    }
}

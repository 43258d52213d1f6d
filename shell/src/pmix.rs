//! PMIx for the job's tasks: the choice of PMI services (`-o pmi=LIST`), the `vigil-pmix` helper that runs the
//! OpenPMIx server of this node, and the fence exchange carried over the job's PMI barrier.
//!
//! The shell is linked statically and Debian ships no static `libpmix`, so the PMIx server runs in a helper process
//! (`vigil-pmix`, installed beside `vigil-shell`, linked dynamically with OpenPMIx), one per node of a job that asks
//! for PMIx. The shell writes it the job's layout as one JSON line, reads back the environment each task needs to
//! reach it (`PMIX_SERVER_URI*`, `PMIX_NAMESPACE`, `PMIX_RANK`...), and then serves its upcalls: a fence is this
//! node's blob, exchanged with every other node through `job-exec.pmi-barrier` (cut into PMI-sized values, see
//! [`fence_kvs`]), an abort fails the job. The protocol, both sides' types, is [`vigil_proto::pmix`].

use base64::Engine as _;
use std::collections::BTreeMap;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use vigil_proto::pmix::{self as proto, FromHelper, Setup, ToHelper};

/// Which PMI services the tasks get, from `-o pmi=LIST`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PmiChoice {
    /// PMI-1's simple wire protocol (`PMI_FD`), which MPICH speaks.
    pub(crate) simple: bool,
    /// A PMIx server (OpenPMIx, through `vigil-pmix`), which Open MPI needs.
    pub(crate) pmix: bool,
}

impl PmiChoice {
    /// Parse the `pmi` shell option: absent is PMI-1 alone (`simple`); `on` is both services; `off` or `none` is
    /// neither; else a comma-separated list of `simple` (or `pmi1`) and `pmix`. An unknown name is an error
    /// naming it.
    ///
    /// PMIx is asked for, as with Flux (`-o pmi=pmix`) and Slurm (`--mpi=pmix`; `MpiDefault=none`): its server
    /// starts with every job on every node, and OpenPMIx's start-up (a `vigil-pmix` process, `PMIx_server_init`
    /// probing the node's topology) measured 106-162 ms per node on a loaded 2-core machine, which would be paid
    /// by every job, `true` included (`vigil run -N4 true`: 23-45 ms without it, 204-249 ms with it).
    pub(crate) fn parse(v: Option<&str>) -> Result<PmiChoice, String> {
        let (mut simple, mut pmix) = (false, false);
        match v.map(str::trim) {
            None | Some("") => return Ok(PmiChoice { simple: true, pmix: false }),
            Some("on") => return Ok(PmiChoice { simple: true, pmix: true }),
            Some("off") | Some("none") => return Ok(PmiChoice { simple: false, pmix: false }),
            Some(list) => {
                for name in list.split(',').map(str::trim) {
                    match name {
                        "simple" | "pmi1" => simple = true,
                        "pmix" => pmix = true,
                        other => {
                            return Err(format!(
                                "-o pmi={list}: unknown PMI '{other}' (expected a list of simple, pmix; or off)"
                            ))
                        }
                    }
                }
            }
        }
        Ok(PmiChoice { simple, pmix })
    }
}

/// Characters of base64 per barrier value: within PMI-1's value size (`VALLEN_MAX`), which rank 0 enforces on
/// every value of a barrier.
const CHUNK: usize = 896;

/// The puts of shell `shell_rank` for a fence whose blob is `data` (base64): `pmix.S.n` (the count) and `pmix.S.I`
/// for each piece of at most [`CHUNK`] characters.
pub(crate) fn fence_kvs(shell_rank: u32, data: &str) -> BTreeMap<String, String> {
    let mut kvs = BTreeMap::new();
    // base64 is ASCII, so cutting by bytes cuts between characters.
    let pieces: Vec<&str> = data.as_bytes().chunks(CHUNK).map(|c| std::str::from_utf8(c).unwrap_or_default()).collect();
    kvs.insert(format!("pmix.{shell_rank}.n"), pieces.len().to_string());
    for (i, p) in pieces.iter().enumerate() {
        kvs.insert(format!("pmix.{shell_rank}.{i}"), p.to_string());
    }
    kvs
}

/// Every node's blob (base64) from the union of a fence's puts, in shell order. A shell that is not in it (its
/// node was lost, and the barrier went on without it) is skipped: its tasks are gone. An error names a count or a
/// piece that is missing or malformed.
pub(crate) fn fence_blobs(all: &BTreeMap<String, String>, nshells: u32) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for s in 0..nshells {
        let Some(n) = all.get(&format!("pmix.{s}.n")) else { continue };
        let n: usize = n.parse().map_err(|_| format!("pmix.{s}.n: '{n}' is not a count"))?;
        let mut blob = String::new();
        for i in 0..n {
            let p = all.get(&format!("pmix.{s}.{i}")).ok_or_else(|| format!("pmix.{s}.{i}: missing"))?;
            blob.push_str(p);
        }
        out.push(blob);
    }
    Ok(out)
}

/// Where the helper is: beside this shell's executable.
fn helper_path() -> Result<std::path::PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find vigil-shell's own path: {e}"))?;
    let p = exe.with_file_name("vigil-pmix");
    if !p.exists() {
        return Err(format!("{} is not installed (build the vigil-pmix crate, which needs libpmix-dev)", p.display()));
    }
    Ok(p)
}

/// How long the helper may take to start its server and register the job (OpenPMIx takes a few ms here).
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A running `vigil-pmix`.
#[derive(Debug)]
pub(crate) struct Helper {
    /// Lines to it (a writer task sends them).
    pub(crate) tx: mpsc::UnboundedSender<String>,
    /// Its messages, one JSON value each, until it exits.
    pub(crate) rx: mpsc::UnboundedReceiver<serde_json::Value>,
    /// The environment of each local task (by global rank) that points it at the server.
    pub(crate) env: BTreeMap<u32, BTreeMap<String, String>>,
    /// Variables every task gets unless its environment already sets them (settings for Open MPI).
    pub(crate) defaults: BTreeMap<String, String>,
    _child: tokio::process::Child,
}

impl Helper {
    /// Start the helper and hand it `setup`; wait for its server to be ready.
    pub(crate) async fn start(setup: &Setup) -> Result<Helper, String> {
        let path = helper_path()?;
        let mut child = tokio::process::Command::new(&path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", path.display()))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("vigil-pmix: no pipes".into());
        };
        let (tx, mut wrx) = mpsc::unbounded_channel::<String>();
        let (rtx, mut rx) = mpsc::unbounded_channel::<serde_json::Value>();
        tokio::spawn(async move {
            while let Some(l) = wrx.recv().await {
                if stdin.write_all(l.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                match serde_json::from_str::<serde_json::Value>(&l) {
                    Ok(v) => {
                        if rtx.send(v).is_err() {
                            break;
                        }
                    }
                    Err(e) => eprintln!("vigil-shell: a line from vigil-pmix that is not JSON: {e}"),
                }
            }
        });
        let _ = tx.send(proto::line(setup));
        let first = tokio::time::timeout(START_TIMEOUT, rx.recv())
            .await
            .map_err(|_| format!("vigil-pmix did not start its server within {} s", START_TIMEOUT.as_secs()))?
            .ok_or_else(|| "vigil-pmix exited before its server was ready".to_string())?;
        let env = match FromHelper::decode(&first) {
            Ok(Some(FromHelper::Ready { env, .. })) => env,
            Ok(Some(FromHelper::Error { error })) => return Err(format!("vigil-pmix: {error}")),
            Err(e) => return Err(format!("vigil-pmix: malformed first message: {e}")),
            Ok(_) => return Err(format!("vigil-pmix: unexpected first message {first}")),
        };
        Ok(Helper { tx, rx, env, defaults: BTreeMap::new(), _child: child })
    }

    /// Add what task `rank` needs to reach the server to its environment `env`, and the [`Helper::defaults`] it
    /// does not set itself.
    pub(crate) fn add_env(&self, rank: u32, env: &mut BTreeMap<String, String>) {
        if let Some(e) = self.env.get(&rank) {
            env.extend(e.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        for (k, v) in &self.defaults {
            env.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }

    /// Answer fence `seq` with every node's blob.
    pub(crate) fn fence_done(&self, seq: u64, blobs: Vec<String>) {
        let _ = self.tx.send(proto::line(&ToHelper::FenceDone { seq, data: blobs }));
    }

    /// Fail fence `seq`.
    pub(crate) fn fence_failed(&self, seq: u64, error: &str) {
        let _ = self.tx.send(proto::line(&ToHelper::FenceFailed { seq, error: error.to_string() }));
    }

    /// Pass on a lost-node notice (`shell.<jobid>.lost`, see [`LostNodes::from_notice`]): the helper raises the
    /// PMIx node-down event for the lost processes to this node's tasks.
    pub(crate) fn node_lost(&self, lost: &LostNodes) {
        let m = ToHelper::NodeLost { ranks: lost.tasks.clone(), hosts: lost.hosts.clone() };
        let _ = self.tx.send(proto::line(&m));
    }
}

/// What a lost-node notice from the exec system (`rexec.notify`, delivered as the event `shell.<jobid>.lost`)
/// says: the job's tasks that ran on the lost nodes and the nodes' host names.
#[derive(Debug, PartialEq)]
pub(crate) struct LostNodes {
    /// Global task ranks.
    pub(crate) tasks: Vec<u32>,
    /// Host names.
    pub(crate) hosts: Vec<String>,
}

impl LostNodes {
    /// The lost tasks and hosts of a notice; `None` when it names no task (a batch job's, whose tasks are its
    /// brokers) or is malformed.
    pub(crate) fn from_notice(v: &serde_json::Value) -> Option<LostNodes> {
        let tasks: Vec<u32> = serde_json::from_value(v.get("tasks")?.clone()).ok()?;
        let hosts: Vec<String> =
            serde_json::from_value(v.get("hosts").cloned().unwrap_or_default()).unwrap_or_default();
        (!tasks.is_empty()).then_some(LostNodes { tasks, hosts })
    }
}

/// A message of the helper, as the shell acts on it.
#[derive(Debug, PartialEq)]
pub(crate) enum Event {
    /// This node entered fence `seq` with blob `data` (base64).
    Fence {
        /// Fence number.
        seq: u64,
        /// This node's blob, base64 (checked).
        data: String,
    },
    /// Task `rank` aborted the job with `status`.
    Abort {
        /// The task.
        rank: u32,
        /// Its exit status for the job.
        status: i32,
        /// Its message.
        msg: String,
    },
    /// Something to ignore (connected, finalized), or a message the shell does not know.
    Other,
}

impl Event {
    /// Decode one helper message ([`FromHelper::decode`]), with a fence's blob checked to be base64; an error
    /// names what is wrong.
    pub(crate) fn decode(v: &serde_json::Value) -> Result<Event, String> {
        match FromHelper::decode(v)? {
            Some(FromHelper::Fence { seq, data }) => {
                base64::engine::general_purpose::STANDARD.decode(&data).map_err(|e| format!("fence.data: {e}"))?;
                Ok(Event::Fence { seq, data })
            }
            Some(FromHelper::Abort { rank, status, msg }) => Ok(Event::Abort { rank, status, msg }),
            _ => Ok(Event::Other),
        }
    }
}

impl crate::Shell {
    /// Start this node's PMIx server (`vigil-pmix`) for local tasks `ranks`, with the job's layout.
    pub(crate) async fn start_pmix(&self, ranks: &[u32]) -> Result<Helper, String> {
        let i = &self.input;
        let by_node = vigil_proto::taskmap::Taskmap::decode(&i.taskmap)
            .map_err(|e| format!("task map: {e}"))?
            .tasks_by_node(i.nshells as usize);
        if by_node.get(i.shell_rank as usize).map(Vec::as_slice) != Some(ranks) {
            return Err(format!("the task map does not give shell {} its tasks", i.shell_rank));
        }
        // R's hosts, in the order of the job's nodes; made-up names where R has none for every node.
        let hosts: Vec<String> = vigil_proto::r::Rv1::from_value(&i.r)
            .ok()
            .and_then(|r| r.hosts().ok())
            .map(|h| h.into_vec())
            .filter(|h| h.len() == i.nshells as usize)
            .unwrap_or_else(|| (0..i.nshells).map(|n| format!("vigil-node{n}")).collect());
        // Several brokers of one host (a test instance) are still different nodes to the job: Open MPI takes
        // processes of one host name for neighbours and joins them through shared memory, which fails across
        // shells. Such names get their node index.
        let distinct = hosts.iter().collect::<std::collections::BTreeSet<_>>().len() == hosts.len();
        let hosts: Vec<String> =
            if distinct { hosts } else { hosts.into_iter().enumerate().map(|(n, h)| format!("{h}-{n}")).collect() };
        let tmpdir = self.tmpdir.as_ref().ok_or("no job directory")?.display().to_string();
        // Open MPI 4.1 takes a process for direct-launched (its `ess` component `pmi`) only when a resource
        // manager it knows claims it (its `schizo` components: Slurm, Flux, LSF's jsm); else its `orte` one
        // declares it a singleton. Excluding that one lets the PMIx server be found: the equivalent of a `schizo`
        // component of Vigil's own.
        let mut defaults = BTreeMap::from([("OMPI_MCA_schizo".to_string(), "^orte".to_string())]);
        if !distinct {
            // Its shared-memory segments are named by host, job and local rank in /dev/shm: the shells of one
            // host would share them. Each node's go to its own job directory.
            defaults.insert("OMPI_MCA_btl_vader_backing_directory".into(), tmpdir.clone());
        }
        let setup = vigil_proto::pmix::Setup {
            nspace: format!("vigil.{}", i.id_f58),
            jobid: i.id_f58.clone(),
            nodeid: i.shell_rank,
            size: i.ntasks,
            ranks: by_node,
            hosts,
            tmpdir,
        };
        let mut h = Helper::start(&setup).await?;
        h.defaults = defaults;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_pmi_option_is_a_list() {
        let both = PmiChoice { simple: true, pmix: true };
        assert_eq!(PmiChoice::parse(None), Ok(PmiChoice { simple: true, pmix: false }), "PMIx is asked for");
        assert_eq!(PmiChoice::parse(Some("on")), Ok(both));
        assert_eq!(PmiChoice::parse(Some("simple,pmix")), Ok(both));
        assert_eq!(PmiChoice::parse(Some("pmix")), Ok(PmiChoice { simple: false, pmix: true }));
        assert_eq!(PmiChoice::parse(Some("pmi1")), Ok(PmiChoice { simple: true, pmix: false }));
        assert_eq!(PmiChoice::parse(Some("off")), Ok(PmiChoice { simple: false, pmix: false }));
        let e = PmiChoice::parse(Some("simple,pmi3")).unwrap_err();
        assert!(e.contains("'pmi3'"), "{e}");
    }

    #[test]
    fn fence_blobs_go_through_pmi_sized_values_and_come_back_whole() {
        let big = "QUJD".repeat(1000); // 4,000 characters: five pieces
        let mut all = fence_kvs(0, &big);
        assert_eq!(all.get("pmix.0.n").map(String::as_str), Some("5"));
        assert!(all.values().all(|v| v.len() <= CHUNK));
        all.extend(fence_kvs(2, "eHl6"));
        all.extend(fence_kvs(3, ""));
        // Shell 1 was lost: skipped; an empty blob stays an (empty) blob.
        assert_eq!(fence_blobs(&all, 4), Ok(vec![big, "eHl6".to_string(), String::new()]));
        let mut bad_count = all.clone();
        bad_count.insert("pmix.2.n".into(), "x".into());
        assert!(fence_blobs(&bad_count, 4).unwrap_err().contains("pmix.2.n"));
        all.remove("pmix.0.3");
        assert_eq!(fence_blobs(&all, 4), Err("pmix.0.3: missing".to_string()));
    }

    #[test]
    fn a_lost_node_notice_names_tasks_and_hosts() {
        let v = json!({"id": 7, "leader": false, "lost_shells": [3], "tasks": [3, 7], "hosts": ["node3"], "note": ""});
        assert_eq!(LostNodes::from_notice(&v), Some(LostNodes { tasks: vec![3, 7], hosts: vec!["node3".into()] }));
        assert_eq!(LostNodes::from_notice(&json!({"lost_shells": [2], "tasks": []})), None, "a batch job's");
        assert_eq!(LostNodes::from_notice(&json!({"tasks": ["x"]})), None);
    }

    #[test]
    fn malformed_helper_messages_are_errors_naming_the_field() {
        assert_eq!(
            Event::decode(&json!({"fence": {"seq": 3, "data": "eHl6"}})),
            Ok(Event::Fence { seq: 3, data: "eHl6".into() })
        );
        assert!(Event::decode(&json!({"fence": {"seq": "3", "data": ""}})).unwrap_err().contains("fence.seq"));
        assert!(Event::decode(&json!({"fence": {"seq": 3, "data": "!!"}})).unwrap_err().contains("fence.data"));
        assert!(Event::decode(&json!({"abort": {"status": 7}})).unwrap_err().contains("abort.rank"));
        assert_eq!(
            Event::decode(&json!({"abort": {"rank": 5, "status": 7, "msg": "bye"}})),
            Ok(Event::Abort { rank: 5, status: 7, msg: "bye".into() })
        );
        assert_eq!(Event::decode(&json!({"connected": {"rank": 1}})), Ok(Event::Other));
    }
}

//! The line protocol between the job shell (`vigil-shell`) and its PMIx server helper (`vigil-pmix`): one JSON
//! object per line, each way, over the helper's stdin and stdout.
//!
//! Every message is an object with one key naming it (serde's external tagging: `{"fence": {"seq": 0, "data":
//! "..."}}`). Binary data (fence blobs) is standard base64. The conversation:
//!
//! 1. The shell sends [`Setup`]; the helper answers [`FromHelper::Ready`] (the environment of each local task) or
//!    [`FromHelper::Error`], and exits 1 after an error.
//! 2. The helper sends [`FromHelper::Fence`] for each fence of the local tasks, which the shell answers with
//!    [`ToHelper::FenceDone`] or [`ToHelper::FenceFailed`]; [`FromHelper::Abort`] when a task aborts the job;
//!    [`FromHelper::Connected`] and [`FromHelper::Finalized`] as tasks come and go.
//! 3. The shell closes the helper's input; the helper finalizes its server and exits 0.
//!
//! Both sides use these types, so they cannot drift apart; [`FromHelper::decode`] is the shell's decoder, which
//! names the field of a malformed message and passes over a kind of message it does not know.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The job as one node's PMIx server registers it; the first line the shell sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setup {
    /// The PMIx namespace of the job (`vigil.<jobid>`), at most 255 bytes (the helper checks).
    pub nspace: String,
    /// The job's id as users see it, in F58 (`PMIX_JOBID`).
    pub jobid: String,
    /// This node's index among the job's nodes (the shell rank: `PMIX_NODEID`, the server's rank).
    pub nodeid: u32,
    /// The job's task count (`PMIX_JOB_SIZE`, `PMIX_UNIV_SIZE`).
    pub size: u32,
    /// The global ranks of each node's tasks, by node index; this node's are `ranks[nodeid]`. Together a partition
    /// of `0..size` (the helper checks).
    pub ranks: Vec<Vec<u32>>,
    /// The host name of each node, by node index (`PMIX_NODE_MAP`, `PMIX_HOSTNAME`); as many as `ranks`.
    pub hosts: Vec<String>,
    /// The job's temporary directory on this node (`PMIX_TMPDIR`, `PMIX_NSDIR`, and where the server puts its
    /// rendezvous files).
    pub tmpdir: String,
}

/// The exit status of an abort that does not say one.
fn abort_status() -> i32 {
    1
}

/// What the helper sends to the shell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FromHelper {
    /// The server is up: the environment to add to each local task, by global rank.
    Ready {
        /// `PMIx_server_setup_fork`'s variables for each local task (none when absent).
        #[serde(default)]
        env: BTreeMap<u32, BTreeMap<String, String>>,
        /// The OpenPMIx version serving them (empty when absent).
        #[serde(default)]
        version: String,
    },
    /// The setup failed (the helper then exits 1).
    Error {
        /// Why, in one sentence.
        error: String,
    },
    /// The local tasks entered fence `seq` (numbered from 0 in the order they were entered): exchange `data` with
    /// every node's and answer [`ToHelper::FenceDone`] or [`ToHelper::FenceFailed`].
    Fence {
        /// The fence's number on this node.
        seq: u64,
        /// This node's blob for the fence, standard base64.
        data: String,
    },
    /// A task called `PMIx_Abort` (`MPI_Abort`): the whole job is to fail.
    Abort {
        /// The task's global rank.
        rank: u32,
        /// The status it asked the job to exit with (1 when absent).
        #[serde(default = "abort_status")]
        status: i32,
        /// Its message, if any (at most 1,024 characters from the helper; empty when absent).
        #[serde(default)]
        msg: String,
    },
    /// A task connected to the server (`PMIx_Init`).
    Connected {
        /// The task's global rank.
        rank: u32,
    },
    /// A task finalized (`PMIx_Finalize`).
    Finalized {
        /// The task's global rank.
        rank: u32,
    },
}

/// The names of [`FromHelper`]'s messages on the wire, in the order [`FromHelper::decode`] looks for them.
const FROM_HELPER_KINDS: [&str; 6] = ["fence", "abort", "ready", "error", "connected", "finalized"];

impl FromHelper {
    /// Decode one message of the helper (one line, parsed as JSON): `None` for a message of a kind this side does
    /// not know (from a newer helper), which is passed over.
    ///
    /// # Errors
    /// A message of a known kind that is malformed, naming the field: `fence.seq: invalid type: string "3",
    /// expected u64`, `abort.rank: missing`.
    pub fn decode(v: &Value) -> Result<Option<FromHelper>, String> {
        let Some(obj) = v.as_object() else { return Ok(None) };
        let Some((kind, body)) = FROM_HELPER_KINDS.iter().find_map(|k| obj.get_key_value(*k)) else {
            return Ok(None);
        };
        // Only the kind's key: anything beside it is not this message's.
        let one = Value::Object(serde_json::Map::from_iter([(kind.clone(), body.clone())]));
        serde_path_to_error::deserialize(&one).map(Some).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            // serde says a missing field in its parent's place: say it in the field's own.
            match inner.strip_prefix("missing field `").and_then(|f| f.strip_suffix('`')) {
                Some(field) => format!("{path}.{field}: missing"),
                None => format!("{path}: {inner}"),
            }
        })
    }
}

/// What the shell sends to the helper after the [`Setup`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToHelper {
    /// Fence `seq` completed: every node's blob, standard base64, in node order.
    FenceDone {
        /// The fence's number.
        seq: u64,
        /// The blobs.
        data: Vec<String>,
    },
    /// Fence `seq` failed (the job is failing).
    FenceFailed {
        /// The fence's number.
        seq: u64,
        /// Why.
        error: String,
    },
    /// Nodes of the job were lost and the job goes on (`-o on-node-loss=notify`): raise `PMIX_EVENT_NODE_DOWN`
    /// to this node's clients, the lost processes as `PMIX_EVENT_AFFECTED_PROCS`.
    NodeLost {
        /// The global ranks of the processes that ran on the lost nodes (each below the job's size, which the
        /// helper checks).
        ranks: Vec<u32>,
        /// The lost nodes' host names (the event's `vigil.lost.hosts`, comma-separated).
        hosts: Vec<String>,
    },
}

/// `m` as one line of the protocol: its JSON and a newline.
pub fn line<T: Serialize>(m: &T) -> String {
    // These types hold only strings, numbers and maps with integer or string keys: they always serialize.
    let mut s = serde_json::to_string(m).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every message goes through its line and comes back the same, on the side that reads it.
    #[test]
    fn every_message_comes_back_from_its_line() {
        let setup = Setup {
            nspace: "vigil.f2bN7".into(),
            jobid: "f2bN7".into(),
            nodeid: 1,
            size: 3,
            ranks: vec![vec![0, 2], vec![1]],
            hosts: vec!["node0".into(), "node1".into()],
            tmpdir: "/tmp/vigil-job-f2bN7-1".into(),
        };
        let l = line(&setup);
        assert!(l.ends_with('\n') && l.matches('\n').count() == 1, "one line: {l:?}");
        assert_eq!(serde_json::from_str::<Setup>(&l).unwrap(), setup);
        let env = BTreeMap::from([(2, BTreeMap::from([("PMIX_RANK".to_string(), "2".to_string())]))]);
        let from = [
            FromHelper::Ready { env, version: "4.2.2".into() },
            FromHelper::Error { error: "nspace: 0 bytes".into() },
            FromHelper::Fence { seq: 7, data: "eHl6".into() },
            FromHelper::Abort { rank: 2, status: -3, msg: "line one\nline \"two\"".into() },
            FromHelper::Connected { rank: 0 },
            FromHelper::Finalized { rank: 2 },
        ];
        for m in from {
            let l = line(&m);
            assert_eq!(l.matches('\n').count(), 1, "one line: {l:?}");
            let v: Value = serde_json::from_str(&l).unwrap();
            assert_eq!(FromHelper::decode(&v), Ok(Some(m)));
        }
        for m in [
            ToHelper::FenceDone { seq: 7, data: vec!["eHl6".into(), String::new()] },
            ToHelper::FenceFailed { seq: 8, error: "a node was lost".into() },
            ToHelper::NodeLost { ranks: vec![3, 7], hosts: vec!["node3".into()] },
        ] {
            assert_eq!(serde_json::from_str::<ToHelper>(&line(&m)).unwrap(), m);
        }
    }

    /// The wire is what the shell and the helper have always exchanged: one key naming the message.
    #[test]
    fn the_wire_names_each_message_by_one_key() {
        let v = |l: String| serde_json::from_str::<Value>(&l).unwrap();
        assert_eq!(
            v(line(&ToHelper::FenceDone { seq: 3, data: vec!["QQ==".into()] })),
            json!({"fence_done": {"seq": 3, "data": ["QQ=="]}})
        );
        assert_eq!(
            v(line(&ToHelper::FenceFailed { seq: 3, error: "e".into() })),
            json!({"fence_failed": {"seq": 3, "error": "e"}})
        );
        assert_eq!(
            v(line(&ToHelper::NodeLost { ranks: vec![3], hosts: vec!["node3".into()] })),
            json!({"node_lost": {"ranks": [3], "hosts": ["node3"]}})
        );
        assert_eq!(v(line(&FromHelper::Connected { rank: 4 })), json!({"connected": {"rank": 4}}));
        assert_eq!(
            v(line(&FromHelper::Abort { rank: 1, status: 9, msg: String::new() })),
            json!({"abort": {"rank": 1, "status": 9, "msg": ""}})
        );
        let setup = json!({"nspace": "vigil.a", "jobid": "a", "nodeid": 0, "size": 1, "ranks": [[0]],
            "hosts": ["h"], "tmpdir": "/t"});
        let s: Setup = serde_json::from_value(setup.clone()).unwrap();
        assert_eq!(v(line(&s)), setup);
    }

    #[test]
    fn malformed_messages_are_errors_naming_the_field_and_unknown_ones_are_passed_over() {
        let d = |v: Value| FromHelper::decode(&v);
        let e = d(json!({"fence": {"seq": "3", "data": ""}})).unwrap_err();
        assert!(e.starts_with("fence.seq: "), "{e}");
        assert_eq!(d(json!({"fence": {"seq": 3}})), Err("fence.data: missing".to_string()));
        assert_eq!(d(json!({"abort": {"status": 7}})), Err("abort.rank: missing".to_string()));
        assert_eq!(
            d(json!({"abort": {"rank": 5}})),
            Ok(Some(FromHelper::Abort { rank: 5, status: 1, msg: "".into() }))
        );
        assert_eq!(d(json!({"ready": {}})), Ok(Some(FromHelper::Ready { env: BTreeMap::new(), version: "".into() })));
        assert!(d(json!({"ready": {"env": {"x": {}}}})).unwrap_err().starts_with("ready.env"));
        assert_eq!(d(json!({"spawned": {"rank": 1}})), Ok(None));
        assert_eq!(d(json!([1, 2])), Ok(None));
    }
}

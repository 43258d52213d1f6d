//! PMI-1 server of the job shell (Flux RFC 13, the simple protocol MPICH speaks), as a sans-IO state machine.
//!
//! Each task gets one end of a socketpair as `PMI_FD`. The shell feeds every line a task sends to
//! [`PmiServer::handle`] and every closed connection to [`PmiServer::closed`], and carries out the returned
//! [`Out`]s: replies to tasks, a job-wide barrier exchange through the overlay (once per barrier per shell, with
//! the puts made since the previous barrier), or a fatal job exception (abort, early close, protocol error).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use vigil_proto::pmi::{Line, LineError, KEYLEN_MAX, KVSNAME_MAX, VALLEN_MAX};

/// Something the shell must do for the PMI server.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Out {
    /// Send this line to task `rank`.
    Reply(u32, Line),
    /// Every local task entered the barrier: exchange these puts with the other shells, then call
    /// [`PmiServer::barrier_done`] with everyone's puts.
    Barrier(BTreeMap<String, String>),
    /// Bring the job down with a fatal exception carrying this note; `exit_code` is set for `abort`.
    Fatal {
        /// Exception note.
        note: String,
        /// Exit code requested by `abort`.
        exit_code: Option<i32>,
    },
}

#[derive(Default, Debug)]
struct TaskState {
    init: bool,
    finalized: bool,
}

/// PMI-1 server state for the tasks of one shell.
#[derive(Debug)]
pub(crate) struct PmiServer {
    kvsname: String,
    size: u32,
    local: BTreeSet<u32>,
    mapping: String,
    kvs: HashMap<String, String>,
    pending: BTreeMap<String, String>,
    in_barrier: BTreeSet<u32>,
    exchanging: bool,
    tasks: HashMap<u32, TaskState>,
    failed: bool,
}

impl PmiServer {
    /// A server for a job of `size` tasks named `kvsname`, of which this shell runs `local` (global ranks);
    /// `mapping` is the `PMI_process_mapping` value.
    pub(crate) fn new(kvsname: String, size: u32, local: impl IntoIterator<Item = u32>, mapping: String) -> PmiServer {
        PmiServer {
            kvsname,
            size,
            local: local.into_iter().collect(),
            mapping,
            kvs: HashMap::new(),
            pending: BTreeMap::new(),
            in_barrier: BTreeSet::new(),
            exchanging: false,
            tasks: HashMap::new(),
            failed: false,
        }
    }

    fn fatal(&mut self, note: String, exit_code: Option<i32>) -> Vec<Out> {
        if self.failed {
            return vec![];
        }
        self.failed = true;
        vec![Out::Fatal { note, exit_code }]
    }

    /// A raw line from task `rank`. Malformed lines get an error reply when the command is known, else the job
    /// fails cleanly; nothing here panics.
    pub(crate) fn handle(&mut self, rank: u32, raw: &[u8]) -> Vec<Out> {
        let line = match Line::parse(raw) {
            Ok(l) => l,
            Err(LineError::Empty) => return vec![],
            Err(e) => return self.fatal(format!("task {rank}: PMI protocol error: {e}"), None),
        };
        let ok = |cmd: &str, args: &[(&str, &str)]| {
            let mut a: Vec<(&str, &str)> = vec![("rc", "0")];
            a.extend_from_slice(args);
            Out::Reply(rank, Line::new(cmd, &a))
        };
        let err = |cmd: &str, msg: &str| Out::Reply(rank, Line::new(cmd, &[("rc", "-1"), ("msg", msg)]));
        let st = self.tasks.entry(rank).or_default();
        match line.cmd.as_str() {
            "init" => {
                st.init = true;
                let v = line.get("pmi_version").unwrap_or("1");
                if v != "1" {
                    return vec![err("response_to_init", "unsupported_version")];
                }
                vec![ok("response_to_init", &[("pmi_version", "1"), ("pmi_subversion", "1")])]
            }
            "get_maxes" => vec![ok(
                "maxes",
                &[
                    ("kvsname_max", &KVSNAME_MAX.to_string()),
                    ("keylen_max", &KEYLEN_MAX.to_string()),
                    ("vallen_max", &VALLEN_MAX.to_string()),
                ],
            )],
            "get_appnum" => vec![ok("appnum", &[("appnum", "0")])],
            "get_universe_size" => vec![ok("universe_size", &[("size", &self.size.to_string())])],
            "get_my_kvsname" => vec![ok("my_kvsname", &[("kvsname", &self.kvsname.clone())])],
            "put" => {
                let (Some(k), Some(v)) = (line.get("key"), line.get("value")) else {
                    return vec![err("put_result", "missing_key_or_value")];
                };
                if k.len() > KEYLEN_MAX || v.len() > VALLEN_MAX {
                    return vec![err("put_result", "key_or_value_too_long")];
                }
                if line.get("kvsname").is_some_and(|n| n != self.kvsname) {
                    return vec![err("put_result", "unknown_kvsname")];
                }
                self.pending.insert(k.to_string(), v.to_string());
                self.kvs.insert(k.to_string(), v.to_string());
                vec![ok("put_result", &[])]
            }
            "get" => {
                let Some(k) = line.get("key") else { return vec![err("get_result", "missing_key")] };
                // An empty mapping (one that does not fit in a PMI value) is left out: the task finds no key, as
                // under a launcher that gives none, rather than a wrong or truncated map.
                if k == "PMI_process_mapping" && !self.mapping.is_empty() {
                    let m = self.mapping.clone();
                    return vec![ok("get_result", &[("value", &m)])];
                }
                match self.kvs.get(k) {
                    Some(v) => {
                        let v = v.clone();
                        vec![ok("get_result", &[("value", &v)])]
                    }
                    None => vec![err("get_result", "key_not_found")],
                }
            }
            "barrier_in" => {
                if !self.in_barrier.insert(rank) {
                    return self.fatal(format!("task {rank}: PMI barrier entered twice"), None);
                }
                self.maybe_exchange()
            }
            "finalize" => {
                st.finalized = true;
                vec![ok("finalize_ack", &[])]
            }
            "abort" => {
                let code = line.get("exitcode").and_then(|c| c.parse::<i32>().ok()).unwrap_or(1);
                let msg = line.get("error_msg").map(|m| format!(": {m}")).unwrap_or_default();
                self.fatal(format!("task {rank}: MPI_Abort / PMI abort with exit code {code}{msg}"), Some(code))
            }
            other => {
                // Echoed clipped: the reply to a 1000-byte command name must still fit in a PMI line.
                let o: String = other.chars().take(64).collect();
                vec![Out::Reply(rank, Line::new(&format!("{o}_result"), &[("rc", "-1"), ("msg", "unknown_command")]))]
            }
        }
    }

    fn maybe_exchange(&mut self) -> Vec<Out> {
        if self.exchanging || !self.local.iter().all(|r| self.in_barrier.contains(r)) {
            return vec![];
        }
        self.exchanging = true;
        vec![Out::Barrier(std::mem::take(&mut self.pending))]
    }

    /// The job-wide barrier completed with everyone's puts: merge them and release the local tasks.
    pub(crate) fn barrier_done(&mut self, all: BTreeMap<String, String>) -> Vec<Out> {
        self.kvs.extend(all);
        self.exchanging = false;
        let ranks: Vec<u32> = std::mem::take(&mut self.in_barrier).into_iter().collect();
        ranks.into_iter().map(|r| Out::Reply(r, Line::new("barrier_out", &[("rc", "0")]))).collect()
    }

    /// Task `rank` closed its PMI connection (or exited). Fatal if it had called `init` but not `finalize`:
    /// the other tasks would otherwise hang in the next barrier.
    pub(crate) fn closed(&mut self, rank: u32) -> Vec<Out> {
        let st = self.tasks.entry(rank).or_default();
        if st.init && !st.finalized {
            return self
                .fatal(format!("task {rank} closed its PMI connection before PMI_Finalize (exited or crashed)"), None);
        }
        vec![]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn srv() -> PmiServer {
        PmiServer::new("kvs-1".into(), 4, [0, 1], "(vector,(0,2,2))".into())
    }

    fn reply(o: &[Out]) -> &Line {
        match &o[0] {
            Out::Reply(_, l) => l,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn every_command() {
        let mut s = srv();
        let r = s.handle(0, b"cmd=init pmi_version=1 pmi_subversion=1\n");
        assert_eq!(reply(&r).encode(), "cmd=response_to_init pmi_subversion=1 pmi_version=1 rc=0\n");
        assert_eq!(reply(&s.handle(0, b"cmd=get_maxes\n")).get("vallen_max"), Some(&*VALLEN_MAX.to_string()));
        assert_eq!(reply(&s.handle(0, b"cmd=get_appnum\n")).get("appnum"), Some("0"));
        assert_eq!(reply(&s.handle(0, b"cmd=get_universe_size\n")).get("size"), Some("4"));
        assert_eq!(reply(&s.handle(0, b"cmd=get_my_kvsname\n")).get("kvsname"), Some("kvs-1"));
        assert_eq!(
            reply(&s.handle(0, b"cmd=get kvsname=kvs-1 key=PMI_process_mapping\n")).get("value"),
            Some("(vector,(0,2,2))")
        );
        assert_eq!(reply(&s.handle(0, b"cmd=put kvsname=kvs-1 key=a value=b=c\n")).get("rc"), Some("0"));
        assert_eq!(reply(&s.handle(1, b"cmd=get kvsname=kvs-1 key=a\n")).get("value"), Some("b=c"));
        let miss = s.handle(1, b"cmd=get kvsname=kvs-1 key=nope\n");
        assert_eq!(reply(&miss).get("rc"), Some("-1"));
        assert_eq!(reply(&miss).cmd, "get_result");
        assert_eq!(reply(&s.handle(0, b"cmd=finalize\n")).cmd, "finalize_ack");
        assert!(s.closed(0).is_empty(), "finalized tasks may close");
        assert_eq!(reply(&s.handle(0, b"cmd=bogus\n")).get("msg"), Some("unknown_command"));
    }

    /// A cyclic task map: this shell runs ranks 0 and 2 of 4; the mapping describes it, and without one (too
    /// long for a PMI value) the key is absent.
    #[test]
    fn cyclic_ranks_and_their_mapping() {
        let mut s = PmiServer::new("kvs-1".into(), 4, [0, 2], "(vector,(0,2,1),(0,2,1))".into());
        assert_eq!(reply(&s.handle(2, b"cmd=get_universe_size\n")).get("size"), Some("4"));
        let m = s.handle(2, b"cmd=get kvsname=kvs-1 key=PMI_process_mapping\n");
        assert_eq!(reply(&m).get("value"), Some("(vector,(0,2,1),(0,2,1))"));
        assert!(s.handle(0, b"cmd=barrier_in\n").is_empty(), "waits for local rank 2, not 1");
        assert!(matches!(s.handle(2, b"cmd=barrier_in\n")[0], Out::Barrier(_)));
        let mut none = PmiServer::new("kvs-1".into(), 4, [0, 2], String::new());
        let m = none.handle(0, b"cmd=get kvsname=kvs-1 key=PMI_process_mapping\n");
        assert_eq!(reply(&m).get("rc"), Some("-1"));
    }

    #[test]
    fn barrier_exchanges_once_per_shell() {
        let mut s = srv();
        s.handle(0, b"cmd=put kvsname=kvs-1 key=k0 value=v0\n");
        s.handle(1, b"cmd=put kvsname=kvs-1 key=k1 value=v1\n");
        assert!(s.handle(0, b"cmd=barrier_in\n").is_empty(), "waits for the other local task");
        let o = s.handle(1, b"cmd=barrier_in\n");
        let Out::Barrier(puts) = &o[0] else { panic!("{o:?}") };
        assert_eq!(puts.len(), 2);
        let mut all = puts.clone();
        all.insert("remote".into(), "x".into());
        let out = s.barrier_done(all);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|o| matches!(o, Out::Reply(_, l) if l.cmd == "barrier_out")));
        assert_eq!(reply(&s.handle(0, b"cmd=get kvsname=kvs-1 key=remote\n")).get("value"), Some("x"));
        // The next barrier only carries new puts.
        s.handle(0, b"cmd=barrier_in\n");
        let o = s.handle(1, b"cmd=barrier_in\n");
        assert_eq!(o, vec![Out::Barrier(BTreeMap::new())]);
    }

    #[test]
    fn abort_early_close_and_garbage_are_fatal_once() {
        let mut s = srv();
        let o = s.handle(0, b"cmd=abort exitcode=7\n");
        assert!(matches!(&o[0], Out::Fatal { exit_code: Some(7), .. }));
        assert!(s.handle(1, b"cmd=abort exitcode=8\n").is_empty(), "only the first failure is reported");

        let mut s = srv();
        s.handle(1, b"cmd=init pmi_version=1 pmi_subversion=1\n");
        let o = s.closed(1);
        assert!(matches!(&o[0], Out::Fatal { note, .. } if note.contains("before PMI_Finalize")));
        let mut s = srv();
        assert!(s.closed(0).is_empty(), "a task that never used PMI may exit");
        let o = s.handle(0, b"this is not pmi\n");
        assert!(matches!(&o[0], Out::Fatal { note, .. } if note.contains("protocol error")));
        let mut s = srv();
        let o = s.handle(0, &[b'x'; 2000]);
        assert!(matches!(&o[0], Out::Fatal { .. }));
    }

    #[test]
    fn long_values_are_segmented_by_the_client() {
        let mut s = srv();
        let long = "v".repeat(VALLEN_MAX + 1);
        let o = s.handle(0, format!("cmd=put kvsname=kvs-1 key=big value={}\n", &long[..VALLEN_MAX - 100]).as_bytes());
        assert_eq!(reply(&o).get("rc"), Some("0"));
        // MPICH splits what exceeds vallen_max into key-seg-i/N keys; each segment is an ordinary key.
        for i in 1..=3 {
            let o = s.handle(0, format!("cmd=put kvsname=kvs-1 key=big-seg-{i}/3 value=part{i}\n").as_bytes());
            assert_eq!(reply(&o).get("rc"), Some("0"));
        }
        assert_eq!(reply(&s.handle(1, b"cmd=get kvsname=kvs-1 key=big-seg-2/3\n")).get("value"), Some("part2"));
    }

    /// One thing that happens to a PMI server: a line from a task, a task closing its connection, or the end of
    /// a job-wide barrier with the other shells' puts.
    #[derive(Debug, Clone)]
    enum Event {
        Line(u32, Vec<u8>),
        Closed(u32),
        BarrierDone(BTreeMap<String, String>),
    }

    /// Lines a task could send: arbitrary bytes, or PMI-shaped text with known and unknown commands.
    fn pmi_line() -> impl Strategy<Value = Vec<u8>> {
        let cmd = prop_oneof![
            Just("init".to_string()),
            Just("get_maxes".to_string()),
            Just("get_universe_size".to_string()),
            Just("get_my_kvsname".to_string()),
            Just("put".to_string()),
            Just("get".to_string()),
            Just("barrier_in".to_string()),
            Just("finalize".to_string()),
            Just("abort".to_string()),
            "[a-z_=]{0,1020}",
        ];
        let token = ("[a-z_]{1,8}|key|value|kvsname|pmi_version|exitcode", "[a-zA-Z0-9=\\-]{0,300}")
            .prop_map(|(k, v)| format!("{k}={v}"));
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..1100),
            (cmd, proptest::collection::vec(token, 0..4), "[ \\n]{0,2}").prop_map(|(c, t, end)| {
                let mut l = format!("cmd={c}");
                for t in t {
                    l.push(' ');
                    l.push_str(&t);
                }
                l.push_str(&end);
                l.into_bytes()
            }),
        ]
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            8 => (0u32..3, pmi_line()).prop_map(|(r, l)| Event::Line(r, l)),
            1 => (0u32..3).prop_map(Event::Closed),
            1 => proptest::collection::btree_map("[a-z]{1,4}", "[a-z=]{0,8}", 0..3).prop_map(Event::BarrierDone),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// An unknown command gets an error reply that fits in a PMI line, however long its name.
        #[test]
        fn unknown_commands_get_a_reply_that_fits(name in "[a-z_]{900,1020}") {
            let out = srv().handle(0, format!("cmd={name}\n").as_bytes());
            for o in out {
                if let Out::Reply(_, l) = o {
                    prop_assert!(l.encode().len() <= vigil_proto::pmi::MAX_LINE, "{} bytes", l.encode().len());
                }
            }
        }

        /// Whatever tasks send, the server never panics and every reply is a PMI line a task can read back
        /// (within `MAX_LINE`, parsing to the same line).
        #[test]
        fn arbitrary_lines_never_panic_and_replies_are_pmi_lines(
            events in proptest::collection::vec(event(), 1..16),
        ) {
            let mut s = srv();
            for e in events {
                let out = match e {
                    Event::Line(r, l) => s.handle(r, &l),
                    Event::Closed(r) => s.closed(r),
                    Event::BarrierDone(all) => s.barrier_done(all),
                };
                for o in out {
                    if let Out::Reply(_, l) = o {
                        let text = l.encode();
                        prop_assert!(text.len() <= vigil_proto::pmi::MAX_LINE, "reply too long: {} bytes", text.len());
                        prop_assert_eq!(text.find('\n'), Some(text.len() - 1), "one line: {:?}", text);
                        prop_assert_eq!(Line::parse(text.as_bytes()), Ok(l));
                    }
                }
            }
        }
    }
}

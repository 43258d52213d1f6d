//! Which variant of each detector a kernel runs: the pure rule [`plan`] from [`KernelFeatures`] to a
//! [`DetectorPlan`] (one [`Choice`] per detector: `ebpf (variant)` or `userspace (why)`). No I/O here: the
//! features are probed (or read from a recording) in `features.rs`, the plan is carried out by the driver
//! (`runtime/driver/src/broker/detect/load.rs`), which loads only what the plan says can load and shows each
//! choice in `vigil overlay status`. The floors below come from the kernel sources; docs/failure-detection.md
//! has the table per kernel, and the unit tests judge feature sets recorded on real kernels.
//!
//! What each BPF object needs (`bpf/*.bpf.c`):
//! - `exit.bpf.o` (process exit): three `BPF_PROG_TYPE_TRACEPOINT` programs (4.7) on `sched/sched_process_exit`,
//!   `signal/signal_generate` (fields `sig code pid result`) and `oom/mark_victim` (`pid`); maps `HASH`,
//!   `LRU_HASH` (4.10), `RINGBUF` (5.8); helpers `get_current_task` (4.8), `probe_read_kernel` (5.5, the CO-RE
//!   reads of `task_struct`), `ringbuf_output` (5.8); CO-RE relocations against the kernel's BTF (5.4).
//!   `group_dead` of `sched_process_exit` (6.16) is read where it exists, else `signal->live`.
//! - `tcp.bpf.o` (TCP): tracepoint programs on `sock/inet_sock_set_state` (4.16), `tcp/tcp_receive_reset` and
//!   `tcp/tcp_retransmit_skb` (4.15); maps `HASH`, `RINGBUF`; helpers `probe_read_kernel`, `ringbuf_output`; CO-RE.
//!   The records' `family` (5.12) and the retransmit record's `state` are read where they exist, else from the
//!   socket (`skaddr`); the retransmit record of its own (6.17) or of the class `tcp_event_sk_skb` before.
//! - `exit-perfbuf.bpf.o`, `tcp-perfbuf.bpf.o` (`bpf/output.h`): the same programs with `PERF_EVENT_ARRAY` (4.3)
//!   and `perf_event_output` instead of the ring buffer, and `probe_read` (4.1) for the CO-RE reads: the
//!   [`EventChannel::PerfBuffer`] variant, for kernels without the ring buffer or `probe_read_kernel`.
//! - `xdp.bpf.o` (heartbeat responder): `BPF_PROG_TYPE_XDP` (4.8, generic mode on any interface 4.12); maps `HASH`,
//!   `LRU_HASH`, `ARRAY` with `BPF_F_MMAPABLE` (5.5); no CO-RE relocation the kernel's BTF must resolve (the
//!   packet headers are UAPI), so it loads without BTF.

use crate::KernelFeatures;

/// One detector's choice: the eBPF variant it runs, or the userspace fallback and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Load the BPF programs; the text says which variant (e.g. `classic tracepoints, CO-RE, ring buffer; ...`).
    Ebpf(String),
    /// Do not try: the kernel lacks something the programs need (e.g. `needs kernel >= 5.8: ...`).
    Userspace(String),
}

impl Choice {
    /// True for [`Choice::Ebpf`].
    pub fn is_ebpf(&self) -> bool {
        matches!(self, Choice::Ebpf(_))
    }
}

impl std::fmt::Display for Choice {
    /// `ebpf (variant)` or `userspace (reason)`: the wording of the detectors' status lines.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Choice::Ebpf(v) => write!(f, "ebpf ({v})"),
            Choice::Userspace(why) => write!(f, "userspace ({why})"),
        }
    }
}

/// How the tracing programs hand their events to userspace (`bpf/output.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EventChannel {
    /// `BPF_MAP_TYPE_RINGBUF` (Linux 5.8) and CO-RE reads through `bpf_probe_read_kernel` (5.5): the default objects.
    #[default]
    RingBuffer,
    /// `BPF_MAP_TYPE_PERF_EVENT_ARRAY` (4.3), one buffer per CPU, and CO-RE reads through `bpf_probe_read` (4.1):
    /// the `*-perfbuf` objects, for kernels without the ring buffer or `bpf_probe_read_kernel`.
    PerfBuffer,
}

impl std::fmt::Display for EventChannel {
    /// `ring buffer` / `perf buffer`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EventChannel::RingBuffer => "ring buffer",
            EventChannel::PerfBuffer => "perf buffer",
        })
    }
}

/// The choice for each detector a broker runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectorPlan {
    /// Process exit, signal origin and OOM victim (`exit.bpf.o`).
    pub process_exit: Choice,
    /// The overlay's TCP connections (`tcp.bpf.o`).
    pub tcp: Choice,
    /// The heartbeat responder (`xdp.bpf.o`).
    pub responder: Choice,
    /// The objects the two tracing detectors load, where they run on eBPF.
    pub channel: EventChannel,
}

const EXIT: &str = "sched/sched_process_exit";
const SIGNAL: &str = "signal/signal_generate";
const OOM: &str = "oom/mark_victim";
const SET_STATE: &str = "sock/inet_sock_set_state";
const RETRANSMIT: &str = "tcp/tcp_retransmit_skb";
const RESET: &str = "tcp/tcp_receive_reset";

/// `userspace (needs kernel >= V: what; this kernel (R) has none)`.
fn needs(f: &KernelFeatures, version: &str, what: &str) -> Choice {
    Choice::Userspace(format!("needs kernel >= {version}: {what}; kernel {} has none", f.release))
}

/// The requirements the two tracing objects share (tracepoint programs, CO-RE, a way to hand events over), in the
/// order a reader would fix them: the channel and its words for the variant, or why not.
fn tracing_floor(f: &KernelFeatures) -> Result<(EventChannel, &'static str), Choice> {
    match tracing_needs(f) {
        Some(c) => Err(c),
        None if f.ringbuf && f.probe_read_kernel => Ok((EventChannel::RingBuffer, "ring buffer")),
        None if !f.ringbuf => Ok((EventChannel::PerfBuffer, "perf buffer (no ring buffer before 5.8)")),
        None => Ok((EventChannel::PerfBuffer, "perf buffer, bpf_probe_read (no bpf_probe_read_kernel before 5.5)")),
    }
}

/// What neither channel can do without: `Some(userspace (...))` if the kernel lacks it.
fn tracing_needs(f: &KernelFeatures) -> Option<Choice> {
    if !f.prog_tracepoint {
        return Some(needs(f, "4.7", "BPF tracepoint programs"));
    }
    if f.lockdown.as_deref() == Some("confidentiality") {
        return Some(Choice::Userspace(
            "kernel lockdown=confidentiality: BPF programs may not read kernel memory".into(),
        ));
    }
    if !f.btf {
        return Some(needs(
            f,
            "5.4",
            "kernel BTF (/sys/kernel/btf/vmlinux) for the CO-RE reads of tracepoint records and task_struct",
        ));
    }
    if !f.ringbuf && !f.perf_event_array {
        return Some(needs(f, "4.3", "a BPF ring buffer (5.8) or perf event array (4.3) for the events"));
    }
    None
}

/// `Some(userspace (...))` if tracepoint `tp` is missing or lacks one of `fields`.
fn record_lacks(f: &KernelFeatures, tp: &str, fields: &[&str]) -> Option<Choice> {
    if !f.has_tracepoint(tp) {
        return Some(Choice::Userspace(format!("kernel {} has no tracepoint {tp}", f.release)));
    }
    fields
        .iter()
        .find(|x| !f.has_field(tp, x))
        .map(|x| Choice::Userspace(format!("tracepoint {tp} of kernel {} has no field {x}", f.release)))
}

/// The process-exit detector's choice.
pub fn process_exit_choice(f: &KernelFeatures) -> Choice {
    let channel = match tracing_floor(f) {
        Ok((_, words)) => words,
        Err(c) => return c,
    };
    if !f.lru_hash {
        return needs(f, "4.10", "the LRU hash map (pending signals)");
    }
    let lacks = record_lacks(f, EXIT, &[])
        .or_else(|| record_lacks(f, SIGNAL, &["sig", "code", "pid", "result"]))
        .or_else(|| record_lacks(f, OOM, &["pid"]));
    if let Some(c) = lacks {
        return c;
    }
    let last_thread = if f.has_field(EXIT, "group_dead") {
        "last thread by group_dead"
    } else {
        "last thread by signal->live (no group_dead before 6.16)"
    };
    Choice::Ebpf(format!("classic tracepoints, CO-RE, {channel}; {last_thread}; kernel {}", f.release))
}

/// The TCP detector's choice.
pub fn tcp_choice(f: &KernelFeatures) -> Choice {
    let channel = match tracing_floor(f) {
        Ok((_, words)) => words,
        Err(c) => return c,
    };
    let set_state = ["oldstate", "newstate", "family", "protocol", "sport", "dport", "saddr", "daddr"];
    let with_sk = ["skaddr", "sport", "dport", "saddr", "daddr"];
    let lacks = record_lacks(f, SET_STATE, &set_state)
        .or_else(|| record_lacks(f, RESET, &with_sk))
        .or_else(|| record_lacks(f, RETRANSMIT, &with_sk));
    if let Some(c) = lacks {
        return c;
    }
    let mut notes = vec![if f.has_field(RETRANSMIT, "err") {
        "retransmit record of its own (6.17)"
    } else {
        "retransmit record of class tcp_event_sk_skb"
    }];
    if !f.has_field(RESET, "family") || !f.has_field(RETRANSMIT, "family") {
        notes.push("family read from the socket (records before 5.12 lack it)");
    }
    if !f.has_field(RETRANSMIT, "state") {
        notes.push("retransmit state read from the socket");
    }
    Choice::Ebpf(format!("classic tracepoints, CO-RE, {channel}; {}; kernel {}", notes.join(", "), f.release))
}

/// The heartbeat responder's choice (`xdp (mode on interface)` replaces the variant once attached).
pub fn responder_choice(f: &KernelFeatures) -> Choice {
    if !f.prog_xdp {
        return needs(f, "4.8", "XDP programs");
    }
    if !f.lru_hash {
        return needs(f, "4.10", "the LRU hash map (parents of group probes)");
    }
    if !f.mmapable_array {
        return needs(f, "5.5", "mmapable BPF arrays (BPF_F_MMAPABLE: the reply collector)");
    }
    Choice::Ebpf(format!("XDP; kernel {}", f.release))
}

/// Judges a kernel: the choice of every detector. Pure: same features, same plan.
pub fn plan(f: &KernelFeatures) -> DetectorPlan {
    DetectorPlan {
        process_exit: process_exit_choice(f),
        tcp: tcp_choice(f),
        responder: responder_choice(f),
        channel: tracing_floor(f).map(|(c, _)| c).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorded feature set of `tests/kernels/`.
    fn kernel(name: &str) -> KernelFeatures {
        let text = match name {
            "4.18" => include_str!("../tests/kernels/4.18.txt"),
            "4.18-rhel8-backports" => include_str!("../tests/kernels/4.18-rhel8-backports.txt"),
            "5.14" => include_str!("../tests/kernels/5.14.txt"),
            "5.15" => include_str!("../tests/kernels/5.15.txt"),
            "6.1" => include_str!("../tests/kernels/6.1.txt"),
            "6.18" => include_str!("../tests/kernels/6.18.txt"),
            n => panic!("no recorded kernel {n}"),
        };
        KernelFeatures::from_text(text).unwrap_or_else(|e| panic!("tests/kernels/{name}.txt: {e}"))
    }

    fn text(c: &Choice) -> String {
        c.to_string()
    }

    #[test]
    fn mainline_4_18_runs_the_tracing_detectors_in_userspace_and_says_which_feature_is_missing() {
        let p = plan(&kernel("4.18"));
        // No kernel BTF before 5.4: the CO-RE reads could not be relocated (aya would load them with the build
        // machine's offsets), so they are not tried.
        assert!(text(&p.process_exit).starts_with("userspace (needs kernel >= 5.4: kernel BTF"), "{p:?}");
        assert!(text(&p.tcp).starts_with("userspace (needs kernel >= 5.4: kernel BTF"), "{p:?}");
        assert!(text(&p.responder).starts_with("userspace (needs kernel >= 5.5: mmapable BPF arrays"), "{p:?}");
    }

    #[test]
    fn a_4_18_kernel_with_backports_is_judged_by_its_features_and_reads_old_records_from_the_socket() {
        let p = plan(&kernel("4.18-rhel8-backports"));
        assert!(p.process_exit.is_ebpf() && p.tcp.is_ebpf() && p.responder.is_ebpf(), "{p:?}");
        assert_eq!(p.channel, EventChannel::RingBuffer);
        assert!(text(&p.process_exit).contains("signal->live"), "{p:?}");
        let tcp = text(&p.tcp);
        assert!(tcp.contains("family read from the socket") && tcp.contains("state read from the socket"), "{tcp}");
        assert!(tcp.contains("class tcp_event_sk_skb"), "{tcp}");
    }

    #[test]
    fn a_kernel_with_btf_but_without_the_ring_buffer_runs_the_perf_buffer_variant() {
        let mut f = kernel("4.18-rhel8-backports");
        f.ringbuf = false;
        let p = plan(&f);
        assert_eq!(p.channel, EventChannel::PerfBuffer);
        assert!(
            text(&p.process_exit)
                .starts_with("ebpf (classic tracepoints, CO-RE, perf buffer (no ring buffer before 5.8)"),
            "{p:?}"
        );
        assert!(text(&p.tcp).starts_with("ebpf (classic tracepoints, CO-RE, perf buffer"), "{p:?}");
        // 5.4 itself: BTF, neither the ring buffer nor bpf_probe_read_kernel (5.5), nor mmapable arrays (5.5).
        let mut f = kernel("5.14");
        (f.release, f.ringbuf, f.probe_read_kernel, f.mmapable_array) = ("5.4.0".into(), false, false, false);
        let p = plan(&f);
        assert_eq!(p.channel, EventChannel::PerfBuffer);
        assert!(p.process_exit.is_ebpf() && p.tcp.is_ebpf(), "{p:?}");
        assert!(text(&p.responder).starts_with("userspace (needs kernel >= 5.5: mmapable BPF arrays"), "{p:?}");
        // Without the ring buffer and the perf event array, nothing to hand the events over.
        f.perf_event_array = false;
        assert!(text(&plan(&f).tcp).starts_with("userspace (needs kernel >= 4.3: a BPF ring buffer (5.8) or perf"));
    }

    #[test]
    fn rhel_9_and_ubuntu_22_04_run_every_detector_on_ebpf_with_the_old_exit_record() {
        for k in ["5.14", "5.15"] {
            let p = plan(&kernel(k));
            let exit = text(&p.process_exit);
            assert!(
                exit.starts_with("ebpf (classic tracepoints, CO-RE, ring buffer; last thread by signal->live"),
                "{k}: {exit}"
            );
            let tcp = text(&p.tcp);
            assert!(tcp.starts_with("ebpf (") && tcp.contains("class tcp_event_sk_skb"), "{k}: {tcp}");
            assert!(!tcp.contains("from the socket"), "{k} records have family and state: {tcp}");
            assert!(p.responder.is_ebpf(), "{k}: {p:?}");
        }
    }

    #[test]
    fn debian_12_recorded_in_the_vm_runs_every_detector_on_ebpf() {
        let p = plan(&kernel("6.1"));
        assert!(text(&p.process_exit).contains("signal->live (no group_dead before 6.16)"), "{p:?}");
        assert!(text(&p.tcp).contains("class tcp_event_sk_skb"), "{p:?}");
        assert!(p.responder.is_ebpf(), "{p:?}");
    }

    #[test]
    fn the_build_machine_6_18_uses_group_dead_and_the_new_retransmit_record() {
        let p = plan(&kernel("6.18"));
        assert!(text(&p.process_exit).contains("last thread by group_dead;"), "{p:?}");
        assert!(text(&p.tcp).contains("retransmit record of its own (6.17)"), "{p:?}");
        assert!(p.responder.is_ebpf(), "{p:?}");
    }

    #[test]
    fn lockdown_confidentiality_and_a_missing_field_fall_back_alone() {
        let mut f = kernel("6.18");
        f.lockdown = Some("confidentiality".into());
        let p = plan(&f);
        assert!(text(&p.process_exit).contains("lockdown=confidentiality") && p.responder.is_ebpf(), "{p:?}");
        let mut f = kernel("6.18");
        f.tracepoints.get_mut(SIGNAL).unwrap().retain(|x| x != "result");
        let p = plan(&f);
        assert!(text(&p.process_exit).contains("signal/signal_generate of kernel") && p.tcp.is_ebpf(), "{p:?}");
    }
}

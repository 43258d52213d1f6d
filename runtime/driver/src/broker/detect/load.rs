//! Loading the eBPF detectors and taking them into use, with the one report of what degraded.
//!
//! Loading (aya parses the kernel's BTF, the verifier runs: ~0.1 s of CPU) happens on a thread of its own once the
//! broker has joined the overlay ([`load`], started by `Detectors::begin_load`): the process-exit and TCP
//! watchers, and the XDP heartbeat responder on the interface that carries the overlay address. One broker per
//! machine loads them (`broker.detector-rank` in a test instance); the others, and a broker that finds another
//! Vigil broker's program already attached, share its responder table through pins on bpffs ([`PIN_DIR`]),
//! which are swept when nothing uses them any more. [`Detectors::loaded`] then starts the watchers' tasks
//! (`watch.rs`), registers this broker with the responder and logs, once, what runs and what fell back to
//! userspace (a warning unless everything is eBPF, shared, forced or in a nested instance). Before loading, the
//! kernel is judged ([`judge_kernel`]): its features are probed (`vigil_ebpf::KernelFeatures`) and the pure rule
//! `vigil_ebpf::plan` (`ebpf/src/choice.rs`) says per detector which variant loads (ring buffer or perf buffer
//! objects) or why it stays in userspace; the status lines show that choice. Each detector and its fallback is in
//! docs/failure-detection.md ("The detectors", "Which variant a kernel runs").

use super::prober_thread::ProbeCmd;
use super::watch::{exit_task, tcp_task};
use super::Detectors;
use crate::attrs::{BrokerConfig, DetectorChoice, XdpMode};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};
use vigil_ebpf::{
    Choice, Detector, DetectorMode, DetectorPlan, HbTable, KernelFeatures, PidfdWatcher, TcpWatcher, XdpAttach,
    XdpResponder,
};

/// How the detectors are chosen (`broker.detectors`; with `auto`, `$VIGIL_EXIT_DETECTOR` may still force one).
pub(super) fn mode(c: &BrokerConfig) -> DetectorMode {
    match c.detectors {
        DetectorChoice::Userspace => DetectorMode::ForceUserspace,
        DetectorChoice::Ebpf => DetectorMode::RequireEbpf,
        DetectorChoice::Auto => DetectorMode::from_env(),
    }
}

/// `broker.xdp_mode=auto|native|generic`: how the XDP responder is attached (default `auto`: native on an
/// interface with a device behind it, generic on `lo` and veth).
pub(super) fn xdp_attach(c: &BrokerConfig) -> XdpAttach {
    match c.xdp_mode {
        XdpMode::Auto => XdpAttach::Auto,
        XdpMode::Native => XdpAttach::Native,
        XdpMode::Generic => XdpAttach::Generic,
    }
}

/// Directory (on bpffs) of the responder tables the brokers of a machine share.
const PIN_DIR: &str = "/sys/fs/bpf/vigil";

/// Where to pin the responder table shared by the brokers of one test instance (derived from the instance
/// id without revealing it).
pub(super) fn table_pin_path(instance: &str) -> std::path::PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (instance, "vigil-hb").hash(&mut h);
    std::path::PathBuf::from(format!("{PIN_DIR}/{}{:016x}", vigil_ebpf::TABLE_PREFIX, h.finish()))
}

/// Where the XDP owner of `interface` (in this network namespace) pins its responder table for the other
/// brokers of the machine.
fn interface_pin_path(interface: &str) -> std::path::PathBuf {
    interface_pin(vigil_ebpf::TABLE_PREFIX, interface)
}

/// Where the XDP owner of `interface` pins the program's link, so that the program keeps answering for the
/// other brokers of the machine after the owner is gone (see [`vigil_ebpf::sweep_stale_pins`]).
fn interface_link_path(interface: &str) -> std::path::PathBuf {
    interface_pin(vigil_ebpf::LINK_PREFIX, interface)
}

/// `PIN_DIR/<prefix>ns<netns inode>-<interface>`.
fn interface_pin(prefix: &str, interface: &str) -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata("/proc/self/ns/net").map(|m| m.ino()).unwrap_or(0);
    std::path::PathBuf::from(format!("{PIN_DIR}/{prefix}ns{ns}-{interface}"))
}

/// Removes the responder pins of this machine that nothing uses any more, says so, and returns their paths.
pub(super) fn sweep_pins(when: &str) -> Vec<std::path::PathBuf> {
    match vigil_ebpf::sweep_stale_pins(std::path::Path::new(PIN_DIR)) {
        Ok(gone) => {
            let links = gone
                .iter()
                .filter(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(vigil_ebpf::LINK_PREFIX))
                })
                .count();
            if !gone.is_empty() {
                let note = if links > 0 { " (an XDP program detached: no broker of this machine uses it)" } else { "" };
                tracing::info!(
                    "{when}: removed {} responder pins nothing uses any more from {PIN_DIR}{note}",
                    gone.len()
                );
            }
            gone
        }
        Err(e) => {
            tracing::debug!("stale pins in {PIN_DIR} not checked: {e}");
            Vec::new()
        }
    }
}

/// Result of background loading.
pub(crate) struct Loaded {
    exit: Result<Detector, String>,
    tcp: Result<TcpWatcher, String>,
    /// What the plan said the eBPF detectors run (`ebpf (variant)`), shown when they loaded.
    exit_variant: Option<String>,
    tcp_variant: Option<String>,
    xdp: Result<XdpResponder, String>,
    shared_table: Option<Arc<HbTable>>,
    /// Pins this broker made of a table it shares (for the other brokers of its test instance).
    shared_pins: Vec<std::path::PathBuf>,
    /// `broker.detectors=ebpf` and this detector could not run on eBPF.
    pub(crate) required_failed: Option<String>,
}

impl Detectors {
    /// Takes the loaded detectors into use: starts their tasks, registers this broker with the responder.
    pub(crate) fn loaded(&mut self, l: Loaded) {
        let pid = std::process::id();
        match l.exit {
            Ok(det) => {
                self.status.process_exit = match (&det, l.exit_variant) {
                    (Detector::Ebpf(_), Some(v)) => v,
                    _ => det.description().to_string(),
                };
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(exit_task(det, rx, self.input_tx.clone()));
                self.exit_tx = Some(tx);
            }
            Err(why) => self.status.process_exit = why,
        }
        match l.tcp {
            Ok(w) => {
                self.status.tcp = l.tcp_variant.unwrap_or_else(|| "ebpf".into());
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(tcp_task(w, rx, self.input_tx.clone()));
                self.tcp_tx = Some(tx);
            }
            Err(why) => self.status.tcp = why,
        }
        let table = match l.xdp {
            Ok(x) => {
                self.status.responder = format!("xdp ({} on {})", x.mode(), x.interface());
                let t = x.table();
                self.xdp = Some(x);
                Some(t)
            }
            Err(why) => match l.shared_table {
                Some(t) => {
                    self.shared_pins = l.shared_pins;
                    let asked = match self.xdp_how {
                        XdpAttach::Auto => None,
                        XdpAttach::Native => Some("native"),
                        XdpAttach::Generic => Some("generic"),
                    };
                    let mode_note = asked
                        .map(|m| format!("; broker.xdp_mode={m} not applied: the program's mode holds"))
                        .unwrap_or_default();
                    self.status.responder = if self.owner {
                        format!("xdp (shared: the program another broker of this machine attached{mode_note})")
                    } else {
                        // Same attributes as the detector rank (a test instance): its mode is the one asked.
                        "xdp (shared with this machine's detector rank)".into()
                    };
                    Some(t)
                }
                None => {
                    self.status.responder = why;
                    None
                }
            },
        };
        if let Some(t) = &table {
            let pinned = match (t.register(self.probe_port, pid), self.xdp.as_mut()) {
                (Err(e), _) => Err(format!("userspace (registering with the XDP responder failed: {e})")),
                // Registered: the program may now outlive this broker (ended or killed) for the other brokers of
                // the machine that use it; the last of them out detaches it.
                (Ok(()), Some(x)) => match x.pin_link(&interface_link_path(x.interface())) {
                    Ok(()) => {
                        // This node's kernel reports our own death to our parent's probes (the brokers sharing
                        // the program are marked by our exit watches, `Detect::on_exit`).
                        if let Err(e) = x.mark_dead_on_exit(pid, self.probe_port) {
                            self.status.responder.push_str(&format!(
                                "; this broker's exit is not reported by the kernel ({e}): a kill is seen when its \
                                 connection closes"
                            ));
                            warn!("the XDP responder will not report this broker's exit: {e}");
                        }
                        Ok(())
                    }
                    Err(e) if e.contains("detached") => {
                        let _ = t.unregister(self.probe_port);
                        self.xdp = None;
                        Err(format!("userspace (XDP responder lost: {e})"))
                    }
                    Err(e) => {
                        info!("the XDP responder on {} ends with this broker: {e}", x.interface());
                        Ok(())
                    }
                },
                (Ok(()), None) => Ok(()),
            };
            if let Err(why) = pinned {
                self.status.responder = why;
            } else {
                // The kernel answers from now on; the userspace thread would only see what XDP passes.
                self.table = table;
                if let (Some(p), Some(t)) = (&self.prober, &self.table) {
                    let _ = p.send(ProbeCmd::Collector(t.clone()));
                }
            }
        }
        let s = &self.status;
        let all_ebpf =
            !s.process_exit.starts_with("userspace") && s.tcp.starts_with("ebpf") && s.responder.starts_with("xdp");
        let shared = s.responder.starts_with("xdp (shared");
        let forced = s.tcp.contains("forced");
        if all_ebpf || shared || forced || self.quiet {
            info!("failure detectors: process-exit {}, tcp {}, responder {}", s.process_exit, s.tcp, s.responder);
        } else {
            warn!(
                "failure detectors degraded: process-exit {}, tcp {}, responder {}",
                s.process_exit, s.tcp, s.responder
            );
        }
    }
}

/// Background loading (blocking: aya parses BTF and the verifier runs).
pub(super) fn load(
    mode: DetectorMode,
    xdp_how: XdpAttach,
    owner: bool,
    ifname: Option<String>,
    pin: Option<std::path::PathBuf>,
) -> Loaded {
    if !owner {
        // Another broker of this machine owns the detectors: use its responder table once it is pinned.
        let forced = mode == DetectorMode::ForceUserspace;
        let mut shared = None;
        if let (Some(p), false) = (&pin, forced) {
            for _ in 0..50 {
                if let Ok(t) = HbTable::open_pinned(p) {
                    shared = Some(Arc::new(t));
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let why = if forced {
            "userspace (forced by broker.detectors=userspace)".to_string()
        } else {
            "userspace (this machine's detector rank runs the eBPF detectors)".to_string()
        };
        return Loaded {
            exit: Err(why.clone()),
            tcp: Err(why.clone()),
            exit_variant: None,
            tcp_variant: None,
            xdp: Err(if shared.is_some() || forced { why } else { "userspace (no shared XDP responder found)".into() }),
            shared_table: shared,
            shared_pins: Vec::new(),
            required_failed: None,
        };
    }
    let forced = mode == DetectorMode::ForceUserspace;
    // What this kernel can load, judged before anything is tried (as root: without root nothing loads anyway, and
    // the watchers say so). A detector the plan puts in userspace is not loaded: its line names the missing feature
    // instead of a verifier dump.
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let plan = (!forced && root).then(judge_kernel);
    let ebpf_text = |c: &Choice| c.is_ebpf().then(|| c.to_string());
    let exit_variant = plan.as_ref().and_then(|p| ebpf_text(&p.process_exit));
    let tcp_variant = plan.as_ref().and_then(|p| ebpf_text(&p.tcp));
    let channel = plan.as_ref().map(|p| p.channel).unwrap_or_default();
    let watchers = || {
        let exit = match plan.as_ref().map(|p| &p.process_exit) {
            Some(Choice::Userspace(why)) if mode == DetectorMode::RequireEbpf => Err(format!("userspace ({why})")),
            Some(Choice::Userspace(why)) => PidfdWatcher::new()
                .map(|watcher| Detector::Userspace { watcher, reason: format!("userspace ({why}): pidfd") })
                .map_err(|e| format!("userspace (none: {e})")),
            _ => Detector::choose_with(mode, channel).map_err(|e| format!("userspace (none: {})", e.summary())).map(
                |d| match d {
                    // Say why, as the other detectors' lines do.
                    Detector::Userspace { watcher, .. } if forced => Detector::Userspace {
                        watcher,
                        reason: "userspace (forced by broker.detectors=userspace): pidfd".into(),
                    },
                    d => d,
                },
            ),
        };
        let tcp = match plan.as_ref().map(|p| &p.tcp) {
            _ if forced => Err("userspace (forced by broker.detectors=userspace): socket errors and TCP_INFO".into()),
            Some(Choice::Userspace(why)) => Err(format!("userspace ({why}): socket errors and TCP_INFO")),
            _ => TcpWatcher::with_channel(channel).map_err(|e| {
                tracing::debug!("TCP detector: {e}");
                format!("userspace (BPF load failed: {}): socket errors and TCP_INFO", e.summary())
            }),
        };
        (exit, tcp)
    };
    // Both CO-RE objects relocate against one parse of the kernel's BTF.
    let (exit, tcp) = if forced { watchers() } else { vigil_ebpf::with_kernel_btf(watchers) };
    let mut shared_table = None;
    let mut shared_pins = Vec::new();
    let xdp = if forced {
        Err("userspace (forced by broker.detectors=userspace)".into())
    } else {
        match (&ifname, plan.as_ref().map(|p| &p.responder)) {
            (_, Some(Choice::Userspace(why))) => Err(format!("userspace ({why})")),
            (None, _) => Err("userspace (no interface carries the overlay address)".into()),
            (Some(i), _) => match attach_after_sweep(i, xdp_how) {
                Ok(mut x) => {
                    // Other brokers of this machine (nested instances, the rest of a test instance) register
                    // their probe ports through the pinned table.
                    let pin_err = |e: vigil_ebpf::EbpfError| format!("userspace (pinning the table: {e})");
                    let mut r = x.pin_table(&interface_pin_path(i)).map_err(pin_err);
                    if let (Ok(()), Some(p)) = (&r, &pin) {
                        r = x.pin_table(p).map_err(pin_err);
                    }
                    r.map(|_| x)
                }
                Err(e) => {
                    // Busy: if the program there is another Vigil broker's, share its table, and pin it for the
                    // other brokers of this test instance too.
                    if let Ok(t) = HbTable::open_pinned(&interface_pin_path(i)) {
                        if let Some(p) = &pin {
                            match t.pin(p) {
                                Ok(done) => shared_pins = done,
                                Err(e) => tracing::info!("the shared XDP table is not pinned for this instance: {e}"),
                            }
                        }
                        shared_table = Some(Arc::new(t));
                    }
                    Err(format!("userspace (XDP on {i}: {e})"))
                }
            },
        }
    };
    // A shared XDP table is an eBPF responder too.
    let xdp_failed = xdp.as_ref().err().filter(|_| shared_table.is_none());
    let required_failed = if mode == DetectorMode::RequireEbpf {
        [exit.as_ref().err(), tcp.as_ref().err(), xdp_failed].into_iter().flatten().next().cloned()
    } else {
        None
    };
    // aya keeps parsed BTF and relocation scratch in freed heap; hand it back to the system.
    // SAFETY: malloc_trim only releases free heap memory; it is safe to call at any time.
    unsafe { libc::malloc_trim(0) };
    Loaded { exit, tcp, exit_variant, tcp_variant, xdp, shared_table, shared_pins, required_failed }
}

/// The plan for this kernel ([`vigil_ebpf::plan`] of its probed features, or of the recorded set named by
/// `$VIGIL_KERNEL_FEATURES`); every detector in userspace, with the reason, if that recording cannot be read.
fn judge_kernel() -> DetectorPlan {
    match KernelFeatures::from_env_or_probe() {
        Ok(f) => vigil_ebpf::plan(&f),
        Err(e) => {
            let c = Choice::Userspace(format!("cannot judge the kernel: {e}"));
            DetectorPlan { process_exit: c.clone(), tcp: c.clone(), responder: c, channel: Default::default() }
        }
    }
}

/// Attaches the XDP responder to `interface`, after removing the pins nothing uses any more: a program kept
/// attached for brokers that have all gone since (killed, so none of them removed it) is detached first.
fn attach_after_sweep(interface: &str, how: XdpAttach) -> Result<XdpResponder, vigil_ebpf::EbpfError> {
    let detached = sweep_pins("starting").contains(&interface_link_path(interface));
    let mut tries = 0;
    loop {
        match XdpResponder::attach_with(interface, how) {
            // The kernel frees an unpinned link in the background: the program detached by the sweep may still be
            // there for a moment.
            Err(_) if detached && tries < 25 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

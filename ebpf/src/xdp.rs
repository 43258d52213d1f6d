//! XDP heartbeat responder: a node's kernel answers its parent's probes for the brokers registered on it.
//!
//! [`XdpResponder::attach`] loads `bpf/xdp.bpf.c` and attaches it to one interface; [`HbTable`] is the table
//! of brokers it answers for (UDP port of each broker's probe socket → pid, alive flag, last userspace
//! heartbeat). Several brokers on one machine (a test instance) share one responder: its owner pins the
//! table on bpffs ([`XdpResponder::pin_table`]) and the others open it ([`HbTable::open_pinned`]).
//!
//! The program outlives its owner while other brokers use it: the owner pins its XDP link
//! ([`XdpResponder::pin_link`]), a clean exit leaves it for them ([`XdpResponder::release`]), and the last broker
//! out removes the pin ([`sweep_stale_pins`]). A node's kernel keeps answering for a nested instance's broker
//! after the broker that loaded the program (another instance's) is gone, ended or killed, so a stalled broker
//! there is still seen as torpid, not lost.
//!
//! The same program collects, on a parent's node, the replies to that parent's probes ([`HbTable::replies`],
//! [`ReplyArea`](crate::ReplyArea)): the prober reads its children's replies from shared memory, and answers
//! to group probes (one IP multicast datagram per period for all children, [`crate::ProbeKind::Group`]) come
//! from each child node's kernel, which learned its parent from an earlier unicast request.
//!
//! Mode ([`XdpAttach`]): by default generic (SKB) XDP on `lo`, on veth and on any interface without a device
//! behind it. Native XDP on a veth would need an XDP program on the peer end for `XDP_TX` to be delivered, which
//! a broker inside a network namespace cannot attach; generic mode has no such rule and costs nothing that matters
//! at heartbeat rates. Physical NICs try native (driver) mode first. An admin (or a test bed modelling a NIC) can
//! ask for either mode ([`XdpResponder::attach_with`]). One XDP program per interface: if another is attached,
//! [`XdpResponder::attach`] fails with [`EbpfError::Program`] and the caller falls back.

use std::{path::Path, sync::Mutex};

use aya::{
    Ebpf, EbpfLoader, Pod,
    maps::{Array, HashMap, Map, MapData, MapError},
    programs::{
        TracePoint, Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
    },
};

use crate::{
    error::{EbpfError, map_err, prog_err},
    sys,
};

static XDP_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp.bpf.o"));

/// Value of the responder table (`struct vigil_hb_state` in `bpf/probe.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HbState {
    /// `CLOCK_MONOTONIC` ns of the broker's last userspace heartbeat.
    pub hb_ns: u64,
    /// Probes answered for this broker (written by the XDP program).
    pub answered: u64,
    /// Broker process id.
    pub pid: u32,
    /// 1 while the broker runs; 0 once its exit was seen.
    pub alive: u32,
}

// SAFETY: HbState is repr(C), made only of integers, with no padding (8+8+4+4 bytes): every bit pattern is valid.
unsafe impl Pod for HbState {}
const _: () = assert!(std::mem::size_of::<HbState>() == 24);

/// Value of the `OWNER` array (`struct vigil_owner` in `bpf/xdp.bpf.c`): the broker whose exit the kernel reports.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Owner {
    pid: u32,
    key: u32,
}

// SAFETY: Owner is repr(C), two u32 and no padding: every bit pattern is valid.
unsafe impl Pod for Owner {}

fn key(port: u16) -> u32 {
    // The BPF program widens the network-order `udp->dest` into a u32 key.
    u32::from(port.to_be())
}

/// The table of brokers a responder answers for. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct HbTable {
    map: Mutex<HashMap<MapData, u32, HbState>>,
    /// Reply collection (`RESULTS` + `SLOT_CLAIMS`); absent when opened from pins made by an older build.
    replies: Option<std::sync::Arc<crate::ReplyArea>>,
}

/// Where the reply array and its claims are pinned, next to the responder table pinned at `path`.
fn side_pin(path: &Path, what: &str) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push("-"); // bpffs refuses names with a dot
    p.push(what);
    p.into()
}

impl HbTable {
    fn from_map_data(data: MapData, replies: Option<crate::ReplyArea>) -> Result<HbTable, EbpfError> {
        let map = Map::from_map_data(data).map_err(map_err("RESPONDERS"))?;
        let map = HashMap::try_from(map).map_err(map_err("RESPONDERS"))?;
        Ok(HbTable { map: Mutex::new(map), replies: replies.map(std::sync::Arc::new) })
    }

    /// Opens a table pinned by another broker's [`XdpResponder::pin_table`] (and its reply array, if pinned).
    /// Errors if nothing is pinned there.
    pub fn open_pinned(path: &Path) -> Result<HbTable, EbpfError> {
        let pinned = |what| MapData::from_pin(side_pin(path, what)).ok().and_then(|d| Map::from_map_data(d).ok());
        let replies = match (pinned("results"), pinned("claims")) {
            (Some(r), Some(c)) => crate::ReplyArea::new(r, c).ok(),
            _ => None,
        };
        Self::from_map_data(MapData::from_pin(path).map_err(map_err("RESPONDERS"))?, replies)
    }

    /// Pins this table (and its reply array, if it has one) at `path` on bpffs, mounted on `/sys/fs/bpf` if needed,
    /// replacing a stale pin there. Returns the paths pinned, for the caller to remove when it is done.
    ///
    /// # Errors
    /// [`EbpfError::Io`] if bpffs cannot be mounted or the kernel refuses the pin.
    pub fn pin(&self, path: &Path) -> Result<Vec<std::path::PathBuf>, EbpfError> {
        sys::ensure_bpffs()?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(path);
        let mut done = Vec::new();
        let m = self.lock();
        aya::maps::IterableMap::map(&*m).pin(path).map_err(pin_err)?;
        done.push(path.to_owned());
        drop(m);
        if let Some(r) = &self.replies {
            let (rp, cp) = (side_pin(path, "results"), side_pin(path, "claims"));
            let _ = std::fs::remove_file(&rp);
            let _ = std::fs::remove_file(&cp);
            if let Err(e) = r.pin(&rp, &cp) {
                for p in &done {
                    let _ = std::fs::remove_file(p);
                }
                return Err(pin_err(e));
            }
            done.push(rp);
            done.push(cp);
        }
        Ok(done)
    }

    /// Brokers registered here that are alive: marked alive and with a process of that id (`kill(pid, 0)`),
    /// other than process `except`.
    pub fn live_brokers(&self, except: u32) -> usize {
        self.entries().iter().filter(|(_, s)| s.pid != except && s.alive == 1 && sys::process_exists(s.pid)).count()
    }

    /// This node's reply array, where the kernel collects the replies to a prober's probes (`None`: the
    /// program predates it, or mapping it failed).
    pub fn replies(&self) -> Option<std::sync::Arc<crate::ReplyArea>> {
        self.replies.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<MapData, u32, HbState>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers broker `pid` answering on UDP `port`, alive, with a heartbeat now.
    pub fn register(&self, port: u16, pid: u32) -> Result<(), EbpfError> {
        let st = HbState { hb_ns: sys::monotonic_ns(), answered: 0, pid, alive: 1 };
        self.lock().insert(key(port), st, 0).map_err(map_err("RESPONDERS"))
    }

    /// Records a userspace heartbeat of the broker on `port` (now). The answered counter is left to the kernel.
    pub fn heartbeat(&self, port: u16) -> Result<(), EbpfError> {
        let mut m = self.lock();
        let mut st = m.get(&key(port), 0).map_err(map_err("RESPONDERS"))?;
        st.hb_ns = sys::monotonic_ns();
        m.insert(key(port), st, 0).map_err(map_err("RESPONDERS"))
    }

    /// Marks every broker with process id `pid` dead (its exit was seen); returns how many entries changed.
    pub fn mark_dead(&self, pid: u32) -> usize {
        let mut m = self.lock();
        let hits: Vec<(u32, HbState)> = m.iter().filter_map(Result::ok).filter(|(_, s)| s.pid == pid).collect();
        for (k, mut s) in hits.iter().copied() {
            s.alive = 0;
            let _ = m.insert(k, s, 0);
        }
        hits.len()
    }

    /// Removes the broker on `port` (clean exit). Not an error if absent.
    pub fn unregister(&self, port: u16) -> Result<(), EbpfError> {
        match self.lock().remove(&key(port)) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err("RESPONDERS")(e)),
        }
    }

    /// Current entry for `port`.
    pub fn get(&self, port: u16) -> Option<HbState> {
        self.lock().get(&key(port), 0).ok()
    }

    /// Every registered (port, state).
    pub fn entries(&self) -> Vec<(u16, HbState)> {
        self.lock().iter().filter_map(Result::ok).map(|(k, s)| (u16::from_be(k as u16), s)).collect()
    }
}

/// An attached XDP responder. Dropping it detaches the program, unpins the table if it pinned it, and frees
/// the maps once no other broker holds them open.
pub struct XdpResponder {
    table: std::sync::Arc<HbTable>,
    interface: String,
    mode: &'static str,
    pinned: Vec<std::path::PathBuf>,
    /// The attachment until pinned; dropping it detaches.
    link: Option<XdpLink>,
    /// The attachment once pinned ([`XdpResponder::pin_link`]), and where.
    pinned_link: Option<(PinnedLink, std::path::PathBuf)>,
    // Owns the program.
    bpf: Ebpf,
    /// The owner-exit tracepoint is attached ([`XdpResponder::mark_dead_on_exit`]).
    exit_report: bool,
}

impl std::fmt::Debug for XdpResponder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpResponder").field("interface", &self.interface).field("mode", &self.mode).finish()
    }
}

/// How the responder is attached (`broker.xdp_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XdpAttach {
    /// Native (driver) mode on an interface with a device behind it, falling back to generic; generic on `lo`,
    /// veth and other virtual interfaces (see the module docs).
    #[default]
    Auto,
    /// Native (driver) mode only: attaching fails if the driver has no XDP support. On a veth, `XDP_TX` replies
    /// are then delivered only if the peer end has an XDP program too.
    Native,
    /// Generic (SKB) mode only: runs after the kernel has built a socket buffer, on any interface.
    Generic,
}

impl std::str::FromStr for XdpAttach {
    type Err = String;
    /// Parses `auto`, `native` or `generic`; the error says what is expected.
    fn from_str(s: &str) -> Result<XdpAttach, String> {
        match s {
            "auto" => Ok(XdpAttach::Auto),
            "native" => Ok(XdpAttach::Native),
            "generic" => Ok(XdpAttach::Generic),
            _ => Err(format!("'{s}': expected auto, native or generic")),
        }
    }
}

impl XdpResponder {
    /// Loads the responder and attaches it to `interface` in [`XdpAttach::Auto`] mode. Needs root.
    /// Fails if the interface does not exist, already has an XDP program, or the kernel refuses the program.
    pub fn attach(interface: &str) -> Result<XdpResponder, EbpfError> {
        XdpResponder::attach_with(interface, XdpAttach::Auto)
    }

    /// Loads the responder and attaches it to `interface` in `how` mode. Needs root. Fails as
    /// [`attach`](Self::attach) does, and in [`XdpAttach::Native`] mode also if the driver has no native XDP.
    pub fn attach_with(interface: &str, how: XdpAttach) -> Result<XdpResponder, EbpfError> {
        let euid = sys::euid();
        if euid != 0 {
            return Err(EbpfError::NotRoot(euid));
        }
        // No CO-RE relocation in this object: skip parsing the kernel's BTF (saves ~20 ms and ~10 MB).
        let mut bpf = EbpfLoader::new().btf(None).load(XDP_OBJ)?;
        let name = "vigil_hb_responder";
        let prog: &mut Xdp =
            bpf.program_mut(name).ok_or(EbpfError::Missing(name))?.try_into().map_err(prog_err(name))?;
        prog.load().map_err(prog_err(name))?;
        let physical = Path::new("/sys/class/net").join(interface).join("device").exists();
        let (id, mode) = if how == XdpAttach::Native {
            (prog.attach(interface, XdpMode::Driver).map_err(prog_err(name))?, "native")
        } else if physical && how == XdpAttach::Auto {
            match prog.attach(interface, XdpMode::Driver) {
                Ok(id) => (id, "native"),
                Err(_) => (prog.attach(interface, XdpMode::Skb).map_err(prog_err(name))?, "generic"),
            }
        } else {
            (prog.attach(interface, XdpMode::Skb).map_err(prog_err(name))?, "generic")
        };
        let link = prog.take_link(id).map_err(prog_err(name))?;
        let data = bpf.take_map("RESPONDERS").ok_or(EbpfError::Missing("RESPONDERS"))?;
        let table = HashMap::try_from(data).map_err(map_err("RESPONDERS"))?;
        let results = bpf.take_map("RESULTS").ok_or(EbpfError::Missing("RESULTS"))?;
        let claims = bpf.take_map("SLOT_CLAIMS").ok_or(EbpfError::Missing("SLOT_CLAIMS"))?;
        let replies = crate::ReplyArea::new(results, claims)?;
        Ok(XdpResponder {
            table: std::sync::Arc::new(HbTable { map: Mutex::new(table), replies: Some(std::sync::Arc::new(replies)) }),
            interface: interface.to_owned(),
            mode,
            pinned: Vec::new(),
            link: Some(link),
            pinned_link: None,
            bpf,
            exit_report: false,
        })
    }

    /// The table of brokers answered for.
    pub fn table(&self) -> std::sync::Arc<HbTable> {
        self.table.clone()
    }

    /// Interface it is attached to.
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// `native` or `generic` XDP.
    pub fn mode(&self) -> &'static str {
        self.mode
    }

    /// Pins the table at `path` (on bpffs, mounted on `/sys/fs/bpf` if needed) for the other brokers of this
    /// machine; removed again when the responder is dropped. A stale pin at `path` is replaced. May be called
    /// for several paths.
    pub fn pin_table(&mut self, path: &Path) -> Result<(), EbpfError> {
        let done = self.table.pin(path)?;
        self.pinned.extend(done);
        Ok(())
    }

    /// Pins the program's XDP link at `path` (on bpffs, named [`LINK_PREFIX`] + the name of the table's pin after
    /// [`TABLE_PREFIX`], for [`sweep_stale_pins`]), replacing a stale pin there. From then on the program stays
    /// attached after this responder is gone, cleanly or killed, until the pin is removed: by
    /// [`release`](Self::release) if no other broker uses the table, else by the sweep of whichever broker finds
    /// no live broker left in it. Pin after this broker registered in the table, or a sweep may judge the table
    /// unused.
    ///
    /// # Errors
    /// Why, if the attachment is not a BPF link (kernels before 5.9 attach XDP through netlink; such a program
    /// ends with its owner, detached when this responder is dropped). If the kernel refuses the pin itself (rare:
    /// bpffs is mounted and the directory made first), the program is detached already and the error says so:
    /// the caller must stop relying on it.
    pub fn pin_link(&mut self, path: &Path) -> Result<(), String> {
        if self.link.is_none() {
            return Err("the link is already pinned".into());
        }
        // aya attaches XDP with a BPF link from Linux 5.9 on, through netlink before. Only a BPF link can be
        // pinned, and converting a netlink attachment would drop (detach) it: ask the version first.
        match aya::util::KernelVersion::current() {
            Ok(v) if v >= aya::util::KernelVersion::new(5, 9, 0) => {}
            Ok(v) => return Err(format!("kernel {v} attaches XDP through netlink, which cannot be pinned")),
            Err(e) => return Err(format!("kernel version unknown ({e}): the XDP link is not pinned")),
        }
        sys::ensure_bpffs().map_err(|e| format!("bpffs: {e}"))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let _ = std::fs::remove_file(path);
        let link = self.link.take().ok_or("the link is already pinned")?;
        let fd = FdLink::try_from(link).map_err(|e| format!("{e}; the XDP program is detached"))?;
        let pinned = fd
            .pin(path)
            .map_err(|e| format!("pinning the XDP link at {}: {e}; the XDP program is detached", path.display()))?;
        self.pinned_link = Some((pinned, path.to_path_buf()));
        Ok(())
    }

    /// Has this node's kernel mark the entry of broker `pid` on `port` dead (`alive` 0) as soon as that
    /// process's main thread exits (`sched/sched_process_exit`), so that its parent's next probe is answered
    /// "broker dead" within a round trip, even when the FIN or reset of its connections is lost or late (a lossy
    /// or congested link). For the broker that loaded this responder (the other brokers of a machine that share
    /// it are marked by their owner's exit watches, `HbTable::mark_dead`); call after it registered. The
    /// tracepoint lives as long as this responder: a clean exit unregisters first, so it marks nothing then.
    /// Called again, it only changes the broker watched.
    ///
    /// # Errors
    /// [`EbpfError::Tracefs`] if tracefs cannot be mounted, [`EbpfError::Missing`] or
    /// [`EbpfError::Program`] if the program or its map is missing or the kernel refuses it (the responder
    /// still answers; only this report is lost).
    pub fn mark_dead_on_exit(&mut self, pid: u32, port: u16) -> Result<(), EbpfError> {
        sys::ensure_tracefs().map_err(EbpfError::Tracefs)?;
        let mut owner: Array<&mut MapData, Owner> =
            self.bpf.map_mut("OWNER").ok_or(EbpfError::Missing("OWNER"))?.try_into().map_err(map_err("OWNER"))?;
        owner.set(0, Owner { pid, key: key(port) }, 0).map_err(map_err("OWNER"))?;
        if self.exit_report {
            return Ok(());
        }
        let name = "vigil_owner_exit";
        let prog: &mut TracePoint =
            self.bpf.program_mut(name).ok_or(EbpfError::Missing(name))?.try_into().map_err(prog_err(name))?;
        prog.load().map_err(prog_err(name))?;
        prog.attach("sched", "sched_process_exit").map_err(prog_err(name))?;
        self.exit_report = true;
        Ok(())
    }

    /// Clean exit of the owner, after it left the table. If its link is pinned ([`pin_link`](Self::pin_link))
    /// and other live brokers are registered in the table ([`HbTable::live_brokers`], a nested instance's), the
    /// program and the pins stay for them ([`Release::Kept`]); the last of them to leave removes the pins.
    /// Otherwise the program is detached and the pins removed.
    pub fn release(mut self) -> Release {
        let others = self.table.live_brokers(std::process::id());
        if others == 0 {
            return Release::Detached;
        }
        if self.pinned_link.is_none() {
            return Release::NotKept(others);
        }
        self.pinned.clear();
        self.pinned_link = None; // closes our fd; the pin holds the link
        Release::Kept(others)
    }
}

/// Name prefix of a responder table pinned under the pin directory given to [`sweep_stale_pins`].
pub const TABLE_PREFIX: &str = "hb-";
/// Name prefix of an XDP link pinned there: `link-NAME` keeps attached the program of the table `hb-NAME`.
pub const LINK_PREFIX: &str = "link-";

/// What [`XdpResponder::release`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// No other broker uses the program: it is detached and its pins removed.
    Detached,
    /// The program stays attached for this many other brokers; the last one out removes its pins.
    Kept(usize),
    /// This many other brokers use the program, but its link is not pinned: it is detached.
    NotKept(usize),
}

fn pin_err(e: aya::pin::PinError) -> EbpfError {
    EbpfError::Io(std::io::Error::other(e.to_string()))
}

/// Removes the pins under `dir` that nothing uses any more, and returns their paths (a missing `dir` is not an
/// error):
/// * XDP links pinned by [`XdpResponder::pin_link`] (named `link-NAME`, for the table pinned at `hb-NAME`) whose
///   table has no live broker left
///   ([`HbTable::live_brokers`]): the program is detached once its owner's fd is closed too (the owner has exited,
///   or is calling [`XdpResponder::release`]);
/// * responder tables (and their `-results` / `-claims` side maps) that no loaded BPF program uses: those of
///   brokers killed outright (SIGKILL, OOM), whose `Drop` never ran, and those of links removed here. A pin holds
///   its map in kernel memory (the reply array alone is 3 MiB) until it is unlinked.
///
/// Brokers call it when they start and when they leave a table they share. Liveness is judged by process id, so
/// the brokers sharing a program must be in one pid namespace.
///
/// # Errors
/// [`EbpfError`] if the loaded programs cannot be listed (no `CAP_SYS_ADMIN`/`CAP_BPF`): nothing is removed then.
pub fn sweep_stale_pins(dir: &Path) -> Result<Vec<std::path::PathBuf>, EbpfError> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(Vec::new()) };
    let mut used = std::collections::HashSet::new();
    for p in aya::programs::loaded_programs() {
        let p = p.map_err(|e| EbpfError::Io(std::io::Error::other(e.to_string())))?;
        if let Ok(Some(ids)) = p.map_ids() {
            used.extend(ids);
        }
    }
    let names: Vec<std::path::PathBuf> = entries.flatten().map(|e| e.path()).collect();
    let ends = |p: &Path, tails: &[&str]| {
        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| tails.iter().any(|t| n.ends_with(t)))
    };
    let is_side = |p: &Path| ends(p, &["-results", "-claims"]);
    let link_of = |p: &Path| {
        let n = p.file_name().and_then(|n| n.to_str())?;
        n.strip_prefix(LINK_PREFIX).map(|rest| dir.join(format!("{TABLE_PREFIX}{rest}")))
    };
    let is_link = |p: &Path| link_of(p).is_some();
    let mut removed = Vec::new();
    // Links first: the tables of the links removed are unused from now on, whatever the program list said.
    let mut orphaned = std::collections::HashSet::new();
    for (link, base) in names.iter().filter_map(|p| Some((p, link_of(p)?))) {
        let base = base.as_path();
        let live = match HbTable::open_pinned(base) {
            Ok(t) => t.live_brokers(0) > 0,
            Err(_) => false,
        };
        if !live && std::fs::remove_file(link).is_ok() {
            removed.push(link.clone());
            if let Ok(m) = aya::maps::MapInfo::from_pin(base) {
                orphaned.insert(m.id());
            }
        }
    }
    for base in names.iter().filter(|p| !is_side(p) && !is_link(p)) {
        let stale = match aya::maps::MapInfo::from_pin(base) {
            Ok(m) => !used.contains(&m.id()) || orphaned.contains(&m.id()),
            Err(_) => false, // not a map we can read: leave it
        };
        if stale {
            for p in [base.clone(), side_pin(base, "results"), side_pin(base, "claims")] {
                if std::fs::remove_file(&p).is_ok() {
                    removed.push(p);
                }
            }
        }
    }
    // Side maps whose table is gone.
    for side in names.iter().filter(|p| is_side(p)) {
        let n = side.to_string_lossy();
        let base = n.trim_end_matches("-results").trim_end_matches("-claims");
        if !Path::new(base).exists() && std::fs::remove_file(side).is_ok() {
            removed.push(side.clone());
        }
    }
    Ok(removed)
}

impl Drop for XdpResponder {
    fn drop(&mut self) {
        if let Some(l) = self.pinned_link.take() {
            // Close our descriptor first, then remove the pin: the kernel then detaches the program in a worker.
            // Unpinning first would make our close the last reference and detach here, in the exiting broker.
            let (l, path) = l;
            drop(l);
            let _ = std::fs::remove_file(path);
        }
        for p in self.pinned.drain(..) {
            let _ = std::fs::remove_file(p);
        }
    }
}

//! XDP heartbeat responder: a node's kernel answers its parent's probes for the brokers registered on it.
//!
//! [`XdpResponder::attach`] loads `bpf/xdp.bpf.c` and attaches it to one interface; [`HbTable`] is the table
//! of brokers it answers for (UDP port of each broker's probe socket → pid, alive flag, last userspace
//! heartbeat). Several brokers on one machine (a test instance) share one responder: its owner pins the
//! table on bpffs ([`XdpResponder::pin_table`]) and the others open it ([`HbTable::open_pinned`]).
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
    maps::{HashMap, Map, MapData, MapError},
    programs::{Xdp, XdpMode},
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
    // Owns the program and its link; dropping detaches.
    _bpf: Ebpf,
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
        let mode = if how == XdpAttach::Native {
            prog.attach(interface, XdpMode::Driver).map_err(prog_err(name))?;
            "native"
        } else if physical && how == XdpAttach::Auto {
            match prog.attach(interface, XdpMode::Driver) {
                Ok(_) => "native",
                Err(_) => {
                    prog.attach(interface, XdpMode::Skb).map_err(prog_err(name))?;
                    "generic"
                }
            }
        } else {
            prog.attach(interface, XdpMode::Skb).map_err(prog_err(name))?;
            "generic"
        };
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
            _bpf: bpf,
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
        sys::ensure_bpffs()?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(path);
        let pin_err = |e: aya::pin::PinError| EbpfError::Io(std::io::Error::other(e.to_string()));
        let m = self.table.lock();
        aya::maps::IterableMap::map(&*m).pin(path).map_err(pin_err)?;
        self.pinned.push(path.to_owned());
        drop(m);
        if let Some(r) = &self.table.replies {
            let (rp, cp) = (side_pin(path, "results"), side_pin(path, "claims"));
            let _ = std::fs::remove_file(&rp);
            let _ = std::fs::remove_file(&cp);
            r.pin(&rp, &cp).map_err(pin_err)?;
            self.pinned.push(rp);
            self.pinned.push(cp);
        }
        Ok(())
    }
}

/// Removes the responder tables pinned under `dir` (and their `-results` / `-claims` side maps) that no loaded
/// BPF program uses any more: those of brokers killed outright (SIGKILL, OOM), whose `Drop` never ran. A pin holds
/// its map in kernel memory (the reply array alone is 3 MiB) until it is unlinked. A table in use is referenced by
/// its XDP program, which lives as long as its owner. Returns the paths removed; a missing `dir` is not an error.
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
    let is_side = |p: &Path| {
        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with("-results") || n.ends_with("-claims"))
    };
    let mut removed = Vec::new();
    for base in names.iter().filter(|p| !is_side(p)) {
        let stale = match aya::maps::MapInfo::from_pin(base) {
            Ok(m) => !used.contains(&m.id()),
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
        for p in self.pinned.drain(..) {
            let _ = std::fs::remove_file(p);
        }
    }
}

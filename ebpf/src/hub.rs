//! Test-bed switch port for benchmarks (`bench/probe-cost.sh` with `PARENT_RX=xdp`); brokers never load it.
//!
//! [`HubRedirect::attach`] loads `bpf/hub.bpf.c` and attaches it in native mode to the hub's end of every
//! child's veth. Heartbeat probe replies addressed to the parent are handed to the hub's end of the parent's
//! veth as XDP frames, so they arrive in the parent's receive ring the way a NIC's DMA puts them there, and a
//! parent whose responder runs in native mode (`broker.xdp_mode=native`) consumes them without a socket buffer.
//! That models a NIC with native XDP, which the veth/bridge path (a socket buffer per packet) does not.

use std::net::Ipv4Addr;

use aya::{
    Ebpf, EbpfLoader,
    programs::{Xdp, XdpMode},
};

use crate::{
    error::{EbpfError, prog_err},
    sys,
};

static HUB_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/hub.bpf.o"));

/// The program attached to a set of switch ports; dropping it detaches it from every port.
pub struct HubRedirect {
    ports: usize,
    // Owns the program and its links.
    _bpf: Ebpf,
}

impl std::fmt::Debug for HubRedirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubRedirect").field("ports", &self.ports).finish()
    }
}

impl HubRedirect {
    /// Attaches to every interface in `ports` (native mode), redirecting probe replies whose IPv4 destination is
    /// `parent` to interface `to`. Needs root. Errors: [`EbpfError::NotRoot`]; [`EbpfError::Interface`] if `to`
    /// does not exist, or a port does not exist, has an XDP program already or has no native XDP;
    /// [`EbpfError::Load`] / [`EbpfError::Program`] if the kernel refuses the program.
    pub fn attach(ports: &[String], to: &str, parent: Ipv4Addr) -> Result<HubRedirect, EbpfError> {
        let euid = sys::euid();
        if euid != 0 {
            return Err(EbpfError::NotRoot(euid));
        }
        let name = "vigil_hub_redirect";
        let bad = |msg: &str| EbpfError::Interface { interface: to.into(), msg: msg.into() };
        let cname = std::ffi::CString::new(to).map_err(|_| bad("name contains a NUL byte"))?;
        // SAFETY: if_nametoindex reads a NUL-terminated string we own; it returns 0 if there is no such interface.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(bad("no such interface"));
        }
        let addr = u32::from_ne_bytes(parent.octets());
        let mut bpf = EbpfLoader::new()
            .btf(None)
            .override_global("TARGET_IFINDEX", &ifindex, true)
            .override_global("TARGET_ADDR", &addr, true)
            .load(HUB_OBJ)?;
        let prog: &mut Xdp =
            bpf.program_mut(name).ok_or(EbpfError::Missing(name))?.try_into().map_err(prog_err(name))?;
        prog.load().map_err(prog_err(name))?;
        for p in ports {
            prog.attach(p, XdpMode::Driver)
                .map_err(|e| EbpfError::Interface { interface: p.clone(), msg: format!("native XDP: {e}") })?;
        }
        Ok(HubRedirect { ports: ports.len(), _bpf: bpf })
    }
}

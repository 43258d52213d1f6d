//! Device discovery: which verbs device, port and GID index serve a local IP address.
//!
//! RoCE (and soft-RoCE, rdma_rxe) devices list the IP addresses of their network interface in their GID table:
//! an IPv4 address a.b.c.d appears as the IPv4-mapped GID `::ffff:a.b.c.d` (RoCE v2 over IPv4), an IPv6 address
//! as itself. A device "serves" an address when one of its active ports has that GID; with both a RoCE v1 and a
//! v2 entry for it (mlx5 lists both), the v2 one is preferred because it is routable over IP.

use crate::verbs::{device_names, Context};
use std::net::{IpAddr, Ipv6Addr};

/// A port and GID that serve a local address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// Device name (`rxe0`, `mlx5_0`...).
    pub name: String,
    /// Port number (1-based).
    pub port: u8,
    /// Index of the GID in the port's GID table.
    pub gid_index: u8,
    /// The GID itself (for RoCE over IPv4: `::ffff:a.b.c.d`).
    pub gid: Ipv6Addr,
    /// The port's active MTU in bytes (256..=4096).
    pub mtu: u32,
    /// The port's LID (0 on RoCE, where addressing is by GID).
    pub lid: u16,
}

/// Why no device serves an address: a sentence for logs and `vigil overlay status`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoDevice(pub String);

/// The GID an address appears as in a RoCE GID table.
pub fn gid_for(addr: IpAddr) -> Ipv6Addr {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// Find the verbs device, port and GID index that serve the local address `addr`.
///
/// The error says why none does: "no verbs devices" when the kernel lists none, libibverbs cannot be loaded or
/// finds no device at all (no RDMA hardware, no kernel support, or no provider library), else which devices
/// were looked at and why none fits. libibverbs is loaded only when the kernel lists a device.
pub fn find_device(addr: IpAddr) -> Result<Device, NoDevice> {
    if addr.is_unspecified() {
        return Err(NoDevice(format!("{addr} is not a specific local address")));
    }
    if !crate::ibverbs::kernel_lists_devices() {
        return Err(NoDevice(
            "no verbs devices (the kernel lists none in /sys/class/infiniband_verbs: no RDMA hardware or kernel \
             support)"
                .into(),
        ));
    }
    if let Err(e) = crate::ibverbs::load() {
        return Err(NoDevice(format!("no verbs devices usable: {e}")));
    }
    let names = device_names();
    if names.is_empty() {
        return Err(NoDevice(
            "no verbs devices (libibverbs found none: no RDMA hardware, kernel support or provider)".into(),
        ));
    }
    let want = gid_for(addr).octets();
    let mut notes: Vec<String> = Vec::new();
    for name in &names {
        let ctx = match Context::open(name) {
            Ok(c) => c,
            Err(e) => {
                notes.push(format!("{name}: cannot open ({e})"));
                continue;
            }
        };
        let ports = match ctx.port_count() {
            Ok(n) => n,
            Err(e) => {
                notes.push(format!("{name}: {e}"));
                continue;
            }
        };
        for port in 1..=ports {
            let Ok(pa) = ctx.query_port(port) else { continue };
            let mut found: Option<u8> = None;
            for idx in 0..pa.gid_tbl_len.clamp(0, 256) {
                let Ok(g) = ctx.query_gid(port, idx) else { continue };
                if g == want {
                    let v2 = gid_type(name, port, idx).is_some_and(|t| t.contains("v2"));
                    if found.is_none() || v2 {
                        found = Some(idx as u8);
                    }
                    if v2 {
                        break;
                    }
                }
            }
            let Some(gid_index) = found else { continue };
            if pa.state != rdma_sys::ibv_port_state::IBV_PORT_ACTIVE {
                notes.push(format!("{name} port {port} has {addr} but is not active (state {})", pa.state));
                continue;
            }
            return Ok(Device {
                name: name.clone(),
                port,
                gid_index,
                gid: Ipv6Addr::from(want),
                mtu: crate::verbs::mtu_bytes(pa.active_mtu).max(256),
                lid: pa.lid,
            });
        }
    }
    let mut why = format!("libibverbs found no device serving {addr} (devices: {})", names.join(", "));
    if !notes.is_empty() {
        why.push_str(&format!("; {}", notes.join("; ")));
    }
    Err(NoDevice(why))
}

/// The GID type from sysfs ("IB/RoCE v1", "RoCE v2"), where the kernel exposes it.
fn gid_type(dev: &str, port: u8, idx: i32) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{idx}"))
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_gid() {
        assert_eq!(gid_for("10.200.0.1".parse().unwrap()).to_string(), "::ffff:10.200.0.1");
    }

    #[test]
    fn unspecified_is_refused() {
        let e = find_device("0.0.0.0".parse().unwrap()).unwrap_err();
        assert!(e.0.contains("not a specific"), "{e}");
    }
}

//! `vigil-bench xdp-hub`: make the netns test bed's bridge behave, for the parent's receive path, like a switch in
//! front of a NIC with native XDP (see `vigil_ebpf::HubRedirect`). Used by `bench/probe-cost.sh` with
//! `PARENT_RX=xdp`; run inside the hub's network namespace. Attaches, says so on stderr, and holds the program until
//! killed (closing its links detaches it from every port).

use clap::Args;

/// Options of `vigil-bench xdp-hub`.
#[derive(Args, Debug)]
pub(crate) struct XdpHubArgs {
    /// The hub's end of the parent's veth: replies are handed to it as XDP frames.
    #[arg(long)]
    pub to: String,
    /// The parent's IPv4 address: only probe replies addressed to it are redirected.
    #[arg(long)]
    pub parent: std::net::Ipv4Addr,
    /// The hub's ends of the children's veths (native XDP is attached to each).
    #[arg(required = true)]
    pub ports: Vec<String>,
}

/// Attach and hold until killed. Exit status 1 with the reason on stderr if attaching fails.
pub(crate) fn run(a: &XdpHubArgs) -> i32 {
    match vigil_ebpf::HubRedirect::attach(&a.ports, &a.to, a.parent) {
        Ok(h) => {
            eprintln!("xdp-hub: {} ports redirect probe replies for {} to {}", a.ports.len(), a.parent, a.to);
            loop {
                std::thread::park();
                // Spurious wake-ups: keep holding the program.
                let _ = &h;
            }
        }
        Err(e) => {
            eprintln!("xdp-hub: {e}");
            1
        }
    }
}

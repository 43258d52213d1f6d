//! XDP heartbeat responder in network namespaces this test creates (veth pair 10.200.250.0/24, and a
//! namespace's own loopback). Run as root.

use std::{net::UdpSocket, process::Command, sync::Arc, time::Duration};

use vigil_ebpf::{HbTable, Probe, ProbeKind, ReplyArea, XdpResponder, monotonic_ns};

mod netns;
use netns::{Netns, in_ns, ip};

fn probe(sock: &UdpSocket, to: &str, seq: u32) -> Option<Probe> {
    sock.send_to(&Probe::request(seq, 5, monotonic_ns()).encode(), to).unwrap();
    let mut buf = [0u8; 128];
    loop {
        let n = sock.recv(&mut buf).ok()?;
        if let Some(p) = Probe::decode(&buf[..n]).filter(|p| p.seq == seq) {
            return Some(p);
        }
    }
}

#[test]
fn kernel_answers_over_veth_with_heartbeat_age_and_liveness() {
    let tag = std::process::id() % 100_000;
    let (a, b) = (format!("vx{tag}a"), format!("vx{tag}b"));
    let _ns = Netns(vec![a.clone(), b.clone()]);
    ip(&format!("netns add {a}"));
    ip(&format!("netns add {b}"));
    ip(&format!("link add vxa{tag} netns {a} type veth peer name vxb{tag} netns {b}"));
    ip(&format!("-n {a} addr add 10.200.250.1/24 dev vxa{tag}"));
    ip(&format!("-n {b} addr add 10.200.250.2/24 dev vxb{tag}"));
    ip(&format!("-n {a} link set vxa{tag} up"));
    ip(&format!("-n {b} link set vxb{tag} up"));

    // Node A: the responder, and a "broker" registered on port 7100 that never runs a responder itself.
    let ifname = format!("vxa{tag}");
    let resp = in_ns(&a, move || XdpResponder::attach(&ifname).expect("attach XDP"));
    assert_eq!(resp.mode(), "generic");
    let table: Arc<HbTable> = resp.table();
    table.register(7100, 4242).unwrap();

    // Node B: the parent probing.
    let replies = in_ns(&b, move || {
        let s = UdpSocket::bind("10.200.250.2:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let first = probe(&s, "10.200.250.1:7100", 1);
        std::thread::sleep(Duration::from_millis(150));
        let later = probe(&s, "10.200.250.1:7100", 2);
        let unknown = probe(&s, "10.200.250.1:7101", 3);
        (first, later, unknown)
    });
    let (first, later, unknown) = replies;
    let first = first.expect("kernel reply over veth");
    let later = later.expect("second reply");
    assert_eq!(first.kind, ProbeKind::ReplyKernel);
    assert_eq!((first.seq, first.rank), (1, 5));
    assert!(first.alive());
    assert!(later.hb_age_ns >= first.hb_age_ns + 100_000_000, "age grows: {first:?} {later:?}");
    assert_eq!(later.answered, 2);
    assert!(unknown.is_none(), "an unregistered port is not answered by the kernel");

    // A heartbeat resets the age; the broker's death clears `alive`.
    let beat = std::time::Instant::now();
    table.heartbeat(7100).unwrap();
    assert_eq!(table.mark_dead(4242), 1);
    let after = in_ns(&b, move || {
        let s = UdpSocket::bind("10.200.250.2:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        probe(&s, "10.200.250.1:7100", 4)
    })
    .expect("reply after death");
    assert!(!after.alive());
    // Younger than the time since the heartbeat (an age not reset would be older by the 150 ms slept above), on
    // however slow a machine (the emulated 6.1 VM).
    assert!(u128::from(after.hb_age_ns) <= beat.elapsed().as_nanos(), "{after:?}");
    assert_eq!(table.entries().len(), 1);

    // Detached on drop: nobody answers any more.
    drop(resp);
    let none = in_ns(&b, move || {
        let s = UdpSocket::bind("10.200.250.2:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        probe(&s, "10.200.250.1:7100", 5)
    });
    assert!(none.is_none());
}

#[test]
fn generic_xdp_on_loopback_is_shared_through_a_pinned_table() {
    let tag = std::process::id() % 100_000;
    let a = format!("vx{tag}l");
    let _ns = Netns(vec![a.clone()]);
    ip(&format!("netns add {a}"));
    ip(&format!("-n {a} link set lo up"));
    let pin = std::path::PathBuf::from(format!("/sys/fs/bpf/vigil-test-{tag}/hb"));
    let pin2 = pin.clone();
    let (got, second_attach_failed) = in_ns(&a, move || {
        let mut resp = XdpResponder::attach("lo").expect("attach on lo");
        resp.pin_table(&pin2).expect("pin");
        let second_attach_failed = XdpResponder::attach("lo").is_err();
        // Another broker of the machine registers through the pinned table.
        let other = HbTable::open_pinned(&pin2).expect("open pinned");
        other.register(7200, 1).unwrap();
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let got = probe(&s, "127.0.0.1:7200", 9);
        drop(resp);
        (got, second_attach_failed)
    });
    let got = got.expect("kernel reply on lo");
    assert_eq!(got.kind, ProbeKind::ReplyKernel);
    assert!(got.alive());
    assert!(second_attach_failed, "one XDP program per interface: the second attach must fail");
    assert!(!pin.exists(), "the pin is removed with its responder");
    let _ = std::fs::remove_dir(pin.parent().unwrap());
}

/// Sets the interface a socket sends multicast on (`IP_MULTICAST_IF`, by local address).
fn multicast_from(sock: &UdpSocket, local: std::net::Ipv4Addr) {
    socket2::SockRef::from(sock).set_multicast_if_v4(&local).expect("IP_MULTICAST_IF");
}

/// Waits until the kernel has collected a reply with sequence `seq` in each of `slots`.
fn wait_collected(area: &ReplyArea, slots: &[u32], seq: u32) -> Vec<Probe> {
    for _ in 0..100 {
        let hits: Vec<Probe> =
            slots.iter().filter_map(|s| area.read(*s)).map(|(p, _)| p).filter(|p| p.seq == seq).collect();
        if hits.len() == slots.len() {
            return hits;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("replies to seq {seq} not all collected: {:?}", slots.iter().map(|s| area.read(*s)).collect::<Vec<_>>());
}

#[test]
fn group_probe_answered_by_children_kernels_and_replies_collected_on_the_parent() {
    let tag = std::process::id() % 100_000;
    let names: Vec<String> = ["h", "p", "c", "d"].iter().map(|s| format!("vg{tag}{s}")).collect();
    let _ns = Netns(names.clone());
    for n in &names {
        ip(&format!("netns add {n}"));
    }
    let hub = &names[0];
    ip(&format!("-n {hub} link add br0 type bridge"));
    ip(&format!("-n {hub} link set br0 up"));
    // Parent 10.200.251.1, children 10.200.251.2 and .3, each on a veth into the hub's bridge.
    for (i, n) in names[1..].iter().enumerate() {
        let (h, e) = (format!("vg{tag}h{i}"), format!("vg{tag}e{i}"));
        ip(&format!("link add {h} netns {hub} type veth peer name {e} netns {n}"));
        ip(&format!("-n {hub} link set {h} master br0 up"));
        ip(&format!("-n {n} addr add 10.200.251.{}/24 dev {e}", i + 1));
        ip(&format!("-n {n} link set {e} up"));
    }
    let attach = |ns: &str, i: usize| {
        let ifname = format!("vg{tag}e{i}");
        in_ns(ns, move || XdpResponder::attach(&ifname).expect("attach XDP"))
    };
    let parent = attach(&names[1], 0);
    let child1 = attach(&names[2], 1);
    let child2 = attach(&names[3], 2);
    child1.table().register(7100, 41).unwrap();
    child2.table().register(7100, 42).unwrap();
    let area = parent.table().replies().expect("reply array mapped");

    let sock = in_ns(&names[1], || {
        let s = UdpSocket::bind("10.200.251.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        multicast_from(&s, "10.200.251.1".parse().unwrap());
        s
    });
    let port = sock.local_addr().unwrap().port();
    let first = area.claim_block(port).unwrap();
    let second = area.claim_block(port).unwrap();
    assert_ne!(first, second, "a claimed block is never handed out twice");
    let (s1, s2) = (first, first + 1);
    area.expect(s1, port, "10.200.251.2:7100".parse().unwrap());
    area.expect(s2, port, "10.200.251.3:7100".parse().unwrap());

    // Unicast requests: answered by each child's kernel, collected by the parent's, never seen by the socket.
    sock.send_to(&Probe::request(1, s1, 11).encode(), "10.200.251.2:7100").unwrap();
    sock.send_to(&Probe::request(1, s2, 11).encode(), "10.200.251.3:7100").unwrap();
    let got = wait_collected(&area, &[s1, s2], 1);
    assert!(got.iter().all(|p| p.kind == ProbeKind::ReplyKernel && p.alive() && p.sent_ns == 11), "{got:?}");
    let mut buf = [0u8; 128];
    assert!(sock.recv(&mut buf).is_err(), "collected replies must not reach the prober's socket");

    // One multicast datagram: both children's kernels answer it (they learned this parent), with their slots.
    child2.table().mark_dead(42);
    sock.send_to(&Probe::group(2, 22).encode(), "239.255.86.71:22087").unwrap();
    let got = wait_collected(&area, &[s1, s2], 2);
    assert_eq!(
        got.iter().map(|p| (p.rank, p.kind, p.sent_ns)).collect::<Vec<_>>(),
        vec![(s1, ProbeKind::ReplyKernel, 22), (s2, ProbeKind::ReplyKernel, 22)]
    );
    assert!(got[0].alive() && !got[1].alive(), "the dead broker's node says so: {got:?}");
    assert_eq!(area.read(s1).unwrap().1, 2, "two replies collected in the slot");

    // A parent the children never heard of gets no answer; a slot nobody set up collects nothing.
    let stranger = in_ns(&names[1], || {
        let s = UdpSocket::bind("10.200.251.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        multicast_from(&s, "10.200.251.1".parse().unwrap());
        s
    });
    stranger.send_to(&Probe::group(3, 33).encode(), "239.255.86.71:22087").unwrap();
    assert!(stranger.recv(&mut buf).is_err(), "children answer only the parents that probed them");
    area.forget(s2);
    sock.send_to(&Probe::request(4, s2, 44).encode(), "10.200.251.3:7100").unwrap();
    let n = sock.recv(&mut buf).expect("a reply nobody collects reaches the socket");
    assert_eq!(Probe::decode(&buf[..n]).map(|p| (p.seq, p.rank)), Some((4, s2)));
    area.release_block(first);
    area.release_block(second);
    assert_eq!(area.claim_block(port).unwrap(), first, "released blocks are claimed again");
}

#[test]
fn stale_pins_of_killed_brokers_are_swept_and_live_ones_kept() {
    let tag = std::process::id() % 100_000;
    let (a, b) = (format!("vx{tag}s"), format!("vx{tag}d"));
    let _ns = Netns(vec![a.clone(), b.clone()]);
    for n in [&a, &b] {
        ip(&format!("netns add {n}"));
        ip(&format!("-n {n} link set lo up"));
    }
    let dir = std::path::PathBuf::from(format!("/sys/fs/bpf/vigil-test-sweep-{tag}"));
    let d = dir.clone();
    let (removed, left) = in_ns(&a, move || {
        let mut live = XdpResponder::attach("lo").expect("attach on lo");
        live.pin_table(&d.join("live")).expect("pin live");
        // A killed broker's pins: a table (and its reply array) pinned, the program that used them gone. Made by
        // pinning a second responder's maps again under other names, then dropping it (its Drop unpins its own).
        let d2 = d.clone();
        in_ns(&b, move || {
            let mut dead = XdpResponder::attach("lo").expect("attach on lo");
            dead.pin_table(&d2.join("tmp")).expect("pin tmp");
            for (from, to) in [("tmp", "dead"), ("tmp-results", "dead-results")] {
                let m = aya::maps::MapData::from_pin(d2.join(from)).expect("open pin");
                m.pin(d2.join(to)).expect("pin again");
            }
            let dead_map = aya::maps::MapInfo::from_pin(d2.join("dead")).expect("dead pin").id();
            drop(dead);
            // The kernel frees a detached program in deferred work: until then the program still lists the table
            // as used, and the sweep rightly keeps it (a later sweep removes it). Wait for that here (seen taking
            // longer than the sweep's start while other tests attached programs beside this one).
            let used = || {
                aya::programs::loaded_programs()
                    .flatten()
                    .any(|p| p.map_ids().ok().flatten().is_some_and(|ids| ids.contains(&dead_map)))
            };
            let t0 = std::time::Instant::now();
            while used() && t0.elapsed() < std::time::Duration::from_secs(10) {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(!used(), "the dropped responder's program still holds its table after 10 s");
        });
        let mut removed = vigil_ebpf::sweep_stale_pins(&d).expect("sweep");
        removed.sort();
        let mut left: Vec<String> =
            std::fs::read_dir(&d).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        drop(live);
        (removed, left)
    });
    let _ = std::fs::remove_dir(&dir);
    assert_eq!(removed, vec![dir.join("dead"), dir.join("dead-results")], "the dead broker's table and array");
    assert_eq!(left, vec!["live", "live-claims", "live-results"], "the live responder's pins stay");
}

/// The owner's link pinned: after its clean exit the program keeps answering for another broker still
/// registered, and the sweep after that broker is gone removes the link (detaching the program) and the tables.
#[test]
fn a_pinned_link_keeps_the_program_while_another_broker_is_registered() {
    let tag = std::process::id() % 100_000;
    let a = format!("vx{tag}k");
    let _ns = Netns(vec![a.clone()]);
    ip(&format!("netns add {a}"));
    ip(&format!("-n {a} link set lo up"));
    let dir = std::path::PathBuf::from(format!("/sys/fs/bpf/vigil-test-link-{tag}"));
    let d = dir.clone();
    let (kept, answered_after_release, swept_while_live, swept, answered_after_sweep, alone) = in_ns(&a, move || {
        let me = std::process::id();
        let mut owner = XdpResponder::attach("lo").expect("attach on lo");
        owner.pin_table(&d.join("hb-x")).expect("pin table");
        owner.table().register(7300, me).unwrap();
        owner.pin_link(&d.join("link-x")).expect("pin link");
        // Another broker of the machine: a live process registered through the pinned table.
        let mut other = Command::new("sleep").arg("30").spawn().expect("sleep");
        let shared = HbTable::open_pinned(&d.join("hb-x")).expect("open pinned");
        shared.register(7301, other.id()).unwrap();
        // The owner leaves cleanly.
        owner.table().unregister(7300).unwrap();
        let kept = owner.release();
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let answered_after_release = probe(&s, "127.0.0.1:7301", 1).map(|p| p.kind);
        let swept_while_live = vigil_ebpf::sweep_stale_pins(&d).expect("sweep");
        // The other broker is killed: its entry stays, but no process has its id.
        other.kill().unwrap();
        other.wait().unwrap();
        drop(shared);
        let mut swept = vigil_ebpf::sweep_stale_pins(&d).expect("sweep");
        swept.sort();
        // The kernel frees the link in the background.
        let mut answered_after_sweep = Some(ProbeKind::ReplyKernel);
        for seq in 2..20 {
            answered_after_sweep = probe(&s, "127.0.0.1:7301", seq).map(|p| p.kind);
            if answered_after_sweep.is_none() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // An owner alone: released, it detaches and unpins.
        let mut owner = XdpResponder::attach("lo").expect("attach again once detached");
        owner.pin_table(&d.join("hb-y")).expect("pin table");
        owner.pin_link(&d.join("link-y")).expect("pin link");
        let alone = (owner.release(), std::fs::read_dir(&d).map(|r| r.count()).unwrap_or(0));
        (kept, answered_after_release, swept_while_live, swept, answered_after_sweep, alone)
    });
    let _ = std::fs::remove_dir(&dir);
    assert_eq!(kept, vigil_ebpf::Release::Kept(1), "one live broker is registered besides the owner");
    assert_eq!(answered_after_release, Some(ProbeKind::ReplyKernel), "the program outlives its owner");
    assert!(swept_while_live.is_empty(), "nothing is stale while a broker uses the table: {swept_while_live:?}");
    let names = ["hb-x", "hb-x-claims", "hb-x-results", "link-x"];
    assert_eq!(swept, names.map(|n| dir.join(n)).to_vec(), "the last broker gone: link and tables");
    assert_eq!(answered_after_sweep, None, "the program is detached once its link pin is removed");
    assert_eq!(alone, (vigil_ebpf::Release::Detached, 0), "an owner alone detaches and removes its pins");
}

/// The kernel marks its owner broker dead when that process's main thread exits (a kill -9 here), not when one of
/// its other threads ends.
#[test]
fn the_kernel_marks_its_owner_dead_when_the_process_exits_not_when_a_thread_does() {
    let tag = std::process::id() % 100_000;
    let a = format!("vx{tag}e");
    let _ns = Netns(vec![a.clone()]);
    ip(&format!("netns add {a}"));
    ip(&format!("-n {a} link set lo up"));
    let (thread_end, killed) = in_ns(&a, move || {
        let mut resp = XdpResponder::attach("lo").expect("attach on lo");
        let table = resp.table();
        // This process as the owner: a thread that ends is not the broker's death.
        let me = std::process::id();
        table.register(7300, me).unwrap();
        resp.mark_dead_on_exit(me, 7300).expect("exit tracepoint");
        std::thread::spawn(|| ()).join().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let thread_end = table.get(7300).expect("registered").alive;
        // A child process as the owner, killed.
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        table.register(7301, child.id()).unwrap();
        resp.mark_dead_on_exit(child.id(), 7301).expect("exit tracepoint");
        assert_eq!(table.get(7301).expect("registered").alive, 1);
        child.kill().unwrap();
        child.wait().unwrap();
        let killed = table.get(7301).expect("still registered").alive;
        (thread_end, killed)
    });
    assert_eq!(thread_end, 1, "a thread's end is not the broker's exit");
    assert_eq!(killed, 0, "the owner's exit clears `alive` in the kernel");
}

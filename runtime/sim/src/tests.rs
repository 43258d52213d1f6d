//! The simulator's own tests, and the sans-IO broker's rules tried across many brokers in virtual time.

use super::*;
use crate::broker::core::MemberState;
use std::collections::BTreeSet;

fn kary(k: u32) -> Topology {
    Topology::Kary(k)
}

#[test]
fn every_scenario_holds_its_invariants_on_a_small_instance() {
    for scenario in [Scenario::Boot, Scenario::Jobs, Scenario::Churn, Scenario::Partition, Scenario::Overload] {
        let r = run(Config::new(64, kary(4), 7), scenario);
        assert!(r.ok, "{scenario}: {:#?}", r.violations);
        assert!(r.events > 1000, "{scenario}: only {} inputs handled", r.events);
    }
}

/// A small instance with 1 ms links, for the router-loss scenarios.
fn routers_cfg(brokers: u32, k: u32, seed: u64) -> Config {
    let mut cfg = Config::new(brokers, kary(k), seed);
    cfg.latency = Duration::from_millis(1);
    cfg
}

/// Run a router-loss scenario and check what every one of them must show: the invariants held (among them,
/// every orphan reachable from rank 0 again within the bound), orphans re-parented, no broker had more children
/// than the fanout plus the adoption limit (its static children coming back after a restart on top of twice the
/// fanout).
fn routers_ok(cfg: Config, scenario: Scenario) -> Report {
    let (k, brokers) = (cfg.topo, cfg.brokers);
    let r = run(cfg, scenario);
    assert!(r.ok, "{scenario} ({brokers}, {k}): {:#?}", r.violations);
    let f = r.reparent.clone().unwrap_or_else(|| panic!("{scenario}: no orphan re-parented"));
    assert!(f.reparents > 0 && f.losses > 0, "{scenario}: {f:?}");
    assert!(f.loss_to_reachable_ms.is_some(), "{scenario}: {f:?}");
    let bound = (adopt_limit(k, brokers, 1) + k.children(brokers, 0).len()) as u32;
    assert!(r.max_children <= bound, "{scenario}: {} children (bound {bound})", r.max_children);
    r
}

/// Twice the fanout: the most children any broker may have when no broker restarts.
fn adopt_limit(k: Topology, brokers: u32, rank: u32) -> usize {
    crate::broker::reparent::adopt_limit(k, brokers, rank)
}

#[test]
fn every_router_lost_in_turn_re_parents_its_orphans_each_time() {
    for (n, k) in [(85, 4), (73, 8)] {
        let r = routers_ok(routers_cfg(n, k, 3), Scenario::RouterEach);
        let cfg = routers_cfg(n, k, 3);
        let routers = (1..n).filter(|&x| !cfg.topo.children(n, x).is_empty()).count() as u32;
        assert_eq!(r.faults.get("node_loss"), Some(&routers), "kary:{k}: {:?}", r.faults);
        assert_eq!(r.reparent.expect("figures").losses, routers, "kary:{k}: every router had orphans");
    }
}

#[test]
fn one_and_five_percent_of_routers_lost_at_random_re_parent_within_the_bound() {
    for scenario in [Scenario::Routers1Pct, Scenario::Routers5Pct] {
        for seed in [1, 2] {
            let r = routers_ok(routers_cfg(256, 4, seed), scenario);
            // Nobody restarts here: every broker stays within twice the fanout.
            assert!(r.max_children as usize <= adopt_limit(kary(4), 256, 1), "{scenario}: {}", r.max_children);
        }
    }
}

#[test]
fn a_router_lost_with_its_orphans_adopter_costs_one_candidate_timeout() {
    let r = routers_ok(routers_cfg(128, 4, 1), Scenario::RouterAdopter);
    let f = r.reparent.expect("figures");
    // Some orphans asked the dead sibling first and waited out the candidate timeout (500 ms).
    assert!(f.max_attempts >= 2, "{f:?}");
    let (_, _, max) = f.loss_to_reachable_ms.expect("figures");
    assert!(max >= 500.0, "{f:?}");
}

#[test]
fn adopters_lost_while_orphans_join_them_are_survived() {
    let r = routers_ok(routers_cfg(128, 8, 1), Scenario::ReparentLoss);
    assert_eq!(r.faults.get("node_loss"), Some(&4), "the router and three adopters: {:?}", r.faults);
    // The orphan whose adopter died after rank 0 recorded it re-parents twice.
    assert!(r.reparent.expect("figures").reparents > 4);
}

#[test]
fn a_flapping_router_costs_its_children_one_re_parent() {
    let r = routers_ok(routers_cfg(85, 4, 1), Scenario::RouterFlap);
    assert_eq!(r.faults.get("restart"), Some(&10), "{:?}", r.faults);
    // Rank 1's four children re-parent once: it comes back a leaf, so its later losses orphan nobody.
    assert_eq!(r.reparent.expect("figures").reparents, 4);
}

#[test]
fn a_cut_subtree_comes_back_whole_when_the_cut_heals() {
    let r = routers_ok(routers_cfg(256, 4, 1), Scenario::Partition);
    assert_eq!(r.faults.get("cut"), Some(&2), "{:?}", r.faults);
}

/// The checker can fail: a run whose record is tampered with before the check (a live rank recorded lost, a
/// broker past its adoption limit, an orphan that answered late) reports each.
#[test]
fn the_router_invariants_catch_a_live_rank_lost_an_overfull_adopter_and_a_late_orphan() {
    let r = scenario::run_with(routers_cfg(128, 4, 1), Scenario::Routers5Pct, |sim| {
        let wall = WALL_ORIGIN + sim.now().as_secs_f64();
        let jc = sim.nodes[0].broker.as_mut().and_then(|b| b.jobcore.as_mut()).expect("rank 0");
        let ctx = serde_json::json!({"idset": "127", "state": "lost", "reason": "made up"});
        jc.resource_eventlog.push(vigil_core::eventlog::Event::with_time(wall, "offline", ctx));
        sim.watch.over_limit.insert(2, 99);
        sim.watch.over_bound.insert(3, 99);
        let rec = sim.watch.done.first_mut().expect("a re-parent");
        rec.answered = rec.answered.map(|t| t + Duration::from_secs(5));
    });
    assert!(!r.ok);
    let has = |s: &str| r.violations.iter().any(|v| v.contains(s));
    assert!(has("rank 127 was recorded lost"), "{:#?}", r.violations);
    assert!(has("rank 2 adopted a child with 99 children"), "{:#?}", r.violations);
    assert!(has("rank 3 had 99 children, more than its bound"), "{:#?}", r.violations);
    assert!(has("answered rank 0"), "{:#?}", r.violations);
}

/// Under load (`overload`: congested links, starved nodes, userspace responders) no live rank is lost, and the
/// check that says so can fail: a live rank recorded lost is caught.
#[test]
fn under_overload_no_live_rank_is_lost_and_the_check_catches_one() {
    let r = run(Config::new(96, kary(4), 3), Scenario::Overload);
    assert!(r.ok, "{:#?}", r.violations);
    let r = scenario::run_with(Config::new(96, kary(4), 3), Scenario::Overload, |sim| {
        let struck: BTreeSet<u32> = sim.faults.iter().map(|(_, f)| f.rank()).collect();
        let live =
            (1..96).find(|r| !struck.contains(r) && sim.nodes[*r as usize].broker.is_some()).expect("a live rank");
        let wall = WALL_ORIGIN + sim.now().as_secs_f64();
        let jc = sim.nodes[0].broker.as_mut().and_then(|b| b.jobcore.as_mut()).expect("rank 0");
        let ctx = serde_json::json!({"idset": live.to_string(), "state": "lost", "reason": "made up"});
        jc.resource_eventlog.push(vigil_core::eventlog::Event::with_time(wall, "offline", ctx));
    });
    assert!(r.violations.iter().any(|v| v.starts_with("live rank") && v.ends_with("made up")), "{:#?}", r.violations);
}

#[test]
fn the_same_seed_gives_the_same_trace_and_another_seed_another() {
    let a = run(Config::new(48, kary(3), 42), Scenario::Churn);
    let b = run(Config::new(48, kary(3), 42), Scenario::Churn);
    let c = run(Config::new(48, kary(3), 43), Scenario::Churn);
    assert_eq!((a.trace.as_str(), a.events), (b.trace.as_str(), b.events));
    assert_ne!(a.trace, c.trace);
    // Rank 0's restarts too (its store, the client's retries).
    let a = run(Config::new(48, kary(3), 42), Scenario::Restart);
    let b = run(Config::new(48, kary(3), 42), Scenario::Restart);
    assert_eq!((a.trace.as_str(), a.events), (b.trace.as_str(), b.events));
    assert_eq!(a.restarts.map(|f| f.restarts), Some(scenario::RESTARTS));
}

/// A router lost silently, `tbon.reparent` off: its subtree is cut off and exits.
#[test]
fn a_silent_node_loss_is_lost_within_the_probe_rule_and_its_subtree_cut_off() {
    let mut cfg = Config::new(13, kary(3), 1);
    cfg.reparent = false;
    let mut sim = Sim::new(cfg);
    sim.boot();
    sim.run_until(Time::from_secs_f64(1.0));
    // Rank 1 is a router (children 4, 5, 6).
    sim.fault_at(Time::from_secs_f64(1.0), Fault::NodeLoss(1));
    sim.run_until(Time::from_secs_f64(3.0));
    let b0 = sim.broker(0).expect("rank 0 runs");
    let (state, why, since) = b0.members[&1].clone();
    assert_eq!(state, MemberState::Lost, "{why}");
    let ms = (since - WALL_ORIGIN - 1.0) * 1e3;
    // probe_misses (3) periods of 10 ms, give or take one period and the links' latency.
    assert!((20.0..=60.0).contains(&ms), "lost after {ms:.1} ms: {why}");
    for r in [4, 5, 6] {
        let (state, why, _) = b0.members[&r].clone();
        assert_eq!(state, MemberState::Lost);
        assert!(why.starts_with("cut off: rank 1"), "{why}");
        assert!(sim.broker(r).is_none(), "rank {r} should have exited without its parent");
    }
    assert!(sim.broker(2).is_some() && sim.broker(3).is_some());
}

/// A router lost silently (re-parenting on, the default): only it is lost; its children re-parent under its
/// siblings (spread), everyone below answers a ping from rank 0 again, and rank 0 routes by the new shape.
#[test]
fn a_lost_routers_children_re_parent_under_its_siblings_and_stay_reachable() {
    let mut sim = Sim::new(Config::new(40, kary(3), 1));
    sim.boot();
    sim.run_until(Time::from_secs_f64(1.0));
    // Rank 1 routes for 4, 5, 6 (and they for 13..21).
    sim.fault_at(Time::from_secs_f64(1.0), Fault::NodeLoss(1));
    sim.run_until(Time::from_secs_f64(2.0));
    let b0 = sim.broker(0).expect("rank 0 runs");
    assert_eq!(b0.members[&1].0, MemberState::Lost);
    let mut parents = Vec::new();
    for r in [4, 5, 6] {
        assert!(sim.broker(r).is_some(), "rank {r} re-parents rather than exit");
        assert_eq!(b0.members[&r].0, MemberState::Online, "{:?}", b0.members[&r]);
        parents.push(b0.parent_of(r).expect("a parent"));
    }
    assert_eq!(parents, vec![2, 3, 2], "spread over rank 1's siblings");
    assert!(sim.broker(2).expect("rank 2").children.contains_key(&4));
    let log = &b0.jobcore.as_ref().expect("rank 0").resource_eventlog;
    assert_eq!(log.iter().filter(|e| e.name == "reparent").count(), 3, "{log:?}");
    // Everyone alive answers.
    let tags: Vec<(u32, u32)> = (0..40)
        .filter(|&r| r != 1)
        .map(|r| (r, sim.request_at(Time::from_secs_f64(2.0), "broker.ping", r, &serde_json::json!({}))))
        .collect();
    sim.run_until(Time::from_secs_f64(2.5));
    for (r, tag) in tags {
        let (e, body) = sim.responses.get(&tag).cloned().unwrap_or((u32::MAX, serde_json::json!(null)));
        assert_eq!(e, 0, "ping to rank {r}: {body}");
    }
    // Its new parent dies too: rank 4 re-parents again.
    sim.fault_at(Time::from_secs_f64(2.5), Fault::NodeLoss(2));
    sim.run_until(Time::from_secs_f64(4.0));
    let b0 = sim.broker(0).expect("rank 0 runs");
    assert!(sim.broker(4).is_some());
    assert_eq!(b0.members[&4].0, MemberState::Online, "{:?}", b0.members[&4]);
    // Rank 2's orphans (its own 7, 8, 9 and its adoptees 4, 6) all know rank 1 was lost: 7-9 from rank 0's event,
    // 4 and 6 from the `lost` control message rank 2 sent them when it adopted them. So nobody waits on the dead
    // rank 1 (asked last); they ask rank 3, which fills to twice the fanout (its own 10-12, then 5, 4, 6), and the
    // rest go on to rank 0.
    let children3: BTreeSet<u32> = sim.broker(3).expect("rank 3").children.keys().copied().collect();
    assert_eq!(children3, BTreeSet::from([4, 5, 6, 10, 11, 12]), "rank 3 holds at most 2 x fanout");
    let moved: Vec<(u32, Option<u32>)> = [4, 6, 7, 8, 9].map(|r| (r, b0.parent_of(r))).to_vec();
    assert_eq!(moved, [(4, Some(3)), (6, Some(3)), (7, Some(0)), (8, Some(0)), (9, Some(0))]);
    let second: Vec<(u32, u32, u32)> =
        sim.watch.done.iter().skip(3).map(|d| (d.rank, d.attempts, d.timeouts)).collect();
    assert!(second.iter().all(|d| d.2 == 0), "no candidate timed out: {second:?}");
}

#[test]
fn a_stalled_broker_is_torpid_never_lost_and_lively_again() {
    let mut sim = Sim::new(Config::new(13, kary(3), 1));
    sim.boot();
    sim.run_until(Time::from_secs_f64(1.0));
    sim.fault_at(Time::from_secs_f64(1.0), Fault::Stall(5, Duration::from_secs(10)));
    sim.run_until(Time::from_secs_f64(6.0));
    assert_eq!(sim.broker(0).expect("rank 0").members[&5].0, MemberState::Torpid);
    sim.run_until(Time::from_secs_f64(13.0));
    let b0 = sim.broker(0).expect("rank 0");
    assert_eq!(b0.members[&5].0, MemberState::Online, "{:?}", b0.members[&5]);
    assert!(sim.broker(5).is_some());
}

/// Found by `restart` (kary:8, seed 1): an orphan asked a stopped candidate to adopt it, gave up on it, and its
/// node died; the candidate, running again, read the hello and accepted a child whose node was gone. Nothing
/// came back on that link: the simulator dropped the candidate's side of it, so what it sent the child was never
/// unacknowledged and the child stayed there for good. As on a real node, its data now stays unacknowledged and
/// the TCP rule finds the child lost.
#[test]
fn a_dead_orphan_accepted_late_by_a_stopped_candidate_is_lost() {
    let (n, topo) = (40, kary(3));
    let mut sim = Sim::new(Config::new(n, topo, 1));
    sim.boot();
    sim.run_until(Time::from_secs_f64(1.0));
    // Rank 1 routes for 4, 5, 6; rank 4 asks `cand` first, which is stopped for 5 s.
    let cand = crate::broker::reparent::candidates(topo, n, 4, 1)[0];
    sim.fault_at(Time::from_secs_f64(1.0), Fault::Stall(cand, Duration::from_secs(5)));
    sim.fault_at(Time::from_secs_f64(1.0), Fault::NodeLoss(1));
    // Rank 4's hello waits in the stopped candidate; its node dies before the attempt times out (its verdict on
    // rank 1 comes about 290 ms after the loss: the TCP rule, confirmed; its candidate timeout is 500 ms).
    sim.fault_at(Time::from_secs_f64(1.5), Fault::NodeLoss(4));
    sim.run_until(Time::from_secs_f64(6.5));
    assert!(sim.broker(cand).expect("the candidate runs").children.contains_key(&4), "the late hello is accepted");
    sim.run_until(Time::from_secs_f64(14.0));
    assert!(!sim.broker(cand).expect("the candidate runs").children.contains_key(&4), "the dead child is dropped");
    // Rank 0 never heard of the adoption (the orphan died before reporting it), so it ignores the candidate's
    // verdict as a stale one and loses rank 4 as an orphan that did not re-parent within 30 s of rank 1's loss.
    sim.run_until(Time::from_secs_f64(33.0));
    let b0 = sim.broker(0).expect("rank 0 runs");
    assert_eq!(b0.members[&4].0, MemberState::Lost, "{:?}", b0.members[&4]);
}

#[test]
fn a_request_in_flight_to_a_node_that_dies_gets_ehostunreach() {
    let mut sim = Sim::new(Config::new(13, kary(3), 1));
    sim.boot();
    sim.run_until(Time::from_secs_f64(1.0));
    // Rank 4 dies just after the ping left rank 0, before it arrives.
    let tag = sim.request_at(Time::from_secs_f64(1.0), "broker.ping", 4, &serde_json::json!({}));
    sim.fault_at(Time::from_secs_f64(1.0) + Duration::from_micros(1), Fault::NodeLoss(4));
    sim.run_until(Time::from_secs_f64(2.0));
    let (errnum, body) = sim.responses.get(&tag).cloned().expect("answered");
    assert_eq!(errnum, crate::message::errno::EHOSTUNREACH, "{body}");
    // A request to the rank once it is known lost is refused at once.
    let tag = sim.request_at(Time::from_secs_f64(2.0), "broker.ping", 4, &serde_json::json!({}));
    sim.run_until(Time::from_secs_f64(2.1));
    assert_eq!(sim.responses[&tag].0, crate::message::errno::EHOSTUNREACH);
}

/// An orphan judges its silent parent on TCP (unacknowledged data for `tbon.lost_timeout`, 120 ms, sampled each
/// heartbeat, then confirmed by its own check of the parent's node, which waits as long again:
/// `broker/confirm.rs`), with or without probing the parent's node: missed probes of the one node a child probes
/// only stop vouching for it (`membership.rs`; a child cannot tell a dead parent from links that slowed down at
/// once), so that the TCP rule may judge it. Probing never makes the verdict slower.
#[test]
fn an_orphan_judges_its_silent_parent_on_tcp_confirmed_whether_it_probes_it_or_not() {
    let verdict = |probe_parent: bool| {
        let mut cfg = routers_cfg(256, 4, 1);
        cfg.probe_parent = probe_parent;
        let r = routers_ok(cfg, Scenario::Routers1Pct);
        r.reparent.and_then(|f| f.loss_to_orphan_verdict_ms).expect("figures")
    };
    let (tcp, probes) = (verdict(false), verdict(true));
    assert!(tcp.0 >= 240.0 && tcp.2 <= 340.0, "TCP rule: {tcp:?}");
    assert!(probes.0 >= 240.0 && probes.2 <= 340.0, "probing the parent: {probes:?}");
}

/// Rank 0 killed and restarted on its state directory three times while the `churn` faults and jobs go on: no
/// acknowledged job lost, duplicated or hung, ids never given again, the others rejoin it, and jobs running
/// across an outage complete with their real exit status.
#[test]
fn rank_0_restarts_on_its_store_and_no_acknowledged_job_is_lost() {
    for seed in [7, 8] {
        let r = run(Config::new(64, kary(4), seed), Scenario::Restart);
        assert!(r.ok, "seed {seed}: {:#?}", r.violations);
        let f = r.restarts.clone().expect("restart figures");
        eprintln!("seed {seed}: {f:?}");
        assert_eq!(f.restarts, scenario::RESTARTS, "{f:?}");
        assert!(f.in_commit >= 1, "{f:?}");
        assert!(f.acknowledged >= 600, "{f:?}");
        assert!(f.retried > 0, "submissions sent during an outage are retried: {f:?}");
        assert!(f.running_at_crash > 0 && f.reattached_ok > 0, "{f:?}");
    }
}

/// The restart checker can fail: an acknowledged job removed from rank 0's core (lost), one acknowledged twice
/// (duplicated, its id not above the last), one left running (hung), one completed without its `start` are each
/// reported.
#[test]
fn the_restart_invariants_catch_a_lost_a_duplicated_and_a_hung_job() {
    let r = scenario::run_with(Config::new(64, kary(4), 7), Scenario::Restart, |sim| {
        let acked = sim.client.acked.clone();
        let now = sim.now();
        sim.client.acked.push((acked[1].0, acked[1].1, now, false));
        let jc = sim.nodes[0].broker.as_mut().and_then(|b| b.jobcore.as_mut()).expect("rank 0");
        jc.jobs.remove(&acked[0].1);
        jc.jobs.get_mut(&acked[2].1).expect("kept").state = crate::jobs::JobState::Run;
        // A completed job whose `start` is gone from its eventlog.
        let done = jc.jobs.values_mut().find(|j| j.fatal.is_none() && j.status == Some(0) && j.id > acked[2].1);
        done.expect("a completed job").eventlog.retain(|e| e.name != "start");
    });
    assert!(!r.ok);
    let has = |s: &str| r.violations.iter().any(|v| v.contains(s));
    assert!(has("is lost: not in rank 0's job core"), "{:#?}", r.violations);
    assert!(has("acknowledged twice"), "{:#?}", r.violations);
    assert!(has("is not above"), "{:#?}", r.violations);
    assert!(has("hung"), "{:#?}", r.violations);
    assert!(has("completed without a start before its finish"), "{:#?}", r.violations);
}

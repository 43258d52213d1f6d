//! The simulator's own tests, and the sans-IO broker's rules tried across many brokers in virtual time.

use super::*;
use crate::broker::core::MemberState;

fn kary(k: u32) -> Topology {
    Topology::Kary(k)
}

#[test]
fn every_scenario_holds_its_invariants_on_a_small_instance() {
    for scenario in [Scenario::Boot, Scenario::Jobs, Scenario::Churn, Scenario::Partition] {
        let r = run(Config::new(64, kary(4), 7), scenario);
        assert!(r.ok, "{scenario}: {:#?}", r.violations);
        assert!(r.events > 1000, "{scenario}: only {} inputs handled", r.events);
    }
}

#[test]
fn the_same_seed_gives_the_same_trace_and_another_seed_another() {
    let a = run(Config::new(48, kary(3), 42), Scenario::Churn);
    let b = run(Config::new(48, kary(3), 42), Scenario::Churn);
    let c = run(Config::new(48, kary(3), 43), Scenario::Churn);
    assert_eq!((a.trace.as_str(), a.events), (b.trace.as_str(), b.events));
    assert_ne!(a.trace, c.trace);
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
    // Rank 2's own children 7, 8, 9 knew rank 1 was lost (rank 0's event reached them), so they asked rank 3
    // first: 7 and 8 fill it to twice the fanout (its own 10-12, 5, 7, 8), 9 goes on to rank 0. Rank 4, an
    // orphan when that event went out, asks rank 1 first (dead: the attempt times out), then rank 3 (full), then
    // rank 0.
    assert_eq!(b0.parent_of(7), Some(3));
    assert_eq!(b0.parent_of(9), Some(0));
    assert_eq!(b0.parent_of(4), Some(0));
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

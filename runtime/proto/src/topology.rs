//! TBON topology math: parent, children, depth, routers and next hops.
//!
//! Pure functions of `(topology, size, rank)`; no I/O. Ranks are `u32` in `0..size`, rank 0 is the root.
//! The shapes follow flux-core's `tbon.topo` attribute: `kary:K` (K children per router, `kary:0` = flat:
//! every rank is a child of rank 0) and `binomial` (rank r's parent is r with its highest set bit cleared).

use std::fmt;
use std::str::FromStr;

/// A TBON shape (the `tbon.topo` attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Topology {
    /// k-ary tree: rank r's children are `k*r+1 ..= k*r+k`. `Kary(0)` is flat (all ranks children of 0).
    Kary(u32),
    /// Binomial tree: children of r are `r + 2^i` for every `2^i > r`; parent clears the highest set bit.
    Binomial,
}

impl Default for Topology {
    /// flux-core's default, `kary:32`.
    fn default() -> Self {
        Topology::Kary(32)
    }
}

/// Error parsing a `tbon.topo` / `tbon.fanout` value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid topology '{0}': expected kary:K (K >= 0) or binomial")]
pub struct TopologyParseError(pub String);

impl FromStr for Topology {
    type Err = TopologyParseError;
    /// Parses `kary:K`, `binomial`, or a bare number `K` (the `tbon.fanout` shorthand).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t == "binomial" {
            return Ok(Topology::Binomial);
        }
        let k = t.strip_prefix("kary:").unwrap_or(t);
        k.parse::<u32>().map(Topology::Kary).map_err(|_| TopologyParseError(s.to_string()))
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Topology::Kary(k) => write!(f, "kary:{k}"),
            Topology::Binomial => write!(f, "binomial"),
        }
    }
}

fn highest_bit(r: u32) -> u32 {
    1u32 << (31 - r.leading_zeros())
}

/// The deepest TBON the overlay routes (see [`Topology::check_depth`]): `2 * (MAX_DEPTH - 1) + 1` route entries fit
/// in [`crate::message::MAX_ROUTE`].
pub const MAX_DEPTH: u32 = crate::message::MAX_ROUTE as u32 / 2;

impl Topology {
    /// The shape of a nested instance (a batch or alloc job) of `size` brokers that sets no `tbon.topo`. With
    /// re-parenting (`reparent`, the default) its only critical rank is rank 0 whatever the shape, so it keeps the
    /// system instance's `kary:32` (rank 0 serves at most 32 children, flat up to 33 brokers). Without it every
    /// router is critical, so it takes the tree with the fewest routers: flat (`kary:0`) up to 257 brokers, then
    /// `kary:256` (docs/failure-detection.md, "Re-parenting").
    pub fn nested_default(size: u32, reparent: bool) -> Topology {
        match reparent {
            false if size <= 257 => Topology::Kary(0),
            false => Topology::Kary(256),
            true => Topology::Kary(32),
        }
    }

    /// Parent of `rank` in an instance of `size` brokers; `None` for rank 0 (and for ranks >= size).
    pub fn parent(&self, size: u32, rank: u32) -> Option<u32> {
        if rank == 0 || rank >= size {
            return None;
        }
        Some(match *self {
            Topology::Kary(0) => 0,
            Topology::Kary(k) => (rank - 1) / k,
            Topology::Binomial => rank - highest_bit(rank),
        })
    }

    /// Direct children of `rank`, ascending.
    pub fn children(&self, size: u32, rank: u32) -> Vec<u32> {
        if rank >= size {
            return Vec::new();
        }
        match *self {
            Topology::Kary(0) => {
                if rank == 0 {
                    (1..size).collect()
                } else {
                    Vec::new()
                }
            }
            Topology::Kary(k) => {
                let first = (k as u64) * (rank as u64) + 1;
                let last = ((k as u64) * (rank as u64) + k as u64).min(size as u64 - 1);
                (first..=last).map(|c| c as u32).collect()
            }
            Topology::Binomial => {
                let mut v = Vec::new();
                let mut step: u64 = if rank == 0 { 1 } else { (highest_bit(rank) as u64) << 1 };
                while (rank as u64) + step < size as u64 {
                    v.push((rank as u64 + step) as u32);
                    step <<= 1;
                }
                v
            }
        }
    }

    /// Distance of `rank` from rank 0 (rank 0 has level 0).
    pub fn level(&self, size: u32, rank: u32) -> u32 {
        let mut l = 0;
        let mut r = rank;
        while let Some(p) = self.parent(size, r) {
            l += 1;
            r = p;
        }
        l
    }

    /// Depth of the tree: the largest level plus one (1 for a single broker).
    pub fn depth(&self, size: u32) -> u32 {
        (0..size).map(|r| self.level(size, r)).max().map_or(0, |m| m + 1)
    }

    /// Refuse a tree too deep for the overlay's route stacks: a request between two leaves of a tree `D` levels
    /// deep crosses up to `2(D-1)` brokers, each pushing one route entry after the sender's own, and a route
    /// holds at most [`crate::message::MAX_ROUTE`] entries: so at most [`MAX_DEPTH`] levels. The error names
    /// the shape, the size, the depth and what would fit.
    pub fn check_depth(&self, size: u32) -> Result<(), String> {
        let depth = self.depth(size);
        if depth > MAX_DEPTH {
            return Err(format!(
                "tbon.topo={self} with {size} brokers is {depth} levels deep: overlay routes allow at most {MAX_DEPTH} \
                 (use a larger fanout, e.g. kary:2 or more)"
            ));
        }
        Ok(())
    }

    /// True if `rank` has at least one child (an interior broker, a "router").
    pub fn is_router(&self, size: u32, rank: u32) -> bool {
        !self.children(size, rank).is_empty()
    }

    /// Every router rank, ascending (rank 0 included when size > 1).
    pub fn routers(&self, size: u32) -> Vec<u32> {
        (0..size).filter(|&r| self.is_router(size, r)).collect()
    }

    /// Default critical ranks: rank 0 and every router, ascending.
    pub fn critical_ranks(&self, size: u32) -> Vec<u32> {
        let mut v = self.routers(size);
        if size > 0 && v.first() != Some(&0) {
            v.insert(0, 0);
        }
        v
    }

    /// Every rank in the subtree rooted at `rank` (including `rank`), ascending.
    pub fn subtree(&self, size: u32, rank: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut stack = vec![rank];
        while let Some(r) = stack.pop() {
            if r >= size {
                continue;
            }
            out.push(r);
            stack.extend(self.children(size, r));
        }
        out.sort_unstable();
        out
    }

    /// Next hop from `rank` towards `target`: `Hop::Local` if equal, `Hop::Child(c)` when `target` is in the
    /// subtree of child `c`, `Hop::Parent` otherwise. `target >= size` routes upstream (rank 0 rejects it).
    pub fn next_hop(&self, size: u32, rank: u32, target: u32) -> Hop {
        if target == rank {
            return Hop::Local;
        }
        let mut t = target;
        while let Some(p) = self.parent(size, t) {
            if p == rank {
                return Hop::Child(t);
            }
            t = p;
        }
        Hop::Parent
    }
}

/// Where a message addressed to a rank goes next (see [`Topology::next_hop`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hop {
    /// Deliver on this broker.
    Local,
    /// Forward to this child rank.
    Child(u32),
    /// Forward to the parent (or, on rank 0, the target does not exist).
    Parent,
}

#[cfg(test)]
mod tests {
    #[test]
    fn trees_deeper_than_routes_allow_are_refused() {
        use super::*;
        assert!(Topology::Kary(1).check_depth(MAX_DEPTH).is_ok());
        let e = Topology::Kary(1).check_depth(MAX_DEPTH + 1).unwrap_err();
        assert!(e.contains("33 levels deep") && e.contains("at most 32"), "{e}");
        assert!(Topology::Kary(2).check_depth(100_000).is_ok());
        assert!(Topology::Binomial.check_depth(1 << 20).is_ok());
    }

    use super::*;
    use proptest::prelude::*;

    fn topo() -> impl Strategy<Value = Topology> {
        prop_oneof![(0u32..9).prop_map(Topology::Kary), Just(Topology::Binomial)]
    }

    #[test]
    fn parse_and_display() {
        assert_eq!("kary:2".parse::<Topology>().unwrap(), Topology::Kary(2));
        assert_eq!("kary:0".parse::<Topology>().unwrap(), Topology::Kary(0));
        assert_eq!("binomial".parse::<Topology>().unwrap(), Topology::Binomial);
        assert_eq!("16".parse::<Topology>().unwrap(), Topology::Kary(16));
        assert!("kary:x".parse::<Topology>().is_err());
        assert!("mesh".parse::<Topology>().is_err());
        assert_eq!(Topology::Kary(32).to_string(), "kary:32");
    }

    #[test]
    fn known_shapes() {
        let k2 = Topology::Kary(2);
        assert_eq!(k2.children(7, 0), vec![1, 2]);
        assert_eq!(k2.children(7, 2), vec![5, 6]);
        assert_eq!(k2.parent(7, 6), Some(2));
        assert_eq!(k2.depth(7), 3);
        assert_eq!(k2.routers(7), vec![0, 1, 2]);
        let flat = Topology::Kary(0);
        assert_eq!(flat.children(5, 0), vec![1, 2, 3, 4]);
        assert_eq!(flat.depth(5), 2);
        assert_eq!(flat.critical_ranks(5), vec![0]);
        let b = Topology::Binomial;
        assert_eq!(b.children(16, 0), vec![1, 2, 4, 8]);
        assert_eq!(b.children(16, 1), vec![3, 5, 9]);
        assert_eq!(b.children(16, 6), vec![14]);
        assert_eq!(b.parent(16, 13), Some(5));
        assert_eq!(b.depth(16), 5);
        assert_eq!(Topology::Kary(2).next_hop(7, 0, 6), Hop::Child(2));
        assert_eq!(Topology::Kary(2).next_hop(7, 1, 6), Hop::Parent);
        assert_eq!(Topology::Kary(2).next_hop(7, 6, 6), Hop::Local);
        assert_eq!(Topology::default().depth(1), 1);
    }

    /// 16384 brokers: every rank reaches rank 0 and rank 0 reaches every rank in exactly `level` hops, and a
    /// lost router's subtree is exactly the ranks whose route crosses it.
    #[test]
    fn sixteen_thousand_brokers() {
        let size = 16384;
        for t in [Topology::Kary(32), Topology::Kary(2), Topology::Binomial, Topology::Kary(0)] {
            let mut hops_total = 0u64;
            for r in 0..size {
                let mut at = 0;
                let mut hops = 0;
                while at != r {
                    match t.next_hop(size, at, r) {
                        Hop::Child(c) => at = c,
                        other => panic!("{t}: unexpected {other:?} from {at} to {r}"),
                    }
                    hops += 1;
                }
                assert_eq!(hops, t.level(size, r), "{t} rank {r}");
                hops_total += hops as u64;
            }
            assert!(hops_total > 0);
            let router = t.children(size, 0)[0];
            let sub = t.subtree(size, router);
            let crosses = (0..size).filter(|&r| {
                let mut x = r;
                while let Some(p) = t.parent(size, x) {
                    if x == router {
                        return true;
                    }
                    x = p;
                }
                x == router
            });
            assert_eq!(crosses.count(), sub.len(), "{t}");
        }
        assert_eq!(Topology::Kary(32).depth(size), 4);
        assert_eq!(Topology::Binomial.depth(size), 15);
    }

    proptest! {
        #[test]
        fn parent_child_agree(t in topo(), size in 1u32..600) {
            let mut seen = vec![false; size as usize];
            seen[0] = true;
            for r in 0..size {
                for c in t.children(size, r) {
                    prop_assert!(c < size);
                    prop_assert_eq!(t.parent(size, c), Some(r));
                    prop_assert!(!seen[c as usize], "rank {} has two parents", c);
                    seen[c as usize] = true;
                }
            }
            prop_assert!(seen.iter().all(|s| *s), "every rank is reachable from rank 0");
        }

        #[test]
        fn routing_reaches_target(t in topo(), size in 1u32..300, a in 0u32..300, b in 0u32..300) {
            let (a, b) = (a % size, b % size);
            let mut at = a;
            for _ in 0..(2 * size + 2) {
                match t.next_hop(size, at, b) {
                    Hop::Local => { prop_assert_eq!(at, b); return Ok(()); }
                    Hop::Child(c) => { prop_assert_eq!(t.parent(size, c), Some(at)); at = c; }
                    Hop::Parent => { at = t.parent(size, at).expect("rank 0 never routes up to a valid target"); }
                }
            }
            prop_assert!(false, "no route from {} to {}", a, b);
        }

        #[test]
        fn subtree_and_depth(t in topo(), size in 1u32..300, r in 0u32..300) {
            let r = r % size;
            let st = t.subtree(size, r);
            for x in &st {
                let mut y = *x;
                while y != r { y = t.parent(size, y).unwrap(); }
            }
            prop_assert_eq!(t.subtree(size, 0).len() as u32, size);
            let d = t.depth(size);
            prop_assert!((0..size).all(|x| t.level(size, x) < d));
            if let Topology::Kary(k) = t { if k >= 2 {
                // a k-ary tree of n nodes has depth ceil(log_k(n(k-1)+1))
                let mut cap = 1u64; let mut lvl = 1u64; let mut dd = 1;
                while cap < size as u64 { lvl *= k as u64; cap += lvl; dd += 1; }
                prop_assert_eq!(d, dd);
            }}
        }
    }
}

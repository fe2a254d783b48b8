//! Property laws of the layout algebra (proptest), over the public API only.
//!
//! Layouts come from random op sequences on a world of up to 2048 ranks (optionally with a
//! random rank map): unflatten of any dim into a random ordered factorisation of its size
//! (size-1 parts included; splits a non-adjacently flattened dim cannot take are skipped),
//! slices of ordered subsets (often non-adjacent) and flatten. Every layout met on the way must
//! obey the laws below.

use std::sync::Arc;

use proptest::prelude::*;
use rankmesh::{Layout, LayoutError, Mode, Slice};

const MAX_WORLD: u64 = 2048;

/// A tiny deterministic generator, so an op's random choices shrink with its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn prime_factors(mut n: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut p = 2;
    while p * p <= n {
        while n % p == 0 {
            out.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        out.push(n);
    }
    out
}

/// A random ordered factorisation of `n` into at least `min_parts` parts of size > 1 where `n`
/// has enough prime factors, sometimes with an extra size-1 part.
fn random_sizes(n: u64, min_parts: usize, rng: &mut Rng) -> Vec<i128> {
    let mut primes = prime_factors(n);
    for i in (1..primes.len()).rev() {
        primes.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let most = primes.len().clamp(1, 4);
    let least = min_parts.clamp(1, most);
    let parts = least + rng.below((most - least + 1) as u64) as usize;
    let mut sizes = vec![1i128; parts];
    for (i, p) in primes.iter().enumerate() {
        // every part gets one prime first, the rest go anywhere
        let bin = if i < parts {
            i
        } else {
            rng.below(parts as u64) as usize
        };
        sizes[bin] *= *p as i128;
    }
    if rng.below(4) == 0 {
        let at = rng.below(sizes.len() as u64 + 1) as usize;
        sizes.insert(at, 1);
    }
    sizes
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// A random non-empty ordered subset of `l`'s dim names; with `gap` (and 3+ dims) one that
/// skips a dim between two picked ones.
fn random_subset(l: &Layout, rng: &mut Rng, gap: bool) -> Vec<String> {
    let n = l.ndim();
    let mut keep: Vec<bool> = (0..n).map(|_| rng.below(2) == 0).collect();
    if gap && n >= 3 {
        let g = 1 + rng.below(n as u64 - 2) as usize;
        keep[g] = false;
        keep[rng.below(g as u64) as usize] = true;
        keep[g + 1 + rng.below((n - g - 1) as u64) as usize] = true;
    }
    if !keep.iter().any(|&k| k) {
        keep[rng.below(n as u64) as usize] = true;
    }
    l.names()
        .iter()
        .zip(keep)
        .filter(|&(_, k)| k)
        .map(|(name, _)| name.clone())
        .collect()
}

/// Applies `ops` to the world layout and returns every layout met on the way. Op kinds:
/// unflatten (twice as likely), slice, flatten, and slice-then-flatten, which makes the dims
/// with several modes (non-adjacent flattens) that later unflattens must respect.
fn build(world: &Layout, ops: &[(u8, u64)]) -> Vec<Layout> {
    let mut out = vec![world.clone()];
    let mut cur = world.clone();
    for (step, &(kind, seed)) in ops.iter().enumerate() {
        let mut rng = Rng(seed);
        // the first op splits the world into several dims, for the later ops to work on
        let kind = if step == 0 { 0 } else { kind };
        let next = match kind % 5 {
            0 | 1 => {
                let d = rng.below(cur.ndim() as u64) as usize;
                let sizes = random_sizes(cur.shape()[d], if step == 0 { 3 } else { 1 }, &mut rng);
                match cur.unflatten(d, &sizes, &names(&format!("u{step}_"), sizes.len())) {
                    Ok(l) => l,
                    Err(LayoutError::Incompatible { .. }) => continue,
                    Err(e) => panic!("unexpected error {e} unflattening {cur:?} by {sizes:?}"),
                }
            }
            2 => cur
                .slice(&random_subset(&cur, &mut rng, false))
                .expect("an ordered slice"),
            3 => cur
                .flatten(if rng.below(2) == 0 {
                    None
                } else {
                    Some("flat")
                })
                .expect("flatten"),
            _ => {
                let sub = cur
                    .slice(&random_subset(&cur, &mut rng, true))
                    .expect("an ordered slice");
                sub.flatten(Some(&format!("f{step}"))).expect("flatten")
            }
        };
        out.push(next.clone());
        cur = next;
    }
    out
}

fn world_strategy() -> impl Strategy<Value = (u64, Option<Vec<i64>>)> {
    prop::collection::vec(prop::sample::select(vec![2u64, 2, 2, 3, 3, 5, 7]), 0..10)
        .prop_map(|factors| {
            factors
                .into_iter()
                .fold(1u64, |w, f| if w * f <= MAX_WORLD { w * f } else { w })
        })
        .prop_flat_map(|w| {
            let identity: Vec<i64> = (0..w as i64).collect();
            (Just(w), prop::option::of(Just(identity).prop_shuffle()))
        })
}

fn ops_strategy() -> impl Strategy<Value = Vec<(u8, u64)>> {
    prop::collection::vec((any::<u8>(), any::<u64>()), 0..8)
}

fn make_world(w: u64, map: &Option<Vec<i64>>) -> Layout {
    Layout::world(w as i128, map.as_deref()).expect("a valid world")
}

/// A few ranks worth checking: the ends and some in between.
fn sample_ranks(w: u64, seed: u64) -> Vec<i128> {
    let mut rng = Rng(seed);
    let mut ranks = vec![0, w as i128 - 1];
    ranks.extend((0..4).map(|_| rng.below(w) as i128));
    ranks.sort_unstable();
    ranks.dedup();
    ranks
}

fn axis_modes(l: &Layout) -> Vec<Vec<Mode>> {
    l.axes().iter().map(|a| a.modes().to_vec()).collect()
}

/// Row-major coordinate of flat index `p` in `shape`.
fn unravel(mut p: u64, shape: &[u64]) -> Vec<u64> {
    let mut c = vec![0; shape.len()];
    for (i, &s) in shape.iter().enumerate().rev() {
        c[i] = p % s;
        p /= s;
    }
    c
}

fn ravel(c: &[u64], shape: &[u64]) -> u64 {
    c.iter().zip(shape).fold(0, |acc, (&x, &s)| acc * s + x)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Unflattening a dim and flattening the new dims again gives back the dim's modes.
    #[test]
    fn unflatten_then_flatten_is_identity(
        (w, map) in world_strategy(), ops in ops_strategy(), seed in any::<u64>()
    ) {
        for l in build(&make_world(w, &map), &ops) {
            let mut rng = Rng(seed);
            let d = rng.below(l.ndim() as u64) as usize;
            let sizes = random_sizes(l.shape()[d], 1, &mut rng);
            let new = names("x", sizes.len());
            let u = match l.unflatten(d, &sizes, &new) {
                Ok(u) => u,
                Err(e) => { prop_assert!(matches!(e, LayoutError::Incompatible { .. }), "{}", e); continue; }
            };
            prop_assert_eq!(u.ndim(), l.ndim() + sizes.len() - 1);
            let back = u.slice(&new).unwrap().flatten(None).unwrap();
            prop_assert_eq!(back.axes()[0].modes(), l.axes()[d].modes());
            prop_assert_eq!(back.names()[0].clone(), new.join("_"));
            // the dims it did not touch are untouched
            for (i, name) in l.names().iter().enumerate().filter(|&(i, _)| i != d) {
                let j = u.dim_by_name(name).unwrap();
                prop_assert_eq!(u.axes()[j].modes(), l.axes()[i].modes());
            }
            let shape: Vec<u64> = sizes.iter().map(|&s| s as u64).collect();
            prop_assert_eq!(&u.shape()[d..d + sizes.len()], &shape[..]);
        }
    }

    /// Slicing names out of mesh order fails with a hint that is an order of the same names
    /// which slices (whatever op sequence made the dims).
    #[test]
    fn slice_order_hint_slices(
        (w, map) in world_strategy(), ops in ops_strategy(), seed in any::<u64>()
    ) {
        for l in build(&make_world(w, &map), &ops) {
            let mut rng = Rng(seed);
            let mut picked = random_subset(&l, &mut rng, false);
            for i in (1..picked.len()).rev() {
                picked.swap(i, rng.below(i as u64 + 1) as usize);
            }
            match l.slice(&picked) {
                Ok(s) => prop_assert_eq!(s.names(), &picked[..]),
                Err(LayoutError::SliceOrder { names, fix, .. }) => {
                    prop_assert_eq!(&names, &picked);
                    let mut a = fix.clone();
                    let mut b = picked.clone();
                    a.sort();
                    b.sort();
                    prop_assert_eq!(a, b);
                    let s = l.slice(&fix);
                    prop_assert!(s.is_ok(), "hint {:?} for {:?} fails: {:?}", fix, picked, s);
                }
                Err(e) => prop_assert!(false, "unexpected error {}", e),
            }
        }
    }

    /// Flattening a layout and unflattening it with its own sizes gives back its axes.
    #[test]
    fn flatten_then_unflatten_is_identity((w, map) in world_strategy(), ops in ops_strategy()) {
        for l in build(&make_world(w, &map), &ops) {
            let flat = l.flatten(Some("all")).unwrap();
            prop_assert_eq!(flat.ndim(), 1);
            prop_assert_eq!(flat.numel(), l.numel());
            let sizes: Vec<i128> = l.shape().iter().map(|&s| s as i128).collect();
            let again = flat.unflatten(0, &sizes, l.names()).unwrap();
            prop_assert_eq!(axis_modes(&again), axis_modes(&l));
            prop_assert_eq!(&again, &l);
            prop_assert_eq!(again.fingerprint(), l.fingerprint());
        }
    }

    /// `groups()` lists every rank exactly once, `num_copies` rows of `numel` ranks, and
    /// `mesh_of(r)` is the row `copy_index_of(r)` of it.
    #[test]
    fn groups_partition_the_world(
        (w, map) in world_strategy(), ops in ops_strategy(), seed in any::<u64>()
    ) {
        for l in build(&make_world(w, &map), &ops) {
            let g = l.groups();
            prop_assert_eq!(g.len() as u64, w);
            prop_assert_eq!(l.num_copies() * l.numel(), w);
            let mut seen = vec![false; w as usize];
            for &r in &g {
                prop_assert!(r >= 0 && (r as u64) < w);
                prop_assert!(!seen[r as usize], "rank {} twice in {:?}", r, l);
                seen[r as usize] = true;
            }
            let n = l.numel() as usize;
            for r in sample_ranks(w, seed) {
                let row = l.copy_index_of(r).unwrap() as usize;
                prop_assert!(row < l.num_copies() as usize);
                let mesh = l.mesh_of(r).unwrap();
                prop_assert_eq!(&mesh[..], &g[row * n..(row + 1) * n]);
            }
            // and every rank is in the row copy_index_of says (O(W) queries: small worlds only)
            if w <= 256 {
                for (p, &r) in g.iter().enumerate() {
                    prop_assert_eq!(l.copy_index_of(r as i128).unwrap() as usize, p / n.max(1));
                }
            }
        }
    }

    /// `coordinate_of` and the local mesh agree both ways, and `group(r, d)` is the line through
    /// `r`'s coordinate along `d`.
    #[test]
    fn coordinates_groups_and_meshes_agree(
        (w, map) in world_strategy(), ops in ops_strategy(), seed in any::<u64>()
    ) {
        for l in build(&make_world(w, &map), &ops) {
            let shape = l.shape();
            for r in sample_ranks(w, seed) {
                let coord = l.coordinate_of(r).unwrap();
                prop_assert_eq!(coord.len(), l.ndim());
                prop_assert!(coord.iter().zip(&shape).all(|(c, s)| c < s));
                let mesh = l.mesh_of(r).unwrap();
                prop_assert_eq!(mesh[ravel(&coord, &shape) as usize] as i128, r);
                let copy = l.copy_index_of(r).unwrap();
                // rank -> coordinate -> rank, for every rank of r's mesh (a stride of them in
                // big meshes, to keep the quadratic mesh_of checks cheap)
                let step = (mesh.len() / 64).max(1);
                for (p, &x) in mesh.iter().enumerate().step_by(step) {
                    prop_assert_eq!(l.coordinate_of(x as i128).unwrap(), unravel(p as u64, &shape));
                    prop_assert_eq!(l.copy_index_of(x as i128).unwrap(), copy);
                    prop_assert_eq!(&l.mesh_of(x as i128).unwrap(), &mesh);
                }
                for d in 0..l.ndim() {
                    let group = l.group(r, d).unwrap();
                    prop_assert_eq!(group.len() as u64, shape[d]);
                    prop_assert_eq!(group[coord[d] as usize] as i128, r);
                    let step = (group.len() / 32).max(1);
                    for (k, &x) in group.iter().enumerate().step_by(step) {
                        let mut c = coord.clone();
                        c[d] = k as u64;
                        prop_assert_eq!(&l.coordinate_of(x as i128).unwrap(), &c);
                        prop_assert_eq!(mesh[ravel(&c, &shape) as usize], x);
                        // groups are symmetric: every member sees the same group
                        prop_assert_eq!(&l.group(x as i128, d).unwrap(), &group);
                    }
                    // in a world in rank order, the group as a set is one Slice, read in O(modes)
                    match l.group_slice(r, d).unwrap() {
                        Some(set) => {
                            let mut sorted: Vec<u64> = group.iter().map(|&x| x as u64).collect();
                            sorted.sort_unstable();
                            prop_assert_eq!(set.ranks(), sorted);
                        }
                        None => prop_assert!(!l.world_arc().is_identity()),
                    }
                    // the 1-D slice of that dim has the group as its local mesh
                    let one = l.slice(&[l.names()[d].as_str()]).unwrap();
                    prop_assert_eq!(&one.mesh_of(r).unwrap(), &group);
                }
            }
        }
    }

    /// Equal layouts have equal fingerprints: rebuilt from scratch, via an identity rank map,
    /// or from their raw parts (what unpickling does). A rename changes the fingerprint.
    #[test]
    fn fingerprint_follows_equality((w, map) in world_strategy(), ops in ops_strategy()) {
        let first = build(&make_world(w, &map), &ops);
        let second = build(&make_world(w, &map), &ops);
        for (a, b) in first.iter().zip(&second) {
            prop_assert_eq!(a, b);
            prop_assert_eq!(a.fingerprint(), b.fingerprint());
            let parts = Layout::from_parts(Arc::clone(a.world_arc()), &axis_modes(a), a.names()).unwrap();
            prop_assert_eq!(&parts, a);
            prop_assert_eq!(parts.fingerprint(), a.fingerprint());
            let renamed: Vec<String> = a.names().iter().map(|n| format!("{n}'")).collect();
            let other = Layout::from_parts(Arc::clone(a.world_arc()), &axis_modes(a), &renamed).unwrap();
            prop_assert_ne!(&other, a);
            prop_assert_ne!(other.fingerprint(), a.fingerprint());
        }
        if map.is_none() {
            let identity: Vec<i64> = (0..w as i64).collect();
            let via_identity = build(&Layout::world(w as i128, Some(&identity)).unwrap(), &ops);
            for (a, b) in first.iter().zip(&via_identity) {
                prop_assert_eq!(a, b);
                prop_assert_eq!(a.fingerprint(), b.fingerprint());
            }
        }
    }
}

#[test]
fn random_sizes_factorise() {
    let mut rng = Rng(1);
    for n in [1u64, 2, 12, 360, 2048] {
        for _ in 0..50 {
            let s = random_sizes(n, 2, &mut rng);
            assert_eq!(s.iter().product::<i128>(), n as i128);
            assert!(s.iter().all(|&x| x >= 1));
        }
    }
    assert_eq!(
        unravel(ravel(&[1, 2, 3], &[2, 3, 4]), &[2, 3, 4]),
        vec![1, 2, 3]
    );
}

/// The dense rank map a renumbering stands for: index `i` holds old rank `i` (or its spare's),
/// renumbered without the removed ranks; computed the slow, obvious way.
fn dense_renumbering(old: u64, size: u64, removed: &[u64], spares: &[(u64, u64)]) -> Vec<i64> {
    let alive: Vec<u64> = (0..old).filter(|r| !removed.contains(r)).collect();
    (0..size)
        .map(|i| {
            let q = spares.iter().find(|&&(j, _)| j == i).map_or(i, |&(_, r)| r);
            alive.iter().position(|&r| r == q).unwrap() as i64
        })
        .collect()
}

/// The renumbering law for one case: a world of `size` ranks re-formed from `size + spare_count`
/// old ranks, with the failures and swaps `seed` draws, gives every group, coordinate and
/// membership the dense rank map it stands for gives, after `ops`.
fn renumbered_matches_dense(
    size: u64,
    spare_count: u64,
    seed: u64,
    ops: &[(u8, u64)],
) -> Result<(), TestCaseError> {
    let mut rng = Rng(seed);
    // never more failures than spares, nor than the mesh has ranks (a 2-rank mesh with 3 spares
    // can lose both ranks, not three: asking for a third distinct rank would never end)
    let failed_n = (1 + rng.below(3)).min(spare_count).min(size);
    let old = size + spare_count;
    // failed ranks inside the mesh, each replaced by a spare (old ranks size..old)
    let mut failed: Vec<u64> = Vec::new();
    while (failed.len() as u64) < failed_n {
        let f = rng.below(size);
        if !failed.contains(&f) {
            failed.push(f);
        }
    }
    let mut spares: Vec<(u64, u64)> = failed
        .iter()
        .enumerate()
        .map(|(k, &f)| (f, size + k as u64))
        .collect();
    // unused spares leave the new job too
    let mut removed = failed.clone();
    removed.extend(size + failed_n..old);
    // sometimes two survivors swap places as well
    if size > 3 && rng.below(2) == 1 {
        let (a, b) = (rng.below(size), rng.below(size));
        if a != b && !failed.contains(&a) && !failed.contains(&b) {
            spares.push((a, b));
            spares.push((b, a));
        }
    }
    let to_i = |v: &[u64]| v.iter().map(|&x| x as i128).collect::<Vec<_>>();
    let pairs: Vec<(i128, i128)> = spares
        .iter()
        .map(|&(i, r)| (i as i128, r as i128))
        .collect();
    let sparse = Layout::renumbered(old as i128, size as i128, &to_i(&removed), &pairs).unwrap();
    let map = dense_renumbering(old, size, &removed, &spares);
    let dense = Layout::world(size as i128, Some(&map)).unwrap();
    prop_assert_eq!(sparse.world_size(), size);
    let a = build(&sparse, ops);
    let b = build(&dense, ops);
    for (x, y) in a.iter().zip(&b) {
        prop_assert_eq!(x.shape(), y.shape());
        prop_assert_eq!(x.groups(), y.groups());
        for r in 0..size as i128 {
            prop_assert_eq!(x.coordinate_of(r).ok(), y.coordinate_of(r).ok());
            for d in 0..x.ndim() {
                prop_assert_eq!(x.group(r, d).ok(), y.group(r, d).ok());
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A world re-formed after failures (`Layout::renumbered`, O(changes)) gives every group,
    /// coordinate and membership the dense rank map it stands for gives, after any ops.
    #[test]
    fn renumbered_worlds_answer_as_their_dense_rank_map(
        size in 2u64..=256,
        spare_count in 0u64..4,
        seed in any::<u64>(),
        ops in proptest::collection::vec((any::<u8>(), any::<u64>()), 0..4),
    ) {
        renumbered_matches_dense(size, spare_count, seed, &ops)?;
    }
}

/// The smallest mesh with more spares than ranks: every seed, including those that draw three
/// failures (more than the two ranks there are), ends and obeys the law. This case once looped
/// forever and held CI until its time ran out.
#[test]
fn renumbering_a_two_rank_mesh_with_three_spares_ends() {
    let mut drew_three = false;
    for seed in 0..64u64 {
        drew_three |= 1 + Rng(seed).below(3) == 3;
        renumbered_matches_dense(2, 3, seed, &[(0, seed), (2, seed ^ 1)]).unwrap();
    }
    assert!(
        drew_three,
        "no seed asked for three failures: the case is not covered"
    );
}

#[test]
fn renumbered_worlds_refuse_what_cannot_be_reformed() {
    let field = |e: LayoutError| e.field().to_string();
    // a failed rank with no spare: the mesh would have a hole
    assert_eq!(
        field(Layout::renumbered(9, 8, &[3], &[]).unwrap_err()),
        "removed"
    );
    // a failed rank outside the old job
    assert_eq!(
        field(Layout::renumbered(9, 8, &[9], &[(3, 8)]).unwrap_err()),
        "removed[0]"
    );
    // a spare that is itself removed, or an index outside the mesh
    assert_eq!(
        field(Layout::renumbered(9, 8, &[3, 8], &[(3, 8)]).unwrap_err()),
        "replaced[0]"
    );
    assert_eq!(
        field(Layout::renumbered(9, 8, &[3], &[(8, 8)]).unwrap_err()),
        "replaced[0]"
    );
    // two spares for one index; one spare for two indices
    assert_eq!(
        field(Layout::renumbered(10, 8, &[3], &[(3, 8), (3, 9)]).unwrap_err()),
        "replaced"
    );
    assert_eq!(
        field(Layout::renumbered(10, 8, &[3, 4], &[(3, 8), (4, 8)]).unwrap_err()),
        "replaced"
    );
    // a survivor moved without anyone taking its own index
    assert_eq!(
        field(Layout::renumbered(9, 8, &[3], &[(3, 5)]).unwrap_err()),
        "replaced"
    );
    // an unused spare still in the new job
    assert_eq!(
        field(Layout::renumbered(10, 8, &[3], &[(3, 8)]).unwrap_err()),
        "removed"
    );
    // the example: job of 9, rank 3 fails, spare 8 takes index 3
    let l = Layout::renumbered(9, 8, &[3], &[(3, 8)]).unwrap();
    let ranks: Vec<i32> = (0..8).map(|i| l.world_arc().rank_at(i)).collect();
    assert_eq!(ranks, vec![0, 1, 2, 7, 3, 4, 5, 6]);
    assert_eq!(l.coordinate_of(7).unwrap(), vec![3]);
    // nothing changed: the plain world
    assert_eq!(
        Layout::renumbered(8, 8, &[], &[]).unwrap(),
        Layout::world(8, None).unwrap()
    );
}

// -- Slice: one set of ranks as offset + (size, stride) modes ---------------------------------

/// A random slice of at most 64 ranks: up to 3 modes that nest (each stride at least the span of
/// the modes inside it, sometimes with a gap), in a random lexicographic order, at a random offset.
fn random_slice(seed: u64) -> Slice {
    let mut rng = Rng(seed);
    let n = rng.below(4) as usize;
    let mut modes: Vec<(i128, i128)> = Vec::new();
    let mut span = 1i128;
    for _ in 0..n {
        let size = 1 + rng.below(4) as i128;
        let stride = span * (1 + rng.below(3) as i128)
            + rng.below(2) as i128 * rng.below(span as u64 + 1) as i128;
        let stride = stride.max(span);
        modes.push((size, stride));
        span += (size - 1) * stride;
    }
    for i in (1..modes.len()).rev() {
        modes.swap(i, rng.below(i as u64 + 1) as usize);
    }
    Slice::new(rng.below(40) as i128, &modes).expect("nested modes make a slice")
}

fn rank_set(s: &Slice) -> std::collections::BTreeSet<u64> {
    s.ranks().into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The ranks are distinct, `index_of` inverts `rank_at`, and `recognise` reads the slice back
    /// from its ranks in index order.
    #[test]
    fn slices_are_read_back_from_their_ranks(seed in any::<u64>()) {
        let s = random_slice(seed);
        let ranks = s.ranks();
        prop_assert_eq!(rank_set(&s).len() as u64, s.len());
        for (i, &r) in ranks.iter().enumerate() {
            prop_assert_eq!(s.index_of(r), Some(i as u64));
        }
        for r in 0..=s.last() + 2 {
            prop_assert_eq!(s.contains(r), ranks.contains(&r));
        }
        let as_i64: Vec<i64> = ranks.iter().map(|&r| r as i64).collect();
        prop_assert_eq!(Slice::recognise(&as_i64), Some(s.clone()));
    }

    /// The first shared rank is the least rank of the intersection; `subset_by_modes`, where it
    /// decides, is set inclusion.
    #[test]
    fn two_slices_meet_as_their_rank_sets(a in any::<u64>(), b in any::<u64>()) {
        let (x, y) = (random_slice(a), random_slice(b));
        let (sx, sy) = (rank_set(&x), rank_set(&y));
        prop_assert_eq!(x.first_shared_rank(&y), sx.intersection(&sy).next().copied());
        prop_assert_eq!(x.intersects(&y), !sx.is_disjoint(&sy));
        let (x0, y0) = (Slice::new(0, &modes_of(&x)).unwrap(), Slice::new(0, &modes_of(&y)).unwrap());
        if let Some(verdict) = x0.subset_by_modes(&y0) {
            prop_assert_eq!(verdict, rank_set(&x0).is_subset(&rank_set(&y0)));
        }
    }

    /// A permutation of a slice's ranks other than its own order is recognised only as a slice
    /// with the same ranks, at the same positions.
    #[test]
    fn recognised_orders_hold_the_same_ranks(seed in any::<u64>()) {
        let s = random_slice(seed);
        let mut ranks: Vec<i64> = s.ranks().into_iter().map(|r| r as i64).collect();
        let mut rng = Rng(seed ^ 0x5eed);
        for i in (1..ranks.len()).rev() {
            ranks.swap(i, rng.below(i as u64 + 1) as usize);
        }
        if let Some(t) = Slice::recognise(&ranks) {
            prop_assert_eq!(t.ranks().into_iter().map(|r| r as i64).collect::<Vec<_>>(), ranks);
        }
    }
}

fn modes_of(s: &Slice) -> Vec<(i128, i128)> {
    s.modes()
        .iter()
        .map(|m| (m.size as i128, m.stride as i128))
        .collect()
}
